//! The election's role, in tokio paused time: a leader that hands over, resigns or yields is no
//! longer reported `Leader` once its release has started, not only after the store answered it
//! (a dashboard or a caller reading `is_leader()` must not see a leader that is letting go).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::election::{Election, Role};
use leasehold_core::supervisor::SupervisorConfig;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, KeyState, KeyWatch, Lease, LeaseKey, LeaseStore,
    MemoryLeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result,
};
use tokio::sync::{Notify, Semaphore};

const TTL: Duration = Duration::from_secs(3);

/// The memory store, with releases that wait for a gate (and say when one is waiting).
#[derive(Debug, Clone)]
struct Gated {
    mem: MemoryLeaseStore,
    entered: Arc<Notify>,
    gate: Arc<Semaphore>,
}

#[async_trait]
impl LeaseStore for Gated {
    fn backend(&self) -> &'static str {
        "gated"
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
        self.entered.notify_one();
        let _permit = self.gate.acquire().await.expect("gate open");
        self.mem.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.mem.inspect(key).await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        self.mem.watch(key).await
    }
}

fn gated() -> Gated {
    Gated {
        mem: MemoryLeaseStore::new(),
        entered: Arc::new(Notify::new()),
        gate: Arc::new(Semaphore::new(0)),
    }
}

async fn leader(election: &Election, id: &str) -> leasehold_core::election::Candidate {
    let c = election.join(OwnerId::new(id).unwrap());
    let mut role = c.subscribe();
    role.wait_for(|r| matches!(r, Role::Leader { .. }))
        .await
        .unwrap();
    c
}

#[tokio::test(start_paused = true)]
async fn a_handover_is_not_reported_leader_while_its_release_is_in_flight() {
    let store = gated();
    let key = LeaseKey::new("role-handover").unwrap();
    let election = Election::new(store.clone(), key, SupervisorConfig::new(TTL));
    let a = leader(&election, "a").await;
    let b = OwnerId::new("b").unwrap();
    let handover = a.handover(&b, TTL);
    tokio::pin!(handover);
    tokio::select! {
        _ = &mut handover => panic!("the handover finished with its release held back"),
        _ = store.entered.notified() => {}
    }
    assert!(
        !a.is_leader(),
        "still Leader while releasing: {:?}",
        a.role()
    );
    store.gate.add_permits(100);
    assert!(handover.await);
}

#[tokio::test(start_paused = true)]
async fn a_resignation_is_not_reported_leader_while_its_release_is_in_flight() {
    let store = gated();
    let key = LeaseKey::new("role-resign").unwrap();
    let election = Election::new(store.clone(), key, SupervisorConfig::new(TTL));
    let a = leader(&election, "a").await;
    let role = a.subscribe();
    let resign = a.resign();
    tokio::pin!(resign);
    tokio::select! {
        _ = &mut resign => panic!("the resignation finished with its release held back"),
        _ = store.entered.notified() => {}
    }
    assert!(
        !matches!(*role.borrow(), Role::Leader { .. }),
        "still Leader while releasing: {:?}",
        *role.borrow()
    );
    store.gate.add_permits(100);
    resign.await;
}
