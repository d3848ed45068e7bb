//! [`RedisFencedResource`]: one script checks the token against the resource's high-water mark
//! and applies the write atomically.

use async_trait::async_trait;
use leasehold_core::backend::decode_token;
use leasehold_core::{
    FenceOp, FencedResource, FencingToken, LeaseKey, ResourceState, Result, WriteOp, WriteOutcome,
};

use crate::error::{BACKEND, unexpected};
use crate::protocol;
use crate::store::RedisLeaseStore;

impl RedisLeaseStore {
    /// The [`FencedResource`] in this store's Redis, on the store's connection (see
    /// [`RedisFencedResource`] for when *not* to use it).
    ///
    /// ```no_run
    /// use leasehold_core::{FencedResource, FencingToken, LeaseKey, WriteOp};
    /// use leasehold_redis::RedisLeaseStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let resource = RedisLeaseStore::connect("redis://10.0.0.9:6379").await?.fenced_resource();
    /// let key = LeaseKey::new("ledger")?;
    /// let outcome = resource.write(&key, FencingToken::new(7)?, WriteOp::Add(1)).await?;
    /// # let _ = outcome; Ok(()) }
    /// ```
    pub fn fenced_resource(&self) -> RedisFencedResource {
        RedisFencedResource {
            store: self.clone(),
        }
    }
}

/// Fenced writes in a Redis, under `<prefix>:{key}:fence` (see
/// [`KeyLayout`](crate::protocol::KeyLayout)). Made by
/// [`RedisLeaseStore::fenced_resource`]; cheap to clone.
///
/// Each write is one script: a token below the high-water mark is rejected, otherwise the mark
/// moves to it and the write is applied, atomically. Every call is bounded by the store's
/// [operation deadline](RedisLeaseStore::op_deadline).
///
/// # Do not pair it with the lock store's own Redis
/// The high-water mark lives in *this* Redis and is replicated asynchronously like everything
/// else in it. If this is the Redis that also holds the leases, it fails over together with the
/// lock store: a failover to a replica that missed the last fenced write loses the mark, and the
/// promoted Redis then **accepts a lower token after a higher one** (split brain is *not* fenced,
/// which is exactly the failure fencing is there to catch). The test
/// `redis::split_brain_lets_the_same_redis_accept_a_lower_token` shows this miss against a real
/// primary and replica. Keep the resource's mark somewhere that does not fail over with the lock
/// store: a different Redis (with its own persistence), or the system the work writes to (the
/// PostgreSQL backend's fenced transactions). Only with one Redis that never fails over (and
/// keeps its data across restarts) is the pairing safe.
#[derive(Debug, Clone)]
pub struct RedisFencedResource {
    store: RedisLeaseStore,
}

impl RedisFencedResource {
    async fn apply_unbounded(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: Option<WriteOp>,
    ) -> Result<WriteOutcome> {
        let (name, operand): (&str, Vec<u8>) = match &op {
            None => ("install", Vec::new()),
            Some(WriteOp::Put(v)) => ("put", v.clone()),
            Some(WriteOp::Add(n)) => ("add", n.to_string().into_bytes()),
            Some(other) => {
                return Err(leasehold_core::Error::InvalidInput(format!(
                    "write op {other:?} is not supported by {BACKEND}"
                )));
            }
        };
        let mut con = self.store.connection();
        let reply: Vec<String> = protocol::FENCE
            .key(self.store.layout().fence(key))
            .arg(token.get())
            .arg(name)
            .arg(operand)
            .invoke_async(&mut con)
            .await
            .map_err(self.store.map("fenced write"))?;
        match reply.as_slice() {
            [tag, hw] if tag == "accepted" || tag == "rejected" => {
                let high_water = decode_token(BACKEND, key.as_str(), hw.as_str())?;
                if tag == "accepted" {
                    Ok(WriteOutcome::Accepted { high_water })
                } else {
                    tracing::debug!(backend = BACKEND, key = %key, token = %token, high_water = %high_water, "stale token rejected");
                    Ok(WriteOutcome::Rejected {
                        presented: token,
                        high_water,
                    })
                }
            }
            _ => Err(unexpected("fence", &reply)),
        }
    }

    async fn read_unbounded(&self, key: &LeaseKey) -> Result<ResourceState> {
        let mut con = self.store.connection();
        let (hw, value, counter, accepted): (
            Option<String>,
            Option<Vec<u8>>,
            Option<i64>,
            Option<u64>,
        ) = redis::cmd("HMGET")
            .arg(self.store.layout().fence(key))
            .arg(&["hw", "value", "counter", "accepted"])
            .query_async(&mut con)
            .await
            .map_err(self.store.map("fenced read"))?;
        let high_water = hw
            .map(|h| decode_token(BACKEND, key.as_str(), h))
            .transpose()?;
        Ok(ResourceState {
            high_water,
            value,
            counter: counter.unwrap_or(0),
            accepted: accepted.unwrap_or(0),
        })
    }
}

#[async_trait]
impl FencedResource for RedisFencedResource {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        let what = match op {
            FenceOp::Write(_) => "fenced write",
            _ => "fenced install",
        };
        self.store
            .bounded(what, self.apply_unbounded(key, token, op.into_write_op()))
            .await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        self.store
            .bounded("fenced read", self.read_unbounded(key))
            .await
    }
}
