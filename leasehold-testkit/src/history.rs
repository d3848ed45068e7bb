//! A history recorder and checker for lease operations and fenced writes.
//!
//! Record the invocation and completion of every acquire, renew, release and fenced write (take a
//! [`Stamp`] with [`History::begin`] before the call, then [`History::end`] after it), and
//! [`History::check`] the history. Each violation found carries a [`ViolationKind`]:
//!
//! | kind | what the checker saw |
//! |---|---|
//! | [`OverlappingBelief`](ViolationKind::OverlappingBelief) | a grant completed while another holder still believed it held the key |
//! | [`TokenRegression`](ViolationKind::TokenRegression) | a grant invoked after another grant completed carries a smaller token |
//! | [`DuplicateToken`](ViolationKind::DuplicateToken) | two grants carry the same token |
//! | [`StaleWriteAccepted`](ViolationKind::StaleWriteAccepted) | a write was accepted after a write with a greater token (possibly) was |
//! | [`WriteAfterDeadline`](ViolationKind::WriteAfterDeadline) | a holder's write started, or was still in flight, at or after its local deadline |
//! | [`LateLoss`](ViolationKind::LateLoss) | a holder reported `Lost` at or after its local deadline, or after someone else was granted the key |
//! | [`WriteCountMismatch`](ViolationKind::WriteCountMismatch) | the resource's counter is not between the acknowledged and the possibly applied writes |
//!
//! The checker is strict where the evidence is ambiguous:
//! - **Ties count.** A holder believes it holds a lease strictly before its local deadline, so a
//!   grant (or write) at the very instant of the deadline is judged as overlapping it. Events at
//!   the same instant are ordered by the recorder's sequence numbers, never assumed harmless.
//! - **Unknown outcomes** ([`Op::Unknown`]) may or may not have taken effect: a history is legal
//!   if some choice for them explains it. A stale write needs a greater token that *certainly*
//!   took effect first (an acknowledged accepted write), or an unknown write the resource's final
//!   state shows applied ([`History::check_counter`], [`History::check_high_water`]).
//!   An unanswered renewal never extends the holder's belief (the holder does not know of it).
//! - **Renewals** ([`Op::Renewed`]) extend the holder's belief to the renewed deadline, provided
//!   the confirmation arrived while the holder still believed (a late confirmation is not trusted,
//!   as the supervisor does not trust it).
//! - **Releases and losses** end the belief at their invocation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use leasehold_core::{FencingToken, LeaseKey, OwnerId};
use tokio::time::Instant;

mod check;
#[cfg(test)]
mod tests;

/// An instant plus the recorder's sequence number: orders events that share an instant (common
/// in paused time) by the order in which they were observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp {
    /// The instant.
    pub at: Instant,
    /// The recorder's sequence number (0 for stamps made from a bare instant).
    pub seq: u64,
}

/// One recorded operation.
#[derive(Debug, Clone)]
pub struct Event {
    /// Which client did it (a task or process name).
    pub client: String,
    /// The key.
    pub key: LeaseKey,
    /// When it was invoked.
    pub invoked: Stamp,
    /// When it completed (answered, failed, timed out or was abandoned).
    pub completed: Stamp,
    /// What it was and how it ended.
    pub op: Op,
}

/// What an operation with an unknown outcome attempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// An acquisition (it may have granted a lease nobody knows of: a ghost grant).
    Acquire,
    /// A renewal of the lease with this token (it may have extended the lease at the store).
    Renew(FencingToken),
    /// A release of the lease with this token.
    Release(FencingToken),
    /// A fenced write with this token (it may have been accepted).
    Write(FencingToken),
    /// A [`LateWrite`](Op::LateWrite) with this token (it may have been accepted).
    LateWrite(FencingToken),
}

/// The kinds of operations and their results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A granted acquire, with the holder's local validity deadline.
    Granted {
        /// The owner.
        owner: OwnerId,
        /// The token.
        token: FencingToken,
        /// The local deadline of the grant.
        deadline: Instant,
    },
    /// An acquire refused because the key was held.
    Refused,
    /// A confirmed renewal with the new deadline.
    Renewed {
        /// The token.
        token: FencingToken,
        /// The new local deadline.
        deadline: Instant,
    },
    /// The holder was told its lease is lost (by a refused renewal or its loss deadline); it
    /// stops believing at the invocation.
    RenewLost {
        /// The token.
        token: FencingToken,
    },
    /// A release was invoked (whatever its result): the holder stops believing it holds the lease
    /// at its invocation.
    Release {
        /// The token.
        token: FencingToken,
    },
    /// A fenced write made by a holder that believed it held the lease (it checked
    /// `may_act()` first): it must start and end before the holder's local deadline.
    Write {
        /// The token presented.
        token: FencingToken,
        /// Whether the resource accepted it.
        accepted: bool,
    },
    /// A fenced write made on purpose without checking the lease (a process resuming from a pause
    /// with a stale token): exempt from the deadline check, it must still be rejected once a
    /// greater token was accepted.
    LateWrite {
        /// The token presented.
        token: FencingToken,
        /// Whether the resource accepted it.
        accepted: bool,
    },
    /// An operation whose outcome is unknown (timeout, dropped connection, abandoned).
    Unknown(Attempt),
}

/// The kinds of violation the checker (and the fault suite) can report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViolationKind {
    /// Two holders believed they held the key at the same instant.
    OverlappingBelief,
    /// A later grant carried a smaller token than an earlier one.
    TokenRegression,
    /// Two grants carried the same token.
    DuplicateToken,
    /// A fenced resource accepted a write after it (possibly) accepted a greater token.
    StaleWriteAccepted,
    /// A holder's write started, or was still in flight, at or after its local deadline.
    WriteAfterDeadline,
    /// A holder reported `Lost` at or after its local deadline, or after the store had already
    /// granted the key to someone else (a loss reported after the store's expiry).
    LateLoss,
    /// The resource's counter disagrees with the writes made (acknowledged writes lost, or more
    /// applied than were attempted).
    WriteCountMismatch,
}

impl ViolationKind {
    /// Every kind, in table order.
    pub const ALL: [ViolationKind; 7] = [
        ViolationKind::OverlappingBelief,
        ViolationKind::TokenRegression,
        ViolationKind::DuplicateToken,
        ViolationKind::StaleWriteAccepted,
        ViolationKind::WriteAfterDeadline,
        ViolationKind::LateLoss,
        ViolationKind::WriteCountMismatch,
    ];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::OverlappingBelief => "overlapping belief",
            ViolationKind::TokenRegression => "token regression",
            ViolationKind::DuplicateToken => "duplicate token",
            ViolationKind::StaleWriteAccepted => "stale write accepted",
            ViolationKind::WriteAfterDeadline => "write after deadline",
            ViolationKind::LateLoss => "late loss",
            ViolationKind::WriteCountMismatch => "write count mismatch",
        }
    }
}

impl std::fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A violation found by the checker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which property was broken.
    pub kind: ViolationKind,
    /// What was seen (clients, tokens, instants).
    pub detail: String,
}

impl Violation {
    /// A violation of `kind`.
    pub fn new(kind: ViolationKind, detail: impl Into<String>) -> Self {
        Violation {
            kind,
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

/// Violations counted by kind: the typed result of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    counts: BTreeMap<ViolationKind, u64>,
}

impl Verdict {
    /// Counts `violations`.
    pub fn of(violations: &[Violation]) -> Self {
        let mut v = Verdict::default();
        for x in violations {
            v.add(x.kind, 1);
        }
        v
    }

    /// Adds `n` violations of `kind`.
    pub fn add(&mut self, kind: ViolationKind, n: u64) {
        if n > 0 {
            *self.counts.entry(kind).or_default() += n;
        }
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Verdict) {
        for (k, n) in &other.counts {
            self.add(*k, *n);
        }
    }

    /// How many violations of `kind`.
    pub fn count(&self, kind: ViolationKind) -> u64 {
        self.counts.get(&kind).copied().unwrap_or(0)
    }

    /// All violations.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// No violation at all.
    pub fn is_clean(&self) -> bool {
        self.total() == 0
    }
}

/// A shared, cloneable recorder.
#[derive(Debug, Clone, Default)]
pub struct History {
    events: Arc<Mutex<Vec<Event>>>,
    seq: Arc<AtomicU64>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// A stamp for now: take it just before invoking an operation.
    pub fn begin(&self) -> Stamp {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        Stamp {
            at: Instant::now(),
            seq,
        }
    }

    /// Records an operation invoked at `invoked` (from [`begin`](Self::begin)) that completed
    /// now.
    pub fn end(&self, client: &str, key: &LeaseKey, invoked: Stamp, op: Op) {
        let completed = self.begin();
        self.push(Event {
            client: client.to_string(),
            key: key.clone(),
            invoked,
            completed,
            op,
        });
    }

    /// Records an operation invoked at the bare instant `invoked` that completed now. Prefer
    /// [`begin`](Self::begin) and [`end`](Self::end): a bare instant orders before every event
    /// of the same instant.
    pub fn record(&self, client: &str, key: &LeaseKey, invoked: Instant, op: Op) {
        self.end(
            client,
            key,
            Stamp {
                at: invoked,
                seq: 0,
            },
            op,
        );
    }

    /// Records an already built event (hand-written histories in tests).
    pub fn push(&self, ev: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ev);
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The tokens of all grants, in completion order.
    pub fn granted_tokens(&self) -> Vec<FencingToken> {
        let mut ev = self.events();
        ev.sort_by_key(|e| e.completed);
        ev.iter()
            .filter_map(|e| match e.op {
                Op::Granted { token, .. } => Some(token),
                _ => None,
            })
            .collect()
    }

    /// How many operations ended with an unknown outcome.
    pub fn unknown_outcomes(&self) -> u64 {
        self.events()
            .iter()
            .filter(|e| matches!(e.op, Op::Unknown(_)))
            .count() as u64
    }

    /// Checks every property; returns all violations found (empty when the history is legal).
    pub fn check(&self) -> Vec<Violation> {
        let events = self.events();
        let mut out = Vec::new();
        let mut keys: Vec<&LeaseKey> = events.iter().map(|e| &e.key).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let evs: Vec<&Event> = events.iter().filter(|e| &e.key == key).collect();
            check::grants(key, &evs, &mut out);
            check::writes(key, &evs, &mut out);
        }
        out
    }

    /// Checks a counter the writers incremented by one per write: it must lie between the
    /// acknowledged writes (accepted answers) and those plus the writes of unknown outcome
    /// ([`WriteCountMismatch`](ViolationKind::WriteCountMismatch)); and if it shows more unknown
    /// writes applied than can have been without making an accepted write stale (an unknown
    /// write with a greater token that completed before a smaller token was accepted), it is a
    /// [`StaleWriteAccepted`](ViolationKind::StaleWriteAccepted).
    pub fn check_counter(&self, key: &LeaseKey, counter: i64) -> Option<Violation> {
        let events = self.events();
        let evs: Vec<&Event> = events.iter().filter(|e| &e.key == key).collect();
        check::resource(key, &evs, Some(counter), None)
    }

    /// Checks the resource's final high-water mark: it must be the greatest acknowledged
    /// accepted token, or the token of a write of unknown outcome above it (which then took
    /// effect: a [`StaleWriteAccepted`](ViolationKind::StaleWriteAccepted) if every such write
    /// completed before a smaller token was accepted); anything else is a broken resource
    /// ([`WriteCountMismatch`](ViolationKind::WriteCountMismatch)). Only for resources that
    /// nobody but the recorded writers touched (no installs).
    pub fn check_high_water(
        &self,
        key: &LeaseKey,
        high_water: Option<FencingToken>,
    ) -> Option<Violation> {
        let events = self.events();
        let evs: Vec<&Event> = events.iter().filter(|e| &e.key == key).collect();
        check::resource(key, &evs, None, Some(high_water))
    }

    /// A readable dump of the history, for failure reports.
    pub fn dump(&self) -> String {
        let mut ev = self.events();
        ev.sort_by_key(|e| e.invoked);
        let t0 = ev.first().map(|e| e.invoked.at);
        let mut s = String::new();
        for e in ev {
            let base = t0.unwrap_or(e.invoked.at);
            let ms = |i: Instant| i.saturating_duration_since(base).as_secs_f64() * 1e3;
            let op = match &e.op {
                Op::Granted {
                    token, deadline, ..
                } => format!(
                    "Granted {{ token: {token}, deadline: {:.1}ms }}",
                    ms(*deadline)
                ),
                Op::Renewed { token, deadline } => {
                    format!(
                        "Renewed {{ token: {token}, deadline: {:.1}ms }}",
                        ms(*deadline)
                    )
                }
                other => format!("{other:?}"),
            };
            s.push_str(&format!(
                "{:>8.1}ms..{:>8.1}ms {:<6} {} {op}\n",
                ms(e.invoked.at),
                ms(e.completed.at),
                e.client,
                e.key,
            ));
        }
        s
    }
}
