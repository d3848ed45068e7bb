//! The in-memory reference store: the semantics every backend must match.
//!
//! It is public API with no feature switch (unlike the test-only `clock::ManualClock` behind
//! `test-util`): it is the reference every backend's conformance is judged against, what the
//! documentation's examples and the demos run on, and what applications use in their own tests
//! and single-process setups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::validate_ttl;
use crate::capability::{Capabilities, ExpiryClock, TokenDurability};
use crate::error::Result;
use crate::fencing::FencingToken;
use crate::lease::{
    AcquireOutcome, AcquireRequest, Holder, KeyState, Lease, LeaseKey, OwnerId, ReleaseOutcome,
    RenewOutcome,
};
use crate::store::{KeyWatch, LeaseStore};

#[derive(Debug)]
struct Held {
    owner: OwnerId,
    token: FencingToken,
    ttl: Duration,
    expires: Instant,
}

#[derive(Debug)]
struct Entry {
    held: Option<Held>,
    generation: Option<FencingToken>,
    changes: watch::Sender<u64>,
}

impl Entry {
    fn new() -> Self {
        Entry {
            held: None,
            generation: None,
            changes: watch::channel(0).0,
        }
    }

    fn valid_holder(&self, now: Instant) -> Option<&Held> {
        self.held.as_ref().filter(|h| h.expires > now)
    }

    fn notify(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// The in-memory reference [`LeaseStore`].
///
/// A cloneable handle over shared state, safe to use from many tasks. Its clock is tokio's
/// [`Instant`], so tests can run it in paused time (`tokio::time::pause`). It supports
/// [`watch`](LeaseStore::watch): waiters are woken on release and acquisition. Tokens live as
/// long as the store value.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId, RenewOutcome};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = MemoryLeaseStore::new();
/// let req = AcquireRequest::new(LeaseKey::new("k")?, OwnerId::random(), Duration::from_secs(5));
/// let lease = store.acquire(&req).await?.lease().unwrap();
/// assert!(matches!(store.renew(&lease).await?, RenewOutcome::Renewed(_)));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryLeaseStore {
    inner: Arc<Mutex<HashMap<LeaseKey, Entry>>>,
}

impl MemoryLeaseStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseKey, Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

const BACKEND: &str = "memory";

#[async_trait]
impl LeaseStore for MemoryLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TokenDurability::Process, ExpiryClock::InProcess).with_watch(true)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        validate_ttl(req.ttl, self.capabilities().min_ttl)?;
        let sent = Instant::now();
        let mut map = self.lock();
        let entry = map.entry(req.key.clone()).or_insert_with(Entry::new);
        let now = Instant::now();
        if let Some(h) = entry.valid_holder(now)
            && h.owner != req.owner
        {
            return Ok(AcquireOutcome::Held(Holder {
                owner: h.owner.clone(),
                token: h.token,
                remaining: h.expires - now,
                ttl: h.ttl,
            }));
        }
        let token = match entry.generation {
            Some(t) => t.next()?,
            None => FencingToken::MIN,
        };
        entry.generation = Some(token);
        entry.held = Some(Held {
            owner: req.owner.clone(),
            token,
            ttl: req.ttl,
            expires: crate::clock::saturating_add(now, req.ttl),
        });
        entry.notify();
        tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, "lease acquired");
        Ok(AcquireOutcome::Acquired(Lease::granted(
            req.key.clone(),
            req.owner.clone(),
            token,
            req.ttl,
            req.drift_margin(),
            sent,
        )))
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        validate_ttl(lease.ttl(), self.capabilities().min_ttl)?;
        let sent = Instant::now();
        let mut map = self.lock();
        let now = Instant::now();
        let Some(entry) = map.get_mut(lease.key()) else {
            return Ok(RenewOutcome::Lost);
        };
        match entry.held.as_mut() {
            Some(h) if h.expires > now && h.owner == *lease.owner() && h.token == lease.token() => {
                h.expires = crate::clock::saturating_add(now, lease.ttl());
                h.ttl = lease.ttl();
                tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
                Ok(RenewOutcome::Renewed(lease.renewed(lease.ttl(), sent)))
            }
            _ => Ok(RenewOutcome::Lost),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let mut map = self.lock();
        let now = Instant::now();
        let Some(entry) = map.get_mut(lease.key()) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        match entry.held.as_ref() {
            Some(h) if h.expires > now && h.owner == *lease.owner() && h.token == lease.token() => {
                entry.held = None;
                entry.notify();
                tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease released");
                Ok(ReleaseOutcome::Released)
            }
            _ => Ok(ReleaseOutcome::NotHeld),
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        let map = self.lock();
        let now = Instant::now();
        let entry = map.get(key);
        Ok(KeyState {
            key: key.clone(),
            holder: entry.and_then(|e| e.valid_holder(now)).map(|h| Holder {
                owner: h.owner.clone(),
                token: h.token,
                remaining: h.expires - now,
                ttl: h.ttl,
            }),
            last_token: entry.and_then(|e| e.generation),
        })
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        let mut rx = {
            let mut map = self.lock();
            map.entry(key.clone())
                .or_insert_with(Entry::new)
                .changes
                .subscribe()
        };
        rx.mark_unchanged();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            match rx.changed().await {
                Ok(()) => Some((Ok(()), rx)),
                Err(_) => None,
            }
        });
        Ok(Some(KeyWatch::new(Box::pin(stream))))
    }
}
