//! [`MysqlLeaseStore`]: the lease contract on a MySQL/MariaDB (InnoDB) table.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use leasehold_core::backend::{RoundedTtl, decode_token, granted_lease, ttl_millis, validate_ttl};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, ExpiryClock, FencingToken, KeyState,
    Lease, LeaseKey, LeaseStore, ReleaseOutcome, RenewOutcome, Result, TokenDurability,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Executor, Row};
use tokio::time::Instant;

use crate::client::Client;
use crate::config::{MysqlOptions, TableName, lock_wait_secs};
use crate::error::{self, BACKEND, ErrCtx};
use crate::fenced::FencedTx;
use crate::inspect::holder_from;
use crate::protocol::Statements;
use crate::schema;

/// The shortest TTL this store grants: one millisecond, its granularity.
pub const MIN_TTL: Duration = Duration::from_millis(1);

/// The largest pool [`MysqlOptions::with_max_connections`] may ask for: the driver allocates its
/// queue up front, so `u32::MAX` would abort the process.
const MAX_POOL: u32 = 10_000;

/// The longest pool wait handed to the driver (it adds the wait to an `Instant`, which
/// overflows near `Duration::MAX`): a year is "no bound" for a pool wait.
const LONGEST_POOL_WAIT: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A [`LeaseStore`] on a MySQL or MariaDB (InnoDB) table, over a `sqlx` connection pool.
///
/// - **acquire** of a key that has a row is one statement: a guarded `UPDATE` that takes the
///   row when it is free (`lease_until <= UTC_TIMESTAMP(6)`) or already held by the same owner,
///   writing the token `GREATEST(old + 1, server clock in µs)` through `LAST_INSERT_ID(expr)`,
///   which the server hands back in the statement's OK packet. A refused grant reads the
///   holder (a second statement); a key without a row is inserted with the token
///   `GREATEST(floor + 1, server clock in µs)` from its floor row. A duplicate key (the row was
///   inserted concurrently), a deadlock or a lock wait timeout starts the acquire over, within
///   the operation timeout.
/// - **renew** and **release** are single conditional `UPDATE`s by key, owner *and* token
///   while unexpired. Release keeps the row (and so the generation). **renew_many** is the
///   same `UPDATE` over up to 250 keys and tokens of one owner.
/// - **Tokens never go back**: not after release, expiry, row deletion (a trigger keeps a
///   deleted row's token in the floor table), restart, or a failover to an asynchronous replica
///   that lost the newest grants (the clock floor; see the crate docs for the assumption).
/// - Expiry is decided by the server's clock only, `UTC_TIMESTAMP(6)` at the start of each
///   statement (independent of the session's time zone).
/// - TTLs are sent in milliseconds, rounded up; the lease reports the granted TTL.
///
/// Sessions run at `READ COMMITTED` (no gap locks, so concurrent first acquisitions of a key
/// do not deadlock each other) with `innodb_lock_wait_timeout` at the operation timeout (whole
/// seconds, at least 1).
///
/// A cloneable handle: clones share the pool.
#[derive(Debug, Clone)]
pub struct MysqlLeaseStore {
    pub(crate) client: Arc<Client>,
}

impl MysqlLeaseStore {
    /// Connects to `url` with [`MysqlOptions::default`]: the table `leases` in the URL's
    /// database, created if missing.
    ///
    /// ```no_run
    /// use leasehold_mysql::MysqlLeaseStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = MysqlLeaseStore::connect("mysql://root@127.0.0.1:3306/test").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    ///
    /// # Cancellation safety
    /// As [`connect_with`](Self::connect_with).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, MysqlOptions::default()).await
    }

    /// Builds a pool from `url` (`mysql://` or `mariadb://`, sized and bounded by `options`),
    /// connects, and then runs [`migrate`](Self::migrate) ([`MysqlOptions::with_migrate`], on by
    /// default; a user without DDL rights still connects when
    /// [`verify_schema`](Self::verify_schema) passes) or only `verify_schema` (off).
    ///
    /// # Errors
    /// [`Error::Config`] for an unparsable URL, a refused login, a missing database, or a
    /// missing schema that could not be created; [`Error::Unavailable`] if the server cannot be
    /// reached.
    ///
    /// # Cancellation safety
    /// Cancel safe: every migration statement is idempotent, so a migration cut short is
    /// completed by the next one.
    pub async fn connect_with(url: &str, options: MysqlOptions) -> Result<Self> {
        let (options, pool_options, connect_options) = pool_config(url, options)?;
        let pool = pool_options
            .connect_with(connect_options)
            .await
            .map_err(|e| error::map_unsent("connect", e, err_ctx(&options)))?;
        let store = MysqlLeaseStore::from_pool(pool, options);
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
    pub fn connect_lazy(url: &str, options: MysqlOptions) -> Result<Self> {
        let (options, pool_options, connect_options) = pool_config(url, options)?;
        Ok(MysqlLeaseStore::from_pool(
            pool_options.connect_lazy_with(connect_options),
            options,
        ))
    }

    /// A store over an existing pool. No I/O; call [`migrate`](Self::migrate) or
    /// [`verify_schema`](Self::verify_schema) before use. The pool's sessions should run at
    /// `READ COMMITTED` (the pools this crate builds do): at `REPEATABLE READ` concurrent first
    /// acquisitions of one key may deadlock, which the store retries within the operation
    /// timeout.
    pub fn from_pool(pool: MySqlPool, options: MysqlOptions) -> Self {
        MysqlLeaseStore {
            client: Arc::new(Client::new(pool, options)),
        }
    }

    /// The pool (for your own queries, [`AdvisoryLocks`](crate::AdvisoryLocks), ...).
    pub fn pool(&self) -> &MySqlPool {
        &self.client.pool
    }

    /// The options the store was built with.
    pub fn options(&self) -> &MysqlOptions {
        &self.client.options
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        self.client.options.table()
    }

    /// The statements this store sends.
    pub fn statements(&self) -> &Statements {
        &self.client.sql
    }

    /// Creates the lease table, its floor table, the high-water-mark table and the token
    /// triggers if missing ([`protocol::migration`](crate::protocol::migration)). Idempotent, and
    /// safe to run from several processes at once (serialised by `GET_LOCK`). Creating triggers
    /// needs the `TRIGGER` privilege (and, with binary logging on, `SUPER` or
    /// `log_bin_trust_function_creators = 1`).
    ///
    /// # Errors
    /// [`Error::Unavailable`] / [`Error::Timeout`] if the server cannot be reached in time;
    /// [`Error::Config`] or [`Error::Backend`] if the DDL is refused (for example permissions).
    ///
    /// # Cancellation safety
    /// Cancel safe: each statement is idempotent, and the migration lock ends with the
    /// connection, which is closed if the call is dropped.
    pub async fn migrate(&self) -> Result<()> {
        schema::migrate(&self.client).await
    }

    /// Checks that the lease table (with this version's comment), the floor and fence tables and
    /// the three token triggers exist.
    ///
    /// # Errors
    /// [`Error::Config`] naming what is missing (run [`migrate`](Self::migrate)).
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    pub async fn verify_schema(&self) -> Result<()> {
        schema::verify(&self.client).await
    }

    /// Runs the caller's statements in one transaction that is fenced by the lease row.
    ///
    /// 1. `innodb_lock_wait_timeout` is set to [`TxTimeouts::lock_timeout`](crate::TxTimeouts)
    ///    for the session, and a transaction begins.
    /// 2. The lease row is locked `FOR UPDATE` and validated: same key, owner and token, and
    ///    `lease_until > UTC_TIMESTAMP(6)`. Otherwise: rollback, [`FencedTx::LeaseLost`].
    /// 3. `f` runs its statements on the same connection, inside the transaction.
    /// 4. The row is checked again (still unexpired) and the transaction commits.
    ///
    /// While the row is locked nobody can take the lease over (a takeover must update the row),
    /// so the caller's writes commit before any newer token exists. Keep fenced transactions
    /// short compared to the TTL: the lock also delays the holder's own renewals.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, OwnerId};
    /// use leasehold_mysql::{FencedTx, MysqlLeaseStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = MysqlLeaseStore::connect("mysql://root@127.0.0.1:3306/test").await?;
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
    /// # Errors
    /// [`Error::Timeout`] if the row lock was not granted within the lock timeout or the call
    /// ran past [`TxTimeouts::deadline`](crate::TxTimeouts) (if `COMMIT` had been sent, its
    /// outcome is unknown); [`Error::Unavailable`] if the connection was lost; `f`'s own error,
    /// mapped (the transaction is rolled back).
    ///
    /// # Cancellation safety
    /// Not cancel safe: dropped before `COMMIT` was sent, the connection is closed, the server
    /// rolls the transaction back and nothing is written; dropped during `COMMIT`, the outcome
    /// is unknown.
    pub async fn fenced_transaction<T, F>(&self, lease: &Lease, f: F) -> Result<FencedTx<T>>
    where
        T: Send,
        F: for<'c> FnOnce(
                &'c mut MySqlConnection,
            ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
            + Send,
    {
        crate::fenced::fenced_transaction(&self.client, lease, f).await
    }

    /// Deletes every lease row and high-water-mark row whose key starts with `prefix`. Tokens
    /// still never go back for those keys (the delete trigger keeps each deleted row's token in
    /// the floor table). Meant for tests and tooling.
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
                        .bind(prefix)
                        .execute(&mut *conn)
                        .await
                })
                .await?
                .rows_affected();
        }
        Ok(n)
    }
}

/// What one acquire attempt found.
pub(crate) enum Acquired {
    /// Granted, with the token the server handed back (`LAST_INSERT_ID(expr)`).
    Granted(u64),
    /// Granted, with the token read back from the row the batch wrote.
    Stored(i64),
    /// Held by another owner: the row of [`Statements::holder`].
    Held(MySqlRow),
}

/// One acquire attempt on `conn` (see [`MysqlLeaseStore`]): a conflict reported by the server
/// is retried by the caller on a new connection.
pub(crate) async fn acquire_on(
    conn: &mut MySqlConnection,
    sql: &Statements,
    req: &AcquireRequest,
    ttl: RoundedTtl,
) -> std::result::Result<Acquired, sqlx::Error> {
    let ttl_us = ttl.as_i64().saturating_mul(1000);
    loop {
        let r = sqlx::query(AssertSqlSafe(sql.acquire_free.as_str()))
            .bind(req.owner.as_str())
            .bind(ttl_us)
            .bind(ttl.as_i64())
            .bind(req.key.as_str())
            .bind(req.owner.as_str())
            .execute(&mut *conn)
            .await?;
        if r.rows_affected() == 1 {
            // The server reports `LAST_INSERT_ID(expr)` of an UPDATE in its OK packet (and 0
            // when the statement did not call it); the session's value is the fallback.
            return Ok(Acquired::Granted(match r.last_insert_id() {
                0 => last_insert_id(conn).await?,
                id => id,
            }));
        }
        let row = sqlx::query(AssertSqlSafe(sql.holder.as_str()))
            .bind(req.key.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        match row {
            Some(row) => {
                let held: bool = row.try_get("held")?;
                if held {
                    return Ok(Acquired::Held(row));
                }
                // Freed between the two statements: try the grant again.
            }
            None => {
                sqlx::query(AssertSqlSafe(sql.acquire_insert.as_str()))
                    .bind(req.key.as_str())
                    .bind(req.owner.as_str())
                    .bind(ttl_us)
                    .bind(req.key.as_str())
                    .bind(ttl.as_i64())
                    .execute(&mut *conn)
                    .await?;
                // An `INSERT .. SELECT` does not report `LAST_INSERT_ID(expr)` in its OK packet
                // (the table has no AUTO_INCREMENT column): read the session's value.
                return Ok(Acquired::Granted(last_insert_id(conn).await?));
            }
        }
    }
}

/// The session's `LAST_INSERT_ID()`: the value of the last `LAST_INSERT_ID(expr)` this
/// connection evaluated.
async fn last_insert_id(conn: &mut MySqlConnection) -> std::result::Result<u64, sqlx::Error> {
    sqlx::query_scalar(crate::protocol::LAST_INSERT_ID)
        .fetch_one(&mut *conn)
        .await
}

/// The URL's options applied on top of `options`, and the driver's pool and connect options.
fn pool_config(
    url: &str,
    options: MysqlOptions,
) -> Result<(MysqlOptions, MySqlPoolOptions, MySqlConnectOptions)> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    if !matches!(scheme, Some("mysql" | "mariadb")) {
        return Err(Error::config(
            BACKEND,
            format!(
                "unparsable MySQL URL {:?}: it must start with mysql:// or mariadb://",
                url.chars().take(10).collect::<String>()
            ),
            None,
        ));
    }
    let (url, options) = options.with_url(url)?;
    if options.max_connections() > MAX_POOL {
        return Err(Error::config(
            BACKEND,
            format!(
                "max_connections {} is above the largest pool the store builds ({MAX_POOL})",
                options.max_connections()
            ),
            None,
        ));
    }
    // The driver parses mysql:// only by its fields, so mariadb:// is the same URL.
    let connect = MySqlConnectOptions::from_str(&url).map_err(|e| {
        Error::config(
            BACKEND,
            format!("unparsable MySQL URL: {e}"),
            Some(Box::new(e) as _),
        )
    })?;
    let lock_wait = format!(
        "SET SESSION innodb_lock_wait_timeout = {}",
        lock_wait_secs(options.op_timeout())
    );
    let pool = MySqlPoolOptions::new()
        .max_connections(options.max_connections())
        .acquire_timeout(options.acquire_timeout().min(LONGEST_POOL_WAIT))
        // No ping before each checkout: it is a whole round trip on every operation's path. The
        // driver already pings a connection when it returns to the pool (off the caller's path)
        // and drops it if that fails; a connection that dies idle fails its next statement, which
        // the caller sees as a failed operation and retries like any other backend error.
        .test_before_acquire(false)
        .after_connect(move |conn, _| {
            let lock_wait = lock_wait.clone();
            Box::pin(async move {
                conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await?;
                conn.execute(AssertSqlSafe(lock_wait)).await?;
                Ok(())
            })
        });
    Ok((options, pool, connect))
}

/// The error context of an operation before the store exists.
fn err_ctx(options: &MysqlOptions) -> ErrCtx<'_> {
    ErrCtx {
        table: options.table(),
        timeout: options.op_timeout(),
    }
}

/// A granted token from the OK packet's insert id (`LAST_INSERT_ID(expr)`).
fn granted_token(key: &LeaseKey, id: u64) -> Result<FencingToken> {
    let id = i64::try_from(id).map_err(|_| {
        leasehold_core::backend::corrupt(BACKEND, key.as_str(), format_args!("token {id}"))
    })?;
    decode_token(BACKEND, key.as_str(), id)
}

/// `ttl` checked against [`MIN_TTL`] and the largest TTL, rounded up to whole milliseconds.
pub(crate) fn grantable_ttl(ttl: Duration) -> Result<RoundedTtl> {
    validate_ttl(ttl, MIN_TTL).and_then(|()| ttl_millis(ttl))
}

/// The outcome of a request from what its acquire attempt found: a grant (the lease, its local
/// deadline counted from `sent`) or the holder. `what` is the debug line of a grant.
pub(crate) fn outcome(
    req: &AcquireRequest,
    found: Acquired,
    ttl: RoundedTtl,
    sent: Instant,
    what: &'static str,
    cx: ErrCtx<'_>,
) -> Result<AcquireOutcome> {
    let token = match found {
        Acquired::Granted(id) => granted_token(&req.key, id)?,
        Acquired::Stored(token) => decode_token(BACKEND, req.key.as_str(), token)?,
        Acquired::Held(row) => {
            let holder = holder_from(&req.key, &row, "acquire", cx)?;
            tracing::trace!(backend = BACKEND, key = %req.key, owner = %holder.owner, token = %holder.token, "lease held by another owner");
            return Ok(AcquireOutcome::Held(holder));
        }
    };
    tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, "{what}");
    Ok(AcquireOutcome::Acquired(granted_lease(
        req.key.clone(),
        req.owner.clone(),
        token,
        ttl.granted(),
        req.drift_margin(),
        sent,
    )))
}

#[async_trait]
impl LeaseStore for MysqlLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Tokens are [`TokenDurability::ClockFloored`]: durable on one server (InnoDB rows, a floor
    /// row per deleted key), and floored by the server's clock so that a failover to an
    /// asynchronous replica that lost the newest grants still issues greater tokens, as long as
    /// the promoted server's clock does not lag the old primary's by more than the failover took.
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TokenDurability::ClockFloored, ExpiryClock::Server)
            .with_min_ttl(MIN_TTL)
            .with_ttl_granularity(Duration::from_millis(1))
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let ttl = grantable_ttl(req.ttl)?;
        let sent = Instant::now();
        let c = &self.client;
        let found = c
            .query_retrying("acquire", async |conn| {
                acquire_on(conn, &c.sql, req, ttl).await
            })
            .await?;
        outcome(req, found, ttl, sent, "lease acquired", c.cx())
    }

    /// One transaction per 250 requests (`ACQUIRE_MANY_CHUNK`), 8 at once (`ACQUIRE_MANY_TXNS`),
    /// in key order (so that two batches over overlapping keys lock rows in one order). A chunk
    /// whose requests share one owner and one TTL (the usual batch: one worker taking many
    /// keys) is decided by three statements whatever its size: one guarded `UPDATE` of its keys
    /// (the single grant's guard and token, row by row), one `INSERT` of its keys without a row
    /// (each above its own floor), and one read of its rows (the granted tokens, the holders of
    /// the refused keys); see [`Statements::acquire_free_many`]. Any other chunk is decided
    /// request by request by acquire's statements on the transaction's connection. Either way
    /// one commit per chunk instead of one per key. The session's `READ COMMITTED` lets the
    /// holder reads see rows committed during the transaction, as they do outside one. A
    /// conflict (deadlock, lock wait timeout, a key inserted concurrently) rolls the chunk back
    /// and runs it again, as for a single acquire. Requests with an invalid TTL get their error
    /// in their slot and are not sent.
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        self.acquire_batch(reqs).await
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        let ttl = grantable_ttl(lease.ttl())?;
        let sent = Instant::now();
        let c = &self.client;
        let done = c
            .query_retrying("renew", async |conn| {
                sqlx::query(AssertSqlSafe(c.sql.renew.as_str()))
                    .bind(ttl.as_i64().saturating_mul(1000))
                    .bind(ttl.as_i64())
                    .bind(lease.key().as_str())
                    .bind(lease.owner().as_str())
                    .bind(lease.token().to_i64())
                    .execute(&mut *conn)
                    .await
            })
            .await?;
        if done.rows_affected() == 1 {
            tracing::trace!(backend = BACKEND, key = %lease.key(), token = %lease.token(), "lease renewed");
            Ok(RenewOutcome::Renewed(lease.renewed(ttl.granted(), sent)))
        } else {
            tracing::debug!(backend = BACKEND, key = %lease.key(), token = %lease.token(), "renew refused: lease lost");
            Ok(RenewOutcome::Lost)
        }
    }

    /// One guarded `UPDATE` per 250 leases of one owner and one TTL (the usual batch: one
    /// worker renewing everything it holds), 8 at once: the single renewal's guard (key, owner
    /// *and* token, unexpired) over a list of keys and tokens. When it changes fewer rows than
    /// it was sent, one read of the owner's unexpired rows tells the renewed leases from the
    /// lost ones (a lease renewed and then released or re-granted before that read is reported
    /// lost, never the other way round). Leases with an invalid TTL get their error in their
    /// slot and are not sent. A conflict (deadlock, lock wait timeout) runs the chunk again, as
    /// for a single renewal.
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        self.renew_batch(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let c = &self.client;
        let done = c
            .query_retrying("release", async |conn| {
                sqlx::query(AssertSqlSafe(c.sql.release.as_str()))
                    .bind(lease.key().as_str())
                    .bind(lease.owner().as_str())
                    .bind(lease.token().to_i64())
                    .execute(&mut *conn)
                    .await
            })
            .await?;
        if done.rows_affected() == 1 {
            tracing::debug!(backend = BACKEND, key = %lease.key(), token = %lease.token(), "lease released");
            Ok(ReleaseOutcome::Released)
        } else {
            Ok(ReleaseOutcome::NotHeld)
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.key_state(key).await
    }

    /// One `SELECT ... WHERE resource_key IN (...)` per 1,000 keys (the default would read the
    /// keys one by one: a shard set's scan of 10,000 keys did not answer within its bound).
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        self.key_states(keys).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unparsable_urls_are_config_errors() {
        for url in ["not a url", "postgres://h/db", "mysql://h/db?nope=1"] {
            let err = MysqlLeaseStore::connect_lazy(url, MysqlOptions::default()).unwrap_err();
            assert!(matches!(err, Error::Config { .. }), "{url}: {err:?}");
        }
    }

    #[test]
    fn an_absurd_pool_is_refused_before_anything_is_allocated() {
        let err = MysqlLeaseStore::connect_lazy(
            "mysql://h/db",
            MysqlOptions::default().with_max_connections(u32::MAX),
        )
        .unwrap_err();
        assert!(matches!(err, Error::Config { .. }), "{err:?}");
    }
}
