//! # lease-http: fencing for HTTP services, both sides
//!
//! A lease decides who may *start* work; the resource is what stops a holder that paused past its
//! TTL. Most resources are HTTP services, so this crate puts the fencing check in front of them:
//!
//! - **Server**: [`FenceLayer`], a tower layer (axum, hyper, tonic-style stacks) that reads
//!   `Fencing-Token` and the resource key (`Fencing-Key`, a route parameter, or any
//!   [`KeySource`]), checks it against any [`FencedResource`](lease_core::FencedResource)
//!   (PostgreSQL, Redis, etcd, Kubernetes, SQLite, memory) and records it, **before** the handler
//!   runs. Refusals are RFC 9457 `application/problem+json` ([`Problem`]): `409` stale (names
//!   the highest accepted token), `428` missing, `400` malformed, `503` resource unavailable.
//!   The handler gets the [`AcceptedToken`].
//! - **Client**: [`FencingClientLayer`] (any tower HTTP client) and, with feature `reqwest`,
//!   `RequestBuilder::fenced(&guard)`: both attach the guard's token and key, and refuse to send
//!   (a typed [`NotHolder`] error, nothing leaves the process) once
//!   [`may_act`](lease_core::supervisor::LeaseGuardRef::may_act) is false.
//!
//! ## Fence your API in ten lines
//! ```
//! use std::sync::Arc;
//! use axum::{Extension, Router, routing::post};
//! use lease_core::{FencedResource, MemoryFencedResource};
//! use lease_http::{AcceptedToken, FenceLayer};
//!
//! fn app(resource: Arc<dyn FencedResource>) -> Router {
//!     Router::new()
//!         .route("/ledger", post(|Extension(t): Extension<AcceptedToken>| async move {
//!             format!("accepted {}", t.token())
//!         }))
//!         .layer(FenceLayer::new(resource))
//! }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use tower::ServiceExt;
//! let app = app(Arc::new(MemoryFencedResource::new()));
//! let write = |token: &str| {
//!     axum::http::Request::post("/ledger")
//!         .header("Fencing-Token", token)
//!         .header("Fencing-Key", "ledger")
//!         .body(axum::body::Body::empty())
//! };
//! assert_eq!(app.clone().oneshot(write("7")?).await?.status(), 200);
//! assert_eq!(app.clone().oneshot(write("6")?).await?.status(), 409); // stale: 7 was accepted
//! assert_eq!(app.clone().oneshot(write("7")?).await?.status(), 200); // the holder goes on
//! # Ok(()) }
//! ```
//! Serve it with `axum::serve(tokio::net::TcpListener::bind(addr).await?, app)`; see
//! `examples/fenced_api.rs`. With feature `axum`, `AcceptedToken` is also an extractor by itself.
//! Requests then need `Fencing-Token: <n>` and `Fencing-Key: <key>`; a token below the highest
//! one accepted for the key gets `409` with `highest_accepted_token` in the body.
//!
//! ## What the server layer guarantees
//! The check is [`FencedResource::install`](lease_core::FencedResource::install): atomic
//! check-and-record, so after a request with token `n` is accepted every later request with a
//! lower token is refused, on every replica sharing the resource. The check and the handler's own
//! write are two steps, though; see [`FenceLayer`] for when to write through the resource too.
//!
//! ## Cancellation
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
mod problem;
mod server;

#[cfg(feature = "axum")]
mod axum_ext;

pub use client::{ClientError, FencingClient, FencingClientLayer, NotHolder, fencing_headers};
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use client::{FencedRequest, FencedRequestExt, SendError};
pub use problem::{PROBLEM_JSON, Problem};
pub use server::{
    AcceptedToken, DEFAULT_CHECK_TIMEOUT, FenceLayer, FenceService, KeySource, Requirement,
};

/// The request header that carries the fencing token (`Fencing-Token`), a decimal integer in
/// `1..=i64::MAX`. `lease run` exports the same value as `LEASE_FENCING_TOKEN`.
pub const FENCING_TOKEN: http::HeaderName = http::HeaderName::from_static("fencing-token");

/// The request header that carries the resource key (`Fencing-Key`), a legal
/// [`LeaseKey`](lease_core::LeaseKey).
pub const FENCING_KEY: http::HeaderName = http::HeaderName::from_static("fencing-key");
