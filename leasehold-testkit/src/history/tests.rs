//! The checker against hand-written histories: each bad one names the kind it must produce, each
//! good one must pass.

use std::time::Duration;

use leasehold_core::{FencingToken, LeaseKey, OwnerId};
use tokio::time::Instant;

use super::*;

/// A hand-written history: instants in milliseconds from a base, sequence numbers in the order
/// of the calls (so events written later order later within one instant).
struct Script {
    h: History,
    base: Instant,
    seq: u64,
    key: LeaseKey,
}

fn t(n: u64) -> FencingToken {
    FencingToken::new(n).unwrap()
}

impl Script {
    fn new() -> Self {
        Script {
            h: History::new(),
            base: Instant::now(),
            seq: 0,
            key: LeaseKey::new("k").unwrap(),
        }
    }
    fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }
    fn stamp(&mut self, ms: u64) -> Stamp {
        self.seq += 1;
        Stamp {
            at: self.at(ms),
            seq: self.seq,
        }
    }
    fn ev(&mut self, client: &str, invoked: u64, completed: u64, op: Op) -> &mut Self {
        let invoked = self.stamp(invoked);
        let completed = self.stamp(completed);
        self.h.push(Event {
            client: client.into(),
            key: self.key.clone(),
            invoked,
            completed,
            op,
        });
        self
    }
    fn grant(&mut self, client: &str, at: u64, token: u64, deadline: u64) -> &mut Self {
        let op = Op::Granted {
            owner: OwnerId::with_label(client),
            token: t(token),
            deadline: self.at(deadline),
        };
        self.ev(client, at, at, op)
    }
    fn renew(&mut self, client: &str, at: u64, token: u64, deadline: u64) -> &mut Self {
        let op = Op::Renewed {
            token: t(token),
            deadline: self.at(deadline),
        };
        self.ev(client, at, at, op)
    }
    fn release(&mut self, client: &str, at: u64, token: u64) -> &mut Self {
        self.ev(client, at, at, Op::Release { token: t(token) })
    }
    fn lost(&mut self, client: &str, at: u64, token: u64) -> &mut Self {
        self.ev(client, at, at, Op::RenewLost { token: t(token) })
    }
    fn write(&mut self, client: &str, from: u64, to: u64, token: u64, accepted: bool) -> &mut Self {
        let op = Op::Write {
            token: t(token),
            accepted,
        };
        self.ev(client, from, to, op)
    }
    fn kinds(&self) -> Vec<ViolationKind> {
        let mut k: Vec<ViolationKind> = self.h.check().iter().map(|v| v.kind).collect();
        k.sort();
        k.dedup();
        k
    }
    fn assert_only(&self, kind: ViolationKind) {
        assert_eq!(
            self.kinds(),
            vec![kind],
            "{:#?}\n{}",
            self.h.check(),
            self.h.dump()
        );
    }
    fn assert_clean(&self) {
        assert!(
            self.h.check().is_empty(),
            "{:#?}\n{}",
            self.h.check(),
            self.h.dump()
        );
    }
}

#[test]
fn grant_inside_another_holders_belief_is_an_overlap() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 1000).grant("b", 500, 2, 1500);
    s.assert_only(ViolationKind::OverlappingBelief);
}

#[test]
fn grant_at_the_very_instant_of_the_deadline_is_an_overlap() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 1000).grant("b", 1000, 2, 2000);
    s.assert_only(ViolationKind::OverlappingBelief);
}

#[test]
fn grant_after_the_deadline_is_legal() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 1000).grant("b", 1001, 2, 2000);
    s.assert_clean();
}

#[test]
fn renewal_extends_belief() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 1000)
        .renew("a", 600, 1, 1600)
        .grant("b", 1200, 2, 2200);
    s.assert_only(ViolationKind::OverlappingBelief);
}

#[test]
fn renewal_confirmed_after_the_deadline_is_not_trusted() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 1000)
        .renew("a", 1000, 1, 2000)
        .grant("b", 1200, 2, 2200);
    s.assert_clean();
}

#[test]
fn renewal_of_another_client_does_not_extend_belief() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 1000)
        .renew("x", 600, 1, 1600)
        .grant("b", 1200, 2, 2200);
    s.assert_clean();
}

#[test]
fn release_before_a_grant_at_the_same_instant_is_legal() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 1000)
        .release("a", 500, 1)
        .grant("b", 500, 2, 1500);
    s.assert_clean();
}

#[test]
fn grant_observed_before_a_release_at_the_same_instant_is_an_overlap() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 1000)
        .grant("b", 500, 2, 1500)
        .release("a", 500, 1);
    s.assert_only(ViolationKind::OverlappingBelief);
}

#[test]
fn same_token_twice_is_a_duplicate() {
    let mut s = Script::new();
    s.grant("a", 0, 3, 100).grant("b", 200, 3, 300);
    s.assert_only(ViolationKind::DuplicateToken);
}

#[test]
fn smaller_token_after_a_grant_is_a_regression() {
    let mut s = Script::new();
    s.grant("a", 0, 3, 100).grant("b", 200, 2, 300);
    s.assert_only(ViolationKind::TokenRegression);
}

#[test]
fn increasing_tokens_after_expiry_are_legal() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100)
        .write("a", 10, 20, 1, true)
        .lost("a", 90, 1)
        .grant("b", 200, 2, 300)
        .write("b", 210, 220, 2, true)
        .release("b", 230, 2)
        .grant("a", 240, 3, 340);
    s.assert_clean();
}

#[test]
fn lower_token_accepted_after_a_higher_one_is_a_stale_write() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100)
        .grant("b", 200, 2, 300)
        .write("b", 210, 220, 2, true)
        .ev(
            "a",
            230,
            240,
            Op::LateWrite {
                token: t(1),
                accepted: true,
            },
        );
    s.assert_only(ViolationKind::StaleWriteAccepted);
}

/// The shape of the Redis soak, seed 97: c2 is granted token 2 and its first write fails at the
/// same instant with an unknown outcome; c1 (lost) then writes late with token 1 and the resource
/// accepts it; c2 writes on with token 2. `unknown_write` adds the unknown write of c2.
fn seed_97(unknown_write: bool) -> Script {
    let mut s = Script::new();
    s.grant("c1", 0, 1, 100)
        .write("c1", 10, 20, 1, true)
        .lost("c1", 90, 1)
        .grant("c2", 150, 2, 300);
    if unknown_write {
        s.ev("c2", 150, 150, Op::Unknown(Attempt::Write(t(2))));
    }
    s.ev(
        "c1",
        160,
        170,
        Op::LateWrite {
            token: t(1),
            accepted: true,
        },
    )
    .write("c2", 180, 190, 2, true);
    s
}

#[test]
fn lower_token_accepted_after_a_write_of_unknown_outcome_is_legal_when_it_may_not_have_applied() {
    let s = seed_97(true);
    s.assert_clean();
    let k = s.key.clone();
    // 3 acknowledged writes; the counter says the unknown write was not applied.
    assert!(s.h.check_counter(&k, 3).is_none());
    assert!(s.h.check_high_water(&k, Some(t(2))).is_none());
}

#[test]
fn lower_token_accepted_after_a_write_of_unknown_outcome_the_counter_shows_applied_is_a_stale_write()
 {
    let s = seed_97(true);
    let k = s.key.clone();
    // 4 applied: the only unknown write took effect before the token-1 write was accepted.
    assert_eq!(
        s.h.check_counter(&k, 4).map(|v| v.kind),
        Some(ViolationKind::StaleWriteAccepted)
    );
    assert_eq!(
        s.h.check_counter(&k, 5).map(|v| v.kind),
        Some(ViolationKind::WriteCountMismatch)
    );
}

#[test]
fn unknown_write_the_counter_may_attribute_elsewhere_is_legal() {
    // Two unknowns: one (token 2, before the accepted token-1 write) cannot have applied, the
    // other (token 2, after it) can: a counter one above the acknowledged writes is explained.
    let mut s = seed_97(true);
    s.ev("c2", 200, 210, Op::Unknown(Attempt::Write(t(2))));
    s.assert_clean();
    let k = s.key.clone();
    assert!(s.h.check_counter(&k, 4).is_none());
    assert_eq!(
        s.h.check_counter(&k, 5).map(|v| v.kind),
        Some(ViolationKind::StaleWriteAccepted)
    );
}

#[test]
fn high_water_only_an_unknown_write_could_set_shows_it_applied() {
    // c2's only write is unknown and the final high-water is its token: it was applied, before
    // the token-1 write was accepted.
    let mut s = Script::new();
    s.grant("c1", 0, 1, 100)
        .lost("c1", 90, 1)
        .grant("c2", 150, 2, 300)
        .ev("c2", 150, 155, Op::Unknown(Attempt::Write(t(2))))
        .ev(
            "c1",
            160,
            170,
            Op::LateWrite {
                token: t(1),
                accepted: true,
            },
        );
    s.assert_clean();
    let k = s.key.clone();
    assert!(s.h.check_high_water(&k, Some(t(1))).is_none());
    assert_eq!(
        s.h.check_high_water(&k, Some(t(2))).map(|v| v.kind),
        Some(ViolationKind::StaleWriteAccepted)
    );
    // A high-water no write presented, or below an accepted token, is a broken resource.
    assert_eq!(
        s.h.check_high_water(&k, Some(t(3))).map(|v| v.kind),
        Some(ViolationKind::WriteCountMismatch)
    );
    assert_eq!(
        s.h.check_high_water(&k, None).map(|v| v.kind),
        Some(ViolationKind::WriteCountMismatch)
    );
}

#[test]
fn without_the_unknown_write_seed_97_is_clean() {
    let s = seed_97(false);
    s.assert_clean();
    assert!(s.h.check_counter(&s.key.clone(), 3).is_none());
}

#[test]
fn rejected_late_write_is_legal() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100)
        .grant("b", 200, 2, 300)
        .write("b", 210, 220, 2, true)
        .ev(
            "a",
            230,
            240,
            Op::LateWrite {
                token: t(1),
                accepted: false,
            },
        );
    s.assert_clean();
}

#[test]
fn write_started_at_the_deadline_is_a_write_after_deadline() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100).write("a", 100, 101, 1, false);
    s.assert_only(ViolationKind::WriteAfterDeadline);
}

#[test]
fn write_still_in_flight_at_the_deadline_is_a_write_after_deadline() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100).write("a", 90, 100, 1, true);
    s.assert_only(ViolationKind::WriteAfterDeadline);
}

#[test]
fn write_abandoned_after_the_deadline_is_a_write_after_deadline() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100)
        .ev("a", 90, 105, Op::Unknown(Attempt::Write(t(1))));
    s.assert_only(ViolationKind::WriteAfterDeadline);
}

#[test]
fn write_after_release_is_a_write_after_deadline() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100)
        .release("a", 50, 1)
        .write("a", 60, 70, 1, true);
    s.assert_only(ViolationKind::WriteAfterDeadline);
}

#[test]
fn write_without_a_grant_is_a_write_after_deadline() {
    let mut s = Script::new();
    s.write("a", 60, 70, 1, true);
    s.assert_only(ViolationKind::WriteAfterDeadline);
}

#[test]
fn writes_inside_a_renewed_lease_are_legal() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100)
        .renew("a", 40, 1, 140)
        .write("a", 110, 120, 1, true)
        .ev("a", 120, 130, Op::Unknown(Attempt::Write(t(1))))
        .release("a", 135, 1);
    s.assert_clean();
}

#[test]
fn loss_reported_at_the_deadline_is_late() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100).lost("a", 100, 1);
    s.assert_only(ViolationKind::LateLoss);
}

#[test]
fn loss_reported_before_the_deadline_is_legal() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100)
        .lost("a", 90, 1)
        .grant("b", 101, 2, 200);
    s.assert_clean();
}

#[test]
fn loss_after_release_is_not_late() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100)
        .release("a", 50, 1)
        .lost("a", 150, 1);
    s.assert_clean();
}

#[test]
fn counter_must_lie_between_acknowledged_and_possible_writes() {
    let mut s = Script::new();
    s.grant("a", 0, 1, 100)
        .write("a", 10, 20, 1, true)
        .write("a", 20, 30, 1, true)
        .ev("a", 30, 40, Op::Unknown(Attempt::Write(t(1))));
    let k = s.key.clone();
    assert!(s.h.check_counter(&k, 2).is_none());
    assert!(s.h.check_counter(&k, 3).is_none());
    assert_eq!(
        s.h.check_counter(&k, 1).map(|v| v.kind),
        Some(ViolationKind::WriteCountMismatch)
    );
    assert_eq!(
        s.h.check_counter(&k, 4).map(|v| v.kind),
        Some(ViolationKind::WriteCountMismatch)
    );
}

#[test]
fn verdict_counts_by_kind() {
    let mut s = Script::new();
    s.grant("a", 0, 3, 1000).grant("b", 500, 2, 1500);
    let v = Verdict::of(&s.h.check());
    assert_eq!(v.count(ViolationKind::OverlappingBelief), 1);
    assert_eq!(v.count(ViolationKind::StaleWriteAccepted), 0);
    assert!(!v.is_clean());
}
