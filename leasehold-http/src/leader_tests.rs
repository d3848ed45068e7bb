//! Unit tests of the health checks and the leadership gate.

use super::*;

fn lease(token: u64, ttl: Duration) -> leasehold_core::Result<Lease> {
    Ok(Lease::resume(
        LeaseKey::new("ctl")?,
        OwnerId::new("pod-a-1")?,
        FencingToken::new(token)?,
        ttl,
    ))
}

/// A leader whose lease's deadline passes without a confirmed renewal (the campaign is
/// wedged: its role still says leader) is `stalled` and unhealthy; within the tolerance, or
/// after a confirmed renewal, it is healthy; a follower is healthy.
#[tokio::test(start_paused = true)]
async fn a_leader_past_its_deadline_is_stalled() -> leasehold_core::Result<()> {
    let tracker = LeaderTracker::new();
    let l = lease(7, Duration::from_secs(3))?;
    tracker.hook().acquired(&l, Duration::ZERO);
    let (role_tx, role) = watch::channel(Role::Leader { term: l.token() });
    let check = HealthCheck::new(Source::Candidate {
        key: l.key().clone(),
        owner: l.owner().clone(),
        id: OwnerId::new("pod-a")?,
        role,
        tracker: tracker.clone(),
    });
    let lenient = check.clone().with_tolerance(Duration::from_secs(2));
    let r = check.report();
    assert!(r.healthy && r.state == "leader", "{r:?}");
    assert_eq!(r.token, Some(l.token()));

    tokio::time::advance(l.remaining() + Duration::from_millis(1)).await;
    let r = check.report();
    assert!(!r.healthy && r.state == "stalled", "{r:?}");
    assert_eq!(
        r.response::<Bytes>().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert!(lenient.report().healthy, "within the tolerance");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(!lenient.report().healthy, "past the tolerance");

    // A confirmed renewal moves the deadline: healthy again.
    let renewed = l.renewed(Duration::from_secs(3), Instant::now());
    tracker.hook().renewal(
        &renewed,
        RenewalResult::Confirmed {
            remaining_before: Duration::ZERO,
        },
        Duration::ZERO,
    );
    assert!(check.report().healthy);
    // An unconfirmed renewal does not.
    tokio::time::advance(Duration::from_secs(4)).await;
    tracker
        .hook()
        .renewal(&renewed, RenewalResult::TimedOut, Duration::ZERO);
    assert_eq!(check.report().state, "stalled");

    role_tx.send_replace(Role::Follower);
    let r = check.report();
    assert!(r.healthy && r.state == "follower", "{r:?}");
    assert!(!check.clone().require_leading().report().healthy);
    Ok(())
}

/// The tracker forgets a lease when it ends, and passes every call on to the wrapped hook.
#[tokio::test(start_paused = true)]
async fn the_tracker_forgets_ended_leases_and_passes_calls_on() -> leasehold_core::Result<()> {
    #[derive(Debug, Default)]
    struct Count(std::sync::atomic::AtomicUsize);
    impl Hook for Count {
        fn acquired(&self, _: &Lease, _: Duration) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        fn ended(&self, _: &Lease, _: Duration, _: Option<ReleaseOutcome>) {
            self.0.fetch_add(10, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let count = Arc::new(Count::default());
    let tracker = LeaderTracker::wrapping(count.clone());
    let l = lease(3, Duration::from_secs(3))?;
    tracker.hook().acquired(&l, Duration::ZERO);
    assert!(tracker.record(l.key(), l.owner()).is_some());
    tracker
        .hook()
        .ended(&l, Duration::ZERO, Some(ReleaseOutcome::Released));
    assert!(tracker.record(l.key(), l.owner()).is_none());
    assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 11);
    Ok(())
}

/// A tolerance that overflows the clock means "never stalled", not a panic.
#[tokio::test(start_paused = true)]
async fn a_huge_tolerance_never_stalls() -> leasehold_core::Result<()> {
    let tracker = LeaderTracker::new();
    let l = lease(1, Duration::from_millis(10))?;
    tracker.hook().acquired(&l, Duration::ZERO);
    let (_tx, role) = watch::channel(Role::Leader { term: l.token() });
    let check = HealthCheck::new(Source::Candidate {
        key: l.key().clone(),
        owner: l.owner().clone(),
        id: OwnerId::new("pod-a")?,
        role,
        tracker,
    })
    .with_tolerance(Duration::MAX);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(check.report().healthy);
    Ok(())
}
