//! Trace conformance: histories recorded against the real backends, under
//! faults, are checked against the model's rules by [`leasehold_model::trace::check`].
//!
//! - `fixtures_conform`: one small recorded trace per backend, checked in under `tests/traces/`
//!   (no services needed);
//! - `mutated_traces_are_rejected`: negative controls, each mutation of a fixture must be rejected
//!   with its rule, naming the mutated step: one mutation for each rule but the late loss (which
//!   `late_loss_needs_a_measured_stall` covers);
//! - `keys_are_checked_as_separate_models`: a hand-written trace of two keys, checked per key;
//! - `multi_key_fixtures_conform`: two recorded long storms of three keys (`*-keys.trace`), with
//!   the token mutation on one key rejected there only;
//! - `real_backends_conform`: against every backend configured in the environment
//!   (`/tmp/lease-test/*.env`), two short storms (one key, two contenders) and one long storm
//!   (three keys, three contenders, six rounds each), each recorded and checked; the long storm's
//!   trace must reach two keys with two grants or more and a grant to every contender, and its
//!   mutation (a token that goes back on one key other than the first) must be rejected on that
//!   key's steps only. A backend that cannot be reached fails
//!   the test under `LEASE_TEST_REQUIRE=1` (or `CI`), and is reported as skipped otherwise.
//!   `LEASE_MODEL_RECORD=<dir>` writes every recorded trace there (how the fixtures were made).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::supervisor::{Health, Hook, RenewalResult, Supervisor, SupervisorConfig};
use leasehold_core::{Lease, LeaseKey, WriteOp};
use leasehold_faults::link::LinkFault;
use leasehold_faults::storm::{Contender, StormBackend};
use leasehold_faults::target::{Target, targets_from_env};
use leasehold_model::StoreKind;
use leasehold_model::trace::{DEADLINE_TOLERANCE, Obs, Rule, Step, Trace, check, check_all};
use leasehold_testkit::history::{Attempt, Event, History, Op, Stamp};
use tokio::time::{Instant, sleep, sleep_until, timeout};

const FIXTURES: [&str; 5] = ["postgres", "redis", "etcd", "k8s", "sqlite"];

fn fixture(name: &str) -> Trace {
    let path = format!("{}/tests/traces/{name}.trace", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Trace::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn fixtures_conform() {
    for name in FIXTURES {
        let t = fixture(name);
        let s = check(&t).unwrap_or_else(|e| panic!("{name}: {e}"));
        println!("{name}: {s:?}");
        assert!(
            s.grants >= 2 && s.writes >= 1,
            "{name}: a vacuous fixture: {s:?}"
        );
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).expect("a short duration")
}

fn grant_steps(t: &Trace) -> Vec<usize> {
    (0..t.steps.len())
        .filter(|&i| matches!(t.steps[i].obs, Obs::Granted { .. }))
        .collect()
}

fn token_of(o: Obs) -> u64 {
    match o {
        Obs::Granted { token, .. } => token,
        _ => unreachable!(),
    }
}

fn token_of_write(o: Obs) -> u64 {
    match o {
        Obs::Write { token, .. } => token,
        _ => unreachable!(),
    }
}

fn assert_rejected(name: &str, what: &str, t: &Trace, rule: Rule, step: usize) {
    let first = match check(t) {
        Ok(s) => panic!("{name}: the mutation `{what}` was accepted: {s:?}"),
        Err(e) => e,
    };
    let (_, all) = check_all(t);
    let hit = all
        .iter()
        .find(|n| (n.rule, n.step) == (rule, step))
        .unwrap_or_else(|| {
            panic!("{name}: `{what}` rejected, but not as {rule:?} at step {step}: {all:#?}")
        });
    println!("{name}: `{what}` rejected: {hit} (first: {first})");
}

/// Negative controls: each mutation of each fixture is rejected, naming the step.
#[test]
fn mutated_traces_are_rejected() {
    for name in FIXTURES {
        let orig = fixture(name);
        // Two grants, the second begun after the first was granted, whose holder then had a
        // write accepted.
        let g = grant_steps(&orig);
        let accepted_with = |tok: u64| {
            orig.steps
                .iter()
                .any(|s| matches!(s.obs, Obs::Write { token, accepted: true } if token == tok))
        };
        let (first, second) = g
            .iter()
            .flat_map(|&a| g.iter().map(move |&b| (a, b)))
            .find(|&(a, b)| {
                orig.steps[b].invoked > orig.steps[a].completed
                    && accepted_with(token_of(orig.steps[b].obs))
            })
            .unwrap_or_else(|| panic!("{name}: no two grants one after the other"));
        let t1 = token_of(orig.steps[first].obs);

        // A token that goes back: the second grant carries the first grant's token minus one.
        let mut t = orig.clone();
        if let Obs::Granted { token, .. } = &mut t.steps[second].obs {
            *token = t1 - 1;
        }
        assert_rejected(
            name,
            "token goes back",
            &t,
            Rule::TokenNotAboveEarlier,
            second,
        );

        // A write accepted with a stale token: a late write with the first token, accepted right
        // after the second holder's token was accepted.
        let mut t = orig.clone();
        let t2 = token_of(orig.steps[second].obs);
        let (wi, w) = orig
            .steps
            .iter()
            .enumerate()
            .find(|(_, s)| matches!(s.obs, Obs::Write { token, accepted: true } if token == t2))
            .unwrap_or_else(|| panic!("{name}: no accepted write of the second holder"));
        t.steps.insert(
            wi + 1,
            Step {
                client: "zombie".into(),
                key: String::new(),
                invoked: w.completed + 1,
                completed: w.completed + 2,
                obs: Obs::LateWrite {
                    token: t1,
                    accepted: true,
                },
            },
        );
        assert_rejected(
            name,
            "stale write accepted",
            &t,
            Rule::StaleWriteAccepted,
            wi + 1,
        );

        // A grant while the first holder is unexpired by store time: the second grant moved to
        // just after the first grant (its deadline moved with it).
        let mut t = orig.clone();
        let at = t.steps[first].completed + 1;
        let live = micros(t.ttl - t.drift);
        let s = &mut t.steps[second];
        s.invoked = at;
        s.completed = at + 1;
        if let Obs::Granted { deadline, .. } = &mut s.obs {
            *deadline = at + live;
        }
        assert_rejected(name, "grant while held", &t, Rule::GrantWhileHeld, second);

        // A renewal confirmed after the key was granted to someone else.
        let mut t = orig.clone();
        let late = t.steps[second].completed + micros(t.ttl);
        let extra = Step {
            client: t.steps[first].client.clone(),
            key: String::new(),
            invoked: late,
            completed: late + 1000,
            obs: Obs::Renewed {
                token: t1,
                deadline: late + 500 + micros(t.ttl - t.drift),
            },
        };
        t.steps.push(extra);
        let last = t.steps.len() - 1;
        assert_rejected(
            name,
            "renewal after takeover",
            &t,
            Rule::RenewalAfterTakeover,
            last,
        );

        // Two grants with one token: the second grant carries the first grant's token.
        let mut t = orig.clone();
        if let Obs::Granted { token, .. } = &mut t.steps[second].obs {
            *token = t1;
        }
        assert_rejected(name, "duplicate token", &t, Rule::DuplicateToken, second);

        // A deadline no send inside the operation gives: the first grant's a whole TTL later.
        let mut t = orig.clone();
        if let Obs::Granted { deadline, .. } = &mut t.steps[first].obs {
            *deadline += micros(t.ttl);
        }
        assert_rejected(
            name,
            "deadline not from a send",
            &t,
            Rule::DeadlineNotFromSend,
            first,
        );

        // A write with a token no grant gave, of unknown outcome (so that no other rule of the
        // resource applies to it), after every step.
        let mut t = orig.clone();
        let end = t.steps.iter().map(|s| s.completed).max().unwrap_or(0);
        let highest = g
            .iter()
            .map(|&i| token_of(orig.steps[i].obs))
            .max()
            .unwrap_or(0);
        t.steps.push(Step {
            client: "forger".into(),
            key: orig.steps[first].key.clone(),
            invoked: end + 1,
            completed: end + 2,
            obs: Obs::UnknownWrite {
                token: highest + 1000,
            },
        });
        let last = t.steps.len() - 1;
        assert_rejected(
            name,
            "write with an ungranted token",
            &t,
            Rule::WriteWithUngrantedToken,
            last,
        );

        // A write rejected while no greater token can have been accepted: the earliest accepted
        // write with no greater token written before it ended, turned into a rejection.
        let mut t = orig.clone();
        let written = |o: &Step| match o.obs {
            Obs::Write { token, accepted } | Obs::LateWrite { token, accepted } => {
                Some((token, Some(accepted)))
            }
            Obs::UnknownWrite { token } => Some((token, None)),
            _ => None,
        };
        let wi = (0..orig.steps.len())
            .find(|&i| {
                let s = &orig.steps[i];
                matches!(s.obs, Obs::Write { accepted: true, .. })
                    && !orig.steps.iter().any(|o| {
                        o.invoked < s.completed
                            && matches!(written(o), Some((tok, a)) if tok > token_of_write(s.obs) && a != Some(false))
                    })
            })
            .unwrap_or_else(|| panic!("{name}: no accepted write without a greater one before"));
        if let Obs::Write { accepted, .. } = &mut t.steps[wi].obs {
            *accepted = false;
        }
        assert_rejected(
            name,
            "write rejected without a greater token",
            &t,
            Rule::RejectedWithoutGreaterToken,
            wi,
        );

        // A checked write by the first holder after the second grant: its belief had ended.
        let mut t = orig.clone();
        let after = orig.steps[second].completed + 1;
        t.steps.push(Step {
            client: orig.steps[first].client.clone(),
            key: orig.steps[first].key.clone(),
            invoked: after,
            completed: after + 1,
            obs: Obs::Write {
                token: t1,
                accepted: false,
            },
        });
        let last = t.steps.len() - 1;
        assert_rejected(
            name,
            "write after belief ended",
            &t,
            Rule::WriteWithoutBelief,
            last,
        );

        // A refusal before any acquisition began: nothing can be live.
        let mut t = orig.clone();
        let start = orig.steps.iter().map(|s| s.invoked).min().unwrap_or(0);
        assert!(start >= 2, "{name}: the first step begins at {start} µs");
        t.steps.insert(
            0,
            Step {
                client: "early".into(),
                key: orig.steps[first].key.clone(),
                invoked: 0,
                completed: 1,
                obs: Obs::Refused,
            },
        );
        assert_rejected(name, "refused while free", &t, Rule::RefusedWhileFree, 0);

        // A clock-floored store that hands out a plain sequence number.
        if t.store == (StoreKind::Row { clock_floor: true }) {
            let mut t = orig.clone();
            if let Obs::Granted { token, .. } = &mut t.steps[first].obs {
                *token = 1;
            }
            assert_rejected(name, "no clock floor", &t, Rule::BelowClockFloor, first);
        }
    }
}

/// Recorded long storms (three keys, three contenders), checked in: each conforms over its three
/// keys, every contender was granted, its token mutation on one key is rejected on that key only,
/// and read as one key it breaks rules (the keys were held at once).
#[test]
fn multi_key_fixtures_conform() {
    for name in ["redis-keys", "etcd-keys"] {
        let t = fixture(name);
        let s = check(&t).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(s.keys, 3, "{name}: {s:?}");
        let coverage = multi_key_coverage(&t, 3).unwrap_or_else(|e| panic!("{name}: {e}"));
        let what = token_goes_back_on_one_key(name, &t).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (_, merged) = check_all(&Trace {
            steps: t
                .steps
                .iter()
                .map(|s| Step {
                    key: String::new(),
                    ..s.clone()
                })
                .collect(),
            ..t.clone()
        });
        assert!(!merged.is_empty(), "{name}: read as one key it conforms");
        println!(
            "{name}: {s:?}, {coverage}; `{what}` rejected; read as one key: {} rules broken",
            merged.len()
        );
    }
}

/// Records what the supervisor reports (renewals, losses) into the history, under the lease's key.
#[derive(Debug)]
struct Recorder {
    name: String,
    history: History,
}

impl Hook for Recorder {
    fn renewal(&self, lease: &Lease, result: RenewalResult, latency: Duration) {
        let invoked = Stamp {
            at: Instant::now()
                .checked_sub(latency)
                .unwrap_or_else(Instant::now),
            seq: 0,
        };
        let op = match result {
            RenewalResult::Confirmed { .. } => Op::Renewed {
                token: lease.token(),
                deadline: lease.deadline(),
            },
            RenewalResult::Refused => return,
            _ => Op::Unknown(Attempt::Renew(lease.token())),
        };
        self.history.end(&self.name, lease.key(), invoked, op);
    }

    fn health_changed(&self, lease: &Lease, _from: Health, to: Health) {
        if matches!(to, Health::Lost(_)) {
            let s = self.history.begin();
            self.history.end(
                &self.name,
                lease.key(),
                s,
                Op::RenewLost {
                    token: lease.token(),
                },
            );
        }
    }
}

fn store_kind(target: &str) -> StoreKind {
    match target {
        "postgres" | "redis" | "mysql" => StoreKind::Row { clock_floor: true },
        "sqlite" => StoreKind::Row { clock_floor: false },
        "etcd" => StoreKind::EtcdLockKey,
        "k8s" => StoreKind::Kubernetes {
            token_from_own_write: true,
        },
        other => panic!("no model variant for {other}"),
    }
}

/// One contender's rounds, each on a key drawn from `keys`: acquire, hold while writing (a fault
/// strikes at a random moment), release, sometimes write once more as a zombie.
///
/// After a round whose store link was blackholed the contender takes fresh clients (as a restarted
/// process would): the proxy's blackhole discards bytes inside the connection, which no real
/// partition does (TCP retransmits them or resets), and a pipelined connection (Redis) stays out
/// of step after it, every later request timing out.
#[allow(clippy::too_many_arguments)]
async fn contender(
    target: Target,
    cfg: SupervisorConfig,
    hook: Arc<Recorder>,
    mut c: Contender,
    keys: Vec<LeaseKey>,
    name: String,
    history: History,
    mut rng: fastrand::Rng,
    ttl: Duration,
    rounds: usize,
) {
    let mut sup = Supervisor::from_arc(c.store.clone(), cfg.clone()).with_hook(hook.clone());
    for _ in 0..rounds {
        let key = &keys[rng.usize(..keys.len())];
        let s = history.begin();
        let guard = match timeout(ttl * 6, sup.acquire(key)).await {
            Ok(Ok(a)) => match a.guard() {
                Some(g) => g,
                None => {
                    history.end(&name, key, s, Op::Refused);
                    continue;
                }
            },
            _ => {
                history.end(&name, key, s, Op::Unknown(Attempt::Acquire));
                continue;
            }
        };
        let token = guard.token();
        history.end(
            &name,
            key,
            s,
            Op::Granted {
                owner: sup.owner().clone(),
                token,
                deadline: guard.lease().deadline(),
            },
        );
        let start = Instant::now();
        let until = start + ttl.mul_f64(0.5 + rng.f64());
        let fault_at = start + ttl.mul_f64(rng.f64());
        let fault = match rng.u8(0..5) {
            0 => Some((true, LinkFault::DropResponses)),
            1 => Some((true, LinkFault::Blackhole)),
            2 => Some((false, LinkFault::DropResponses)),
            _ => None,
        };
        let mut struck = false;
        loop {
            let now = Instant::now();
            if let (false, Some((store, f))) = (struck, fault)
                && now >= fault_at
            {
                struck = true;
                if store {
                    c.store_link.set(f);
                } else {
                    c.resource_link.set(f);
                }
            }
            if now >= until || !guard.may_act() {
                break;
            }
            let s = history.begin();
            let write = timeout(ttl / 3, c.resource.write(key, token, WriteOp::Add(1)));
            let op = match guard.run(write).await {
                Ok(Ok(Ok(out))) => Op::Write {
                    token,
                    accepted: out.is_accepted(),
                },
                _ => Op::Unknown(Attempt::Write(token)),
            };
            history.end(&name, key, s, op);
            sleep(Duration::from_millis(rng.u64(10..40))).await;
        }
        let s = history.begin();
        let _ = timeout(ttl * 2, guard.release()).await;
        history.end(&name, key, s, Op::Release { token });
        c.store_link.heal();
        c.resource_link.heal();
        if rng.bool() {
            sleep(ttl.mul_f64(rng.f64())).await;
            let s = history.begin();
            let op = match timeout(ttl, c.resource.write(key, token, WriteOp::Add(1))).await {
                Ok(Ok(out)) => Op::LateWrite {
                    token,
                    accepted: out.is_accepted(),
                },
                _ => Op::Unknown(Attempt::LateWrite(token)),
            };
            history.end(&name, key, s, op);
        }
        if matches!(fault, Some((true, LinkFault::Blackhole)))
            && let Ok(fresh) = target.contender().await
        {
            c = fresh;
            sup = Supervisor::from_arc(c.store.clone(), cfg.clone()).with_hook(hook.clone());
        }
    }
}

/// The stalls of the recording process measured by [`probe`]: the late wake-ups, `(due, ran)`,
/// and the wake-up it waits for.
#[derive(Debug, Default)]
struct StallLog {
    late: Vec<(Instant, Instant)>,
    waiting_for: Option<Instant>,
}

type Stalls = Arc<Mutex<StallLog>>;

fn stall_log(stalls: &Stalls) -> std::sync::MutexGuard<'_, StallLog> {
    stalls
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Measures how late the runtime the storms run on gets to its timers: wakes every millisecond and
/// keeps each wake-up later than [`DEADLINE_TOLERANCE`] as `(due, ran)`. The supervisors' loss
/// timers run on the same runtime, so a loss reported late because the process was not scheduled
/// shows here too; the traces carry these as stall steps, which excuse a late loss report only
/// where they cover it (see `leasehold_model::trace`). Runs until aborted.
async fn probe(stalls: Stalls) {
    loop {
        let due = Instant::now() + Duration::from_millis(1);
        stall_log(&stalls).waiting_for = Some(due);
        sleep_until(due).await;
        let ran = Instant::now();
        let mut log = stall_log(&stalls);
        log.waiting_for = None;
        if ran.saturating_duration_since(due) > DEADLINE_TOLERANCE {
            log.late.push((due, ran));
        }
    }
}

/// The stalls measured so far, with the one under way (the probe overdue by more than the
/// tolerance now) as ending now.
fn stalls_now(stalls: &Stalls) -> Vec<(Instant, Instant)> {
    let log = stall_log(stalls);
    let now = Instant::now();
    let mut out = log.late.clone();
    if let Some(due) = log.waiting_for
        && now.saturating_duration_since(due) > DEADLINE_TOLERANCE
    {
        out.push((due, now));
    }
    out
}

/// The trace of `events` and of the stalls measured while they were recorded (those that ended
/// after the first event and began before the last one ended); with more than one key, each step
/// names its key by its index in `keys` (`k0`, `k1`, ...).
fn to_trace(
    events: &[Event],
    stalls: &[(Instant, Instant)],
    keys: &[LeaseKey],
    store: StoreKind,
    cfg: &SupervisorConfig,
    anchor: (Instant, u64),
) -> Trace {
    let mut ev = events.to_vec();
    ev.sort_by_key(|e| e.invoked);
    let t0 = ev.first().map_or(anchor.0, |e| e.invoked.at.min(anchor.0));
    let us =
        |i: Instant| u64::try_from(i.saturating_duration_since(t0).as_micros()).unwrap_or(u64::MAX);
    let end = ev.iter().map(|e| e.completed.at).max().unwrap_or(t0);
    let mut steps: Vec<Step> = ev
        .iter()
        .map(|e| {
            let obs = match &e.op {
                Op::Granted {
                    token, deadline, ..
                } => Obs::Granted {
                    token: token.get(),
                    deadline: us(*deadline),
                },
                Op::Refused => Obs::Refused,
                Op::Renewed { token, deadline } => Obs::Renewed {
                    token: token.get(),
                    deadline: us(*deadline),
                },
                Op::RenewLost { token } => Obs::Lost { token: token.get() },
                Op::Release { token } => Obs::Release { token: token.get() },
                Op::Write { token, accepted } => Obs::Write {
                    token: token.get(),
                    accepted: *accepted,
                },
                Op::LateWrite { token, accepted } => Obs::LateWrite {
                    token: token.get(),
                    accepted: *accepted,
                },
                Op::Unknown(Attempt::Acquire) => Obs::UnknownAcquire,
                Op::Unknown(Attempt::Renew(t)) => Obs::UnknownRenew { token: t.get() },
                Op::Unknown(Attempt::Release(t)) => Obs::UnknownRelease { token: t.get() },
                Op::Unknown(Attempt::Write(t) | Attempt::LateWrite(t)) => {
                    Obs::UnknownWrite { token: t.get() }
                }
            };
            let key = match keys.iter().position(|k| *k == e.key) {
                Some(j) if keys.len() > 1 => format!("k{j}"),
                _ => String::new(),
            };
            Step {
                client: e.client.clone(),
                key,
                invoked: us(e.invoked.at),
                completed: us(e.completed.at),
                obs,
            }
        })
        .collect();
    steps.extend(
        stalls
            .iter()
            .filter(|&&(due, ran)| ran > t0 && due < end)
            .map(|&(due, ran)| Step {
                client: "probe".into(),
                key: String::new(),
                invoked: us(due),
                completed: us(ran),
                obs: Obs::Stall,
            }),
    );
    // In order of invocation (a stable sort: events of one instant keep their order).
    steps.sort_by_key(|s| s.invoked);
    Trace {
        store,
        ttl: cfg.ttl(),
        drift: cfg.drift_margin(),
        renew_interval: cfg.renew_interval(),
        loss_lead: cfg.loss_lead(),
        wall_start_us: Some(anchor.1.saturating_sub(us(anchor.0))),
        steps,
    }
}

/// The shape of a recorded storm.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Keys the contenders draw from, one per round.
    keys: usize,
    /// Contenders (each with its own store and resource clients behind their own links).
    contenders: u64,
    /// Rounds per contender.
    rounds: usize,
}

/// The short storms: one key, two contenders, two rounds each.
const SHORT: Shape = Shape {
    keys: 1,
    contenders: 2,
    rounds: 2,
};

/// The long storm: three keys, three contenders, six rounds each (18 rounds on 3 keys).
const LONG: Shape = Shape {
    keys: 3,
    contenders: 3,
    rounds: 6,
};

/// Records one storm of `shape` on `target`.
async fn record(target: &Target, seed: u64, shape: Shape, stalls: Stalls) -> Result<Trace, String> {
    let run = fastrand::u32(..);
    let keys = (0..shape.keys)
        .map(|j| {
            LeaseKey::new(format!(
                "model-trace-{}-{seed}-{run}-{j}",
                std::process::id()
            ))
            .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let history = History::new();
    let ttl = target.ttl();
    let cfg = target.config().with_acquire_wait(ttl * 3);
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?;
    let anchor = (Instant::now(), u64::try_from(wall.as_micros()).unwrap_or(0));
    let mut tasks = Vec::new();
    for i in 0..shape.contenders {
        let c = target.contender().await?;
        let name = format!("c{i}");
        let hook = Arc::new(Recorder {
            name: name.clone(),
            history: history.clone(),
        });
        let rng = fastrand::Rng::with_seed(seed * 100 + i);
        tasks.push(tokio::spawn(contender(
            target.clone(),
            cfg.clone(),
            hook,
            c,
            keys.clone(),
            name,
            history.clone(),
            rng,
            ttl,
            shape.rounds,
        )));
    }
    for t in tasks {
        t.await.map_err(|e| format!("contender panicked: {e}"))?;
    }
    let stalls = stalls_now(&stalls);
    Ok(to_trace(
        &history.events(),
        &stalls,
        &keys,
        store_kind(target.name),
        &cfg,
        anchor,
    ))
}

/// The grant steps of `key`, in trace order.
fn grants_on(t: &Trace, key: &str) -> Vec<usize> {
    grant_steps(t)
        .into_iter()
        .filter(|&i| t.steps[i].key == key)
        .collect()
}

/// The negative control of a trace of several keys: on one key other than the first, a grant
/// begun after an earlier grant of that key ended carries the earlier grant's token minus one.
/// It must be rejected as a token that goes back at that step, and every nonconformance found
/// must be a step of that key (the other keys, untouched, still conform). Returns what was
/// mutated, or that no key but the first had two grants one after the other.
fn token_goes_back_on_one_key(name: &str, orig: &Trace) -> Result<String, String> {
    let keys = orig.keys();
    let (key, first, second) = keys
        .iter()
        .skip(1)
        .find_map(|k| {
            let g = grants_on(orig, k);
            g.iter()
                .flat_map(|&a| g.iter().map(move |&b| (a, b)))
                .find(|&(a, b)| orig.steps[b].invoked > orig.steps[a].completed)
                .map(|(a, b)| (k.clone(), a, b))
        })
        .ok_or("no key but the first has two grants one after the other")?;
    let mut t = orig.clone();
    let t1 = token_of(orig.steps[first].obs);
    if let Obs::Granted { token, .. } = &mut t.steps[second].obs {
        *token = t1.saturating_sub(1);
    }
    let what = format!("token goes back on key {key} only (step {second})");
    assert_rejected(name, &what, &t, Rule::TokenNotAboveEarlier, second);
    let (_, all) = check_all(&t);
    let elsewhere: Vec<_> = all.iter().filter(|n| t.steps[n.step].key != key).collect();
    assert!(
        elsewhere.is_empty(),
        "{name}: `{what}` also rejected steps of other keys: {elsewhere:#?}"
    );
    Ok(what)
}

/// What a storm of several keys must have contained to be worth its time: at least two keys with
/// two grants or more, and every contender granted at least once.
fn multi_key_coverage(t: &Trace, contenders: u64) -> Result<String, String> {
    let per_key: Vec<(String, usize)> = t
        .keys()
        .into_iter()
        .map(|k| {
            let n = grants_on(t, &k).len();
            (k, n)
        })
        .collect();
    let mut holders: Vec<&str> = grant_steps(t)
        .into_iter()
        .map(|i| t.steps[i].client.as_str())
        .collect();
    holders.sort_unstable();
    holders.dedup();
    let text = format!("grants per key {per_key:?}, holders {holders:?}");
    if per_key.iter().filter(|k| k.1 >= 2).count() < 2
        || holders.len() < usize::try_from(contenders).unwrap_or(usize::MAX)
    {
        return Err(format!("too little reached: {text}"));
    }
    Ok(text)
}

#[test]
fn real_backends_conform() {
    let require = leasehold_testkit::env::require_services();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let out_dir = std::env::var("LEASE_MODEL_RECORD").ok();
    let mut failures = Vec::new();
    rt.block_on(async {
        let stalls = Stalls::default();
        let prober = tokio::spawn(probe(stalls.clone()));
        let mut runs = Vec::new();
        for t in targets_from_env() {
            let t = match t {
                Ok(t) => t,
                Err((name, why)) => {
                    if require {
                        failures.push(format!("{name}: required but unavailable: {why}"));
                    } else {
                        eprintln!("WARNING: {name} skipped (unavailable: {why}); LEASE_TEST_REQUIRE=1 makes this a failure");
                    }
                    continue;
                }
            };
            for (seed, shape) in [(1u64, SHORT), (2, SHORT), (3, LONG)] {
                let t = t.clone();
                let stalls = stalls.clone();
                runs.push(tokio::spawn(async move {
                    let started = Instant::now();
                    let r = timeout(
                        Duration::from_secs(120),
                        record(&t, seed, shape, stalls),
                    )
                    .await;
                    (t.name, seed, shape, r, started.elapsed())
                }));
            }
        }
        for r in runs {
            let (name, seed, shape, r, took) = r.await.expect("storm task");
            let label = if shape.keys > 1 {
                format!("{name} seed {seed} ({} keys, {} contenders)", shape.keys, shape.contenders)
            } else {
                format!("{name} seed {seed}")
            };
            let trace = match r {
                Ok(Ok(t)) => t,
                Ok(Err(e)) if !require && e.contains("onnect") => {
                    eprintln!("WARNING: {label} skipped: {e}");
                    continue;
                }
                Ok(Err(e)) => {
                    failures.push(format!("{label}: {e}"));
                    continue;
                }
                Err(_) => {
                    failures.push(format!("{label}: storm timed out"));
                    continue;
                }
            };
            if let Some(dir) = &out_dir {
                let file = if shape.keys > 1 {
                    format!("{dir}/{name}-keys-{seed}.trace")
                } else {
                    format!("{dir}/{name}-{seed}.trace")
                };
                std::fs::write(&file, trace.to_text()).expect("writing a trace");
            }
            match check(&trace) {
                Ok(s) => {
                    let stalled = trace.steps.iter().filter(|s| s.obs == Obs::Stall).count();
                    println!(
                        "{label}: {} steps conform ({:.1} s, {stalled} of them measured stalls): {s:?}",
                        trace.steps.len(),
                        took.as_secs_f64()
                    );
                    if s.grants < 2 {
                        failures.push(format!("{label}: fewer than two grants: {s:?}"));
                    }
                    if shape.keys > 1 {
                        match multi_key_coverage(&trace, shape.contenders) {
                            Ok(c) => println!("  {c}"),
                            Err(e) => failures.push(format!("{label}: {e}")),
                        }
                        let (_, merged) = check_all(&Trace {
                            steps: trace
                                .steps
                                .iter()
                                .map(|s| Step {
                                    key: String::new(),
                                    ..s.clone()
                                })
                                .collect(),
                            ..trace.clone()
                        });
                        match token_goes_back_on_one_key(&label, &trace) {
                            Ok(what) => println!(
                                "  `{what}` rejected; read as one key the trace breaks {} rules",
                                merged.len()
                            ),
                            Err(e) => failures.push(format!("{label}: {e}")),
                        }
                    }
                }
                Err(e) => failures.push(format!(
                    "{label}: {e}\n{}",
                    trace.to_text()
                )),
            }
        }
        prober.abort();
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The model's row and etcd stores re-grant a live lease to its own owner with a new token (the
/// backends' same-owner rule), so a trace showing it conforms; another owner is still refused.
#[test]
fn same_owner_regrant_while_live_conforms() {
    let head = "store row\nttl_us 1000000\ndrift_us 21000\nrenew_us 333333\nlead_us 100000\nsteps\n\
                0 500 a granted 1 979000\n";
    let same = Trace::parse(&format!("{head}1000 1200 a granted 2 980000\n")).unwrap();
    check(&same).unwrap_or_else(|e| panic!("a same-owner re-grant: {e}"));
    let other = Trace::parse(&format!("{head}1000 1200 b granted 2 980000\n")).unwrap();
    assert_eq!(check(&other).unwrap_err().rule, Rule::GrantWhileHeld);
}

/// A loss reported after the deadline (by more than the tolerance) is rejected unless measured
/// stalls of the recording process cover the time from the deadline to the report: one stall, or
/// stalls chained (each due within the tolerance after the previous one ran). A stall that ends
/// too early, begins after the deadline, or is chained across a gap excuses nothing. Stall steps
/// belong to no key and survive the text form.
#[test]
fn late_loss_needs_a_measured_stall() {
    // Granted at 0 with deadline 979 ms (TTL 1 s less the 21 ms drift); lost 51 ms after it.
    let head = "store row\nttl_us 1000000\ndrift_us 21000\nrenew_us 333333\nlead_us 100000\nsteps\n\
                0 500 a granted 1 979000\n";
    let with = |stalls: &str, lost_at: u64| {
        let t = Trace::parse(&format!("{head}{stalls}{lost_at} {lost_at} a lost 1\n")).unwrap();
        assert_eq!(Trace::parse(&t.to_text()).unwrap(), t);
        check_all(&t).1
    };
    let late = |stalls: &str| {
        let found = with(stalls, 1_030_000);
        assert_eq!(
            found.iter().map(|n| n.rule).collect::<Vec<_>>(),
            [Rule::LateLoss],
            "stalls {stalls:?}: {found:#?}"
        );
    };
    let fine = |stalls: &str| {
        let found = with(stalls, 1_030_000);
        assert!(found.is_empty(), "stalls {stalls:?}: {found:#?}");
    };
    // On time (within the tolerance), no stall needed.
    assert!(with("", 980_000).is_empty());
    // Late without a stall, or with stalls that do not cover it.
    late("");
    late("970000 1020000 probe stall\n");
    late("990000 1029000 probe stall\n");
    late("970000 1000000 probe stall\n1010000 1029000 probe stall\n");
    // Covered by one stall, or by a chain of them.
    fine("970000 1029000 probe stall\n");
    fine("970000 1000000 probe stall\n1001000 1029000 probe stall\n");

    // A stall is no key's step: a trace of one key keeps one key.
    let keyed = Trace::parse(
        "store row\nttl_us 1000000\ndrift_us 21000\nrenew_us 333333\nlead_us 100000\nsteps\n\
         0 500 a @k0 granted 1 979000\n970000 1029000 probe stall\n1030000 1030000 a @k0 lost 1\n",
    )
    .unwrap();
    assert_eq!(keyed.keys(), ["k0"]);
    assert_eq!(check(&keyed).map(|s| s.keys), Ok(1));
}

/// The model has one key: a trace of several keys is one model per key. Two clients holding two
/// keys at once, each key with its own tokens, conform; the same steps read as one key break three
/// rules; a token that goes back on the second key alone is rejected on that key's steps only.
#[test]
fn keys_are_checked_as_separate_models() {
    let head =
        "store row\nttl_us 1000000\ndrift_us 21000\nrenew_us 333333\nlead_us 100000\nsteps\n";
    let steps = "0 500 a @k0 granted 5 979000\n\
                 1000 1200 b @k1 granted 3 980000\n\
                 1300 1400 a @k0 write 5 accepted\n\
                 1500 1600 b @k1 write 3 accepted\n";
    let keyed = Trace::parse(&format!("{head}{steps}")).unwrap();
    assert_eq!(keyed.keys(), ["k0", "k1"]);
    assert_eq!(Trace::parse(&keyed.to_text()).unwrap(), keyed);
    let s = check(&keyed).unwrap_or_else(|e| panic!("two keys held at once: {e}"));
    assert_eq!((s.keys, s.grants, s.writes), (2, 2, 2));

    let one_key = Trace::parse(&format!(
        "{head}{}",
        steps.replace(" @k0", "").replace(" @k1", "")
    ))
    .unwrap();
    // Read as one key: two holders at once, a token below the earlier grant's, and the resource
    // accepting the lower token after the greater one.
    let (_, all) = check_all(&one_key);
    assert_eq!(
        all.iter().map(|n| (n.rule, n.step)).collect::<Vec<_>>(),
        [
            (Rule::GrantWhileHeld, 0),
            (Rule::TokenNotAboveEarlier, 1),
            (Rule::StaleWriteAccepted, 3)
        ],
        "read as one key: {all:#?}"
    );

    // On k1, a grant after the first one ended, with a lower token (and, to show it conforms, with
    // a greater one); k0's token is greater than both and does not matter.
    let back = Trace::parse(&format!(
        "{head}{steps}2000000 2000400 a @k1 granted 2 2979000\n"
    ))
    .unwrap();
    let (_, all) = check_all(&back);
    assert!(
        all.iter()
            .any(|n| (n.rule, n.step) == (Rule::TokenNotAboveEarlier, 4)),
        "{all:#?}"
    );
    assert!(
        all.iter().all(|n| back.steps[n.step].key == "k1"),
        "a step of k0 rejected: {all:#?}"
    );
    let fine = Trace::parse(&format!(
        "{head}{steps}2000000 2000400 a @k1 granted 4 2979000\n"
    ))
    .unwrap();
    check(&fine).unwrap_or_else(|e| panic!("a greater token on k1: {e}"));
}
