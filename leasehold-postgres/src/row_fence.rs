//! A [`FencedResource`] fenced by the lease row itself: the generation in the lease table is the
//! high-water mark.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::backend::decode_token;
use leasehold_core::{
    Error, FenceOp, FencedResource, FencingToken, LeaseKey, ResourceState, Result, WriteOp,
    WriteOutcome,
};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::client::{Client, set_local_timeouts, within};
use crate::error::{BACKEND, ErrCtx, map};
use crate::fenced::PostgresFencedResource;

/// A [`FencedResource`] whose writes are validated against the **lease row** in the same
/// transaction, like the seed's protected write but keyed by the token alone (a
/// `FencedResource` write carries no owner).
///
/// Each write or install: `BEGIN`; lock the key's lease row `FOR UPDATE` and read its
/// generation `g` (the newest token ever granted for the key); a token below `g` is
/// [`WriteOutcome::Rejected`] with `g` as the high-water mark; a token equal to `g` is applied to
/// the `<table>_fence` row (value, counter, mark) and committed. While the row is locked no newer
/// token can be granted, so an accepted write always commits before any newer holder exists.
/// It does not check expiry: a token that is still the newest generation is, by definition, not
/// stale yet (use [`PostgresLeaseStore::fenced_transaction`](crate::PostgresLeaseStore::fenced_transaction) to also require an unexpired lease).
///
/// Each call is bounded on the client by the store's [`TxTimeouts::deadline`](crate::TxTimeouts::deadline)
/// (default 10 s): a connection that stops answering gives a retryable
/// [`Error::Timeout`](leasehold_core::Error::Timeout) and is closed; if `COMMIT` had been sent, the
/// write's outcome is unknown.
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_core::{AcquireRequest, FencedResource, LeaseKey, LeaseStore, OwnerId, WriteOp};
/// use leasehold_postgres::{LeaseRowFence, PostgresLeaseStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = PostgresLeaseStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// let req = AcquireRequest::new(LeaseKey::new("ledger")?, OwnerId::random(), Duration::from_secs(10));
/// let lease = store.acquire(&req).await?.lease().expect("free");
/// let fence = LeaseRowFence::new(store.clone());
/// let out = fence.write(lease.key(), lease.token(), WriteOp::Add(1)).await?;
/// println!("accepted: {}", out.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LeaseRowFence {
    client: Arc<Client>,
    data: PostgresFencedResource,
}

impl LeaseRowFence {
    /// The lease-row fence over a store's shared internals; data goes to `data`
    /// (`<table>_fence`). [`LeaseRowFence::new`] is the public constructor.
    pub(crate) fn from_client(client: Arc<Client>, data: PostgresFencedResource) -> Self {
        LeaseRowFence { client, data }
    }

    async fn run(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: Option<WriteOp>,
    ) -> Result<WriteOutcome> {
        let operation = "lease-row fenced write";
        let cx = self.client.tx_cx();
        within(
            self.client.options.tx_timeouts().deadline,
            operation,
            async {
                let mut conn = crate::conn::Guarded::acquire(&self.client.pool)
                    .await
                    .map_err(|e| e.into_error(operation, cx))?;
                let out = self.run_on(conn.get(), operation, cx, key, token, op).await;
                conn.finish();
                out
            },
        )
        .await
    }

    async fn run_on(
        &self,
        conn: &mut PgConnection,
        operation: &'static str,
        cx: ErrCtx<'_>,
        key: &LeaseKey,
        token: FencingToken,
        op: Option<WriteOp>,
    ) -> Result<WriteOutcome> {
        let map = |e| map(operation, e, cx);
        let mut tx = conn.begin().await.map_err(map)?;
        set_local_timeouts(&mut tx, self.client.options.tx_timeouts())
            .await
            .map_err(map)?;
        let generation: Option<i64> =
            sqlx::query_scalar(AssertSqlSafe(self.client.sql.lock_generation.as_str()))
                .bind(key.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(map)?;
        let Some(generation) = generation else {
            let _ = tx.rollback().await;
            return Err(Error::InvalidInput(format!(
                "no lease row for {key}: token {token} was not issued by this table"
            )));
        };
        let generation = decode_token(BACKEND, key.as_str(), generation)?;
        if token < generation {
            let _ = tx.rollback().await;
            tracing::debug!(backend = BACKEND, key = %key, token = %token, high_water = %generation, "stale token rejected by the lease row");
            return Ok(WriteOutcome::Rejected {
                presented: token,
                high_water: generation,
            });
        }
        if token > generation {
            let _ = tx.rollback().await;
            return Err(Error::InvalidToken {
                reason: format!(
                    "token {token} was never issued for {key} (newest is {generation})"
                ),
            });
        }
        let out = self.data.apply_on(&mut tx, key, token, op).await?;
        if out.is_accepted() {
            tx.commit().await.map_err(map)?;
        } else {
            let _ = tx.rollback().await;
        }
        Ok(out)
    }
}

#[async_trait]
impl FencedResource for LeaseRowFence {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        self.run(key, token, op.into_write_op()).await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        self.data.read(key).await
    }
}
