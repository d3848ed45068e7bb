//! The checks behind [`History::check`](super::History::check).

use leasehold_core::{FencingToken, LeaseKey};
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
    // No write is accepted after a write with a greater token was certainly accepted. A write of
    // unknown outcome may or may not have taken effect; a history is legal if some choice for its
    // unknowns explains it, and the only evidence that an unknown write took effect is the
    // resource's final state ([`resource`]).
    let acked = acknowledged(evs);
    for (b, tb) in &acked {
        if let Some((a, ta)) = acked
            .iter()
            .find(|(a, ta)| a.completed < b.invoked && tb < ta)
        {
            out.push(Violation::new(
                ViolationKind::StaleWriteAccepted,
                format!(
                    "{key}: write by {} with token {tb} accepted after a write by {} with token {ta} was accepted",
                    b.client, a.client
                ),
            ));
        }
    }
}

/// The acknowledged accepted writes (plain and late) with their tokens.
fn acknowledged<'a>(evs: &[&'a Event]) -> Vec<(&'a Event, FencingToken)> {
    evs.iter()
        .filter_map(|e| match e.op {
            Op::Write {
                token,
                accepted: true,
            }
            | Op::LateWrite {
                token,
                accepted: true,
            } => Some((*e, token)),
            _ => None,
        })
        .collect()
}

/// A write of unknown outcome, its token, and the acknowledged write (with its token) it would
/// have made stale had it taken effect.
type Unknown<'a> = (&'a Event, FencingToken, Option<(&'a Event, FencingToken)>);

/// The writes of unknown outcome, each with the acknowledged write that it would have made stale
/// had it taken effect (an accepted write with a smaller token invoked after it completed): such
/// an unknown write cannot have taken effect in any legal explanation.
fn unknowns<'a>(evs: &[&'a Event]) -> Vec<Unknown<'a>> {
    let acked = acknowledged(evs);
    evs.iter()
        .filter_map(|e| match e.op {
            Op::Unknown(Attempt::Write(token) | Attempt::LateWrite(token)) => Some((*e, token)),
            _ => None,
        })
        .map(|(u, tu)| {
            let refuted = acked
                .iter()
                .find(|(b, tb)| u.completed < b.invoked && *tb < tu)
                .copied();
            (u, tu, refuted)
        })
        .collect()
}

/// Checks the resource's final state against the writes: `counter` (one per applied write) and
/// `high_water` (the greatest token applied), when known.
///
/// With `acked` acknowledged writes and `n` unknown ones, of which `r` would each have made an
/// accepted write stale: the counter must lie in `acked..=acked + n` (else the counter is wrong:
/// [`WriteCountMismatch`](ViolationKind::WriteCountMismatch)), and if it exceeds
/// `acked + (n - r)` at least one of the `r` took effect, before a smaller token was accepted:
/// [`StaleWriteAccepted`](ViolationKind::StaleWriteAccepted). The bound `n - r` may exceed what
/// the unknowns among themselves allow (two of them can also exclude each other), so the check
/// can miss a violation but never reports one that some choice of outcomes explains.
///
/// A final high-water above every acknowledged token was set by an unknown write with exactly
/// that token; if every such write would have made an accepted write stale, one of them did.
pub(super) fn resource(
    key: &LeaseKey,
    evs: &[&Event],
    counter: Option<i64>,
    high_water: Option<Option<FencingToken>>,
) -> Option<Violation> {
    let acked = acknowledged(evs);
    let unknown = unknowns(evs);
    let stale = |(u, tu, refuted): &Unknown<'_>, why: &str| {
        let (b, tb) = refuted.expect("only refuted unknowns are named");
        Violation::new(
            ViolationKind::StaleWriteAccepted,
            format!(
                "{key}: {why}, but the write by {} with token {tu} ({:?}, unknown outcome) would have made the write by {} with token {tb}, accepted after it, stale",
                u.client, u.op, b.client
            ),
        )
    };
    if let Some(counter) = counter {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let (a, n) = (count(acked.len()), count(unknown.len()));
        let possible = count(unknown.iter().filter(|u| u.2.is_none()).count());
        if counter < a || counter > a + n {
            return Some(Violation::new(
                ViolationKind::WriteCountMismatch,
                format!(
                    "{key}: counter {counter}, but {a} acknowledged writes and {n} of unknown outcome"
                ),
            ));
        }
        if counter > a + possible {
            let u = unknown.iter().find(|u| u.2.is_some())?;
            let why = format!(
                "counter {counter} shows {} of the unknown writes applied and at most {possible} can have been without a stale write",
                counter - a
            );
            return Some(stale(u, &why));
        }
    }
    if let Some(hw) = high_water {
        let max_acked = acked.iter().map(|(_, t)| *t).max();
        let broken = |why: String| {
            Some(Violation::new(
                ViolationKind::WriteCountMismatch,
                format!("{key}: {why}"),
            ))
        };
        match (hw, max_acked) {
            (None, Some(m)) => return broken(format!("no high-water, but token {m} was accepted")),
            (Some(h), Some(m)) if h < m => {
                return broken(format!("high-water {h} below the accepted token {m}"));
            }
            (Some(h), m) if m.is_none_or(|m| h > m) => {
                let setters: Vec<_> = unknown.iter().filter(|u| u.1 == h).collect();
                if setters.is_empty() {
                    return broken(format!("high-water {h} was presented by no write"));
                }
                if setters.iter().all(|u| u.2.is_some()) {
                    let why =
                        format!("the final high-water {h} shows an unknown write with it applied");
                    return Some(stale(setters[0], &why));
                }
            }
            _ => {}
        }
    }
    None
}
