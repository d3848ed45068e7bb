//! [`PostgresLeaseStore`]: the lease contract on a PostgreSQL table.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, ExpiryClock, FencingToken, Holder,
    KeyState, KeyWatch, Lease, LeaseKey, LeaseStore, ReleaseOutcome, RenewOutcome, Result,
    TokenDurability, validate_ttl,
};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};
use tokio::time::Instant;

use crate::BACKEND;
use crate::config::{PostgresOptions, TableName, millis_setting};
use crate::error::{self, ErrCtx};
use crate::fenced::HighWaterTable;
use crate::notify::Notifier;
use crate::sql::Statements;

/// The shortest TTL this store grants: one millisecond, its granularity.
pub const MIN_TTL: Duration = Duration::from_millis(1);

/// A [`LeaseStore`] on a PostgreSQL table, over a `sqlx` connection pool.
///
/// - **acquire** is one statement: the seed's upsert (insert, or take over only when
///   `lease_until <= clock_timestamp()`), extended so that the same owner may re-acquire. The
///   token is drawn by a trigger, `greatest(requested, nextval(seq), server clock in µs)`, so
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
///   sends `pg_notify(<channel>, <key>)` in the same statement, on the table's channel
///   ([`TableName::notify_channel`]); [`watch`](LeaseStore::watch) subscribes to the key on one
///   shared `LISTEN` connection per store. See [Watching a key](#watching-a-key).
///
/// A cloneable handle: clones share the pool and the listener.
///
/// # Watching a key
/// The first `watch` opens a dedicated connection (`application_name =
/// lease-postgres-listener`, the pool's other connect options, bounded by the operation timeout)
/// and `LISTEN`s before it returns, so every release committed after that reaches the watch.
/// Later watches share it; each [`KeyWatch`] gets hints for its own key only and unsubscribes when
/// dropped. PostgreSQL has no expiry events: a lease that simply runs out sends nothing (the
/// [`Supervisor`](lease_core::supervisor::Supervisor) already retries at the holder's reported
/// remaining time). [`delete_prefix`](Self::delete_prefix) sends nothing either.
///
/// **Failure behaviour**: the listener never reconnects silently (notifications sent while it
/// was away would be lost). If its connection breaks, every open watch ends (its stream returns
/// `None`), so waiters fall back to polling, and the next `watch` connects again. With no open
/// watch for 30 s, or once the store and all its watches are dropped, the listener disconnects.
///
/// ```no_run
/// use std::time::Duration;
/// use lease_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
/// use lease_postgres::{PostgresLeaseStore, PostgresOptions};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
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
    pool: PgPool,
    options: Arc<PostgresOptions>,
    sql: Arc<Statements>,
    notifier: Arc<Notifier>,
}

impl PostgresLeaseStore {
    /// A store over an existing pool. No I/O; call [`migrate`](Self::migrate) or
    /// [`verify_schema`](Self::verify_schema) before use.
    pub fn new(pool: PgPool, options: PostgresOptions) -> Self {
        let sql = Arc::new(Statements::new(options.table()));
        let notifier = Arc::new(Notifier::new(options.table()));
        PostgresLeaseStore {
            pool,
            options: Arc::new(options),
            sql,
            notifier,
        }
    }

    /// Builds a pool from `url` (sized and bounded by `options`, with `statement_timeout` set to
    /// the operation timeout), connects, and checks that the schema exists.
    ///
    /// # Errors
    /// [`Error::Config`] for an unparsable URL, a refused login, a missing database or a missing
    /// table (run [`migrate`](Self::migrate)); [`Error::Unavailable`] if the server cannot be
    /// reached.
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is changed on the server.
    pub async fn connect(url: &str, options: PostgresOptions) -> Result<Self> {
        let (pool_options, connect_options) = pool_config(url, &options)?;
        let pool = pool_options
            .connect_with(connect_options)
            .await
            .map_err(|e| error::map(e, err_ctx("connect", &options)))?;
        let store = PostgresLeaseStore::new(pool, options);
        store.verify_schema().await?;
        Ok(store)
    }

    /// Parses `url` and builds a pool that connects on first use. No I/O.
    ///
    /// # Errors
    /// [`Error::Config`] for an unparsable URL.
    pub fn connect_lazy(url: &str, options: PostgresOptions) -> Result<Self> {
        let (pool_options, connect_options) = pool_config(url, &options)?;
        Ok(PostgresLeaseStore::new(
            pool_options.connect_lazy_with(connect_options),
            options,
        ))
    }

    /// The pool (for your own queries, [`AdvisoryLocks`](crate::AdvisoryLocks), ...).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The options the store was built with.
    pub fn options(&self) -> &PostgresOptions {
        &self.options
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        self.options.table()
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

    /// The high-water-mark [`FencedResource`](lease_core::FencedResource) next to this store's
    /// lease table (`<table>_fence`), sharing the pool.
    pub fn fenced_resource(&self) -> HighWaterTable {
        HighWaterTable::new(self.pool.clone(), self.table(), self.options.op_timeout())
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
        let mut n = 0;
        for stmt in &self.sql.delete_prefix {
            n += self
                .bounded("delete", async {
                    let mut conn = crate::conn::Guarded::acquire(&self.pool).await?;
                    let r = sqlx::query(AssertSqlSafe(stmt.as_str()))
                        .bind(prefix)
                        .execute(conn.get())
                        .await;
                    conn.finish();
                    r
                })
                .await
                .map_err(|e| e.into_error(self.cx("delete")))?
                .rows_affected();
        }
        Ok(n)
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.sql
    }

    pub(crate) fn cx(&self, operation: &'static str) -> ErrCtx<'_> {
        err_ctx(operation, &self.options)
    }

    /// Runs `fut` within the operation timeout.
    pub(crate) async fn bounded<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> std::result::Result<T, Failure> {
        let after = self.options.op_timeout();
        match tokio::time::timeout(after, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Failure::Sql(e)),
            Err(_) => Err(Failure::TimedOut(operation, after)),
        }
    }

    async fn holder(&self, key: &LeaseKey) -> Result<(Option<Holder>, Option<FencingToken>)> {
        let row = self
            .bounded("inspect", async {
                let mut conn = crate::conn::Guarded::acquire(&self.pool).await?;
                let r = sqlx::query(AssertSqlSafe(self.sql.inspect.as_str()))
                    .bind(key.as_str())
                    .fetch_optional(conn.get())
                    .await;
                conn.finish();
                r
            })
            .await
            .map_err(|e| e.into_error(self.cx("inspect")))?;
        let Some(row) = row else {
            return Ok((None, None));
        };
        let cx = self.cx("inspect");
        let owner: String = row.try_get("owner").map_err(|e| error::map(e, cx))?;
        let token: i64 = row
            .try_get("fencing_token")
            .map_err(|e| error::map(e, cx))?;
        let ttl_ms: Option<i64> = row.try_get("ttl_ms").map_err(|e| error::map(e, cx))?;
        let remaining_us: Option<i64> =
            row.try_get("remaining_us").map_err(|e| error::map(e, cx))?;
        let token = token_from_row(token)?;
        let holder = match remaining_us {
            Some(_) => Some(holder_from(key, owner, token, ttl_ms, remaining_us)?),
            None => None,
        };
        Ok((holder, Some(token)))
    }
}

/// A holder from a row: the remaining time (at most the TTL) and the TTL (the row's, or the
/// remaining time for rows written by other tools).
fn holder_from(
    key: &LeaseKey,
    owner: String,
    token: FencingToken,
    ttl_ms: Option<i64>,
    remaining_us: Option<i64>,
) -> Result<Holder> {
    let remaining = Duration::from_micros(
        remaining_us
            .and_then(|us| u64::try_from(us).ok())
            .unwrap_or(0)
            .max(1),
    );
    let (remaining, ttl) = match ttl_ms.map(u64::try_from) {
        Some(Ok(ms)) => {
            let ttl = Duration::from_millis(ms);
            (remaining.min(ttl), ttl)
        }
        _ => (remaining, remaining),
    };
    let owner = lease_core::OwnerId::new(&owner)
        .map_err(|e| error::corrupt(format!("the lease row of {key} has an illegal owner: {e}")))?;
    Ok(Holder {
        owner,
        token,
        remaining,
        ttl,
    })
}

/// A failed bounded call: a driver error, or the client-side timeout.
#[derive(Debug)]
pub(crate) enum Failure {
    Sql(sqlx::Error),
    TimedOut(&'static str, Duration),
}

impl Failure {
    pub(crate) fn into_error(self, cx: ErrCtx<'_>) -> Error {
        match self {
            Failure::Sql(e) => error::map(e, cx),
            Failure::TimedOut(op, after) => error::timeout(op, after),
        }
    }
}

fn err_ctx<'a>(operation: &'static str, options: &'a PostgresOptions) -> ErrCtx<'a> {
    ErrCtx {
        operation,
        table: options.table(),
        timeout: options.op_timeout(),
        lock_timeout: options.tx_timeouts().lock_timeout,
    }
}

fn pool_config(url: &str, options: &PostgresOptions) -> Result<(PgPoolOptions, PgConnectOptions)> {
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
    let connect = PgConnectOptions::from_str(url).map_err(|e| {
        Error::config(
            BACKEND,
            format!("unparsable PostgreSQL URL: {e}"),
            Some(Box::new(e) as _),
        )
    })?;
    let connect = connect
        .application_name("lease-postgres")
        .options([("statement_timeout", millis_setting(options.op_timeout()))]);
    let pool = PgPoolOptions::new()
        .max_connections(options.max_connections())
        .acquire_timeout(options.acquire_timeout());
    Ok((pool, connect))
}

/// A TTL in whole milliseconds, rounded up, and the granted TTL it stands for.
pub(crate) fn ttl_millis(ttl: Duration) -> Result<(i64, Duration)> {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    let ms = u64::try_from(ms).map_err(|_| Error::InvalidTtl {
        ttl,
        reason: "too large".to_string(),
    })?;
    let signed = i64::try_from(ms).map_err(|_| Error::InvalidTtl {
        ttl,
        reason: "too large".to_string(),
    })?;
    Ok((signed, Duration::from_millis(ms)))
}

pub(crate) fn token_from_row(token: i64) -> Result<FencingToken> {
    FencingToken::try_from(token)
        .map_err(|e| error::corrupt(format!("the lease table holds an illegal token: {e}")))
}

#[async_trait]
impl LeaseStore for PostgresLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Tokens are [`TokenDurability::ClockFloored`]: durable on one server (a WAL-logged sequence
    /// and table), and floored by the server's clock so that a failover to an asynchronous standby
    /// that lost the newest grants still issues greater tokens, as long as the promoted server's
    /// clock does not lag the old primary's by more than the failover took (ADR 0010).
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TokenDurability::ClockFloored, ExpiryClock::Server)
            .with_watch(self.options.notify())
            .with_min_ttl(MIN_TTL)
            .with_ttl_granularity(Duration::from_millis(1))
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        validate_ttl(req.ttl, MIN_TTL)?;
        let (ms, granted) = ttl_millis(req.ttl)?;
        let sent = Instant::now();
        let row = self
            .bounded("acquire", async {
                let mut conn = crate::conn::Guarded::acquire(&self.pool).await?;
                let r = sqlx::query(AssertSqlSafe(self.sql.acquire.as_str()))
                    .bind(req.key.as_str())
                    .bind(req.owner.as_str())
                    .bind(ms)
                    .fetch_one(conn.get())
                    .await;
                conn.finish();
                r
            })
            .await
            .map_err(|e| e.into_error(self.cx("acquire")))?;
        let cx = self.cx("acquire");
        let owner: String = row.try_get("owner").map_err(|e| error::map(e, cx))?;
        let token: i64 = row
            .try_get("fencing_token")
            .map_err(|e| error::map(e, cx))?;
        let token = token_from_row(token)?;
        if owner == req.owner.as_str() {
            tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, "lease acquired");
            return Ok(AcquireOutcome::Acquired(Lease::granted(
                req.key.clone(),
                req.owner.clone(),
                token,
                granted,
                req.drift_margin(),
                sent,
            )));
        }
        let ttl_ms: Option<i64> = row.try_get("ttl_ms").map_err(|e| error::map(e, cx))?;
        let remaining_us: Option<i64> =
            row.try_get("remaining_us").map_err(|e| error::map(e, cx))?;
        let holder = holder_from(&req.key, owner, token, ttl_ms, remaining_us)?;
        tracing::trace!(backend = BACKEND, key = %req.key, owner = %holder.owner, token = %holder.token, "lease held by another owner");
        Ok(AcquireOutcome::Held(holder))
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        validate_ttl(lease.ttl(), MIN_TTL)?;
        let (ms, granted) = ttl_millis(lease.ttl())?;
        let sent = Instant::now();
        let done = self
            .bounded("renew", async {
                let mut conn = crate::conn::Guarded::acquire(&self.pool).await?;
                let r = sqlx::query(AssertSqlSafe(self.sql.renew.as_str()))
                    .bind(lease.key().as_str())
                    .bind(lease.owner().as_str())
                    .bind(lease.token().to_i64())
                    .bind(ms)
                    .execute(conn.get())
                    .await;
                conn.finish();
                r
            })
            .await
            .map_err(|e| e.into_error(self.cx("renew")))?;
        if done.rows_affected() == 1 {
            tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
            Ok(RenewOutcome::Renewed(lease.renewed(granted, sent)))
        } else {
            tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "renew refused: lease lost");
            Ok(RenewOutcome::Lost)
        }
    }

    /// One statement. With notifications on (the default) it also sends
    /// `pg_notify(<channel>, <key>)` when, and only when, it released: one round trip.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let sql = if self.options.notify() {
            self.sql.release_notify.as_str()
        } else {
            self.sql.release.as_str()
        };
        let done = self
            .bounded("release", async {
                let mut conn = crate::conn::Guarded::acquire(&self.pool).await?;
                let r = sqlx::query(AssertSqlSafe(sql))
                    .bind(lease.key().as_str())
                    .bind(lease.owner().as_str())
                    .bind(lease.token().to_i64())
                    .execute(conn.get())
                    .await;
                conn.finish();
                r
            })
            .await
            .map_err(|e| e.into_error(self.cx("release")))?;
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
        let mut slots: Vec<Option<Result<RenewOutcome>>> = Vec::with_capacity(leases.len());
        let (mut keys, mut owners, mut tokens, mut ttls) = (vec![], vec![], vec![], vec![]);
        let mut granted = Vec::with_capacity(leases.len());
        for lease in leases {
            match validate_ttl(lease.ttl(), MIN_TTL).and_then(|()| ttl_millis(lease.ttl())) {
                Ok((ms, g)) => {
                    keys.push(lease.key().as_str().to_string());
                    owners.push(lease.owner().as_str().to_string());
                    tokens.push(lease.token().to_i64());
                    ttls.push(ms);
                    granted.push(g);
                    slots.push(None);
                }
                Err(e) => {
                    granted.push(Duration::ZERO);
                    slots.push(Some(Err(e)));
                }
            }
        }
        if keys.is_empty() {
            return Ok(slots.into_iter().flatten().collect());
        }
        let sent = Instant::now();
        let rows = self
            .bounded("renew", async {
                let mut conn = crate::conn::Guarded::acquire(&self.pool).await?;
                let r = sqlx::query(AssertSqlSafe(self.sql.renew_many.as_str()))
                    .bind(&keys)
                    .bind(&owners)
                    .bind(&tokens)
                    .bind(&ttls)
                    .fetch_all(conn.get())
                    .await;
                conn.finish();
                r
            })
            .await
            .map_err(|e| e.into_error(self.cx("renew")))?;
        let mut renewed = std::collections::HashSet::with_capacity(rows.len());
        for row in rows {
            let cx = self.cx("renew");
            let key: String = row.try_get(0).map_err(|e| error::map(e, cx))?;
            let token: i64 = row.try_get(1).map_err(|e| error::map(e, cx))?;
            renewed.insert((key, token));
        }
        Ok(leases
            .iter()
            .zip(granted)
            .zip(slots)
            .map(|((lease, ttl), slot)| {
                slot.unwrap_or_else(|| {
                    let id = (lease.key().as_str().to_string(), lease.token().to_i64());
                    if renewed.contains(&id) {
                        tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
                        Ok(RenewOutcome::Renewed(lease.renewed(ttl, sent)))
                    } else {
                        tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "renew refused: lease lost");
                        Ok(RenewOutcome::Lost)
                    }
                })
            })
            .collect())
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        let (holder, last_token) = self.holder(key).await?;
        Ok(KeyState {
            key: key.clone(),
            holder,
            last_token,
        })
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
        if !self.options.notify() {
            return Ok(None);
        }
        self.notifier
            .watch(&self.pool, key, self.options.op_timeout())
            .await
            .map(Some)
            .map_err(|e| e.into_error(self.cx("watch")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_milliseconds() {
        assert_eq!(
            ttl_millis(Duration::from_micros(1500)).unwrap(),
            (2, Duration::from_millis(2))
        );
        assert_eq!(
            ttl_millis(Duration::from_secs(3)).unwrap(),
            (3000, Duration::from_secs(3))
        );
    }

    #[test]
    fn unparsable_urls_are_config_errors() {
        let err =
            PostgresLeaseStore::connect_lazy("not a url", PostgresOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Config { .. }), "{err:?}");
    }
}
