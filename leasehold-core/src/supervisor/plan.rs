//! The renewal task's decisions, pure: when to send the next renewal (on the batch grid or on
//! the machine's own timing), whether a wake-up is due for a renewal or past the loss deadline,
//! how long a renewal may take, what its answer means to the [`Machine`] and the hook, whether a
//! confirmed renewal replaces the lease the guard shows, and how long the release may take. No
//! I/O, no timers: the [driver](super::driver) sleeps, calls the store, publishes, and asks
//! these. (The health itself is the machine's, in `state.rs`.)

use std::time::Duration;

use tokio::time::Instant;

use super::state::{Event, Health, Machine};
use crate::clock::saturating_add;
use crate::error::Result;
use crate::hook::RenewalResult;
use crate::lease::{Lease, ReleaseOutcome, RenewOutcome};

/// When to send the next renewal, on the validity clock, for the machine's `at`: a `Held` lease
/// renews at the grid point `align` picks (batched guards share a grid on tokio's clock, which is
/// `suspended` behind the validity clock; earlier than `at`, never later); a lease at risk
/// retries on its own timing.
pub(super) fn renew_time(
    at: Instant,
    health: Health,
    suspended: Duration,
    align: impl FnOnce(Instant) -> Instant,
) -> Instant {
    if health != Health::Held {
        return at;
    }
    match at.checked_sub(suspended) {
        Some(mono) => saturating_add(align(mono), suspended),
        None => at,
    }
}

/// What a wake-up of the renewal task at `now` (validity clock) is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    /// The loss deadline has passed: step [`Event::Tick`], send nothing.
    LossDeadline,
    /// Send the renewal.
    Renewal,
}

/// Whether a wake-up at `now` is past `loss_deadline` or due for the renewal.
pub(super) fn due(now: Instant, loss_deadline: Instant) -> Due {
    if now >= loss_deadline {
        Due::LossDeadline
    } else {
        Due::Renewal
    }
}

/// When a renewal sent at `sent` (tokio's clock, the host `suspended` for that long) is given
/// up, on the validity clock: after the op timeout, and never past the loss deadline.
pub(super) fn renewal_bound(
    sent: Instant,
    suspended: Duration,
    op_timeout: Duration,
    loss_deadline: Instant,
) -> Instant {
    saturating_add(saturating_add(sent, suspended), op_timeout).min(loss_deadline)
}

/// What a renewal's answer means: the event for the machine and the result for the hook.
/// `answer` is `None` when the renewal was not answered within its bound. `remaining_before`
/// (the validity left when the confirmation landed) is asked for only for a confirmation.
pub(super) fn judge_renewal(
    answer: Option<Result<RenewOutcome>>,
    remaining_before: impl FnOnce() -> Duration,
) -> (Event, RenewalResult) {
    match answer {
        Some(Ok(RenewOutcome::Renewed(l))) => (
            Event::RenewConfirmed(l),
            RenewalResult::Confirmed {
                remaining_before: remaining_before(),
            },
        ),
        Some(Ok(RenewOutcome::Lost)) => (Event::RenewRefused, RenewalResult::Refused),
        Some(Err(e)) if e.is_retryable() => (Event::RenewFailed, RenewalResult::Failed),
        Some(Err(_)) => (Event::RenewFatal, RenewalResult::Failed),
        None => (Event::RenewFailed, RenewalResult::TimedOut),
    }
}

/// The lease the hook is told a renewal was about: the confirmed one, or else the one sent.
pub(super) fn renewal_subject<'a>(event: &'a Event, sent: &'a Lease) -> &'a Lease {
    match event {
        Event::RenewConfirmed(l) => l,
        _ => sent,
    }
}

/// Steps `m` with a renewal's `event` at `now`. A confirmed lease comes as the store issued it
/// and is stepped on the validity clock (its deadline moved by the time `suspended` when the
/// renewal was sent). Returns the confirmed lease as issued when the guard should show it from
/// now on: the machine took it (it is still `Held` and holds exactly that lease; a confirmation
/// that came too late, or with an earlier deadline, is not shown).
pub(super) fn apply_renewal(
    m: &mut Machine,
    event: Event,
    suspended: Duration,
    now: Instant,
) -> Option<Lease> {
    let Event::RenewConfirmed(issued) = event else {
        m.step(event, now);
        return None;
    };
    let valid = issued.shifted(suspended);
    m.step(Event::RenewConfirmed(valid.clone()), now);
    (m.health() == Health::Held && *m.lease() == valid).then_some(issued)
}

/// How long the release may take: the op timeout, cut to the validity `left` (at least a
/// millisecond, so that a release is always sent).
pub(super) fn release_bound(op_timeout: Duration, left: Duration) -> Duration {
    op_timeout.min(left.max(Duration::from_millis(1)))
}

/// What the release's answer means: the outcome returned (a failed or timed-out release is
/// `NotHeld`: the lease will expire) and the event for the machine.
pub(super) fn judge_release(answer: Option<Result<ReleaseOutcome>>) -> (ReleaseOutcome, Event) {
    let outcome = match answer {
        Some(Ok(o)) => o,
        Some(Err(_)) | None => ReleaseOutcome::NotHeld,
    };
    let event = match outcome {
        ReleaseOutcome::Released => Event::Released,
        ReleaseOutcome::NotHeld => Event::ReleaseNotHeld,
    };
    (outcome, event)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
