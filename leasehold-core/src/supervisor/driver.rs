//! The driver: the renewal task. A thin loop that asks the pure [`Machine`] what to do next,
//! does it (sleep, renew, release) against the store, steps the machine with what happened and
//! publishes the result to the guard, the hook and the log. It decides nothing itself: health,
//! the renewal schedule and the loss deadline are the machine's; the grid, the bounds of each
//! call and the meaning of each answer are the [plan](super::plan)'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::batch;
use super::config::SupervisorConfig;
use super::guard::Shared;
use super::plan::{self, Due};
use super::state::{Event, Health, LossReason, Machine, Next};
use crate::clock::Clock;
use crate::error::Result;
use crate::hook::Hook;
use crate::lease::{Lease, ReleaseOutcome, RenewOutcome};
use crate::store::LeaseStore;

/// Sleeps until `target` on the validity clock, waking at least every `nap` of tokio time: a
/// tokio timer does not count a host suspend, so a long sleep would oversleep a resume.
pub(super) async fn sleep_until_valid(clock: &dyn Clock, target: Instant, nap: Duration) {
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

impl<'a> Publisher<'a> {
    /// A publisher for a guard born `Held` (the first [`publish`](Self::publish) tells otherwise).
    fn new(shared: &'a Shared, hook: &'a dyn Hook, backend: &'static str) -> Self {
        Publisher {
            shared,
            hook,
            backend,
            last: Health::Held,
        }
    }

    /// Publishes the machine `m` to the guard, and its health for `l` (the lease as the store
    /// issued it) to everyone.
    fn publish(&mut self, m: &Machine, l: &Lease) {
        self.shared.machine.send_if_modified(|cur| {
            if cur == m {
                false
            } else {
                cur.clone_from(m);
                true
            }
        });
        let h = m.health();
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
/// the store, the hook and the guard's [`lease`](super::LeaseGuard::lease) see. What to do at each
/// step is decided by the machine and the pure [plan](super::plan); this carries it out.
pub(super) async fn drive(
    store: Arc<dyn LeaseStore>,
    config: SupervisorConfig,
    mut m: Machine,
    mut issued: Lease,
    shared: Arc<Shared>,
    hook: Arc<dyn Hook>,
    renewer: batch::Renewer,
) -> ReleaseOutcome {
    let _end = TaskEnd(shared.clone());
    let (backend, clock, nap) = (store.backend(), shared.clock.clone(), shared.nap);
    let clock = &*clock;
    let started = Instant::now();
    let mut out = Publisher::new(&shared, &*hook, backend);
    out.publish(&m, &issued);
    loop {
        let Next::RenewAt { at, loss_deadline } = m.next(clock.now()) else {
            hook.ended(&issued, started.elapsed(), None);
            return ReleaseOutcome::NotHeld;
        };
        let at = plan::renew_time(at, m.health(), clock.suspended(), |mono| {
            renewer.align(mono, Instant::now())
        });
        // Wait for the renewal time or the loss deadline (looking at the clock), or a stop.
        tokio::select! {
            biased;
            _ = shared.stop.cancelled() => break,
            _ = sleep_until_valid(clock, at.min(loss_deadline), nap) => {}
        }
        if plan::due(clock.now(), loss_deadline) == Due::LossDeadline {
            m.step(Event::Tick, clock.now());
            out.publish(&m, &issued);
            continue;
        }
        let (suspended, sent) = (clock.suspended(), Instant::now());
        let bound = plan::renewal_bound(sent, suspended, config.op_timeout(), loss_deadline);
        let current = issued.clone();
        let answer = tokio::select! {
            biased;
            _ = shared.stop.cancelled() => break,
            r = renewer.renew(&current) => Some(r),
            _ = sleep_until_valid(clock, bound, nap) => None,
        };
        log_renewal_error(backend, &current, answer.as_ref());
        let remaining = || m.lease().deadline().saturating_duration_since(clock.now());
        let (event, result) = plan::judge_renewal(answer, remaining);
        let subject = plan::renewal_subject(&event, &current);
        hook.renewal(subject, result, sent.elapsed());
        if let Some(l) = plan::apply_renewal(&mut m, event, suspended, clock.now()) {
            issued = l;
            shared.lease.send_replace(issued.clone());
        }
        out.publish(&m, &issued);
    }
    // Stop requested: cancel work, step the release's start (the holder may not act from here
    // on), then release (bounded by the time the lease is still valid).
    shared.work.cancel();
    m.step(Event::ReleaseStarted, clock.now());
    out.publish(&m, &issued);
    if m.health().is_final() {
        hook.ended(&issued, started.elapsed(), None);
        return ReleaseOutcome::NotHeld;
    }
    let left = m.lease().deadline().saturating_duration_since(clock.now());
    let bound = plan::release_bound(config.op_timeout(), left);
    let (outcome, event) = plan::judge_release(release(&*store, &issued, bound).await);
    m.step(event, clock.now());
    out.publish(&m, &issued);
    hook.ended(&issued, started.elapsed(), Some(outcome));
    outcome
}

/// Logs a renewal that failed with an error: at debug level when it is retryable (the machine
/// turns `AtRisk` and retries), as a warning when it is not (the lease is lost).
fn log_renewal_error(backend: &'static str, lease: &Lease, answer: Option<&Result<RenewOutcome>>) {
    let Some(Err(e)) = answer else {
        return;
    };
    if e.is_retryable() {
        tracing::debug!(backend, key = %lease.key(), error = %e, "renewal failed");
    } else {
        tracing::warn!(backend, key = %lease.key(), error = %e, "renewal failed with a non-retryable error");
    }
}

/// Releases `lease` within `bound`: the store's answer, or `None` if it did not come in time. A
/// failure or a timeout is logged (the lease will expire).
async fn release(
    store: &dyn LeaseStore,
    lease: &Lease,
    bound: Duration,
) -> Option<Result<ReleaseOutcome>> {
    let backend = store.backend();
    let answer = timeout(bound, store.release(lease)).await.ok();
    match &answer {
        Some(Ok(_)) => {}
        Some(Err(e)) => {
            tracing::warn!(backend, key = %lease.key(), error = %e, "release failed; the lease will expire")
        }
        None => {
            tracing::warn!(backend, key = %lease.key(), "release timed out; the lease will expire")
        }
    }
    answer
}
