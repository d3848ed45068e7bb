//! [`SqliteFencedResource`]: a high-water-mark table in the same database file.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{
    FenceOp, FencedResource, FencingToken, LeaseKey, ResourceState, Result, WriteOp, WriteOutcome,
};

use leasehold_core::backend::{corrupt, decode_token};
use leasehold_core::mutation;
use sqlx::Connection;

use crate::error::BACKEND;
use crate::protocol;
use crate::store::{Inner, SqliteLeaseStore};

impl SqliteLeaseStore {
    /// A [`FencedResource`](leasehold_core::FencedResource) stored in the same file (table
    /// `lease_fenced`), sharing this store's connections.
    pub fn fenced_resource(&self) -> SqliteFencedResource {
        SqliteFencedResource::new(self.inner.clone())
    }
}

/// A [`FencedResource`] in table `lease_fenced` of a [`SqliteLeaseStore`]'s file: per key, the
/// highest accepted token, the last `Put` value, the sum of `Add`s and the number of accepted
/// writes. Each write is one `BEGIN IMMEDIATE` transaction, so the token check and the write are
/// atomic across processes.
///
/// ```no_run
/// use leasehold_core::{FencedResource, FencingToken, LeaseKey, WriteOp};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = leasehold_sqlite::SqliteLeaseStore::open("/tmp/leases.db").await?;
/// let res = store.fenced_resource();
/// let key = LeaseKey::new("ledger")?;
/// let out = res.write(&key, FencingToken::new(7)?, WriteOp::Add(1)).await?;
/// assert!(out.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteFencedResource {
    inner: Arc<Inner>,
}

impl SqliteFencedResource {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        SqliteFencedResource { inner }
    }

    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: Option<WriteOp>,
    ) -> Result<WriteOutcome> {
        let map = self.inner.map(if op.is_some() {
            "fenced write"
        } else {
            "fenced install"
        });
        let _turn = self.inner.gate.ordinary().await;
        let mut conn = self.inner.writer().await.map_err(&map)?;
        let done = async {
            let mut tx = conn.begin_with(protocol::BEGIN).await?;
            let row: Option<(i64, Option<Vec<u8>>, i64, i64)> =
                sqlx::query_as(protocol::SELECT_FENCED)
                    .bind(key.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            let mut state = match decode(key, row) {
                Ok(state) => state,
                Err(e) => return Ok(Err(e)),
            };
            if let Some(high_water) = state.high_water
                && token < high_water
                && !mutation::on("sqlite.fence.accept_stale")
            {
                tx.rollback().await?;
                tracing::debug!(backend = BACKEND, key = %key, token = %token, high_water = %high_water, "stale token rejected");
                return Ok(Ok(WriteOutcome::Rejected {
                    presented: token,
                    high_water,
                }));
            }
            state.high_water = Some(token);
            match op {
                Some(WriteOp::Put(v)) => {
                    state.value = Some(v);
                    state.accepted = state.accepted.saturating_add(1);
                }
                Some(WriteOp::Add(n)) => {
                    state.counter = state.counter.saturating_add(n);
                    state.accepted = state.accepted.saturating_add(1);
                }
                // `WriteOp` is non-exhaustive: refuse what this version cannot apply.
                Some(other) => {
                    tx.rollback().await?;
                    return Ok(Err(leasehold_core::Error::InvalidInput(format!(
                        "unsupported write {other:?}"
                    ))));
                }
                None => {}
            }
            sqlx::query(protocol::UPSERT_FENCED)
                .bind(key.as_str())
                .bind(token.to_i64())
                .bind(state.value)
                .bind(state.counter)
                .bind(i64::try_from(state.accepted).unwrap_or(i64::MAX))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            tracing::trace!(backend = BACKEND, key = %key, token = %token, "fenced write accepted");
            Ok(Ok(WriteOutcome::Accepted { high_water: token }))
        }
        .await;
        self.inner.check(done).map_err(&map)?
    }
}

fn decode(key: &LeaseKey, row: Option<(i64, Option<Vec<u8>>, i64, i64)>) -> Result<ResourceState> {
    let Some((high_water, value, counter, accepted)) = row else {
        return Ok(ResourceState::default());
    };
    Ok(ResourceState {
        high_water: Some(decode_token(BACKEND, key.as_str(), high_water)?),
        value,
        counter,
        accepted: u64::try_from(accepted).map_err(|e| {
            corrupt(
                BACKEND,
                key.as_str(),
                format_args!("accepted {accepted}: {e}"),
            )
        })?,
    })
}

#[async_trait]
impl FencedResource for SqliteFencedResource {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        self.apply(key, token, op.into_write_op()).await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        let row = sqlx::query_as(protocol::SELECT_FENCED)
            .bind(key.as_str())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(self.inner.map("fenced read"))?;
        decode(key, row)
    }
}

/// The store is also a fenced resource (its [`fenced_resource`](SqliteLeaseStore::fenced_resource)),
/// so one handle serves both roles.
#[async_trait]
impl FencedResource for SqliteLeaseStore {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        FencedResource::apply(&self.fenced_resource(), key, token, op).await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        self.fenced_resource().read(key).await
    }
}
