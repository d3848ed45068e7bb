//! # leasehold-postgres
//!
//! Leases with fencing tokens on PostgreSQL, over `sqlx`: a [`LeaseStore`](leasehold_core::LeaseStore)
//! on a lease table, fenced transactions, a high-water-mark [`FencedResource`](leasehold_core::FencedResource),
//! and transaction-scoped advisory locks.
//!
//! ## The table
//! One row per key, the seed's design: `(resource_key text primary key, owner text, lease_until
//! timestamptz, fencing_token bigint)`, plus `ttl_ms`. [`PostgresLeaseStore::connect`] creates it
//! if missing ([`PostgresLeaseStore::migrate`], idempotent); the same DDL ships as
//! `sql/0001_leases.sql` for teams that run migrations themselves. A team that already runs the
//! seed's `coordination_lease` table keeps it: see [Adopting an existing table](#adopting-an-existing-coordination_lease-table). The table name is configurable and schema-qualified ([`TableName`]), validated
//! before any SQL is built.
//!
//! - **acquire** is one statement, the seed's upsert: insert, or take over only when
//!   `lease_until <= clock_timestamp()` (or when the same owner asks again). Expiry is decided by
//!   the database's clock only. (A key that has a row is decided by that statement's `UPDATE`
//!   alone; only a key without a row takes a second round trip, the statement with the insert.)
//! - **renew** and **release** are single conditional `UPDATE`s by key, owner *and* token;
//!   release keeps the row, so the next token is still greater.
//! - **Tokens never go back**, not after release, expiry, row deletion, restart or failover: a
//!   trigger gives every new token `greatest(requested, nextval(seq), server clock in
//!   microseconds)`. The row carries a key's generation while it exists (a takeover requests
//!   `old + 1`); a keep trigger lifts the sequence over a deleted or truncated row's token; and
//!   the clock floor covers a failover to an **asynchronous standby** that lost the newest grants
//!   and sequence values. The seed's own statements (`fencing_token = fencing_token + 1`) go
//!   through the same trigger. See `docs/adr/0010-postgres-token-floor.md`.
//!
//!   **Assumption** (failover only): the promoted server's clock does not lag the old primary's
//!   by more than the failover took (seconds, against clock offsets of milliseconds under NTP).
//!   With synchronous replication (`synchronous_commit = on` and a synchronous standby) no grant
//!   is lost and the clock is not needed. The capability is
//!   [`TokenDurability::ClockFloored`](leasehold_core::TokenDurability::ClockFloored).
//!
//! - **Expiry follows the server's wall clock** (`clock_timestamp()`): a forward step of the
//!   database server's clock (a manual `date -s`, an NTP *step*) ends every lease early by the
//!   size of the step, so the next owner is granted while the old holder still believes it holds
//!   the lease (its local deadline runs on its own monotonic clock). Fencing still rejects the old
//!   holder's writes: [`fenced_transaction`](PostgresLeaseStore::fenced_transaction) reports
//!   [`FencedTx::LeaseLost`], and both fenced resources reject its older token once the new owner
//!   has written or installed. Run the server with a clock that **slews** rather than steps
//!   (chrony's default `makestep` only at boot, or `ntpd -x`), as for the Redis backend;
//!   SQLite has the same caveat for its host.
//!
//! - **release notifies**: with [`PostgresOptions::with_notify`] on (the default), a release
//!   that frees a key also runs `pg_notify(<channel>, <key>)` in the same statement, so a waiting
//!   [`Supervisor`](leasehold_core::supervisor::Supervisor) is woken by
//!   [`watch`](leasehold_core::LeaseStore::watch) instead of polling. See `docs/adr/0011-postgres-listen-notify.md`.
//!
//! ## Options in the URL
//! Every [`PostgresOptions`] setting can be given in the URL's query, on top of the options
//! passed in code ([`PostgresOptions::with_url`]), so that a URL alone (`lease run --store ...`,
//! an environment variable) configures the store. The driver's own libpq parameters
//! ([`DRIVER_URL_PARAMETERS`]) pass through; **any other parameter is an
//! [`Error::Config`](leasehold_core::Error::Config)** naming it, so a misspelt `sslrootcert` is never
//! ignored. Durations take a unit: `250ms`, `2s`, `5m`, `1h`.
//!
//! | parameter | sets | example |
//! |---|---|---|
//! | `table` | [`PostgresOptions::new`]'s table, schema-qualified | `table=public.coordination_lease` |
//! | `layout` | [`PostgresOptions::with_layout`]: `library` or `coordination_lease` (`seed`, its old name, is still accepted) | `layout=coordination_lease` |
//! | `migrate` | [`PostgresOptions::with_migrate`] | `migrate=false` |
//! | `notify` | [`PostgresOptions::with_notify`] | `notify=false` |
//! | `op_timeout` | [`PostgresOptions::with_op_timeout`] | `op_timeout=2s` |
//! | `max_connections` | [`PostgresOptions::with_max_connections`] | `max_connections=4` |
//! | `acquire_timeout` | [`PostgresOptions::with_acquire_timeout`] | `acquire_timeout=500ms` |
//! | `tx_lock_timeout`, `tx_statement_timeout`, `tx_idle_timeout`, `tx_deadline` | [`TxTimeouts`] | `tx_deadline=3s` |
//! | `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `application_name`, `options`, ... | the driver | `sslmode=verify-full` |
//!
//! ```no_run
//! use leasehold_postgres::PostgresLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! // The seed's table, used in place, with a 2 s bound per operation.
//! let store = PostgresLeaseStore::connect(
//!     "postgres://app@db:5432/app?table=public.coordination_lease&layout=coordination_lease&op_timeout=2s",
//! )
//! .await?;
//! # Ok(()) }
//! ```
//!
//! ## TLS and authentication
//! The URL's libpq parameters go to the driver unchanged: `sslmode=verify-full` with
//! `sslrootcert=CA.pem` verifies the server's certificate and name, `sslcert=`/`sslkey=` add a
//! client certificate (PostgreSQL's `cert` authentication), and `user:password@` authenticates by
//! password (SCRAM). TLS is rustls with the webpki roots when no `sslrootcert` is named; no
//! OpenSSL is linked. A certificate that does not verify (unknown issuer, expired, wrong name), a
//! missing client certificate, a refused password or a server that requires TLS from a client
//! without it are [`Error::Config`](leasehold_core::Error::Config) errors that name the cause, never
//! retryable; an unreachable server is [`Error::Unavailable`](leasehold_core::Error::Unavailable).
//!
//! ```no_run
//! use leasehold_postgres::PostgresLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = PostgresLeaseStore::connect(
//!     "postgres://lease@db.internal:5432/app\
//!      ?sslmode=verify-full&sslrootcert=/etc/lease/ca.pem\
//!      &sslcert=/etc/lease/client.pem&sslkey=/etc/lease/client.key",
//! )
//! .await?;
//! # Ok(()) }
//! ```
//!
//! ## Acquire
//! ```no_run
//! use std::time::Duration;
//! use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome};
//! use leasehold_postgres::{PostgresLeaseStore, PostgresOptions, TableName};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let opts = PostgresOptions::new(TableName::parse("public.leases")?);
//! let store = PostgresLeaseStore::connect_with("postgres://postgres@127.0.0.1:5432/test", opts).await?;
//! let req = AcquireRequest::new(LeaseKey::new("tenant-42")?, OwnerId::with_label("worker-a"), Duration::from_secs(10));
//! let lease = match store.acquire(&req).await? {
//!     AcquireOutcome::Acquired(lease) => lease,
//!     AcquireOutcome::Held(h) => return Ok(println!("{} holds it (token {})", h.owner, h.token)),
//! };
//! // ... work, renewing before lease.deadline() (or use leasehold_core::supervisor) ...
//! assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
//! # Ok(()) }
//! ```
//!
//! ## Fenced transaction
//! The caller's statements run in one transaction that has locked and validated the lease row
//! (owner, token, unexpired); a lost lease returns [`FencedTx::LeaseLost`] and writes nothing.
//! ```no_run
//! # use std::time::Duration;
//! # use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, OwnerId};
//! # use leasehold_postgres::{FencedTx, PostgresLeaseStore};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! # let store = PostgresLeaseStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
//! # let lease = store.acquire(&AcquireRequest::new(LeaseKey::new("ledger")?, OwnerId::random(), Duration::from_secs(10))).await?.lease().unwrap();
//! let token = lease.token().to_i64();
//! let out = store
//!     .fenced_transaction(&lease, |conn| {
//!         Box::pin(async move {
//!             sqlx::query("INSERT INTO audit (token, note) VALUES ($1, 'rebuilt')")
//!                 .bind(token)
//!                 .execute(&mut *conn)
//!                 .await?;
//!             Ok(())
//!         })
//!     })
//!     .await?;
//! assert!(matches!(out, FencedTx::Committed(()) | FencedTx::LeaseLost));
//! # Ok(()) }
//! ```
//!
//! ## Fenced resources
//! Two [`FencedResource`](leasehold_core::FencedResource)s, both run through the shared fencing cases:
//! [`LeaseRowFence`] validates each write against the lease row's generation in the same
//! transaction (the lease row is the high-water mark); [`PostgresFencedResource`] ([`PostgresLeaseStore::fenced_resource`]) accepts a write only if its token
//! is at least the key's `last_fencing_token` and advances it in the same statement; `install`
//! moves the mark to a new generation before the new owner starts.
//!
//! Both keep their marks in the same cluster as the data they guard, so they share its failover
//! fate: a failover to an asynchronous standby that lost the newest commits loses the marks those
//! commits raised, and a stale holder whose token lies between the surviving mark and the lost one
//! is accepted once more (the writes it guards were lost in the same failover). The token floor
//! keeps every *new* grant above the lost ones; to fence across a failover with no write
//! accepted twice, run the cluster with synchronous replication.
//!
//! ## Advisory locks
//! ```no_run
//! # use leasehold_core::LeaseKey;
//! # use leasehold_postgres::{AdvisoryLocks, PostgresLeaseStore};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! # let store = PostgresLeaseStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
//! let locks = AdvisoryLocks::new(store.pool().clone());
//! let ran = locks
//!     .try_with_lock(&LeaseKey::new("compaction")?, |conn| {
//!         Box::pin(async move { sqlx::query("SELECT 1").execute(&mut *conn).await.map(|_| ()) })
//!     })
//!     .await?;
//! println!("{}", if ran.is_some() { "compacted" } else { "busy" });
//! # Ok(()) }
//! ```
//! Only transaction-scoped locks are offered; the [`advisory`] module says why, and
//! [`advisory_lock_id`] documents the stable key-to-id mapping.
//!
//! ## Watching a key
//! A release wakes waiters on other processes through `LISTEN`/`NOTIFY`. A refused acquire
//! marks the row (`wake = 1`, in the same statement, under the row lock); the release statement
//! is `UPDATE .. SET lease_until = '-infinity', wake = .. RETURNING CASE WHEN wake = 2 THEN
//! pg_notify(<channel>, resource_key)::text END`, one round trip that notifies (at commit) only
//! when it freed the key **and** an acquire was refused since the last notification. An
//! uncontended release sends nothing, so releases do not serialise on `NOTIFY`'s commit lock.
//! A watch that is about to wait marks the row too (and yields a hint at once if the key is
//! already free), so a release that commits after the mark is never missed; a watch that is
//! never polled (the [`Supervisor`](leasehold_core::supervisor::Supervisor)'s, when its first attempt
//! is granted) costs nothing. The seed
//! layout's table has no mark column: there every release notifies. The channel is per table
//! ([`TableName::notify_channel`], `lease:public.leases` by default); the payload is the key.
//! ```no_run
//! # use leasehold_core::{LeaseKey, LeaseStore};
//! # use leasehold_postgres::PostgresLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! # let store = PostgresLeaseStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
//! let key = LeaseKey::new("nightly-report")?;
//! let mut watch = store.watch(&key).await?.expect("notifications are on by default");
//! // ... then try to acquire (a refusal asks the release to notify); if held, wait for a hint
//! // (or the holder's expiry) and try again:
//! match watch.changed().await {
//!     Some(Ok(())) => println!("released: try again now"),
//!     _ => println!("the listener broke: poll instead"),
//! }
//! # Ok(()) }
//! ```
//! One listener connection per store (`application_name = leasehold-postgres-listener`) serves every
//! watch of that store; each watch hears its own key only. If that connection breaks, every open
//! watch **ends** rather than silently missing releases, and the next `watch` reconnects. Expiry
//! sends nothing (PostgreSQL has no expiry events); the supervisor retries at the holder's
//! server-reported remaining time anyway. [`PostgresLeaseStore`] documents the details.
//!
//! ## Adopting an existing `coordination_lease` table
//! [`TableLayout::CoordinationLease`] runs the library **in place** on the `coordination_lease`
//! table of the seed design (the row-per-key lease table services ran before this crate): its columns
//! (`resource_key text`, `owner_id uuid`, `lease_until timestamptz default '-infinity'`,
//! `fencing_token bigint default 0`) are kept, and [`migrate`](PostgresLeaseStore::migrate)
//! (run by `connect_with` unless turned off) adds the token floor (sequence and triggers) and the
//! high-water-mark table ([`protocol::migration`] shows the DDL). Services that run the seed's
//! own statements keep running them next to the library: the trigger floors their
//! `fencing_token + 1` too, so no token goes back. Owners must be UUIDs
//! ([`OwnerId::random`](leasehold_core::OwnerId::random)). An un-migrated seed table is refused with
//! an [`Error::Config`](leasehold_core::Error::Config) naming what is missing.
//! ```no_run
//! use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, OwnerId};
//! use leasehold_postgres::{PostgresLeaseStore, PostgresOptions, TableLayout, TableName};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let options = PostgresOptions::new(TableName::parse("public.coordination_lease")?)
//!     .with_layout(TableLayout::CoordinationLease);
//! let store = PostgresLeaseStore::connect_with("postgres://postgres@127.0.0.1:5432/test", options).await?;
//! let req = AcquireRequest::new(LeaseKey::new("nightly")?, OwnerId::random(), std::time::Duration::from_secs(10));
//! let _ = store.acquire(&req).await?;
//! # Ok(()) }
//! ```
//!
//! ## Errors
//! Driver errors are mapped by kind and SQLSTATE: connection loss, pool exhaustion and server
//! shutdown are [`Error::Unavailable`](leasehold_core::Error::Unavailable) (retryable); cancelled
//! statements and lock waits are [`Error::Timeout`](leasehold_core::Error::Timeout); an unparsable
//! URL, a refused login, a missing database or a missing table are
//! [`Error::Config`](leasehold_core::Error::Config); anything else is
//! [`Error::Backend`](leasehold_core::Error::Backend). A failure to take a pooled connection (pool
//! timeout, connection refused) is built with [`Error::refused`](leasehold_core::Error::refused):
//! nothing was sent, so [`outcome_unknown`](leasehold_core::Error::outcome_unknown) is false.

pub mod advisory;
mod batch;
mod client;
mod config;
mod conn;
mod error;
mod fenced;
mod inspect;
mod notify;
pub mod protocol;
mod row_fence;
mod schema;
mod store;

pub use advisory::{AdvisoryLocks, advisory_lock_id};
pub use config::{
    DRIVER_URL_PARAMETERS, MAX_SCHEMA_LEN, MAX_TABLE_LEN, PostgresOptions, TableLayout, TableName,
    TxTimeouts, URL_OPTIONS,
};
pub use fenced::{FencedTx, PostgresFencedResource};
pub use row_fence::LeaseRowFence;
pub use store::{MIN_TTL, PostgresLeaseStore};

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
