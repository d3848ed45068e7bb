//! A guard stops saying "you may act" the moment its release starts, not when the store answers
//! (found by the deterministic simulation, leasehold-sim seed 5: the store applied a release whose
//! answer was lost, granted the key to someone else, and the old guard's `may_act()` stayed true
//! until the release call gave up).

use std::time::Duration;

use leasehold_core::supervisor::{Supervisor, SupervisorConfig};
use leasehold_core::{LeaseKey, LeaseStore, MemoryLeaseStore};
use leasehold_testkit::faulty::{Fault, FaultyStore, Operation};
use tokio::time::{sleep, timeout};

const TTL: Duration = Duration::from_secs(3);

#[tokio::test(start_paused = true)]
async fn may_act_is_false_while_a_release_is_in_flight() {
    let mem = MemoryLeaseStore::new();
    let store = FaultyStore::new(mem.clone());
    let sup = Supervisor::new(store.clone(), SupervisorConfig::new(TTL));
    let key = LeaseKey::new("job").unwrap();
    let guard = sup.acquire(&key).await.unwrap().guard().unwrap();
    let view = guard.view();
    assert!(view.may_act());
    // The store applies the release, but its answer never arrives.
    store.set(Operation::Release, Fault::DropResponse);
    let release = tokio::spawn(guard.release());
    sleep(Duration::from_millis(10)).await;
    assert!(
        mem.inspect(&key).await.unwrap().holder.is_none(),
        "the store applied the release"
    );
    assert!(
        !view.may_act(),
        "may_act() is still true while the release is in flight, after the store let the lease go"
    );
    // The release call itself stays bounded.
    timeout(TTL * 2, release)
        .await
        .expect("release hung")
        .unwrap()
        .ok();
}
