//! The soak run: every scenario plus many storms per backend, summarised as the table in
//! `docs/faults.md`.
//!
//! `cargo run --release -p lease-faults --bin soak -- --storms 1000 [--backend redis] [--out docs/faults.md]`

use std::time::Duration;

use lease_faults::report::BackendReport;
use lease_faults::scenarios;
use lease_faults::target::targets_from_env;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn run<F>(f: F) -> Result<lease_faults::scenarios::Measured, String>
where
    F: std::future::Future<Output = Result<lease_faults::scenarios::Measured, String>>,
{
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .unwrap_or_else(|_| Err("timeout".to_string()))
}

fn scenario(
    rep: &mut BackendReport,
    name: &str,
    r: Result<lease_faults::scenarios::Measured, String>,
) {
    if let Err(e) = &r {
        eprintln!("{} scenario {name} FAILED: {e}", rep.backend);
    }
    rep.add(&r);
}

#[tokio::main]
async fn main() {
    let storms: u64 = arg("--storms").and_then(|s| s.parse().ok()).unwrap_or(10);
    let only = arg("--backend");
    let contenders: usize = arg("--contenders")
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let rounds: usize = arg("--rounds").and_then(|s| s.parse().ok()).unwrap_or(6);
    let out = arg("--out");
    let mut reports = Vec::new();
    for t in targets_from_env() {
        let Ok(t) = t else { continue };
        if only.as_deref().is_some_and(|o| o != t.name) {
            continue;
        }
        let mut rep = BackendReport::new(t.name);
        scenario(
            &mut rep,
            "paused_process",
            run(scenarios::paused_process(&t)).await,
        );
        scenario(
            &mut rep,
            "killed_process",
            run(scenarios::killed_process(&t)).await,
        );
        scenario(&mut rep, "blackhole", run(scenarios::blackhole(&t)).await);
        scenario(
            &mut rep,
            "lost_renewal_responses",
            run(scenarios::lost_renewal_responses(&t)).await,
        );
        scenario(
            &mut rep,
            "ghost_grant",
            run(scenarios::ghost_grant(&t)).await,
        );
        scenario(
            &mut rep,
            "latency_near_ttl",
            run(scenarios::latency_near_ttl(&t)).await,
        );
        for seed in 0..storms {
            let r = run(scenarios::storm(&t, seed, contenders, rounds)).await;
            if let Err(e) = &r {
                eprintln!("{} storm seed {seed} FAILED: {e}", t.name);
            }
            rep.add(&r);
            if seed % 10 == 9 {
                eprintln!("{}: {} storms, {} failed", t.name, seed + 1, rep.failures);
                if let Some(path) = &out {
                    let partial = format!(
                        "{}\n{}\n\n(partial: {} of {storms} storms so far)\n",
                        BackendReport::header(),
                        rep.row(),
                        seed + 1
                    );
                    let _ = std::fs::write(format!("{path}.partial"), partial);
                }
            }
        }
        println!("{}", rep.row());
        reports.push(rep);
    }
    let mut table = String::from(BackendReport::header());
    table.push('\n');
    for r in &reports {
        table.push_str(&r.row());
        table.push('\n');
    }
    println!("{table}");
    if let Some(path) = out {
        let doc = format!(
            "# Fault suite: soak results\n\nProduced by `cargo run -p lease-faults --bin soak -- --storms {storms} --contenders {contenders} --rounds {rounds}{} --out {path}` \
             against the services started by `scripts/test.sh` (each storm: {contenders} contenders behind fault proxies, {rounds} rounds each, \
             random blackholes, lost responses, resets and latency while holding; plus one run of every scenario).\n\n{table}",
            only.as_deref()
                .map(|b| format!(" --backend {b}"))
                .unwrap_or_default()
        );
        std::fs::write(&path, doc).expect("write report");
    }
    if reports
        .iter()
        .any(|r| r.stale_accepted > 0 || r.regressions > 0)
    {
        std::process::exit(1);
    }
}
