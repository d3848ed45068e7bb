//! The bounded model checks CI runs: the known holes are found in their old form, and every store
//! variant passes in its fixed form.

use std::time::Instant;

use lease_model::{Config, LeaseModel};
use stateright::{Checker, HasDiscoveries, Model};

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

/// Asserts every `always` property holds and every coverage guard was reached, naming all the
/// guards that were not (so a bound too small to reach a class of state fails the test instead
/// of letting the exclusion properties pass vacuously).
fn passes_and_reaches(checker: &impl Checker<LeaseModel>) {
    let model = checker.model();
    let unreached: Vec<&str> = model
        .coverage_guards()
        .iter()
        .map(|g| g.name)
        .filter(|n| checker.discovery(n).is_none())
        .collect();
    for g in model.coverage_guards() {
        if checker.discovery(g.name).is_some() {
            println!("  reached: {}", g.name);
        }
    }
    assert!(
        unreached.is_empty(),
        "coverage guards not reached: {unreached:#?}"
    );
    checker.assert_properties();
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

#[test]
fn kubernetes_token_from_the_grants_own_write_passes() {
    passes_and_reaches(&run("k8s fixed", ci(Config::kubernetes(true))));
}

#[test]
fn postgres_failover_without_a_clock_floor_is_found() {
    let c = find("pg failover old", Config::postgres_failover(false));
    found(&c, UNIQUE);
}

#[test]
fn postgres_failover_with_a_clock_floor_passes() {
    passes_and_reaches(&run(
        "pg failover fixed",
        ci(Config::postgres_failover(true)),
    ));
}

#[test]
fn cas_row_passes() {
    passes_and_reaches(&run("cas row", Config::cas_row()));
}

#[test]
fn redis_clock_floored_counter_passes() {
    passes_and_reaches(&run(
        "redis",
        Config {
            losses: 0,
            ..ci(Config::redis())
        },
    ));
}

#[test]
fn etcd_lock_keys_pass() {
    passes_and_reaches(&run("etcd", ci(Config::etcd())));
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
