//! The soak run: every scenario once plus many storms per backend, and every negative control;
//! writes `docs/faults.md` itself (never edit that file by hand).
//!
//! `cargo run --release -p lease-faults --bin soak -- --storms 1000 [--backend redis]
//! [--contenders 3] [--rounds 2] [--parallel 4] [--minutes 60] [--out docs/faults.md]`
//!
//! `--minutes` stops starting storms once that much time has passed; the file then says how many
//! storms ran. With `LEASE_TEST_REQUIRE=1` a missing backend fails the run. The exit status is 1
//! on any violation, any uncaught control or any missing required backend.

use std::sync::Arc;
use std::time::Duration;

use lease_faults::controls::{Control, run_control};
use lease_faults::report::BackendReport;
use lease_faults::scenarios::{self, Measured};
use lease_faults::storm::{StormShape, storm};
use lease_faults::target::{Target, targets_from_env};
use tokio::time::Instant;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn num(name: &str, default: u64) -> u64 {
    arg(name).and_then(|s| s.parse().ok()).unwrap_or(default)
}

async fn bounded<F>(f: F) -> Result<Measured, String>
where
    F: std::future::Future<Output = Result<Measured, String>>,
{
    tokio::time::timeout(Duration::from_secs(180), f)
        .await
        .unwrap_or_else(|_| Err("timeout".to_string()))
}

fn note(rep: &BackendReport, what: &str, r: &Result<Measured, String>) {
    match r {
        Err(e) => eprintln!("{} {what}: ERROR {e}", rep.backend),
        Ok(m) if !m.violations.is_empty() => eprintln!(
            "{} {what}: VIOLATIONS {:#?}\n{}",
            rep.backend,
            m.violations,
            m.history.as_deref().unwrap_or_default()
        ),
        Ok(_) => {}
    }
}

#[derive(Debug, Clone, Copy)]
struct Plan {
    storms: u64,
    contenders: usize,
    rounds: usize,
    parallel: u64,
    stop_at: Option<Instant>,
}

async fn soak_backend(t: Target, plan: Plan) -> BackendReport {
    let mut rep = BackendReport::new(t.name);
    let runs: [(&str, _); 6] = [
        (
            "paused_process",
            bounded(scenarios::paused_process(&t)).await,
        ),
        (
            "killed_process",
            bounded(scenarios::killed_process(&t)).await,
        ),
        ("blackhole", bounded(scenarios::blackhole(&t)).await),
        (
            "lost_renewal_responses",
            bounded(scenarios::lost_renewal_responses(&t)).await,
        ),
        ("ghost_grant", bounded(scenarios::ghost_grant(&t)).await),
        (
            "latency_near_ttl",
            bounded(scenarios::latency_near_ttl(&t)).await,
        ),
    ];
    for (name, r) in &runs {
        note(&rep, &format!("scenario {name}"), r);
        rep.add(r, false);
    }
    let t = Arc::new(t);
    let mut seed = 1;
    while seed <= plan.storms {
        if plan.stop_at.is_some_and(|s| Instant::now() >= s) {
            eprintln!("{}: time is up after {} storms", t.name, rep.storms);
            break;
        }
        let batch: Vec<u64> = (seed..=plan.storms)
            .take(usize::try_from(plan.parallel).unwrap_or(4))
            .collect();
        seed += batch.len() as u64;
        let handles: Vec<_> = batch
            .iter()
            .map(|&s| {
                let t = t.clone();
                let shape = StormShape {
                    seed: s,
                    contenders: plan.contenders,
                    rounds: plan.rounds,
                };
                tokio::spawn(async move { (s, bounded(storm(&*t, shape)).await) })
            })
            .collect();
        for h in handles {
            let (s, r) = h
                .await
                .unwrap_or_else(|e| (0, Err(format!("panicked: {e}"))));
            note(&rep, &format!("storm seed {s}"), &r);
            rep.add(&r, true);
        }
        if rep.storms % 20 < plan.parallel {
            eprintln!(
                "{}: {} storms, {} with violations, {} errors",
                t.name, rep.storms, rep.failed, rep.errors
            );
        }
    }
    rep
}

fn sh(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() {
    let plan = Plan {
        storms: num("--storms", 20),
        contenders: usize::try_from(num("--contenders", 3)).unwrap_or(3),
        rounds: usize::try_from(num("--rounds", 2)).unwrap_or(2),
        parallel: num("--parallel", 4).max(1),
        stop_at: arg("--minutes")
            .and_then(|m| m.parse::<u64>().ok())
            .map(|m| Instant::now() + Duration::from_secs(m * 60)),
    };
    let only = arg("--backend");
    let out = arg("--out");
    let require = lease_testkit::require_services();
    let started = Instant::now();
    let date = sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let commit = sh("git", &["rev-parse", "--short=12", "HEAD"]);
    let dirty = !sh("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let mut missing = Vec::new();
    let mut handles = Vec::new();
    let mut ttls = Vec::new();
    for t in targets_from_env() {
        let t = match t {
            Ok(t) => t,
            Err((name, why)) => {
                if only.as_deref().is_none_or(|o| o == name) {
                    eprintln!("backend {name} unavailable: {why}");
                    missing.push(format!("{name} ({why})"));
                }
                continue;
            }
        };
        if only.as_deref().is_some_and(|o| o != t.name) {
            continue;
        }
        ttls.push(format!("{} {} ms", t.name, t.ttl.as_millis()));
        handles.push(tokio::spawn(soak_backend(t, plan)));
    }
    let controls: Vec<_> = Control::ALL
        .iter()
        .map(|&c| tokio::spawn(run_control(c, 8)))
        .collect();
    let mut reports = Vec::new();
    for h in handles {
        if let Ok(r) = h.await {
            println!("{}", r.row());
            reports.push(r);
        }
    }
    let mut control_rows = String::from(
        "| control | expected | caught | storms needed | what the catching storm reported |\n|---|---|---|---|---|\n",
    );
    let mut uncaught = 0;
    for (c, h) in Control::ALL.iter().zip(controls) {
        let r = h.await.map_err(|e| e.to_string()).and_then(|r| r);
        let row = match r {
            Ok(r) => {
                if !r.caught {
                    uncaught += 1;
                }
                let what = r.caught_by.map_or("-".to_string(), |m| {
                    let v = m.verdict();
                    let mut parts: Vec<String> = lease_testkit::history::ViolationKind::ALL
                        .iter()
                        .filter(|k| v.count(**k) > 0)
                        .map(|k| format!("{} {k}", v.count(*k)))
                        .collect();
                    if m.false_expiries > 0 {
                        parts.push(format!("{} false expiries", m.false_expiries));
                    }
                    parts.join(", ")
                });
                format!(
                    "| {} | {} | {} | {} | {what} |",
                    c.name(),
                    c.expected(),
                    if r.caught { "yes" } else { "**NO**" },
                    r.storms
                )
            }
            Err(e) => {
                uncaught += 1;
                format!("| {} | {} | **error** | - | {e} |", c.name(), c.expected())
            }
        };
        println!("{row}");
        control_rows.push_str(&row);
        control_rows.push('\n');
    }
    let mut table = BackendReport::header();
    table.push('\n');
    let mut measures = String::from(BackendReport::measure_header());
    measures.push('\n');
    for r in &reports {
        table.push_str(&r.row());
        table.push('\n');
        measures.push_str(&r.measure_row());
        measures.push('\n');
    }
    println!("{table}\n{measures}");
    let violations: u64 = reports.iter().map(|r| r.verdict.total()).sum();
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    let elapsed = started.elapsed();
    if let Some(path) = out {
        let storms: Vec<String> = reports
            .iter()
            .map(|r| format!("{} {}", r.backend, r.storms))
            .collect();
        let doc = render(&Doc {
            date: &date,
            commit: &commit,
            dirty,
            minutes: elapsed.as_secs() / 60,
            plan,
            storms: storms.join(", "),
            ttls: ttls.join(", "),
            missing: &missing,
            table: &table,
            measures: &measures,
            controls: &control_rows,
            violations,
            errors,
            load: sh("cat", &["/proc/loadavg"]),
        });
        std::fs::write(&path, doc).expect("write report");
    }
    if violations > 0 || uncaught > 0 || (require && !missing.is_empty()) {
        eprintln!(
            "FAILED: {violations} violations, {uncaught} uncaught controls, missing backends: {missing:?}"
        );
        std::process::exit(1);
    }
}

struct Doc<'a> {
    date: &'a str,
    commit: &'a str,
    dirty: bool,
    minutes: u64,
    plan: Plan,
    storms: String,
    ttls: String,
    missing: &'a [String],
    table: &'a str,
    measures: &'a str,
    controls: &'a str,
    violations: u64,
    errors: u64,
    load: String,
}

fn render(d: &Doc<'_>) -> String {
    let missing = if d.missing.is_empty() {
        String::new()
    } else {
        format!(
            "\n**Backends missing from this run:** {}.\n",
            d.missing.join("; ")
        )
    };
    format!(
        r#"# Fault suite: soak results

This file is written by the soak program (`lease-faults/src/bin/soak.rs`); do not edit it by hand.

- **Commit:** `{commit}`{dirty}
- **Date:** {date}; the run took {minutes} min (load average at the end: {load})
- **Storms per backend:** {storms} (asked for {asked}; `--minutes` may stop a run early, and the
  counts above are the storms that actually ran), {contenders} contenders x {rounds} rounds each,
  {parallel} storms at a time per backend, all backends at once
- **TTLs:** {ttls}
- **Result:** {violations} violations, {errors} runs that could not be carried out (no verdict)
{missing}
## Violations by kind

"Runs" are the six scenarios plus the storms. Every violation column must be 0.

{table}
## Measurements

The safety margin is the time from a holder's `Lost` report to the next grant: in the blackhole
and lost-response scenarios, and after every loss in the storms (it must be positive; a grant
before the holder's deadline is an overlapping belief above). The takeover is the time from a
holder's death, pause or loss to the next grant in the scenarios. A false expiry is a holder that gave up while the store still held its lease (the
conservative direction).

{measures}
## Negative controls

Each control is a deliberately broken store, resource or configuration on the in-memory store,
run through the same storm code (three contenders, three rounds, TTL 1 s) until a storm catches
it, at most 8 storms. A green storm above means something only because every row here is "yes".

{controls}
## What a storm does

Each contender has its own client of the store and of the backend's fenced resource (the
PostgreSQL high-water table, the Redis script resource, the etcd and Kubernetes resources, the
SQLite generation table), each behind its own fault link: a loopback TCP proxy for network
backends, an in-process wrapper for SQLite and the memory store. A contender acquires through the
supervisor, holds the lease for 0.5 to 2 TTLs (several renewal intervals), writes through the
fenced resource while `may_act()` holds (each write cancelled with the lease), and releases. In
most rounds one fault strikes at a random moment of the hold, a third of them right before the
release: a blackhole, lost responses or resets of the store link (for the rest of the round or a
short blip), latency just under and just over the loss lead, a fault on the resource link, or a
pause of the holder (its renewals stop for about a TTL, then it writes once without checking,
like a process resumed from SIGSTOP). A quarter of the rounds end with such a late write after the
release. Every grant, confirmed renewal, loss report, release, write and unknown outcome is
recorded and checked (`lease-testkit/src/history.rs`): ties at equal instants count as
violations, a write of unknown outcome counts as possibly applied, renewals extend belief, and the
resource's counter must lie between the acknowledged and the possibly applied writes.

The scenarios: a holder process paused past its TTL and resumed, a holder process killed, a
blackhole between holder and store, renewals applied with their answers lost, a ghost grant (an
acquisition applied with its answer lost), latency near the TTL. Store restarts and failovers are
exercised by each backend crate's own failure tests, not by this run.

Reproduce: `set -a; for f in /tmp/lease-test/*.env; do . $f; done; set +a; cargo run --release
-p lease-faults --bin soak -- --storms {asked} --contenders {contenders} --rounds {rounds} --out
docs/faults.md`.
"#,
        commit = d.commit,
        dirty = if d.dirty {
            " (with uncommitted changes)"
        } else {
            ""
        },
        date = d.date,
        minutes = d.minutes,
        load = d.load,
        storms = d.storms,
        asked = d.plan.storms,
        contenders = d.plan.contenders,
        rounds = d.plan.rounds,
        parallel = d.plan.parallel,
        ttls = d.ttls,
        violations = d.violations,
        errors = d.errors,
        missing = missing,
        table = d.table,
        measures = d.measures,
        controls = d.controls,
    )
}
