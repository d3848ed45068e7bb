//! Fenced writes on PostgreSQL: the fenced transaction (validated against the lease row) and the
//! high-water-mark table (a [`FencedResource`] that does not need the lease row).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use leasehold_core::backend::decode_token;
use leasehold_core::{
    FenceOp, FencedResource, FencingToken, Lease, LeaseKey, ResourceState, Result, WriteOp,
    WriteOutcome,
};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{AssertSqlSafe, Connection};

use crate::client::{Client, set_local_timeouts, within};
use crate::config::{TableLayout, TableName, TxTimeouts};
use crate::error::{self, BACKEND, ErrCtx};
use crate::inspect::column;
use crate::protocol::Statements;

impl crate::PostgresLeaseStore {
    /// The high-water-mark [`FencedResource`](leasehold_core::FencedResource) next to this store's
    /// lease table (`<table>_fence`), sharing the pool.
    pub fn fenced_resource(&self) -> PostgresFencedResource {
        PostgresFencedResource::from_pool(
            self.pool().clone(),
            self.table(),
            self.options().op_timeout(),
        )
    }
}

/// The result of [`PostgresLeaseStore::fenced_transaction`](crate::PostgresLeaseStore::fenced_transaction).
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
/// [`PostgresLeaseStore::fenced_transaction`](crate::PostgresLeaseStore::fenced_transaction)).
pub(crate) async fn fenced_transaction<T, F>(
    client: &Client,
    lease: &Lease,
    f: F,
) -> Result<FencedTx<T>>
where
    T: Send,
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
        + Send,
{
    let timeouts = client.options.tx_timeouts();
    let operation = "fenced transaction";
    let cx = client.tx_cx();
    within(timeouts.deadline, operation, async {
        let mut conn = crate::conn::Guarded::acquire(&client.pool)
            .await
            .map_err(|e| e.into_error(operation, cx))?;
        let out = fenced_tx_on(conn.get(), &client.sql, timeouts, operation, cx, lease, f).await;
        conn.finish();
        out
    })
    .await
}

async fn fenced_tx_on<T, F>(
    conn: &mut PgConnection,
    sql: &Statements,
    timeouts: TxTimeouts,
    operation: &'static str,
    cx: ErrCtx<'_>,
    lease: &Lease,
    f: F,
) -> Result<FencedTx<T>>
where
    T: Send,
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
        + Send,
{
    let map = |e| error::map(operation, e, cx);
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
/// (`... WHERE last_fencing_token <= $token`), or call [`PostgresFencedResource::advance_in`] inside your
/// transaction before your own statements.
///
/// ```no_run
/// use leasehold_core::{FencedResource, FencingToken, LeaseKey, WriteOp};
/// use leasehold_postgres::PostgresLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = PostgresLeaseStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// let res = store.fenced_resource();
/// let key = LeaseKey::new("ledger")?;
/// let out = res.write(&key, FencingToken::new(7)?, WriteOp::Add(1)).await?;
/// assert!(out.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresFencedResource {
    pool: PgPool,
    table: TableName,
    sql: Arc<Statements>,
    op_timeout: Duration,
}

impl PostgresFencedResource {
    /// The high-water-mark table that belongs to the lease table `lease_table`
    /// (`<lease_table>_fence`, created by
    /// [`PostgresLeaseStore::migrate`](crate::PostgresLeaseStore::migrate)), over an existing
    /// pool; each call is bounded by `op_timeout`. No I/O.
    pub fn from_pool(pool: PgPool, lease_table: &TableName, op_timeout: Duration) -> Self {
        PostgresFencedResource {
            pool,
            table: lease_table.clone(),
            // The high-water-mark statements are the same in every layout.
            sql: Arc::new(Statements::new(lease_table, TableLayout::Library)),
            op_timeout,
        }
    }

    fn cx(&self) -> ErrCtx<'_> {
        ErrCtx {
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
        self.apply_on(conn, key, token, None).await
    }

    pub(crate) async fn apply_on(
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
                return Err(leasehold_core::Error::InvalidInput(format!(
                    "unsupported write operation {other:?}"
                )));
            }
        };
        let operation = "fenced write";
        let cx = self.cx();
        let row = sqlx::query(AssertSqlSafe(self.sql.fence_write.as_str()))
            .bind(key.as_str())
            .bind(token.to_i64())
            .bind(value)
            .bind(add)
            .bind(count)
            .bind(put)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map(operation, e, cx))?;
        if row.is_some() {
            tracing::trace!(backend = BACKEND, key = %key, token = %token, "fenced write accepted");
            return Ok(WriteOutcome::Accepted { high_water: token });
        }
        let mark: i64 = sqlx::query_scalar(AssertSqlSafe(self.sql.fence_mark.as_str()))
            .bind(key.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| error::map(operation, e, cx))?;
        let high_water = decode_token(BACKEND, key.as_str(), mark)?;
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
                .map_err(|e| e.into_error(operation, self.cx()))?;
            let out = self.apply_on(conn.get(), key, token, op).await;
            conn.finish();
            out
        })
        .await
    }
}

#[async_trait]
impl FencedResource for PostgresFencedResource {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        let what = match op.write_op() {
            Some(_) => "fenced write",
            None => "fenced install",
        };
        self.run(what, key, token, op.into_write_op()).await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        let operation = "fenced read";
        let cx = self.cx();
        let row = tokio::time::timeout(
            self.op_timeout,
            sqlx::query(AssertSqlSafe(self.sql.fence_read.as_str()))
                .bind(key.as_str())
                .fetch_optional(&self.pool),
        )
        .await
        .map_err(|_| error::timeout("fenced read", self.op_timeout))?
        .map_err(|e| error::map(operation, e, cx))?;
        let Some(row) = row else {
            return Ok(ResourceState::default());
        };
        let mark: i64 = column(&row, 0, operation, cx)?;
        let value: Option<Vec<u8>> = column(&row, 1, operation, cx)?;
        let counter: i64 = column(&row, 2, operation, cx)?;
        let accepted: i64 = column(&row, 3, operation, cx)?;
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
