//! The configuration space: any durations give a typed error or a working
//! supervisor, never a panic.

use std::time::Duration;

use proptest::prelude::*;
use tokio_util::sync::CancellationToken;

use super::{Acquisition, Health, Supervisor, SupervisorConfig};
use crate::lease::{LeaseKey, MAX_TTL, ReleaseOutcome};
use crate::memory::MemoryLeaseStore;
use crate::store::LeaseStore;

/// Durations from the edges (zero, one nanosecond, `Duration::MAX`) and from everywhere between.
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
        4 => (1u64..60_000).prop_map(Duration::from_millis),
        1 => duration(),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    ttl: Duration,
    acquire_wait: Option<Duration>,
    renew_interval: Option<Duration>,
    op_timeout: Option<Duration>,
    drift_margin: Option<Duration>,
    loss_lead: Option<Duration>,
    backoff: Option<(Duration, Duration)>,
    batch_window: Option<Duration>,
}

impl Setup {
    fn config(&self) -> SupervisorConfig {
        let mut c = SupervisorConfig::new(self.ttl);
        if let Some(d) = self.acquire_wait {
            c = c.with_acquire_wait(d);
        }
        if let Some(d) = self.renew_interval {
            c = c.with_renew_interval(d);
        }
        if let Some(d) = self.op_timeout {
            c = c.with_op_timeout(d);
        }
        if let Some(d) = self.drift_margin {
            c = c.with_drift_margin(d);
        }
        if let Some(d) = self.loss_lead {
            c = c.with_loss_lead(d);
        }
        if let Some((min, max)) = self.backoff {
            c = c.with_backoff(min, max);
        }
        if let Some(d) = self.batch_window {
            c = c.with_renewal_batching(d);
        }
        c
    }
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        ttl(),
        proptest::option::of(duration()),
        proptest::option::of(duration()),
        proptest::option::of(duration()),
        proptest::option::of(duration()),
        proptest::option::of(duration()),
        proptest::option::of((duration(), duration())),
        proptest::option::of(duration()),
    )
        .prop_map(
            |(
                ttl,
                acquire_wait,
                renew_interval,
                op_timeout,
                drift_margin,
                loss_lead,
                backoff,
                batch_window,
            )| Setup {
                ttl,
                acquire_wait,
                renew_interval,
                op_timeout,
                drift_margin,
                loss_lead,
                backoff,
                batch_window,
            },
        )
}

/// Acquires, holds through three renewal intervals (at most an hour), lets a second supervisor
/// wait for the held key until cancelled, and releases.
async fn exercise(config: SupervisorConfig) -> Result<(), TestCaseError> {
    let mem = MemoryLeaseStore::new();
    let key = LeaseKey::new("k").unwrap();
    let sup = Supervisor::new(mem.clone(), config.clone());
    let guard = match sup.acquire(&key).await {
        Err(e) => {
            prop_assert!(e.is_invalid_input(), "not a typed input error: {e}");
            prop_assert!(config.validate().is_err());
            prop_assert!(mem.inspect(&key).await.unwrap().last_token.is_none());
            return Ok(());
        }
        Ok(Acquisition::Acquired(g)) => g,
        Ok(other) => {
            return Err(TestCaseError::fail(format!(
                "free key not acquired: {other:?}"
            )));
        }
    };
    prop_assert!(guard.may_act());
    let horizon = config
        .renew_interval()
        .saturating_mul(3)
        .min(Duration::from_secs(3600));
    tokio::time::sleep(horizon).await;
    prop_assert_eq!(guard.health(), Health::Held);
    prop_assert!(guard.may_act());
    let holder = mem.inspect(&key).await.unwrap().holder.map(|h| h.token);
    prop_assert_eq!(holder, Some(guard.token()));

    let other = Supervisor::new(mem.clone(), config.clone());
    let cancel = CancellationToken::new();
    let stopper = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        stopper.cancel();
    });
    let waited = other.acquire_until_cancelled(&key, &cancel).await;
    prop_assert!(
        matches!(
            waited,
            Ok(Acquisition::NotAcquired { .. } | Acquisition::Cancelled)
        ),
        "{waited:?}"
    );
    prop_assert_eq!(guard.health(), Health::Held);
    prop_assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_durations_give_a_typed_error_or_a_working_supervisor(s in setup()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(exercise(s.config()))?;
    }

    #[test]
    fn backoff_never_panics_and_never_spins(min in duration(), max in duration(), attempt in any::<u32>()) {
        let c = SupervisorConfig::new(Duration::from_secs(3)).with_backoff(min, max);
        let b = c.backoff(attempt);
        prop_assert!(b >= Duration::from_millis(1));
        prop_assert!(b <= c.backoff_max().max(Duration::from_millis(1)));
    }
}

#[test]
fn timings_that_leave_no_time_to_renew_are_typed_errors() {
    let ttl = Duration::from_secs(3);
    let bad = [
        SupervisorConfig::new(ttl).with_drift_margin(ttl),
        SupervisorConfig::new(ttl).with_renew_interval(ttl),
        SupervisorConfig::new(ttl).with_renew_interval(Duration::MAX),
        SupervisorConfig::new(ttl).with_renewal_batching(ttl),
        SupervisorConfig::new(ttl)
            .with_renewal_batching(Duration::from_millis(500))
            .with_op_timeout(Duration::from_millis(100)),
        SupervisorConfig::new(Duration::from_millis(1)),
    ];
    for c in bad {
        let e = c.validate().expect_err("accepted");
        assert!(e.is_invalid_input(), "{c:?}: {e}");
    }
    for c in [
        SupervisorConfig::new(ttl),
        SupervisorConfig::new(ttl).with_op_timeout(Duration::MAX),
        SupervisorConfig::new(ttl).with_acquire_wait(Duration::MAX),
        SupervisorConfig::new(ttl).with_loss_lead(Duration::MAX),
        SupervisorConfig::new(ttl).with_backoff(Duration::MAX, Duration::MAX),
        SupervisorConfig::new(Duration::from_millis(10)),
    ] {
        assert!(c.validate().is_ok(), "{c:?}");
    }
}

/// The memory store with the acquire's reply delayed by `reply_after` (the grant lands at once,
/// the caller hears of it later).
#[derive(Debug, Clone)]
struct SlowReply {
    mem: MemoryLeaseStore,
    reply_after: Duration,
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl LeaseStore for SlowReply {
    fn backend(&self) -> &'static str {
        "slow-reply"
    }
    fn capabilities(&self) -> crate::Capabilities {
        self.mem.capabilities()
    }
    async fn acquire(&self, req: &crate::AcquireRequest) -> crate::Result<crate::AcquireOutcome> {
        let out = self.mem.acquire(req).await;
        tokio::time::sleep(self.reply_after).await;
        out
    }
    async fn renew(&self, lease: &crate::Lease) -> crate::Result<crate::RenewOutcome> {
        self.mem.renew(lease).await
    }
    async fn release(&self, lease: &crate::Lease) -> crate::Result<ReleaseOutcome> {
        self.mem.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> crate::Result<crate::KeyState> {
        self.mem.inspect(key).await
    }
    async fn renew_many(
        &self,
        leases: &[crate::Lease],
    ) -> crate::Result<Vec<crate::Result<crate::RenewOutcome>>> {
        self.mem.renew_many(leases).await
    }
    async fn inspect_many(&self, keys: &[LeaseKey]) -> crate::Result<Vec<crate::KeyState>> {
        self.mem.inspect_many(keys).await
    }
    async fn acquire_many(
        &self,
        reqs: &[crate::AcquireRequest],
    ) -> crate::Result<Vec<crate::Result<crate::AcquireOutcome>>> {
        self.mem.acquire_many(reqs).await
    }
    async fn holders_many(&self, keys: &[LeaseKey]) -> crate::Result<Vec<Option<crate::HeldBy>>> {
        self.mem.holders_many(keys).await
    }
    async fn watch(&self, key: &LeaseKey) -> crate::Result<Option<crate::KeyWatch>> {
        self.mem.watch(key).await
    }
}

/// A fenced resource whose installs take 200 ms.
#[derive(Debug, Clone, Default)]
struct SlowFence {
    mem: crate::MemoryFencedResource,
}

#[async_trait::async_trait]
impl crate::FencedResource for SlowFence {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: crate::FencingToken,
        op: crate::FenceOp,
    ) -> crate::Result<crate::WriteOutcome> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.mem.apply(key, token, op).await
    }
    async fn read(&self, key: &LeaseKey) -> crate::Result<crate::ResourceState> {
        self.mem.read(key).await
    }
}

/// Dropping `acquire`, `try_acquire`, `run` or a fenced `acquire` at any point (here: every
/// 10 ms of a call whose grant lands at once, whose reply takes 200 ms and whose fence install
/// another 200 ms) leaves the key free within the op timeout, not held by nobody for a TTL.
#[tokio::test(start_paused = true)]
async fn a_dropped_acquire_releases_what_it_was_granted() {
    let ttl = Duration::from_secs(30);
    let op = Duration::from_secs(1);
    let key = LeaseKey::new("dropped").unwrap();
    let store = SlowReply {
        mem: MemoryLeaseStore::new(),
        reply_after: Duration::from_millis(200),
    };
    let sup = Supervisor::new(
        store.clone(),
        SupervisorConfig::new(ttl).with_op_timeout(op),
    );
    let fenced = Supervisor::new(
        store.clone(),
        SupervisorConfig::new(ttl).with_op_timeout(op),
    )
    .with_fence_on_acquire(std::sync::Arc::new(SlowFence::default()));
    for which in 0..4 {
        for ms in (0..=450).step_by(10) {
            let after = Duration::from_millis(ms);
            let held = match which {
                0 => tokio::time::timeout(after, sup.acquire(&key))
                    .await
                    .map(|r| r.unwrap().guard()),
                1 => tokio::time::timeout(after, sup.try_acquire(&key))
                    .await
                    .map(|r| r.unwrap().guard()),
                2 => tokio::time::timeout(after, sup.run(&key, |_| std::future::pending::<()>()))
                    .await
                    .map(|_| None),
                _ => tokio::time::timeout(after, fenced.acquire(&key))
                    .await
                    .map(|r| r.unwrap().guard()),
            };
            if let Ok(Some(guard)) = held {
                assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
            }
            // Bounded background clean-up: the key is free within two op timeouts of the drop
            // (the call's own bound, then the release's), well within a TTL.
            let deadline = tokio::time::Instant::now() + op * 2;
            loop {
                let holder = store.mem.inspect(&key).await.unwrap().holder;
                if holder.is_none() {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "call {which} dropped after {after:?}: the key is still held: {holder:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Counts the leases a hook was told were acquired and ended.
#[derive(Debug, Default)]
struct Counting {
    acquired: std::sync::atomic::AtomicUsize,
    ended: std::sync::atomic::AtomicUsize,
}

impl crate::hook::Hook for Counting {
    fn acquired(&self, _: &crate::Lease, _: Duration) {
        self.acquired
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn ended(&self, _: &crate::Lease, _: Duration, _: Option<ReleaseOutcome>) {
        self.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A fenced acquire dropped while its fence install runs tells its hook that the lease it
/// reported acquired has ended (metrics such as a held-leases gauge come back down), and frees
/// the key within the op timeout.
#[tokio::test(start_paused = true)]
async fn a_fenced_acquire_dropped_during_its_install_reports_the_end() {
    let op = Duration::from_secs(1);
    let key = LeaseKey::new("dropped-fenced").unwrap();
    let mem = MemoryLeaseStore::new();
    let hook = std::sync::Arc::new(Counting::default());
    let sup = Supervisor::new(
        mem.clone(),
        SupervisorConfig::new(Duration::from_secs(30)).with_op_timeout(op),
    )
    .with_fence_on_acquire(std::sync::Arc::new(SlowFence::default()))
    .with_hook(hook.clone());
    // The grant is immediate; the install takes 200 ms: dropped after 100 ms, mid-install.
    let dropped = tokio::time::timeout(Duration::from_millis(100), sup.acquire(&key)).await;
    assert!(dropped.is_err(), "the acquire finished before its install");
    let deadline = tokio::time::Instant::now() + op;
    loop {
        let free = mem.inspect(&key).await.unwrap().holder.is_none();
        let ended = hook.ended.load(std::sync::atomic::Ordering::SeqCst);
        if free && ended == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after the drop: key free {free}, ended reported {ended} times"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(hook.acquired.load(std::sync::atomic::Ordering::SeqCst), 1);
}
