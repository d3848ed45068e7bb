//! The campaign's decisions, pure: whom a reservation is for, whether to campaign or stay out
//! (and how long), whether to lead or give the key back once acquired, which reservation a new
//! leader clears, how long to reserve and to wait, when to give up on an unreadable reservation,
//! why a term ended, whom to yield to. No I/O, no timers: the
//! [campaign driver](super::campaign) reads the store and sleeps, and asks these. The bounded
//! model check (`plan_model.rs`) steps them for a few candidates through every interleaving.

use std::time::Duration;

use super::StepDownReason;
use crate::capability::Capabilities;
use crate::fencing::FencingToken;
use crate::lease::{Holder, LeaseKey, OwnerId};
use crate::supervisor::Health;

/// What a candidate knows of the handover reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reservation {
    /// None stands, or it is for this candidate.
    Clear,
    /// One stands for someone else, for this much longer.
    ForOther(Duration),
}

/// Whether a reservation held by `holder` is for this candidate: for its identity (as the
/// leader names successors) or for its instance itself.
pub(super) fn reserved_for_me(holder: &OwnerId, identity: &OwnerId, instance: &OwnerId) -> bool {
    holder == identity || holder == instance
}

/// The reservation as its key's holder shows it, for the candidate `identity` (`instance`).
pub(super) fn reservation_of(
    holder: Option<Holder>,
    identity: &OwnerId,
    instance: &OwnerId,
) -> Reservation {
    match holder.filter(|h| !reserved_for_me(&h.owner, identity, instance)) {
        Some(h) => Reservation::ForOther(h.remaining),
        None => Reservation::Clear,
    }
}

/// How long to stay out before looking at a reservation for another again: until it expires,
/// at most a renewal interval `tick`, at least a millisecond.
pub(super) fn recheck_after(left: Duration, tick: Duration) -> Duration {
    left.min(tick).max(Duration::from_millis(1))
}

/// What a candidate does with the reservation it read before it campaigns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Campaign for the key.
    Campaign,
    /// Stay out this long, then read the reservation again.
    StayOut(Duration),
}

/// Before acquiring: campaign if the reservation is clear (none, or for this candidate); stay
/// out while it stands for another ([`recheck_after`], `tick` a renewal interval).
pub(super) fn gate(reservation: Reservation, tick: Duration) -> Gate {
    match reservation {
        Reservation::Clear => Gate::Campaign,
        Reservation::ForOther(left) => Gate::StayOut(recheck_after(left, tick)),
    }
}

/// What a candidate that has just acquired the key does with the reservation it read then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Won {
    /// Take the lead (a term starts).
    Lead,
    /// Give the key back without announcing a term: a reservation stands for another (it may
    /// have been written after the reading before the acquisition).
    GiveBack,
}

/// After acquiring: lead only if the reservation is clear.
pub(super) fn after_acquire(reservation: Reservation) -> Won {
    match reservation {
        Reservation::Clear => Won::Lead,
        Reservation::ForOther(_) => Won::GiveBack,
    }
}

/// The reservation a new leader removes: the one its key's `holder` shows, if it is for this
/// candidate (`identity` or its `instance`). A reservation for another is left alone.
pub(super) fn to_clear(
    holder: Option<Holder>,
    identity: &OwnerId,
    instance: &OwnerId,
) -> Option<Holder> {
    holder.filter(|h| reserved_for_me(&h.owner, identity, instance))
}

/// While the reservation cannot be read: the pause before the next read, or `None` once the
/// bound has passed since the first failed read (then it is taken as clear). Each read is
/// already paced by the op timeout it may wait out, and the candidate may be holding the key
/// meanwhile, so it retries at the shortest backoff `backoff`, not a growing one.
pub(super) fn unreadable_pause(
    waited: Duration,
    bound: Duration,
    backoff: Duration,
) -> Option<Duration> {
    let left = bound.saturating_sub(waited);
    if left.is_zero() {
        return None;
    }
    Some(backoff.min(left).max(Duration::from_millis(1)))
}

/// The lease TTL of a reservation valid for `within` on a store with `caps`: rounded up to the
/// store's minimum and granularity; `None` past [`MAX_TTL`](crate::MAX_TTL) (not written).
pub(super) fn reservation_ttl(within: Duration, caps: &Capabilities) -> Option<Duration> {
    let mut ttl = within.max(caps.min_ttl).max(Duration::from_millis(1));
    let g = caps.ttl_granularity.as_nanos();
    if g > 1 {
        let n = ttl.as_nanos().div_ceil(g).saturating_mul(g);
        ttl = Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX));
    }
    (ttl <= crate::lease::MAX_TTL).then_some(ttl)
}

/// How long to reserve the lead for a successor that may claim `within` after the release: the
/// reservation is written before the drain and the release, so it also covers the drain
/// timeout `drain` (while work holds a drain guard: `draining`) and the release (bounded by the
/// op timeout `op`); once the release returned it is cut back to `within` from then.
pub(super) fn reserve_for(
    within: Duration,
    drain: Duration,
    draining: bool,
    op: Duration,
) -> Duration {
    let drain = if draining { drain } else { Duration::ZERO };
    within.saturating_add(drain).saturating_add(op)
}

/// Whether the reservation written for `successor` with token `reserved` still stands (so it
/// may be cut back): the successor has not claimed it, nobody replaced it.
pub(super) fn still_reserved(
    holder: Option<&Holder>,
    successor: &OwnerId,
    reserved: FencingToken,
) -> bool {
    holder.is_some_and(|h| h.owner == *successor && h.token == reserved)
}

/// Why a term ended when its lease's health became final (`Released` only when the guard was
/// released by the campaign itself).
pub(super) fn lost_reason(health: Health) -> StepDownReason {
    match health {
        Health::Lost(r) => StepDownReason::Lost(r),
        _ => StepDownReason::Resigned,
    }
}

/// How many preferred candidates are better than one of `rank` among `preferred` (all of them
/// if it is not preferred): the leader yields to any of them present.
pub(super) fn better_than(rank: Option<usize>, preferred: usize) -> usize {
    rank.unwrap_or(preferred)
}

/// The presence key to claim this round: a preferred candidate's own (by its `rank`), if it
/// holds no live presence lease (`held_final`: whether the one it holds has ended).
pub(super) fn presence_to_claim(
    rank: Option<usize>,
    held_final: Option<bool>,
    keys: &[LeaseKey],
) -> Option<&LeaseKey> {
    let r = rank?;
    if held_final == Some(false) {
        return None;
    }
    keys.get(r)
}

/// Whom to yield to: the best preferred candidate present, unless that is this candidate's own
/// id (another instance of it).
pub(super) fn yield_to(present: Option<OwnerId>, identity: &OwnerId) -> Option<OwnerId> {
    present.filter(|s| s != identity)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
