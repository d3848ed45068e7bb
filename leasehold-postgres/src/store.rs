// This file stays whole past 600 lines (657 with its tests): the `LeaseStore` implementation in
// the contract's order, each operation with its statement's bounded query and error mapping; the
// statements are in protocol.rs, batches in batch.rs and inspection in inspect.rs.
//! [`PostgresLeaseStore`]: the lease contract on a PostgreSQL table.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use leasehold_core::backend::{RoundedTtl, decode_token, granted_lease, ttl_millis, validate_ttl};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, ExpiryClock, KeyState, KeyWatch, Lease,
    LeaseKey, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result, TokenDurability,
};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use tokio::time::Instant;

use crate::client::Client;
use crate::config::{PostgresOptions, TableLayout, TableName, millis_setting};
use crate::error::{self, BACKEND, ErrCtx};
use crate::fenced::FencedTx;
use crate::inspect::column;
use crate::inspect::holder_from;
use crate::notify::Notifier;
use crate::row_fence::LeaseRowFence;
use crate::schema;

/// The shortest TTL this store grants: one millisecond, its granularity.
pub const MIN_TTL: Duration = Duration::from_millis(1);

/// A [`LeaseStore`] on a PostgreSQL table, over a `sqlx` connection pool.
///
/// - **acquire** is decided by one statement: the seed's upsert semantics (insert, or take over
///   only when `lease_until <= clock_timestamp()`), extended so that the same owner may
///   re-acquire. A grant alone (one guarded `UPDATE` of a free or own row) is sent first; only
///   when it grants nothing (a held key, or a key without a row) does the full statement follow,
///   which decides again on its own: a refusal that reports the holder, or an insert (a second
///   round trip). A takeover writes
///   `greatest(old + 1, server clock in µs)`; a new row's token is drawn by a trigger,
///   `greatest(requested, nextval(seq), server clock in µs)` (and so is the seed's `+ 1`), so
///   tokens never go back, even after a row is deleted, when the seed's own statements share the
///   table, or after a failover to an asynchronous standby (assuming the promoted server's clock
///   does not lag the old primary's by more than the failover took; see
///   `docs/adr/0010-postgres-token-floor.md`).
/// - **renew** and **release** are single conditional `UPDATE`s by key, owner *and* token while
///   unexpired. Release keeps the row (and so the generation), setting `lease_until` to
///   `-infinity`.
/// - Expiry is decided by the server's `clock_timestamp()` only: a forward step of the server's
///   clock ends leases early (fencing still rejects the old holder; see the crate docs).
/// - TTLs are sent in milliseconds, rounded up; the lease reports the granted TTL.
/// - **watch** (on by default, [`PostgresOptions::with_notify`]): a release that frees a key
///   for which an acquire was refused since the last notification sends
///   `pg_notify(<channel>, <key>)` in the same statement, on the table's channel
///   ([`TableName::notify_channel`]); [`watch`](LeaseStore::watch) subscribes to the key on one
///   shared `LISTEN` connection per store. See [Watching a key](#watching-a-key).
///
/// A cloneable handle: clones share the pool and the listener.
///
/// # Watching a key
/// The first `watch` opens a dedicated connection (`application_name =
/// leasehold-postgres-listener`, the pool's other connect options, bounded by the operation timeout)
/// and `LISTEN`s before it returns. Later watches share it; each [`KeyWatch`] gets hints for its
/// own key only and unsubscribes when dropped. A release notifies only if the row was marked
/// since the last notification (`wake`, ADR 0017): a refused acquire marks it, and so does the
/// watch itself when it is about to wait (the first time it is polled with nothing pending, and
/// after each hint: one `UPDATE`, under the row lock). Every release that commits after a mark
/// reaches the watch; a release that committed before it is seen by the mark, which then yields
/// a hint at once. A watch that is never polled (the supervisor's, when its first attempt is
/// granted) sends nothing. A key that has no row yet cannot be marked: its watch hints once and
/// then hears releases only after someone is refused. PostgreSQL has no expiry events: a lease that simply runs out sends nothing (the
/// [`Supervisor`](leasehold_core::supervisor::Supervisor) already retries at the holder's reported
/// remaining time). [`delete_prefix`](Self::delete_prefix) sends nothing either.
///
/// **Failure behaviour**: the listener never reconnects silently (notifications sent while it
/// was away would be lost). If its connection breaks, every open watch ends (its stream returns
/// `None`), so waiters fall back to polling, and the next `watch` connects again. With no open
/// watch for 30 s, or once the store and all its watches are dropped, the listener disconnects.
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
/// use leasehold_postgres::{PostgresLeaseStore, PostgresOptions};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = PostgresLeaseStore::connect_lazy(
///     "postgres://postgres@127.0.0.1:5432/test",
///     PostgresOptions::default(),
/// )?;
/// store.migrate().await?; // idempotent
/// let req = AcquireRequest::new(LeaseKey::new("nightly-report")?, OwnerId::random(), Duration::from_secs(10));
/// match store.acquire(&req).await? {
///     AcquireOutcome::Acquired(lease) => println!("ours, token {}", lease.token()),
///     AcquireOutcome::Held(h) => println!("{} holds it for {:?}", h.owner, h.remaining),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresLeaseStore {
    pub(crate) client: Arc<Client>,
    notifier: Arc<Notifier>,
}

impl PostgresLeaseStore {
    /// Connects to `url` with [`PostgresOptions::default`]: the table `public.leases`, created
    /// if missing. The same as [`connect_with`](Self::connect_with)`(url, PostgresOptions::default())`.
    ///
    /// ```no_run
    /// use leasehold_postgres::PostgresLeaseStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = PostgresLeaseStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    ///
    /// # Cancellation safety
    /// As [`connect_with`](Self::connect_with).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Builds a pool from `url` (`postgres://` or `postgresql://`, sized and bounded by
    /// `options`, with `statement_timeout` set to the operation timeout), connects, and then
    /// runs [`migrate`](Self::migrate) ([`PostgresOptions::with_migrate`], on by default; a role
    /// without DDL rights still connects when [`verify_schema`](Self::verify_schema) passes) or
    /// only `verify_schema` (off).
    ///
    /// # Errors
    /// [`Error::Config`] for an unparsable URL, a refused login, a missing database, or a
    /// missing or outdated schema that could not be migrated; [`Error::Unavailable`] if the
    /// server cannot be reached.
    ///
    /// # Cancellation safety
    /// Cancel safe: the migration is one transaction, rolled back if dropped; nothing else is
    /// changed on the server.
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<Self> {
        let (options, pool_options, connect_options) = pool_config(url, options)?;
        let pool = pool_options
            .connect_with(connect_options)
            .await
            .map_err(|e| error::map_unsent("connect", e, err_ctx(&options)))?;
        let store = PostgresLeaseStore::from_pool(pool, options);
        if store.options().migrate() {
            if let Err(e) = store.migrate().await
                && (e.is_retryable() || store.verify_schema().await.is_err())
            {
                return Err(e);
            }
        } else {
            store.verify_schema().await?;
        }
        Ok(store)
    }

    /// Parses `url` and builds a pool that connects on first use. No I/O, no migration (call
    /// [`migrate`](Self::migrate) or [`verify_schema`](Self::verify_schema) before use).
    ///
    /// # Errors
    /// [`Error::Config`] for an unparsable URL.
    pub fn connect_lazy(url: &str, options: PostgresOptions) -> Result<Self> {
        let (options, pool_options, connect_options) = pool_config(url, options)?;
        Ok(PostgresLeaseStore::from_pool(
            pool_options.connect_lazy_with(connect_options),
            options,
        ))
    }

    /// A store over an existing pool. No I/O; call [`migrate`](Self::migrate) or
    /// [`verify_schema`](Self::verify_schema) before use.
    pub fn from_pool(pool: PgPool, options: PostgresOptions) -> Self {
        let notifier = Arc::new(Notifier::new(options.table()));
        PostgresLeaseStore {
            client: Arc::new(Client::new(pool, options)),
            notifier,
        }
    }

    /// The pool (for your own queries, [`AdvisoryLocks`](crate::AdvisoryLocks), ...).
    pub fn pool(&self) -> &PgPool {
        &self.client.pool
    }

    /// The options the store was built with.
    pub fn options(&self) -> &PostgresOptions {
        &self.client.options
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        self.client.options.table()
    }

    /// The channel releases are notified on (whether or not notifications are on):
    /// [`TableName::notify_channel`] of the lease table.
    pub fn notify_channel(&self) -> &str {
        self.notifier.channel()
    }

    /// The number of [`KeyWatch`]es of this store (and its clones) that are open on the current
    /// listener. For diagnostics and tests.
    pub fn open_watches(&self) -> usize {
        self.notifier.open_watches()
    }

    /// Creates the schema (if needed), the lease table, its token sequence and triggers, and
    /// the high-water-mark table; with [`TableLayout::CoordinationLease`], keeps the existing seed table's
    /// columns and adds the rest (see [`protocol::migration`](crate::protocol::migration)).
    /// Idempotent, and safe to run from several processes at once (the DDL runs in one
    /// transaction under an advisory lock).
    ///
    /// # Errors
    /// [`Error::Unavailable`] / [`Error::Timeout`] if the server cannot be reached in time;
    /// [`Error::Config`] or [`Error::Backend`] if the DDL is refused (for example permissions).
    ///
    /// # Cancellation safety
    /// Cancel safe: the DDL is one transaction, rolled back if dropped.
    pub async fn migrate(&self) -> Result<()> {
        schema::migrate(&self.client).await
    }

    /// Checks that the lease table (with the layout's owner column), its sequence, its token
    /// triggers (the current version, see `docs/adr/0010-postgres-token-floor.md`) and the
    /// high-water-mark table exist.
    ///
    /// # Errors
    /// [`Error::Config`] naming what is missing or outdated (run [`migrate`](Self::migrate),
    /// which upgrades an existing schema in place).
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    pub async fn verify_schema(&self) -> Result<()> {
        schema::verify(&self.client).await
    }

    /// Runs the caller's statements in one transaction that is fenced by the lease row: the seed's
    /// protected write, as a library call.
    ///
    /// 1. `BEGIN`, then `lock_timeout`, `statement_timeout` and
    ///    `idle_in_transaction_session_timeout` are set for this transaction only
    ///    ([`TxTimeouts`](crate::TxTimeouts), from the store's options).
    /// 2. The lease row is locked `FOR UPDATE` and validated: same key, owner and token, and
    ///    `lease_until > clock_timestamp()`. Otherwise: rollback, [`FencedTx::LeaseLost`].
    /// 3. `f` runs its statements on the same connection, inside the transaction.
    /// 4. The row is checked again (still unexpired) and the transaction commits.
    ///
    /// While the row is locked nobody can take the lease over (a takeover must update the row),
    /// so the caller's writes commit before any newer token exists. The timeouts bound how long a
    /// stuck transaction can delay a takeover; it also delays the holder's own renewals, so keep
    /// fenced transactions short compared to the TTL.
    ///
    /// If `f` fails, the transaction is rolled back and its error is returned, mapped like every
    /// other driver error.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, OwnerId};
    /// use leasehold_postgres::{FencedTx, PostgresLeaseStore, PostgresOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = PostgresLeaseStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
    /// let req = AcquireRequest::new(LeaseKey::new("ledger")?, OwnerId::random(), Duration::from_secs(10));
    /// let lease = store.acquire(&req).await?.lease().expect("free");
    /// let out = store
    ///     .fenced_transaction(&lease, |conn| {
    ///         Box::pin(async move {
    ///             sqlx::query("UPDATE accounts SET balance = balance + 1 WHERE id = 7")
    ///                 .execute(&mut *conn)
    ///                 .await?;
    ///             Ok(())
    ///         })
    ///     })
    ///     .await?;
    /// match out {
    ///     FencedTx::Committed(()) => println!("written under token {}", lease.token()),
    ///     FencedTx::LeaseLost => println!("lease lost, nothing written"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// The whole call (taking a pooled connection included) is bounded on the client by
    /// [`TxTimeouts::deadline`](crate::TxTimeouts::deadline) (default 10 s): a connection that stops answering (a black-holed
    /// network path, where even the server's own timeouts never reach the client) gives a
    /// retryable [`Error::Timeout`](leasehold_core::Error::Timeout), and that connection is closed.
    ///
    /// # Errors
    /// [`Error::Timeout`](leasehold_core::Error::Timeout) if the row lock was not granted within
    /// `lock_timeout`, a statement ran past `statement_timeout` (nothing committed), or the call
    /// ran past `deadline` (if `COMMIT` had been sent, its outcome is unknown);
    /// [`Error::Unavailable`](leasehold_core::Error::Unavailable) if the connection was lost (if lost
    /// during `COMMIT`, the outcome is unknown); `f`'s own error, mapped.
    ///
    /// # Cancellation safety
    /// Not cancel safe: dropped before `COMMIT` was sent, the transaction is rolled back (when the
    /// connection returns to the pool) and nothing is written; dropped during `COMMIT`, the outcome
    /// is unknown. Locks end with the transaction or, at the latest, after `idle_timeout`.
    pub async fn fenced_transaction<T, F>(&self, lease: &Lease, f: F) -> Result<FencedTx<T>>
    where
        T: Send,
        F: for<'c> FnOnce(
                &'c mut PgConnection,
            ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
            + Send,
    {
        self.check_owner(lease.owner())?;
        crate::fenced::fenced_transaction(&self.client, lease, f).await
    }

    /// Deletes every lease row and high-water-mark row whose key starts with `prefix`. Tokens
    /// still never go back for those keys. Meant for tests and tooling. Sends no release
    /// notification: a waiter on a deleted key finds it free at its next retry.
    ///
    /// # Errors
    /// As any other operation.
    ///
    /// # Cancellation safety
    /// Not cancel safe: a dropped call may or may not have deleted the rows.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<u64> {
        let c = &self.client;
        let mut n = 0;
        for stmt in &c.sql.delete_prefix {
            n += c
                .query("delete", async |conn| {
                    sqlx::query(AssertSqlSafe(stmt.as_str()))
                        .bind(prefix)
                        .execute(&mut *conn)
                        .await
                })
                .await?
                .rows_affected();
        }
        Ok(n)
    }

    /// On [`TableLayout::CoordinationLease`], owners live in a `uuid` column: anything but a canonical UUID
    /// is refused before anything is sent.
    pub(crate) fn check_owner(&self, owner: &OwnerId) -> Result<()> {
        if self.options().layout() == TableLayout::CoordinationLease
            && !is_canonical_uuid(owner.as_str())
        {
            return Err(Error::InvalidOwner {
                owner: owner.as_str().chars().take(80).collect(),
                reason: "the seed table layout stores owners in a uuid column: use \
                         OwnerId::random() or a lowercase hyphenated UUID",
            });
        }
        Ok(())
    }
}

/// The TTL this store grants for a requested `ttl`: checked against [`MIN_TTL`] and
/// [`MAX_TTL`](leasehold_core::MAX_TTL), in whole milliseconds rounded up. The one check of
/// acquire, renew and their batches.
pub(crate) fn grantable_ttl(ttl: Duration) -> Result<RoundedTtl> {
    validate_ttl(ttl, MIN_TTL).and_then(|()| ttl_millis(ttl))
}

impl LeaseRowFence {
    /// The lease-row fence of `store`'s table; data goes to `<table>_fence`.
    pub fn new(store: PostgresLeaseStore) -> Self {
        let data = store.fenced_resource();
        LeaseRowFence::from_client(store.client, data)
    }
}

/// Whether `s` is a UUID in the form PostgreSQL prints it (lowercase, hyphenated), so that an
/// owner stored in a `uuid` column reads back as the same [`OwnerId`].
fn is_canonical_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// The outcome of `req` from its row of `acquire` or `acquire_many`: granted if the row's owner is the
/// request's, else refused, naming the row's holder (the columns of `acquire`).
pub(crate) fn acquired_from_row(
    req: &AcquireRequest,
    row: &sqlx::postgres::PgRow,
    granted: Duration,
    sent: Instant,
    operation: &'static str,
    cx: ErrCtx<'_>,
) -> Result<AcquireOutcome> {
    let owner: Option<String> = column(row, "owner", operation, cx)?;
    let token: i64 = column(row, "fencing_token", operation, cx)?;
    let token = decode_token(BACKEND, req.key.as_str(), token)?;
    if owner.as_deref() == Some(req.owner.as_str()) {
        tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, "lease acquired");
        return Ok(AcquireOutcome::Acquired(granted_lease(
            req.key.clone(),
            req.owner.clone(),
            token,
            granted,
            req.drift_margin(),
            sent,
        )));
    }
    let ttl_ms: Option<i64> = column(row, "ttl_ms", operation, cx)?;
    let remaining_us: Option<i64> = column(row, "remaining_us", operation, cx)?;
    let holder = holder_from(&req.key, owner, token, ttl_ms, remaining_us)?;
    tracing::trace!(backend = BACKEND, key = %req.key, owner = %holder.owner, token = %holder.token, "lease held by another owner");
    Ok(AcquireOutcome::Held(holder))
}

/// The error context of an operation before the store exists.
fn err_ctx(options: &PostgresOptions) -> ErrCtx<'_> {
    ErrCtx {
        table: options.table(),
        timeout: options.op_timeout(),
        lock_timeout: options.tx_timeouts().lock_timeout,
    }
}

/// The longest pool wait handed to the driver (see [`PostgresOptions::with_acquire_timeout`]).
/// The largest pool [`PostgresOptions::with_max_connections`] may ask for: the driver allocates
/// its queue up front, so `u32::MAX` would abort the process.
const MAX_POOL: u32 = 10_000;

const LONGEST_POOL_WAIT: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The URL's options applied on top of `options`, and the driver's pool and connect options.
fn pool_config(
    url: &str,
    options: PostgresOptions,
) -> Result<(PostgresOptions, PgPoolOptions, PgConnectOptions)> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    if !matches!(scheme, Some("postgres" | "postgresql")) {
        return Err(Error::config(
            BACKEND,
            format!(
                "unparsable PostgreSQL URL {:?}: it must start with postgres:// or postgresql://",
                url.chars().take(12).collect::<String>()
            ),
            None,
        ));
    }
    let (url, options) = options.with_url(url)?;
    if options.max_connections() > MAX_POOL {
        return Err(Error::config(
            BACKEND,
            format!(
                "max_connections {} is above the largest pool the store builds ({MAX_POOL}; \
                 PostgreSQL itself allows at most 262,143 connections)",
                options.max_connections()
            ),
            None,
        ));
    }
    let connect = PgConnectOptions::from_str(&url).map_err(|e| {
        Error::config(
            BACKEND,
            format!("unparsable PostgreSQL URL: {e}"),
            Some(Box::new(e) as _),
        )
    })?;
    let connect = match connect.get_application_name() {
        Some(_) => connect,
        None => connect.application_name("leasehold-postgres"),
    }
    .options([("statement_timeout", millis_setting(options.op_timeout()))]);
    let pool = PgPoolOptions::new()
        .max_connections(options.max_connections())
        // The driver adds it to an Instant, which overflows (a panic) near Duration::MAX: a
        // year is "no bound" for a pool wait.
        .acquire_timeout(options.acquire_timeout().min(LONGEST_POOL_WAIT))
        // No ping before each checkout: it is a whole round trip on every operation's path. The
        // driver already pings a connection when it returns to the pool (off the caller's path)
        // and drops it if that fails; a connection that dies idle fails its next statement, which
        // the caller sees as a failed operation and retries like any other backend error.
        .test_before_acquire(false);
    Ok((options, pool, connect))
}

#[async_trait]
impl LeaseStore for PostgresLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Tokens are [`TokenDurability::ClockFloored`]: durable on one server (a WAL-logged sequence
    /// and table), and floored by the server's clock so that a failover to an asynchronous standby
    /// that lost the newest grants still issues greater tokens, as long as the promoted server's
    /// clock does not lag the old primary's by more than the failover took (ADRs 0010 and 0012).
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TokenDurability::ClockFloored, ExpiryClock::Server)
            .with_watch(self.options().notify())
            .with_min_ttl(MIN_TTL)
            .with_ttl_granularity(Duration::from_millis(1))
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let ttl = grantable_ttl(req.ttl)?;
        self.check_owner(&req.owner)?;
        let sent = Instant::now();
        let c = &self.client;
        let row = c
            .query("acquire", async |conn| {
                // The grant alone first (a free or own row, the usual case); a refusal or a key
                // without a row needs the full statement, which decides again on its own.
                let mut r = sqlx::query(AssertSqlSafe(c.sql.acquire_free.as_str()))
                    .bind(req.key.as_str())
                    .bind(req.owner.as_str())
                    .bind(ttl.as_i64())
                    .fetch_optional(&mut *conn)
                    .await;
                if let Ok(None) = r {
                    r = sqlx::query(AssertSqlSafe(c.sql.acquire.as_str()))
                        .bind(req.key.as_str())
                        .bind(req.owner.as_str())
                        .bind(ttl.as_i64())
                        .fetch_one(&mut *conn)
                        .await
                        .map(Some);
                }
                r?.ok_or(sqlx::Error::RowNotFound)
            })
            .await?;
        acquired_from_row(req, &row, ttl.granted(), sent, "acquire", c.cx())
    }

    /// One statement for the whole batch ([`Statements::acquire_many`]): the batch's existing
    /// rows are locked in key order, each is granted or refused by the guarded `UPDATE` of
    /// [`acquire`](LeaseStore::acquire), and keys without a row are inserted; one round trip,
    /// one transaction. Requests with an invalid TTL or owner get their error in their slot and
    /// are not sent.
    ///
    /// [`Statements::acquire_many`]: crate::protocol::Statements::acquire_many
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        self.acquire_batch(reqs).await
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        let ttl = grantable_ttl(lease.ttl())?;
        self.check_owner(lease.owner())?;
        let granted = ttl.granted();
        let sent = Instant::now();
        let c = &self.client;
        let done = c
            .query("renew", async |conn| {
                sqlx::query(AssertSqlSafe(c.sql.renew.as_str()))
                    .bind(lease.key().as_str())
                    .bind(lease.owner().as_str())
                    .bind(lease.token().to_i64())
                    .bind(ttl.as_i64())
                    .execute(&mut *conn)
                    .await
            })
            .await?;
        if done.rows_affected() == 1 {
            tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
            Ok(RenewOutcome::Renewed(lease.renewed(granted, sent)))
        } else {
            tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "renew refused: lease lost");
            Ok(RenewOutcome::Lost)
        }
    }

    /// One statement. With notifications on (the default) it also sends
    /// `pg_notify(<channel>, <key>)` when, and only when, it released a key for which an
    /// acquire was refused since the last notification: one round trip.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.check_owner(lease.owner())?;
        let c = &self.client;
        let sql = if c.options.notify() {
            c.sql.release_notify.as_str()
        } else {
            c.sql.release.as_str()
        };
        let done = c
            .query("release", async |conn| {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(lease.key().as_str())
                    .bind(lease.owner().as_str())
                    .bind(lease.token().to_i64())
                    .execute(&mut *conn)
                    .await
            })
            .await?;
        if done.rows_affected() == 1 {
            tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease released");
            Ok(ReleaseOutcome::Released)
        } else {
            Ok(ReleaseOutcome::NotHeld)
        }
    }

    /// One statement (`UPDATE .. FROM unnest(..)`) renews the whole batch: one round trip, one
    /// transaction. Leases with an invalid TTL get their error in their slot and are not sent.
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        self.renew_batch(leases).await
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        let (holder, last_token) = self.holder(key).await?;
        Ok(KeyState {
            key: key.clone(),
            holder,
            last_token,
        })
    }

    /// One statement for all `keys` (`unnest($1) WITH ORDINALITY` joined to the table): one
    /// round trip, one snapshot. States in input order, duplicates kept; keys never seen are
    /// reported free, with no last token. An empty slice sends nothing.
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        self.inspect_batch(keys).await
    }

    /// Subscribes to releases of `key` on the store's shared listener (started on first use,
    /// `LISTEN`ing before this returns). `Ok(None)` when notifications are off. The watch ends
    /// if the listener's connection breaks. See [Watching a key](#watching-a-key).
    ///
    /// # Errors
    /// [`Error::Unavailable`] or [`Error::Timeout`] if the listener cannot connect within the
    /// operation timeout; [`Error::Config`] if the server refuses the login.
    ///
    /// # Cancellation safety
    /// Cancel safe: a listener being started is dropped with the future; nothing else changes.
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        if !self.options().notify() {
            return Ok(None);
        }
        self.notifier
            .watch(&self.client, key)
            .await
            .map(Some)
            .map_err(|e| e.into_error("watch", self.client.cx()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unparsable_urls_are_config_errors() {
        let err =
            PostgresLeaseStore::connect_lazy("not a url", PostgresOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Config { .. }), "{err:?}");
    }

    #[test]
    fn only_canonical_uuids_fit_the_seed_owner_column() {
        assert!(is_canonical_uuid(OwnerId::random().as_str()));
        assert!(is_canonical_uuid("0f8fad5b-d9cb-469f-a165-70867728950e"));
        for bad in [
            "0F8FAD5B-D9CB-469F-A165-70867728950E",
            "0f8fad5bd9cb469fa16570867728950e",
            "{0f8fad5b-d9cb-469f-a165-70867728950e}",
            "worker-a",
            "",
        ] {
            assert!(!is_canonical_uuid(bad), "{bad}");
        }
    }
}
