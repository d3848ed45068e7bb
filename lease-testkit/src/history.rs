//! A history recorder and checker for lease operations and fenced writes.
//!
//! Record the invocation and completion (monotonic timestamps) of every acquire, renew, release
//! and fenced write, then [`History::check`] that:
//! - no two leases were granted overlapping in the time their holders believed them valid;
//! - tokens increase in grant order (and no token is granted twice);
//! - accepted fenced writes never go backwards in token order.

use std::sync::{Arc, Mutex};

use lease_core::{FencingToken, LeaseKey, OwnerId};
use tokio::time::Instant;

/// One recorded operation.
#[derive(Debug, Clone)]
pub struct Event {
    /// Which client did it (a task or process name).
    pub client: String,
    /// The key.
    pub key: LeaseKey,
    /// When it was invoked.
    pub invoked: Instant,
    /// When it completed (answered, failed or timed out).
    pub completed: Instant,
    /// What it was and how it ended.
    pub op: Op,
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
    /// A renewal reported lost.
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
    /// A fenced write.
    Write {
        /// The token presented.
        token: FencingToken,
        /// Whether the resource accepted it.
        accepted: bool,
    },
    /// An operation whose outcome is unknown (timeout, dropped connection).
    Unknown {
        /// What was attempted.
        what: &'static str,
    },
}

/// A shared, cloneable recorder.
#[derive(Debug, Clone, Default)]
pub struct History {
    events: Arc<Mutex<Vec<Event>>>,
}

/// A violation found by the checker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an operation invoked at `invoked` that completed now.
    pub fn record(&self, client: &str, key: &LeaseKey, invoked: Instant, op: Op) {
        let ev = Event {
            client: client.to_string(),
            key: key.clone(),
            invoked,
            completed: Instant::now(),
            op,
        };
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

    /// Checks every property; returns all violations found (empty when the history is legal).
    pub fn check(&self) -> Vec<Violation> {
        let events = self.events();
        let mut out = Vec::new();
        let mut keys: Vec<&LeaseKey> = events.iter().map(|e| &e.key).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let evs: Vec<&Event> = events.iter().filter(|e| &e.key == key).collect();
            check_grants(key, &evs, &mut out);
            check_writes(key, &evs, &mut out);
        }
        out
    }

    /// A readable dump of the history, for failure reports.
    pub fn dump(&self) -> String {
        let mut ev = self.events();
        ev.sort_by_key(|e| e.invoked);
        let t0 = ev.first().map(|e| e.invoked);
        let mut s = String::new();
        for e in ev {
            let base = t0.unwrap_or(e.invoked);
            s.push_str(&format!(
                "{:>8.1}ms..{:>8.1}ms {:<12} {} {:?}\n",
                (e.invoked - base).as_secs_f64() * 1e3,
                (e.completed - base).as_secs_f64() * 1e3,
                e.client,
                e.key,
                e.op
            ));
        }
        s
    }
}

struct Grant<'a> {
    ev: &'a Event,
    token: FencingToken,
    /// Until when the holder believed it held the lease: the latest confirmed deadline, cut short
    /// by the first release invocation or lost renewal.
    believed_until: Instant,
}

fn check_grants(key: &LeaseKey, evs: &[&Event], out: &mut Vec<Violation>) {
    let mut grants: Vec<Grant<'_>> = Vec::new();
    for e in evs {
        if let Op::Granted {
            token, deadline, ..
        } = e.op
        {
            let mut until = deadline;
            for f in evs {
                match f.op {
                    Op::Renewed {
                        token: t,
                        deadline: d,
                    } if t == token => until = until.max(d),
                    _ => {}
                }
            }
            for f in evs {
                match f.op {
                    Op::Release { token: t } | Op::RenewLost { token: t } if t == token => {
                        until = until.min(f.invoked.max(e.completed));
                    }
                    _ => {}
                }
            }
            grants.push(Grant {
                ev: e,
                token,
                believed_until: until,
            });
        }
    }
    grants.sort_by_key(|g| g.ev.completed);
    for (i, a) in grants.iter().enumerate() {
        for b in &grants[i + 1..] {
            if a.token == b.token {
                out.push(Violation(format!(
                    "{key}: token {} granted twice ({} and {})",
                    a.token, a.ev.client, b.ev.client
                )));
            }
            // a completed before b was invoked: b must carry the greater token.
            if a.ev.completed < b.ev.invoked && b.token <= a.token {
                out.push(Violation(format!(
                    "{key}: grant to {} with token {} came after grant to {} with token {}",
                    b.ev.client, b.token, a.ev.client, a.token
                )));
            }
        }
    }
    // Overlap: the later grant (greater token) completed while the earlier holder still believed
    // it held the lease.
    for a in &grants {
        for b in &grants {
            if b.token > a.token
                && b.ev.completed < a.believed_until
                && b.ev.completed > a.ev.invoked
            {
                out.push(Violation(format!(
                    "{key}: {} was granted token {} while {} still believed it held token {} ({:?} before its deadline)",
                    b.ev.client,
                    b.token,
                    a.ev.client,
                    a.token,
                    a.believed_until - b.ev.completed
                )));
            }
        }
    }
}

fn check_writes(key: &LeaseKey, evs: &[&Event], out: &mut Vec<Violation>) {
    let mut writes: Vec<(&Event, FencingToken)> = evs
        .iter()
        .filter_map(|e| match e.op {
            Op::Write {
                token,
                accepted: true,
            } => Some((*e, token)),
            _ => None,
        })
        .collect();
    writes.sort_by_key(|(e, _)| e.completed);
    for (i, (a, ta)) in writes.iter().enumerate() {
        for (b, tb) in &writes[i + 1..] {
            if a.completed < b.invoked && tb < ta {
                out.push(Violation(format!(
                    "{key}: write by {} with token {tb} accepted after a write by {} with token {ta}",
                    b.client, a.client
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn detects_overlap_regression_and_stale_write() {
        let h = History::new();
        let key = LeaseKey::new("k").unwrap();
        let a = OwnerId::random();
        let t0 = Instant::now();
        h.record(
            "a",
            &key,
            t0,
            Op::Granted {
                owner: a.clone(),
                token: t(2),
                deadline: t0 + Duration::from_secs(10),
            },
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        h.record(
            "b",
            &key,
            t1,
            Op::Granted {
                owner: a.clone(),
                token: t(3),
                deadline: t1 + Duration::from_secs(10),
            },
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let t2 = Instant::now();
        h.record(
            "b",
            &key,
            t2,
            Op::Write {
                token: t(3),
                accepted: true,
            },
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let t3 = Instant::now();
        h.record(
            "a",
            &key,
            t3,
            Op::Write {
                token: t(2),
                accepted: true,
            },
        );
        h.record(
            "c",
            &key,
            t3,
            Op::Granted {
                owner: a,
                token: t(1),
                deadline: t3,
            },
        );
        let v = h.check();
        let text: Vec<String> = v.iter().map(|v| v.0.clone()).collect();
        assert!(
            text.iter().any(|s| s.contains("still believed")),
            "{text:?}"
        );
        assert!(text.iter().any(|s| s.contains("came after")), "{text:?}");
        assert!(
            text.iter().any(|s| s.contains("write by a with token 2")),
            "{text:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn legal_history_passes() {
        let h = History::new();
        let key = LeaseKey::new("k").unwrap();
        let o = OwnerId::random();
        let t0 = Instant::now();
        h.record(
            "a",
            &key,
            t0,
            Op::Granted {
                owner: o.clone(),
                token: t(1),
                deadline: t0 + Duration::from_secs(1),
            },
        );
        h.record(
            "a",
            &key,
            t0,
            Op::Write {
                token: t(1),
                accepted: true,
            },
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        h.record("a", &key, Instant::now(), Op::Release { token: t(1) });
        tokio::time::advance(Duration::from_millis(10)).await;
        let t1 = Instant::now();
        h.record(
            "b",
            &key,
            t1,
            Op::Granted {
                owner: o,
                token: t(2),
                deadline: t1 + Duration::from_secs(1),
            },
        );
        h.record(
            "b",
            &key,
            t1,
            Op::Write {
                token: t(2),
                accepted: true,
            },
        );
        assert!(h.check().is_empty(), "{:?}", h.check());
    }
}
