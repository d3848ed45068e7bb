//! The checks behind [`History::check`](super::History::check).

use lease_core::{FencingToken, LeaseKey};
use tokio::time::Instant;

use super::{Attempt, Event, Op, Stamp, Violation, ViolationKind};

/// One grant and the span in which its holder believed it held the lease.
struct Grant<'a> {
    ev: &'a Event,
    token: FencingToken,
    /// Belief starts when the grant's answer arrived.
    start: Stamp,
    /// The latest deadline confirmed while the holder still believed.
    deadline: Instant,
    /// The first release or loss invocation, which ends the belief early.
    cut: Option<Stamp>,
    /// The loss report, if the belief ended by a loss (not a release).
    lost: Option<Stamp>,
}

impl Grant<'_> {
    /// Whether the holder believed it held the lease at `s`. The deadline is exclusive (a holder
    /// believes strictly before it), so an event at the deadline's very instant is inside.
    fn believes_at(&self, s: Stamp) -> bool {
        self.start < s && s.at <= self.deadline && self.cut.is_none_or(|c| s < c)
    }

    fn same(&self, e: &Event, token: FencingToken) -> bool {
        e.client == self.ev.client && token == self.token
    }
}

fn collect<'a>(evs: &[&'a Event]) -> Vec<Grant<'a>> {
    let mut grants = Vec::new();
    for e in evs {
        let Op::Granted {
            token, deadline, ..
        } = e.op
        else {
            continue;
        };
        let mut g = Grant {
            ev: e,
            token,
            start: e.completed,
            deadline,
            cut: None,
            lost: None,
        };
        let mut ends: Vec<(&Event, bool)> = evs
            .iter()
            .filter_map(|f| match f.op {
                Op::Release { token: t } if g.same(f, t) => Some((*f, false)),
                Op::RenewLost { token: t } if g.same(f, t) => Some((*f, true)),
                _ => None,
            })
            .filter(|(f, _)| f.invoked >= e.invoked)
            .collect();
        ends.sort_by_key(|(f, _)| f.invoked);
        if let Some((f, lost)) = ends.first() {
            g.cut = Some(f.invoked);
            g.lost = lost.then_some(f.invoked);
        }
        let mut renewals: Vec<(&Event, Instant)> = evs
            .iter()
            .filter_map(|f| match f.op {
                Op::Renewed { token: t, deadline } if g.same(f, t) => Some((*f, deadline)),
                _ => None,
            })
            .collect();
        renewals.sort_by_key(|(f, _)| f.completed);
        for (f, d) in renewals {
            // A confirmation counts only if it arrived while the holder still believed.
            if f.completed > g.start
                && f.completed.at < g.deadline
                && g.cut.is_none_or(|c| f.completed < c)
            {
                g.deadline = g.deadline.max(d);
            }
        }
        grants.push(g);
    }
    grants.sort_by_key(|g| g.start);
    grants
}

pub(super) fn grants(key: &LeaseKey, evs: &[&Event], out: &mut Vec<Violation>) {
    let grants = collect(evs);
    for (i, a) in grants.iter().enumerate() {
        for b in &grants[i + 1..] {
            if a.token == b.token {
                out.push(Violation::new(
                    ViolationKind::DuplicateToken,
                    format!(
                        "{key}: token {} granted twice ({} and {})",
                        a.token, a.ev.client, b.ev.client
                    ),
                ));
            }
            if a.ev.completed < b.ev.invoked && b.token < a.token {
                out.push(Violation::new(
                    ViolationKind::TokenRegression,
                    format!(
                        "{key}: grant to {} with token {} came after grant to {} with token {}",
                        b.ev.client, b.token, a.ev.client, a.token
                    ),
                ));
            }
            // b's answer arrived after a's: a must have stopped believing by then.
            if a.believes_at(b.start) {
                out.push(Violation::new(
                    ViolationKind::OverlappingBelief,
                    format!(
                        "{key}: {} was granted token {} while {} still believed it held token {} ({:?} before its deadline)",
                        b.ev.client,
                        b.token,
                        a.ev.client,
                        a.token,
                        a.deadline.saturating_duration_since(b.start.at)
                    ),
                ));
            }
        }
        if let Some(l) = a.lost
            && l.at >= a.deadline
        {
            out.push(Violation::new(
                ViolationKind::LateLoss,
                format!(
                    "{key}: {} reported token {} lost {:?} after its local deadline",
                    a.ev.client,
                    a.token,
                    l.at - a.deadline
                ),
            ));
        }
    }
}

pub(super) fn writes(key: &LeaseKey, evs: &[&Event], out: &mut Vec<Violation>) {
    let grants = collect(evs);
    // Writes made by a believing holder must start and end strictly before its deadline.
    for w in evs {
        let token = match w.op {
            Op::Write { token, .. } | Op::Unknown(Attempt::Write(token)) => token,
            _ => continue,
        };
        let Some(g) = grants.iter().rev().find(|g| g.same(w, token)) else {
            out.push(Violation::new(
                ViolationKind::WriteAfterDeadline,
                format!(
                    "{key}: {} wrote with token {token} it was never granted",
                    w.client
                ),
            ));
            continue;
        };
        if !g.believes_at(w.invoked) || w.completed.at >= g.deadline {
            let when = if g.believes_at(w.invoked) {
                "was still in flight at"
            } else {
                "started after"
            };
            out.push(Violation::new(
                ViolationKind::WriteAfterDeadline,
                format!(
                    "{key}: a write by {} with token {token} {when} the end of its lease ({:?})",
                    w.client, w.op
                ),
            ));
        }
    }
    // No write is accepted after a write with a greater token was (possibly) accepted.
    let possibly: Vec<(&Event, FencingToken)> = evs
        .iter()
        .filter_map(|e| match e.op {
            Op::Write {
                token,
                accepted: true,
            }
            | Op::LateWrite {
                token,
                accepted: true,
            }
            | Op::Unknown(Attempt::Write(token) | Attempt::LateWrite(token)) => Some((*e, token)),
            _ => None,
        })
        .collect();
    for b in evs {
        let tb = match b.op {
            Op::Write {
                token,
                accepted: true,
            }
            | Op::LateWrite {
                token,
                accepted: true,
            } => token,
            _ => continue,
        };
        if let Some((a, ta)) = possibly
            .iter()
            .find(|(a, ta)| a.completed < b.invoked && tb < *ta)
        {
            let how = if matches!(a.op, Op::Unknown(_)) {
                "possibly accepted (outcome unknown)"
            } else {
                "accepted"
            };
            out.push(Violation::new(
                ViolationKind::StaleWriteAccepted,
                format!(
                    "{key}: write by {} with token {tb} accepted after a write by {} with token {ta} was {how}",
                    b.client, a.client
                ),
            ));
        }
    }
}
