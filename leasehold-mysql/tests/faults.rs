//! The fault suite (leasehold-faults) against the real MariaDB/MySQL server, through a loopback
//! fault proxy: the scenarios that need no child process (black hole, lost renewal responses,
//! ghost grant, latency near the TTL), the zero-loss-lead negative control, and a sample of
//! storms (`LEASE_FAULTS_STORMS`, default 20). Each is a named test; a run fails on any
//! violation (named by kind) and on any error of the test itself.
//!
//! Server: `LEASE_MYSQL_URL`, as the main test target (through leasehold-testkit's test store
//! table).

use std::net::ToSocketAddrs;
use std::time::Duration;

use leasehold_faults::controls::{Control, ZeroLead};
use leasehold_faults::scenarios::{self, Measured};
use leasehold_faults::storm::{StormShape, storm};
use leasehold_faults::target::{Endpoint, Target};
use libtest_mimic::{Arguments, Failed, Trial};

type Run = fn(
    Target,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Measured, String>> + Send>,
>;

fn scenario_list() -> Vec<(&'static str, Run)> {
    vec![
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

/// The target: `LEASE_MYSQL_URL` (or its default in leasehold-testkit's test store table) with
/// its `host:port` replaced by the proxy's (`{addr}`), the tables of the main test target, and
/// the TTLs of the PostgreSQL target.
fn target() -> Result<Target, String> {
    let url = leasehold_testkit::stores::MYSQL_URL.get();
    let rest = url.split_once("://").ok_or("no scheme")?.1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let hp = rest.split(['/', '?']).next().unwrap_or(rest);
    let upstream = hp
        .to_socket_addrs()
        .map_err(|e| format!("{hp}: {e}"))?
        .find(|a| a.is_ipv4())
        .ok_or(format!("{hp}: no IPv4 address"))?;
    let sep = if url.contains('?') { '&' } else { '?' };
    let template = format!(
        "{}{sep}table=lease_my_faults",
        url.replacen(hp, "{addr}", 1)
    );
    Ok(Target {
        name: "mysql",
        endpoint: Endpoint::Url { template, upstream },
        ttl: Duration::from_millis(1000),
        takeover_slack: Duration::from_millis(500),
    })
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

fn storms() -> u64 {
    std::env::var("LEASE_FAULTS_STORMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

async fn storm_sample(t: Target, n: u64) -> Result<String, String> {
    let (mut faults, mut renewals, mut unknown) = (0, 0, 0);
    for seed in 1..=n {
        let shape = StormShape {
            seed,
            contenders: 3,
            rounds: 2,
        };
        let m = storm(&t, shape)
            .await
            .map_err(|e| format!("storm seed {seed}: {e}"))?;
        if !m.violations.is_empty() {
            return Err(format!(
                "storm seed {seed}: {} violation(s): {:#?}\n{}",
                m.violations.len(),
                m.violations,
                m.history.unwrap_or_default()
            ));
        }
        faults += m.faults;
        renewals += m.renewals;
        unknown += m.unknown;
    }
    Ok(format!(
        "{n} storms: {faults} faults, {renewals} confirmed renewals, {unknown} unknown outcomes, no violation"
    ))
}

fn main() {
    let args = Arguments::from_args();
    let target = match target() {
        Ok(t) => t,
        Err(e) => {
            let trial = Trial::test("mysql::service_available", move || {
                Err(Failed::from(e.clone()))
            });
            libtest_mimic::run(&args, vec![trial]).exit();
        }
    };
    let mut trials = Vec::new();
    for (name, run) in scenario_list() {
        let t = target.clone();
        trials.push(Trial::test(format!("mysql::{name}"), move || {
            let r =
                block_on(async { tokio::time::timeout(Duration::from_secs(120), run(t)).await })?;
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
        "mysql::control_zero_loss_lead_is_caught",
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
                Err("a supervisor with a zero loss lead was NOT caught in 10 storms".to_string())
            })?;
            eprintln!("{}", r.clone().unwrap_or_default());
            r.map(|_| ()).map_err(Failed::from)
        },
    ));
    let n = storms();
    let t = target;
    trials.push(Trial::test("mysql::storms", move || {
        let r = block_on(async {
            tokio::time::timeout(Duration::from_secs(600), storm_sample(t, n)).await
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
    libtest_mimic::run(&args, trials).exit()
}
