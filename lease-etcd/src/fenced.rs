//! [`EtcdFencedResource`]: a fenced resource whose state lives in etcd.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lease_core::{
    FencedResource, FencingToken, LeaseKey, ResourceState, Result, WriteOp, WriteOutcome,
};

use crate::BACKEND;
use crate::config::EtcdConfig;
use crate::error::protocol;
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
/// use lease_core::{FencedResource, FencingToken, LeaseKey, WriteOp};
/// use lease_etcd::{EtcdConfig, EtcdLeaseStore, EtcdFencedResource};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// let store = EtcdLeaseStore::connect(EtcdConfig::from_list("http://127.0.0.1:2379")).await?;
/// let resource = EtcdFencedResource::from_store(&store);
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

impl EtcdFencedResource {
    /// A resource sharing `store`'s connection, under its configured fence prefix.
    pub fn from_store(store: &EtcdLeaseStore) -> Self {
        EtcdFencedResource {
            store: store.clone(),
            prefix: Arc::from(store.config().fence_prefix()),
        }
    }

    /// Connects on its own (see [`EtcdLeaseStore::connect`]).
    ///
    /// # Errors
    /// As [`EtcdLeaseStore::connect`].
    ///
    /// # Cancellation safety
    /// Cancel safe.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        Ok(Self::from_store(&EtcdLeaseStore::connect(config).await?))
    }

    fn state_key(&self, key: &LeaseKey) -> String {
        format!("{}{}", self.prefix, key)
    }

    /// The state and the state key's mod revision (0 if absent).
    async fn load(&self, key: &LeaseKey) -> Result<(ResourceState, i64)> {
        let mut resp = self.store.get(self.state_key(key), None).await?;
        match resp.take_kvs().into_iter().next() {
            Some(kv) => Ok((decode(kv.value())?, kv.mod_revision())),
            None => Ok((ResourceState::default(), 0)),
        }
    }

    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: Option<WriteOp>,
    ) -> Result<WriteOutcome> {
        let state_key = self.state_key(key);
        for _ in 0..MAX_ATTEMPTS {
            let (mut state, mod_rev) = self.load(key).await?;
            let out = state.apply(token, op.as_ref());
            if let WriteOutcome::Rejected { high_water, .. } = out {
                tracing::debug!(backend = BACKEND, key = %key, token = %token, high_water = %high_water, "stale token rejected");
                return Ok(out);
            }
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(
                    state_key.clone(),
                    CompareOp::Equal,
                    mod_rev,
                )])
                .and_then(vec![TxnOp::put(state_key.clone(), encode(&state), None)]);
            if self.store.txn(txn).await?.succeeded() {
                return Ok(WriteOutcome::Accepted { high_water: token });
            }
        }
        Err(lease_core::Error::unavailable(
            BACKEND,
            format!("fenced write on {key} lost {MAX_ATTEMPTS} races"),
            None,
        ))
    }
}

#[async_trait]
impl FencedResource for EtcdFencedResource {
    async fn write(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: WriteOp,
    ) -> Result<WriteOutcome> {
        self.apply(key, token, Some(op)).await
    }

    async fn install(&self, key: &LeaseKey, token: FencingToken) -> Result<WriteOutcome> {
        self.apply(key, token, None).await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        Ok(self.load(key).await?.0)
    }
}

/// `v1 <high water or 0> <counter> <accepted> <0|1>\n<value bytes>`.
fn encode(state: &ResourceState) -> Vec<u8> {
    let hw = state.high_water.map_or(0, FencingToken::get);
    let mut out = format!(
        "v1 {hw} {} {} {}\n",
        state.counter,
        state.accepted,
        u8::from(state.value.is_some())
    )
    .into_bytes();
    if let Some(v) = &state.value {
        out.extend_from_slice(v);
    }
    out
}

fn decode(bytes: &[u8]) -> Result<ResourceState> {
    let bad = || protocol("malformed fenced resource state");
    let nl = bytes.iter().position(|b| *b == b'\n').ok_or_else(bad)?;
    let (head, rest) = bytes.split_at(nl);
    let head = std::str::from_utf8(head).map_err(|_| bad())?;
    let fields: Vec<&str> = head.split(' ').collect();
    let [version, hw, counter, accepted, has_value] = fields.as_slice() else {
        return Err(bad());
    };
    if *version != "v1" {
        return Err(bad());
    }
    let hw: u64 = hw.parse().map_err(|_| bad())?;
    Ok(ResourceState {
        high_water: if hw == 0 {
            None
        } else {
            Some(FencingToken::new(hw)?)
        },
        counter: counter.parse().map_err(|_| bad())?,
        accepted: accepted.parse().map_err(|_| bad())?,
        value: match *has_value {
            "1" => rest.get(1..).map(<[u8]>::to_vec),
            "0" => None,
            _ => return Err(bad()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips() {
        let state = ResourceState {
            high_water: Some(FencingToken::new(42).unwrap()),
            value: Some(b"a\nb".to_vec()),
            counter: -3,
            accepted: 9,
        };
        assert_eq!(decode(&encode(&state)).unwrap(), state);
        assert_eq!(
            decode(&encode(&ResourceState::default())).unwrap(),
            ResourceState::default()
        );
        assert!(decode(b"v2 1 2 3 0\n").is_err());
    }
}
