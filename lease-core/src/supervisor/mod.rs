//! The renewal supervisor: bounded acquisition, renewal, a health state machine, and a guard that
//! cancels the guarded work when the lease is lost.
//!
//! The promise to the application is not "you got a lease" but "you will know, in time, when you
//! may no longer act, and your work will be stopped":
//! - [`Supervisor::acquire`] tries, then retries with jittered backoff (woken by the store's watch
//!   when it has one) until the configured wait runs out or it is cancelled. No unbounded waits.
//! - While held, a small task renews every third of the TTL, each attempt bounded so that it ends
//!   before the loss deadline. Health moves `Held -> AtRisk -> Lost` (or `Released`), published on
//!   a `tokio::sync::watch` channel ([`LeaseGuard::health`]).
//! - Loss is signalled strictly **before** the lease's local validity deadline, and the guard's
//!   [`CancellationToken`] is cancelled at that moment. [`LeaseGuard::may_act`] checks the same
//!   *loss deadline* on the spot; a guard whose loss deadline passed before it was handed out (a
//!   very slow answer) is born `Lost`.
//!
//! # Host suspend
//! Validity is judged on the configured [`Clock`]
//! ([`SupervisorConfig::with_clock`]; by default the system clock): tokio's monotonic clock plus
//! the time the host spent suspended. Linux counts suspend and hibernation (`CLOCK_BOOTTIME`);
//! other operating systems count none, so there a suspend goes unnoticed until the next renewal
//! is refused. Timers run on tokio's clock, which does not count a suspend, so every sleep of the
//! renewal task wakes at least every [`SupervisorConfig::clock_check_interval`] (a twentieth of
//! the TTL, 1 ms to 1 s) to look at the clock. After a resume past the loss deadline:
//! `may_act()` is false at once; health turns `Lost(DeadlineReached)`, the work is cancelled and
//! an election leader steps down within that interval. A renewal confirmed after the resume does
//! not revive the lease.
//!
//! # Failure of the renewal task
//! If the renewal task ends early (a panicking [`Hook`], its runtime shutting down), the work is
//! cancelled and health becomes `Lost(RenewalTaskEnded)`; nobody is left `Held` without renewal.
//! Durations never panic: [`SupervisorConfig::validate`] (run by every acquire) rejects timings
//! that leave no time to renew with a typed error, and every other wait or timeout, up to
//! `Duration::MAX`, saturates. Opening a store's watch is bounded like any store call; a watch
//! that does not open in time leaves the acquirer polling.
//!
//! ```
//! use std::time::Duration;
//! use lease_core::{LeaseKey, MemoryLeaseStore};
//! use lease_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
//! let sup = Supervisor::new(MemoryLeaseStore::new(), SupervisorConfig::new(Duration::from_secs(10)));
//! let Acquisition::Acquired(guard) = sup.acquire(&LeaseKey::new("reindex")?).await? else {
//!     return Ok(()); // someone else is doing it
//! };
//! let token = guard.token();
//! // The work is cancelled (dropped) if the lease is lost; carry the token into every write.
//! let result = guard.run(async move { token.get() * 2 }).await;
//! assert!(result.is_ok());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod batch;
mod config;
mod hook;
pub mod state;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

pub use config::SupervisorConfig;
pub use hook::{Hook, NoHook, RenewalResult};
use state::{Event, Machine, Next};
pub use state::{Health, LossReason};

use crate::clock::{Clock, saturating_add};
use crate::error::{Error, Result};
use crate::fencing::{FencedResource, FencingToken};
use crate::lease::{
    AcquireOutcome, AcquireRequest, Holder, Lease, LeaseKey, OwnerId, ReleaseOutcome, RenewOutcome,
};
use crate::store::LeaseStore;

/// Acquires and supervises leases on one store.
#[derive(Clone)]
pub struct Supervisor {
    store: Arc<dyn LeaseStore>,
    config: SupervisorConfig,
    owner: OwnerId,
    fence: Option<Arc<dyn FencedResource>>,
    hook: Arc<dyn Hook>,
    renewer: batch::Renewer,
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("backend", &self.store.backend())
            .field("owner", &self.owner)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The result of a bounded acquisition.
#[derive(Debug)]
#[must_use]
pub enum Acquisition {
    /// Acquired; the guard renews until released, dropped or lost.
    Acquired(LeaseGuard),
    /// The wait ran out while someone else held the key.
    NotAcquired {
        /// The holder at the last attempt.
        holder: Option<Holder>,
        /// How long we waited.
        waited: Duration,
    },
    /// The cancellation token passed to [`Supervisor::acquire_until_cancelled`] fired.
    Cancelled,
}

impl Acquisition {
    /// The guard, if acquired.
    pub fn guard(self) -> Option<LeaseGuard> {
        match self {
            Acquisition::Acquired(g) => Some(g),
            _ => None,
        }
    }
}

impl Supervisor {
    /// A supervisor acting as a fresh random owner.
    pub fn new<S: LeaseStore + 'static>(store: S, config: SupervisorConfig) -> Self {
        Self::from_arc(Arc::new(store), config)
    }

    /// A supervisor over a shared store.
    pub fn from_arc(store: Arc<dyn LeaseStore>, config: SupervisorConfig) -> Self {
        let renewer = batch::Renewer::new(
            store.clone(),
            config.renewal_batching(),
            config.renew_interval(),
            config.op_timeout(),
        );
        Supervisor {
            store,
            config,
            owner: OwnerId::random(),
            fence: None,
            hook: Arc::new(NoHook),
            renewer,
        }
    }

    /// Acts as `owner` instead of a random one.
    pub fn with_owner(mut self, owner: OwnerId) -> Self {
        self.owner = owner;
        self
    }

    /// Immediate fencing: install every new token in `resource` before handing out the guard, so
    /// the previous holder is rejected even before the new one writes.
    pub fn with_fence(mut self, resource: Arc<dyn FencedResource>) -> Self {
        self.fence = Some(resource);
        self
    }

    /// Reports every step to `hook` (metrics, audit).
    pub fn with_hook(mut self, hook: Arc<dyn Hook>) -> Self {
        self.hook = hook;
        self
    }

    /// The hook.
    pub fn hook(&self) -> &Arc<dyn Hook> {
        &self.hook
    }

    /// The owner id this supervisor acquires as.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }

    /// The configuration.
    pub fn config(&self) -> &SupervisorConfig {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.store
    }

    /// Acquires `key`, waiting at most the configured acquire wait.
    ///
    /// # Errors
    /// Invalid input, or the last store error if every attempt failed.
    ///
    /// # Cancellation safety
    /// Not cancel safe: a dropped acquire may leave a ghost grant that expires after its TTL. Use
    /// [`Supervisor::acquire_until_cancelled`] to stop waiting cleanly.
    pub async fn acquire(&self, key: &LeaseKey) -> Result<Acquisition> {
        self.acquire_until_cancelled(key, &CancellationToken::new())
            .await
    }

    /// Like [`Supervisor::acquire`], but stops waiting (between attempts) when `cancel` fires.
    ///
    /// # Errors
    /// Invalid input, or the last store error if every attempt failed.
    ///
    /// # Cancellation safety
    /// Cancel safe through `cancel`: an attempt in flight finishes (bounded by the call timeout)
    /// and a lease it obtained is released before returning `Cancelled`.
    pub async fn acquire_until_cancelled(
        &self,
        key: &LeaseKey,
        cancel: &CancellationToken,
    ) -> Result<Acquisition> {
        self.config.validate()?;
        let clock = self.config.clock();
        let started = Instant::now();
        let deadline = saturating_add(started, self.config.acquire_wait());
        let req = AcquireRequest::new(key.clone(), self.owner.clone(), self.config.ttl())
            .with_drift_margin(self.config.drift_margin());
        let mut watch = if self.store.capabilities().watch && !self.config.acquire_wait().is_zero()
        {
            // Bounded like any store call: a watch that does not open in time (a subscription
            // on a black-holed connection) leaves us polling.
            let bound = self.config.op_timeout().min(self.config.acquire_wait());
            match timeout(bound, self.store.watch(key)).await {
                Ok(Ok(w)) => w,
                Ok(Err(e)) => {
                    tracing::debug!(backend = self.store.backend(), key = %key, error = %e, "watch failed; polling");
                    None
                }
                Err(_) => {
                    tracing::debug!(backend = self.store.backend(), key = %key, "watch did not open in time; polling");
                    None
                }
            }
        } else {
            None
        };
        let mut attempt: u32 = 0;
        let mut holder = None;
        loop {
            let op = self.config.op_timeout();
            // Suspended time before the request is sent: the grant's deadline is placed on the
            // validity clock with it (a suspend during the call only makes it earlier).
            let suspended = clock.suspended();
            let result = match timeout(op, self.store.acquire(&req)).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout {
                    backend: self.store.backend(),
                    operation: "acquire",
                    after: op,
                }),
            };
            let wait = match result {
                Ok(AcquireOutcome::Acquired(lease)) => {
                    if cancel.is_cancelled() {
                        let _ = timeout(op, self.store.release(&lease)).await;
                        return Ok(Acquisition::Cancelled);
                    }
                    self.hook.acquired(&lease, started.elapsed());
                    return self
                        .start(lease, suspended)
                        .await
                        .map(Acquisition::Acquired);
                }
                Ok(AcquireOutcome::Held(h)) => {
                    // Retry when the holder's lease would expire, or earlier with backoff.
                    let until_expiry = h.remaining.saturating_add(Duration::from_millis(1));
                    holder = Some(h);
                    self.config
                        .backoff(attempt)
                        .max(self.config.backoff_min())
                        .min(until_expiry)
                }
                Err(e) if e.is_retryable() => {
                    tracing::debug!(backend = self.store.backend(), key = %key, error = %e, "acquire attempt failed; retrying");
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                    self.config.backoff(attempt)
                }
                Err(e) => return Err(e),
            };
            attempt = attempt.saturating_add(1);
            let now = Instant::now();
            if now >= deadline {
                self.hook.not_acquired(key, now - started);
                return Ok(Acquisition::NotAcquired {
                    holder,
                    waited: now - started,
                });
            }
            let wake = saturating_add(now, wait).min(deadline);
            tokio::select! {
                _ = cancel.cancelled() => {
                    self.hook.not_acquired(key, started.elapsed());
                    return Ok(Acquisition::Cancelled);
                }
                _ = tokio::time::sleep_until(wake) => {}
                changed = async {
                    match watch.as_mut() {
                        Some(w) => w.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if !matches!(changed, Some(Ok(()))) {
                        watch = None; // the watch broke: fall back to polling
                    }
                }
            }
        }
    }

    /// Acquires `key`, runs `work` with the guard while the lease is held, and releases after.
    /// `work` is dropped (cancelled) if the lease is lost.
    ///
    /// # Errors
    /// As [`Supervisor::acquire`].
    ///
    /// # Cancellation safety
    /// Not cancel safe: dropping it drops the guard, which releases in the background.
    pub async fn run<F, Fut, T>(&self, key: &LeaseKey, work: F) -> Result<RunOutcome<T>>
    where
        F: FnOnce(LeaseGuardRef) -> Fut,
        Fut: Future<Output = T>,
    {
        match self.acquire(key).await? {
            Acquisition::Acquired(guard) => {
                let r = guard.run(work(guard.as_ref())).await;
                match r {
                    Ok(v) => {
                        let released = guard.release().await?;
                        Ok(RunOutcome::Completed { value: v, released })
                    }
                    Err(reason) => Ok(RunOutcome::Lost(reason)),
                }
            }
            Acquisition::NotAcquired { holder, .. } => Ok(RunOutcome::NotAcquired { holder }),
            Acquisition::Cancelled => Ok(RunOutcome::NotAcquired { holder: None }),
        }
    }

    /// Hands out the guard for `lease`, granted to a request sent after `suspended` of host
    /// suspend.
    async fn start(&self, lease: Lease, suspended: Duration) -> Result<LeaseGuard> {
        if let Some(fence) = &self.fence {
            let out = match timeout(
                self.config.op_timeout(),
                fence.install(lease.key(), lease.token()),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout {
                    backend: "fence",
                    operation: "install",
                    after: self.config.op_timeout(),
                }),
            };
            match out {
                Ok(o) if o.is_accepted() => {}
                other => {
                    let released =
                        timeout(self.config.op_timeout(), self.store.release(&lease)).await;
                    self.hook
                        .ended(&lease, Duration::ZERO, released.ok().and_then(|r| r.ok()));
                    return Err(match other {
                        Err(e) => e,
                        Ok(o) => Error::InvalidInput(format!(
                            "the fenced resource refused to install token {}: {o:?}",
                            lease.token()
                        )),
                    });
                }
            }
        }
        tracing::info!(backend = self.store.backend(), key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease acquired");
        Ok(LeaseGuard::spawn(
            self.store.clone(),
            self.config.clone(),
            lease,
            suspended,
            self.hook.clone(),
            self.renewer.clone(),
        ))
    }
}

/// What [`Supervisor::run`] ended with.
#[derive(Debug)]
pub enum RunOutcome<T> {
    /// The work completed while the lease was held; it was then released.
    Completed {
        /// The work's output.
        value: T,
        /// What the store said to the release.
        released: ReleaseOutcome,
    },
    /// The lease was lost; the work was cancelled.
    Lost(LossReason),
    /// Someone else held the key for the whole wait.
    NotAcquired {
        /// The holder at the last attempt.
        holder: Option<Holder>,
    },
}

/// Shared state between a guard and its renewal task.
#[derive(Debug)]
struct Shared {
    health: watch::Sender<Health>,
    lease: watch::Sender<Lease>,
    /// Cancelled on loss or release: the parent of every work token.
    work: CancellationToken,
    /// Cancelled by the guard to stop renewing (release or drop).
    stop: CancellationToken,
    /// The loss deadline of the latest confirmed lease, on the validity clock: computed by the
    /// machine ([`Machine::loss_deadline`]) and nowhere else.
    loss_deadline: watch::Sender<Instant>,
    /// The validity clock.
    clock: Arc<dyn Clock>,
    /// How often a sleep looks at the clock (see [`SupervisorConfig::clock_check_interval`]).
    nap: Duration,
}

impl Shared {
    /// Health is `Held`, the work has not been cancelled (a release or drop cancels it before
    /// the store is asked, so a release in flight already says no), and the loss deadline has not
    /// passed on the validity clock.
    fn may_act(&self, health: Health) -> bool {
        health == Health::Held
            && !self.work.is_cancelled()
            && self.clock.now() < *self.loss_deadline.borrow()
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

/// A cheap, cloneable view of a guard for the guarded work: token, health and cancellation.
#[derive(Debug, Clone)]
pub struct LeaseGuardRef {
    key: LeaseKey,
    token: FencingToken,
    health: watch::Receiver<Health>,
    lease: watch::Receiver<Lease>,
    work: CancellationToken,
    shared: Arc<Shared>,
}

impl LeaseGuardRef {
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
    /// [`clock`](crate::clock) for which suspends are seen).
    pub fn may_act(&self) -> bool {
        self.shared.may_act(self.health())
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
    fn spawn(
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
        let (loss_tx, _) = watch::channel(m.loss_deadline());
        let shared = Arc::new(Shared {
            health: health_tx,
            lease: lease_tx,
            work: CancellationToken::new(),
            stop: CancellationToken::new(),
            loss_deadline: loss_tx,
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
    /// [`LeaseGuardRef::may_act`]).
    pub fn may_act(&self) -> bool {
        self.shared.may_act(self.health())
    }

    /// A receiver of health changes.
    pub fn subscribe(&self) -> watch::Receiver<Health> {
        self.health.clone()
    }

    /// A view for the guarded work.
    pub fn as_ref(&self) -> LeaseGuardRef {
        LeaseGuardRef {
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
    /// On loss the work future is dropped (cancelled) and the loss reason returned.
    ///
    /// # Cancellation safety
    /// Cancel safe: dropping it drops `work` and leaves the guard as it was.
    pub async fn run<F: Future>(&self, work: F) -> std::result::Result<F::Output, LossReason> {
        if let Health::Lost(reason) = self.health() {
            return Err(reason);
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
    /// # async fn main() -> lease_core::Result<()> {
    /// use std::time::Duration;
    /// use lease_core::{LeaseKey, MemoryLeaseStore, ReleaseOutcome};
    /// use lease_core::supervisor::{Supervisor, SupervisorConfig};
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
        let until = *self.shared.loss_deadline.borrow();
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

/// Sleeps until `target` on the validity clock, waking at least every `nap` of tokio time: a
/// tokio timer does not count a host suspend, so a long sleep would oversleep a resume.
async fn sleep_until_valid(clock: &dyn Clock, target: Instant, nap: Duration) {
    loop {
        let now = clock.now();
        if now >= target {
            return;
        }
        sleep((target - now).min(nap)).await;
    }
}

/// Ends the guard when the renewal task ends without returning (a panic, in a hook for example,
/// or its runtime shutting down): cancels the work and publishes `Lost`. On a normal return the
/// health is already final and this does nothing more than cancel the (cancelled) work.
struct TaskEnd(Arc<Shared>);

impl Drop for TaskEnd {
    fn drop(&mut self) {
        self.0.work.cancel();
        let ended = self.0.health.send_if_modified(|h| {
            if h.is_final() {
                false
            } else {
                *h = Health::Lost(LossReason::RenewalTaskEnded);
                true
            }
        });
        if ended {
            let l = self.0.lease.borrow();
            tracing::error!(key = %l.key(), owner = %l.owner(), token = %l.token(), "the renewal task ended unexpectedly; lease given up");
        }
    }
}

/// Publishes health changes to the guard, the hook and the log.
struct Publisher<'a> {
    shared: &'a Shared,
    hook: &'a dyn Hook,
    backend: &'static str,
    last: Health,
}

impl Publisher<'_> {
    /// Publishes `h` for `l` (the lease as the store issued it).
    fn publish(&mut self, h: Health, l: &Lease) {
        if h.is_final() {
            // Cancel the guarded work before anyone can observe the final state.
            self.shared.work.cancel();
        }
        if h == self.last {
            return;
        }
        let backend = self.backend;
        self.hook.health_changed(l, self.last, h);
        self.last = h;
        self.shared.health.send_replace(h);
        match h {
            Health::Lost(reason) => {
                tracing::warn!(backend, key = %l.key(), owner = %l.owner(), token = %l.token(), %reason, "lease lost")
            }
            Health::AtRisk => {
                tracing::warn!(backend, key = %l.key(), owner = %l.owner(), token = %l.token(), "lease at risk: renewal not confirmed")
            }
            Health::Held => {
                tracing::info!(backend, key = %l.key(), owner = %l.owner(), token = %l.token(), "lease renewal confirmed again")
            }
            Health::Released => {
                tracing::info!(backend, key = %l.key(), owner = %l.owner(), token = %l.token(), "lease released")
            }
        }
    }
}

/// The renewal task. `m` runs on the validity clock (its lease's deadline shifted by the
/// suspended time at sending); `issued` is the same lease as the store issued it, which is what
/// the store, the hook and the guard's [`lease`](LeaseGuard::lease) see.
async fn drive(
    store: Arc<dyn LeaseStore>,
    config: SupervisorConfig,
    mut m: Machine,
    mut issued: Lease,
    shared: Arc<Shared>,
    hook: Arc<dyn Hook>,
    renewer: batch::Renewer,
) -> ReleaseOutcome {
    let _end = TaskEnd(shared.clone());
    let backend = store.backend();
    let clock = shared.clock.clone();
    let clock = &*clock;
    let nap = shared.nap;
    let started = Instant::now();
    let mut out = Publisher {
        shared: &shared,
        hook: &*hook,
        backend,
        last: Health::Held,
    };
    out.publish(m.health(), &issued);
    loop {
        let now = clock.now();
        let Next::RenewAt { at, loss_deadline } = m.next(now) else {
            hook.ended(&issued, started.elapsed(), None);
            return ReleaseOutcome::NotHeld;
        };
        // Batched guards renew on the supervisor's shared grid (earlier, never later); retries
        // after a failure keep their own timing. The grid runs on tokio's clock.
        let at = if m.health() == Health::Held {
            let s = clock.suspended();
            match at.checked_sub(s) {
                Some(mono) => saturating_add(renewer.align(mono, Instant::now()), s),
                None => at,
            }
        } else {
            at
        };
        // Wait for the renewal time or the loss deadline (looking at the clock on the way), or a
        // stop request.
        tokio::select! {
            biased;
            _ = shared.stop.cancelled() => break,
            _ = sleep_until_valid(clock, at.min(loss_deadline), nap) => {}
        }
        if clock.now() >= loss_deadline {
            m.step(Event::Tick, clock.now());
            out.publish(m.health(), &issued);
            continue;
        }
        let suspended = clock.suspended();
        let sent = Instant::now();
        let bound =
            saturating_add(saturating_add(sent, suspended), config.op_timeout()).min(loss_deadline);
        let current = issued.clone();
        let (event, result) = tokio::select! {
            biased;
            _ = shared.stop.cancelled() => break,
            r = renewer.renew(&current) => match r {
                Ok(RenewOutcome::Renewed(l)) => (
                    Event::RenewConfirmed(l),
                    RenewalResult::Confirmed {
                        remaining_before: m.lease().deadline().saturating_duration_since(clock.now()),
                    },
                ),
                Ok(RenewOutcome::Lost) => (Event::RenewRefused, RenewalResult::Refused),
                Err(e) if e.is_retryable() => {
                    tracing::debug!(backend, key = %current.key(), error = %e, "renewal failed");
                    (Event::RenewFailed, RenewalResult::Failed)
                }
                Err(e) => {
                    tracing::warn!(backend, key = %current.key(), error = %e, "renewal failed with a non-retryable error");
                    (Event::RenewFatal, RenewalResult::Failed)
                }
            },
            _ = sleep_until_valid(clock, bound, nap) => (Event::RenewFailed, RenewalResult::TimedOut),
        };
        let renewed = match event {
            Event::RenewConfirmed(l) => {
                hook.renewal(&l, result, sent.elapsed());
                let valid = l.shifted(suspended);
                m.step(Event::RenewConfirmed(valid.clone()), clock.now());
                Some((l, valid))
            }
            other => {
                hook.renewal(&current, result, sent.elapsed());
                m.step(other, clock.now());
                None
            }
        };
        if let Some((l, valid)) = renewed
            && m.health() == Health::Held
            && *m.lease() == valid
        {
            issued = l;
            shared.lease.send_replace(issued.clone());
            shared.loss_deadline.send_replace(m.loss_deadline());
        }
        out.publish(m.health(), &issued);
    }
    // Stop requested: cancel work, then release (bounded by the time the lease is still valid).
    shared.work.cancel();
    if m.health().is_final() {
        hook.ended(&issued, started.elapsed(), None);
        return ReleaseOutcome::NotHeld;
    }
    let left = m.lease().deadline().saturating_duration_since(clock.now());
    let bound = config.op_timeout().min(left.max(Duration::from_millis(1)));
    let outcome = match timeout(bound, store.release(&issued)).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => {
            tracing::warn!(backend, key = %issued.key(), error = %e, "release failed; the lease will expire");
            ReleaseOutcome::NotHeld
        }
        Err(_) => {
            tracing::warn!(backend, key = %issued.key(), "release timed out; the lease will expire");
            ReleaseOutcome::NotHeld
        }
    };
    let ev = match outcome {
        ReleaseOutcome::Released => Event::Released,
        ReleaseOutcome::NotHeld => Event::ReleaseNotHeld,
    };
    m.step(ev, clock.now());
    out.publish(m.health(), &issued);
    hook.ended(&issued, started.elapsed(), Some(outcome));
    outcome
}
