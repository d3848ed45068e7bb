use std::sync::Mutex;

use async_trait::async_trait;
use tokio::time::Instant;

use super::*;
use crate::lease::{AcquireOutcome, AcquireRequest, Lease};
use crate::{
    Capabilities, KeyState, KeyWatch, MemoryLeaseStore, ReleaseOutcome, RenewOutcome, Result,
};
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(3);

/// How the reservation key's inspect behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inspect {
    Works,
    Fails,
    Hangs,
}

/// The memory store, with the reservation's inspect failing or hanging on demand, and the
/// election key's release taking `release_takes`.
#[derive(Debug, Clone)]
struct Flaky {
    mem: MemoryLeaseStore,
    inspect: Arc<Mutex<Inspect>>,
    release_takes: Arc<Mutex<Duration>>,
}

impl Flaky {
    fn new() -> Self {
        Flaky {
            mem: MemoryLeaseStore::new(),
            inspect: Arc::new(Mutex::new(Inspect::Works)),
            release_takes: Arc::new(Mutex::new(Duration::ZERO)),
        }
    }

    fn set(&self, how: Inspect) {
        *self.inspect.lock().unwrap() = how;
    }
}

fn is_reservation(key: &LeaseKey) -> bool {
    key.as_str().ends_with("handover")
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl LeaseStore for Flaky {
    fn backend(&self) -> &'static str {
        "flaky"
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
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        self.mem.renew_many(leases).await
    }
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        self.mem.inspect_many(keys).await
    }
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        self.mem.acquire_many(reqs).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        if !is_reservation(lease.key()) {
            let takes = *self.release_takes.lock().unwrap();
            sleep(takes).await;
        }
        self.mem.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        let how = *self.inspect.lock().unwrap();
        match how {
            _ if !is_reservation(key) => self.mem.inspect(key).await,
            Inspect::Works => self.mem.inspect(key).await,
            Inspect::Fails => Err(crate::Error::refused("flaky", "inspect refused", None)),
            Inspect::Hangs => std::future::pending().await,
        }
    }
    async fn holders_many(&self, keys: &[LeaseKey]) -> Result<Vec<Option<crate::HeldBy>>> {
        self.mem.holders_many(keys).await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        self.mem.watch(key).await
    }
}

fn election(store: &Flaky) -> Election {
    Election::new(
        store.clone(),
        LeaseKey::new("jobs").unwrap(),
        SupervisorConfig::new(TTL).with_acquire_wait(TTL),
    )
}

async fn leads(c: &Candidate) {
    c.subscribe()
        .wait_for(|r| matches!(r, Role::Leader { .. }))
        .await
        .unwrap();
}

/// Waits until one of `a` and `b` leads (the old leader campaigns again after a handover).
async fn one_leads(a: &Candidate, b: &Candidate) {
    tokio::select! {
        _ = leads(a) => {}
        _ = leads(b) => {}
    }
}

/// While the reservation cannot be read (for less than the bound), a candidate that is not
/// the successor stays out; once it can be read again, it stays out until the reservation
/// expires `within` after the release.
async fn unreadable_reservation_keeps_others_out(how: Inspect) {
    let store = Flaky::new();
    let e = election(&store);
    let a = e.join(OwnerId::new("a").unwrap());
    leads(&a).await;
    let b = e.join(OwnerId::new("b").unwrap());
    sleep(TTL).await;
    let within = TTL * 2;
    store.set(how);
    assert!(a.handover(&OwnerId::new("ghost").unwrap(), within).await);
    let released = Instant::now();
    let outage = e.reservation_bound() / 2;
    let early = tokio::time::timeout(outage, one_leads(&a, &b)).await;
    assert!(
        early.is_err(),
        "{:?} {:?} while the reservation was unreadable ({how:?})",
        a.role(),
        b.role()
    );
    store.set(Inspect::Works);
    let led = tokio::time::timeout(within + TTL * 2, one_leads(&a, &b)).await;
    assert!(led.is_ok(), "nobody led");
    assert!(
        released.elapsed() >= within,
        "led {:?} after the release, the reservation being for {within:?}",
        released.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_reservation_inspect_keeps_others_out() {
    unreadable_reservation_keeps_others_out(Inspect::Fails).await;
}

#[tokio::test(start_paused = true)]
async fn a_hanging_reservation_inspect_keeps_others_out() {
    unreadable_reservation_keeps_others_out(Inspect::Hangs).await;
}

/// A reservation that stays unreadable keeps others out for the bound, not forever.
#[tokio::test(start_paused = true)]
async fn an_unreadable_reservation_is_waited_for_up_to_the_bound() {
    let store = Flaky::new();
    let e = election(&store);
    let a = e.join(OwnerId::new("a").unwrap());
    leads(&a).await;
    let b = e.join(OwnerId::new("b").unwrap());
    sleep(TTL).await;
    store.set(Inspect::Fails);
    assert!(a.handover(&OwnerId::new("ghost").unwrap(), TTL * 10).await);
    let released = Instant::now();
    let bound = e.reservation_bound();
    let led = tokio::time::timeout(bound + TTL * 2, one_leads(&a, &b)).await;
    assert!(led.is_ok(), "nobody led");
    assert!(
        released.elapsed() >= bound,
        "led {:?} after the release, before the bound {bound:?}",
        released.elapsed()
    );
}

/// `within` counts from the release, however long the release takes.
#[tokio::test(start_paused = true)]
async fn within_counts_from_the_release() {
    let store = Flaky::new();
    let e = election(&store);
    let a = e.join(OwnerId::new("a").unwrap());
    leads(&a).await;
    let b = e.join(OwnerId::new("b").unwrap());
    sleep(TTL).await;
    let takes = Duration::from_millis(800);
    *store.release_takes.lock().unwrap() = takes;
    let within = TTL;
    assert!(a.handover(&OwnerId::new("ghost").unwrap(), within).await);
    let released = Instant::now();
    one_leads(&a, &b).await;
    assert!(
        released.elapsed() >= within,
        "led {:?} after the release, the reservation being for {within:?}",
        released.elapsed()
    );
}
