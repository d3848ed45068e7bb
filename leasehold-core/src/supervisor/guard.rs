//! The guard: [`LeaseGuard`], handed to the holder, and [`LeaseGuardView`], its cheap view for the
//! guarded work. Both read what the renewal task publishes in [`Shared`]; neither decides
//! anything itself: health, the loss deadline and whether one may act all come from the
//! [`Machine`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::batch;
use super::config::SupervisorConfig;
use super::driver::{drive, sleep_until_valid};
use super::state::{Health, LossReason, Machine};
use crate::clock::Clock;
use crate::error::Result;
use crate::fencing::FencingToken;
use crate::hook::Hook;
use crate::lease::{Lease, LeaseKey, OwnerId, ReleaseOutcome};
use crate::store::LeaseStore;

/// Shared state between a guard and its renewal task.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) health: watch::Sender<Health>,
    /// The latest lease as the store issued it.
    pub(super) lease: watch::Sender<Lease>,
    /// The renewal task's machine as of its last step, on the validity clock: the guard reads
    /// the loss deadline and `may_act` from it and computes neither itself.
    pub(super) machine: watch::Sender<Machine>,
    /// Cancelled on loss or release: the parent of every work token.
    pub(super) work: CancellationToken,
    /// Cancelled by the guard to stop renewing (release or drop).
    pub(super) stop: CancellationToken,
    /// The validity clock.
    pub(super) clock: Arc<dyn Clock>,
    /// How often a sleep looks at the clock (see [`SupervisorConfig::clock_check_interval`]).
    pub(super) nap: Duration,
}

impl Shared {
    /// The machine's [`may_act`](Machine::may_act) on the validity clock, and no release or
    /// drop asked for: the guard says no the moment it asks, before the renewal task has stepped
    /// the machine's release (which it does before the store is asked), and loss cancels the
    /// work before anyone can observe it.
    fn may_act(&self) -> bool {
        !self.stop.is_cancelled()
            && !self.work.is_cancelled()
            && self.machine.borrow().may_act(self.clock.now())
    }

    /// The loss deadline of the latest confirmed lease, on the validity clock.
    fn loss_deadline(&self) -> tokio::time::Instant {
        self.machine.borrow().loss_deadline()
    }
}

/// A held lease, renewed in the background until released, dropped or lost.
///
/// Dropping the guard without [`release`](LeaseGuard::release) stops renewal and releases in the
/// background; it never blocks and never panics.
#[derive(Debug)]
pub struct LeaseGuard {
    key: LeaseKey,
    owner: OwnerId,
    token: FencingToken,
    shared: Arc<Shared>,
    health: watch::Receiver<Health>,
    task: Option<tokio::task::JoinHandle<ReleaseOutcome>>,
}

/// The name [`LeaseGuardView`] had: it is an owned view, not a reference.
#[deprecated(note = "renamed to LeaseGuardView")]
pub type LeaseGuardRef = LeaseGuardView;

/// A cheap, cloneable view of a guard for the guarded work: token, health and cancellation.
/// It is owned (no lifetime) and cannot release the lease; the [`LeaseGuard`] does that.
#[derive(Debug, Clone)]
pub struct LeaseGuardView {
    key: LeaseKey,
    token: FencingToken,
    health: watch::Receiver<Health>,
    lease: watch::Receiver<Lease>,
    work: CancellationToken,
    shared: Arc<Shared>,
}

impl LeaseGuardView {
    /// The key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }
    /// The fencing token to carry into every protected write.
    pub fn token(&self) -> FencingToken {
        self.token
    }
    /// The current health.
    pub fn health(&self) -> Health {
        *self.health.borrow()
    }
    /// A token cancelled when the lease is lost or released.
    pub fn cancellation(&self) -> CancellationToken {
        self.work.child_token()
    }
    /// Whether it is still reasonable to *start* a side effect: health is `Held`, no release has
    /// started (a release or drop says no before the store is asked), **and** the loss deadline
    /// (the local validity deadline minus the loss lead) has not passed. The
    /// deadline is checked on the spot, on the validity clock, so a process resuming from a long
    /// pause or a host suspend gets `false` at once, before the renewal task has run (see
    /// [`clock`](crate::clock) for which suspends are seen). Work that does not ask is not
    /// stopped at once: its cancellation token is cancelled when the renewal task next wakes,
    /// up to [`SupervisorConfig::clock_check_interval`] of tokio time after the resume.
    pub fn may_act(&self) -> bool {
        self.shared.may_act()
    }
    /// The latest lease (its deadline moves with each confirmed renewal).
    pub fn lease(&self) -> Lease {
        self.lease.borrow().clone()
    }
}

impl LeaseGuard {
    /// A guard for `lease`, granted to a request sent after `suspended` of host suspend. Its
    /// health is decided here, before it is handed out: a lease already past its loss deadline
    /// is born `Lost`, with its work cancelled.
    pub(super) fn spawn(
        store: Arc<dyn LeaseStore>,
        config: SupervisorConfig,
        lease: Lease,
        suspended: Duration,
        hook: Arc<dyn Hook>,
        renewer: batch::Renewer,
    ) -> Self {
        let clock = config.clock();
        let retry = (config.renew_interval() / 4).max(config.backoff_min());
        let m = Machine::new(
            lease.shifted(suspended),
            config.renew_interval(),
            retry,
            config.loss_lead(),
            clock.now(),
        );
        let (health_tx, health_rx) = watch::channel(m.health());
        let (lease_tx, _) = watch::channel(lease.clone());
        let (machine_tx, _) = watch::channel(m.clone());
        let shared = Arc::new(Shared {
            health: health_tx,
            lease: lease_tx,
            work: CancellationToken::new(),
            stop: CancellationToken::new(),
            machine: machine_tx,
            clock,
            nap: config.clock_check_interval(),
        });
        if m.health().is_final() {
            shared.work.cancel();
        }
        let task = tokio::spawn(drive(
            store,
            config,
            m,
            lease.clone(),
            shared.clone(),
            hook,
            renewer,
        ));
        LeaseGuard {
            key: lease.key().clone(),
            owner: lease.owner().clone(),
            token: lease.token(),
            shared,
            health: health_rx,
            task: Some(task),
        }
    }

    /// The key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// The owner.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }

    /// The fencing token of this grant: carry it into every protected write.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The latest lease (its deadline moves with each confirmed renewal).
    pub fn lease(&self) -> Lease {
        self.shared.lease.borrow().clone()
    }

    /// The current health.
    pub fn health(&self) -> Health {
        *self.health.borrow()
    }

    /// Whether it is still reasonable to *start* a side effect: health is `Held`, no release has
    /// started, and the loss deadline has not passed on the validity clock (see
    /// [`LeaseGuardView::may_act`]).
    pub fn may_act(&self) -> bool {
        self.shared.may_act()
    }

    /// A receiver of health changes.
    pub fn subscribe(&self) -> watch::Receiver<Health> {
        self.health.clone()
    }

    /// Renamed to [`view`](LeaseGuard::view).
    #[deprecated(note = "renamed to view")]
    pub fn guard_ref(&self) -> LeaseGuardView {
        self.view()
    }

    /// A [`LeaseGuardView`]: the cheap, cloneable view of this guard to hand to the guarded work
    /// (token, health, `may_act`, cancellation). It cannot release the lease.
    pub fn view(&self) -> LeaseGuardView {
        LeaseGuardView {
            key: self.key.clone(),
            token: self.token,
            health: self.health.clone(),
            lease: self.shared.lease.subscribe(),
            work: self.shared.work.clone(),
            shared: self.shared.clone(),
        }
    }

    /// A child token cancelled when the lease is lost or released. Hand it to spawned work.
    pub fn cancellation(&self) -> CancellationToken {
        self.shared.work.child_token()
    }

    /// Completes when the lease is lost (or released), with the final health.
    ///
    /// # Cancellation safety
    /// Cancel safe.
    pub async fn lost(&self) -> Health {
        let mut rx = self.health.clone();
        let seen = rx.wait_for(|h| h.is_final()).await.map(|h| *h);
        match seen {
            Ok(h) => h,
            Err(_) => *rx.borrow(),
        }
    }

    /// Runs `work` until it completes or the lease is lost or released, whichever comes first.
    /// On loss the work future is dropped (cancelled) and the loss reason returned. Work is never
    /// started once [`LeaseGuard::may_act`] is false (past the loss deadline by the validity
    /// clock, even before the renewal task has woken to publish the loss). After a host suspend
    /// past the loss deadline *while the work runs*, the loss is seen when the renewal task next
    /// wakes, so the work runs on for up to [`SupervisorConfig::clock_check_interval`] of tokio
    /// time after the resume (check [`LeaseGuard::may_act`] before each side effect to stop
    /// sooner).
    ///
    /// # Cancellation safety
    /// Cancel safe: dropping it drops `work` and leaves the guard as it was.
    pub async fn run<F: Future>(&self, work: F) -> std::result::Result<F::Output, LossReason> {
        if let Health::Lost(reason) = self.health() {
            return Err(reason);
        }
        if !self.may_act() {
            // Past the loss deadline (a suspend, a late timer) or released: the published health
            // may lag the clock, so the clock decides.
            return Err(match self.health() {
                Health::Lost(r) => r,
                _ => LossReason::DeadlineReached,
            });
        }
        tokio::select! {
            biased;
            _ = self.shared.work.cancelled() => Err(match self.health() {
                Health::Lost(r) => r,
                _ => LossReason::DeadlineReached,
            }),
            v = work => Ok(v),
        }
    }

    /// Stops renewing, cancels guarded work, releases the lease and reports what the store said.
    ///
    /// # Errors
    /// Never for store failures (a failed release simply lets the lease expire; the outcome is
    /// then `NotHeld`); kept as `Result` for future validation.
    ///
    /// # Cancellation safety
    /// Cancel safe: the release runs in the background task and completes even if this future is
    /// dropped.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        self.shared.stop.cancel();
        match self.task.take() {
            Some(task) => Ok(task.await.unwrap_or(ReleaseOutcome::NotHeld)),
            None => Ok(ReleaseOutcome::NotHeld),
        }
    }

    /// Drain then release: lets `work` finish while the lease is still valid, then releases.
    /// Returns the work's output if it finished in time, and the release outcome.
    ///
    /// The drain is bounded by the lease as it stands when the drain starts: `work` is cancelled
    /// (dropped) at that lease's loss deadline (its local deadline minus the configured
    /// [loss lead](SupervisorConfig::with_loss_lead)), or at once if the lease is lost meanwhile.
    /// Renewal goes on while the work drains, so a shutdown never waits longer than one TTL.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> leasehold_core::Result<()> {
    /// use std::time::Duration;
    /// use leasehold_core::{LeaseKey, MemoryLeaseStore, ReleaseOutcome};
    /// use leasehold_core::supervisor::{Supervisor, SupervisorConfig};
    ///
    /// let sup = Supervisor::new(MemoryLeaseStore::new(), SupervisorConfig::new(Duration::from_secs(10)));
    /// let guard = sup.acquire(&LeaseKey::new("nightly")?).await?.guard().expect("free key");
    /// let (flushed, released) = guard.drain_and_release(async { "flushed" }).await?;
    /// assert_eq!(flushed, Some("flushed"));
    /// assert_eq!(released, ReleaseOutcome::Released);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancellation safety
    /// Cancel safe: dropping it drops `work` and releases in the background.
    pub async fn drain_and_release<F: Future>(
        self,
        work: F,
    ) -> Result<(Option<F::Output>, ReleaseOutcome)> {
        let until = self.shared.loss_deadline();
        let out = tokio::select! {
            v = work => Some(v),
            _ = sleep_until_valid(&*self.shared.clock, until, self.shared.nap) => None,
            _ = self.shared.work.cancelled() => None,
        };
        let released = self.release().await?;
        Ok((out, released))
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // Stop the work, stop renewing and let the background task release; never block, never
        // panic.
        self.shared.work.cancel();
        self.shared.stop.cancel();
    }
}
