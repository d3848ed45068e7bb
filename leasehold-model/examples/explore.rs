//! Runs one bounded check and prints its size and time.
//!
//! `cargo run --release -p leasehold-model --example explore -- <variant> [key=value ...]` where
//! variant is one of `k8s-old`, `k8s`, `pg-old`, `pg`, `cas`, `redis`, `etcd`, and the keys are
//! `horizon`, `lag`, `margin`, `losses`, `dups`, `attempts`, `writes`, `clients`, `inflight`,
//! `release` (0/1), `restarts`, `promotions`, `deletions`, `renew` and `timeout` (ticks), `cap`
//! (stop after this many million states).

use std::time::Instant;

use leasehold_model::Config;
use stateright::{Checker, Model};

fn main() {
    let mut args = std::env::args().skip(1);
    let variant = args.next().unwrap_or_else(|| "cas".into());
    let mut cfg = match variant.as_str() {
        "k8s-old" => Config::kubernetes(false),
        "k8s" => Config::kubernetes(true),
        "pg-old" => Config::postgres_failover(false),
        "pg" => Config::postgres_failover(true),
        "redis" => Config::redis(),
        "etcd" => Config::etcd(),
        _ => Config::cas_row(),
    };
    let mut cap = usize::MAX;
    for a in args {
        let Some((k, v)) = a.split_once('=') else {
            continue;
        };
        let Ok(n) = v.parse::<u8>() else { continue };
        match k {
            "horizon" => cfg.horizon = n,
            "lag" => cfg.max_lag = n,
            "margin" => cfg.drift_margin_ticks = n,
            "losses" => cfg.losses = n,
            "dups" => cfg.duplicates = n,
            "attempts" => cfg.attempts = n,
            "writes" => cfg.writes = n,
            "clients" => cfg.clients = n,
            "inflight" => cfg.max_in_flight = n,
            "release" => cfg.release = n != 0,
            "restarts" => cfg.restarts = n,
            "promotions" => cfg.promotions = n,
            "deletions" => cfg.deletions = n,
            "renew" => cfg.renew_ticks = n,
            "timeout" => cfg.op_timeout_ticks = n,
            "cap" => cap = usize::from(n) * 1_000_000,
            _ => {}
        }
    }
    println!("{variant}: {cfg:?}");
    let started = Instant::now();
    let c = cfg
        .into_model()
        .checker()
        .threads(2)
        .target_state_count(cap)
        .spawn_bfs()
        .join();
    println!(
        "{} states, {} unique, depth {}, {:.1}s",
        c.state_count(),
        c.unique_state_count(),
        c.max_depth(),
        started.elapsed().as_secs_f64()
    );
    for (name, path) in c.discoveries() {
        println!("discovery: {name} ({} steps)", path.into_actions().len());
    }
}
