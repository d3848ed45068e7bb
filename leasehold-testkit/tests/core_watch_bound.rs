//! No unbounded wait on a store's watch: a `watch()` that never answers (a
//! Redis `SUBSCRIBE` on a black-holed connection) must not stall an acquire or an observer; they
//! fall back to polling.

use std::time::Duration;

use leasehold_core::election::Election;
use leasehold_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId};
use leasehold_testkit::faulty::{Fault, FaultyStore, Operation};
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(3);

fn key() -> LeaseKey {
    LeaseKey::new("job").unwrap()
}

fn hanging_watch(mem: &MemoryLeaseStore) -> FaultyStore<MemoryLeaseStore> {
    let f = FaultyStore::new(mem.clone());
    f.set(Operation::Watch, Fault::Hang);
    f
}

#[tokio::test(start_paused = true)]
async fn acquire_polls_when_the_watch_never_answers() {
    let mem = MemoryLeaseStore::new();
    let other = mem
        .acquire(&AcquireRequest::new(key(), OwnerId::random(), TTL))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let wait = Duration::from_secs(10);
    let sup = Supervisor::new(
        hanging_watch(&mem),
        SupervisorConfig::new(TTL).with_acquire_wait(wait),
    );
    let release = async {
        sleep(Duration::from_secs(1)).await;
        mem.release(&other).await.unwrap()
    };
    let t0 = Instant::now();
    let k = key();
    let (got, _) = tokio::join!(timeout(wait * 2, sup.acquire(&k)), release);
    let got = got.expect("acquire hung on a watch that never answers");
    assert!(matches!(got.unwrap(), Acquisition::Acquired(_)));
    assert!(
        Instant::now() - t0 < wait,
        "acquired only after the whole wait"
    );
}

#[tokio::test(start_paused = true)]
async fn a_bounded_wait_ends_on_time_when_the_watch_never_answers() {
    let mem = MemoryLeaseStore::new();
    let _other = mem
        .acquire(&AcquireRequest::new(key(), OwnerId::random(), TTL * 100))
        .await
        .unwrap();
    let wait = Duration::from_secs(2);
    let sup = Supervisor::new(
        hanging_watch(&mem),
        SupervisorConfig::new(TTL).with_acquire_wait(wait),
    );
    let got = timeout(wait * 2, sup.acquire(&key()))
        .await
        .expect("acquire hung on a watch that never answers");
    assert!(matches!(got.unwrap(), Acquisition::NotAcquired { .. }));
}

#[tokio::test(start_paused = true)]
async fn an_observer_reports_the_leader_when_the_watch_never_answers() {
    let mem = MemoryLeaseStore::new();
    let lease = mem
        .acquire(&AcquireRequest::new(key(), OwnerId::random(), TTL * 100))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let election = Election::new(hanging_watch(&mem), key(), SupervisorConfig::new(TTL));
    let mut observer = election.observe();
    let seen = timeout(TTL * 2, observer.changed())
        .await
        .expect("the observer never reported: stuck on the watch")
        .unwrap();
    assert_eq!(seen.term, Some(lease.token()));
}
