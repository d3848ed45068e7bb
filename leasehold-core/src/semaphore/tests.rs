//! The semaphore on the in-memory store, in paused time.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::lease::{AcquireRequest, ReleaseOutcome};
use crate::memory::MemoryLeaseStore;
use crate::supervisor::Health;

const TTL: Duration = Duration::from_secs(10);

fn name() -> LeaseKey {
    LeaseKey::new("crawlers").unwrap()
}

fn sem(store: &MemoryLeaseStore, permits: u32, wait: Duration) -> Semaphore {
    let config = SupervisorConfig::new(TTL).with_acquire_wait(wait);
    Semaphore::new(store.clone(), &name(), permits, config).unwrap()
}

#[test]
fn permit_counts_out_of_range_and_names_too_long_are_typed_errors() {
    let store = MemoryLeaseStore::new();
    let config = SupervisorConfig::new(TTL);
    for n in [0, MAX_PERMITS + 1, u32::MAX] {
        let r = Semaphore::new(store.clone(), &name(), n, config.clone());
        assert!(matches!(r, Err(Error::InvalidInput(_))), "{n}: {r:?}");
    }
    let sem = Semaphore::new(store.clone(), &name(), MAX_PERMITS, config.clone()).unwrap();
    assert_eq!(sem.permits(), MAX_PERMITS);
    assert_eq!(
        sem.slot_keys().last().unwrap().as_str(),
        "crawlers.lease--permit.1023"
    );
    // 200 bytes is a legal key, but leaves no room for the slot suffix.
    let long = LeaseKey::new("a".repeat(190)).unwrap();
    let r = Semaphore::new(store.clone(), &long, 2, config.clone());
    assert!(matches!(r, Err(Error::InvalidKey { .. })), "{r:?}");
    let r = Semaphore::new(store, &name(), 2, SupervisorConfig::new(Duration::ZERO));
    assert!(matches!(r, Err(Error::InvalidTtl { .. })), "{r:?}");
}

#[test]
fn every_rotation_tries_every_slot_once() {
    for n in 1..40 {
        let mut starts = std::collections::HashSet::new();
        for _ in 0..200 {
            let order = rotation(&OwnerId::instance("w").unwrap(), n);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>());
            starts.insert(order[0]);
        }
        assert!(starts.len() >= n.min(5), "{n}: starts {starts:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn at_most_n_permits_each_on_its_own_slot_and_owner() {
    let store = MemoryLeaseStore::new();
    let sem = sem(&store, 3, Duration::ZERO);
    let mut permits = Vec::new();
    for _ in 0..3 {
        permits.push(
            sem.try_acquire()
                .await
                .unwrap()
                .permit()
                .expect("free slot"),
        );
    }
    let mut slots: Vec<u32> = permits.iter().map(Permit::slot).collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2]);
    let owners: std::collections::HashSet<_> = permits.iter().map(|p| p.owner().clone()).collect();
    assert_eq!(owners.len(), 3, "each permit has its own owner instance");
    for p in &permits {
        assert_eq!(p.key(), &sem.slot_keys()[p.slot() as usize]);
        assert_eq!(p.owner().identity(), sem.supervisor().owner().as_str());
    }
    match sem.try_acquire().await.unwrap() {
        PermitAcquisition::NotAcquired { held, .. } => assert_eq!(held.len(), 3),
        other => panic!("a fourth permit: {other:?}"),
    }
    // Renewals keep all three (two permits of one semaphore never take each other's slot).
    tokio::time::sleep(TTL * 3).await;
    assert!(permits.iter().all(|p| p.health() == Health::Held));
    let held = sem.holders().await.unwrap();
    assert!(held.iter().all(Option::is_some));
    let freed = permits.pop().unwrap();
    let slot = freed.slot();
    assert_eq!(freed.release().await.unwrap(), ReleaseOutcome::Released);
    let again = sem
        .try_acquire()
        .await
        .unwrap()
        .permit()
        .expect("a freed slot");
    assert_eq!(again.slot(), slot);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_the_permit_released_and_a_greater_token() {
    let store = MemoryLeaseStore::new();
    let sem = sem(&store, 1, Duration::from_secs(60));
    let first = sem.acquire().await.unwrap().permit().unwrap();
    let first_token = first.token();
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            (sem.acquire().await.unwrap().permit(), t0.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (got, waited) = waiter.await.unwrap();
    let got = got.expect("the released permit");
    assert!(got.token() > first_token);
    // Woken by the watch, not by a poll a backoff later.
    assert!(waited < Duration::from_millis(5_100), "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_dead_holders_slot_is_taken_after_its_ttl() {
    let store = MemoryLeaseStore::new();
    let slot = Semaphore::slot_key(&name(), 0).unwrap();
    let ttl = Duration::from_secs(2);
    let dead = store
        .acquire(&AcquireRequest::new(slot, OwnerId::random(), ttl))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let sem = sem(&store, 1, Duration::from_secs(60));
    let t0 = Instant::now();
    let got = sem
        .acquire()
        .await
        .unwrap()
        .permit()
        .expect("the expired slot");
    assert!(t0.elapsed() >= ttl, "{:?}", t0.elapsed());
    assert!(got.token() > dead.token());
}

#[tokio::test(start_paused = true)]
async fn semaphores_that_disagree_on_n_hold_at_most_the_larger_n() {
    let store = MemoryLeaseStore::new();
    let two = sem(&store, 2, Duration::ZERO);
    let three = sem(&store, 3, Duration::ZERO);
    let a = two.try_acquire().await.unwrap().permit().unwrap();
    let b = two.try_acquire().await.unwrap().permit().unwrap();
    let c = three.try_acquire().await.unwrap().permit().expect("slot 2");
    assert_eq!(c.slot(), 2);
    assert!(three.try_acquire().await.unwrap().permit().is_none());
    assert!(two.try_acquire().await.unwrap().permit().is_none());
    // The other way round: three holders of a 3-semaphore leave none to a 2-semaphore.
    for p in [a, b, c] {
        assert_eq!(p.release().await.unwrap(), ReleaseOutcome::Released);
    }
    let held: Vec<_> = futures::future::join_all((0..3).map(|_| three.try_acquire())).await;
    assert!(
        held.iter()
            .all(|r| matches!(r, Ok(PermitAcquisition::Acquired(_))))
    );
    assert!(two.try_acquire().await.unwrap().permit().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_returns_cancelled_and_holds_nothing() {
    let store = MemoryLeaseStore::new();
    let sem = sem(&store, 1, Duration::from_secs(600));
    let held = sem.acquire().await.unwrap().permit().unwrap();
    let cancel = CancellationToken::new();
    let waiter = {
        let (sem, cancel) = (sem.clone(), cancel.clone());
        tokio::spawn(async move { sem.acquire_until_cancelled(&cancel).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    cancel.cancel();
    let out = waiter.await.unwrap().unwrap();
    assert!(matches!(out, PermitAcquisition::Cancelled), "{out:?}");
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(sem.holders().await.unwrap()[0].is_none());
}

#[tokio::test(start_paused = true)]
async fn a_full_semaphore_gives_up_after_the_wait() {
    let store = MemoryLeaseStore::new();
    let sem = sem(&store, 2, Duration::from_secs(4));
    let _a = sem.acquire().await.unwrap().permit().unwrap();
    let _b = sem.acquire().await.unwrap().permit().unwrap();
    match sem.acquire().await.unwrap() {
        PermitAcquisition::NotAcquired { held, waited } => {
            assert_eq!(held.len(), 2);
            assert!(waited >= Duration::from_secs(4), "{waited:?}");
            assert!(waited < Duration::from_secs(5), "{waited:?}");
        }
        other => panic!("{other:?}"),
    }
}
