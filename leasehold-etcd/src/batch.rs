//! Batched acquisition ([`LeaseStore::acquire_many`]) on etcd: each key still gets an etcd lease
//! of its own and the lock protocol's free-lock comparison, but up to
//! [`MAX_TXN_KEYS`](protocol::MAX_TXN_KEYS) keys are created by one transaction.

use leasehold_core::backend::granted_lease;
use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseStore, Result};
use tokio::time::Instant;

use crate::error::{BACKEND, protocol as protocol_error};
use crate::handle::{Handle, check_owner, our_owner, secs};
use crate::protocol;
use crate::store::{BATCH_CONCURRENCY, EtcdLeaseStore, MAX_ATTEMPTS};

/// A request of the batch on its way: its index, TTL in seconds, and the etcd lease granted for
/// it (with the instant the grant was sent).
#[derive(Clone, Copy)]
struct Entry {
    i: usize,
    ttl_secs: i64,
    lease_id: i64,
    sent: Instant,
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
        // Keys decided one by one by `acquire`: those this store puts on shared etcd leases (the
        // sweeper's bookkeeping is acquire's), and keys the batch found held by their own owner
        // (a same-owner re-acquire replaces the key) or that changed hands too often.
        let mut single: Vec<usize> = Vec::new();
        valid.retain(|&(i, _)| {
            let shared = self.shared_for(&reqs[i].key).is_some();
            if shared {
                single.push(i);
            }
            !shared
        });
        let mut pending = self.grant_all(reqs, &valid, &mut out).await?;
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
                    // of the chunks not sent) removes whatever it may have created.
                    for entry in chunk.iter().chain(rest).chain(&again) {
                        self.revoke_quietly(entry.lease_id).await;
                    }
                    return Err(e);
                }
            }
            pending = again;
        }
        for entry in pending {
            self.revoke_quietly(entry.lease_id).await;
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
                let handle = Handle::in_slot(e.lease_id, e.ttl_secs, 0);
                (
                    protocol::mutex_prefix(prefix, key),
                    handle.lock_key(prefix, key),
                )
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
            for (e, (_, lock_key)) in chunk.iter().zip(&names) {
                let req = &reqs[e.i];
                let token =
                    leasehold_core::backend::decode_token(BACKEND, req.key.as_str(), revision)?;
                let handle = Handle::in_slot(e.lease_id, e.ttl_secs, 0)
                    .tagged(self.tag(lock_key, &req.owner, token, e.lease_id, e.ttl_secs));
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
                    self.revoke_quietly(e.lease_id).await;
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
            self.revoke_quietly(e.lease_id).await;
            out[e.i] = Some(holder.map(AcquireOutcome::Held));
        }
        Ok(())
    }
}
