//! Trace conformance: does a history recorded against a real backend show only steps the model
//! allows?
//!
//! The model runs in discrete one-second ticks with tiny tokens, so a recorded trace (microsecond
//! instants, real tokens) cannot be fed to [`LeaseModel::next_state`](crate::LeaseModel) literally.
//! Instead [`check`] replays the trace against the model's **rules**, one recorded step at a time,
//! and asks whether some placement of each store-side effect inside its operation's interval
//! (`invoked..completed`, the only thing a client can observe) makes the step one the model
//! allows. The rules and where they come from:
//!
//! | rule | the model's step it checks |
//! |---|---|
//! | [`Rule::DeadlineNotFromSend`] | a grant or renewal's local deadline is `backend::granted_lease` / `Lease::renewed` (real code) of a send instant inside the operation |
//! | [`Rule::TokenNotAboveEarlier`] | the store's token counter: a grant that began after another ended has a greater token, by at least the variant's gap (etcd: 2, the old key's deletion and the new key's creation are both revisions) |
//! | [`Rule::DuplicateToken`] | no two grants share a token |
//! | [`Rule::BelowClockFloor`] | `StoreKind::Row { clock_floor: true }`: a token is at least the store's clock (in microseconds) when the grant began |
//! | [`Rule::GrantWhileHeld`] | the store grants only when the record is not live: no earlier grant's last confirmed extension plus the TTL can lie after the new grant (within the drift bound), unless its holder began a release or (row stores, etcd) is the new grant's owner |
//! | [`Rule::RenewalAfterTakeover`] | the store renews only its current holder: no confirmed renewal of a grant was sent after a greater grant completed |
//! | [`Rule::RefusedWhileFree`] | the store refuses only while some grant may be live |
//! | [`Rule::LateLoss`] | the real `Machine` replayed over the holder's confirmed renewals: loss is reported no later than the lease's deadline (the model's loss timer fires at the loss deadline, before it), unless the recording process was measured stalled from the deadline until the report ([`Obs::Stall`]) |
//! | [`Rule::WriteWithoutBelief`] | the model's holder writes only while it believes: a fenced write starts before the replayed machine's deadline, before its holder reported loss or began a release |
//! | [`Rule::WriteWithUngrantedToken`] | only holders write: every written token was granted |
//! | [`Rule::StaleWriteAccepted`] | `ResourceState::apply`: a write is accepted only if no greater token was accepted before it began |
//! | [`Rule::RejectedWithoutGreaterToken`] | `ResourceState::apply`: a write is rejected only if a greater token may have been accepted before it ended |
//!
//! Operations of unknown outcome may have taken effect at any time after they began (a request
//! can sit in a network buffer), so they only ever make more behaviours possible: an unknown
//! acquisition may explain a refusal, an unknown write a rejection.
//!
//! A loss is reported by the supervisor's renewal task when its timer fires, so a recording
//! process that is not scheduled (a loaded machine) reports it late, through no fault of the
//! model or the library. The recorder measures this: a probe task on the same runtime wakes every
//! millisecond and records each wake-up late by more than [`DEADLINE_TOLERANCE`] as an
//! [`Obs::Stall`] step (`invoked` when it was due, `completed` when it ran). A loss reported after
//! the deadline conforms only if such stalls, chained (each due within the tolerance after the
//! previous one ran), cover the time from the deadline to the report (within the tolerance): the
//! process demonstrably ran no timer then. Stall steps belong to no key.
//!
//! The model has one key. A trace of several keys (each step names its key) is checked as one
//! model per key: every rule runs over one key's steps at a time, and a nonconformance names the
//! step in the whole trace.
//!
//! A trace is a small text file ([`Trace::parse`], [`Trace::to_text`]) so that recorded traces
//! can be kept as fixtures and mutated by hand.

use std::fmt;
use std::time::Duration;

use leasehold_core::supervisor::Health;
use leasehold_core::supervisor::{Event, Machine};
use leasehold_core::{FencingToken, LeaseKey, OwnerId};
use tokio::time::Instant;

use crate::StoreKind;

/// What a recorded operation was and how it ended (the observable part of the model's steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Obs {
    /// Granted, with the token and the holder's local deadline (µs after the trace's start).
    Granted {
        /// The token.
        token: u64,
        /// The local deadline.
        deadline: u64,
    },
    /// The acquisition was refused (held by someone else).
    Refused,
    /// A renewal confirmed, with the new local deadline.
    Renewed {
        /// The token.
        token: u64,
        /// The new local deadline.
        deadline: u64,
    },
    /// The holder reported the lease lost.
    Lost {
        /// The token.
        token: u64,
    },
    /// A release was begun (whatever its answer).
    Release {
        /// The token.
        token: u64,
    },
    /// A fenced write by a holder that checked its lease first.
    Write {
        /// The token presented.
        token: u64,
        /// Whether the resource accepted it.
        accepted: bool,
    },
    /// A fenced write made on purpose without checking the lease (a zombie).
    LateWrite {
        /// The token presented.
        token: u64,
        /// Whether the resource accepted it.
        accepted: bool,
    },
    /// An acquisition of unknown outcome.
    UnknownAcquire,
    /// A renewal of unknown outcome.
    UnknownRenew {
        /// The token.
        token: u64,
    },
    /// A release of unknown outcome.
    UnknownRelease {
        /// The token.
        token: u64,
    },
    /// A write (checked or late) of unknown outcome.
    UnknownWrite {
        /// The token.
        token: u64,
    },
    /// The recording process's timer probe, due at `invoked`, ran only at `completed`: no timer
    /// of the process ran in between (see the module docs). Not an operation of any key.
    Stall,
}

/// One recorded operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The client that made it.
    pub client: String,
    /// The key it was made on: a short name for the trace's keys (`k0`, `k1`, ...), empty in a
    /// trace of one key.
    pub key: String,
    /// When it began, µs after the trace's start.
    pub invoked: u64,
    /// When it ended, µs after the trace's start.
    pub completed: u64,
    /// What it was.
    pub obs: Obs,
}

/// A recorded history of one or more keys, with the parameters the clients used (the same for
/// every key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Which model variant the backend follows.
    pub store: StoreKind,
    /// The TTL requested.
    pub ttl: Duration,
    /// The clients' drift margin (also the bound assumed between client and store clocks).
    pub drift: Duration,
    /// The supervisor's renew interval.
    pub renew_interval: Duration,
    /// The supervisor's loss lead.
    pub loss_lead: Duration,
    /// The wall clock (µs since the Unix epoch) at the trace's start, where known: needed for
    /// [`Rule::BelowClockFloor`].
    pub wall_start_us: Option<u64>,
    /// The steps, in order of invocation.
    pub steps: Vec<Step>,
}

/// The rules a trace step can break (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// A deadline that `backend::granted_lease` / `Lease::renewed` cannot give for a send inside the
    /// operation.
    DeadlineNotFromSend,
    /// A token not above an earlier grant's (by the variant's gap).
    TokenNotAboveEarlier,
    /// Two grants with one token.
    DuplicateToken,
    /// A clock-floored token below the store's clock.
    BelowClockFloor,
    /// A grant while another grant may still be live at the store.
    GrantWhileHeld,
    /// A renewal confirmed to a holder after a later grant took the key.
    RenewalAfterTakeover,
    /// A refusal while no grant can be live.
    RefusedWhileFree,
    /// A loss reported after the holder's deadline.
    LateLoss,
    /// A checked write begun when the model's holder no longer believes.
    WriteWithoutBelief,
    /// A write with a token nobody was granted.
    WriteWithUngrantedToken,
    /// A write accepted after a greater token was accepted.
    StaleWriteAccepted,
    /// A write rejected although no greater token can have been accepted.
    RejectedWithoutGreaterToken,
}

impl Rule {
    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Rule::DeadlineNotFromSend => "deadline not from a send inside the operation",
            Rule::TokenNotAboveEarlier => "token not above an earlier grant's",
            Rule::DuplicateToken => "duplicate token",
            Rule::BelowClockFloor => "token below the clock floor",
            Rule::GrantWhileHeld => "grant while another grant may be live",
            Rule::RenewalAfterTakeover => "renewal confirmed after a takeover",
            Rule::RefusedWhileFree => "refused while no grant can be live",
            Rule::LateLoss => "loss reported after the deadline",
            Rule::WriteWithoutBelief => "checked write after the holder stopped believing",
            Rule::WriteWithUngrantedToken => "write with an ungranted token",
            Rule::StaleWriteAccepted => "stale write accepted",
            Rule::RejectedWithoutGreaterToken => "write rejected without a greater token",
        }
    }
}

/// A step the model does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nonconformance {
    /// The index of the offending step in [`Trace::steps`] (line `step + 1` of the steps in the
    /// text form).
    pub step: usize,
    /// The rule broken.
    pub rule: Rule,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Nonconformance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {}: {}: {}",
            self.step,
            self.rule.name(),
            self.detail
        )
    }
}

/// What a conforming trace contained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Grants checked.
    pub grants: usize,
    /// Confirmed renewals checked.
    pub renewals: usize,
    /// Writes checked (accepted, rejected).
    pub writes: usize,
    /// Rejected writes among them.
    pub rejected: usize,
    /// Steps of unknown outcome.
    pub unknown: usize,
    /// Refusals and losses checked.
    pub other: usize,
    /// Keys checked (each as its own model).
    pub keys: usize,
}

/// An error in a trace's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The 1-based line.
    pub line: usize,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

impl std::error::Error for ParseError {}

fn store_name(s: StoreKind) -> &'static str {
    match s {
        StoreKind::Row { clock_floor: false } => "row",
        StoreKind::Row { clock_floor: true } => "row-clock-floor",
        StoreKind::EtcdLockKey => "etcd-lock-key",
        StoreKind::Kubernetes {
            token_from_own_write: true,
        } => "kubernetes",
        StoreKind::Kubernetes {
            token_from_own_write: false,
        } => "kubernetes-token-from-list",
    }
}

fn parse_store(s: &str) -> Option<StoreKind> {
    Some(match s {
        "row" => StoreKind::Row { clock_floor: false },
        "row-clock-floor" => StoreKind::Row { clock_floor: true },
        "etcd-lock-key" => StoreKind::EtcdLockKey,
        "kubernetes" => StoreKind::Kubernetes {
            token_from_own_write: true,
        },
        "kubernetes-token-from-list" => StoreKind::Kubernetes {
            token_from_own_write: false,
        },
        _ => return None,
    })
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Trace {
    /// The keys of the steps, in order of first appearance (the empty name for a trace of one
    /// key).
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for s in self.steps.iter().filter(|s| s.obs != Obs::Stall) {
            if !keys.contains(&s.key) {
                keys.push(s.key.clone());
            }
        }
        keys
    }

    /// The text form: a header of `name value` lines, then one line per step:
    /// `<invoked µs> <completed µs> <client> [@<key>] <op> [args]` (the key is left out in a trace
    /// of one key), where `op` is one of `granted <token>
    /// <deadline µs>`, `refused`, `renewed <token> <deadline µs>`, `lost <token>`, `release
    /// <token>`, `write <token> accepted|rejected`, `late-write <token> accepted|rejected`,
    /// `unknown-acquire`, `unknown-renew <token>`, `unknown-release <token>`, `unknown-write
    /// <token>`, `stall` (a measured stall of the recording process, without a key). Lines
    /// starting with `#` are comments.
    pub fn to_text(&self) -> String {
        let mut s = String::from("# leasehold-model trace v1\n");
        s.push_str(&format!("store {}\n", store_name(self.store)));
        s.push_str(&format!("ttl_us {}\n", us(self.ttl)));
        s.push_str(&format!("drift_us {}\n", us(self.drift)));
        s.push_str(&format!("renew_us {}\n", us(self.renew_interval)));
        s.push_str(&format!("lead_us {}\n", us(self.loss_lead)));
        if let Some(w) = self.wall_start_us {
            s.push_str(&format!("wall_start_us {w}\n"));
        }
        s.push_str("steps\n");
        for st in &self.steps {
            let ab = |a: bool| if a { "accepted" } else { "rejected" };
            let op = match st.obs {
                Obs::Granted { token, deadline } => format!("granted {token} {deadline}"),
                Obs::Refused => "refused".into(),
                Obs::Renewed { token, deadline } => format!("renewed {token} {deadline}"),
                Obs::Lost { token } => format!("lost {token}"),
                Obs::Release { token } => format!("release {token}"),
                Obs::Write { token, accepted } => format!("write {token} {}", ab(accepted)),
                Obs::LateWrite { token, accepted } => {
                    format!("late-write {token} {}", ab(accepted))
                }
                Obs::UnknownAcquire => "unknown-acquire".into(),
                Obs::UnknownRenew { token } => format!("unknown-renew {token}"),
                Obs::UnknownRelease { token } => format!("unknown-release {token}"),
                Obs::UnknownWrite { token } => format!("unknown-write {token}"),
                Obs::Stall => "stall".into(),
            };
            let key = if st.key.is_empty() {
                String::new()
            } else {
                format!("@{} ", st.key)
            };
            s.push_str(&format!(
                "{} {} {} {key}{op}\n",
                st.invoked, st.completed, st.client
            ));
        }
        s
    }

    /// Parses the text form (see [`to_text`](Self::to_text)).
    ///
    /// # Errors
    /// A [`ParseError`] naming the first bad line.
    pub fn parse(text: &str) -> Result<Trace, ParseError> {
        let mut t = Trace {
            store: StoreKind::Row { clock_floor: false },
            ttl: Duration::ZERO,
            drift: Duration::ZERO,
            renew_interval: Duration::ZERO,
            loss_lead: Duration::ZERO,
            wall_start_us: None,
            steps: Vec::new(),
        };
        let mut in_steps = false;
        let mut have_store = false;
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let err = |what: String| ParseError {
                line: line_no,
                what,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut w: Vec<&str> = line.split_whitespace().collect();
            let mut key = String::new();
            if let Some(k) = w.get(3).and_then(|f| f.strip_prefix('@'))
                && in_steps
            {
                if k.is_empty() {
                    return Err(err("an empty key after @".into()));
                }
                key = k.to_string();
                w.remove(3);
            }
            let num = |k: usize| -> Result<u64, ParseError> {
                w.get(k)
                    .ok_or_else(|| err(format!("missing field {k}")))?
                    .parse::<u64>()
                    .map_err(|e| err(format!("field {k}: {e}")))
            };
            if !in_steps {
                match w[0] {
                    "steps" => in_steps = true,
                    "store" => {
                        t.store = w
                            .get(1)
                            .and_then(|s| parse_store(s))
                            .ok_or_else(|| err(format!("unknown store {:?}", w.get(1))))?;
                        have_store = true;
                    }
                    "ttl_us" => t.ttl = Duration::from_micros(num(1)?),
                    "drift_us" => t.drift = Duration::from_micros(num(1)?),
                    "renew_us" => t.renew_interval = Duration::from_micros(num(1)?),
                    "lead_us" => t.loss_lead = Duration::from_micros(num(1)?),
                    "wall_start_us" => t.wall_start_us = Some(num(1)?),
                    other => return Err(err(format!("unknown header {other:?}"))),
                }
                continue;
            }
            if w.len() < 4 {
                return Err(err("a step needs invoked, completed, client, op".into()));
            }
            let accepted = |k: usize| match w.get(k) {
                Some(&"accepted") => Ok(true),
                Some(&"rejected") => Ok(false),
                other => Err(err(format!("expected accepted|rejected, got {other:?}"))),
            };
            let obs = match w[3] {
                "granted" => Obs::Granted {
                    token: num(4)?,
                    deadline: num(5)?,
                },
                "refused" => Obs::Refused,
                "renewed" => Obs::Renewed {
                    token: num(4)?,
                    deadline: num(5)?,
                },
                "lost" => Obs::Lost { token: num(4)? },
                "release" => Obs::Release { token: num(4)? },
                "write" => Obs::Write {
                    token: num(4)?,
                    accepted: accepted(5)?,
                },
                "late-write" => Obs::LateWrite {
                    token: num(4)?,
                    accepted: accepted(5)?,
                },
                "unknown-acquire" => Obs::UnknownAcquire,
                "unknown-renew" => Obs::UnknownRenew { token: num(4)? },
                "unknown-release" => Obs::UnknownRelease { token: num(4)? },
                "unknown-write" => Obs::UnknownWrite { token: num(4)? },
                "stall" => Obs::Stall,
                other => return Err(err(format!("unknown op {other:?}"))),
            };
            let (invoked, completed) = (num(0)?, num(1)?);
            if completed < invoked {
                return Err(err("completed before invoked".into()));
            }
            t.steps.push(Step {
                client: w[2].to_string(),
                key,
                invoked,
                completed,
                obs,
            });
        }
        if !have_store || t.ttl.is_zero() {
            return Err(ParseError {
                line: 0,
                what: "the header needs `store` and `ttl_us`".into(),
            });
        }
        Ok(t)
    }
}

/// How far a recorded deadline may differ from the one computed from the operation's interval
/// (the recorder stamps the interval a little outside the store call); also how late a loss may
/// be reported after the deadline without a measured stall, and the lateness from which the
/// recorder's probe records a wake-up as an [`Obs::Stall`].
pub const DEADLINE_TOLERANCE: Duration = Duration::from_millis(2);

/// The trace's stalls as windows `(from, to)` in µs, chained: a stall due within `tol` after the
/// previous one ran extends it (the probe runs every millisecond, so a process that stays
/// unscheduled shows as consecutive late wake-ups).
fn stall_windows(trace: &Trace, tol: u64) -> Vec<(u64, u64)> {
    let mut stalls: Vec<(u64, u64)> = trace
        .steps
        .iter()
        .filter(|s| s.obs == Obs::Stall)
        .map(|s| (s.invoked, s.completed))
        .collect();
    stalls.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (from, to) in stalls {
        match out.last_mut() {
            Some(last) if from <= last.1 + tol => last.1 = last.1.max(to),
            _ => out.push((from, to)),
        }
    }
    out
}

/// One grant and what its holder did with it.
#[derive(Debug)]
struct Grant {
    step: usize,
    token: u64,
    /// The send instant the deadline was computed from (µs).
    sent: u64,
    /// Confirmed renewals: (step, sent µs, completed µs).
    renewals: Vec<(usize, u64, u64)>,
    /// Unknown renewals (completed µs).
    unknown_renewals: Vec<u64>,
    /// When its holder first began a release (µs): the store may have dropped the record.
    released: Option<u64>,
    /// When its holder first began a release or reported loss (µs): it stopped believing.
    let_go: Option<u64>,
}

/// Checks `trace` against the model's rules (see the module docs).
///
/// # Errors
/// The first step (in trace order) that no behaviour of the model explains, with the rule.
///
/// # Example
/// ```
/// use leasehold_model::trace::{Rule, Trace, check};
/// let text = "store row\nttl_us 1000000\ndrift_us 21000\nrenew_us 333333\nlead_us 100000\nsteps\n\
///             0 500 a granted 1 979000\n\
///             600 900 a write 1 accepted\n\
///             1000 1200 b granted 1 980200\n";
/// let trace = Trace::parse(text).unwrap();
/// let err = check(&trace).unwrap_err();
/// assert_eq!(err.step, 2);
/// assert!(matches!(err.rule, Rule::TokenNotAboveEarlier | Rule::GrantWhileHeld));
/// ```
pub fn check(trace: &Trace) -> Result<Summary, Nonconformance> {
    let (summary, found) = check_all(trace);
    match found.into_iter().next() {
        Some(n) => Err(n),
        None => Ok(summary),
    }
}

/// Every nonconformance in `trace`, ordered by step and rule (empty when it conforms), and what
/// was checked.
///
/// The model has one key, so a trace of several keys is checked as one model per key: every rule
/// runs over the steps of one key at a time (grants, renewals and writes of one key never explain
/// or contradict another key's), and the nonconformances name steps of the whole trace.
pub fn check_all(trace: &Trace) -> (Summary, Vec<Nonconformance>) {
    let mut found: Vec<Nonconformance> = Vec::new();
    let mut summary = Summary::default();
    let stalls = stall_windows(trace, us(DEADLINE_TOLERANCE));
    for k in trace.keys() {
        let idx: Vec<usize> = (0..trace.steps.len())
            .filter(|&i| trace.steps[i].key == k && trace.steps[i].obs != Obs::Stall)
            .collect();
        let steps: Vec<Step> = idx.iter().map(|&i| trace.steps[i].clone()).collect();
        check_key(trace, &steps, &idx, &stalls, &mut summary, &mut found);
        summary.keys += 1;
    }
    found.sort_by_key(|n| (n.step, n.rule));
    (summary, found)
}

/// Checks the steps of one key (`steps`, whose indices in the whole trace are `idx`).
fn check_key(
    trace: &Trace,
    steps: &[Step],
    idx: &[usize],
    stalls: &[(u64, u64)],
    summary: &mut Summary,
    found: &mut Vec<Nonconformance>,
) {
    let ttl = us(trace.ttl);
    let drift = us(trace.drift);
    let tol = us(DEADLINE_TOLERANCE);
    let base = Instant::now();
    let at = |t: u64| base + Duration::from_micros(t);
    let back = |i: Instant| us(i.saturating_duration_since(base));
    let key = LeaseKey::new("trace").expect("valid key");
    let owner = OwnerId::new("trace").expect("valid owner");
    // The local deadline `backend::granted_lease` gives for a send at `sent` (µs).
    let deadline_for = |token: u64, sent: u64| -> u64 {
        let t = FencingToken::new(token.max(1)).unwrap_or(FencingToken::MIN);
        back(
            leasehold_core::backend::granted_lease(
                key.clone(),
                owner.clone(),
                t,
                trace.ttl,
                trace.drift,
                at(sent),
            )
            .deadline(),
        )
    };
    // The send instant behind a deadline (its inverse).
    let sent_of = |deadline: u64| (deadline + drift).saturating_sub(ttl);
    let mut bad = |step: usize, rule: Rule, detail: String| {
        found.push(Nonconformance {
            step: idx[step],
            rule,
            detail,
        });
    };

    // Pass 1: grants and their renewals, deadlines.
    let mut grants: Vec<Grant> = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        match s.obs {
            Obs::Granted { token, deadline } | Obs::Renewed { token, deadline } => {
                let lo = deadline_for(token, s.invoked);
                let hi = deadline_for(token, s.completed);
                if deadline + tol < lo || deadline > hi + tol {
                    bad(
                        i,
                        Rule::DeadlineNotFromSend,
                        format!(
                            "{} token {token}: deadline {deadline} µs outside {lo}..={hi} µs",
                            s.client
                        ),
                    );
                }
                let sent = sent_of(deadline).clamp(s.invoked, s.completed);
                if matches!(s.obs, Obs::Granted { .. }) {
                    summary.grants += 1;
                    if let Some(g) = grants.iter().find(|g| g.token == token) {
                        bad(
                            i,
                            Rule::DuplicateToken,
                            format!(
                                "{} granted token {token}, as step {} was",
                                s.client, idx[g.step]
                            ),
                        );
                    }
                    grants.push(Grant {
                        step: i,
                        token,
                        sent,
                        renewals: Vec::new(),
                        unknown_renewals: Vec::new(),
                        released: None,
                        let_go: None,
                    });
                } else {
                    summary.renewals += 1;
                    match grants.iter_mut().find(|g| g.token == token) {
                        Some(g) => g.renewals.push((i, sent, s.completed)),
                        None => bad(
                            i,
                            Rule::RenewalAfterTakeover,
                            format!(
                                "{} renewed token {token}, which was never granted",
                                s.client
                            ),
                        ),
                    }
                }
            }
            Obs::UnknownRenew { token } => {
                if let Some(g) = grants.iter_mut().find(|g| g.token == token) {
                    g.unknown_renewals.push(s.completed);
                }
            }
            Obs::Release { token } | Obs::UnknownRelease { token } | Obs::Lost { token } => {
                if let Some(g) = grants.iter_mut().find(|g| g.token == token) {
                    let first = |x: Option<u64>| Some(x.map_or(s.invoked, |l| l.min(s.invoked)));
                    g.let_go = first(g.let_go);
                    if !matches!(s.obs, Obs::Lost { .. }) {
                        g.released = first(g.released);
                    }
                }
            }
            _ => {}
        }
        if matches!(
            s.obs,
            Obs::UnknownAcquire
                | Obs::UnknownRenew { .. }
                | Obs::UnknownRelease { .. }
                | Obs::UnknownWrite { .. }
        ) {
            summary.unknown += 1;
        }
    }

    // Store rules over pairs of grants.
    let gap = match trace.store {
        StoreKind::EtcdLockKey => 2,
        _ => 1,
    };
    for g in &grants {
        let s = &steps[g.step];
        if let (StoreKind::Row { clock_floor: true }, Some(w)) = (trace.store, trace.wall_start_us)
        {
            let floor = (w + s.invoked).saturating_sub(drift);
            if g.token < floor {
                bad(
                    g.step,
                    Rule::BelowClockFloor,
                    format!(
                        "{} granted token {} below the store clock {floor} µs at its start",
                        s.client, g.token
                    ),
                );
            }
        }
        for h in grants.iter().filter(|h| h.step != g.step) {
            let hs = &steps[h.step];
            // h ended before g began: g's token is above h's by the gap.
            if hs.completed < s.invoked && g.token < h.token + gap {
                bad(
                    g.step,
                    Rule::TokenNotAboveEarlier,
                    format!(
                        "{} granted token {} after step {} ({}) was granted {} (gap {gap})",
                        s.client, g.token, idx[h.step], hs.client, h.token
                    ),
                );
            }
            // The row stores and etcd re-grant a live lease to its own owner (a new token).
            let same_owner = hs.client == s.client
                && matches!(trace.store, StoreKind::Row { .. } | StoreKind::EtcdLockKey);
            if h.token < g.token && !same_owner {
                // h's record must not be live at g's grant: its last confirmed extension plus
                // the TTL lies at or before g's completion (with the drift bound), unless h let go.
                let last = h
                    .renewals
                    .iter()
                    .map(|r| r.1)
                    .chain([h.sent])
                    .max()
                    .unwrap_or(h.sent);
                let released = h.released.is_some_and(|l| l <= s.completed);
                if !released && s.completed + drift < last + ttl {
                    bad(
                        g.step,
                        Rule::GrantWhileHeld,
                        format!(
                            "{} granted token {} at {}..{} µs while token {} (step {}) was extended from {last} µs, live at the store until at least {} µs",
                            s.client,
                            g.token,
                            s.invoked,
                            s.completed,
                            h.token,
                            idx[h.step],
                            last + ttl
                        ),
                    );
                }
                for &(r, sent, _) in &h.renewals {
                    if sent.min(steps[r].invoked) > s.completed + drift {
                        bad(
                            r,
                            Rule::RenewalAfterTakeover,
                            format!(
                                "token {} renewed from {sent} µs, after token {} was granted (step {}, completed {} µs)",
                                h.token, g.token, idx[g.step], s.completed
                            ),
                        );
                    }
                }
            }
        }
    }

    // Refusals: some grant may be live inside the refused operation.
    for (i, s) in steps.iter().enumerate() {
        if s.obs != Obs::Refused {
            continue;
        }
        summary.other += 1;
        let ghost = steps[..i]
            .iter()
            .chain(&steps[i + 1..])
            .any(|o| o.obs == Obs::UnknownAcquire && o.invoked < s.completed);
        let live = grants.iter().any(|g| {
            let gs = &steps[g.step];
            let latest = g
                .renewals
                .iter()
                .map(|r| r.2)
                .chain([gs.completed])
                .max()
                .unwrap_or(gs.completed);
            gs.invoked < s.completed
                && (!g.unknown_renewals.is_empty() || latest + ttl + drift > s.invoked)
        });
        if !ghost && !live {
            bad(
                i,
                Rule::RefusedWhileFree,
                format!("{} was refused while no grant can be live", s.client),
            );
        }
    }

    // Holders: replay the real machine over each grant's confirmed renewals.
    let margin_lead = trace.loss_lead;
    for g in &grants {
        let gs = &steps[g.step];
        let t = FencingToken::new(g.token.max(1)).unwrap_or(FencingToken::MIN);
        let lease = leasehold_core::backend::granted_lease(
            key.clone(),
            owner.clone(),
            t,
            trace.ttl,
            trace.drift,
            at(g.sent),
        );
        let machine = Machine::new(
            lease,
            trace.renew_interval,
            trace.renew_interval,
            margin_lead,
            at(gs.completed),
        );
        // The machine as of `when`: confirmed renewals completed by `upto` applied.
        let replay = |upto: u64| -> Machine {
            let mut m = machine.clone();
            let mut rs: Vec<&(usize, u64, u64)> =
                g.renewals.iter().filter(|r| r.2 <= upto).collect();
            rs.sort_by_key(|r| r.2);
            for r in rs {
                let l = m.lease().renewed(trace.ttl, at(r.1));
                m.step(Event::RenewConfirmed(l), at(r.2));
            }
            m
        };
        for (i, s) in steps.iter().enumerate() {
            match s.obs {
                // A loss published by the release path (its answer lost or refused) is the
                // release's outcome, not the loss timer's.
                Obs::Lost { token }
                    if token == g.token && g.released.is_none_or(|r| r > s.invoked) =>
                {
                    summary.other += 1;
                    let m = replay(s.invoked);
                    let deadline = back(m.lease().deadline());
                    // Late only through a measured stall: the process ran no timer from the
                    // deadline until the report (within the tolerance at both ends).
                    let stalled = stalls
                        .iter()
                        .any(|&(from, to)| from <= deadline + tol && to + tol >= s.invoked);
                    if s.invoked > deadline + tol && !stalled {
                        bad(
                            i,
                            Rule::LateLoss,
                            format!(
                                "{} reported the loss of token {token} at {} µs, after its deadline {deadline} µs, no measured stall covering it",
                                s.client, s.invoked
                            ),
                        );
                    }
                }
                Obs::Write { token, .. } if token == g.token => {
                    // Confirmations recorded by the end of the write count: the supervisor
                    // publishes a renewal before its hook records it.
                    let mut m = replay(s.completed);
                    m.step(Event::Tick, at(s.invoked));
                    let deadline = back(m.lease().deadline());
                    let gone = g.let_go.is_some_and(|l| l < s.invoked);
                    if gone || s.invoked >= deadline || matches!(m.health(), Health::Lost(_)) {
                        bad(
                            i,
                            Rule::WriteWithoutBelief,
                            format!(
                                "{} wrote with token {token} at {} µs; deadline {deadline} µs, health {:?}, let go at {:?}",
                                s.client,
                                s.invoked,
                                m.health(),
                                g.let_go
                            ),
                        );
                    }
                }
                _ => {}
            }
        }
    }

    // The resource.
    let written = |s: &Step| match s.obs {
        Obs::Write { token, accepted } | Obs::LateWrite { token, accepted } => {
            Some((token, Some(accepted)))
        }
        Obs::UnknownWrite { token } => Some((token, None)),
        _ => None,
    };
    for (i, s) in steps.iter().enumerate() {
        let Some((token, outcome)) = written(s) else {
            continue;
        };
        if !grants.iter().any(|g| g.token == token) {
            bad(
                i,
                Rule::WriteWithUngrantedToken,
                format!("{} wrote with token {token}, never granted", s.client),
            );
        }
        let Some(accepted) = outcome else { continue };
        summary.writes += 1;
        if accepted {
            if let Some((j, o)) = steps.iter().enumerate().find(|(_, o)| {
                o.completed < s.invoked && matches!(written(o), Some((t, Some(true))) if t > token)
            }) {
                bad(
                    i,
                    Rule::StaleWriteAccepted,
                    format!(
                        "{} had token {token} accepted after {} had token {:?} accepted (step {})",
                        s.client,
                        o.client,
                        written(o).map(|w| w.0),
                        idx[j]
                    ),
                );
            }
        } else {
            summary.rejected += 1;
            let witness = steps.iter().any(|o| {
                o.invoked < s.completed
                    && matches!(written(o), Some((t, a)) if t > token && a != Some(false))
            });
            if !witness {
                bad(
                    i,
                    Rule::RejectedWithoutGreaterToken,
                    format!(
                        "{} had token {token} rejected, but no greater token was written before",
                        s.client
                    ),
                );
            }
        }
    }
}
