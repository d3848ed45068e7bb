//! Overhead of the store decorator on the acquire + release path.
//!
//! Runs acquire + release on the in-memory store (the worst case for the decorator: no network,
//! a call costs about a microsecond) with and without [`InstrumentedStore`], interleaved in the
//! same run so both see the same machine state, with an SDK meter provider installed (an
//! in-memory exporter, so every call really aggregates). Prints ns per acquire+release and the
//! ratio.
//!
//! ```text
//! cargo bench -p leasehold-otel --bench overhead           # full run (a few seconds)
//! LEASE_BENCH_SMOKE=1 cargo bench -p leasehold-otel --bench overhead   # about a second
//! ```
//! Without `--bench` on the command line (as under `cargo test --benches`) it runs in smoke mode.
//!
//! [`InstrumentedStore`]: leasehold_otel::InstrumentedStore

use std::hint::black_box;
use std::time::{Duration, Instant};

use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId};
use leasehold_otel::{LeaseMetrics, OtelConfig};
use opentelemetry::metrics::MeterProvider;
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

fn smoke() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let env = std::env::var("LEASE_BENCH_SMOKE").is_ok_and(|v| v == "1" || v == "true");
    env || args.iter().any(|a| a == "--smoke") || !args.iter().any(|a| a == "--bench")
}

/// Time for `n` acquire + release pairs on `store`.
async fn run(store: &dyn LeaseStore, req: &AcquireRequest, n: u32) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        let lease = store
            .acquire(req)
            .await
            .expect("acquire")
            .lease()
            .expect("free key");
        let _ = black_box(store.release(&lease).await.expect("release"));
    }
    start.elapsed()
}

fn per_op(d: Duration, n: u32) -> f64 {
    d.as_secs_f64() * 1e9 / f64::from(n)
}

fn main() {
    let smoke = smoke();
    let (rounds, n) = if smoke { (5, 2_000) } else { (15, 50_000) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(InMemoryMetricExporter::default()).build())
        .build();
    let meter = provider.meter("leasehold-otel-bench");
    let plain = MemoryLeaseStore::new();
    let instrumented = LeaseMetrics::new(&meter).store(MemoryLeaseStore::new());
    // The global meter provider is not set: a no-op meter, isolating the decorator's own cost
    // (span, clock reads, boxing) from the SDK's aggregation.
    let noop = LeaseMetrics::global().store(MemoryLeaseStore::new());
    let keyed = LeaseMetrics::with_config(&meter, OtelConfig::new().with_key_attribute())
        .store(MemoryLeaseStore::new());
    let req = AcquireRequest::new(
        LeaseKey::new("bench").expect("key"),
        OwnerId::new("bench-owner").expect("owner"),
        Duration::from_secs(30),
    );

    let (mut base, mut deco, mut deco_key, mut deco_noop) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    rt.block_on(async {
        // Warm up all three (allocations, attribute sets).
        run(&plain, &req, n / 10).await;
        run(&instrumented, &req, n / 10).await;
        run(&keyed, &req, n / 10).await;
        run(&noop, &req, n / 10).await;
        for _ in 0..rounds {
            base.push(per_op(run(&plain, &req, n).await, n));
            deco.push(per_op(run(&instrumented, &req, n).await, n));
            deco_key.push(per_op(run(&keyed, &req, n).await, n));
            deco_noop.push(per_op(run(&noop, &req, n).await, n));
        }
    });
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (b, d, k, z) = (
        median(&mut base),
        median(&mut deco),
        median(&mut deco_key),
        median(&mut deco_noop),
    );
    println!(
        "acquire+release on the memory store ({} mode, {rounds} rounds x {n}, median):",
        if smoke { "smoke" } else { "full" }
    );
    if cfg!(debug_assertions) {
        println!(
            "  (debug build: not meaningful, run `cargo bench -p leasehold-otel --bench overhead`)"
        );
    }
    println!("  plain                          {b:>9.0} ns");
    println!(
        "  InstrumentedStore              {d:>9.0} ns   ratio {:.2}   +{:.0} ns",
        d / b,
        d - b
    );
    println!(
        "  InstrumentedStore + lease.key  {k:>9.0} ns   ratio {:.2}   +{:.0} ns",
        k / b,
        k - b
    );
    println!(
        "  InstrumentedStore, no-op meter {z:>9.0} ns   ratio {:.2}   +{:.0} ns",
        z / b,
        z - b
    );
    // The same comparison on a real backend (Redis, when reachable), where the decorator's cost
    // has to be measured against a network round trip.
    let url = std::env::var("LEASE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let real = rt.block_on(async {
        let plain = leasehold_redis::RedisLeaseStore::connect(&url).await.ok()?;
        let deco = LeaseMetrics::new(&meter)
            .store(leasehold_redis::RedisLeaseStore::connect(&url).await.ok()?);
        let n = if smoke { 50 } else { 2_000 };
        let req = AcquireRequest::new(
            LeaseKey::new(format!("otel-bench-{}", std::process::id())).expect("key"),
            OwnerId::new("bench-owner").expect("owner"),
            Duration::from_secs(30),
        );
        run(&plain, &req, n / 10).await;
        run(&deco, &req, n / 10).await;
        let (mut p, mut d) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            p.push(per_op(run(&plain, &req, n).await, n));
            d.push(per_op(run(&deco, &req, n).await, n));
        }
        Some((median(&mut p), median(&mut d), n))
    });
    match real {
        Some((p, d, n)) => {
            println!("acquire+release on Redis at {url} ({rounds} rounds x {n}, median):");
            println!("  plain                          {p:>9.0} ns");
            println!(
                "  InstrumentedStore              {d:>9.0} ns   ratio {:.3}   +{:.0} ns",
                d / p,
                d - p
            );
        }
        None => println!("Redis at {url} not reachable: real-backend comparison skipped"),
    }
    let _ = provider.shutdown();
}
