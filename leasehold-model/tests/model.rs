//! The bounded model checks CI runs: the known holes are found in their old form, and every store
//! variant passes in its fixed form.

use std::time::Instant;

use leasehold_model::{Config, LeaseModel};
use stateright::{Checker, Expectation, HasDiscoveries, Model};

const TOKENS_INCREASE: &str = "tokens strictly increase in grant order";
const UNIQUE: &str = "no two grants share a token";
const EXCLUSION: &str = "within the drift bound, no two clients believe they hold the lease";
const LOSS_FIRST: &str = "loss is reported before the store's expiry";

fn run(name: &str, cfg: Config) -> impl Checker<LeaseModel> {
    run_with(name, cfg, HasDiscoveries::All)
}

fn find(name: &str, cfg: Config) -> impl Checker<LeaseModel> {
    run_with(name, cfg, HasDiscoveries::AnyFailures)
}

fn run_with(name: &str, cfg: Config, until: HasDiscoveries) -> impl Checker<LeaseModel> {
    let started = Instant::now();
    let checker = cfg
        .into_model()
        .checker()
        .threads(2)
        .finish_when(until)
        .spawn_bfs()
        .join();
    println!(
        "{name}: {} states ({} unique), depth {}, {:.1}s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker
}

/// CI's bound: three ticks (a lease lives four), so a debug build checks each variant in seconds.
fn ci(cfg: Config) -> Config {
    Config { horizon: 3, ..cfg }
}

/// One bounded check of a variant: its bounds, and the `always` properties it is known to
/// violate (real findings, asserted found and printed with their counterexample).
struct Check {
    name: &'static str,
    cfg: Config,
    findings: &'static [&'static str],
}

fn check(name: &'static str, cfg: Config) -> Check {
    Check {
        name,
        cfg,
        findings: &[],
    }
}

/// Runs a store variant's checks: each must keep every `always` property (except its named
/// findings, which must be found), and together they must reach every `sometimes` property,
/// coverage guards included; the guards not reached are named. A bound too small to reach a class
/// of state so fails instead of letting the exclusion properties pass vacuously.
fn variant(checks: Vec<Check>) {
    let mut wanted: Vec<&'static str> = Vec::new();
    let mut reached: Vec<&'static str> = Vec::new();
    for Check {
        name,
        cfg,
        findings,
    } in checks
    {
        let c = run(name, cfg);
        for p in c.model().properties() {
            match p.expectation {
                Expectation::Sometimes => {
                    if !wanted.contains(&p.name) {
                        wanted.push(p.name);
                    }
                    if c.discovery(p.name).is_some() && !reached.contains(&p.name) {
                        println!("  {name}: {}", p.name);
                        reached.push(p.name);
                    }
                }
                _ if findings.contains(&p.name) => found(&c, p.name),
                _ => {
                    c.assert_no_discovery(p.name);
                }
            }
        }
    }
    let unreached: Vec<&str> = wanted
        .into_iter()
        .filter(|n| !reached.contains(n))
        .collect();
    assert!(
        unreached.is_empty(),
        "coverage guards not reached: {unreached:#?}"
    );
}

fn found(checker: &impl Checker<LeaseModel>, property: &'static str) {
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("the checker did not find a violation of {property:?}"));
    println!("counterexample for {property:?}:");
    for (state, action) in path.into_vec() {
        println!("  {state}");
        if let Some(a) = action {
            println!("    -> {a:?}");
        }
    }
}

#[test]
fn kubernetes_create_with_token_from_an_earlier_list_is_found() {
    let c = find("k8s old", Config::kubernetes(false));
    found(&c, TOKENS_INCREASE);
}

/// Bounds that reach an expiry takeover and `AtRisk`: a fourth tick (a lease granted at tick 0
/// expires at the store at tick 4) and no drift margin (the clients' clocks do not lag here), so a
/// renewal sent at tick 2 times out at tick 3, before the loss deadline at 3.5. With a margin of
/// one tick the loss deadline is 2.5 and every renewal's timeout falls after it.
fn timing(cfg: Config) -> Config {
    Config {
        horizon: 4,
        drift_margin_ticks: 0,
        losses: 0,
        ..cfg
    }
}

/// Bounds that reach a release racing a renewal: the renewal sent at tick 2 times out at tick 3
/// (or is still in flight) when the client releases.
fn release(cfg: Config) -> Config {
    Config {
        horizon: 3,
        drift_margin_ticks: 0,
        losses: 0,
        release: true,
        promotions: 0,
        ..cfg
    }
}

/// Bounds that reach a duplicated request delivered twice, and with it (a duplicated acquire) a
/// same-owner re-grant.
fn duplicates(cfg: Config) -> Config {
    Config {
        horizon: 2,
        losses: 0,
        duplicates: 1,
        promotions: 0,
        ..cfg
    }
}

/// Bounds for three clients: one tick of time (the clients' clocks may lag by the variant's
/// `max_lag` on top), releases, so the lease passes from hand to hand through all three clients and
/// each of them writes with its token. No lease expires within one tick: the expiry takeover, AtRisk
/// and the other timing guards stay with the two-client checks, whose bounds reach them.
fn three_clients(cfg: Config) -> Config {
    Config {
        clients: 3,
        horizon: 1,
        release: true,
        ..cfg
    }
}

/// A duplicated acquire delivered after its first copy was answered re-grants the same owner a
/// new token (the row stores' and etcd's same-owner rule): the client holds the first token while
/// the store's record carries the second, so it believes it holds a grant the store superseded
/// (its next renewal is refused). No other client is let in (the record is still its owner's).
const SAME_OWNER_FINDING: &[&str] = &[LOSS_FIRST];

#[test]
fn kubernetes_token_from_the_grants_own_write_passes() {
    let k = || Config::kubernetes(true);
    variant(vec![
        check("k8s fixed", ci(k())),
        check("k8s fixed, timing", timing(k())),
        check(
            "k8s fixed, three clients",
            Config {
                losses: 0,
                ..three_clients(k())
            },
        ),
        // One client re-acquiring after its own lease expired: the same-owner re-grant, a
        // duplicate, a release racing a renewal.
        check(
            "k8s fixed, one client",
            Config {
                clients: 1,
                attempts: 2,
                duplicates: 1,
                release: true,
                ..timing(k())
            },
        ),
    ]);
}

#[test]
fn postgres_failover_without_a_clock_floor_is_found() {
    let c = find("pg failover old", Config::postgres_failover(false));
    found(&c, UNIQUE);
}

#[test]
fn postgres_failover_with_a_clock_floor_passes() {
    let p = || Config::postgres_failover(true);
    variant(vec![
        check("pg failover fixed", ci(p())),
        check("pg failover fixed, timing", timing(p())),
        check("pg failover fixed, release", release(p())),
        Check {
            findings: SAME_OWNER_FINDING,
            ..check("pg failover fixed, duplicates", duplicates(p()))
        },
    ]);
}

#[test]
fn cas_row_passes() {
    let c = Config::cas_row;
    // The clients' clocks lag by up to a tick, so the margin stays one tick and the renewals come
    // every tick instead (a renewal sent at tick 1 times out at 2, before the loss deadline 2.5).
    let every_tick = || Config {
        renew_ticks: 1,
        ..c()
    };
    variant(vec![
        check("cas row", c()),
        check("cas row, timing", every_tick()),
        check("cas row, three clients", three_clients(c())),
        check(
            "cas row, release",
            Config {
                horizon: 3,
                losses: 0,
                release: true,
                ..every_tick()
            },
        ),
        Check {
            findings: SAME_OWNER_FINDING,
            ..check("cas row, duplicates", duplicates(c()))
        },
    ]);
}

#[test]
fn redis_clock_floored_counter_passes() {
    let r = Config::redis;
    variant(vec![
        check(
            "redis",
            Config {
                losses: 0,
                ..ci(r())
            },
        ),
        check(
            "redis, timing",
            Config {
                promotions: 0,
                ..timing(r())
            },
        ),
        check("redis, release", release(r())),
        check(
            "redis, three clients",
            Config {
                losses: 0,
                promotions: 0,
                ..three_clients(r())
            },
        ),
        Check {
            findings: SAME_OWNER_FINDING,
            ..check("redis, duplicates", duplicates(r()))
        },
    ]);
}

#[test]
fn etcd_lock_keys_pass() {
    let e = Config::etcd;
    variant(vec![
        check("etcd", ci(e())),
        check("etcd, timing", timing(e())),
        check("etcd, three clients", three_clients(e())),
        Check {
            findings: SAME_OWNER_FINDING,
            ..check("etcd, duplicates", duplicates(e()))
        },
    ]);
}

#[test]
fn drift_beyond_the_margin_is_found() {
    let cfg = Config {
        max_lag: 2,
        drift_margin_ticks: 1,
        ..Config::cas_row()
    };
    let c = find("drift beyond margin", cfg);
    // Whichever the breadth-first search meets first: a client believing past the store's
    // expiry, or (one step later) two clients believing at once.
    if c.discovery(EXCLUSION).is_some() {
        found(&c, EXCLUSION);
    } else {
        found(&c, LOSS_FIRST);
    }
}

#[test]
fn promoted_clock_lagging_more_than_the_failover_time_is_found() {
    // The clock-floor assumption is needed: a promoted server whose clock lags by two ticks
    // (failover takes one) issues a token below the lost grant's.
    let cfg = Config {
        promoted_clock_lag: 2,
        ..Config::postgres_failover(true)
    };
    let c = find("promoted clock lag beyond failover", cfg);
    found(&c, TOKENS_INCREASE);
}
