//! # lease-bench
//!
//! Measures every reachable backend through the library and through its raw protocol (the same
//! statements, scripts and requests issued directly, with the same driver and connection), in
//! one run, and writes the report to `docs/benchmarks.md`.
//!
//! ```text
//! cargo run --release -p lease-bench                 # full run, writes docs/benchmarks.md
//! cargo run -p lease-bench -- --smoke --out /tmp/b.md   # every measurement, tiny counts
//! ```
//!
//! Backends come from the environment: `LEASE_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), `LEASE_REDIS_URL` (default
//! `redis://127.0.0.1:6379`), `LEASE_ETCD_ENDPOINTS` (default `http://127.0.0.1:23790`),
//! `KUBECONFIG` plus `LEASE_K8S_NAMESPACE` (default `default`; Kubernetes is skipped without
//! `KUBECONFIG`), and SQLite on a temporary file. `--backends a,b` limits the run;
//! `LEASE_BENCH_SMOKE=1` equals `--smoke`; `LEASE_BENCH_RENEWAL_INTERVALS=N` changes how many
//! renewal intervals the renewal load counts, and `LEASE_BENCH_TRACE=1` prints the running count
//! of renewal round trips (for checking the figure by eye).

mod measure;
mod raw;
mod report;
mod sys;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lease_core::LeaseStore;
use tokio::time::timeout;

use crate::measure::legal_ttl;
use crate::raw::Raw;
use crate::report::{BackendRun, Report};

/// Every backend, in run and report order: the in-process SQLite before etcd and Kubernetes,
/// whose servers keep working for a while after their phase (expiring and deleting the renewal
/// load's 10,000 keys, tearing down watches) on the same two cores.
const BACKENDS: [&str; 5] = ["postgres", "redis", "sqlite", "etcd", "k8s"];

/// How much to measure.
#[derive(Debug, Clone, Copy)]
struct Plan {
    smoke: bool,
    throughput_for: Duration,
    throughput_block: Duration,
    latency_samples: usize,
    latency_rounds: usize,
    rtt_samples: usize,
    takeover_reps: usize,
    handoff_reps: usize,
    renewal_leases: usize,
    renewal_leases_k8s: usize,
    renewal_ttl: Duration,
    renewal_intervals: u32,
}

impl Plan {
    fn full() -> Self {
        Plan {
            smoke: false,
            throughput_for: Duration::from_secs(16),
            throughput_block: Duration::from_millis(200),
            latency_samples: 8000,
            latency_rounds: 1,
            rtt_samples: 50,
            takeover_reps: 9,
            handoff_reps: 5,
            renewal_leases: 10_000,
            renewal_leases_k8s: 200,
            renewal_ttl: Duration::from_secs(30),
            renewal_intervals: 3,
        }
    }

    fn smoke() -> Self {
        Plan {
            smoke: true,
            throughput_for: Duration::from_millis(400),
            throughput_block: Duration::from_millis(100),
            latency_samples: 10,
            latency_rounds: 1,
            rtt_samples: 5,
            takeover_reps: 1,
            handoff_reps: 1,
            renewal_leases: 40,
            renewal_leases_k8s: 10,
            renewal_ttl: Duration::from_millis(1500),
            renewal_intervals: 1,
        }
    }
}

/// A connected backend: the library store, its raw protocol, and the store for renewal load.
struct Target {
    store: Arc<dyn LeaseStore>,
    raw: Option<Arc<dyn Raw>>,
    renewal_store: Arc<dyn LeaseStore>,
    version: String,
    cleanup: Cleanup,
}

enum Cleanup {
    None,
    Postgres(sqlx::PgPool),
    Redis(lease_redis::RedisLeaseStore),
    Files(Vec<PathBuf>),
    Kube(Box<kube::Api<k8s_openapi::api::coordination::v1::Lease>>),
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

async fn connect(name: &str) -> Result<Target, String> {
    let e = |e: lease_core::Error| e.to_string();
    match name {
        "postgres" => {
            let url = env_or(
                "LEASE_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            );
            // Lazily, then migrate: a fresh database has no lease table yet.
            let store = lease_postgres::PostgresLeaseStore::connect_lazy(
                &url,
                lease_postgres::PostgresOptions::default(),
            )
            .map_err(e)?;
            store.migrate().await.map_err(e)?;
            let raw = raw::PgRaw(store.pool().clone());
            let version = raw.version().await?;
            let pool = store.pool().clone();
            let store: Arc<dyn LeaseStore> = Arc::new(store);
            Ok(Target {
                renewal_store: store.clone(),
                store,
                raw: Some(Arc::new(raw)),
                version,
                cleanup: Cleanup::Postgres(pool),
            })
        }
        "redis" => {
            let url = env_or("LEASE_REDIS_URL", "redis://127.0.0.1:6379");
            let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
            let store = lease_redis::RedisLeaseStore::builder(url)
                .prefix("bench")
                .connect_timeout(Duration::from_secs(3))
                .connect()
                .await
                .map_err(e)?;
            let raw = raw::RedisRaw::new(&store, client);
            let version = raw.version().await?;
            let shared: Arc<dyn LeaseStore> = Arc::new(store.clone());
            Ok(Target {
                renewal_store: shared.clone(),
                store: shared,
                raw: Some(Arc::new(raw)),
                version,
                cleanup: Cleanup::Redis(store),
            })
        }
        "etcd" => {
            let endpoints = env_or("LEASE_ETCD_ENDPOINTS", "http://127.0.0.1:23790");
            let config = lease_etcd::EtcdConfig::from_list(&endpoints)
                .with_connect_timeout(Duration::from_secs(3));
            let store = lease_etcd::EtcdLeaseStore::connect(config.clone())
                .await
                .map_err(e)?;
            let shared = lease_etcd::EtcdLeaseStore::connect(
                config
                    .clone()
                    .with_lease_sharing(lease_etcd::LeaseSharing::PerTtl),
            )
            .await
            .map_err(e)?;
            let metrics = endpoints
                .split(',')
                .next()
                .map(|e| e.trim().trim_start_matches("http://").trim_end_matches('/'))
                .filter(|e| !e.is_empty() && !e.starts_with("https://"))
                .map(str::to_string);
            let raw = raw::EtcdRaw {
                client: store.client(),
                config,
                metrics,
            };
            let version = raw.version().await?;
            Ok(Target {
                store: Arc::new(store),
                raw: Some(Arc::new(raw)),
                renewal_store: Arc::new(shared),
                version,
                cleanup: Cleanup::None,
            })
        }
        "k8s" => {
            if std::env::var_os("KUBECONFIG").is_none() {
                return Err("KUBECONFIG is not set".into());
            }
            let namespace = env_or("LEASE_K8S_NAMESPACE", "default");
            let client = lease_k8s::infer_client().await.map_err(e)?;
            let version = client
                .apiserver_version()
                .await
                .map(|v| format!("kube-apiserver {}", v.git_version))
                .map_err(|e| e.to_string())?;
            let kube_store = lease_k8s::KubeLeaseStore::builder(client.clone())
                .namespace(namespace.clone())
                .build()
                .map_err(e)?;
            let raw = raw::KubeRaw {
                api: kube::Api::namespaced(client, &namespace),
                store: kube_store.clone(),
            };
            let api = raw.api.clone();
            let store: Arc<dyn LeaseStore> = Arc::new(kube_store);
            Ok(Target {
                renewal_store: store.clone(),
                store,
                raw: Some(Arc::new(raw)),
                version,
                cleanup: Cleanup::Kube(Box::new(api)),
            })
        }
        "sqlite" => {
            let path = std::env::temp_dir().join(format!(
                "lease-bench-{}-{}.db",
                std::process::id(),
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ));
            let store = lease_sqlite::SqliteLeaseStore::open(&path)
                .await
                .map_err(e)?;
            // The raw side writes its own file with the same settings: on one shared file the
            // WAL's automatic checkpoints (one every 1,000 pages, run by whichever commit
            // crosses the mark) fell, in step with the alternation, on one side's acquires
            // more than on the other's, and decided its p99. Each side now pays for its own.
            let raw_path = path.with_extension("raw.db");
            // Opening a store creates the schema the raw side writes to.
            drop(
                lease_sqlite::SqliteLeaseStore::open(&raw_path)
                    .await
                    .map_err(e)?,
            );
            let raw = raw::SqliteRaw::open(&raw_path).await?;
            let version = raw.version().await?;
            let store: Arc<dyn LeaseStore> = Arc::new(store);
            Ok(Target {
                renewal_store: store.clone(),
                store,
                raw: Some(Arc::new(raw)),
                version,
                cleanup: Cleanup::Files(vec![path, raw_path]),
            })
        }
        other => Err(format!("unknown backend {other}")),
    }
}

async fn cleanup(c: Cleanup, ns: &str) {
    match c {
        Cleanup::None => {}
        Cleanup::Postgres(pool) => {
            for table in ["\"public\".\"leases\"", "\"public\".\"leases_fence\""] {
                let sql = format!("DELETE FROM {table} WHERE starts_with(resource_key, $1)");
                let _ = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(ns)
                    .execute(&pool)
                    .await;
            }
        }
        Cleanup::Redis(store) => {
            let mut con = store.connection();
            let pattern = store.layout().scan_pattern(ns);
            let mut cursor: u64 = 0;
            loop {
                let r: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut con)
                    .await;
                let Ok((next, keys)) = r else { break };
                if !keys.is_empty() {
                    let _: redis::RedisResult<i64> =
                        redis::cmd("DEL").arg(&keys).query_async(&mut con).await;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Cleanup::Kube(api) => {
            if let Ok(list) = api.list(&kube::api::ListParams::default()).await {
                for obj in list.items {
                    if let Some(name) = obj.metadata.name
                        && name.contains(ns)
                    {
                        let _ = api.delete(&name, &kube::api::DeleteParams::default()).await;
                    }
                }
            }
        }
        Cleanup::Files(paths) => {
            for path in paths {
                for suffix in ["", "-wal", "-shm"] {
                    let mut p = path.clone().into_os_string();
                    p.push(suffix);
                    let _ = std::fs::remove_file(p);
                }
            }
        }
    }
}

async fn run_backend(name: &'static str, plan: Plan) -> BackendRun {
    let mut run = BackendRun::new(name);
    let target = match timeout(Duration::from_secs(20), connect(name)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            run.skipped = Some(e);
            return run;
        }
        Err(_) => {
            run.skipped = Some("no answer within 20 s".into());
            return run;
        }
    };
    let ns = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let store = target.store.clone();
    let caps = store.capabilities();
    run.version = target.version.clone();
    run.watch = caps.watch;
    run.has_raw = target.raw.is_some();
    let raw = target.raw.as_ref();
    run.rtt_what = raw.map_or("inspect (one GET)", |r| r.ping_name());
    run.rtt_ms = measure::rtt(raw, &store, &ns, plan.rtt_samples).await;
    eprintln!("[{name}] {} rtt {:?}", run.version, run.rtt_ms);

    // 1. throughput
    for clients in [1usize, 8] {
        // Warm-up (connections, prepared statements, script cache), not counted.
        let warm = plan.throughput_for / 6;
        let _warm = measure::throughput_interleaved(
            &store,
            raw,
            &format!("{ns}-{clients}w"),
            clients,
            warm,
            plan.throughput_block,
        )
        .await;
        let (lib, rawr, aa) = measure::throughput_interleaved(
            &store,
            raw,
            &format!("{ns}-{clients}m"),
            clients,
            plan.throughput_for,
            plan.throughput_block,
        )
        .await;
        eprintln!("[{name}] throughput {clients} clients: lib {lib:?} raw {rawr:?} A/A {aa:?}");
        run.throughput.push((clients, lib, rawr, aa));
    }

    // 2. latency: the library and the raw protocol alternately, one sample each (which side
    // goes first alternates too), so that a burst of load on the machine hits both alike; in
    // `latency_rounds` consecutive rounds of equal size.
    let rounds = plan.latency_rounds.max(1);
    let total = plan.latency_samples / rounds * rounds;
    let mut lat_lib: Result<Vec<Duration>, String> = Ok(Vec::new());
    let mut lat_raw: Option<Result<Vec<Duration>, String>> = raw.map(|_| Ok(Vec::new()));
    for i in 0..total {
        for side in [i % 2, 1 - i % 2] {
            if side == 0 {
                if let (Some(r), Some(Ok(acc))) = (raw, lat_raw.as_mut()) {
                    match measure::latency_raw(r, &caps, &ns, 1).await {
                        Ok(v) => acc.extend(v),
                        Err(e) => lat_raw = Some(Err(e)),
                    }
                }
            } else if let Ok(acc) = lat_lib.as_mut() {
                match measure::latency_lib(&store, &ns, 1).await {
                    Ok(v) => acc.extend(v),
                    Err(e) => lat_lib = Err(e),
                }
            }
        }
    }
    run.latency_raw = lat_raw;
    run.latency_lib = lat_lib;
    run.latency_rounds = rounds;
    eprintln!("[{name}] latency done");

    // 3. takeover
    let ttl = legal_ttl(&caps, Duration::from_secs(1));
    run.takeover_ttl = ttl;
    for rep in 0..plan.takeover_reps {
        if caps.watch {
            // Paired with the raw protocol's own expiry delay where the store reports one.
            let (t, own) = measure::takeover(&store, &ns, rep, true, ttl, raw).await;
            run.takeover_watch.push(t);
            if let Some(own) = own {
                run.expiry_floor.push(own);
            }
        }
        run.takeover_poll.push(
            measure::takeover(&store, &ns, rep, false, ttl, None)
                .await
                .0,
        );
    }
    eprintln!(
        "[{name}] takeover watch {:?} poll {:?} store expiry delay {:?}",
        run.takeover_watch, run.takeover_poll, run.expiry_floor
    );

    // 4. handoff
    if let Some(r) = raw {
        run.handoff_floor =
            Some(measure::handoff_floor(r, &caps, &ns, plan.handoff_reps * 4).await);
        run.handoff_notified =
            Some(measure::handoff_notified(r, &caps, &ns, plan.handoff_reps * 2).await);
    }
    for rep in 0..plan.handoff_reps {
        if caps.watch {
            run.handoff_watch
                .push(measure::handoff(&store, &ns, rep, true).await);
        }
        run.handoff_poll
            .push(measure::handoff(&store, &ns, rep, false).await);
    }
    eprintln!(
        "[{name}] handoff watch {:?} poll {:?}",
        run.handoff_watch, run.handoff_poll
    );

    // 5. renewal load
    let n = if name == "k8s" {
        plan.renewal_leases_k8s
    } else {
        plan.renewal_leases
    };
    run.renewal = Some(
        measure::renewal_load(
            &target.renewal_store,
            raw,
            &format!("{ns}-r"),
            n,
            plan.renewal_ttl,
            plan.renewal_intervals,
            name != "k8s",
        )
        .await,
    );
    eprintln!("[{name}] renewal {:?}", run.renewal);
    cleanup(target.cleanup, &ns).await;
    run
}

struct Args {
    plan: Plan,
    out: PathBuf,
    backends: Vec<&'static str>,
    command: String,
}

fn parse_args() -> Result<Args, String> {
    let mut smoke = std::env::var("LEASE_BENCH_SMOKE").is_ok_and(|v| v == "1" || v == "true");
    let mut out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/benchmarks.md");
    let mut backends: Vec<&'static str> = BACKENDS.to_vec();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--smoke" => smoke = true,
            "--out" => out = PathBuf::from(args.next().ok_or("--out needs a path")?),
            "--backends" => {
                let list = args.next().ok_or("--backends needs a list")?;
                backends = BACKENDS
                    .iter()
                    .copied()
                    .filter(|b| list.split(',').any(|x| x.trim() == *b))
                    .collect();
            }
            "-h" | "--help" => {
                println!(
                    "usage: lease-bench [--smoke] [--out PATH] [--backends postgres,redis,etcd,k8s,sqlite]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    let command = std::iter::once("lease-bench".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let mut plan = if smoke { Plan::smoke() } else { Plan::full() };
    if let Some(n) = std::env::var("LEASE_BENCH_RENEWAL_INTERVALS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        plan.renewal_intervals = n;
    }
    Ok(Args {
        plan,
        out,
        backends,
        command,
    })
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("lease-bench: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let started = jiff::Timestamp::now();
    let machine = sys::machine();
    let runs = rt.block_on(async {
        let mut runs = Vec::new();
        for (i, name) in args.backends.iter().enumerate() {
            if i > 0 && !args.plan.smoke {
                // Let the previous backend's server finish the work its phase left behind.
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            runs.push(run_backend(name, args.plan).await);
        }
        runs
    });
    let report = Report {
        runs,
        machine,
        command: args.command,
        started,
        finished: jiff::Timestamp::now(),
        smoke: args.plan.smoke,
        optimized: !cfg!(debug_assertions),
        throughput_for: args.plan.throughput_for,
        throughput_block: args.plan.throughput_block,
    };
    println!("{}", report.summary());
    if let Some(dir) = args.out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(&args.out, report.markdown()) {
        eprintln!("lease-bench: writing {}: {e}", args.out.display());
        std::process::exit(1);
    }
    println!("report written to {}", args.out.display());
    rt.shutdown_timeout(Duration::from_secs(5));
}
