use super::*;
use crate::MemoryLeaseStore;
use tokio::time::Instant;
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(3);

fn election(store: &MemoryLeaseStore) -> Election {
    Election::new(
        store.clone(),
        LeaseKey::new("handover").unwrap(),
        SupervisorConfig::new(TTL).with_acquire_wait(TTL),
    )
}

async fn elected(c: &mut Candidate) -> FencingToken {
    loop {
        match c.next_event().await.expect("events") {
            ElectionEvent::Elected { term, .. } => return term,
            ElectionEvent::SteppedDown { .. } => {}
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_named_successor_and_nobody_else_takes_the_lead() {
    let store = MemoryLeaseStore::new();
    let e = election(&store);
    let mut a = e.join(OwnerId::new("a").unwrap());
    let t1 = elected(&mut a).await;
    let mut b = e.join(OwnerId::new("b").unwrap());
    let mut c = e.join(OwnerId::new("c").unwrap());
    tokio::time::sleep(TTL).await; // b and c campaign against a
    // Not leading: nothing happens.
    assert!(!b.handover(&OwnerId::new("c").unwrap(), TTL).await);
    let at = Instant::now();
    assert!(a.handover(&OwnerId::new("c").unwrap(), TTL).await);
    match a.next_event().await.unwrap() {
        ElectionEvent::SteppedDown { term, reason } => {
            assert_eq!((term, reason), (t1, StepDownReason::HandedOver));
        }
        other => panic!("{other:?}"),
    }
    let t2 = tokio::time::timeout(TTL, elected(&mut c))
        .await
        .expect("c leads");
    assert!(t2 > t1);
    // c took over on the release wake-up, not on expiry.
    assert!(at.elapsed() < TTL / 2, "{:?}", at.elapsed());
    // b never led, even once the reservation is gone.
    tokio::time::sleep(TTL * 3).await;
    assert!(
        tokio::time::timeout(Duration::ZERO, b.next_event())
            .await
            .is_err()
    );
    assert!(c.is_leader() && !b.is_leader() && !a.is_leader());
}

#[tokio::test(start_paused = true)]
async fn others_take_over_only_after_an_absent_successor_s_bound() {
    let store = MemoryLeaseStore::new();
    let e = election(&store);
    let mut a = e.join(OwnerId::new("a").unwrap());
    let t1 = elected(&mut a).await;
    let b = e.join(OwnerId::new("b").unwrap());
    tokio::time::sleep(TTL).await;
    let bound = Duration::from_secs(5);
    assert!(a.handover(&OwnerId::new("ghost").unwrap(), bound).await);
    // Nobody leads while the reservation stands ...
    tokio::time::sleep(bound - Duration::from_millis(100)).await;
    assert!(!a.is_leader() && !b.is_leader());
    // ... and someone does within a TTL after it expired, with a greater term.
    tokio::time::sleep(TTL).await;
    let term = match (a.role(), b.role()) {
        (Role::Leader { term }, Role::Follower) | (Role::Follower, Role::Leader { term }) => term,
        other => panic!("{other:?}"),
    };
    assert!(term > t1);
}

/// Elected with the event's drain guard; work that stops `stops_after` after its token is
/// cancelled keeps the guard until then. Returns the term and when the work stopped.
async fn elected_with_work(
    c: &mut Candidate,
    stops_after: Duration,
) -> (FencingToken, oneshot::Receiver<Instant>) {
    loop {
        if let ElectionEvent::Elected { term, work, drain } = c.next_event().await.unwrap() {
            let (tx, rx) = oneshot::channel();
            tokio::spawn(async move {
                work.cancelled().await;
                sleep(stops_after).await;
                drop(drain);
                let _ = tx.send(Instant::now());
            });
            return (term, rx);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_handover_waits_for_the_term_s_work_to_drain() {
    let store = MemoryLeaseStore::new();
    let e = election(&store).with_drain_timeout(TTL * 3);
    let mut a = e.join(OwnerId::new("a").unwrap());
    let (t1, stopped) = elected_with_work(&mut a, Duration::from_secs(2)).await;
    let mut c = e.join(OwnerId::new("c").unwrap());
    tokio::time::sleep(TTL).await;
    let at = Instant::now();
    assert!(a.handover(&OwnerId::new("c").unwrap(), TTL).await);
    let returned = Instant::now();
    let t2 = tokio::time::timeout(TTL * 3, elected(&mut c))
        .await
        .expect("c leads");
    let c_led = Instant::now();
    let stopped = stopped.await.unwrap();
    assert!(t2 > t1);
    // The lease was held (and renewed, past a TTL) while the work drained; the handover
    // returned once released, and c took over on the release, not on expiry.
    assert!(
        c_led >= stopped,
        "c led {:?} before the work stopped",
        stopped - c_led
    );
    assert_eq!(stopped - at, Duration::from_secs(2));
    assert!(returned >= stopped);
    assert!(c_led - stopped < TTL / 2, "{:?}", c_led - stopped);
}

#[tokio::test(start_paused = true)]
async fn a_drain_is_bounded_by_the_drain_timeout() {
    let store = MemoryLeaseStore::new();
    let drain = Duration::from_secs(1);
    let e = election(&store).with_drain_timeout(drain);
    let mut a = e.join(OwnerId::new("a").unwrap());
    // Work that never gives its guard back.
    let (t1, _never) = elected_with_work(&mut a, Duration::MAX).await;
    let mut c = e.join(OwnerId::new("c").unwrap());
    tokio::time::sleep(TTL).await;
    let at = Instant::now();
    assert!(a.handover(&OwnerId::new("c").unwrap(), TTL).await);
    assert_eq!(at.elapsed(), drain);
    let t2 = tokio::time::timeout(TTL, elected(&mut c))
        .await
        .expect("c leads");
    assert!(t2 > t1);
    assert!(at.elapsed() < drain + TTL / 2, "{:?}", at.elapsed());
}

#[tokio::test(start_paused = true)]
async fn resigning_drains_and_an_ignored_guard_costs_nothing() {
    let store = MemoryLeaseStore::new();
    let e = election(&store).with_drain_timeout(TTL * 3);
    let mut a = e.join(OwnerId::new("a").unwrap());
    let (_, stopped) = elected_with_work(&mut a, Duration::from_secs(2)).await;
    let at = Instant::now();
    a.resign().await;
    let returned = Instant::now();
    assert!(store.inspect(e.key()).await.unwrap().holder.is_none());
    let stopped = stopped.await.unwrap();
    assert_eq!(stopped - at, Duration::from_secs(2));
    assert!(
        returned >= stopped,
        "resigned {:?} early",
        stopped - returned
    );
    // A candidate that drops the guard with the event releases at once.
    let mut b = e.join(OwnerId::new("b").unwrap());
    elected(&mut b).await;
    let at = Instant::now();
    b.resign().await;
    assert!(
        at.elapsed() < Duration::from_millis(10),
        "{:?}",
        at.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_yields_to_a_preferred_candidate() {
    let store = MemoryLeaseStore::new();
    let e = election(&store).with_preferred(vec![OwnerId::new("p").unwrap()]);
    let mut a = e.join(OwnerId::new("a").unwrap());
    let t1 = elected(&mut a).await;
    tokio::time::sleep(TTL * 2).await;
    assert!(a.is_leader());
    let joined = Instant::now();
    let mut p = e.join(OwnerId::new("p").unwrap());
    let t2 = tokio::time::timeout(TTL * 2, elected(&mut p))
        .await
        .expect("p leads");
    assert!(t2 > t1);
    // within one renewal interval (the leader's check) and the handover
    assert!(
        joined.elapsed() <= TTL / 3 + Duration::from_millis(100),
        "{:?}",
        joined.elapsed()
    );
    match a.next_event().await.unwrap() {
        ElectionEvent::SteppedDown { reason, .. } => {
            assert_eq!(reason, StepDownReason::HandedOver)
        }
        other => panic!("{other:?}"),
    }
    // p keeps the lead; a does not take it back.
    tokio::time::sleep(TTL * 3).await;
    assert!(p.is_leader() && !a.is_leader());
}
