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
    async fn fence(
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
/// The resource is usually a *different* Redis (or database) than the lock store: what makes it
/// safe is that it remembers the highest token it accepted, not where it lives.
#[async_trait]
impl FencedResource for RedisLeaseStore {
    async fn write(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: WriteOp,
    ) -> Result<WriteOutcome> {
        self.fence(key, token, Some(op)).await
    }

    async fn install(&self, key: &LeaseKey, token: FencingToken) -> Result<WriteOutcome> {
        self.fence(key, token, None).await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
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
