//! # leasehold-sqlite
//!
//! The SQLite backend of the lease library: leases with fencing tokens for **many processes on
//! one host** that share one database file. No server to run; it is the embedded default of the
//! `lease` command line.
//!
//! ## Quick start
//! ```no_run
//! use std::time::Duration;
//! use leasehold_core::{AcquireOutcome, AcquireRequest, FencedResource, LeaseKey, LeaseStore, OwnerId, WriteOp};
//! use leasehold_sqlite::SqliteLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = SqliteLeaseStore::connect("sqlite:///var/lib/myapp/leases.db").await?;
//! let key = LeaseKey::new("nightly-report")?;
//! let req = AcquireRequest::new(key.clone(), OwnerId::with_label("worker-a"), Duration::from_secs(30));
//! if let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? {
//!     // Protected writes carry the token; the resource rejects older generations.
//!     let res = store.fenced_resource();
//!     assert!(res.write(&key, lease.token(), WriteOp::Add(1)).await?.is_accepted());
//!     let _ = store.release(&lease).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## What it assumes
//! - **One host.** Every process opens the same file on a local file system. SQLite's locking is
//!   not reliable over network file systems (NFS, SMB): do not share the file between hosts.
//! - **One clock.** Expiry is judged by SQLite's clock inside each statement
//!   (`unixepoch('subsec')`, millisecond precision), which is the host's wall clock. All
//!   processes on the host read the same clock, so they agree on who holds a key. A wall-clock
//!   *step* (a manual change, an NTP step) shortens or lengthens every lease by that step: a step
//!   forward can expire a lease before its holder's local deadline. Fencing tokens keep the
//!   protected resource safe even then; keep the clock slewed (NTP, chrony), not stepped.
//! - **Tokens never go back.** A key's token lives in its lease row (`lease_holder`), which
//!   release and expiry keep (release only ends the lease); a grant writes one above both that
//!   token and the key's floor in `lease_generation`, and a trigger raises that floor to the
//!   token of any lease row deleted by anyone (a cleanup job, an operator). So tokens survive
//!   release, expiry, deleted lease rows, and crashes and restarts of any process, in a
//!   WAL-mode file ([`TokenDurability::Durable`](leasehold_core::TokenDurability)). By default
//!   ([`CommitSync::Normal`]) a crash of the whole *host* may roll back the last grants, whose
//!   holders all died with it; [`CommitSync::Full`] fsyncs every commit to survive that too, at
//!   the price of an fsync per operation. Deleting the file (or restoring an old copy, or
//!   dropping the `lease_holder` table) resets tokens: treat the file as state.
//! - **Atomic operations.** Acquire, renew, release and inspect are one statement each (an
//!   acquire refused by a holder reads who holds it with a second one); a writing statement
//!   takes the file's write lock before it runs. Within a process, writers to one file take
//!   turns in a fair queue in which renewals and releases go before acquires, and each store
//!   writes on one connection of its own; across processes they wait for each other in
//!   SQLite's busy handler. Writers wait up to the busy timeout
//!   ([`SqliteOptions::with_busy_timeout`], 5 s by default) and then fail with
//!   [`Error::Unavailable`](leasehold_core::Error::Unavailable) built by
//!   [`Error::refused`](leasehold_core::Error::refused): retryable, and certainly not applied
//!   ([`outcome_unknown`](leasehold_core::Error::outcome_unknown) is false).
//! - **Watch by registry and polling.** SQLite cannot notify other processes. A release wakes
//!   the key's watchers in the same process at once; commits by other processes are noticed by
//!   polling `PRAGMA data_version` (every 25 ms by default, only while something watches), so a
//!   waiter in another process hears of a release within about that interval. See
//!   [`SqliteLeaseStore`'s watch section](SqliteLeaseStore#watch);
//!   [`SqliteOptions::with_watch`]`(false)` turns it off.
//!
//! See `docs/adr/0050-sqlite-one-host-one-clock.md` for the reasoning.
//!
//! ## Opening a database
//! - [`SqliteLeaseStore::open`]`(path)` or [`SqliteLeaseStore::connect`]`("sqlite://path")`
//!   create the file if it is missing and create the schema (idempotently; several processes may
//!   do it at once). A directory that does not exist, a path that is a directory, a URL that is
//!   not `sqlite:` or an in-memory database is an [`Error::Config`](leasehold_core::Error::Config).
//! - [`SqliteOptions`] sets the busy timeout, the number of read connections, [`CommitSync`]
//!   and the watch (on or off, and its poll interval).
//! - Every option can also be given in the URL's query ([`SqliteOptions::with_url`]), on top of
//!   the options passed in code; the driver's own `mode`, `cache`, `immutable` and `vfs` pass
//!   through, and **any other parameter is an [`Error::Config`](leasehold_core::Error::Config)**.
//!   Durations take a unit (`250ms`, `2s`, `5m`, `1h`).
//!
//!   | parameter | sets | example |
//!   |---|---|---|
//!   | `busy_timeout` | [`SqliteOptions::with_busy_timeout`] | `busy_timeout=2s` |
//!   | `max_connections` | [`SqliteOptions::with_max_connections`] | `max_connections=2` |
//!   | `commit_sync` | [`SqliteOptions::with_commit_sync`]: `normal` or `full` | `commit_sync=full` |
//!   | `watch` | [`SqliteOptions::with_watch`] | `watch=false` |
//!   | `watch_poll_interval` | [`SqliteOptions::with_watch_poll_interval`] | `watch_poll_interval=50ms` |
//! - A file written by an older version of this crate is upgraded in place when it is opened
//!   (schema version 1 to 2: triggers added, no row rewritten); its tokens continue above the
//!   old ones. An older build then refuses the file (`Error::Config`, newer schema).
//!
//! ## Tables
//! `lease_meta` (schema version), `lease_holder`, `lease_generation`, `lease_fenced`, and two
//! triggers on `lease_holder`; they live next to any tables of your own in the same file. [`protocol`] holds the schema and every
//! statement the crate sends.

mod batch;
mod config;
mod error;
mod fenced;
mod gate;
mod inspect;
pub mod protocol;
mod store;
mod watch;

pub use config::{CommitSync, DRIVER_URL_PARAMETERS, SqliteOptions, URL_OPTIONS};
pub use fenced::SqliteFencedResource;
pub use store::SqliteLeaseStore;

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
