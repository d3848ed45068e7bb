//! The fault suite in CI: every scenario once and a few storms per backend, each a named test.

use std::time::Duration;

use lease_faults::scenarios::{self, Measured};
use lease_faults::target::{Target, targets_from_env};
use libtest_mimic::{Arguments, Failed, Trial};

type Scenario = fn(
    Target,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Measured, String>> + Send>,
>;

fn scenarios_list() -> Vec<(&'static str, Scenario)> {
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
        ("storm_seed_1", |t| {
            Box::pin(async move { scenarios::storm(&t, 1, 4, 6).await })
        }),
        ("storm_seed_2", |t| {
            Box::pin(async move { scenarios::storm(&t, 2, 4, 6).await })
        }),
    ]
}

fn main() {
    let args = Arguments::from_args();
    let require = lease_testkit::require_services();
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
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let r = rt.block_on(async {
                    tokio::time::timeout(Duration::from_secs(120), run(t)).await
                });
                rt.shutdown_timeout(Duration::from_secs(2));
                match r {
                    Ok(Ok(m)) => {
                        eprintln!("measured: {m:?}");
                        Ok(())
                    }
                    Ok(Err(e)) => Err(Failed::from(e)),
                    Err(_) => Err(Failed::from("scenario did not finish within 120 s")),
                }
            }));
        }
    }
    libtest_mimic::run(&args, trials).exit()
}
