//! When the supervisor opens its watch, in tokio paused time: an uncontended acquire opens none
//! (it costs a request on etcd and Kubernetes, a LISTEN on PostgreSQL), a contended one opens it
//! after the first refusal and tries again at once, so a release that lands between that refusal
//! and the watch is not missed (the waiter is granted without waiting for a backoff).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, KeyState, KeyWatch, Lease, LeaseKey, LeaseStore,
    MemoryLeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

/// The memory store counting watches; it can release a lease while a watch is being opened.
#[derive(Debug, Clone, Default)]
struct Counting {
    mem: MemoryLeaseStore,
    watches: Arc<AtomicU32>,
    release_on_watch: Arc<Mutex<Option<Lease>>>,
    /// How long opening a watch takes (a new connection and a LISTEN on PostgreSQL, a LIST on
    /// Kubernetes).
    watch_delay: Duration,
}

#[async_trait]
impl LeaseStore for Counting {
    fn backend(&self) -> &'static str {
        "counting"
    }
    fn capabilities(&self) -> Capabilities {
        self.mem.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.mem.acquire(req).await
    }
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        self.mem.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.mem.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.mem.inspect(key).await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        self.watches.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.watch_delay).await;
        // The holder lets go while the watch is being set up: after the waiter's refusal,
        // before its watch exists, so the watch never reports it.
        let pending = self.release_on_watch.lock().unwrap().take();
        if let Some(lease) = pending {
            assert_eq!(self.mem.release(&lease).await?, ReleaseOutcome::Released);
        }
        self.mem.watch(key).await
    }
}

fn config() -> SupervisorConfig {
    SupervisorConfig::new(TTL).with_acquire_wait(Duration::from_secs(60))
}

#[tokio::test(start_paused = true)]
async fn an_uncontended_acquire_opens_no_watch() {
    let store = Counting::default();
    let sup = Supervisor::new(store.clone(), config());
    let key = LeaseKey::new("free").unwrap();
    let guard = sup.acquire(&key).await.unwrap().guard().expect("free key");
    assert_eq!(store.watches.load(Ordering::SeqCst), 0);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(start_paused = true)]
async fn a_release_between_the_refusal_and_the_watch_is_not_missed() {
    let store = Counting::default();
    let key = LeaseKey::new("raced").unwrap();
    let req = AcquireRequest::new(key.clone(), OwnerId::random(), TTL);
    let held = store.mem.acquire(&req).await.unwrap().lease().unwrap();
    *store.release_on_watch.lock().unwrap() = Some(held);
    let sup = Supervisor::new(store.clone(), config());
    let started = Instant::now();
    let got = sup.acquire(&key).await.unwrap();
    assert!(matches!(got, Acquisition::Acquired(_)), "{got:?}");
    assert_eq!(store.watches.load(Ordering::SeqCst), 1);
    // Granted at once (paused time: no backoff slept), not after a poll.
    assert_eq!(started.elapsed(), Duration::ZERO);
}

/// A watch that takes longer to open than the first backoff (50 ms against 10 ms) still opens:
/// its bound is the op timeout within the acquire's own wait, not the backoff. Once open, the
/// holder's release wakes the waiter at once (paused time: no backoff slept); a waiter left
/// polling would be let in by its next retry instead. Failed before the fix: the watch was
/// bounded by the backoff (the shadowed `wait`), timed out, and the waiter polled (the
/// PostgreSQL and Kubernetes handoff regression of 2026-12-04).
#[tokio::test(start_paused = true)]
async fn a_watch_slower_than_the_backoff_still_opens_and_wakes_the_waiter() {
    let store = Counting {
        watch_delay: Duration::from_millis(50),
        ..Counting::default()
    };
    let key = LeaseKey::new("slow-watch").unwrap();
    let req = AcquireRequest::new(key.clone(), OwnerId::random(), TTL);
    let held = store.mem.acquire(&req).await.unwrap().lease().unwrap();
    let sup = Supervisor::new(store.clone(), config());
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move {
            let got = sup.acquire(&key).await.unwrap();
            (got, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let released_at = Instant::now();
    assert_eq!(
        store.mem.release(&held).await.unwrap(),
        ReleaseOutcome::Released
    );
    let (got, granted_at) = waiter.await.unwrap();
    assert!(matches!(got, Acquisition::Acquired(_)), "{got:?}");
    assert_eq!(store.watches.load(Ordering::SeqCst), 1);
    assert_eq!(
        granted_at - released_at,
        Duration::ZERO,
        "the waiter was let in by a retry, not by its watch"
    );
}
