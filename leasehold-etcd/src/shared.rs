//! Lease sharing ([`LeaseSharing::PerTtl`](crate::LeaseSharing::PerTtl)): one etcd lease per
//! (store, TTL) backs every key the store grants with that TTL; keepalives are batched; per-key
//! expiry is enforced by a local sweeper. See `docs/adr/0030-etcd-lease-sharing.md`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use leasehold_core::{AcquireRequest, Result};
use tokio::time::Instant;

use crate::error::BACKEND;
use crate::protocol;
use crate::store::EtcdLeaseStore;

/// How often the sweeper looks for keys whose holders stopped renewing.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// What this store knows of a lock key on one of its shared etcd leases.
#[derive(Debug)]
struct Tracked {
    /// The etcd lease the key was put on (the sweeper deletes it only while it is still there).
    lease_id: i64,
    /// The granted TTL, for keys whose put has an unknown outcome.
    ttl: Duration,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A put (acquire or move) is in flight: nobody may sweep or extend the key yet.
    Pending { kind: PutKind },
    /// The put's outcome is unknown (it failed, or its future was dropped): the sweeper reads
    /// the key to resolve it.
    Abandoned { kind: PutKind },
    /// The sweeper's read did not find the abandoned put applied, but it may still be (a request
    /// on its way to etcd, or queued there, commits after the read): the sweeper looks for the
    /// key among the keys of its etcd lease (see [`Scan`]) until it finds it or the etcd lease
    /// is gone.
    Unseen { kind: PutKind },
    /// Held with this create revision until `expires` unless renewed.
    Known {
        create_revision: i64,
        expires: Instant,
        /// The sweeper decided the key expired and is deleting it: no renewal may extend it now.
        deleting: bool,
    },
}

/// Why a key is being put on a shared etcd lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PutKind {
    /// A new grant: nobody was told of it if the outcome is unknown, so the key is deleted.
    Acquire,
    /// An existing grant moved onto this store's etcd lease by a renewal: others may have
    /// reported deadlines for it, so the key is kept one TTL from when the sweeper finds it.
    Move,
}

type Slot = Arc<tokio::sync::Mutex<Option<Instant>>>;

/// When the sweeper next reads the keys of an etcd lease that may receive a late put
/// ([`State::Unseen`]): first at the next sweep, then at doubling intervals up to the lease's TTL.
#[derive(Debug, Clone, Copy)]
struct Scan {
    next: Instant,
    every: Duration,
    ttl: Duration,
}

/// The shared etcd leases of one store and the keys they back.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// TTL in seconds -> the etcd lease new grants with that TTL attach to.
    by_ttl: Mutex<HashMap<i64, i64>>,
    /// etcd lease id -> when its last successful keepalive (or grant) was sent. The async mutex
    /// makes concurrent renewals of keys on one lease share one keepalive.
    refreshed: Mutex<HashMap<i64, Slot>>,
    /// Lock key -> what this store knows of it: every key ever put on one of this store's shared
    /// etcd leases, from before its put is sent until it is deleted or moved away.
    held: Mutex<HashMap<Vec<u8>, Tracked>>,
    /// The etcd leases this store granted (the only ones it sweeps and renews in place).
    own: Mutex<std::collections::HashSet<i64>>,
    /// TTL in seconds -> held while an etcd lease for that TTL is granted, so that concurrent
    /// first acquires share one grant instead of each granting (and then keeping alive) its own.
    granting: Mutex<HashMap<i64, Arc<tokio::sync::Mutex<()>>>>,
    /// etcd lease id -> when to read its keys next, for the leases with keys in
    /// [`State::Unseen`].
    scans: Mutex<HashMap<i64, Scan>>,
    /// Distinguishes the lock keys of one etcd lease.
    nonce: std::sync::atomic::AtomicU64,
    /// The store handle (without this shared state) the sweeper gets when it starts, with the
    /// first etcd lease this store grants for sharing; `None` once it started.
    sweeper: Mutex<Option<EtcdLeaseStore>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// A fresh shared state. Its sweeper starts with the first etcd lease it grants (a store
    /// that never puts a key on a shared etcd lease runs none) and runs until the state is
    /// dropped; `store` must not hold this state, so that the sweeper ends with the store.
    pub(crate) fn start(store: EtcdLeaseStore) -> Arc<Shared> {
        let shared = Arc::new(Shared::default());
        *lock(&shared.sweeper) = Some(store);
        shared
    }

    /// Starts the sweeper if it has not started yet.
    fn start_sweeper(self: &Arc<Self>) {
        if let Some(store) = lock(&self.sweeper).take() {
            tokio::spawn(sweep(Arc::downgrade(self), store));
        }
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
        self: &Arc<Self>,
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
        self.start_sweeper();
        self.adopt(ttl_secs, id, sent);
        Ok((id, sent))
    }

    /// Records a freshly granted etcd lease for `ttl_secs`.
    fn adopt(&self, ttl_secs: i64, id: i64, sent: Instant) {
        lock(&self.by_ttl).insert(ttl_secs, id);
        lock(&self.own).insert(id);
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
        self.refresh_within(store, id, window).await
    }

    /// As [`refresh`](Shared::refresh), but reusing only a keepalive sent within `window`
    /// (zero: always send one, after everything this call follows).
    pub(crate) async fn refresh_within(
        &self,
        store: &EtcdLeaseStore,
        id: i64,
        window: Duration,
    ) -> Result<Option<Instant>> {
        let slot = lock(&self.refreshed).entry(id).or_default().clone();
        let mut last = slot.lock().await;
        if let Some(sent) = *last
            && !window.is_zero()
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

    /// Whether this store granted etcd lease `id` (so it alone sweeps the keys on it).
    pub(crate) fn owns(&self, id: i64) -> bool {
        lock(&self.own).contains(&id)
    }

    /// Records, before the put is sent, that `key` is being put on this store's etcd lease
    /// `lease_id`. Until the returned guard is confirmed or cancelled the key is neither swept
    /// nor extended; a guard dropped unresolved (the put failed or its future was dropped) hands
    /// the key to the sweeper, which finds out whether the put happened and cleans up.
    pub(crate) fn pending(
        self: &Arc<Self>,
        key: &[u8],
        lease_id: i64,
        ttl: Duration,
        kind: PutKind,
    ) -> PendingPut {
        lock(&self.held).insert(
            key.to_vec(),
            Tracked {
                lease_id,
                ttl,
                state: State::Pending { kind },
            },
        );
        PendingPut {
            shared: Arc::downgrade(self),
            key: Some(key.to_vec()),
        }
    }

    /// Starts or extends the local expiry of a lock key on one of this store's etcd leases;
    /// `false` if the key may not be reported renewed: the sweeper already decided it expired,
    /// or a put of it is in flight or unresolved.
    pub(crate) fn extend(
        &self,
        key: &[u8],
        lease_id: i64,
        create_revision: i64,
        ttl: Duration,
        expires: Instant,
    ) -> bool {
        let mut held = lock(&self.held);
        match held.get_mut(key) {
            Some(Tracked {
                state:
                    State::Known {
                        create_revision: c,
                        expires: e,
                        deleting,
                    },
                lease_id: l,
                ..
            }) if *c == create_revision && *l == lease_id => {
                if *deleting {
                    return false;
                }
                *e = (*e).max(expires);
                true
            }
            Some(Tracked {
                state: State::Pending { .. } | State::Abandoned { .. } | State::Unseen { .. },
                ..
            }) => false,
            _ => {
                held.insert(
                    key.to_vec(),
                    Tracked {
                        lease_id,
                        ttl,
                        state: State::Known {
                            create_revision,
                            expires,
                            deleting: false,
                        },
                    },
                );
                true
            }
        }
    }

    /// Stops tracking a lock key (released, lost or moved away).
    pub(crate) fn forget(&self, key: &[u8]) {
        lock(&self.held).remove(key);
    }

    /// Marks every expired key as being deleted, and every abandoned put as being resolved, and
    /// returns them.
    fn claim_due(&self, now: Instant) -> Vec<Due> {
        let mut due = Vec::new();
        for (k, t) in lock(&self.held).iter_mut() {
            match &mut t.state {
                State::Known {
                    create_revision,
                    expires,
                    deleting,
                } if *expires <= now && !*deleting => {
                    *deleting = true;
                    due.push(Due::Expired {
                        key: k.clone(),
                        lease_id: t.lease_id,
                        create_revision: *create_revision,
                    });
                }
                State::Abandoned { kind } => {
                    let kind = *kind;
                    // Pending again while it is resolved, so that no renewal extends it meanwhile.
                    t.state = State::Pending { kind };
                    due.push(Due::Abandoned {
                        key: k.clone(),
                        lease_id: t.lease_id,
                        ttl: t.ttl,
                        kind,
                    });
                }
                _ => {}
            }
        }
        due
    }

    /// A sweep step failed: the key is handed back as it was and retried on the next sweep.
    fn unclaim(&self, key: &[u8]) {
        if let Some(t) = lock(&self.held).get_mut(key) {
            match &mut t.state {
                State::Known { deleting, .. } => *deleting = false,
                State::Pending { kind } => t.state = State::Abandoned { kind: *kind },
                State::Abandoned { .. } | State::Unseen { .. } => {}
            }
        }
    }

    /// The sweeper's read did not find `key`'s abandoned put applied: keep it as
    /// [`State::Unseen`] and read the keys of its etcd lease from the next sweep on.
    fn unseen(&self, key: &[u8], kind: PutKind, now: Instant) {
        let (lease_id, ttl) = {
            let mut held = lock(&self.held);
            let Some(t) = held.get_mut(key) else { return };
            t.state = State::Unseen { kind };
            (t.lease_id, t.ttl)
        };
        let first = Scan {
            next: now + SWEEP_EVERY,
            every: SWEEP_EVERY,
            ttl,
        };
        let mut scans = lock(&self.scans);
        let scan = scans.entry(lease_id).or_insert(first);
        // A fresh late put is likeliest soon: scan quickly again.
        *scan = Scan {
            next: scan.next.min(first.next),
            ..first
        };
    }

    /// The etcd leases whose keys are due to be read.
    fn scans_due(&self, now: Instant) -> Vec<i64> {
        lock(&self.scans)
            .iter()
            .filter(|(_, s)| s.next <= now)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Claims `key`, found on etcd lease `lease_id`, for resolution if it is [`State::Unseen`]
    /// there: its TTL and put kind.
    fn claim_unseen(&self, key: &[u8], lease_id: i64) -> Option<(Duration, PutKind)> {
        let mut held = lock(&self.held);
        let t = held.get_mut(key)?;
        match t.state {
            State::Unseen { kind } if t.lease_id == lease_id => {
                t.state = State::Pending { kind };
                Some((t.ttl, kind))
            }
            _ => None,
        }
    }

    /// After a read of etcd lease `lease_id`'s keys (`gone`: etcd no longer knows the lease, so
    /// no put onto it can ever commit): forgets its unseen puts if it is gone, and schedules the
    /// next read while any remain.
    fn scanned(&self, lease_id: i64, gone: bool, now: Instant) {
        let remaining = {
            let mut held = lock(&self.held);
            if gone {
                held.retain(|_, t| {
                    !(t.lease_id == lease_id && matches!(t.state, State::Unseen { .. }))
                });
            }
            held.values()
                .any(|t| t.lease_id == lease_id && matches!(t.state, State::Unseen { .. }))
        };
        let mut scans = lock(&self.scans);
        if !remaining {
            scans.remove(&lease_id);
        } else if let Some(s) = scans.get_mut(&lease_id) {
            s.every = s.every.saturating_mul(2).min(s.ttl.max(SWEEP_EVERY));
            s.next = now + s.every;
        }
    }

    /// A resolved move: the key is held until `expires` unless renewed.
    fn settle(&self, key: &[u8], create_revision: i64, expires: Instant) {
        if let Some(t) = lock(&self.held).get_mut(key) {
            t.state = State::Known {
                create_revision,
                expires,
                deleting: false,
            };
        }
    }
}

/// Work for the sweeper.
enum Due {
    /// A key whose holder stopped renewing it: delete it if it is still on our etcd lease.
    Expired {
        key: Vec<u8>,
        lease_id: i64,
        create_revision: i64,
    },
    /// A put with an unknown outcome: find out, then delete (acquire) or keep a TTL (move).
    Abandoned {
        key: Vec<u8>,
        lease_id: i64,
        ttl: Duration,
        kind: PutKind,
    },
}

/// A put of a lock key onto one of this store's etcd leases, registered before it is sent; see
/// [`Shared::pending`].
#[derive(Debug)]
pub(crate) struct PendingPut {
    shared: Weak<Shared>,
    key: Option<Vec<u8>>,
}

impl PendingPut {
    /// The put happened: the key is held with `create_revision` until `expires`.
    pub(crate) fn confirm(mut self, create_revision: i64, expires: Instant) {
        if let (Some(shared), Some(key)) = (self.shared.upgrade(), self.key.take()) {
            shared.settle(&key, create_revision, expires);
        }
    }

    /// The put certainly did not happen (its transaction's comparison failed).
    pub(crate) fn cancel(mut self) {
        if let (Some(shared), Some(key)) = (self.shared.upgrade(), self.key.take()) {
            shared.forget(&key);
        }
    }
}

impl Drop for PendingPut {
    fn drop(&mut self) {
        if let (Some(shared), Some(key)) = (self.shared.upgrade(), self.key.take())
            && let Some(t) = lock(&shared.held).get_mut(&key)
            && let State::Pending { kind } = t.state
        {
            t.state = State::Abandoned { kind };
        }
    }
}

/// Deletes keys whose holders stopped renewing although their shared etcd lease lives on, and
/// resolves puts whose outcome is unknown. Every deletion is a transaction that compares the
/// key's create revision and etcd lease, so a key moved onto another store's etcd lease (renewed
/// there) is left alone.
async fn sweep(shared: Weak<Shared>, store: EtcdLeaseStore) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        for due in shared.claim_due(Instant::now()) {
            match due {
                Due::Expired {
                    key,
                    lease_id,
                    create_revision,
                } => expire(&shared, &store, key, lease_id, create_revision, None).await,
                Due::Abandoned {
                    key,
                    lease_id,
                    ttl,
                    kind,
                } => resolve(&shared, &store, key, lease_id, ttl, kind).await,
            }
        }
        for lease_id in shared.scans_due(Instant::now()) {
            scan(&shared, &store, lease_id).await;
        }
    }
}

/// Reads the keys of etcd lease `lease_id` and resolves those of its puts the sweeper's read
/// missed ([`State::Unseen`]) that have committed since.
async fn scan(shared: &Shared, store: &EtcdLeaseStore, lease_id: i64) {
    let keys = match store.lease_keys(lease_id).await {
        Ok(keys) => keys,
        Err(e) => {
            shared.scanned(lease_id, false, Instant::now());
            tracing::debug!(backend = BACKEND, lease_id, error = %e, "reading the keys of a shared etcd lease failed; retrying");
            return;
        }
    };
    let gone = keys.is_none();
    for key in keys.unwrap_or_default() {
        if let Some((ttl, kind)) = shared.claim_unseen(&key, lease_id) {
            tracing::debug!(backend = BACKEND, lock_key = %String::from_utf8_lossy(&key), lease_id, "an abandoned put committed after the sweeper's read; resolving it");
            resolve(shared, store, key, lease_id, ttl, kind).await;
        }
    }
    shared.scanned(lease_id, gone, Instant::now());
}

/// Deletes `key` if it still has `create_revision` and `lease_id` (and `mod_revision`, if
/// given); forgets it either way once etcd answered.
async fn expire(
    shared: &Shared,
    store: &EtcdLeaseStore,
    key: Vec<u8>,
    lease_id: i64,
    create_revision: i64,
    mod_revision: Option<i64>,
) {
    let txn = protocol::delete_txn(&key, create_revision, lease_id, mod_revision);
    match store.txn(txn).await {
        Ok(resp) => {
            shared.forget(&key);
            tracing::debug!(backend = BACKEND, lock_key = %String::from_utf8_lossy(&key), token = create_revision, deleted = resp.succeeded(), "lease expired unrenewed (or moved away); lock key swept");
        }
        Err(e) => {
            shared.unclaim(&key);
            tracing::debug!(backend = BACKEND, lock_key = %String::from_utf8_lossy(&key), error = %e, "deleting an expired lock key failed; retrying");
        }
    }
}

/// Finds out whether an abandoned put of `key` onto etcd lease `lease_id` happened. An
/// acquire's key is deleted at once (its caller was told nothing). A moved key is kept one TTL
/// from now: every deadline reported for it by another store came from a renewal answered before
/// this read. A key not found may still be put (the request is on its way or queued in etcd): it
/// becomes [`State::Unseen`] and is looked for among the keys of its etcd lease. An acquire's key
/// found on another etcd lease was put and then moved away: forgotten.
async fn resolve(
    shared: &Shared,
    store: &EtcdLeaseStore,
    key: Vec<u8>,
    lease_id: i64,
    ttl: Duration,
    kind: PutKind,
) {
    let kv = match store
        .get(String::from_utf8_lossy(&key).into_owned(), None)
        .await
    {
        Ok(mut resp) => resp.take_kvs().pop(),
        Err(e) => {
            shared.unclaim(&key);
            tracing::debug!(backend = BACKEND, lock_key = %String::from_utf8_lossy(&key), error = %e, "reading a lock key with an unknown put failed; retrying");
            return;
        }
    };
    let read = Instant::now();
    let kv = match kv {
        Some(kv) if kv.lease() == lease_id => kv,
        Some(_) if kind == PutKind::Acquire => {
            shared.forget(&key);
            return;
        }
        _ => {
            shared.unseen(&key, kind, read);
            return;
        }
    };
    match kind {
        PutKind::Acquire => {
            let (c, m) = (kv.create_revision(), kv.mod_revision());
            expire(shared, store, key, lease_id, c, Some(m)).await;
        }
        PutKind::Move => shared.settle(&key, kv.create_revision(), read + ttl),
    }
}
