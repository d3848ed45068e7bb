//! Fenced writes on MySQL/MariaDB: the fenced transaction (validated against the lease row) and
//! the high-water-mark table (a [`FencedResource`] that does not need the lease row).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use leasehold_core::backend::decode_token;
use leasehold_core::{
    FenceOp, FencedResource, FencingToken, Lease, LeaseKey, ResourceState, Result, WriteOp,
    WriteOutcome,
};
use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::client::{Backoff, Client, Guarded, within};
use crate::config::{TableName, lock_wait_secs};
use crate::error::{self, BACKEND, ErrCtx, MyError};
use crate::protocol::Statements;

impl crate::MysqlLeaseStore {
    /// The high-water-mark [`FencedResource`](leasehold_core::FencedResource) next to this
    /// store's lease table (`<table>_fence`), sharing the pool.
    pub fn fenced_resource(&self) -> MysqlFencedResource {
        MysqlFencedResource::from_pool(
            self.pool().clone(),
            self.table(),
            self.options().op_timeout(),
        )
    }
}

/// The result of [`MysqlLeaseStore::fenced_transaction`](crate::MysqlLeaseStore::fenced_transaction).
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

/// The fenced transaction (documented on
/// [`MysqlLeaseStore::fenced_transaction`](crate::MysqlLeaseStore::fenced_transaction)).
pub(crate) async fn fenced_transaction<T, F>(
    client: &Client,
    lease: &Lease,
    f: F,
) -> Result<FencedTx<T>>
where
    T: Send,
    F: for<'c> FnOnce(
            &'c mut MySqlConnection,
        ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
        + Send,
{
    let timeouts = client.options.tx_timeouts();
    let operation = "fenced transaction";
    let cx = ErrCtx {
        table: client.options.table(),
        timeout: timeouts.lock_timeout,
    };
    within(timeouts.deadline, operation, async {
        let mut conn = Guarded::acquire(&client.pool)
            .await
            .map_err(|e| e.into_error(operation, cx))?;
        let map = |e| error::map(operation, e, cx);
        let c = conn.get();
        sqlx::query(AssertSqlSafe(format!(
            "SET SESSION innodb_lock_wait_timeout = {}",
            lock_wait_secs(timeouts.lock_timeout)
        )))
        .execute(&mut *c)
        .await
        .map_err(map)?;
        let out = fenced_tx_on(c, &client.sql, operation, cx, lease, f).await;
        // Back to the store's own bound before the connection returns to the pool.
        if let Err(e) = sqlx::query(AssertSqlSafe(format!(
            "SET SESSION innodb_lock_wait_timeout = {}",
            lock_wait_secs(client.options.op_timeout())
        )))
        .execute(&mut *c)
        .await
        {
            tracing::debug!(
                backend = BACKEND,
                "resetting the lock wait bound failed: {e}"
            );
            return out; // dropped unfinished: the connection is closed
        }
        conn.finish();
        out
    })
    .await
}

async fn fenced_tx_on<T, F>(
    conn: &mut MySqlConnection,
    sql: &Statements,
    operation: &'static str,
    cx: ErrCtx<'_>,
    lease: &Lease,
    f: F,
) -> Result<FencedTx<T>>
where
    T: Send,
    F: for<'c> FnOnce(
            &'c mut MySqlConnection,
        ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
        + Send,
{
    let map = |e| error::map(operation, e, cx);
    let mut tx = conn.begin().await.map_err(map)?;
    let locked = sqlx::query(AssertSqlSafe(sql.lock_row.as_str()))
        .bind(lease.key().as_str())
        .bind(lease.owner().as_str())
        .bind(lease.token().to_i64())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map)?;
    if locked.is_none() {
        let _ = tx.rollback().await;
        tracing::debug!(backend = BACKEND, key = %lease.key(), token = %lease.token(), "fenced transaction refused: lease lost");
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
        tracing::debug!(backend = BACKEND, key = %lease.key(), token = %lease.token(), "fenced transaction rolled back: lease expired during it");
        return Ok(FencedTx::LeaseLost);
    }
    tx.commit().await.map_err(map)?;
    Ok(FencedTx::Committed(value))
}

/// A high-water-mark table: a [`FencedResource`] for data that lives in MySQL/MariaDB but is
/// written **without** holding the lease row.
///
/// Each key has one row in `<table>_fence` with `last_fencing_token`. A write is one
/// conditional upsert (`INSERT .. ON DUPLICATE KEY UPDATE`) that applies only if
/// `token >= last_fencing_token` and raises the mark in the same statement, followed by a read
/// of the mark in the same transaction (the row stays locked between the two): a mark equal to
/// the token is an accepted write, a greater one a rejection.
/// [`install`](FencedResource::install) raises the mark without writing. The [`WriteOp`]s act
/// on the row's `value` (`Put`) and `counter` (`Add`) columns.
///
/// ```no_run
/// use leasehold_core::{FencedResource, FencingToken, LeaseKey, WriteOp};
/// use leasehold_mysql::MysqlLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = MysqlLeaseStore::connect("mysql://root@127.0.0.1:3306/test").await?;
/// let res = store.fenced_resource();
/// let key = LeaseKey::new("ledger")?;
/// let out = res.write(&key, FencingToken::new(7)?, WriteOp::Add(1)).await?;
/// assert!(out.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MysqlFencedResource {
    pool: MySqlPool,
    table: TableName,
    sql: Arc<Statements>,
    op_timeout: Duration,
}

impl MysqlFencedResource {
    /// The high-water-mark table that belongs to the lease table `lease_table`
    /// (`<lease_table>_fence`, created by
    /// [`MysqlLeaseStore::migrate`](crate::MysqlLeaseStore::migrate)), over an existing pool;
    /// each call is bounded by `op_timeout`. No I/O.
    pub fn from_pool(pool: MySqlPool, lease_table: &TableName, op_timeout: Duration) -> Self {
        MysqlFencedResource {
            pool,
            table: lease_table.clone(),
            sql: Arc::new(Statements::new(lease_table)),
            op_timeout,
        }
    }

    fn cx(&self) -> ErrCtx<'_> {
        ErrCtx {
            table: &self.table,
            timeout: self.op_timeout,
        }
    }

    /// Raises the key's mark to `token` (if not lower) on `conn`, inside your own transaction
    /// (begin one first): the mark's row stays locked until you commit, so a writer with a
    /// greater token waits for you and a writer with a lower one is rejected. Write your own
    /// data after an `Accepted` outcome, in the same transaction.
    ///
    /// # Errors
    /// Driver errors, mapped.
    ///
    /// # Cancellation safety
    /// As the transaction it runs in.
    pub async fn advance_in(
        &self,
        conn: &mut MySqlConnection,
        key: &LeaseKey,
        token: FencingToken,
    ) -> Result<WriteOutcome> {
        apply_on(&self.sql, conn, key, token, None)
            .await
            .map_err(|e| e.into_error("fenced write", self.cx()))?
    }
}

async fn apply_on(
    sql: &Statements,
    conn: &mut MySqlConnection,
    key: &LeaseKey,
    token: FencingToken,
    op: Option<WriteOp>,
) -> std::result::Result<Result<WriteOutcome>, MyError> {
    let (value, add, count, put): (Option<Vec<u8>>, i64, i64, bool) = match op {
        Some(WriteOp::Put(v)) => (Some(v), 0, 1, true),
        Some(WriteOp::Add(n)) => (None, n, 1, false),
        None => (None, 0, 0, false),
        Some(other) => {
            return Ok(Err(leasehold_core::Error::InvalidInput(format!(
                "unsupported write operation {other:?}"
            ))));
        }
    };
    sqlx::query(AssertSqlSafe(sql.fence_write.as_str()))
        .bind(key.as_str())
        .bind(token.to_i64())
        .bind(value)
        .bind(add)
        .bind(count)
        .bind(put)
        .execute(&mut *conn)
        .await?;
    let mark: i64 = sqlx::query_scalar(AssertSqlSafe(sql.fence_mark.as_str()))
        .bind(key.as_str())
        .fetch_one(&mut *conn)
        .await?;
    let high_water = match decode_token(BACKEND, key.as_str(), mark) {
        Ok(t) => t,
        Err(e) => return Ok(Err(e)),
    };
    if high_water == token {
        tracing::trace!(backend = BACKEND, key = %key, token = %token, "fenced write accepted");
        Ok(Ok(WriteOutcome::Accepted { high_water }))
    } else {
        tracing::debug!(backend = BACKEND, key = %key, token = %token, high_water = %high_water, "stale token rejected");
        Ok(Ok(WriteOutcome::Rejected {
            presented: token,
            high_water,
        }))
    }
}

#[async_trait]
impl FencedResource for MysqlFencedResource {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        let operation = match op.write_op() {
            Some(_) => "fenced write",
            None => "fenced install",
        };
        let op = op.into_write_op();
        let cx = self.cx();
        within(self.op_timeout, operation, async {
            let mut backoff = Backoff::new();
            loop {
                let mut conn = Guarded::acquire(&self.pool)
                    .await
                    .map_err(|e| e.into_error(operation, cx))?;
                let r = async {
                    let mut tx = conn.get().begin().await?;
                    let out = apply_on(&self.sql, &mut tx, key, token, op.clone()).await?;
                    tx.commit().await?;
                    Ok(out)
                }
                .await;
                conn.finish();
                if let Some(r) = backoff.retry(operation, r).await {
                    return r.map_err(|e| e.into_error(operation, cx))?;
                }
            }
        })
        .await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        let operation = "fenced read";
        let cx = self.cx();
        let map = |e| error::map(operation, e, cx);
        let row = within(self.op_timeout, operation, async {
            let mut conn = Guarded::acquire(&self.pool)
                .await
                .map_err(|e| e.into_error(operation, cx))?;
            let r = sqlx::query(AssertSqlSafe(self.sql.fence_read.as_str()))
                .bind(key.as_str())
                .fetch_optional(conn.get())
                .await;
            conn.finish();
            r.map_err(map)
        })
        .await?;
        let Some(row) = row else {
            return Ok(ResourceState::default());
        };
        let mark: i64 = row.try_get(0).map_err(map)?;
        let value: Option<Vec<u8>> = row.try_get(1).map_err(map)?;
        let counter: i64 = row.try_get(2).map_err(map)?;
        let accepted: i64 = row.try_get(3).map_err(map)?;
        Ok(ResourceState {
            high_water: Some(decode_token(BACKEND, key.as_str(), mark)?),
            value,
            counter,
            accepted: u64::try_from(accepted).map_err(|_| {
                leasehold_core::backend::corrupt(
                    BACKEND,
                    key.as_str(),
                    format_args!("negative accepted count {accepted}"),
                )
            })?,
        })
    }
}
