//! The supervisor's timing, in tokio paused time, against the in-memory reference store wrapped
//! in a store whose renewals and releases can be made to fail or hang: when it renews, that loss
//! is signalled before the store would expire the lease, that failed or unanswered renewals turn
//! the lease at risk and then lost, that a release stops `may_act` before the store answers, and
//! that a host suspend (a [`ManualClock`] jump) is seen at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::clock::ManualClock;
use leasehold_core::hook::Hook;
use leasehold_core::supervisor::{Health, LeaseGuard, LossReason, Supervisor, SupervisorConfig};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, KeyState, Lease, LeaseKey, LeaseStore,
    MemoryLeaseStore, ReleaseOutcome, RenewOutcome, Result,
};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(3);

/// What a scripted call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Passed to the memory store.
    Pass,
    /// Fails with a retryable error without reaching the store.
    Fail,
    /// Never answers (and never reaches the store).
    Hang,
}

/// The memory store, with renewals and releases that can fail or hang, and a record of when
/// each renewal was sent (on tokio's clock).
#[derive(Debug, Clone)]
struct Scripted {
    mem: MemoryLeaseStore,
    renew: Arc<Mutex<Mode>>,
    release: Arc<Mutex<Mode>>,
    renewals: Arc<Mutex<Vec<Instant>>>,
    release_sent: Arc<Notify>,
}

impl Scripted {
    fn new() -> Self {
        Scripted {
            mem: MemoryLeaseStore::new(),
            renew: Arc::new(Mutex::new(Mode::Pass)),
            release: Arc::new(Mutex::new(Mode::Pass)),
            renewals: Arc::new(Mutex::new(Vec::new())),
            release_sent: Arc::new(Notify::new()),
        }
    }

    fn renewals(&self) -> Vec<Instant> {
        self.renewals.lock().unwrap().clone()
    }

    fn set_renew(&self, m: Mode) {
        *self.renew.lock().unwrap() = m;
    }

    fn set_release(&self, m: Mode) {
        *self.release.lock().unwrap() = m;
    }

    async fn act<T>(&self, mode: Mode, pass: impl Future<Output = Result<T>>) -> Result<T> {
        match mode {
            Mode::Pass => pass.await,
            Mode::Fail => Err(Error::Timeout {
                backend: "scripted",
                operation: "scripted",
                after: Duration::ZERO,
            }),
            Mode::Hang => std::future::pending().await,
        }
    }
}

#[async_trait]
impl LeaseStore for Scripted {
    fn backend(&self) -> &'static str {
        "scripted"
    }
    fn capabilities(&self) -> Capabilities {
        self.mem.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.mem.acquire(req).await
    }
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        self.renewals.lock().unwrap().push(Instant::now());
        let mode = *self.renew.lock().unwrap();
        self.act(mode, self.mem.renew(lease)).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.release_sent.notify_one();
        let mode = *self.release.lock().unwrap();
        self.act(mode, self.mem.release(lease)).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.mem.inspect(key).await
    }
}

/// Records every health change, with the tokio instant it happened at.
#[derive(Debug, Default)]
struct Changes(Mutex<Vec<(Instant, Health)>>);

impl Hook for Changes {
    fn health_changed(&self, _: &Lease, _: Health, to: Health) {
        self.0.lock().unwrap().push((Instant::now(), to));
    }
}

impl Changes {
    fn seen(&self) -> Vec<Health> {
        self.0.lock().unwrap().iter().map(|(_, h)| *h).collect()
    }
}

fn key() -> LeaseKey {
    LeaseKey::new("timing").unwrap()
}

async fn hold(sup: &Supervisor) -> LeaseGuard {
    sup.acquire(&key())
        .await
        .unwrap()
        .guard()
        .expect("a free key")
}

/// The store's view: is the lease with `guard`'s token still held there?
async fn store_holds(store: &Scripted, guard: &LeaseGuard) -> bool {
    let state = store.mem.inspect(&key()).await.unwrap();
    state.holder.is_some_and(|h| h.token == guard.token())
}

/// Every wait in these tests is bounded: a broken supervisor fails a test, it does not hang it.
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    timeout(TTL * 4, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within four TTLs"))
}

/// Tokio's timer fires on whole milliseconds: an instant is "on time" if it is at most 1 ms late.
fn assert_at(what: &str, at: Instant, expected: Instant) {
    assert!(
        at >= expected && at <= expected + Duration::from_millis(1),
        "{what} at {:?} after the expected instant (negative: before)",
        at.checked_duration_since(expected)
            .map(|d| format!("+{d:?}"))
            .unwrap_or_else(|| format!("-{:?}", expected - at))
    );
}

#[tokio::test(start_paused = true)]
async fn renewals_are_sent_every_third_of_the_ttl() {
    let store = Scripted::new();
    let sup = Supervisor::new(store.clone(), SupervisorConfig::new(TTL));
    let t0 = Instant::now();
    let guard = hold(&sup).await;
    sleep(TTL * 3 + TTL / 6).await;
    let sent = store.renewals();
    let offsets: Vec<_> = sent.iter().map(|at| *at - t0).collect();
    assert_eq!(sent.len(), 9, "renewals in 3.5 TTLs, after: {offsets:?}");
    let mut last = t0;
    for (i, at) in sent.iter().enumerate() {
        // Each renewal is due one interval after the previous one was confirmed (at once, here).
        assert_at(&format!("renewal {i}"), *at, last + TTL / 3);
        last = *at;
    }
    assert_eq!(guard.health(), Health::Held);
    assert!(guard.may_act());
    assert!(store_holds(&store, &guard).await);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Without confirmed renewals the lease is given up at its loss deadline: the local deadline
/// (the TTL minus the drift margin, from the moment the acquire was sent) minus the loss lead,
/// while the store still holds it.
async fn lost_before_the_store_expires_it(renew: Mode) {
    let store = Scripted::new();
    let config = SupervisorConfig::new(TTL);
    let sup = Supervisor::new(store.clone(), config.clone());
    let t0 = Instant::now();
    let guard = hold(&sup).await;
    let work = guard.cancellation();
    store.set_renew(renew);

    let lost = bounded("loss", guard.lost()).await;
    let at = Instant::now();
    assert_eq!(lost, Health::Lost(LossReason::DeadlineReached), "{renew:?}");
    let deadline = t0 + TTL - config.drift_margin();
    assert_eq!(guard.lease().deadline(), deadline, "the local deadline");
    assert_at("loss", at, deadline - config.loss_lead());
    assert!(at < deadline, "loss not before the local deadline");
    assert!(
        store_holds(&store, &guard).await,
        "{renew:?}: the store expired the lease before the holder gave it up"
    );
    assert!(work.is_cancelled(), "guarded work not cancelled on loss");
    assert!(!guard.may_act());
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_are_lost_before_the_store_expires_the_lease() {
    lost_before_the_store_expires_it(Mode::Fail).await;
}

#[tokio::test(start_paused = true)]
async fn unanswered_renewals_are_lost_before_the_store_expires_the_lease() {
    lost_before_the_store_expires_it(Mode::Hang).await;
}

/// A renewal that fails (or is not answered in time) makes the outcome uncertain: `AtRisk` at
/// once, `may_act` false, retries, and `Lost` at the loss deadline if none is confirmed.
async fn uncertain_then_lost(renew: Mode) {
    let store = Scripted::new();
    let changes = Arc::new(Changes::default());
    let config = SupervisorConfig::new(TTL);
    let sup = Supervisor::new(store.clone(), config.clone()).with_hook(changes.clone());
    let guard = hold(&sup).await;
    store.set_renew(renew);

    let mut health = guard.subscribe();
    bounded("leaving Held", health.wait_for(|h| *h != Health::Held))
        .await
        .expect("health channel open");
    assert_eq!(guard.health(), Health::AtRisk, "{renew:?}");
    assert!(!guard.may_act(), "may_act while at risk");
    assert!(!guard.view().may_act(), "the view's may_act while at risk");
    assert!(
        !guard.cancellation().is_cancelled(),
        "work cancelled while only at risk"
    );

    assert_eq!(
        bounded("loss", guard.lost()).await,
        Health::Lost(LossReason::DeadlineReached)
    );
    assert_eq!(
        changes.seen(),
        [Health::AtRisk, Health::Lost(LossReason::DeadlineReached)],
        "{renew:?}"
    );
    // The supervisor kept trying while at risk.
    assert!(
        store.renewals().len() >= 2,
        "{renew:?}: only {} renewal attempts",
        store.renewals().len()
    );
}

#[tokio::test(start_paused = true)]
async fn failed_renewals_turn_the_lease_at_risk_then_lost() {
    uncertain_then_lost(Mode::Fail).await;
}

#[tokio::test(start_paused = true)]
async fn unanswered_renewals_turn_the_lease_at_risk_then_lost() {
    uncertain_then_lost(Mode::Hang).await;
}

#[tokio::test(start_paused = true)]
async fn a_confirmed_renewal_brings_an_at_risk_lease_back() {
    let store = Scripted::new();
    let changes = Arc::new(Changes::default());
    let sup = Supervisor::new(store.clone(), SupervisorConfig::new(TTL)).with_hook(changes.clone());
    let guard = hold(&sup).await;
    store.set_renew(Mode::Fail);
    let mut health = guard.subscribe();
    bounded("AtRisk", health.wait_for(|h| *h == Health::AtRisk))
        .await
        .unwrap();
    store.set_renew(Mode::Pass);
    bounded("Held again", health.wait_for(|h| *h == Health::Held))
        .await
        .unwrap();
    assert!(guard.may_act());
    assert_eq!(changes.seen(), [Health::AtRisk, Health::Held]);
}

#[tokio::test(start_paused = true)]
async fn a_release_stops_may_act_before_the_store_answers() {
    let store = Scripted::new();
    let sup = Supervisor::new(store.clone(), SupervisorConfig::new(TTL));
    let guard = hold(&sup).await;
    let view = guard.view();
    let work = guard.cancellation();
    assert!(view.may_act());
    store.set_release(Mode::Hang);

    let sent = store.release_sent.notified();
    let release = tokio::spawn(guard.release());
    timeout(TTL, sent)
        .await
        .expect("the release never reached the store");
    // The store has not let the lease go (its answer hangs), yet the holder may not act.
    let state = store.mem.inspect(&key()).await.unwrap();
    assert_eq!(state.holder.map(|h| h.token), Some(view.token()));
    assert!(!view.may_act(), "may_act while the release is in flight");
    assert!(work.is_cancelled(), "work not cancelled by the release");
    assert_eq!(
        view.health(),
        Health::Held,
        "health changed before the outcome"
    );

    // The release gives up within the op timeout; the lease expires in the store.
    let out = timeout(TTL, release)
        .await
        .expect("release hung")
        .unwrap()
        .unwrap();
    assert_eq!(out, ReleaseOutcome::NotHeld);
    assert_eq!(
        view.health(),
        Health::Lost(LossReason::NotHeldAtRelease),
        "a release without an answer"
    );
}

#[tokio::test(start_paused = true)]
async fn a_released_guard_reports_released() {
    let store = Scripted::new();
    let sup = Supervisor::new(store.clone(), SupervisorConfig::new(TTL));
    let guard = hold(&sup).await;
    let view = guard.view();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(view.health(), Health::Released);
    assert!(!view.may_act());
    assert!(store.mem.inspect(&key()).await.unwrap().holder.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_suspend_past_the_loss_deadline_stops_the_holder_at_once() {
    let store = Scripted::new();
    let clock = ManualClock::new();
    let config = SupervisorConfig::new(TTL).with_clock(Arc::new(clock.clone()));
    let sup = Supervisor::new(store.clone(), config.clone());
    let guard = hold(&sup).await;
    let view = guard.view();
    let work = guard.cancellation();
    sleep(TTL / 2).await; // one confirmed renewal
    assert_eq!(store.renewals().len(), 1);
    assert!(guard.may_act());

    // The host sleeps for ten TTLs: tokio's clock (and the memory store's) does not move, the
    // validity clock does.
    clock.jump(TTL * 10);
    assert!(!guard.may_act(), "may_act right after the resume");
    assert!(!view.may_act(), "the view's may_act right after the resume");
    // The renewal task looks at the clock at least every clock check interval (plus one tick of
    // tokio's timer).
    let promptly = config.clock_check_interval() + Duration::from_millis(1);
    let lost = timeout(promptly, guard.lost())
        .await
        .expect("not lost within the clock check interval after the resume");
    assert_eq!(lost, Health::Lost(LossReason::DeadlineReached));
    assert!(work.is_cancelled());
    // No renewal revived it: none was sent after the resume, though the store would accept one.
    sleep(TTL).await;
    assert_eq!(store.renewals().len(), 1, "renewed after the resume");
    assert_eq!(guard.health(), Health::Lost(LossReason::DeadlineReached));
}

#[tokio::test(start_paused = true)]
async fn a_short_suspend_before_the_loss_deadline_changes_nothing() {
    let store = Scripted::new();
    let clock = ManualClock::new();
    let config = SupervisorConfig::new(TTL).with_clock(Arc::new(clock.clone()));
    let sup = Supervisor::new(store.clone(), config);
    let guard = hold(&sup).await;
    clock.jump(TTL / 10);
    assert!(guard.may_act());
    sleep(TTL * 2).await;
    assert_eq!(guard.health(), Health::Held);
    assert!(guard.may_act());
}

#[tokio::test(start_paused = true)]
async fn run_refuses_to_start_work_after_a_suspend_past_the_loss_deadline() {
    let store = Scripted::new();
    let clock = ManualClock::new();
    let config = SupervisorConfig::new(TTL).with_clock(Arc::new(clock.clone()));
    let sup = Supervisor::new(store.clone(), config);
    let guard = hold(&sup).await;
    // The host sleeps past the loss deadline; the renewal task has not woken yet, so the published
    // health still says Held. Work started now would run without a valid lease.
    clock.jump(TTL * 10);
    assert_eq!(
        guard.health(),
        Health::Held,
        "the renewal task has not looked yet"
    );
    let started = std::sync::atomic::AtomicBool::new(false);
    let outcome = guard
        .run(async { started.store(true, std::sync::atomic::Ordering::SeqCst) })
        .await;
    assert_eq!(outcome, Err(LossReason::DeadlineReached));
    assert!(
        !started.load(std::sync::atomic::Ordering::SeqCst),
        "the work was started past the loss deadline"
    );
}
