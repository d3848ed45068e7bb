//! The supervisor and leader election in paused tokio time, against the memory store and the
//! fault-injecting wrapper.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::election::{Election, ElectionEvent, StepDownReason};
use leasehold_core::supervisor::{
    Acquisition, Health, LeaseGuard, LossReason, Supervisor, SupervisorConfig,
};
use leasehold_core::{
    AcquireRequest, FencedResource, LeaseKey, LeaseStore, MemoryFencedResource, MemoryLeaseStore,
    OwnerId, ReleaseOutcome,
};
use leasehold_testkit::faulty::{Fault, FaultyStore, Operation};
use tokio::time::{Instant, advance, sleep};

const TTL: Duration = Duration::from_secs(3);

fn key() -> LeaseKey {
    LeaseKey::new("job").unwrap()
}

fn sup(store: impl LeaseStore + 'static) -> Supervisor {
    Supervisor::new(store, SupervisorConfig::new(TTL))
}

/// Acquires `k` through `s`, which must grant it.
async fn hold(s: &Supervisor, k: &LeaseKey) -> LeaseGuard {
    s.acquire(k).await.unwrap().guard().expect("a free key")
}

async fn held(store: &MemoryLeaseStore) -> Option<leasehold_core::FencingToken> {
    store.inspect(&key()).await.unwrap().holder.map(|h| h.token)
}

#[tokio::test(start_paused = true)]
async fn renewals_keep_the_lease_for_many_ttls() {
    let mem = MemoryLeaseStore::new();
    let faulty = FaultyStore::new(mem.clone());
    let guard = hold(&sup(faulty.clone()), &key()).await;
    for _ in 0..30 {
        sleep(Duration::from_secs(1)).await;
        assert_eq!(held(&mem).await, Some(guard.token()));
        assert_eq!(guard.health(), Health::Held);
    }
    let renews = faulty.calls(Operation::Renew);
    assert!(
        (28..=31).contains(&renews),
        "expected a renewal per TTL/3, got {renews} in 30 s"
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(held(&mem).await, None);
}

#[tokio::test(start_paused = true)]
async fn hanging_store_goes_at_risk_then_lost_before_store_expiry() {
    let mem = MemoryLeaseStore::new();
    let faulty = FaultyStore::new(mem.clone());
    let guard = hold(&sup(faulty.clone()), &key()).await;
    sleep(Duration::from_millis(1500)).await; // one confirmed renewal at 1 s
    faulty.set(Operation::Renew, Fault::Hang);
    let store_expiry = {
        let h = mem.inspect(&key()).await.unwrap().holder.unwrap();
        Instant::now() + h.remaining
    };
    let mut health = guard.subscribe();
    let work = guard.run(std::future::pending::<()>());
    let watcher = async {
        let mut seen = vec![];
        loop {
            health.changed().await.unwrap();
            let h = *health.borrow();
            seen.push((h, Instant::now()));
            if h.is_final() {
                return seen;
            }
        }
    };
    let (cancelled, seen) = tokio::join!(async { (work.await, Instant::now()) }, watcher);
    let (result, cancelled_at) = cancelled;
    assert_eq!(result, Err(LossReason::DeadlineReached));
    assert_eq!(seen.first().map(|s| s.0), Some(Health::AtRisk), "{seen:?}");
    assert_eq!(
        seen.last().map(|s| s.0),
        Some(Health::Lost(LossReason::DeadlineReached))
    );
    assert!(
        cancelled_at < guard.lease().deadline(),
        "work cancelled at or after the local deadline"
    );
    assert!(
        cancelled_at < store_expiry,
        "work cancelled after the store-side expiry"
    );
    // The store still holds it at that moment: we gave up first.
    assert_eq!(held(&mem).await, Some(guard.token()));
}

#[tokio::test(start_paused = true)]
async fn applied_but_unanswered_renewal_is_never_silently_held() {
    let mem = MemoryLeaseStore::new();
    let faulty = FaultyStore::new(mem.clone());
    let guard = hold(&sup(faulty.clone()), &key()).await;
    let deadline = guard.lease().deadline();
    faulty.set(Operation::Renew, Fault::DropResponse);
    let mut rx = guard.subscribe();
    let mut last_held = Instant::now();
    while !rx.borrow().is_final() {
        if *rx.borrow() == Health::Held {
            last_held = Instant::now();
        }
        rx.changed().await.unwrap();
    }
    assert!(
        last_held < deadline,
        "reported Held past the local deadline"
    );
    assert_eq!(guard.health(), Health::Lost(LossReason::DeadlineReached));
    assert!(Instant::now() < deadline);
    // The store did extend it (the renewal was applied): it outlives our belief.
    let h = mem.inspect(&key()).await.unwrap().holder.unwrap();
    assert!(Instant::now() + h.remaining > deadline);
}

#[tokio::test(start_paused = true)]
async fn refused_renewal_is_lost_at_once() {
    let mem = MemoryLeaseStore::new();
    let s = sup(mem.clone());
    let guard = hold(&s, &key()).await;
    // The same owner re-acquires elsewhere: the guard's token is stale, its renewal is refused.
    let again = mem
        .acquire(&AcquireRequest::new(key(), s.owner().clone(), TTL))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(again.token() > guard.token());
    let t0 = Instant::now();
    let h = guard.lost().await;
    assert_eq!(h, Health::Lost(LossReason::RenewalRefused));
    assert!(
        Instant::now() - t0 <= SupervisorConfig::new(TTL).renew_interval(),
        "not lost at the first refused renewal"
    );
    assert!(guard.cancellation().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_guard_releases_in_the_background() {
    let mem = MemoryLeaseStore::new();
    let guard = hold(&sup(mem.clone()), &key()).await;
    let work = guard.cancellation();
    drop(guard);
    tokio::time::timeout(Duration::from_millis(50), work.cancelled())
        .await
        .expect("work cancelled on drop");
    let deadline = Instant::now() + Duration::from_millis(100);
    while held(&mem).await.is_some() {
        assert!(Instant::now() < deadline, "drop did not release");
        sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn bounded_wait_gives_up_and_watch_wakes_on_release() {
    let mem = MemoryLeaseStore::new();
    let a = hold(&sup(mem.clone()), &key()).await;
    let waiter = Supervisor::new(
        mem.clone(),
        SupervisorConfig::new(TTL).with_acquire_wait(Duration::from_secs(2)),
    );
    let t0 = Instant::now();
    match waiter.acquire(&key()).await.unwrap() {
        Acquisition::NotAcquired { holder, waited } => {
            assert_eq!(holder.map(|h| h.token), Some(a.token()));
            assert!(
                waited >= Duration::from_secs(2)
                    && Instant::now() - t0 < Duration::from_millis(2100)
            );
        }
        other => panic!("expected NotAcquired, got {other:?}"),
    }
    let waiter = Supervisor::new(
        mem.clone(),
        SupervisorConfig::new(TTL)
            .with_acquire_wait(Duration::from_secs(30))
            .with_backoff(Duration::from_secs(1), Duration::from_secs(1)),
    );
    let handle = tokio::spawn(async move {
        let g = hold(&waiter, &key()).await;
        (Instant::now(), g.token())
    });
    sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    assert_eq!(a.release().await.unwrap(), ReleaseOutcome::Released);
    let (got_at, token) = handle.await.unwrap();
    assert!(
        got_at - released_at < Duration::from_millis(10),
        "waiter not woken by the watch: {:?}",
        got_at - released_at
    );
    assert!(token > leasehold_core::FencingToken::MIN);
}

#[tokio::test(start_paused = true)]
async fn immediate_fencing_installs_before_handing_out_the_guard() {
    let mem = MemoryLeaseStore::new();
    let res = MemoryFencedResource::new();
    let s = sup(mem.clone()).with_fence_on_acquire(Arc::new(res.clone()));
    let g = hold(&s, &key()).await;
    assert_eq!(res.read(&key()).await.unwrap().high_water, Some(g.token()));
}

#[tokio::test(start_paused = true)]
async fn one_leader_at_a_time_with_increasing_terms_through_forced_losses() {
    let mem = MemoryLeaseStore::new();
    let cfg = SupervisorConfig::new(TTL).with_acquire_wait(TTL);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut stores = Vec::new();
    let mut candidates = Vec::new();
    for i in 0..5 {
        let f = FaultyStore::new(mem.clone());
        stores.push(f.clone());
        let election = Election::new(f, key(), cfg.clone());
        let mut c = election.join(OwnerId::with_label(&format!("c{i}")));
        let tx = tx.clone();
        candidates.push(tokio::spawn(async move {
            while let Some(ev) = c.next_event().await {
                let _ = tx.send((i, ev, Instant::now()));
            }
        }));
    }
    let mut intervals: Vec<(
        usize,
        leasehold_core::FencingToken,
        Instant,
        Option<Instant>,
    )> = Vec::new();
    let mut losses = 0;
    while losses < 8 {
        let (i, ev, at) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("election stalled")
            .unwrap();
        match ev {
            ElectionEvent::Elected { term, .. } => {
                intervals.push((i, term, at, None));
                // Force this leader to lose: its store stops answering (a partition); everyone
                // else is healed so that another candidate takes over after the expiry.
                for (j, s) in stores.iter().enumerate() {
                    if j == i {
                        s.set_all(Fault::Hang);
                    } else {
                        s.heal();
                    }
                }
            }
            ElectionEvent::SteppedDown { term, reason } => {
                assert_eq!(reason, StepDownReason::Lost(LossReason::DeadlineReached));
                let iv = intervals
                    .iter_mut()
                    .find(|iv| iv.0 == i && iv.1 == term)
                    .expect("stepped down without election");
                iv.3 = Some(at);
                losses += 1;
            }
            _ => {}
        }
    }
    let leaders: std::collections::HashSet<usize> = intervals.iter().map(|iv| iv.0).collect();
    assert!(
        leaders.len() >= 3,
        "leadership did not move between candidates: {intervals:?}"
    );
    for w in intervals.windows(2) {
        assert!(w[1].1 > w[0].1, "terms did not increase: {intervals:?}");
        let prev_end = w[0].3.expect("previous leader stepped down");
        assert!(w[1].2 > prev_end, "two leaders at once: {intervals:?}");
    }
    for c in candidates {
        c.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn resigned_leader_is_replaced_without_waiting_for_the_ttl() {
    let mem = MemoryLeaseStore::new();
    let long = Duration::from_secs(60);
    let election = Election::new(
        mem.clone(),
        key(),
        SupervisorConfig::new(long).with_acquire_wait(long),
    );
    let mut a = election.join(OwnerId::with_label("a"));
    let Some(ElectionEvent::Elected { term: ta, work, .. }) = a.next_event().await else {
        panic!("a not elected")
    };
    let mut b = election.join(OwnerId::with_label("b"));
    let mut observer = election.observe();
    sleep(Duration::from_secs(1)).await;
    assert!(!b.is_leader());
    let t0 = Instant::now();
    a.resign().await;
    assert!(
        work.is_cancelled(),
        "leader-only work not cancelled on resign"
    );
    let Some(ElectionEvent::Elected { term: tb, .. }) = b.next_event().await else {
        panic!("b not elected")
    };
    assert!(tb > ta);
    assert!(
        Instant::now() - t0 < Duration::from_millis(100),
        "takeover waited {:?}",
        Instant::now() - t0
    );
    let seen = loop {
        let l = observer.changed().await.unwrap();
        if l.term == Some(tb) {
            break l;
        }
    };
    assert_eq!(seen.leader.as_ref(), Some(b.id()));
    advance(Duration::from_millis(1)).await;
}

/// Store renew calls per renewal interval over ten intervals, after which every guard must
/// still be held.
async fn renew_calls_per_interval(
    faulty: &FaultyStore<MemoryLeaseStore>,
    guards: &[LeaseGuard],
    interval: Duration,
) -> f64 {
    let before = faulty.calls(Operation::Renew);
    let intervals = 10;
    sleep(interval * intervals).await;
    let calls = faulty.calls(Operation::Renew) - before;
    assert!(
        guards.iter().all(|g| g.health() == Health::Held),
        "a batched lease was lost"
    );
    calls as f64 / f64::from(intervals)
}

#[tokio::test(start_paused = true)]
async fn batched_renewals_coalesce_thousands_of_leases() {
    let mem = MemoryLeaseStore::new();
    let faulty = FaultyStore::new(mem.clone());
    let cfg = SupervisorConfig::new(TTL).with_renewal_batching(Duration::from_millis(20));
    let s = Supervisor::new(faulty.clone(), cfg);
    let mut guards = Vec::new();
    for i in 0..2000 {
        // acquired over half a second, so renewals start out of phase
        if i % 200 == 0 {
            sleep(Duration::from_millis(50)).await;
        }
        let k = LeaseKey::new(format!("k{i}")).unwrap();
        guards.push(hold(&s, &k).await);
    }
    let per_interval = renew_calls_per_interval(
        &faulty,
        &guards,
        SupervisorConfig::new(TTL).renew_interval(),
    )
    .await;
    assert!(
        per_interval <= 10.0,
        "{per_interval} renew round trips per interval for 2000 leases"
    );
    assert!(per_interval >= 1.0, "no renewals happened");
    for g in &guards {
        assert_eq!(
            mem.inspect(g.key()).await.unwrap().holder.map(|h| h.token),
            Some(g.token())
        );
    }
}

#[tokio::test(start_paused = true)]
async fn batched_renewals_acquired_over_a_whole_interval_settle_into_two_waves() {
    let mem = MemoryLeaseStore::new();
    let faulty = FaultyStore::new(mem.clone());
    let cfg = SupervisorConfig::new(TTL).with_renewal_batching(Duration::from_millis(20));
    let interval = cfg.renew_interval();
    let drift = cfg.drift_margin();
    let s = Supervisor::new(faulty.clone(), cfg);
    let mut guards = Vec::new();
    // 1,000 leases acquired over 90% of an interval: with the window alone they would renew
    // in about 45 waves per interval, forever.
    for i in 0..1000 {
        if i % 10 == 0 {
            sleep(interval * 9 / 1000).await;
        }
        let k = LeaseKey::new(format!("w{i}")).unwrap();
        guards.push(hold(&s, &k).await);
    }
    // Let every guard renew once, onto the grid.
    sleep(interval * 2).await;
    let per_interval = renew_calls_per_interval(&faulty, &guards, interval).await;
    assert!(
        (1.0..=2.2).contains(&per_interval),
        "{per_interval} renew round trips per interval for 1000 leases (expected two waves)"
    );
    // Every lease still renews at least once per interval: its store expiry keeps moving.
    let renews_before = faulty.calls(Operation::Renew);
    for g in &guards {
        let l = g.lease();
        assert!(
            l.remaining() + drift + interval + Duration::from_millis(100) > TTL,
            "{}: {:?} left",
            g.key(),
            l.remaining()
        );
    }
    assert_eq!(faulty.calls(Operation::Renew), renews_before);
}

#[tokio::test(start_paused = true)]
async fn loss_is_published_a_tenth_of_the_ttl_before_the_local_deadline() {
    let mem = MemoryLeaseStore::new();
    let faulty = FaultyStore::new(mem.clone());
    let guard = hold(&sup(faulty.clone()), &key()).await;
    faulty.set(Operation::Renew, Fault::Hang);
    let deadline = guard.lease().deadline();
    assert_eq!(
        guard.lost().await,
        Health::Lost(LossReason::DeadlineReached)
    );
    // The default lead leaves the cancelled work (and a late timer on a busy host) a tenth of
    // the TTL before the local deadline.
    assert_eq!(deadline - Instant::now(), TTL / 10);
}

#[tokio::test(start_paused = true)]
async fn drain_and_release_returns_finished_work_and_bounds_endless_work() {
    let mem = MemoryLeaseStore::new();
    let config = SupervisorConfig::new(TTL).with_loss_lead(Duration::from_millis(500));
    let guard = hold(&Supervisor::new(mem.clone(), config.clone()), &key()).await;
    let (out, released) = guard
        .drain_and_release(async {
            sleep(Duration::from_secs(1)).await;
            7
        })
        .await
        .unwrap();
    assert_eq!((out, released), (Some(7), ReleaseOutcome::Released));
    assert_eq!(held(&mem).await, None);

    // Endless work is cut off at the drain-start lease's deadline minus the configured lead,
    // even though renewal goes on meanwhile; then the lease is released.
    let guard = hold(&Supervisor::new(mem.clone(), config), &key()).await;
    let until = guard.lease().deadline() - Duration::from_millis(500);
    let (out, released) = guard
        .drain_and_release(std::future::pending::<()>())
        .await
        .unwrap();
    assert_eq!((out, released), (None, ReleaseOutcome::Released));
    let late = Instant::now() - until;
    assert!(late < Duration::from_millis(5), "cut off {late:?} late");
    assert_eq!(held(&mem).await, None);
}
