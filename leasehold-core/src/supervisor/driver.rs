//! The driver: the renewal task. A thin loop that asks the pure [`Machine`] what to do next,
//! does it (sleep, renew, release) against the store, steps the machine with what happened and
//! publishes the result to the guard, the hook and the log. It decides nothing itself: health,
//! the renewal schedule and the loss deadline are the machine's.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::batch;
use super::config::SupervisorConfig;
use super::guard::Shared;
use super::state::{Event, Health, LossReason, Machine, Next};
use crate::clock::{Clock, saturating_add};
use crate::hook::{Hook, RenewalResult};
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

impl Publisher<'_> {
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
/// the store, the hook and the guard's [`lease`](LeaseGuard::lease) see.
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
    out.publish(&m, &issued);
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
            out.publish(&m, &issued);
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
    out.publish(&m, &issued);
    hook.ended(&issued, started.elapsed(), Some(outcome));
    outcome
}
