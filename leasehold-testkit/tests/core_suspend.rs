//! Host suspend: validity is judged on a clock that keeps counting while the
//! host sleeps. Tokio's clock (and the memory store, which runs on it) does not see the suspend,
//! exactly like `CLOCK_MONOTONIC`; a [`ManualClock`] jump plays the part of `CLOCK_BOOTTIME`.
//! The real store would have expired the lease during the suspend, so the holder must stop at once
//! even though a renewal sent now would still succeed against the memory store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::clock::ManualClock;
use leasehold_core::election::{Election, ElectionEvent, StepDownReason};
use leasehold_core::supervisor::{Health, LeaseGuard, LossReason, Supervisor, SupervisorConfig};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, KeyState, Lease, LeaseKey, LeaseStore,
    MemoryLeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result,
};
use tokio::time::{sleep, timeout};

const TTL: Duration = Duration::from_secs(3);

fn key() -> LeaseKey {
    LeaseKey::new("job").unwrap()
}

/// How soon after a resume the supervisor must have noticed it: its clock check interval (a
/// twentieth of the TTL), plus one tick of tokio's timer.
fn promptly() -> Duration {
    SupervisorConfig::new(TTL).clock_check_interval() + Duration::from_millis(1)
}

fn config(clock: &ManualClock) -> SupervisorConfig {
    SupervisorConfig::new(TTL).with_clock(Arc::new(clock.clone()))
}

async fn hold(s: &Supervisor) -> LeaseGuard {
    s.acquire(&key())
        .await
        .unwrap()
        .guard()
        .expect("a free key")
}

#[tokio::test(start_paused = true)]
async fn a_suspend_past_the_deadline_stops_the_holder_at_once() {
    let clock = ManualClock::new();
    let guard = hold(&Supervisor::new(MemoryLeaseStore::new(), config(&clock))).await;
    let view = guard.view();
    let work = guard.cancellation();
    sleep(Duration::from_millis(1500)).await; // one confirmed renewal
    assert!(guard.may_act());

    clock.jump(TTL * 10); // the host sleeps for ten TTLs
    assert!(!guard.may_act(), "may_act() true right after resume");
    assert!(
        !view.may_act(),
        "the work's view may_act() true after resume"
    );
    let health = timeout(promptly(), guard.lost())
        .await
        .expect("health not Lost within the clock check interval after resume");
    assert_eq!(health, Health::Lost(LossReason::DeadlineReached));
    assert!(work.is_cancelled(), "guarded work not cancelled");
}

#[tokio::test(start_paused = true)]
async fn a_suspend_between_the_loss_deadline_and_the_deadline_stops_the_holder() {
    let clock = ManualClock::new();
    let guard = hold(&Supervisor::new(MemoryLeaseStore::new(), config(&clock))).await;
    // Just past the loss deadline (the deadline minus a tenth of the TTL), before the deadline.
    let remaining = guard.lease().remaining();
    clock.jump(remaining - TTL / 20);
    assert!(!guard.may_act(), "may_act() true past the loss deadline");
    let health = timeout(promptly(), guard.lost()).await.expect("not Lost");
    assert_eq!(health, Health::Lost(LossReason::DeadlineReached));
}

#[tokio::test(start_paused = true)]
async fn a_suspend_cuts_a_drain_short() {
    assert_eq!(promptly(), Duration::from_millis(151));
    let clock = ManualClock::new();
    let mem = MemoryLeaseStore::new();
    let guard = hold(&Supervisor::new(mem.clone(), config(&clock))).await;
    let jump = async {
        sleep(Duration::from_millis(500)).await;
        clock.jump(TTL * 10);
        tokio::time::Instant::now()
    };
    let drain = async {
        let out = guard.drain_and_release(std::future::pending::<()>()).await;
        (out, tokio::time::Instant::now())
    };
    let (jumped_at, (out, drained_at)) = tokio::join!(jump, drain);
    // The work was cut off (the memory store did not see the suspend, so it may still answer
    // the release; a real store would say NotHeld).
    assert_eq!(out.unwrap().0, None);
    assert!(
        drained_at - jumped_at <= promptly(),
        "the drain ran {:?} past the resume",
        drained_at - jumped_at
    );
}

#[tokio::test(start_paused = true)]
async fn a_short_suspend_keeps_the_lease() {
    let clock = ManualClock::new();
    let mem = MemoryLeaseStore::new();
    let guard = hold(&Supervisor::new(mem.clone(), config(&clock))).await;
    for _ in 0..10 {
        sleep(Duration::from_millis(700)).await;
        clock.jump(Duration::from_millis(300)); // well inside the loss budget
        assert!(guard.may_act());
    }
    assert_eq!(guard.health(), Health::Held);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// A store whose acquire is granted, then the host sleeps before the answer is handled.
#[derive(Debug, Clone)]
struct SuspendDuringAcquire {
    inner: MemoryLeaseStore,
    clock: ManualClock,
    by: Duration,
}

#[async_trait]
impl LeaseStore for SuspendDuringAcquire {
    fn backend(&self) -> &'static str {
        "suspend-during-acquire"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let out = self.inner.acquire(req).await;
        self.clock.jump(self.by);
        out
    }
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.inner.inspect(key).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_suspend_during_the_acquire_call_gives_a_guard_born_lost() {
    let clock = ManualClock::new();
    let store = SuspendDuringAcquire {
        inner: MemoryLeaseStore::new(),
        clock: clock.clone(),
        by: TTL,
    };
    let guard = hold(&Supervisor::new(store, config(&clock))).await;
    assert!(!guard.may_act(), "a guard granted before a suspend may act");
    assert_eq!(guard.health(), Health::Lost(LossReason::DeadlineReached));
    assert!(guard.cancellation().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_suspended_leader_steps_down() {
    let clock = ManualClock::new();
    let election = Election::new(
        MemoryLeaseStore::new(),
        key(),
        config(&clock).with_acquire_wait(TTL),
    );
    let mut me = election.join(OwnerId::with_label("a"));
    let Some(ElectionEvent::Elected { term, work, .. }) = me.next_event().await else {
        panic!("not elected")
    };
    sleep(Duration::from_secs(2)).await;
    clock.jump(TTL * 10);
    let event = timeout(promptly(), me.next_event())
        .await
        .expect("the leader did not step down within the clock check interval after resume");
    match event {
        Some(ElectionEvent::SteppedDown {
            term: ended,
            reason,
        }) => {
            assert_eq!(ended, term);
            assert_eq!(reason, StepDownReason::Lost(LossReason::DeadlineReached));
        }
        other => panic!("expected SteppedDown, got {other:?}"),
    }
    assert!(work.is_cancelled(), "leader-only work not cancelled");
}
