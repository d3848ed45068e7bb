//! Trace conformance: histories recorded against the real backends, under
//! faults, are checked against the model's rules by [`leasehold_model::trace::check`].
//!
//! - `fixtures_conform`: one small recorded trace per backend, checked in under `tests/traces/`
//!   (no services needed);
//! - `mutated_traces_are_rejected`: negative controls, each mutation of a fixture must be rejected
//!   with its rule, naming the mutated step;
//! - `real_backends_conform`: short storms against every backend configured in the environment
//!   (`/tmp/lease-test/*.env`), each recorded and checked. A backend that cannot be reached fails
//!   the test under `LEASE_TEST_REQUIRE=1` (or `CI`), and is reported as skipped otherwise.
//!   `LEASE_MODEL_RECORD=<dir>` writes every recorded trace there (how the fixtures were made).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::supervisor::{Health, Hook, RenewalResult, Supervisor, SupervisorConfig};
use leasehold_core::{Lease, LeaseKey, WriteOp};
use leasehold_faults::link::LinkFault;
use leasehold_faults::storm::{Contender, StormBackend};
use leasehold_faults::target::{Target, targets_from_env};
use leasehold_model::StoreKind;
use leasehold_model::trace::{Obs, Rule, Step, Trace, check, check_all};
use leasehold_testkit::history::{Attempt, Event, History, Op, Stamp};
use tokio::time::{Instant, sleep, timeout};

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

/// Records what the supervisor reports (renewals, losses) into the history.
#[derive(Debug)]
struct Recorder {
    name: String,
    key: LeaseKey,
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
        self.history.end(&self.name, &self.key, invoked, op);
    }

    fn health_changed(&self, lease: &Lease, _from: Health, to: Health) {
        if matches!(to, Health::Lost(_)) {
            let s = self.history.begin();
            self.history.end(
                &self.name,
                &self.key,
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

/// One contender's rounds: acquire, hold while writing (a fault strikes at a random moment),
/// release, sometimes write once more as a zombie.
#[allow(clippy::too_many_arguments)]
async fn contender(
    c: Contender,
    sup: Supervisor,
    key: LeaseKey,
    name: String,
    history: History,
    mut rng: fastrand::Rng,
    ttl: Duration,
    rounds: usize,
) {
    for _ in 0..rounds {
        let s = history.begin();
        let guard = match timeout(ttl * 6, sup.acquire(&key)).await {
            Ok(Ok(a)) => match a.guard() {
                Some(g) => g,
                None => {
                    history.end(&name, &key, s, Op::Refused);
                    continue;
                }
            },
            _ => {
                history.end(&name, &key, s, Op::Unknown(Attempt::Acquire));
                continue;
            }
        };
        let token = guard.token();
        history.end(
            &name,
            &key,
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
            let write = timeout(ttl / 3, c.resource.write(&key, token, WriteOp::Add(1)));
            let op = match guard.run(write).await {
                Ok(Ok(Ok(out))) => Op::Write {
                    token,
                    accepted: out.is_accepted(),
                },
                _ => Op::Unknown(Attempt::Write(token)),
            };
            history.end(&name, &key, s, op);
            sleep(Duration::from_millis(rng.u64(10..40))).await;
        }
        let s = history.begin();
        let _ = timeout(ttl * 2, guard.release()).await;
        history.end(&name, &key, s, Op::Release { token });
        c.store_link.heal();
        c.resource_link.heal();
        if rng.bool() {
            sleep(ttl.mul_f64(rng.f64())).await;
            let s = history.begin();
            let op = match timeout(ttl, c.resource.write(&key, token, WriteOp::Add(1))).await {
                Ok(Ok(out)) => Op::LateWrite {
                    token,
                    accepted: out.is_accepted(),
                },
                _ => Op::Unknown(Attempt::LateWrite(token)),
            };
            history.end(&name, &key, s, op);
        }
    }
}

fn to_trace(
    events: &[Event],
    store: StoreKind,
    cfg: &SupervisorConfig,
    anchor: (Instant, u64),
) -> Trace {
    let mut ev = events.to_vec();
    ev.sort_by_key(|e| e.invoked);
    let t0 = ev.first().map_or(anchor.0, |e| e.invoked.at.min(anchor.0));
    let us =
        |i: Instant| u64::try_from(i.saturating_duration_since(t0).as_micros()).unwrap_or(u64::MAX);
    let steps = ev
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
            Step {
                client: e.client.clone(),
                invoked: us(e.invoked.at),
                completed: us(e.completed.at),
                obs,
            }
        })
        .collect();
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

/// Records one storm on `target` (two contenders, two rounds each).
async fn record(target: &Target, seed: u64) -> Result<Trace, String> {
    let key = LeaseKey::new(format!(
        "model-trace-{}-{seed}-{}",
        std::process::id(),
        fastrand::u32(..)
    ))
    .map_err(|e| e.to_string())?;
    let history = History::new();
    let ttl = target.ttl();
    let cfg = target.config().with_acquire_wait(ttl * 3);
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?;
    let anchor = (Instant::now(), u64::try_from(wall.as_micros()).unwrap_or(0));
    let mut tasks = Vec::new();
    for i in 0..2u64 {
        let c = target.contender().await?;
        let name = format!("c{i}");
        let hook = Arc::new(Recorder {
            name: name.clone(),
            key: key.clone(),
            history: history.clone(),
        });
        let sup = Supervisor::from_arc(c.store.clone(), cfg.clone()).with_hook(hook);
        let rng = fastrand::Rng::with_seed(seed * 100 + i);
        tasks.push(tokio::spawn(contender(
            c,
            sup,
            key.clone(),
            name,
            history.clone(),
            rng,
            ttl,
            2,
        )));
    }
    for t in tasks {
        t.await.map_err(|e| format!("contender panicked: {e}"))?;
    }
    Ok(to_trace(
        &history.events(),
        store_kind(target.name),
        &cfg,
        anchor,
    ))
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
            for seed in 1..=2u64 {
                let t = t.clone();
                runs.push(tokio::spawn(async move {
                    let r = timeout(Duration::from_secs(90), record(&t, seed)).await;
                    (t.name, seed, r)
                }));
            }
        }
        for r in runs {
            let (name, seed, r) = r.await.expect("storm task");
            let trace = match r {
                Ok(Ok(t)) => t,
                Ok(Err(e)) if !require && e.contains("onnect") => {
                    eprintln!("WARNING: {name} skipped: {e}");
                    continue;
                }
                Ok(Err(e)) => {
                    failures.push(format!("{name} seed {seed}: {e}"));
                    continue;
                }
                Err(_) => {
                    failures.push(format!("{name} seed {seed}: storm timed out"));
                    continue;
                }
            };
            if let Some(dir) = &out_dir {
                let path = format!("{dir}/{name}-{seed}.trace");
                std::fs::write(&path, trace.to_text()).expect("writing a trace");
            }
            match check(&trace) {
                Ok(s) => {
                    println!("{name} seed {seed}: {} steps conform: {s:?}", trace.steps.len());
                    if s.grants < 2 {
                        failures.push(format!("{name} seed {seed}: fewer than two grants: {s:?}"));
                    }
                }
                Err(e) => failures.push(format!(
                    "{name} seed {seed}: {e}\n{}",
                    trace.to_text()
                )),
            }
        }
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
