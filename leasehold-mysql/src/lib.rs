//! # leasehold-mysql
//!
//! Leases with fencing tokens on MySQL and MariaDB (InnoDB), over `sqlx`: a
//! [`LeaseStore`](leasehold_core::LeaseStore) on a lease table, fenced transactions in the same
//! database, a high-water-mark [`FencedResource`](leasehold_core::FencedResource), and `GET_LOCK`
//! advisory locks.
//!
//! ## The tables
//! One row per key: `(resource_key VARBINARY(255) PRIMARY KEY, owner VARBINARY(255),
//! lease_until DATETIME(6) in UTC, fencing_token BIGINT, ttl_ms BIGINT)`, plus `<table>_floor`
//! (one row per deleted key) and `<table>_fence` (the high-water marks).
//! [`MysqlLeaseStore::connect`] creates them if missing ([`MysqlLeaseStore::migrate`],
//! idempotent); the same DDL ships as `sql/0001_leases.sql`. Keys and owners are binary columns,
//! so they compare byte for byte whatever the server's collation.
//!
//! - **acquire** of a key that has a row is one statement, a guarded `UPDATE` (free, expired or
//!   the same owner), whose new token comes back in the OK packet (`LAST_INSERT_ID(expr)`). A
//!   refused acquire reads the holder; a new key is an `INSERT`. A concurrent insert of the
//!   same key (1062), a deadlock (1213) or a lock wait timeout (1205) starts the acquire over,
//!   within the operation timeout. Sessions run at `READ COMMITTED`, so there are no gap locks.
//! - **renew** and **release** are single conditional `UPDATE`s by key, owner *and* token;
//!   release keeps the row, so the next token is still greater.
//! - **Expiry is decided by the server's clock only**: `UTC_TIMESTAMP(6)` at the start of the
//!   deciding statement, independent of the session's time zone. As for PostgreSQL, a forward
//!   step of the server's clock ends leases early; fencing still rejects the old holder.
//! - **Tokens never go back**, not after release, expiry, row deletion, restart or failover:
//!   every grant's token is `GREATEST(old + 1, server clock in µs)` (a new key's `old` is its
//!   floor row). Triggers enforce the per-key floor for every statement, the library's or
//!   anyone else's: an inserted row starts above its key's floor row, an update can only raise
//!   a token, and a deleted row's token is kept in the floor row. `TRUNCATE` fires no trigger:
//!   after it, the clock floor alone keeps new tokens above the old ones.
//!
//! ## Failover to an asynchronous replica
//! MySQL and MariaDB replicate asynchronously by default. A replica promoted after the primary
//! died may lack the newest commits: grants, renewals, releases and fence marks. What that does:
//!
//! - **tokens still go up**: the promoted server's clock is past every token the old primary
//!   issued (each was at most the old primary's clock in µs, or its row's previous token plus
//!   one, and grants are far fewer than one per µs), so the next grant of any key is greater.
//!   **Assumption**: the promoted server's clock does not lag the old primary's by more than
//!   the failover took (seconds, against clock offsets of milliseconds under NTP). The
//!   capability is [`TokenDurability::ClockFloored`](leasehold_core::TokenDurability::ClockFloored).
//!   `tests/failover.rs` promotes a replica that lost the newest grant and checks that the next
//!   grant is above it.
//! - **a lost grant may be granted again**: a lease granted just before the failover may be
//!   missing, and the key granted to someone else while the first holder still believes it
//!   holds it. Fencing handles it: the new holder's token is greater, so a fenced resource that
//!   has seen it rejects the old holder, and a fenced transaction of the old holder finds no row
//!   with its token and writes nothing.
//! - **a lost fence mark** (on the replicated `<table>_fence`) lets a stale holder whose token
//!   lies between the surviving mark and the lost one write once more; the writes that raised
//!   the lost mark were lost in the same failover. To fence across a failover with no write
//!   accepted twice, run semi-synchronous replication (`rpl_semi_sync_master_wait_point =
//!   AFTER_SYNC`) or a Galera/group-replication cluster, where no acknowledged commit is lost.
//!
//! ## Options in the URL
//! Every [`MysqlOptions`] setting can be given in the URL's query ([`MysqlOptions::with_url`]).
//! The driver's own parameters ([`DRIVER_URL_PARAMETERS`]: `ssl-mode`, `ssl-ca`, `ssl-cert`,
//! `ssl-key`, `charset`, `socket`, ...) pass through; **any other parameter is an
//! [`Error::Config`](leasehold_core::Error::Config)** naming it. Durations take a unit: `250ms`,
//! `2s`, `5m`, `1h`.
//!
//! | parameter | sets | example |
//! |---|---|---|
//! | `table` | [`MysqlOptions::new`]'s table, optionally `database.table` | `table=locks.leases` |
//! | `migrate` | [`MysqlOptions::with_migrate`] | `migrate=false` |
//! | `op_timeout` | [`MysqlOptions::with_op_timeout`] | `op_timeout=2s` |
//! | `max_connections` | [`MysqlOptions::with_max_connections`] | `max_connections=4` |
//! | `acquire_timeout` | [`MysqlOptions::with_acquire_timeout`] | `acquire_timeout=500ms` |
//! | `tx_lock_timeout`, `tx_deadline` | [`TxTimeouts`] | `tx_deadline=3s` |
//! | `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key`, `charset`, `socket`, ... | the driver | `ssl-mode=verify_identity` |
//!
//! `mariadb://` is accepted as a synonym of `mysql://`.
//!
//! ## Acquire
//! ```no_run
//! use std::time::Duration;
//! use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome};
//! use leasehold_mysql::MysqlLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = MysqlLeaseStore::connect("mysql://root@127.0.0.1:3306/test?op_timeout=2s").await?;
//! let req = AcquireRequest::new(LeaseKey::new("tenant-42")?, OwnerId::with_label("worker-a"), Duration::from_secs(10));
//! let lease = match store.acquire(&req).await? {
//!     AcquireOutcome::Acquired(lease) => lease,
//!     AcquireOutcome::Held(h) => return Ok(println!("{} holds it (token {})", h.owner, h.token)),
//! };
//! assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
//! # Ok(()) }
//! ```
//!
//! ## Fenced transaction and fenced resource
//! [`MysqlLeaseStore::fenced_transaction`] runs the caller's statements in one InnoDB
//! transaction that has locked (`FOR UPDATE`) and validated the lease row, and checks it again
//! before `COMMIT`; a lost lease returns [`FencedTx::LeaseLost`] and writes nothing.
//! [`MysqlFencedResource`] ([`MysqlLeaseStore::fenced_resource`]) accepts a write only if its
//! token is at least the key's `last_fencing_token` and raises the mark in the same statement.
//!
//! ## Advisory locks
//! [`AdvisoryLocks`] runs a closure while holding `GET_LOCK(<name>)` on the connection the
//! closure runs on; the [`advisory`] module says when they fit (duplicate work) and when they do
//! not (protecting data: they are session locks, not fenced).
//!
//! ## Errors
//! Driver errors are mapped by the server's error number: connection loss, server shutdown,
//! a read-only (demoted) server and deadlocks are
//! [`Error::Unavailable`](leasehold_core::Error::Unavailable) (retryable); lock wait timeouts
//! and interrupted statements are [`Error::Timeout`](leasehold_core::Error::Timeout); a refused
//! login, a missing database or a missing table are
//! [`Error::Config`](leasehold_core::Error::Config); anything else is
//! [`Error::Backend`](leasehold_core::Error::Backend). A failure to take a pooled connection is
//! built with [`Error::refused`](leasehold_core::Error::refused): nothing was sent.

pub mod advisory;
mod batch;
mod client;
mod config;
mod error;
mod fenced;
mod inspect;
pub mod protocol;
mod schema;
mod store;

pub use advisory::{AdvisoryLocks, advisory_lock_name};
pub use config::{
    DRIVER_URL_PARAMETERS, MAX_DATABASE_LEN, MAX_TABLE_LEN, MysqlOptions, TableName, TxTimeouts,
    URL_OPTIONS,
};
pub use fenced::{FencedTx, MysqlFencedResource};
pub use store::{MIN_TTL, MysqlLeaseStore};
