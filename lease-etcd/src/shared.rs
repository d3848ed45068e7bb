//! Lease sharing ([`LeaseSharing::PerTtl`](crate::LeaseSharing::PerTtl)): one etcd lease per
//! (store, TTL) backs every key the store grants with that TTL; keepalives are batched; per-key
//! expiry is enforced by a local sweeper. See `docs/adr/0030-etcd-lease-sharing.md`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lease_core::{AcquireRequest, Result};
use tokio::time::Instant;

use crate::BACKEND;
use crate::store::EtcdLeaseStore;

/// How often the sweeper looks for keys whose holders stopped renewing.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// A key this store granted, with the instant after which its holder has not renewed it.
#[derive(Debug)]
struct Tracked {
    create_revision: i64,
    expires: Instant,
    /// The sweeper decided the key expired and is deleting it: no renewal may extend it now.
    deleting: bool,
}

type Slot = Arc<tokio::sync::Mutex<Option<Instant>>>;

/// The shared etcd leases of one store and the keys they back.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// TTL in seconds -> the etcd lease new grants with that TTL attach to.
    by_ttl: Mutex<HashMap<i64, i64>>,
    /// etcd lease id -> when its last successful keepalive (or grant) was sent. The async mutex
    /// makes concurrent renewals of keys on one lease share one keepalive.
    refreshed: Mutex<HashMap<i64, Slot>>,
    /// Lock key -> its local expiry.
    held: Mutex<HashMap<Vec<u8>, Tracked>>,
    /// TTL in seconds -> held while an etcd lease for that TTL is granted, so that concurrent
    /// first acquires share one grant instead of each granting (and then keeping alive) its own.
    granting: Mutex<HashMap<i64, Arc<tokio::sync::Mutex<()>>>>,
    /// Distinguishes the lock keys of one etcd lease.
    nonce: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// A fresh shared state and its sweeper, which runs until the state is dropped.
    pub(crate) fn start(store: EtcdLeaseStore) -> Arc<Shared> {
        let shared = Arc::new(Shared::default());
        let weak = Arc::downgrade(&shared);
        tokio::spawn(sweep(weak, store));
        shared
    }

    /// A suffix that makes a lock key unique even when this store's lease backs the same name
    /// twice (an owner re-acquiring its key).
    pub(crate) fn next_nonce(&self) -> u64 {
        self.nonce
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The etcd lease for a new grant of `ttl_secs`, kept alive from the returned instant on
    /// (the instant the keepalive or grant was sent), or `None` if there is none yet.
    async fn lease_for(
        &self,
        store: &EtcdLeaseStore,
        ttl_secs: i64,
    ) -> Result<Option<(i64, Instant)>> {
        let current = lock(&self.by_ttl).get(&ttl_secs).copied();
        let Some(id) = current else { return Ok(None) };
        match self.refresh(store, id, ttl_secs).await? {
            Some(sent) => Ok(Some((id, sent))),
            None => {
                lock(&self.by_ttl).remove(&ttl_secs);
                Ok(None)
            }
        }
    }

    /// The etcd lease for a new grant of `ttl_secs`, and the instant from which it is kept
    /// alive: the current one (see [`lease_for`](Shared::lease_for)), or a fresh grant. One
    /// grant at a time per TTL: an acquire that finds none while another is granting waits for
    /// that grant and uses it.
    pub(crate) async fn lease_or_grant(
        &self,
        store: &EtcdLeaseStore,
        req: &AcquireRequest,
        ttl_secs: i64,
    ) -> Result<(i64, Instant)> {
        if let Some(current) = self.lease_for(store, ttl_secs).await? {
            return Ok(current);
        }
        let gate = lock(&self.granting).entry(ttl_secs).or_default().clone();
        let _granting = gate.lock().await;
        if let Some(current) = self.lease_for(store, ttl_secs).await? {
            return Ok(current);
        }
        let (id, sent) = store.grant_exactly(req, ttl_secs).await?;
        self.adopt(ttl_secs, id, sent);
        Ok((id, sent))
    }

    /// Records a freshly granted etcd lease for `ttl_secs`.
    fn adopt(&self, ttl_secs: i64, id: i64, sent: Instant) {
        lock(&self.by_ttl).insert(ttl_secs, id);
        lock(&self.refreshed).insert(id, Arc::new(tokio::sync::Mutex::new(Some(sent))));
    }

    /// Keeps `id` alive: reuses a keepalive sent within the last tenth of the TTL (waiting for
    /// one in flight), or sends one. Returns when the keepalive that covers the caller was sent,
    /// or `None` if etcd no longer knows the lease.
    pub(crate) async fn refresh(
        &self,
        store: &EtcdLeaseStore,
        id: i64,
        ttl_secs: i64,
    ) -> Result<Option<Instant>> {
        let window = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(0)) / 10;
        let slot = lock(&self.refreshed).entry(id).or_default().clone();
        let mut last = slot.lock().await;
        if let Some(sent) = *last
            && sent.elapsed() <= window
        {
            return Ok(Some(sent));
        }
        let sent = Instant::now();
        if store.keep_alive_once(id).await? {
            *last = Some(sent);
            Ok(Some(sent))
        } else {
            *last = None;
            lock(&self.refreshed).remove(&id);
            Ok(None)
        }
    }

    /// Starts or extends the local expiry of a lock key; `false` if the sweeper already decided
    /// it expired (the renewal came too late and must report the lease lost).
    pub(crate) fn extend(&self, key: &[u8], create_revision: i64, expires: Instant) -> bool {
        let mut held = lock(&self.held);
        match held.get_mut(key) {
            Some(t) if t.create_revision == create_revision && t.deleting => false,
            Some(t) if t.create_revision == create_revision => {
                t.expires = t.expires.max(expires);
                true
            }
            _ => {
                held.insert(
                    key.to_vec(),
                    Tracked {
                        create_revision,
                        expires,
                        deleting: false,
                    },
                );
                true
            }
        }
    }

    /// Stops tracking a lock key (released or lost).
    pub(crate) fn forget(&self, key: &[u8]) {
        lock(&self.held).remove(key);
    }

    /// Marks every expired key as being deleted and returns them.
    fn claim_due(&self, now: Instant) -> Vec<(Vec<u8>, i64)> {
        lock(&self.held)
            .iter_mut()
            .filter(|(_, t)| t.expires <= now && !t.deleting)
            .map(|(k, t)| {
                t.deleting = true;
                (k.clone(), t.create_revision)
            })
            .collect()
    }

    /// A deletion failed: the key is tracked as before and retried on the next sweep.
    fn unclaim(&self, key: &[u8]) {
        if let Some(t) = lock(&self.held).get_mut(key) {
            t.deleting = false;
        }
    }
}

/// Deletes keys whose holders stopped renewing although their shared etcd lease lives on.
async fn sweep(shared: Weak<Shared>, store: EtcdLeaseStore) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        for (key, create_revision) in shared.claim_due(Instant::now()) {
            let txn = Txn::new()
                .when(vec![Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    create_revision,
                )])
                .and_then(vec![TxnOp::delete(key.clone(), None)]);
            match store.txn(txn).await {
                Ok(_) => {
                    shared.forget(&key);
                    tracing::debug!(backend = BACKEND, lock_key = %String::from_utf8_lossy(&key), token = create_revision, "lease expired unrenewed; lock key deleted");
                }
                Err(e) => {
                    shared.unclaim(&key);
                    tracing::debug!(backend = BACKEND, lock_key = %String::from_utf8_lossy(&key), error = %e, "deleting an expired lock key failed; retrying");
                }
            }
        }
    }
}
