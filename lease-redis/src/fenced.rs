//! The Redis-side [`FencedResource`]: one script checks the token against the resource's
//! high-water mark and applies the write atomically.

use async_trait::async_trait;
use lease_core::{
    FencedResource, FencingToken, LeaseKey, ResourceState, Result, WriteOp, WriteOutcome,
};

use crate::BACKEND;
use crate::error::RedisStoreError;
use crate::scripts;
use crate::store::RedisLeaseStore;

fn unexpected(reply: &impl std::fmt::Debug) -> lease_core::Error {
    RedisStoreError::UnexpectedReply {
        script: "fence",
        reply: format!("{reply:?}"),
    }
    .into_backend()
}

impl RedisLeaseStore {
    async fn fence_unbounded(
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
                return Err(lease_core::Error::InvalidInput(format!(
                    "write op {other:?} is not supported by {BACKEND}"
                )));
            }
        };
        let mut con = self.connection();
        let reply: Vec<String> = scripts::FENCE
            .key(self.layout().fence(key))
            .arg(token.get())
            .arg(name)
            .arg(operand)
            .invoke_async(&mut con)
            .await
            .map_err(self.map("fenced write"))?;
        match reply.as_slice() {
            [tag, hw] if tag == "accepted" || tag == "rejected" => {
                let high_water: FencingToken = hw.parse().map_err(|_| unexpected(&reply))?;
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
            _ => Err(unexpected(&reply)),
        }
    }
}

/// Fenced writes in the same Redis, under `<prefix>:{key}:fence` (see [`KeyLayout`](crate::KeyLayout)).
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
#[async_trait]
impl FencedResource for RedisLeaseStore {
    async fn write(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: WriteOp,
    ) -> Result<WriteOutcome> {
        self.bounded("fenced write", self.fence_unbounded(key, token, Some(op)))
            .await
    }

    async fn install(&self, key: &LeaseKey, token: FencingToken) -> Result<WriteOutcome> {
        self.bounded("fenced install", self.fence_unbounded(key, token, None))
            .await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        self.bounded("fenced read", self.read_unbounded(key)).await
    }
}

impl RedisLeaseStore {
    async fn read_unbounded(&self, key: &LeaseKey) -> Result<ResourceState> {
        let mut con = self.connection();
        let (hw, value, counter, accepted): (
            Option<String>,
            Option<Vec<u8>>,
            Option<i64>,
            Option<u64>,
        ) = redis::cmd("HMGET")
            .arg(self.layout().fence(key))
            .arg(&["hw", "value", "counter", "accepted"])
            .query_async(&mut con)
            .await
            .map_err(self.map("fenced read"))?;
        let high_water = hw
            .map(|h| h.parse::<FencingToken>())
            .transpose()
            .map_err(|_| unexpected(&"hw"))?;
        Ok(ResourceState {
            high_water,
            value,
            counter: counter.unwrap_or(0),
            accepted: accepted.unwrap_or(0),
        })
    }
}
