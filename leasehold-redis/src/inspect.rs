//! Reading keys: [`RedisLeaseStore`]'s `inspect` and `inspect_many` (the `INSPECT` script per
//! hash slot) and the decoding of a holder from a lease record.

use std::fmt;
use std::time::Duration;

use leasehold_core::backend::{decode_owner, decode_token};
use leasehold_core::{Holder, KeyState, LeaseKey, Result};

use crate::error::{BACKEND, unexpected};
use crate::protocol;

use crate::store::{INSPECT_BATCH, RedisLeaseStore};

impl RedisLeaseStore {
    pub(crate) async fn inspect_unbounded(&self, key: &LeaseKey) -> Result<KeyState> {
        let mut states = self.inspect_group(std::slice::from_ref(key)).await?;
        states
            .pop()
            .ok_or_else(|| unexpected("inspect", &"no state"))
    }

    /// One [`INSPECT`](protocol::INSPECT_LUA) script for `keys`, which must share a hash slot on
    /// a cluster: their states in order.
    pub(crate) async fn inspect_group(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        let layout = &self.inner.layout;
        let mut invocation = protocol::INSPECT.prepare_invoke();
        for key in keys {
            invocation
                .key(layout.lease(key))
                .key(layout.generation(key));
        }
        let mut con = self.inner.con.clone();
        let reply: Vec<String> = invocation
            .invoke_async(&mut con)
            .await
            .map_err(self.map("inspect"))?;
        if reply.len() != keys.len() * 3 {
            return Err(unexpected("inspect", &reply));
        }
        keys.iter()
            .zip(reply.chunks_exact(3))
            .map(|(key, fields)| key_state(key, &fields[0], &fields[1], &fields[2]))
            .collect()
    }

    pub(crate) async fn inspect_many_unbounded(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        // One script per hash slot (one group on a single server), cut into scripts of at most
        // INSPECT_BATCH keys so that no script holds the server for long; all sent at once (the
        // multiplexed connections pipeline them).
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut group_of = std::collections::HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = self.inner.con.group(&self.inner.layout.lease(key));
            let g = *group_of.entry(slot).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[g].push(i);
        }
        let batches: Vec<Vec<usize>> = groups
            .iter()
            .flat_map(|g| g.chunks(INSPECT_BATCH).map(<[usize]>::to_vec))
            .collect();
        let replies = futures::future::join_all(batches.iter().map(|batch| {
            let keys: Vec<LeaseKey> = batch.iter().map(|&i| keys[i].clone()).collect();
            async move { self.inspect_group(&keys).await }
        }))
        .await;
        let mut out: Vec<Option<KeyState>> = (0..keys.len()).map(|_| None).collect();
        for (batch, reply) in batches.iter().zip(replies) {
            for (&i, state) in batch.iter().zip(reply?) {
                out[i] = Some(state);
            }
        }
        out.into_iter()
            .map(|s| s.ok_or_else(|| unexpected("inspect_many", &"a key without a state")))
            .collect()
    }
}

pub(crate) fn parse_holder(key: &LeaseKey, record: &[u8], pttl: &[u8]) -> Result<Holder> {
    let name = key.as_str();
    let corrupt = |what: &dyn fmt::Debug| {
        leasehold_core::backend::corrupt(BACKEND, name, format_args!("record {what:?}"))
    };
    let text = std::str::from_utf8(record).map_err(|_| corrupt(&record))?;
    let mut fields = text.split(' ');
    let (Some(token), Some(owner), Some(ttl), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(corrupt(&text));
    };
    let token = decode_token(BACKEND, name, token)?;
    let owner = decode_owner(BACKEND, name, owner)?;
    let ttl: u64 = ttl.parse().map_err(|_| corrupt(&text))?;
    let pttl: i64 = std::str::from_utf8(pttl)
        .ok()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| {
            leasehold_core::backend::corrupt(BACKEND, name, format_args!("pttl {pttl:?}"))
        })?;
    Ok(Holder {
        owner,
        token,
        remaining: Duration::from_millis(u64::try_from(pttl).unwrap_or(0)),
        ttl: Duration::from_millis(ttl),
    })
}

/// The state of `key` from the three strings [`protocol::INSPECT_LUA`] returns for it.
fn key_state(key: &LeaseKey, generation: &str, record: &str, pttl: &str) -> Result<KeyState> {
    let holder = if record.is_empty() {
        None
    } else {
        Some(parse_holder(key, record.as_bytes(), pttl.as_bytes())?)
    };
    let last_token = if generation.is_empty() {
        None
    } else {
        Some(decode_token(BACKEND, key.as_str(), generation)?)
    };
    Ok(KeyState {
        key: key.clone(),
        holder,
        last_token,
    })
}
