//! # leasehold
//!
//! Distributed leases, **fencing tokens** and leader election over PostgreSQL, Redis, etcd,
//! Kubernetes and SQLite, behind one contract. Pick a backend with one cargo feature and one URL;
//! everything else (the supervisor that renews, the election, the fenced resource) is the same on
//! every backend.
//!
//! This crate is the facade: it re-exports [`leasehold_core`] (the contract, the in-memory reference
//! store, the [`supervisor`] and [`election`]) and, behind features, each backend crate as a
//! module, plus [`connect`], which turns a URL into a shared `dyn` [`LeaseStore`].
//!
//! ## The safety model
//! A lock service decides who may *start* work; it cannot stop a process that pauses (GC, VM
//! suspend, a network partition) and resumes after its lease expired, still believing it holds
//! the lease. So:
//! - **Liveness comes from leases.** A lease expires unless renewed, so a healthy process takes
//!   over from a dead one.
//! - **Safety comes from the resource.** Every grant carries a [`FencingToken`] that strictly
//!   increases per key and never goes back (across releases, expiry and restarts of the store, as
//!   far as each backend's [`Capabilities`] promise). Every protected write carries the token; the
//!   resource remembers the highest token it accepted and rejects older ones
//!   ([`FencedResource`]). A paused process that wakes up late is refused by the resource, not by
//!   its own belief.
//! - **The holder learns in time.** Each [`Lease`] has a local deadline computed from the instant
//!   its request was *sent*, minus a drift margin, so this process gives up before the store
//!   expires the lease. The [`supervisor`] renews, publishes health (`Held`, `AtRisk`, `Lost`) and
//!   cancels guarded work strictly before that deadline.
//! - **Outcomes are not errors.** "Someone else holds it", "the lease is lost" and "the token is
//!   stale" are enum variants you must match; [`Error`] is for bad input, unreachable stores and
//!   protocol violations, with [`Error::is_retryable`].
//!
//! ## Quick start
//! ```
//! use std::time::Duration;
//! use leasehold::{AcquireOutcome, AcquireRequest, LeaseKey, OwnerId, WriteOp};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! // "memory:" needs no server; use "postgres://...", "redis://...", "sqlite://leases.db", ...
//! let (store, resource) = leasehold::connect_with_resource("memory:").await?;
//! let key = LeaseKey::new("nightly-report")?;
//! let req = AcquireRequest::new(key.clone(), OwnerId::with_label("worker-a"), Duration::from_secs(10));
//! match store.acquire(&req).await? {
//!     AcquireOutcome::Acquired(lease) => {
//!         // Every protected write carries the token; the resource rejects older ones.
//!         let out = resource.write(&key, lease.token(), WriteOp::Put(b"done".to_vec())).await?;
//!         assert!(out.is_accepted());
//!         let _ = store.release(&lease).await?;
//!     }
//!     AcquireOutcome::Held(holder) => println!("held by {} for {:?}", holder.owner, holder.remaining),
//! }
//! # Ok(()) }
//! ```
//!
//! Long-running work goes through the [`supervisor`], which waits (bounded), renews, and
//! cancels the work if the lease is lost:
//! ```
//! use std::time::Duration;
//! use leasehold::LeaseKey;
//! use leasehold::supervisor::{Acquisition, Supervisor, SupervisorConfig};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! let store = leasehold::connect("memory:").await?;
//! let config = SupervisorConfig::new(Duration::from_secs(10)).with_acquire_wait(Duration::from_secs(30));
//! let sup = Supervisor::from_arc(store, config);
//! if let Acquisition::Acquired(guard) = sup.acquire(&LeaseKey::new("reindex")?).await? {
//!     let token = guard.token();
//!     let done = guard.run(async move { /* write with `token` */ token.get() }).await;
//!     assert!(done.is_ok());
//!     guard.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## Features and backends
//! No backend is enabled by default; the in-memory store is always there.
//!
//! | feature | module | URL | tokens | expiry judged by | notes |
//! |---------|--------|-----|--------|------------------|-------|
//! | (none) | [`memory`] | `memory:` | per process | local monotonic clock | tests, demos |
//! | `postgres` | `leasehold::postgres` | `postgres://user@host:5432/db` | floored by the server clock (`ClockFloored`) | the server's `clock_timestamp()` | fenced transactions in the same database |
//! | `mysql` | `leasehold::mysql` | `mysql://user@host:3306/db`, `mariadb://` | floored by the server clock (`ClockFloored`) | the server's `UTC_TIMESTAMP(6)` | MySQL or MariaDB (InnoDB); fenced transactions in the same database |
//! | `redis` | `leasehold::redis` | `redis://host:6379/0`, `rediss://` | floored by the server clock (`ClockFloored`) | the server's clock (`PX`) | asynchronous replication: fence your writes, in a resource that does not fail over with that Redis |
//! | `etcd` | `leasehold::etcd` | `etcd://host:2379,host:2379`, `etcds://` | durable: Raft revisions (`Durable`) | etcd's lease TTL | TTLs in whole seconds; needs `protoc` to build |
//! | `k8s` | `leasehold::k8s` | `k8s://NAMESPACE`, `k8s://` | durable: etcd revisions (`Durable`) | local observation, as client-go | TTLs in whole seconds; ambient kubeconfig or in-cluster config; the final binary enables one `k8s-openapi/v1_xx` feature |
//! | `sqlite` | `leasehold::sqlite` | `sqlite://PATH`, `sqlite:///ABS/PATH` | durable: the file (`Durable`) | the host's clock | many processes on **one host** |
//!
//! Each backend states its promises at run time in [`LeaseStore::capabilities`]; the backend
//! modules document the details (and the failure modes each one can and cannot cover).
//!
//! ```toml
//! [dependencies]
//! leasehold = { version = "0.1", features = ["postgres"] }
//! ```
//!
//! ## Pairing a store with its own fenced resource
//! [`connect_with_resource`] returns the backend's own [`FencedResource`] next to the store.
//! On every backend but Redis that resource is as durable as the tokens. On **Redis** both
//! live in one asynchronously replicated service: the failover (or split brain) that lets two
//! owners hold a lease can also lose the resource's high-water mark, so the resource may accept
//! a lower token after a higher one, exactly when it is needed
//! (`docs/adr/0021-redis-failover-wait-and-fencing.md`). [`connect_with_resource`] therefore
//! logs a `tracing` warning for Redis; [`connect_with_resource_policy`] makes the choice
//! explicit ([`SharedFailover::Refuse`] or [`SharedFailover::Accept`]), and
//! [`StoreUrl::resource_shares_failover`] tells in advance.
//!
//! ## URLs
//! [`connect`] accepts the forms in the table above; [`StoreUrl`] parses them without
//! connecting. The backend receives the URL as written, so its query configures the store
//! (table, key prefix, name prefix, timeouts, TLS files: each backend module lists its
//! parameters under "Options in the URL"), and a parameter the backend does not know is an
//! [`Error::Config`] naming it:
//! `k8s://payments?name_prefix=lease-&request_timeout=5s&kubeconfig=/etc/lease/kubeconfig`,
//! `etcds://10.0.0.1:2379?tls_ca=/pki/ca.crt`, `sqlite:///var/lib/app/leases.db?busy_timeout=2s`.
//! On Kubernetes, `group_set=SET` (and `groups=N`) selects the grouped mode
//! (`k8s::K8sGroupedStore`, for a shard set of thousands of shards: renewal costs requests per
//! owner, not per key):
//! `k8s://payments?group_set=invoices&groups=16`.
//! Displayed, a [`StoreUrl`] hides the password of its user information and of any query
//! parameter named like one (`password=`, `sslpassword=`).
//!
//! A URL whose feature is not enabled fails with [`Error::Config`] naming the feature:
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! match leasehold::connect("ftp://example.org").await {
//!     Err(leasehold::Error::Config { message, .. }) => assert!(message.contains("unknown store URL scheme")),
//!     other => panic!("{other:?}"),
//! }
//! # }
//! ```
//!
//! ## The command line
//! The `lease` binary (crate `leasehold-cli`) runs a command under a lease (`lease run --key K --
//! CMD`, or as one of at most `N` runners with `--limit N`), shows who holds keys (`lease status
//! K`) and joins elections (`lease elect --name N`), with the same URLs in `--store` or
//! `LEASE_STORE` and an embedded SQLite file by default.
//!
//! ## Modules
//! - [`store`]: the [`LeaseStore`] contract; [`memory`]: the reference implementation.
//! - [`fencing`]: [`FencingToken`], [`FencedResource`], [`MemoryFencedResource`].
//! - [`supervisor`]: bounded acquisition, renewal, health, guarded work.
//! - [`election`]: leader election whose term is the fencing token.
//! - [`semaphore`]: fenced semaphores, at most `N` holders of one name, each permit a supervised
//!   lease on one of `N` slot keys whose token the guarded resource fences by.
//! - [`capability`]: what each backend promises.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;
mod url;

pub use connect::{
    SharedFailover, connect, connect_resource, connect_with_resource, connect_with_resource_policy,
};
#[doc(no_inline)]
pub use leasehold_core::*;
pub use url::{SCHEMES, StoreUrl};

/// The attribute that implements [`LeaseStore`] (an `async_trait`) for your own type, for
/// example a wrapper around another store.
pub use async_trait::async_trait;

/// The PostgreSQL backend (feature `postgres`): the crate `leasehold-postgres`.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use leasehold_postgres as postgres;

/// The MySQL / MariaDB backend (feature `mysql`): the crate `leasehold-mysql`.
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
#[doc(inline)]
pub use leasehold_mysql as mysql;

/// The Redis backend (feature `redis`): the crate `leasehold-redis`.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use leasehold_redis as redis;

/// The etcd backend (feature `etcd`): the crate `leasehold-etcd`.
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
#[doc(inline)]
pub use leasehold_etcd as etcd;

/// The Kubernetes backend (feature `k8s`): the crate `leasehold-k8s`.
#[cfg(feature = "k8s")]
#[cfg_attr(docsrs, doc(cfg(feature = "k8s")))]
#[doc(inline)]
pub use leasehold_k8s as k8s;

/// The SQLite backend (feature `sqlite`): the crate `leasehold-sqlite`.
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
#[doc(inline)]
pub use leasehold_sqlite as sqlite;

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
