//! # leasehold-core
//!
//! Distributed leases with **fencing tokens**: the contract ([`LeaseStore`], [`FencedResource`]),
//! the in-memory reference store, the renewal supervisor and leader election.
//!
//! ## The safety model
//! A lock service decides who may *start* work; it cannot stop a process that pauses (GC, VM
//! suspend, partition) and resumes after its lease expired. So:
//! - **Liveness** comes from leases: expiry lets a healthy owner take over.
//! - **Safety** comes from the *resource*: every acquisition yields a [`FencingToken`] that
//!   strictly increases per key and never goes back. Every protected write carries it; the
//!   resource remembers the highest token it accepted and rejects older ones
//!   ([`FencedResource`]).
//! - An [`OwnerId`] tells the store whose lease it is; it is not a fence.
//! - Expiry is judged by the store's clock (or, without one, by local monotonic time), never by
//!   comparing wall clocks of different hosts. Every [`Lease`] carries a local deadline computed
//!   from the instant its request was *sent*, so this process gives up before the store expires it.
//! - A **host suspend** (sleep, hibernation) stops the monotonic clock but not the store's. The
//!   supervisor therefore judges its leases on *validity time*, the monotonic clock plus the time
//!   spent suspended ([`clock`]): on Linux it reads `CLOCK_BOOTTIME`, so after resume
//!   `may_act()` is false at once, and health turns `Lost` (work cancelled, leadership ended)
//!   within a twentieth of the TTL (at most 1 s) of tokio time. On other operating systems only the
//!   monotonic clock is read: a suspend goes unnoticed locally until a renewal is refused, and only
//!   the fencing token protects the resource meanwhile.
//!
//! ## Quick start
//! ```
//! use std::time::Duration;
//! use leasehold_core::*;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = MemoryLeaseStore::new();
//! let resource = MemoryFencedResource::new();
//! let key = LeaseKey::new("tenant-42")?;
//!
//! let req = AcquireRequest::new(key.clone(), OwnerId::with_label("worker-a"), Duration::from_secs(10));
//! let lease = match store.acquire(&req).await? {
//!     AcquireOutcome::Acquired(lease) => lease,
//!     AcquireOutcome::Held(holder) => panic!("held by {} until {:?}", holder.owner, holder.remaining),
//! };
//! // Every protected write carries the token; the resource rejects older ones.
//! let out = resource.write(&key, lease.token(), WriteOp::Put(b"done".to_vec())).await?;
//! assert!(out.is_accepted());
//! let _ = store.release(&lease).await?;
//! # Ok(()) }
//! ```
//!
//! ## Holding a lease while working: the supervisor
//! [`supervisor::Supervisor`] acquires with a bounded wait, renews every third of the TTL, and
//! publishes the lease's health (`Held`, `AtRisk`, `Lost`, `Released`). Guarded work is
//! cancelled strictly **before** the local validity deadline when renewal cannot be confirmed
//! while the process runs; a process that resumes past that deadline (a host suspend) sees
//! `may_act()` false at once, but its work is cancelled only when the supervisor next looks at
//! the clock, up to its check interval (a twentieth of the TTL, at most 1 s) later:
//!
//! ```
//! use std::time::Duration;
//! use leasehold_core::{LeaseKey, MemoryLeaseStore};
//! use leasehold_core::supervisor::{RunOutcome, Supervisor, SupervisorConfig};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let sup = Supervisor::new(
//!     MemoryLeaseStore::new(),
//!     SupervisorConfig::new(Duration::from_secs(15)).with_acquire_wait(Duration::from_secs(60)),
//! );
//! let outcome = sup
//!     .run(&LeaseKey::new("nightly-job")?, |guard| async move {
//!         // carry guard.token() into every protected write
//!         guard.token()
//!     })
//!     .await?;
//! assert!(matches!(outcome, RunOutcome::Completed { .. }));
//! # Ok(()) }
//! ```
//!
//! ## Leader election
//! [`election::Election`]: the leader's term is its fencing token; a local "am I leader" flag is
//! never authority.
//!
//! ## Choosing a backend
//! | backend | crate | tokens survive restart | wake-up | expiry clock |
//! |---|---|---|---|---|
//! | memory | `leasehold-core` | no (process lifetime) | watch | in-process |
//! | PostgreSQL | `leasehold-postgres` | floored by the server clock | `LISTEN`/`NOTIFY` | server |
//! | Redis | `leasehold-redis` | floored by the server clock | notifications | server |
//! | etcd | `leasehold-etcd` | yes (Raft log) | watch | server |
//! | Kubernetes | `leasehold-k8s` | yes (etcd revisions) | watch | observed locally |
//! | SQLite | `leasehold-sqlite` | yes (file) | in-process wake + `data_version` poll | one host |
//!
//! ## Modules
//! - [`store`]: the [`LeaseStore`] contract; [`memory`]: the reference implementation.
//! - [`fencing`]: [`FencingToken`], [`FencedResource`], [`MemoryFencedResource`].
//! - [`capability`]: what each backend promises.
//! - [`backend`]: **for backend authors** only: TTL rounding, record decoding, lease grants.
//! - [`clock`]: the suspend-aware clock validity is judged on.
//! - [`mutation`]: switch points for protocol mutation testing (feature `mutants`; off by default).
//! - [`supervisor`]: bounded acquisition, renewal, health, guards.
//! - [`election`]: leader election.
//! - [`semaphore`]: fenced semaphores, at most `N` holders of one name, each permit a supervised
//!   lease on one of `N` slot keys.
//!
//! ## Who needs what
//! Applications need the crate root and [`supervisor`], [`election`], [`semaphore`] (and
//! [`hook`] for metrics). Backend authors need [`backend`], which also re-exports every contract
//! type a store implementation names, and [`mutation`]. The repository's `docs/api.md` lists
//! every public item by audience.
//!
//! ## Features
//! - `test-util`: `clock::ManualClock`, a clock whose host suspends tests simulate.
//! - `model`: `supervisor::{Machine, Event, Next}`, the supervisor's pure state machine, for the
//!   model checker and simulators that step it themselves. Not for applications: it may change
//!   in any release.
//! - `mutants`: lets one mutant named by the environment switch a backend's protocol text
//!   ([`mutation`]); without it every switch point is the identity.

pub mod backend;
pub mod capability;
pub mod clock;
pub mod election;
pub mod error;
pub mod fencing;
pub mod hook;
pub mod lease;
pub mod memory;
pub mod mutation;
pub mod semaphore;
pub mod store;
pub mod supervisor;
mod url_params;

pub use capability::{Capabilities, ExpiryClock, TokenDurability};
pub use error::{BoxError, Error, ErrorKind, Result};
pub use fencing::{
    FenceOp, FencedResource, FencingToken, MemoryFencedResource, ResourceState, WriteOp,
    WriteOutcome,
};
pub use lease::{
    AcquireOutcome, AcquireRequest, HeldBy, Holder, KeyState, Lease, LeaseKey, MAX_KEY_LEN,
    MAX_OWNER_LEN, MAX_TTL, OwnerId, ReleaseOutcome, RenewOutcome,
};
pub use memory::MemoryLeaseStore;
pub use store::{KeyWatch, LeaseStore};

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
