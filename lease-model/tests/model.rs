//! The bounded model checks CI runs: the known holes are found in their old form, and every store
//! variant passes in its fixed form.

use std::time::Instant;

use lease_model::{Config, LeaseModel};
use stateright::{Checker, Model};

const TOKENS_INCREASE: &str = "tokens strictly increase in grant order";
const UNIQUE: &str = "no two grants share a token";
const EXCLUSION: &str = "within the drift bound, no two clients believe they hold the lease";

fn run(name: &str, cfg: Config) -> impl Checker<LeaseModel> {
    let started = Instant::now();
    let checker = cfg.into_model().checker().threads(2).spawn_bfs().join();
    println!(
        "{name}: {} states ({} unique), depth {}, {:.1}s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker
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
    let c = run("k8s old", Config::kubernetes(false));
    found(&c, TOKENS_INCREASE);
}

#[test]
fn kubernetes_token_from_the_grants_own_write_passes() {
    run("k8s fixed", Config::kubernetes(true)).assert_properties();
}

#[test]
fn postgres_failover_without_a_clock_floor_is_found() {
    let c = run("pg failover old", Config::postgres_failover(false));
    found(&c, UNIQUE);
}

#[test]
fn postgres_failover_with_a_clock_floor_passes() {
    run("pg failover fixed", Config::postgres_failover(true)).assert_properties();
}

#[test]
fn cas_row_passes() {
    run("cas row", Config::cas_row()).assert_properties();
}

#[test]
fn redis_clock_floored_counter_passes() {
    run("redis", Config::redis()).assert_properties();
}

#[test]
fn etcd_lock_keys_pass() {
    run("etcd", Config::etcd()).assert_properties();
}

#[test]
fn drift_beyond_the_margin_is_found() {
    let cfg = Config { max_lag: 2, drift_margin_ticks: 1, ..Config::cas_row() };
    let c = run("drift beyond margin", cfg);
    found(&c, EXCLUSION);
}
