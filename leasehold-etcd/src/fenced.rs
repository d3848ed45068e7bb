//! [`EtcdFencedResource`]: a fenced resource whose state lives in etcd.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{
    FenceOp, FencedResource, FencingToken, LeaseKey, ResourceState, Result, WriteOutcome,
};

use crate::error::BACKEND;
use crate::protocol::{self, decode_state, fence_txn};
use crate::store::EtcdLeaseStore;

/// How often a write retries when another writer changed the state key in between.
const MAX_ATTEMPTS: usize = 64;

/// A [`FencedResource`] in etcd: per key one state key `<fence prefix><key>` holding the
/// high-water token, the value, the counter and the number of accepted writes.
///
/// Every write and install is a transaction that compares the state key's mod revision with the
/// one just read (so the high-water check and the write are atomic), retried when another writer
/// got in between. `install` moves the high-water mark to a new generation without writing, so
/// that the previous holder is rejected before the new one writes.
///
/// ```no_run
/// use leasehold_core::{FencedResource, FencingToken, LeaseKey, WriteOp};
/// use leasehold_etcd::EtcdLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = EtcdLeaseStore::connect("etcd://127.0.0.1:2379").await?;
/// let resource = store.fenced_resource();
/// let key = LeaseKey::new("ledger")?;
/// let out = resource.write(&key, FencingToken::new(7)?, WriteOp::Add(1)).await?;
/// println!("accepted: {}", out.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdFencedResource {
    store: EtcdLeaseStore,
    prefix: Arc<str>,
}

impl fmt::Debug for EtcdFencedResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdFencedResource")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdLeaseStore {
    /// The fenced resource that keeps its state in this store's etcd, under
    /// [`EtcdOptions::fence_prefix`](crate::EtcdOptions::fence_prefix), sharing this store's
    /// connection.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = leasehold_etcd::EtcdLeaseStore::connect("etcd://127.0.0.1:2379").await?;
    /// let resource = store.fenced_resource();
    /// # let _ = resource; Ok(()) }
    /// ```
    pub fn fenced_resource(&self) -> EtcdFencedResource {
        EtcdFencedResource {
            store: self.clone(),
            prefix: Arc::from(self.options().fence_prefix()),
        }
    }
}

impl EtcdFencedResource {
    fn state_key(&self, key: &LeaseKey) -> String {
        protocol::state_key(&self.prefix, key)
    }

    /// The state and the state key's mod revision (0 if absent).
    async fn load(&self, key: &LeaseKey) -> Result<(ResourceState, i64)> {
        let state_key = self.state_key(key);
        let mut resp = self.store.get(state_key.clone(), None).await?;
        match resp.take_kvs().into_iter().next() {
            Some(kv) => Ok((decode_state(&state_key, kv.value())?, kv.mod_revision())),
            None => Ok((ResourceState::default(), 0)),
        }
    }
}

#[async_trait]
impl FencedResource for EtcdFencedResource {
    /// Reads the state, applies `op` to it, and writes it back in one transaction comparing the
    /// state key's mod revision; retried (64 times at most) when another writer got in between.
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        let op = op.into_write_op();
        let state_key = self.state_key(key);
        for _ in 0..MAX_ATTEMPTS {
            let (mut state, mod_rev) = self.load(key).await?;
            let out = state.apply(token, op.as_ref());
            if let WriteOutcome::Rejected { high_water, .. } = out
                && !leasehold_core::mutation::on("etcd.fence.accept_stale")
            {
                tracing::debug!(backend = BACKEND, key = %key, token = %token, high_water = %high_water, "stale token rejected");
                return Ok(out);
            }
            if self
                .store
                .txn(fence_txn(&state_key, mod_rev, &state))
                .await?
                .succeeded()
            {
                return Ok(WriteOutcome::Accepted { high_water: token });
            }
        }
        // Every attempt's transaction failed its comparison: nothing was written.
        Err(leasehold_core::Error::refused(
            BACKEND,
            format!("fenced write on {key} lost {MAX_ATTEMPTS} races"),
            None,
        ))
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        Ok(self.load(key).await?.0)
    }
}
