//! Batched acquisition ([`LeaseStore::acquire_many`]) on etcd: each key still gets the lock
//! protocol's free-lock comparison and either an etcd lease of its own or, for a key the store
//! shares ([`LeaseSharing::shares_etcd_lease`](crate::LeaseSharing::shares_etcd_lease)), the
//! store's shared etcd lease for its TTL, but up to [`MAX_TXN_KEYS`](protocol::MAX_TXN_KEYS) keys
//! are created by one transaction.

use leasehold_core::backend::granted_lease;
use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseStore, Result};
use tokio::time::Instant;

use crate::error::{BACKEND, protocol as protocol_error};
use crate::handle::{Handle, check_owner, our_owner, secs};
use crate::protocol;
use crate::shared::{PendingPut, PutKind};
use crate::store::{BATCH_CONCURRENCY, EtcdLeaseStore, MAX_ATTEMPTS};

/// A request of the batch on its way: its index, TTL in seconds, and the etcd lease granted for
/// it (with the instant the grant was sent), or, with a nonce, the store's shared etcd lease for
/// its TTL (with the instant from which it is kept alive).
#[derive(Clone, Copy)]
struct Entry {
    i: usize,
    ttl_secs: i64,
    lease_id: i64,
    sent: Instant,
    /// On a shared etcd lease: the nonce that names its lock key.
    nonce: Option<u64>,
}

impl Entry {
    /// The handle naming the entry's lock key: the first slot of an etcd lease of its own, or
    /// a name of its own on a shared one.
    fn handle(&self) -> Handle {
        match self.nonce {
            Some(nonce) => Handle {
                nonce: Some(nonce),
                ..Handle::per_grant(self.lease_id, self.ttl_secs)
            },
            None => Handle::in_slot(self.lease_id, self.ttl_secs, 0),
        }
    }
}

impl EtcdLeaseStore {
    /// See [`LeaseStore::acquire_many`] on [`EtcdLeaseStore`].
    pub(crate) async fn acquire_batch(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<Vec<Result<AcquireOutcome>>> {
        let mut out: Vec<Option<Result<AcquireOutcome>>> = (0..reqs.len()).map(|_| None).collect();
        let mut valid = Vec::with_capacity(reqs.len());
        for (i, req) in reqs.iter().enumerate() {
            match self
                .grantable_ttl(req.ttl)
                .and_then(|t| check_owner(&req.owner).map(|()| t))
            {
                Ok(t) => valid.push((i, t.as_i64())),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        // Keys decided one by one by `acquire`: keys the batch found held by their own owner (a
        // same-owner re-acquire replaces the key) or that changed hands too often.
        let mut single: Vec<usize> = Vec::new();
        // Keys this store puts on a shared etcd lease: that lease (one per TTL), not a grant each.
        let mut on_shared = Vec::new();
        valid.retain(|&(i, ttl_secs)| {
            let shared = self.shared_for(&reqs[i].key).is_some();
            if shared {
                on_shared.push((i, ttl_secs));
            }
            !shared
        });
        let mut pending = self.shared_entries(reqs, &on_shared).await?;
        pending.extend(self.grant_all(reqs, &valid, &mut out).await?);
        for _ in 0..MAX_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let mut again = Vec::new();
            let mut rest = pending.as_slice();
            while !rest.is_empty() {
                let (chunk, tail) = rest.split_at(rest.len().min(protocol::MAX_TXN_KEYS));
                rest = tail;
                if let Err(e) = self
                    .create_chunk(reqs, chunk, &mut out, &mut again, &mut single)
                    .await
                {
                    // The outcome of this chunk is unknown: revoking its etcd leases (and those
                    // of the chunks not sent) removes whatever it may have created. Keys on a
                    // shared etcd lease are the sweeper's: it finds out whether their puts
                    // happened and deletes them if so.
                    for entry in chunk.iter().chain(rest).chain(&again) {
                        self.give_back_entry(entry).await;
                    }
                    return Err(e);
                }
            }
            pending = again;
        }
        for entry in pending {
            self.give_back_entry(&entry).await;
            single.push(entry.i);
        }
        for batch in single.chunks(BATCH_CONCURRENCY) {
            let mut calls = Vec::with_capacity(batch.len());
            for &i in batch {
                calls.push(self.acquire(&reqs[i]));
            }
            for (&i, r) in batch.iter().zip(futures::future::join_all(calls).await) {
                match r {
                    Err(e) if !e.is_invalid_input() => return Err(e),
                    r => out[i] = Some(r),
                }
            }
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| protocol_error("acquire_many left a request undecided")))
            .collect()
    }

    /// The entries of `valid` (requests this store puts on a shared etcd lease): the shared etcd
    /// lease for each distinct TTL (kept alive or granted once) and a fresh nonce per key.
    async fn shared_entries(
        &self,
        reqs: &[AcquireRequest],
        valid: &[(usize, i64)],
    ) -> Result<Vec<Entry>> {
        let mut leases: std::collections::HashMap<i64, (i64, Instant)> = Default::default();
        let mut entries = Vec::with_capacity(valid.len());
        for &(i, ttl_secs) in valid {
            let Some(shared) = self.shared_for(&reqs[i].key) else {
                continue;
            };
            let (lease_id, sent) = match leases.get(&ttl_secs) {
                Some(l) => *l,
                None => {
                    let l = shared.lease_or_grant(self, &reqs[i], ttl_secs).await?;
                    leases.insert(ttl_secs, l);
                    l
                }
            };
            entries.push(Entry {
                i,
                ttl_secs,
                lease_id,
                sent,
                nonce: Some(shared.next_nonce()),
            });
        }
        Ok(entries)
    }

    /// Gives back what an entry that was not granted holds: its etcd lease if it is one of its
    /// own; nothing on a shared etcd lease (which carries other keys).
    async fn give_back_entry(&self, entry: &Entry) {
        if entry.nonce.is_none() {
            self.revoke_quietly(entry.lease_id).await;
        }
    }

    /// An etcd lease of its own for each of `valid` (at most 64 grants in flight). A grant
    /// refused as invalid input (etcd raised the TTL) is that request's outcome; any other
    /// failure revokes the grants made and is the batch's error.
    async fn grant_all(
        &self,
        reqs: &[AcquireRequest],
        valid: &[(usize, i64)],
        out: &mut [Option<Result<AcquireOutcome>>],
    ) -> Result<Vec<Entry>> {
        let mut granted = Vec::with_capacity(valid.len());
        let mut failed = None;
        for batch in valid.chunks(BATCH_CONCURRENCY) {
            let mut grants = Vec::with_capacity(batch.len());
            for &(i, ttl_secs) in batch {
                grants.push(self.grant_exactly(&reqs[i], ttl_secs));
            }
            for (&(i, ttl_secs), r) in batch.iter().zip(futures::future::join_all(grants).await) {
                match r {
                    Ok((lease_id, sent)) => granted.push(Entry {
                        i,
                        ttl_secs,
                        lease_id,
                        sent,
                        nonce: None,
                    }),
                    Err(e) if e.is_invalid_input() => out[i] = Some(Err(e)),
                    Err(e) => failed = Some(e),
                }
            }
            if failed.is_some() {
                break;
            }
        }
        if let Some(e) = failed {
            for entry in &granted {
                self.revoke_quietly(entry.lease_id).await;
            }
            return Err(e);
        }
        Ok(granted)
    }

    /// One transaction creating the lock keys of `chunk` if all their locks are free. Otherwise,
    /// from the holders it read: a key held by another owner is refused (its etcd lease given
    /// back), a key held by its own owner alone goes to `single`, a free key to `again`.
    async fn create_chunk(
        &self,
        reqs: &[AcquireRequest],
        chunk: &[Entry],
        out: &mut [Option<Result<AcquireOutcome>>],
        again: &mut Vec<Entry>,
        single: &mut Vec<usize>,
    ) -> Result<()> {
        let prefix = self.options.prefix();
        let names: Vec<(String, String)> = chunk
            .iter()
            .map(|e| {
                let key = &reqs[e.i].key;
                (
                    protocol::mutex_prefix(prefix, key),
                    e.handle().lock_key(prefix, key),
                )
            })
            .collect();
        // Keys on a shared etcd lease are recorded before the put is sent: if its outcome never
        // becomes known (an error, or this future dropped), the sweeper deletes the key.
        let mut puts: Vec<Option<PendingPut>> = chunk
            .iter()
            .zip(&names)
            .map(|(e, (_, lock_key))| {
                let shared = e.nonce.and(self.shared_for(&reqs[e.i].key))?;
                let ttl = secs(e.ttl_secs);
                Some(shared.pending(lock_key.as_bytes(), e.lease_id, ttl, PutKind::Acquire))
            })
            .collect();
        let entries: Vec<(&str, &str, &leasehold_core::OwnerId, i64)> = chunk
            .iter()
            .zip(&names)
            .map(|(e, (p, k))| (p.as_str(), k.as_str(), &reqs[e.i].owner, e.lease_id))
            .collect();
        let resp = self.txn(protocol::acquire_many_txn(&entries)).await?;
        if resp.succeeded() {
            let revision = resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| protocol_error("txn without header"))?;
            for ((e, (_, lock_key)), put) in chunk.iter().zip(&names).zip(&mut puts) {
                let req = &reqs[e.i];
                let token =
                    leasehold_core::backend::decode_token(BACKEND, req.key.as_str(), revision)?;
                if let Some(put) = put.take() {
                    put.confirm(revision, e.sent + secs(e.ttl_secs));
                }
                let mut handle = e.handle();
                if e.nonce.is_none() {
                    // The etcd lease was granted for this key and carries it alone.
                    let tag = self.tag(lock_key, &req.owner, token, e.lease_id, e.ttl_secs);
                    handle = handle.tagged(tag);
                }
                tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, lease_id = e.lease_id, "lease acquired (batch)");
                let lease = granted_lease(
                    req.key.clone(),
                    req.owner.clone(),
                    token,
                    secs(e.ttl_secs),
                    req.drift_margin(),
                    e.sent,
                )
                .with_handle(handle.to_string());
                out[e.i] = Some(Ok(AcquireOutcome::Acquired(lease)));
            }
            return Ok(());
        }
        // Nothing was created.
        for put in puts.into_iter().flatten() {
            put.cancel();
        }
        let reads: Vec<_> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                etcd_client::TxnOpResponse::Get(mut g) => {
                    let count = g.count();
                    Some((g.take_kvs().into_iter().next(), count))
                }
                _ => None,
            })
            .collect();
        if reads.len() != chunk.len() {
            return Err(protocol_error(
                "a batched acquire txn failed without every holder read",
            ));
        }
        let mut held = Vec::new();
        for (e, (current, count)) in chunk.iter().zip(reads) {
            let req = &reqs[e.i];
            match current {
                None => again.push(*e),
                Some(kv) if count == 1 && our_owner(&kv).as_ref() == Some(&req.owner) => {
                    self.give_back_entry(e).await;
                    single.push(e.i);
                }
                Some(kv) => held.push((*e, kv)),
            }
        }
        let mut reports = Vec::with_capacity(held.len());
        for (_, kv) in &held {
            reports.push(self.holder_of(kv));
        }
        let reports = futures::future::join_all(reports).await;
        for ((e, _), holder) in held.iter().zip(reports) {
            self.give_back_entry(e).await;
            out[e.i] = Some(holder.map(AcquireOutcome::Held));
        }
        Ok(())
    }
}
