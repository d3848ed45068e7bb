//! The fault suite in CI: every scenario once and a sample of storms per backend, each a named
//! test. A run fails on any violation (named by kind) and on any error of the test itself.
//!
//! `LEASE_FAULTS_STORMS` sets the storms per backend (default 20).

use std::time::Duration;

use leasehold_faults::controls::{Control, ZeroLead};
use leasehold_faults::procstorm;
use leasehold_faults::record::Record;
use leasehold_faults::scenarios::{self, Measured};
use leasehold_faults::storm::{StormShape, storm};
use leasehold_faults::target::{Target, targets_from_env};
use libtest_mimic::{Arguments, Failed, Trial};

type Run = fn(
    Target,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Measured, String>> + Send>,
>;

fn scenarios_list() -> Vec<(&'static str, Run)> {
    vec![
        ("paused_process_is_fenced", |t| {
            Box::pin(async move { scenarios::paused_process(&t).await })
        }),
        ("killed_process_is_taken_over", |t| {
            Box::pin(async move { scenarios::killed_process(&t).await })
        }),
        ("blackhole_loses_before_any_grant", |t| {
            Box::pin(async move { scenarios::blackhole(&t).await })
        }),
        ("lost_renewal_responses_never_held_past_deadline", |t| {
            Box::pin(async move { scenarios::lost_renewal_responses(&t).await })
        }),
        ("ghost_grant_expires_without_token_reuse", |t| {
            Box::pin(async move { scenarios::ghost_grant(&t).await })
        }),
        ("latency_near_ttl_gives_up_by_deadline", |t| {
            Box::pin(async move { scenarios::latency_near_ttl(&t).await })
        }),
    ]
}

fn storms_per_backend() -> u64 {
    std::env::var("LEASE_FAULTS_STORMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

/// Runs `n` storms, four at a time; the first violation or error fails the test.
async fn storm_sample(t: Target, n: u64) -> Result<String, String> {
    let mut seed = 1;
    let (mut faults, mut renewals, mut unknown) = (0, 0, 0);
    while seed <= n {
        let batch: Vec<u64> = (seed..=n).take(4).collect();
        seed += batch.len() as u64;
        let runs = batch.iter().map(|&s| {
            let t = t.clone();
            async move {
                let shape = StormShape {
                    seed: s,
                    contenders: 3,
                    rounds: 2,
                };
                (s, storm(&t, shape).await)
            }
        });
        for (s, r) in futures_join(runs).await {
            let m = r.map_err(|e| format!("storm seed {s}: {e}"))?;
            if !m.violations.is_empty() {
                return Err(format!(
                    "storm seed {s}: {} violation(s): {:#?}\n{}",
                    m.violations.len(),
                    m.violations,
                    m.history.unwrap_or_default()
                ));
            }
            faults += m.faults;
            renewals += m.renewals;
            unknown += m.unknown;
        }
    }
    Ok(format!(
        "{n} storms: {faults} faults, {renewals} confirmed renewals, {unknown} unknown outcomes, no violation"
    ))
}

/// The holders' wall-clock shifts in the process storms, in seconds (holder `n` takes entry
/// `n % 3`): one on the host's clock, one 45 s behind, one 90 s ahead.
const WALL_SKEW_S: [i64; 3] = [0, -45, 90];

/// Holders at a time in the process storms, and the keys they contend for.
const HOLDERS: usize = 4;
const KEYS: usize = 3;

/// One process storm on `t`: [`HOLDERS`] holders at a time over [`KEYS`] keys are child
/// processes (`lease-fault-holder --process-storm`) that are SIGSTOPped for 0.8 to 1.6 TTLs and
/// SIGCONTed, or SIGKILLed and replaced, while they acquire, renew and write through the
/// backend's fenced resource, their wall clocks apart by [`WALL_SKEW_S`] and stepped forward and
/// back by 10 to 120 s during the storm; their late writes must be rejected and the recorded
/// history and the resource's own record (every backend: [`Record::for_url`]) must check clean.
async fn process_storm_of(t: &Target) -> Result<String, String> {
    let (record, url) = match Record::for_url(&t.direct_url()) {
        Some((r, url)) => (Some(r), url),
        None => (None, t.direct_url()),
    };
    let started = std::time::Instant::now();
    // SQLite's expiry is decided by its clients' wall clocks (`expires_ms`), which on its one host
    // are one clock: skewing or stepping them apart per process breaks it (overlapping beliefs),
    // outside what it promises. Every other backend decides expiry on the server or on monotonic
    // clocks.
    let sqlite = t.name == "sqlite";
    let plan = procstorm::Plan {
        wall_skew_s: if sqlite {
            Vec::new()
        } else {
            WALL_SKEW_S.to_vec()
        },
        clock_steps: !sqlite,
        holders: HOLDERS,
        keys: KEYS,
    };
    let m = procstorm::process_storm_planned(&url, &url, t.ttl, 1, record.as_ref(), &plan).await?;
    if !m.violations.is_empty() {
        return Err(format!(
            "process storm: {} violation(s): {:#?}\n{}",
            m.violations.len(),
            m.violations,
            m.history.unwrap_or_default()
        ));
    }
    Ok(format!(
        "process storm: {HOLDERS} holders over {KEYS} keys, {} faults ({} wall-clock steps, {} \
         seen by their holder), {} confirmed renewals, {} unknown outcomes, no violation \
         (resource's own record checked: {}, {} accepted writes), {:.1} s",
        m.faults,
        m.clock_steps,
        m.clock_steps_seen,
        m.renewals,
        m.unknown,
        record.is_some(),
        m.recorded,
        started.elapsed().as_secs_f64()
    ))
}

async fn futures_join<F: std::future::Future + Send + 'static>(
    fs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> Result<T, Failed> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let r = rt.block_on(f);
    rt.shutdown_timeout(Duration::from_secs(2));
    Ok(r)
}

fn main() {
    let args = Arguments::from_args();
    let require = leasehold_testkit::require_services();
    let storms = storms_per_backend();
    let mut trials = Vec::new();
    for target in targets_from_env() {
        let target = match target {
            Ok(t) => t,
            Err((name, why)) => {
                let msg = format!("backend {name} unavailable: {why}");
                if require {
                    trials.push(Trial::test(
                        format!("{name}::service_available"),
                        move || Err(Failed::from(msg)),
                    ));
                } else {
                    eprintln!("WARNING: {msg}; its fault scenarios are ignored");
                }
                continue;
            }
        };
        for (name, run) in scenarios_list() {
            let t = target.clone();
            trials.push(Trial::test(format!("{}::{name}", t.name), move || {
                let r = block_on(async {
                    tokio::time::timeout(Duration::from_secs(120), run(t)).await
                })?;
                match r {
                    Ok(Ok(m)) if m.violations.is_empty() => {
                        eprintln!("measured: {m:?}");
                        Ok(())
                    }
                    Ok(Ok(m)) => Err(Failed::from(format!("violations: {:#?}", m.violations))),
                    Ok(Err(e)) => Err(Failed::from(e)),
                    Err(_) => Err(Failed::from("scenario did not finish within 120 s")),
                }
            }));
        }
        let t = target.clone();
        trials.push(Trial::test(
            format!("{}::control_zero_loss_lead_is_caught", t.name),
            move || {
                let r = block_on(async {
                    let b = ZeroLead(t);
                    for seed in 1..=10 {
                        let shape = StormShape {
                            seed,
                            contenders: 3,
                            rounds: 2,
                        };
                        let m = storm(&b, shape).await?;
                        if Control::ZeroLossLead.caught_by(&m) {
                            return Ok(format!("caught in storm {seed}: {:?}", m.verdict()));
                        }
                    }
                    Err(
                        "a supervisor with a zero loss lead was NOT caught in 10 storms"
                            .to_string(),
                    )
                })?;
                eprintln!("{}", r.clone().unwrap_or_default());
                r.map(|_| ()).map_err(Failed::from)
            },
        ));
        if let Some((record, url)) = Record::for_url(&target.direct_url()) {
            trials.push(Trial::test(
                format!(
                    "{}::control_ungranted_write_in_resource_record_is_caught",
                    target.name
                ),
                move || {
                    let r = block_on(async {
                        tokio::time::timeout(
                            Duration::from_secs(60),
                            leasehold_faults::record::live_control(&record, &url),
                        )
                        .await
                    })?;
                    match r {
                        Ok(Ok(caught)) => {
                            eprintln!("{caught}");
                            Ok(())
                        }
                        Ok(Err(e)) => Err(Failed::from(e)),
                        Err(_) => Err(Failed::from("the control did not finish within 60 s")),
                    }
                },
            ));
        }
        let t = target.clone();
        trials.push(Trial::test(
            format!("{}::process_storm_sigstop_sigcont_sigkill", t.name),
            move || {
                let r = block_on(async {
                    tokio::time::timeout(Duration::from_secs(180), process_storm_of(&t)).await
                })?;
                match r {
                    Ok(Ok(summary)) => {
                        eprintln!("{summary}");
                        Ok(())
                    }
                    Ok(Err(e)) => Err(Failed::from(e)),
                    Err(_) => Err(Failed::from(
                        "the process storm did not finish within 180 s",
                    )),
                }
            },
        ));
        let t = target.clone();
        trials.push(Trial::test(format!("{}::storms", t.name), move || {
            let r = block_on(async {
                tokio::time::timeout(Duration::from_secs(600), storm_sample(t, storms)).await
            })?;
            match r {
                Ok(Ok(summary)) => {
                    eprintln!("{summary}");
                    Ok(())
                }
                Ok(Err(e)) => Err(Failed::from(e)),
                Err(_) => Err(Failed::from("storms did not finish within 600 s")),
            }
        }));
    }
    libtest_mimic::run(&args, trials).exit()
}
