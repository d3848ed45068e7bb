//! Reading many keys: [`EtcdLeaseStore`]'s `inspect_many` and `holders_many`, range reads over
//! the span of the keys' lock prefixes at one revision.

use std::collections::{HashMap, HashSet};

use etcd_client::KeyValue;
use futures::{StreamExt, TryStreamExt};
use leasehold_core::{Error, HeldBy, Holder, KeyState, LeaseKey, MAX_TTL, Result};

use crate::error::{is_compacted, protocol};
use crate::handle::{owner_of, secs, token_of};
use crate::protocol;

use crate::store::{BATCH_CONCURRENCY, EtcdLeaseStore};

impl EtcdLeaseStore {
    /// [`LeaseStore::inspect_many`](leasehold_core::LeaseStore::inspect_many) (see its docs on [`EtcdLeaseStore`]).
    pub(crate) async fn inspect_batch(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        let mut prefixes: Vec<String> = keys.iter().map(|k| self.mutex_prefix(k)).collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        let holders = self.holders_of(&prefixes).await?;
        let leases: HashSet<i64> = holders
            .values()
            .map(KeyValue::lease)
            .filter(|l| *l != 0)
            .collect();
        let ttls: HashMap<i64, (i64, i64)> = futures::stream::iter(leases)
            .map(|id| async move {
                let r = self.time_to_live(id).await?;
                Ok::<_, Error>((id, (r.ttl(), r.granted_ttl())))
            })
            .buffer_unordered(BATCH_CONCURRENCY)
            .try_collect()
            .await?;
        keys.iter()
            .map(|key| {
                let holder = match holders.get(&self.mutex_prefix(key)) {
                    Some(kv) if kv.lease() == 0 => Some(holder_with(kv, None)?),
                    Some(kv) => {
                        let ttl = ttls
                            .get(&kv.lease())
                            .ok_or_else(|| protocol("a holder's etcd lease was not asked"))?;
                        Some(holder_with(kv, Some(*ttl))?)
                    }
                    None => None,
                };
                Ok(KeyState {
                    key: key.clone(),
                    last_token: holder.as_ref().map(|h| h.token),
                    holder,
                })
            })
            .collect()
    }

    /// [`LeaseStore::holders_many`](leasehold_core::LeaseStore::holders_many) (see its docs on [`EtcdLeaseStore`]).
    pub(crate) async fn holders_batch(&self, keys: &[LeaseKey]) -> Result<Vec<Option<HeldBy>>> {
        let mut prefixes: Vec<String> = keys.iter().map(|k| self.mutex_prefix(k)).collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        let holders = self.holders_of(&prefixes).await?;
        keys.iter()
            .map(|key| match holders.get(&self.mutex_prefix(key)) {
                Some(kv) => Ok(Some(HeldBy {
                    owner: owner_of(kv),
                    token: token_of(kv)?,
                })),
                None => Ok(None),
            })
            .collect()
    }

    /// The holders of `keys`' locks, read with range requests over the span of their lock
    /// prefixes ([`RANGE_PAGE`](protocol::RANGE_PAGE) keys a page, each page jumping to the next
    /// prefix still wanted), all pages at the revision of the first: lock prefix -> the key with
    /// the lowest create revision under it.
    async fn holders_of(&self, prefixes: &[String]) -> Result<HashMap<String, KeyValue>> {
        for attempt in 0.. {
            match self.holders_at_one_revision(prefixes).await {
                Err(Retry::Compacted) if attempt < 3 => continue,
                Err(Retry::Compacted) => {
                    return Err(protocol(
                        "etcd compacted every revision a batched inspect started from",
                    ));
                }
                Err(Retry::Failed(e)) => return Err(e),
                Ok(holders) => return Ok(holders),
            }
        }
        unreachable!("the loop returns")
    }

    async fn holders_at_one_revision(
        &self,
        prefixes: &[String],
    ) -> std::result::Result<HashMap<String, KeyValue>, Retry> {
        // `prefixes` is sorted and free of duplicates; no lock prefix is a prefix of another
        // (keys contain no `/`), so their ranges are disjoint and in the same order.
        let mut holders: HashMap<String, KeyValue> = HashMap::with_capacity(prefixes.len());
        let (Some(first), Some(last)) = (prefixes.first(), prefixes.last()) else {
            return Ok(holders);
        };
        let end = protocol::prefix_end(last);
        let mut start = first.as_bytes().to_vec();
        let mut revision = 0;
        loop {
            let opts = protocol::inspect_page_query(end.clone(), revision);
            let (start_key, o) = (start.clone(), opts);
            let resp = self
                .call("get", || {
                    let (mut kv, key, opts) =
                        (self.client.kv_client(), start_key.clone(), o.clone());
                    async move {
                        match kv.get(key, Some(opts)).await {
                            Err(e) if is_compacted(&e) => Ok(None),
                            r => r.map(Some),
                        }
                    }
                })
                .await
                .map_err(Retry::Failed)?;
            let Some(mut resp) = resp else {
                return Err(Retry::Compacted);
            };
            if revision == 0 {
                revision = resp
                    .header()
                    .map(|h| h.revision())
                    .ok_or_else(|| Retry::Failed(protocol("range without header")))?;
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            let Some(seen) = kvs.last().map(|kv| kv.key().to_vec()) else {
                break;
            };
            for kv in kvs {
                // The wanted prefix this key falls under, if any: the last prefix <= the key.
                let i = prefixes.partition_point(|p| p.as_bytes() <= kv.key());
                let Some(prefix) = i.checked_sub(1).map(|i| &prefixes[i]) else {
                    continue;
                };
                if !kv.key().starts_with(prefix.as_bytes()) {
                    continue;
                }
                match holders.get(prefix) {
                    Some(h) if h.create_revision() <= kv.create_revision() => {}
                    _ => {
                        holders.insert(prefix.clone(), kv);
                    }
                }
            }
            if !more {
                break;
            }
            // Go on right after the last key returned if it lies under a wanted prefix (the
            // rest of that prefix), else at the next wanted prefix after it.
            let i = prefixes.partition_point(|p| p.as_bytes() <= seen.as_slice());
            let inside = i
                .checked_sub(1)
                .is_some_and(|i| seen.starts_with(prefixes[i].as_bytes()));
            start = if inside {
                let mut next = seen;
                next.push(0);
                next
            } else {
                match prefixes.get(i) {
                    Some(p) => p.as_bytes().to_vec(),
                    None => break,
                }
            };
        }
        Ok(holders)
    }
}

/// Why a batched inspect's read starts over.
enum Retry {
    /// etcd compacted the revision the read started from.
    Compacted,
    Failed(Error),
}

/// The holder as reported to callers, from its lock key and (for a key with an etcd lease) that
/// etcd lease's remaining and granted TTL in seconds as etcd reported them (-1: not found).
pub(crate) fn holder_with(kv: &KeyValue, ttl: Option<(i64, i64)>) -> Result<Holder> {
    let token = token_of(kv)?;
    let owner = owner_of(kv);
    let (remaining, ttl) = match ttl {
        // A lock key without a lease (written by hand) never expires.
        None => (MAX_TTL, MAX_TTL),
        Some((left, granted)) => {
            let remaining = secs(left.max(0));
            (remaining, secs(granted.max(0)).max(remaining))
        }
    };
    Ok(Holder {
        owner,
        token,
        remaining,
        ttl,
    })
}
