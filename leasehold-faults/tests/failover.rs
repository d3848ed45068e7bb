//! Restarts and failovers inside storms, one test per scenario of
//! [`leasehold_faults::failover::Scenario`], each on servers of its own (never the shared services).
//! A test fails on any violation of a property the backend promises in that scenario, and on any
//! failure to carry the scenario out (a missing binary, a server that does not start): a
//! scenario that could not run is a failed scenario. Violations outside the guarantee
//! (asynchronous promotions) are printed with their kind, and do not fail the test.
//!
//! `*_promotion_after_forced_lag` promote a Redis replica or a PostgreSQL standby that was cut off
//! from its primary for 1.5 s of the storm: what the promotion lost is printed by kind (outside
//! the guarantee), and only a token that goes back or repeats fails it (both floor every token by
//! the server clock).
//!
//! `LEASE_FAULTS_FAILOVER_SEED` picks the storm seed (default 1).

use std::time::Duration;

use leasehold_faults::failover::{Scenario, run};
use libtest_mimic::{Arguments, Failed, Trial};

fn main() {
    let args = Arguments::from_args();
    let seed: u64 = std::env::var("LEASE_FAULTS_FAILOVER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut trials: Vec<Trial> = Scenario::ALL
        .into_iter()
        .map(|s| {
            Trial::test(format!("{}::{}", s.backend(), s.name()), move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let r = rt.block_on(async {
                    tokio::time::timeout(Duration::from_secs(300), run(s, seed)).await
                });
                rt.shutdown_timeout(Duration::from_secs(5));
                let r = r.map_err(|_| Failed::from("scenario did not finish within 300 s"))?;
                let r = r.map_err(Failed::from)?;
                let m = &r.measured;
                eprintln!(
                    "{}: {} faults, {} confirmed renewals, {} unknown outcomes; outside the guarantee: {:?}",
                    s.name(),
                    m.faults,
                    m.renewals,
                    m.unknown,
                    leasehold_testkit::history::Verdict::of(&r.outside)
                );
                for v in &r.outside {
                    eprintln!("  outside the guarantee: {v:?}");
                }
                if m.violations.is_empty() && m.failed_probes == 0 {
                    Ok(())
                } else if m.violations.is_empty() {
                    Err(Failed::from(format!(
                        "{} store read(s) at loss reports (probes) could not be carried out",
                        m.failed_probes
                    )))
                } else {
                    Err(Failed::from(format!(
                        "{} violation(s): {:#?}\n{}",
                        m.violations.len(),
                        m.violations,
                        m.history.as_deref().unwrap_or_default()
                    )))
                }
            })
        })
        .collect();
    trials.push(Trial::test(
        "redis::control_restart_without_persistence_is_caught",
        move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let r = rt.block_on(async {
                for s in seed..seed + 3 {
                    let m =
                        leasehold_faults::failover::redis_restart_without_persistence(s).await?;
                    if !m.violations.is_empty() {
                        return Ok(format!(
                            "caught in storm {s}: {:?}",
                            leasehold_testkit::history::Verdict::of(&m.violations)
                        ));
                    }
                }
                Err(
                    "a Redis restart that forgot every lease was NOT caught in 3 storms"
                        .to_string(),
                )
            });
            rt.shutdown_timeout(Duration::from_secs(5));
            let r = r.map_err(Failed::from)?;
            eprintln!("{r}");
            Ok(())
        },
    ));
    libtest_mimic::run(&args, trials).exit()
}
