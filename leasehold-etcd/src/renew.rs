//! Renewal: one keepalive per etcd lease, then the lock keys read back, in as few range requests
//! as the batch allows.
//!
//! A keepalive only proves that an etcd lease lives: the lock key may have been deleted (by hand,
//! by our sweeper) or replaced (a new incarnation of the same name). So every renewal reads its
//! key **after** its keepalive and reports [`RenewOutcome::Lost`] unless the key is there with the
//! lease's token (create revision), owner (value) and etcd lease. A batch does the same for all
//! its leases at once: the keepalives of its distinct etcd leases first, then one range over the
//! span `[smallest lock key, largest lock key]` of the batch, in pages of [`RANGE_PAGE`](protocol::RANGE_PAGE) keys,
//! each page starting at the next lock key still wanted (so keys of other holders between two of
//! ours cost bandwidth, never a request per key).

use std::collections::{HashMap, HashSet};

use std::sync::Arc;
use std::time::Duration;

use etcd_client::KeyValue;
use futures::{StreamExt, TryStreamExt};
use leasehold_core::{AcquireRequest, Error, Lease, RenewOutcome, Result};
use tokio::time::Instant;

use crate::error::BACKEND;
use crate::handle::{Handle, check_owner, our_owner, parse_handle, secs};
use crate::protocol::{self, named_lease_of, nonce_of};
use crate::shared::{PutKind, Shared};
use crate::store::{BATCH_CONCURRENCY, EtcdLeaseStore};

/// A lease whose key was created on a shared etcd lease, given to a store without sharing.
fn shared_key_without_sharing() -> Error {
    Error::InvalidInput(
        "this lease's lock key lives on a shared etcd lease (LeaseSharing::PerTtl, or a reserved \
         key with the default LeaseSharing::ReservedPerTtl): renew it through a store that \
         shares etcd leases (either mode), whose sweeper may otherwise delete it"
            .to_string(),
    )
}

/// A lease whose key must move onto this store's shared etcd lease before it can be renewed.
struct Move<'a> {
    slot: usize,
    lease: &'a Lease,
    lock_key: String,
    ttl_secs: i64,
    nonce: Option<u64>,
    named: i64,
}

/// One lease of a batch that names its etcd lease in its handle, and its lock key.
struct Handled<'a> {
    slot: usize,
    lease: &'a Lease,
    handle: Handle,
    lock_key: String,
}

impl EtcdLeaseStore {
    /// [`LeaseStore::renew_many`](leasehold_core::LeaseStore::renew_many): leases with a handle in
    /// one batch (keepalives per distinct etcd lease, then a paginated range read); leases
    /// without one (resumed) one by one, as [`renew`](leasehold_core::LeaseStore::renew) does.
    pub(crate) async fn renew_batch(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        let mut out: Vec<Option<Result<RenewOutcome>>> = leases.iter().map(|_| None).collect();
        let mut handled = Vec::new();
        let mut resumed = Vec::new();
        let mut moves = Vec::new();
        for (slot, lease) in leases.iter().enumerate() {
            if let Err(e) = self
                .grantable_ttl(lease.ttl())
                .and(check_owner(lease.owner()))
            {
                out[slot] = Some(Err(e));
                continue;
            }
            let Some(handle) = parse_handle(lease.handle()) else {
                resumed.push(slot);
                continue;
            };
            let lock_key = handle.lock_key(self.options.prefix(), lease.key());
            match (&self.shared, handle.nonce) {
                (None, Some(_)) => out[slot] = Some(Err(shared_key_without_sharing())),
                // On another store's shared etcd lease: that store's sweeper would delete it on
                // its own schedule, so it moves here first.
                (Some(shared), Some(_)) if !shared.owns(handle.lease_id) => moves.push(Move {
                    slot,
                    lease,
                    lock_key,
                    ttl_secs: handle.ttl_secs,
                    nonce: handle.nonce,
                    named: handle.named,
                }),
                _ => handled.push(Handled {
                    slot,
                    lease,
                    lock_key,
                    handle,
                }),
            }
        }
        let (done, moved_away) = self.renew_handled(handled).await?;
        for (slot, outcome) in done {
            out[slot] = Some(Ok(outcome));
        }
        moves.extend(moved_away);
        if let Some(shared) = &self.shared {
            for chunk in moves.chunks(BATCH_CONCURRENCY) {
                let renewals = chunk.iter().map(|m| self.move_here(shared, m));
                for (m, r) in chunk.iter().zip(futures::future::join_all(renewals).await) {
                    out[m.slot] = Some(Ok(r?));
                }
            }
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

    /// Keeps the batch's etcd leases alive, then reads its lock keys back and judges each lease.
    /// Returns one outcome per entry, with its slot, and the leases whose keys another store
    /// moved onto its own shared etcd lease (they move back here).
    async fn renew_handled<'a>(
        &self,
        batch: Vec<Handled<'a>>,
    ) -> Result<(Vec<(usize, RenewOutcome)>, Vec<Move<'a>>)> {
        let mut moved = Vec::new();
        if batch.is_empty() {
            return Ok((Vec::new(), moved));
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
                && shared.owns(h.handle.lease_id)
                && !shared.extend(
                    h.lock_key.as_bytes(),
                    h.handle.lease_id,
                    h.lease.token().to_i64(),
                    secs(h.handle.ttl_secs),
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
            let ours = found.get(h.lock_key.as_bytes()).filter(|kv| {
                // Mutation switch point (false unless a mutant is active).
                leasehold_core::mutation::on("etcd.renew.no_read_back_check")
                    || (kv.create_revision() == h.lease.token().to_i64()
                        && kv.lease() != 0
                        && our_owner(kv).as_ref() == Some(h.lease.owner()))
            });
            if let Some(kv) = ours
                && kv.lease() != h.handle.lease_id
                && self.shared.is_some()
                && h.handle.nonce.is_some()
            {
                // Another store moved the key onto its etcd lease (a renewal through it).
                moved.push(Move {
                    slot: h.slot,
                    lease: h.lease,
                    lock_key: h.lock_key,
                    ttl_secs: h.handle.ttl_secs,
                    nonce: h.handle.nonce,
                    named: h.handle.named,
                });
                continue;
            }
            if ours.is_none_or(|kv| kv.lease() != h.handle.lease_id) {
                if let Some(shared) = self.shared.as_ref() {
                    shared.forget(h.lock_key.as_bytes());
                }
                out.push((h.slot, self.lost(h.lease)));
                continue;
            }
            tracing::trace!(backend = BACKEND, key = %h.lease.key(), owner = %h.lease.owner(), token = %h.lease.token(), "lease renewed");
            let mut handle = Handle {
                tag: None,
                ..h.handle
            };
            if protocol::alone_on_its_lease(h.lock_key.as_bytes(), h.handle.lease_id) {
                // Read back after the keepalive: our key, alone on an etcd lease of its own.
                let (owner, token) = (h.lease.owner(), h.lease.token());
                let ttl_secs = h.handle.ttl_secs;
                let tag = self.tag(&h.lock_key, owner, token, h.handle.lease_id, ttl_secs);
                handle = handle.tagged(tag);
            }
            let renewed = h
                .lease
                .renewed(secs(h.handle.ttl_secs), sent)
                .with_handle(handle.to_string());
            out.push((h.slot, RenewOutcome::Renewed(renewed)));
        }
        Ok((out, moved))
    }

    /// Renews a lease whose key is on an etcd lease this store did not grant by moving the key
    /// onto this store's shared etcd lease: one transaction that re-puts it (same name, value and
    /// create revision, so the same token) if it still has the lease's token and owner. The
    /// store that granted the old etcd lease then no longer sweeps it (its deletions compare the
    /// etcd lease). The put is recorded before it is sent, like an acquire's; a keepalive sent
    /// after it answered makes the etcd lease, and this store's sweeper, keep the key past every
    /// deadline any store reported for it before the move.
    async fn move_here(&self, shared: &Arc<Shared>, m: &Move<'_>) -> Result<RenewOutcome> {
        let lease = m.lease;
        let ttl = secs(m.ttl_secs);
        let req = AcquireRequest::new(lease.key().clone(), lease.owner().clone(), ttl);
        let (id, _) = shared.lease_or_grant(self, &req, m.ttl_secs).await?;
        let pending = shared.pending(m.lock_key.as_bytes(), id, ttl, PutKind::Move);
        let txn = protocol::move_txn(&m.lock_key, lease.token(), lease.owner(), id);
        if !self.txn(txn).await?.succeeded() {
            pending.cancel();
            return Ok(self.lost(lease));
        }
        let Some(sent) = shared.refresh_within(self, id, Duration::ZERO).await? else {
            // etcd no longer knows the etcd lease: the key is gone with it.
            pending.cancel();
            return Ok(self.lost(lease));
        };
        pending.confirm(lease.token().to_i64(), sent + ttl);
        tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), lease_id = id, "lock key moved onto this store's shared etcd lease");
        let handle = Handle {
            nonce: m.nonce,
            named: m.named,
            ..Handle::per_grant(id, m.ttl_secs)
        };
        Ok(RenewOutcome::Renewed(
            lease.renewed(ttl, sent).with_handle(handle.to_string()),
        ))
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
                let sent = match self.shared.as_ref().filter(|s| s.owns(id)) {
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
    /// over the span of the keys, [`RANGE_PAGE`](protocol::RANGE_PAGE) keys a page. One key is one plain get.
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
            let opts = protocol::page_query(&end);
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

    /// [`LeaseStore::renew`](leasehold_core::LeaseStore::renew) of a lease without a handle (resumed):
    /// its key is checked first, so that a stale or foreign lease never extends somebody else's
    /// etcd lease; then its etcd lease is kept alive and the key checked again.
    pub(crate) async fn renew_resumed(&self, lease: &Lease) -> Result<RenewOutcome> {
        check_owner(lease.owner())?;
        let Some(kv) = self.held_kv(lease).await? else {
            return Ok(self.lost(lease));
        };
        let lease_id = kv.lease();
        let nonce = nonce_of(kv.key());
        let named = named_lease_of(kv.key()).unwrap_or(lease_id);
        match (&self.shared, nonce) {
            (None, Some(_)) => return Err(shared_key_without_sharing()),
            (Some(shared), Some(_)) if !shared.owns(lease_id) => {
                let m = Move {
                    slot: 0,
                    lease,
                    lock_key: String::from_utf8_lossy(kv.key()).into_owned(),
                    ttl_secs: leasehold_core::backend::ttl_secs(lease.ttl())?.as_i64(),
                    nonce,
                    named,
                };
                return self.move_here(shared, &m).await;
            }
            _ => {}
        }
        let granted = self.time_to_live(lease_id).await?.granted_ttl();
        let sent = match self.shared.as_ref().filter(|s| s.owns(lease_id)) {
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
        if let Some(shared) = &self.shared
            && shared.owns(lease_id)
            && !shared.extend(
                kv.key(),
                lease_id,
                kv.create_revision(),
                secs(granted),
                sent + secs(granted),
            )
        {
            return Ok(self.lost(lease));
        }
        tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
        let renewed = lease.renewed(secs(granted), sent);
        let mut handle = Handle::of_key(kv.key(), lease_id, granted);
        // The handle must name this very key (with its nonce if a store sharing etcd leases
        // created it); a key this crate would not name so keeps the lease without a handle.
        if handle
            .lock_key(self.options.prefix(), lease.key())
            .as_bytes()
            != kv.key()
        {
            return Ok(RenewOutcome::Renewed(renewed));
        }
        if protocol::alone_on_its_lease(kv.key(), lease_id) {
            // Read back after the keepalive: our key, alone on an etcd lease of its own.
            let lock_key = String::from_utf8_lossy(kv.key());
            let tag = self.tag(&lock_key, lease.owner(), lease.token(), lease_id, granted);
            handle = handle.tagged(tag);
        }
        Ok(RenewOutcome::Renewed(
            renewed.with_handle(handle.to_string()),
        ))
    }

    fn lost(&self, lease: &Lease) -> RenewOutcome {
        tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "renewal refused: lease lost");
        RenewOutcome::Lost
    }
}
