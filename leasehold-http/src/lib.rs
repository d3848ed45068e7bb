//! # leasehold-http: fencing for HTTP services, both sides
//!
//! A lease decides who may *start* work; the resource is what stops a holder that paused past its
//! TTL. Most resources are HTTP services, so this crate puts the fencing check in front of them:
//!
//! - **Server**: [`FenceLayer`], a tower layer (axum, hyper, tonic-style stacks) that reads
//!   `Fencing-Token`, takes the resource key **from the route** (or any [`KeySource`]), confirms
//!   that the lease store issued the token, checks it against any
//!   [`FencedResource`](leasehold_core::FencedResource) (PostgreSQL, Redis, etcd, Kubernetes, SQLite,
//!   memory) and records it, **before** the handler runs. Refusals are RFC 9457
//!   `application/problem+json` ([`Problem`]): `409` stale (names the highest accepted token) or
//!   never issued, `428` missing, `400` malformed or naming another key than the route, `503`
//!   store or resource unavailable. The handler gets the [`AcceptedToken`].
//! - **Client**: [`FencingClientLayer`] (any tower HTTP client) and, with feature `reqwest`,
//!   `RequestBuilder::fenced(&guard)`: both attach the guard's token and key, and refuse to send
//!   (a typed [`NotHolder`] error, nothing leaves the process) once
//!   [`may_act`](leasehold_core::supervisor::LeaseGuardView::may_act) is false.
//!
//! - **Health and leadership gating**: [`HealthCheck`] (a liveness or readiness probe of a lease
//!   holder or an election candidate that fails when the lease's renewal has stalled past its
//!   deadline, as client-go's `HealthzAdaptor`; a tower service, and an axum route with feature
//!   `axum`) and [`LeaderGateLayer`] (serves only while this process leads; otherwise `503`
//!   naming the leader).
//!
//! ## Fence your API in ten lines: the key comes from the route
//! The resource a request writes decides the key that fences it: `POST /accounts/a-1/deposit` is
//! checked against key `a-1`, whatever key the client believes it holds. With axum, take the
//! route parameter ([`KeySource::route_param`], layer added inside the router with `route_layer`,
//! so that it runs after routing); in any tower stack, a path template ([`KeySource::path`]).
//! ```
//! use std::sync::Arc;
//! use axum::{Router, routing::post};
//! use leasehold_core::{FencedResource, LeaseStore};
//! use leasehold_http::{AcceptedToken, FenceLayer, KeySource};
//!
//! fn app(resource: Arc<dyn FencedResource>, store: Arc<dyn LeaseStore>) -> Router {
//!     Router::new()
//!         .route("/accounts/{id}/deposit", post(|t: AcceptedToken| async move {
//!             format!("deposit to {} under token {}", t.key(), t.token())
//!         }))
//!         .route_layer(FenceLayer::new(resource, store).key_source(KeySource::route_param("id")))
//! }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use std::time::Duration;
//! # use tower::ServiceExt;
//! # use leasehold_core::{AcquireRequest, LeaseKey, MemoryFencedResource, MemoryLeaseStore, OwnerId};
//! let store = Arc::new(MemoryLeaseStore::new());
//! let app = app(Arc::new(MemoryFencedResource::new()), store.clone());
//! let grant = |owner: &str| -> Result<AcquireRequest, leasehold_core::Error> {
//!     Ok(AcquireRequest::new(LeaseKey::new("a-1")?, OwnerId::new(owner)?, Duration::from_secs(1)))
//! };
//! let old = store.acquire(&grant("w1")?).await?.lease().ok_or("held")?;
//! let _ = store.release(&old).await?;
//! let new = store.acquire(&grant("w2")?).await?.lease().ok_or("held")?;
//! let deposit = |token: u64| {
//!     axum::http::Request::post("/accounts/a-1/deposit")
//!         .header("Fencing-Token", token)
//!         .body(axum::body::Body::empty())
//! };
//! assert_eq!(app.clone().oneshot(deposit(new.token().get())?).await?.status(), 200);
//! assert_eq!(app.clone().oneshot(deposit(old.token().get())?).await?.status(), 409); // stale
//! assert_eq!(app.clone().oneshot(deposit(new.token().get())?).await?.status(), 200); // goes on
//! assert_eq!(app.clone().oneshot(deposit(u64::MAX >> 1)?).await?.status(), 409); // never issued
//! # Ok(()) }
//! ```
//! Serve it with `axum::serve(tokio::net::TcpListener::bind(addr).await?, app)`; see
//! `examples/fenced_api.rs`. Requests need `Fencing-Token: <n>`; a token below the highest one
//! accepted for the key gets `409` with `highest_accepted_token` in the body. A request that also
//! sends `Fencing-Key` naming another key than the route's gets `400` naming both. The
//! `Fencing-Key` header as the key ([`KeySource::header`], the default of [`FenceLayer::new`])
//! suits a service that fences one path on behalf of many keys; there the client chooses.
//!
//! ## What the server layer guarantees
//! The check is [`FencedResource::install`](leasehold_core::FencedResource::install): atomic
//! check-and-record, so after a request with token `n` is accepted every later request with a
//! lower token is refused, on every replica sharing the resource. Only tokens the lease store
//! issued move the mark: a token above the highest confirmed one is confirmed with one
//! [`LeaseStore::inspect`](leasehold_core::LeaseStore::inspect) first, so a forged or foreign token
//! cannot fence out the real holder. The check and the handler's own write are two steps,
//! though; see [`FenceLayer`] for when to write through the resource too, and for the
//! assumptions.
//!
//! ## Cancellation
//! [`HealthService`]'s and [`LeaderGate`]'s refusal futures are ready at once (cancel safe); a
//! request the gate lets through is as cancel safe as the inner service.
//! [`FenceLayer::check`] and the layer's response future: if dropped during the check, the mark
//! may or may not have moved and the handler has not run. The client layer's future and
//! `FencedRequest::send` are as cancel safe as the inner client: a dropped request may or may not
//! have been sent.
//!
//! ## Feature flags
//! - `axum`: `AcceptedToken` and `Option<AcceptedToken>` as axum extractors.
//! - `reqwest`: `FencedRequestExt::fenced` for `reqwest::RequestBuilder` (rustls, no default
//!   features).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod client;
mod gate;
mod key;
mod leader;
mod problem;
mod server;

#[cfg(feature = "axum")]
mod axum_ext;

pub use client::{ClientError, FencingClient, FencingClientLayer, NotHolder, fencing_headers};
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use client::{FencedRequest, FencedRequestExt, SendError};
pub use gate::{LeaderGate, LeaderGateLayer};
pub use key::KeySource;
pub use leader::{HealthCheck, HealthReport, HealthService, LEASE_LEADER, LeaderTracker};
pub use problem::{PROBLEM_JSON, Problem};
pub use server::{AcceptedToken, DEFAULT_CHECK_TIMEOUT, FenceLayer, FenceService, Requirement};

/// The request header that carries the fencing token (`Fencing-Token`), a decimal integer in
/// `1..=i64::MAX`. `lease run` exports the same value as `LEASE_FENCING_TOKEN`.
pub const FENCING_TOKEN: http::HeaderName = http::HeaderName::from_static("fencing-token");

/// The request header that carries the resource key (`Fencing-Key`), a legal
/// [`LeaseKey`](leasehold_core::LeaseKey).
pub const FENCING_KEY: http::HeaderName = http::HeaderName::from_static("fencing-key");

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
