//! The renewal task and the loss deadline: whatever ends the renewal
//! task (a panic included) cancels the work and publishes `Lost`; no duration, however large,
//! panics; and a guard past its loss deadline says "lost" from birth.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::election::{Election, ElectionEvent, Role};
use leasehold_core::supervisor::{
    Acquisition, Health, Hook, LossReason, RenewalResult, Supervisor, SupervisorConfig,
};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, FencingToken, KeyState, Lease, LeaseKey,
    LeaseStore, MemoryLeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result,
};
use leasehold_testkit::faulty::{Fault, FaultyStore, Operation};
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(3);

fn key() -> LeaseKey {
    LeaseKey::new("job").unwrap()
}

async fn held(store: &MemoryLeaseStore, k: &LeaseKey) -> Option<FencingToken> {
    store.inspect(k).await.unwrap().holder.map(|h| h.token)
}

/// A hook that panics at the first renewal, or at the first election.
#[derive(Debug, Default)]
struct PanickingHook {
    on_leadership: bool,
    fired: AtomicBool,
}

impl Hook for PanickingHook {
    fn renewal(&self, _: &Lease, _: RenewalResult, _: Duration) {
        if !self.on_leadership && !self.fired.swap(true, Ordering::SeqCst) {
            panic!("hook panics in renewal (deliberately, in a test)");
        }
    }
    fn leadership(&self, _: &LeaseKey, _: &OwnerId, term: Option<FencingToken>) {
        if self.on_leadership && term.is_some() && !self.fired.swap(true, Ordering::SeqCst) {
            panic!("hook panics in leadership (deliberately, in a test)");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_hook_loses_the_guard_and_cancels_the_work() {
    let sup = Supervisor::new(MemoryLeaseStore::new(), SupervisorConfig::new(TTL))
        .with_hook(Arc::new(PanickingHook::default()));
    let guard = sup.acquire(&key()).await.unwrap().guard().unwrap();
    let view = guard.view();
    let result = timeout(TTL * 2, guard.run(std::future::pending::<()>()))
        .await
        .expect("work still running two TTLs after the renewal task panicked");
    assert_eq!(result, Err(LossReason::RenewalTaskEnded));
    assert_eq!(guard.health(), Health::Lost(LossReason::RenewalTaskEnded));
    assert!(!guard.may_act() && !view.may_act());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_hook_ends_the_leaders_term() {
    let election = Election::new(
        MemoryLeaseStore::new(),
        key(),
        SupervisorConfig::new(TTL).with_acquire_wait(TTL),
    )
    .with_hook(Arc::new(PanickingHook::default()));
    let mut me = election.join(OwnerId::with_label("a"));
    let Some(ElectionEvent::Elected { term, work, .. }) = me.next_event().await else {
        panic!("not elected")
    };
    let event = timeout(TTL * 2, me.next_event())
        .await
        .expect("the leader still leads two TTLs after its renewal task panicked");
    assert!(
        matches!(event, Some(ElectionEvent::SteppedDown { term: t, .. }) if t == term),
        "{event:?}"
    );
    assert!(work.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_hook_panicking_in_the_campaign_leaves_no_leader() {
    let election = Election::new(
        MemoryLeaseStore::new(),
        key(),
        SupervisorConfig::new(TTL).with_acquire_wait(TTL),
    )
    .with_hook(Arc::new(PanickingHook {
        on_leadership: true,
        ..PanickingHook::default()
    }));
    let me = election.join(OwnerId::with_label("a"));
    let mut role = me.subscribe();
    // The campaign panics right after it was elected: whatever it published, it must not be left
    // a leader, and a term it announced must end.
    let seen = timeout(TTL * 2, async {
        loop {
            if role.changed().await.is_err() {
                return *role.borrow();
            }
        }
    })
    .await
    .expect("the campaign is still running");
    assert_eq!(
        seen,
        Role::Follower,
        "a dead campaign left its candidate leading"
    );
    assert!(!me.is_leader());
}

/// Each duration setter at `Duration::MAX`: a typed error, or a supervisor that holds, renews
/// and releases. Never a panic, never a guard that is `Held` while nobody renews.
#[tokio::test(start_paused = true)]
async fn duration_max_anywhere_is_an_error_or_a_working_supervisor() {
    let max = Duration::MAX;
    let configs = [
        ("ttl", SupervisorConfig::new(max)),
        (
            "op_timeout",
            SupervisorConfig::new(TTL).with_op_timeout(max),
        ),
        (
            "renew_interval",
            SupervisorConfig::new(TTL).with_renew_interval(max),
        ),
        (
            "acquire_wait",
            SupervisorConfig::new(TTL).with_acquire_wait(max),
        ),
        ("loss_lead", SupervisorConfig::new(TTL).with_loss_lead(max)),
        (
            "drift_margin",
            SupervisorConfig::new(TTL).with_drift_margin(max),
        ),
        ("backoff", SupervisorConfig::new(TTL).with_backoff(max, max)),
        (
            "backoff_max",
            SupervisorConfig::new(TTL).with_backoff(Duration::ZERO, max),
        ),
        (
            "batching",
            SupervisorConfig::new(TTL).with_renewal_batching(max),
        ),
    ];
    for (name, cfg) in configs {
        let mem = MemoryLeaseStore::new();
        let faulty = FaultyStore::new(mem.clone());
        let sup = Supervisor::new(faulty.clone(), cfg);
        let k = LeaseKey::new(format!("max-{}", name.replace('_', "-"))).unwrap();
        let guard = match sup.acquire(&k).await {
            Err(e) => {
                assert!(e.is_invalid_input(), "{name}: {e}");
                continue;
            }
            Ok(a) => a.guard().unwrap_or_else(|| panic!("{name}: not acquired")),
        };
        // Held for three TTLs, renewing; the store agrees.
        for _ in 0..9 {
            sleep(TTL / 3).await;
            assert_eq!(guard.health(), Health::Held, "{name}");
            assert_eq!(held(&mem, &k).await, Some(guard.token()), "{name}");
        }
        // Renewals fail for a while (the retry path), then the store answers again.
        faulty.set(Operation::Renew, Fault::Fail);
        sleep(TTL / 3).await;
        faulty.heal();
        sleep(TTL).await;
        assert!(
            guard.health() == Health::Held || guard.health().is_final(),
            "{name}: {:?}",
            guard.health()
        );
        if guard.health() == Health::Held {
            assert_eq!(held(&mem, &k).await, Some(guard.token()), "{name}");
        }
        // Waiting for a held key (the backoff path) ends when cancelled.
        let other = Supervisor::new(faulty.clone(), sup.config().clone());
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        tokio::spawn(async move {
            sleep(TTL).await;
            c.cancel();
        });
        let waited = timeout(TTL * 2, other.acquire_until_cancelled(&k, &cancel))
            .await
            .unwrap_or_else(|_| panic!("{name}: acquire ignored its cancellation"))
            .unwrap();
        assert!(
            !matches!(waited, Acquisition::Acquired(_)) || !guard.health().eq(&Health::Held),
            "{name}: two holders"
        );
        drop(guard);
    }
}

/// A store that answers an acquire `delay` after granting it: the grant's deadline runs from
/// the moment it was sent, so most of the TTL is gone when the guard is made.
#[derive(Debug, Clone)]
struct SlowAnswer {
    inner: MemoryLeaseStore,
    delay: Duration,
}

#[async_trait]
impl LeaseStore for SlowAnswer {
    fn backend(&self) -> &'static str {
        "slow-answer"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let out = self.inner.acquire(req).await;
        sleep(self.delay).await;
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
async fn a_guard_past_its_loss_deadline_is_born_lost() {
    // TTL 3 s: drift 61 ms, loss lead 300 ms. The answer lands 2.7 s after the request was sent:
    // past the loss deadline (2.639 s), before the deadline (2.939 s).
    let store = SlowAnswer {
        inner: MemoryLeaseStore::new(),
        delay: Duration::from_millis(2700),
    };
    let sup = Supervisor::new(store, SupervisorConfig::new(TTL).with_op_timeout(TTL * 2));
    let guard = sup.acquire(&key()).await.unwrap().guard().expect("granted");
    assert!(
        guard.lease().is_valid(),
        "precondition: the deadline itself has not passed"
    );
    assert!(!guard.may_act(), "may_act() true past the loss deadline");
    assert!(!guard.view().may_act());
    assert_eq!(guard.health(), Health::Lost(LossReason::DeadlineReached));
    assert!(
        guard.cancellation().is_cancelled(),
        "work not cancelled at birth"
    );
    assert_eq!(guard.run(async {}).await, Err(LossReason::DeadlineReached));
}
