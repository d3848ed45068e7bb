//! Settings never panic: every leasehold-core builder that takes a duration or a count, given zero,
//! one nanosecond, `Duration::MAX`, `usize::MAX`-sized inputs or anything between, gives a typed
//! error or works. (`SupervisorConfig` has its own proptest in `src/supervisor/tests.rs`.)

use std::time::Duration;

use leasehold_core::backend::{default_drift, ttl_millis, ttl_secs, validate_ttl};
use leasehold_core::election::{Election, ElectionEvent, Role};
use leasehold_core::supervisor::SupervisorConfig;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencingToken, Lease, LeaseKey, LeaseStore, MAX_TTL,
    MemoryLeaseStore, OwnerId,
};
use proptest::prelude::*;

/// Durations from the edges (zero, one nanosecond, `MAX_TTL`, `Duration::MAX`) and between.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::from_millis(1)),
        Just(MAX_TTL),
        Just(MAX_TTL + Duration::from_nanos(1)),
        Just(Duration::MAX),
        (0u64..10_000).prop_map(Duration::from_millis),
        (0u64..100_000).prop_map(Duration::from_secs),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// TTLs: mostly ones that can work, plus the edges.
fn ttl() -> impl Strategy<Value = Duration> {
    prop_oneof![
        3 => (1u64..60_000).prop_map(Duration::from_millis),
        1 => duration(),
    ]
}

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn key() -> LeaseKey {
    LeaseKey::new("settings").unwrap()
}

/// An acquire, renew and release with any TTL and drift margin: a typed error that changed
/// nothing, or a lease whose deadline is no later than `sent + ttl`.
async fn acquire_request(ttl: Duration, drift: Option<Duration>) -> Result<(), TestCaseError> {
    let mem = MemoryLeaseStore::new();
    let mut req = AcquireRequest::new(key(), OwnerId::random(), ttl);
    if let Some(d) = drift {
        req = req.with_drift_margin(d);
        prop_assert_eq!(req.drift_margin(), d);
    }
    let sent = tokio::time::Instant::now();
    match mem.acquire(&req).await {
        Err(e) => {
            prop_assert!(e.is_invalid_input(), "not a typed input error: {e}");
            prop_assert!(validate_ttl(ttl, Duration::ZERO).is_err());
            prop_assert!(mem.inspect(&key()).await.unwrap().last_token.is_none());
        }
        Ok(AcquireOutcome::Acquired(lease)) => {
            prop_assert!(validate_ttl(ttl, Duration::ZERO).is_ok());
            prop_assert!(lease.deadline() <= sent + ttl);
            let _ = lease.is_valid();
            let _ = lease.remaining();
            prop_assert!(mem.renew(&lease).await.is_ok());
            prop_assert!(mem.release(&lease).await.is_ok());
        }
        Ok(other) => return Err(TestCaseError::fail(format!("{other:?}"))),
    }
    Ok(())
}

/// A resumed lease with any TTL renews or gives a typed error.
async fn resumed(ttl: Duration) -> Result<(), TestCaseError> {
    let mem = MemoryLeaseStore::new();
    let lease = Lease::resume(key(), OwnerId::random(), FencingToken::MIN, ttl);
    prop_assert!(!lease.is_valid());
    match mem.renew(&lease).await {
        Err(e) => prop_assert!(e.is_invalid_input(), "{e}"),
        Ok(_) => prop_assert!(validate_ttl(ttl, Duration::ZERO).is_ok()),
    }
    let renewed = lease.renewed(ttl, tokio::time::Instant::now());
    let _ = renewed.remaining();
    Ok(())
}

#[derive(Debug, Clone)]
struct ElectionSetup {
    ttl: Duration,
    acquire_wait: Option<Duration>,
    op_timeout: Option<Duration>,
    drain: Option<Duration>,
    bound: Option<Duration>,
    preferred: usize,
    within: Duration,
}

fn election_setup() -> impl Strategy<Value = ElectionSetup> {
    (
        ttl(),
        proptest::option::of(duration()),
        proptest::option::of(duration()),
        proptest::option::of(duration()),
        proptest::option::of(duration()),
        0usize..4,
        duration(),
    )
        .prop_map(
            |(ttl, acquire_wait, op_timeout, drain, bound, preferred, within)| ElectionSetup {
                ttl,
                acquire_wait,
                op_timeout,
                drain,
                bound,
                preferred,
                within,
            },
        )
}

/// An election with any settings: joining gives a typed error exactly when the supervisor's
/// settings are invalid; otherwise the candidate leads, hands over (or refuses a bound it cannot
/// reserve) and resigns.
async fn election(s: ElectionSetup) -> Result<(), TestCaseError> {
    let mut config = SupervisorConfig::new(s.ttl);
    if let Some(d) = s.acquire_wait {
        config = config.with_acquire_wait(d);
    }
    if let Some(d) = s.op_timeout {
        config = config.with_op_timeout(d);
    }
    let valid = config.validate().is_ok();
    let mut e = Election::new(MemoryLeaseStore::new(), key(), config);
    if let Some(d) = s.drain {
        e = e.with_drain_timeout(d);
        prop_assert_eq!(e.drain_timeout(), d);
    }
    if let Some(d) = s.bound {
        e = e.with_reservation_bound(d);
        prop_assert_eq!(e.reservation_bound(), d);
    }
    let preferred: Vec<OwnerId> = (0..s.preferred)
        .map(|i| OwnerId::new(format!("p{i}")).unwrap())
        .collect();
    e = e.with_preferred(preferred);
    let mut c = match e.try_join(OwnerId::new("a").unwrap()) {
        Err(err) => {
            prop_assert!(!valid, "refused valid settings: {err}");
            prop_assert!(err.is_invalid_input(), "not a typed input error: {err}");
            return Ok(());
        }
        Ok(c) => {
            prop_assert!(valid, "joined with invalid settings");
            c
        }
    };
    // Elected (the drain guard dropped with the event, so a planned end does not wait).
    let ttl = s.ttl;
    let first = tokio::time::timeout(ttl.saturating_mul(4), c.next_event()).await;
    let elected = matches!(first, Ok(Some(ElectionEvent::Elected { .. })));
    prop_assert!(elected, "{first:?}");
    drop(first);
    let leads = matches!(c.role(), Role::Leader { .. });
    prop_assert!(leads, "{:?}", c.role());
    let handed = c.handover(&OwnerId::new("ghost").unwrap(), s.within).await;
    // A reservation the store cannot grant (over a day) is refused; the leader keeps leading.
    prop_assert_eq!(handed, !c.is_leader());
    c.resign().await;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn acquire_requests_with_any_ttl_and_drift_margin(ttl in duration(), drift in proptest::option::of(duration())) {
        paused().block_on(acquire_request(ttl, drift))?;
    }

    #[test]
    fn resumed_leases_with_any_ttl(ttl in duration()) {
        paused().block_on(resumed(ttl))?;
    }

    #[test]
    fn ttl_helpers_never_panic(ttl in duration(), min in duration()) {
        let _ = default_drift(ttl);
        prop_assert_eq!(validate_ttl(ttl, min).is_ok(), ttl >= min.max(Duration::from_millis(1)) && ttl <= MAX_TTL);
        for r in [ttl_millis(ttl), ttl_secs(ttl)] {
            match r {
                Ok(t) => prop_assert!(t.granted() >= ttl),
                Err(e) => prop_assert!(e.is_invalid_input(), "{e}"),
            }
        }
    }

    #[test]
    fn elections_with_any_settings(s in election_setup()) {
        paused().block_on(election(s))?;
    }

    #[test]
    fn instance_owners_and_reserved_keys_from_any_text(id in ".{0,200}", role in ".{0,220}") {
        match OwnerId::instance(&id) {
            Ok(o) => {
                prop_assert_eq!(o.identity(), id.as_str());
                let back = o.to_identity();
                prop_assert_eq!(back.as_str(), id.as_str());
            }
            Err(e) => prop_assert!(e.is_invalid_input(), "{e}"),
        }
        match key().reserved(&role) {
            Ok(k) => {
                prop_assert!(k.is_reserved());
                prop_assert!(LeaseKey::new(k.as_str()).is_err());
            }
            Err(e) => prop_assert!(e.is_invalid_input(), "{e}"),
        }
    }
}

#[test]
fn many_preferred_candidates_are_accepted() {
    paused().block_on(async {
        let ttl = Duration::from_secs(3);
        let preferred: Vec<OwnerId> = (0..1000)
            .map(|i| OwnerId::new(format!("p{i}")).unwrap())
            .collect();
        let e = Election::new(MemoryLeaseStore::new(), key(), SupervisorConfig::new(ttl))
            .with_preferred(preferred);
        let mut c = e.try_join(OwnerId::new("p999").unwrap()).unwrap();
        let first = tokio::time::timeout(ttl * 4, c.next_event()).await;
        assert!(
            matches!(first, Ok(Some(ElectionEvent::Elected { .. }))),
            "{first:?}"
        );
        c.resign().await;
    });
}
