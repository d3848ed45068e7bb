//! The renewal task's decisions, without a store or a timer: every instant is given.

use super::*;
use crate::error::Error;
use crate::fencing::FencingToken;
use crate::lease::{LeaseKey, OwnerId};

const TTL: Duration = Duration::from_secs(9);

fn lease(now: Instant) -> Lease {
    Lease::granted(
        LeaseKey::new("k").unwrap(),
        OwnerId::with_label("a"),
        FencingToken::MIN,
        TTL,
        Duration::ZERO,
        now,
    )
}

/// A machine renewing every 3 s, retrying every 500 ms, declaring loss 100 ms before the deadline
/// (at `t0 + 8.9 s`).
fn machine(t0: Instant) -> Machine {
    Machine::new(
        lease(t0),
        Duration::from_secs(3),
        Duration::from_millis(500),
        Duration::from_millis(100),
        t0,
    )
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_held_lease_renews_on_the_grid_and_one_at_risk_on_its_own_timing() {
    let t0 = Instant::now();
    let at = t0 + ms(3000);
    let grid = |mono: Instant| mono - ms(200);
    assert_eq!(
        renew_time(at, Health::Held, Duration::ZERO, grid),
        at - ms(200)
    );
    // The grid runs on tokio's clock, `suspended` behind the validity clock: the point is taken
    // there and moved back.
    let seen = std::cell::Cell::new(None);
    let grid = |mono: Instant| {
        seen.set(Some(mono));
        mono - ms(200)
    };
    assert_eq!(renew_time(at, Health::Held, ms(1000), grid), at - ms(200));
    assert_eq!(seen.get(), Some(at - ms(1000)));
    let never = |_: Instant| -> Instant { panic!("a lease at risk is not aligned") };
    assert_eq!(renew_time(at, Health::AtRisk, ms(1000), never), at);
}

#[test]
fn a_wake_up_at_or_past_the_loss_deadline_sends_nothing() {
    let t0 = Instant::now();
    let deadline = t0 + ms(8900);
    assert_eq!(due(t0, deadline), Due::Renewal);
    assert_eq!(due(deadline - ms(1), deadline), Due::Renewal);
    assert_eq!(due(deadline, deadline), Due::LossDeadline);
    assert_eq!(due(deadline + ms(1), deadline), Due::LossDeadline);
}

#[test]
fn a_renewal_is_bounded_by_the_op_timeout_and_the_loss_deadline() {
    let t0 = Instant::now();
    let deadline = t0 + ms(8900);
    assert_eq!(
        renewal_bound(t0, Duration::ZERO, ms(2000), deadline),
        t0 + ms(2000)
    );
    // Sent on tokio's clock with 1 s suspended: the bound is on the validity clock.
    assert_eq!(
        renewal_bound(t0, ms(1000), ms(2000), deadline),
        t0 + ms(3000)
    );
    assert_eq!(renewal_bound(t0, ms(8000), ms(2000), deadline), deadline);
    assert_eq!(
        renewal_bound(t0, Duration::ZERO, Duration::MAX, deadline),
        deadline
    );
}

#[test]
fn each_renewal_answer_has_its_event_and_hook_result() {
    let t0 = Instant::now();
    let l = lease(t0);
    let left = || ms(4000);
    let unasked = || -> Duration { panic!("only a confirmation asks for the validity left") };
    assert_eq!(
        judge_renewal(Some(Ok(RenewOutcome::Renewed(l.clone()))), left),
        (
            Event::RenewConfirmed(l),
            RenewalResult::Confirmed {
                remaining_before: ms(4000)
            }
        )
    );
    assert_eq!(
        judge_renewal(Some(Ok(RenewOutcome::Lost)), unasked),
        (Event::RenewRefused, RenewalResult::Refused)
    );
    let retryable = Error::unavailable("test", "connection reset", None);
    assert_eq!(
        judge_renewal(Some(Err(retryable)), unasked),
        (Event::RenewFailed, RenewalResult::Failed)
    );
    let fatal = Error::store_fault("test", "corrupt record", None);
    assert_eq!(
        judge_renewal(Some(Err(fatal)), unasked),
        (Event::RenewFatal, RenewalResult::Failed)
    );
    assert_eq!(
        judge_renewal(None, unasked),
        (Event::RenewFailed, RenewalResult::TimedOut)
    );
}

#[test]
fn the_hook_hears_of_the_confirmed_lease_or_else_the_one_sent() {
    let t0 = Instant::now();
    let sent = lease(t0);
    let confirmed = sent.renewed(TTL, t0 + ms(3000));
    let event = Event::RenewConfirmed(confirmed.clone());
    assert_eq!(renewal_subject(&event, &sent), &confirmed);
    assert_eq!(renewal_subject(&Event::RenewFailed, &sent), &sent);
}

#[test]
fn a_confirmation_in_time_is_shown_as_issued_and_kept_on_the_validity_clock() {
    let t0 = Instant::now();
    let mut m = machine(t0);
    let t1 = t0 + ms(3000);
    let issued = m.lease().renewed(TTL, t1);
    let shown = apply_renewal(&mut m, Event::RenewConfirmed(issued.clone()), ms(500), t1);
    assert_eq!(shown, Some(issued.clone()));
    assert_eq!(m.health(), Health::Held);
    assert_eq!(m.lease().deadline(), issued.deadline() + ms(500));
}

#[test]
fn a_confirmation_too_late_or_with_an_earlier_deadline_is_not_shown() {
    let t0 = Instant::now();
    // Too late: past the loss deadline and past its own deadline.
    let mut m = machine(t0);
    let stale = m.lease().renewed(TTL, t0);
    let late = t0 + ms(9500);
    assert_eq!(
        apply_renewal(&mut m, Event::RenewConfirmed(stale), Duration::ZERO, late),
        None
    );
    assert!(m.health().is_final());
    // An earlier deadline than the machine holds: it stays held on the later one.
    let mut m = machine(t0);
    let t1 = t0 + ms(3000);
    let later = m.lease().renewed(TTL, t1);
    assert!(
        apply_renewal(
            &mut m,
            Event::RenewConfirmed(later.clone()),
            Duration::ZERO,
            t1
        )
        .is_some()
    );
    let earlier = m.lease().renewed(TTL, t0 + ms(1000));
    assert_eq!(
        apply_renewal(&mut m, Event::RenewConfirmed(earlier), Duration::ZERO, t1),
        None
    );
    assert_eq!(m.health(), Health::Held);
    assert_eq!(m.lease(), &later);
}

#[test]
fn a_failed_or_refused_renewal_shows_nothing_new() {
    let t0 = Instant::now();
    let t1 = t0 + ms(3000);
    let mut m = machine(t0);
    assert_eq!(
        apply_renewal(&mut m, Event::RenewFailed, Duration::ZERO, t1),
        None
    );
    assert_eq!(m.health(), Health::AtRisk);
    assert_eq!(
        apply_renewal(&mut m, Event::RenewRefused, Duration::ZERO, t1),
        None
    );
    assert!(m.health().is_final());
}

#[test]
fn the_release_is_bounded_by_the_validity_left_but_always_sent() {
    assert_eq!(release_bound(ms(2000), ms(5000)), ms(2000));
    assert_eq!(release_bound(ms(2000), ms(300)), ms(300));
    assert_eq!(release_bound(ms(2000), Duration::ZERO), ms(1));
}

#[test]
fn a_release_that_fails_or_times_out_is_not_held() {
    assert_eq!(
        judge_release(Some(Ok(ReleaseOutcome::Released))),
        (ReleaseOutcome::Released, Event::Released)
    );
    assert_eq!(
        judge_release(Some(Ok(ReleaseOutcome::NotHeld))),
        (ReleaseOutcome::NotHeld, Event::ReleaseNotHeld)
    );
    let e = Error::unavailable("test", "connection reset", None);
    assert_eq!(
        judge_release(Some(Err(e))),
        (ReleaseOutcome::NotHeld, Event::ReleaseNotHeld)
    );
    assert_eq!(
        judge_release(None),
        (ReleaseOutcome::NotHeld, Event::ReleaseNotHeld)
    );
}
