//! Renewal: one keepalive per etcd lease, then the lock keys read back, in as few range requests
//! as the batch allows.
//!
//! A keepalive only proves that an etcd lease lives: the lock key may have been deleted (by hand,
//! by our sweeper) or replaced (a new incarnation of the same name). So every renewal reads its
//! key **after** its keepalive and reports [`RenewOutcome::Lost`] unless the key is there with the
//! lease's token (create revision), owner (value) and etcd lease. A batch does the same for all
//! its leases at once: the keepalives of its distinct etcd leases first, then one range over the
//! span `[smallest lock key, largest lock key]` of the batch, in pages of [`RANGE_PAGE`] keys,
//! each page starting at the next lock key still wanted (so keys of other holders between two of
//! ours cost bandwidth, never a request per key).

use std::collections::{HashMap, HashSet};

use etcd_client::{GetOptions, KeyValue};
use futures::{StreamExt, TryStreamExt};
use lease_core::{Lease, RenewOutcome, Result, validate_ttl};
use tokio::time::Instant;

use crate::BACKEND;
use crate::keys::{Handle, nonce_of, owner_of, parse_handle, secs};
use crate::store::{BATCH_CONCURRENCY, EtcdLeaseStore};

/// How many keys one range request of a batched renewal returns at most: the supervisor's
/// largest batch. A lock key is at most about 230 bytes of name, 140 of value (ours: the owner
/// id; `etcdctl lock`'s: empty) and 40 of revisions and lease, so a page stays near 2 MB, below
/// gRPC's 4 MiB response limit; 10,000 leases are read back in two requests.
pub(crate) const RANGE_PAGE: i64 = 5_000;

/// One lease of a batch that names its etcd lease in its handle, and its lock key.
struct Handled<'a> {
    slot: usize,
    lease: &'a Lease,
    handle: Handle,
    lock_key: String,
}

impl EtcdLeaseStore {
    /// [`LeaseStore::renew_many`](lease_core::LeaseStore::renew_many): leases with a handle in
    /// one batch (keepalives per distinct etcd lease, then a paginated range read); leases
    /// without one (resumed) one by one, as [`renew`](lease_core::LeaseStore::renew) does.
    pub(crate) async fn renew_batch(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        let mut out: Vec<Option<Result<RenewOutcome>>> = leases.iter().map(|_| None).collect();
        let mut handled = Vec::new();
        let mut resumed = Vec::new();
        for (slot, lease) in leases.iter().enumerate() {
            if let Err(e) = validate_ttl(lease.ttl(), self.min_ttl) {
                out[slot] = Some(Err(e));
                continue;
            }
            match parse_handle(lease.handle()) {
                Some(handle) => handled.push(Handled {
                    slot,
                    lease,
                    lock_key: self.lock_key(lease.key(), handle.lease_id, handle.nonce),
                    handle,
                }),
                None => resumed.push(slot),
            }
        }
        for (slot, outcome) in self.renew_handled(handled).await? {
            out[slot] = Some(Ok(outcome));
        }
        for chunk in resumed.chunks(BATCH_CONCURRENCY) {
            let renewals = chunk.iter().map(|&slot| self.renew_resumed(&leases[slot]));
            for (&slot, r) in chunk.iter().zip(futures::future::join_all(renewals).await) {
                match r {
                    Err(e) if !e.is_invalid_input() => return Err(e),
                    r => out[slot] = Some(r),
                }
            }
        }
        Ok(out
            .into_iter()
            .map(|r| r.unwrap_or(Ok(RenewOutcome::Lost)))
            .collect())
    }

    /// [`LeaseStore::renew`](lease_core::LeaseStore::renew) of a lease with a handle: the batch
    /// path with one lease (one keepalive, one read of its lock key).
    pub(crate) async fn renew_one(&self, lease: &Lease, handle: Handle) -> Result<RenewOutcome> {
        let one = Handled {
            slot: 0,
            lease,
            lock_key: self.lock_key(lease.key(), handle.lease_id, handle.nonce),
            handle,
        };
        let mut outcomes = self.renew_handled(vec![one]).await?;
        outcomes
            .pop()
            .map(|(_, outcome)| outcome)
            .ok_or_else(|| crate::error::protocol("a renewal without an outcome"))
    }

    /// Keeps the batch's etcd leases alive, then reads its lock keys back and judges each lease.
    /// Returns one outcome per entry, with its slot.
    async fn renew_handled(&self, batch: Vec<Handled<'_>>) -> Result<Vec<(usize, RenewOutcome)>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let alive = self.keep_alive_all(&batch).await?;
        let mut out = Vec::with_capacity(batch.len());
        let mut pending = Vec::with_capacity(batch.len());
        for h in batch {
            let sent = alive
                .get(&(h.handle.lease_id, h.handle.ttl_secs))
                .copied()
                .flatten();
            let Some(sent) = sent else {
                // etcd no longer knows the etcd lease: its keys are gone with it.
                out.push((h.slot, self.lost(h.lease)));
                continue;
            };
            if let Some(shared) = self.shared.as_ref()
                && !shared.extend(
                    h.lock_key.as_bytes(),
                    h.lease.token().to_i64(),
                    sent + secs(h.handle.ttl_secs),
                )
            {
                // The sweeper found the key expired before this renewal and is deleting it.
                out.push((h.slot, self.lost(h.lease)));
                continue;
            }
            pending.push((h, sent));
        }
        let found = self
            .read_lock_keys(pending.iter().map(|(h, _)| h.lock_key.as_str()))
            .await?;
        for (h, sent) in pending {
            let held = found.get(h.lock_key.as_bytes()).is_some_and(|kv| {
                kv.create_revision() == h.lease.token().to_i64()
                    && kv.lease() != 0
                    && kv.lease() == h.handle.lease_id
                    && owner_of(kv) == *h.lease.owner()
            });
            if !held {
                if let Some(shared) = self.shared.as_ref() {
                    shared.forget(h.lock_key.as_bytes());
                }
                out.push((h.slot, self.lost(h.lease)));
                continue;
            }
            tracing::trace!(backend = BACKEND, key = %h.lease.key(), owner = %h.lease.owner(), token = %h.lease.token(), "lease renewed");
            let renewed = h
                .lease
                .renewed(secs(h.handle.ttl_secs), sent)
                .with_handle(h.handle.to_string());
            out.push((h.slot, RenewOutcome::Renewed(renewed)));
        }
        Ok(out)
    }

    /// One keepalive per distinct etcd lease of the batch (with a shared etcd lease, one per
    /// reuse window, see [`Shared::refresh`](crate::shared::Shared::refresh)), at most
    /// [`BATCH_CONCURRENCY`] in flight. Maps (etcd lease, TTL) to the instant the keepalive that
    /// covers it was sent, or `None` if etcd no longer knows the lease.
    async fn keep_alive_all(
        &self,
        batch: &[Handled<'_>],
    ) -> Result<HashMap<(i64, i64), Option<Instant>>> {
        let distinct: HashSet<(i64, i64)> = batch
            .iter()
            .map(|h| (h.handle.lease_id, h.handle.ttl_secs))
            .collect();
        futures::stream::iter(distinct)
            .map(|(id, ttl_secs)| async move {
                let sent = match self.shared.as_ref() {
                    Some(shared) => shared.refresh(self, id, ttl_secs).await?,
                    None => {
                        let sent = Instant::now();
                        self.keep_alive_once(id).await?.then_some(sent)
                    }
                };
                Ok(((id, ttl_secs), sent))
            })
            .buffer_unordered(BATCH_CONCURRENCY)
            .try_collect()
            .await
    }

    /// The current versions of `keys` (those that exist), read with linearizable range requests
    /// over the span of the keys, [`RANGE_PAGE`] keys a page. One key is one plain get.
    async fn read_lock_keys<'k>(
        &self,
        keys: impl Iterator<Item = &'k str>,
    ) -> Result<HashMap<Vec<u8>, KeyValue>> {
        let mut wanted: Vec<&str> = keys.collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut found = HashMap::with_capacity(wanted.len());
        let (Some(first), Some(last)) = (wanted.first(), wanted.last()) else {
            return Ok(found);
        };
        if wanted.len() == 1 {
            if let Some(kv) = self.get((*first).to_string(), None).await?.take_kvs().pop() {
                found.insert(kv.key().to_vec(), kv);
            }
            return Ok(found);
        }
        // [first, last] inclusive: the smallest key after `last` is `last` followed by a zero byte.
        let end = format!("{last}\0");
        let mut next = 0;
        while let Some(start) = wanted.get(next) {
            let opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(RANGE_PAGE);
            let mut resp = self.get((*start).to_string(), Some(opts)).await?;
            let more = resp.more();
            let kvs = resp.take_kvs();
            let Some(seen) = kvs.last().map(|kv| kv.key().to_vec()) else {
                break;
            };
            for kv in kvs {
                if wanted
                    .binary_search_by(|k| k.as_bytes().cmp(kv.key()))
                    .is_ok()
                {
                    found.insert(kv.key().to_vec(), kv);
                }
            }
            if !more {
                break;
            }
            // The next page starts at the first wanted key after the last one returned.
            next = wanted.partition_point(|k| k.as_bytes() <= seen.as_slice());
        }
        Ok(found)
    }

    /// [`LeaseStore::renew`](lease_core::LeaseStore::renew) of a lease without a handle (resumed):
    /// its key is checked first, so that a stale or foreign lease never extends somebody else's
    /// etcd lease; then its etcd lease is kept alive and the key checked again.
    pub(crate) async fn renew_resumed(&self, lease: &Lease) -> Result<RenewOutcome> {
        let Some(kv) = self.held_kv(lease).await? else {
            return Ok(self.lost(lease));
        };
        let lease_id = kv.lease();
        let granted = self.time_to_live(lease_id).await?.granted_ttl();
        let sent = match &self.shared {
            Some(shared) => match shared.refresh(self, lease_id, granted).await? {
                Some(sent) => sent,
                None => return Ok(self.lost(lease)),
            },
            None => {
                let sent = Instant::now();
                if !self.keep_alive_once(lease_id).await? {
                    return Ok(self.lost(lease));
                }
                sent
            }
        };
        let Some(kv) = self
            .held_kv(lease)
            .await?
            .filter(|kv| kv.lease() == lease_id)
        else {
            return Ok(self.lost(lease));
        };
        if let Some(shared) = &self.shared {
            shared.extend(kv.key(), kv.create_revision(), sent + secs(granted));
        }
        tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
        let renewed = lease.renewed(secs(granted), sent);
        // The handle must name this very key (with its nonce if a store sharing etcd leases
        // created it); a key this crate would not name so keeps the lease without a handle.
        let nonce = nonce_of(kv.key());
        if self.lock_key(lease.key(), lease_id, nonce).as_bytes() != kv.key() {
            return Ok(RenewOutcome::Renewed(renewed));
        }
        let handle = Handle {
            lease_id,
            ttl_secs: granted,
            nonce,
        };
        Ok(RenewOutcome::Renewed(
            renewed.with_handle(handle.to_string()),
        ))
    }

    fn lost(&self, lease: &Lease) -> RenewOutcome {
        tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "renewal refused: lease lost");
        RenewOutcome::Lost
    }
}
