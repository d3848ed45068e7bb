//! The campaign's decisions, each without a store.

use super::*;
use crate::supervisor::LossReason;

fn owner(s: &str) -> OwnerId {
    OwnerId::new(s).expect("legal owner")
}

fn holder(o: &str, token: u64, remaining: Duration) -> Holder {
    Holder {
        owner: owner(o),
        token: FencingToken::new(token).expect("legal token"),
        remaining,
        ttl: remaining,
    }
}

#[test]
fn a_reservation_is_clear_for_its_identity_or_instance_and_stands_for_others() {
    let (id, inst) = (owner("a"), owner("a#0123456789abcdef"));
    let s = Duration::from_secs(2);
    assert_eq!(reservation_of(None, &id, &inst), Reservation::Clear);
    assert_eq!(
        reservation_of(Some(holder("a", 1, s)), &id, &inst),
        Reservation::Clear
    );
    assert_eq!(
        reservation_of(Some(holder("a#0123456789abcdef", 1, s)), &id, &inst),
        Reservation::Clear
    );
    assert_eq!(
        reservation_of(Some(holder("b", 1, s)), &id, &inst),
        Reservation::ForOther(s)
    );
    // Another instance of the same id is not this candidate.
    assert_eq!(
        reservation_of(Some(holder("a#fedcba9876543210", 1, s)), &id, &inst),
        Reservation::ForOther(s)
    );
}

#[test]
fn a_candidate_campaigns_and_leads_only_while_the_reservation_is_clear() {
    let ms = Duration::from_millis;
    let tick = ms(300);
    assert_eq!(gate(Reservation::Clear, tick), Gate::Campaign);
    assert_eq!(
        gate(Reservation::ForOther(ms(5_000)), tick),
        Gate::StayOut(tick)
    );
    assert_eq!(
        gate(Reservation::ForOther(ms(20)), tick),
        Gate::StayOut(ms(20)),
        "until it expires"
    );
    assert_eq!(after_acquire(Reservation::Clear), Won::Lead);
    assert_eq!(
        after_acquire(Reservation::ForOther(ms(1))),
        Won::GiveBack,
        "written between the reading and the acquisition"
    );
    // A new leader removes a reservation for itself (identity or instance), not another's.
    let (id, inst) = (owner("a"), owner("a#0123456789abcdef"));
    let s = Duration::from_secs(2);
    assert_eq!(to_clear(None, &id, &inst), None);
    assert_eq!(
        to_clear(Some(holder("a", 4, s)), &id, &inst),
        Some(holder("a", 4, s))
    );
    assert_eq!(
        to_clear(Some(holder("a#0123456789abcdef", 4, s)), &id, &inst),
        Some(holder("a#0123456789abcdef", 4, s))
    );
    assert_eq!(to_clear(Some(holder("b", 4, s)), &id, &inst), None);
}

#[test]
fn waits_are_bounded_and_never_zero() {
    let ms = Duration::from_millis;
    assert_eq!(recheck_after(ms(5_000), ms(300)), ms(300));
    assert_eq!(recheck_after(ms(20), ms(300)), ms(20));
    assert_eq!(recheck_after(Duration::ZERO, ms(300)), ms(1));
    assert_eq!(recheck_after(Duration::MAX, Duration::MAX), Duration::MAX);
    // An unreadable reservation: the shortest backoff, never past the bound; then clear.
    assert_eq!(unreadable_pause(ms(0), ms(1_000), ms(50)), Some(ms(50)));
    assert_eq!(unreadable_pause(ms(980), ms(1_000), ms(50)), Some(ms(20)));
    assert_eq!(unreadable_pause(ms(1_000), ms(1_000), ms(50)), None);
    assert_eq!(unreadable_pause(Duration::MAX, ms(1_000), ms(50)), None);
    assert_eq!(
        unreadable_pause(ms(0), ms(1_000), Duration::ZERO),
        Some(ms(1))
    );
    assert_eq!(
        unreadable_pause(ms(0), Duration::ZERO, ms(50)),
        None,
        "bound 0: fail open"
    );
}

#[test]
fn a_reservation_covers_the_drain_and_the_release_and_its_ttl_fits_the_store() {
    let s = Duration::from_secs;
    assert_eq!(reserve_for(s(5), s(2), true, s(1)), s(8));
    assert_eq!(
        reserve_for(s(5), s(2), false, s(1)),
        s(6),
        "nothing to drain"
    );
    assert_eq!(reserve_for(Duration::MAX, s(2), true, s(1)), Duration::MAX);
    let mut caps = crate::LeaseStore::capabilities(&crate::MemoryLeaseStore::new());
    caps.ttl_granularity = s(1);
    caps.min_ttl = s(2);
    assert_eq!(
        reservation_ttl(Duration::from_millis(2_500), &caps),
        Some(s(3))
    );
    assert_eq!(reservation_ttl(Duration::ZERO, &caps), Some(s(2)));
    assert_eq!(
        reservation_ttl(Duration::MAX, &caps),
        None,
        "over a day: not written"
    );
}

#[test]
fn a_reservation_is_cut_back_only_while_it_still_stands() {
    let succ = owner("c");
    let t = FencingToken::new(7).expect("legal");
    let s = Duration::from_secs(1);
    assert!(still_reserved(Some(&holder("c", 7, s)), &succ, t));
    assert!(
        !still_reserved(Some(&holder("c", 8, s)), &succ, t),
        "rewritten"
    );
    assert!(!still_reserved(Some(&holder("d", 7, s)), &succ, t));
    assert!(!still_reserved(None, &succ, t), "claimed or expired");
}

#[test]
fn terms_end_for_the_reason_the_health_gives() {
    assert_eq!(
        lost_reason(Health::Lost(LossReason::RenewalTaskEnded)),
        StepDownReason::Lost(LossReason::RenewalTaskEnded)
    );
    assert_eq!(lost_reason(Health::Released), StepDownReason::Resigned);
}

#[test]
fn preferred_candidates_claim_their_presence_and_the_leader_yields_to_a_better_one() {
    assert_eq!(better_than(Some(1), 3), 1);
    assert_eq!(
        better_than(None, 3),
        3,
        "not preferred: every preferred one is better"
    );
    let keys = vec![LeaseKey::new("p0").unwrap(), LeaseKey::new("p1").unwrap()];
    assert_eq!(presence_to_claim(Some(1), None, &keys), Some(&keys[1]));
    assert_eq!(
        presence_to_claim(Some(1), Some(true), &keys),
        Some(&keys[1]),
        "lost: again"
    );
    assert_eq!(
        presence_to_claim(Some(1), Some(false), &keys),
        None,
        "still held"
    );
    assert_eq!(presence_to_claim(None, None, &keys), None);
    assert_eq!(presence_to_claim(Some(5), None, &keys), None);
    let me = owner("a");
    assert_eq!(yield_to(Some(owner("b")), &me), Some(owner("b")));
    assert_eq!(
        yield_to(Some(owner("a")), &me),
        None,
        "another instance of this id"
    );
    assert_eq!(yield_to(None, &me), None);
}
