//! Fenced writes on PostgreSQL: the fenced transaction (validated against the lease row) and the
//! high-water-mark table (a [`FencedResource`] that does not need the lease row).

use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use lease_core::{
    FencedResource, FencingToken, Lease, LeaseKey, ResourceState, Result, WriteOp, WriteOutcome,
};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::BACKEND;
use crate::config::{PostgresOptions, TableName, TxTimeouts};
use crate::error::{self, ErrCtx};
use crate::sql::Statements;
use crate::store::{PostgresLeaseStore, token_from_row};

/// The result of [`PostgresLeaseStore::fenced_transaction`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum FencedTx<T> {
    /// The lease was valid when the row was locked and when the transaction committed; the
    /// caller's statements are committed and this is what the closure returned.
    Committed(T),
    /// The lease was not held (expired, released, taken over, or another token): nothing was
    /// written.
    LeaseLost,
}

impl<T> FencedTx<T> {
    /// The closure's value, if committed.
    pub fn committed(self) -> Option<T> {
        match self {
            FencedTx::Committed(v) => Some(v),
            FencedTx::LeaseLost => None,
        }
    }
}

/// Applies `timeouts` with `SET LOCAL` semantics (`set_config(.., true)`) to the open transaction.
pub(crate) async fn set_local_timeouts(
    conn: &mut PgConnection,
    timeouts: TxTimeouts,
) -> std::result::Result<(), sqlx::Error> {
    let [(n1, v1), (n2, v2), (n3, v3)] = timeouts.settings();
    sqlx::query(
        "SELECT set_config($1, $2, true), set_config($3, $4, true), set_config($5, $6, true)",
    )
    .bind(n1)
    .bind(v1)
    .bind(n2)
    .bind(v2)
    .bind(n3)
    .bind(v3)
    .execute(conn)
    .await
    .map(|_| ())
}

/// Runs `fut` within the client-side `deadline`: past it, a retryable
/// [`Error::Timeout`](lease_core::Error::Timeout). `fut` should hold its connection in a
/// [`Guarded`](crate::conn::Guarded), so that a connection abandoned by the deadline is **closed**,
/// not returned to the pool (its answer may still be on the wire, or never come: a black-holed
/// connection).
pub(crate) async fn within<T>(
    deadline: Duration,
    operation: &'static str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(deadline, fut)
        .await
        .map_err(|_| error::timeout(operation, deadline))?
}

impl PostgresLeaseStore {
    /// Runs the caller's statements in one transaction that is fenced by the lease row: the seed's
    /// protected write, as a library call.
    ///
    /// 1. `BEGIN`, then `lock_timeout`, `statement_timeout` and
    ///    `idle_in_transaction_session_timeout` are set for this transaction only
    ///    ([`TxTimeouts`], from the store's options).
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
    /// use lease_core::{AcquireRequest, LeaseKey, LeaseStore, OwnerId};
    /// use lease_postgres::{FencedTx, PostgresLeaseStore, PostgresOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
    /// let store = PostgresLeaseStore::connect("postgres://postgres@127.0.0.1:5432/test", PostgresOptions::default()).await?;
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
    /// [`TxTimeouts::deadline`] (default 10 s): a connection that stops answering (a black-holed
    /// network path, where even the server's own timeouts never reach the client) gives a
    /// retryable [`Error::Timeout`](lease_core::Error::Timeout), and that connection is closed.
    ///
    /// # Errors
    /// [`Error::Timeout`](lease_core::Error::Timeout) if the row lock was not granted within
    /// `lock_timeout`, a statement ran past `statement_timeout` (nothing committed), or the call
    /// ran past `deadline` (if `COMMIT` had been sent, its outcome is unknown);
    /// [`Error::Unavailable`](lease_core::Error::Unavailable) if the connection was lost (if lost
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
        let timeouts = self.options().tx_timeouts();
        let cx = tx_ctx(self.options(), "fenced transaction");
        let sql = self.statements();
        within(timeouts.deadline, cx.operation, async {
            let mut conn = crate::conn::Guarded::acquire(self.pool())
                .await
                .map_err(|e| error::map(e, cx))?;
            let out = fenced_tx_on(conn.get(), sql, timeouts, cx, lease, f).await;
            conn.finish();
            out
        })
        .await
    }
}

async fn fenced_tx_on<T, F>(
    conn: &mut PgConnection,
    sql: &Statements,
    timeouts: TxTimeouts,
    cx: ErrCtx<'_>,
    lease: &Lease,
    f: F,
) -> Result<FencedTx<T>>
where
    T: Send,
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
        + Send,
{
    let map = |e| error::map(e, cx);
    let mut tx = conn.begin().await.map_err(map)?;
    set_local_timeouts(&mut tx, timeouts).await.map_err(map)?;
    let locked = sqlx::query(AssertSqlSafe(sql.lock_row.as_str()))
        .bind(lease.key().as_str())
        .bind(lease.owner().as_str())
        .bind(lease.token().to_i64())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map)?;
    if locked.is_none() {
        let _ = tx.rollback().await;
        tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "fenced transaction refused: lease lost");
        return Ok(FencedTx::LeaseLost);
    }
    let value = match f(&mut tx).await {
        Ok(v) => v,
        Err(e) => {
            let _ = tx.rollback().await;
            return Err(map(e));
        }
    };
    let valid: Option<bool> = sqlx::query_scalar(AssertSqlSafe(sql.still_valid.as_str()))
        .bind(lease.key().as_str())
        .bind(lease.owner().as_str())
        .bind(lease.token().to_i64())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map)?;
    if valid != Some(true) {
        let _ = tx.rollback().await;
        tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "fenced transaction rolled back: lease expired during it");
        return Ok(FencedTx::LeaseLost);
    }
    tx.commit().await.map_err(map)?;
    tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "fenced transaction committed");
    Ok(FencedTx::Committed(value))
}

pub(crate) fn tx_ctx<'a>(options: &'a PostgresOptions, operation: &'static str) -> ErrCtx<'a> {
    let t = options.tx_timeouts();
    ErrCtx {
        operation,
        table: options.table(),
        timeout: t.statement_timeout,
        lock_timeout: t.lock_timeout,
    }
}

/// A high-water-mark table: a [`FencedResource`] for data that lives in PostgreSQL but is written
/// **without** holding the lease row.
///
/// Each key has one row in `<table>_fence` with `last_fencing_token`. A write is one conditional
/// upsert that applies only if `token >= last_fencing_token` and advances the mark in the same
/// statement; [`install`](FencedResource::install) advances the mark without writing ("install
/// the new generation before the new owner starts", so the previous owner is rejected at once).
/// The [`WriteOp`]s act on the row's `value` (`Put`) and `counter` (`Add`) columns.
///
/// For your own tables, either add a `last_fencing_token` column and use the same condition
/// (`... WHERE last_fencing_token <= $token`), or call [`HighWaterTable::advance_in`] inside your
/// transaction before your own statements.
///
/// ```no_run
/// use lease_core::{FencedResource, FencingToken, LeaseKey, WriteOp};
/// use lease_postgres::{PostgresLeaseStore, PostgresOptions};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// let store = PostgresLeaseStore::connect("postgres://postgres@127.0.0.1:5432/test", PostgresOptions::default()).await?;
/// let res = store.fenced_resource();
/// let key = LeaseKey::new("ledger")?;
/// let out = res.write(&key, FencingToken::new(7)?, WriteOp::Add(1)).await?;
/// assert!(out.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct HighWaterTable {
    pool: PgPool,
    table: TableName,
    sql: std::sync::Arc<Statements>,
    op_timeout: Duration,
}

impl HighWaterTable {
    /// The high-water-mark table that belongs to the lease table `lease_table`
    /// (`<lease_table>_fence`, created by [`PostgresLeaseStore::migrate`]).
    pub fn new(pool: PgPool, lease_table: &TableName, op_timeout: Duration) -> Self {
        HighWaterTable {
            pool,
            table: lease_table.clone(),
            sql: std::sync::Arc::new(Statements::new(lease_table)),
            op_timeout,
        }
    }

    fn cx(&self, operation: &'static str) -> ErrCtx<'_> {
        ErrCtx {
            operation,
            table: &self.table,
            timeout: self.op_timeout,
            lock_timeout: self.op_timeout,
        }
    }

    /// Advances the key's mark to `token` (if not lower) on `conn`, typically inside your own
    /// transaction: the row stays locked until you commit, so a writer with a greater token waits
    /// for you and a writer with a lower one is rejected. Write your own data after an
    /// `Accepted` outcome, in the same transaction.
    ///
    /// # Errors
    /// Driver errors, mapped.
    ///
    /// # Cancellation safety
    /// As the transaction it runs in.
    pub async fn advance_in(
        &self,
        conn: &mut PgConnection,
        key: &LeaseKey,
        token: FencingToken,
    ) -> Result<WriteOutcome> {
        self.apply(conn, key, token, None).await
    }

    pub(crate) async fn apply(
        &self,
        conn: &mut PgConnection,
        key: &LeaseKey,
        token: FencingToken,
        op: Option<WriteOp>,
    ) -> Result<WriteOutcome> {
        let (value, add, count, put): (Option<Vec<u8>>, i64, i64, bool) = match op {
            Some(WriteOp::Put(v)) => (Some(v), 0, 1, true),
            Some(WriteOp::Add(n)) => (None, n, 1, false),
            None => (None, 0, 0, false),
            Some(other) => {
                return Err(lease_core::Error::InvalidInput(format!(
                    "unsupported write operation {other:?}"
                )));
            }
        };
        let cx = self.cx("fenced write");
        let row = sqlx::query(AssertSqlSafe(self.sql.fence_write.as_str()))
            .bind(key.as_str())
            .bind(token.to_i64())
            .bind(value)
            .bind(add)
            .bind(count)
            .bind(put)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map(e, cx))?;
        if row.is_some() {
            tracing::trace!(backend = BACKEND, key = %key, token = %token, "fenced write accepted");
            return Ok(WriteOutcome::Accepted { high_water: token });
        }
        let mark: i64 = sqlx::query_scalar(AssertSqlSafe(self.sql.fence_mark.as_str()))
            .bind(key.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| error::map(e, cx))?;
        let high_water = token_from_row(mark)?;
        tracing::debug!(backend = BACKEND, key = %key, token = %token, high_water = %high_water, "stale token rejected");
        Ok(WriteOutcome::Rejected {
            presented: token,
            high_water,
        })
    }

    async fn run(
        &self,
        operation: &'static str,
        key: &LeaseKey,
        token: FencingToken,
        op: Option<WriteOp>,
    ) -> Result<WriteOutcome> {
        within(self.op_timeout, operation, async {
            let mut conn = crate::conn::Guarded::acquire(&self.pool)
                .await
                .map_err(|e| error::map(e, self.cx(operation)))?;
            let out = self.apply(conn.get(), key, token, op).await;
            conn.finish();
            out
        })
        .await
    }
}

#[async_trait]
impl FencedResource for HighWaterTable {
    async fn write(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: WriteOp,
    ) -> Result<WriteOutcome> {
        self.run("fenced write", key, token, Some(op)).await
    }

    async fn install(&self, key: &LeaseKey, token: FencingToken) -> Result<WriteOutcome> {
        self.run("fenced install", key, token, None).await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        let cx = self.cx("fenced read");
        let row = tokio::time::timeout(
            self.op_timeout,
            sqlx::query(AssertSqlSafe(self.sql.fence_read.as_str()))
                .bind(key.as_str())
                .fetch_optional(&self.pool),
        )
        .await
        .map_err(|_| error::timeout("fenced read", self.op_timeout))?
        .map_err(|e| error::map(e, cx))?;
        let Some(row) = row else {
            return Ok(ResourceState::default());
        };
        let mark: i64 = row.try_get(0).map_err(|e| error::map(e, cx))?;
        let value: Option<Vec<u8>> = row.try_get(1).map_err(|e| error::map(e, cx))?;
        let counter: i64 = row.try_get(2).map_err(|e| error::map(e, cx))?;
        let accepted: i64 = row.try_get(3).map_err(|e| error::map(e, cx))?;
        Ok(ResourceState {
            high_water: Some(token_from_row(mark)?),
            value,
            counter,
            accepted: u64::try_from(accepted)
                .map_err(|_| error::corrupt(format!("negative accepted count for {key}")))?,
        })
    }
}
