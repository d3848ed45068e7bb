//! # leasehold-bench
//!
//! Measures every reachable backend in one run, interleaved, on five sides: the library's bare
//! store, the supervisor over it, the `leasehold-otel` decorated store, the library's own protocol
//! issued directly (the wrapper overhead), and a minimal hand-written lease with a fencing
//! counter (`minimal.rs`, the floor the goals are judged against); then takeover (also from a
//! holder process killed with SIGKILL: the binary re-executes itself with a hidden `__hold`
//! subcommand), handoff and renewal load, and writes the report to `docs/benchmarks.md`.
//!
//! ```text
//! cargo run --release -p leasehold-bench                 # full run, writes docs/benchmarks.md
//! cargo run -p leasehold-bench -- --smoke --out /tmp/b.md   # every measurement, tiny counts
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
mod minimal;
mod raw;
mod report;
mod shards;
mod sys;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::LeaseStore;
use tokio::time::timeout;

use crate::measure::legal_ttl;
use leasehold_core::supervisor::{Supervisor, SupervisorConfig};

use crate::measure::Side;
use crate::raw::Raw;
use crate::report::{BackendRun, Report, ThroughputRow};

/// Every backend, in run and report order: the in-process SQLite before etcd and Kubernetes,
/// whose servers keep working for a while after their phase (expiring and deleting the renewal
/// load's 10,000 keys, tearing down watches) on the same two cores.
const BACKENDS: [&str; 5] = ["postgres", "redis", "sqlite", "etcd", "k8s"];

/// How much to measure.
#[derive(Debug, Clone, Copy)]
struct Plan {
    smoke: bool,
    /// The sections to run (all, unless `--sections` names some).
    sections: Sections,
    throughput_for: Duration,
    throughput_block: Duration,
    latency_samples: usize,
    rtt_samples: usize,
    /// CPU per pair: each side's block and the number of rounds over the sides.
    cpu_block: Duration,
    cpu_rounds: usize,
    takeover_reps: usize,
    handoff_reps: usize,
    renewal_leases: usize,
    renewal_leases_k8s: usize,
    renewal_ttl: Duration,
    renewal_intervals: u32,
    shard_plan: shards::ShardPlan,
    shard_plan_k8s: shards::ShardPlan,
}

/// Which of the report's measured sections a run makes (`--sections`): a partial run is for
/// working on one thing, and must write its report somewhere other than `docs/benchmarks.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sections(u8);

impl Sections {
    const NAMES: [&'static str; 7] = [
        "throughput",
        "cpu",
        "latency",
        "takeover",
        "handoff",
        "renewal",
        "shards",
    ];

    fn all() -> Self {
        Sections((1 << Self::NAMES.len()) - 1)
    }

    fn parse(list: &str) -> Result<Self, String> {
        let mut bits = 0u8;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let i = Self::NAMES.iter().position(|n| *n == name).ok_or_else(|| {
                format!(
                    "unknown section {name:?} (one of {})",
                    Self::NAMES.join(",")
                )
            })?;
            bits |= 1 << i;
        }
        if bits == 0 {
            return Err("--sections names no section".into());
        }
        Ok(Sections(bits))
    }

    fn has(self, name: &str) -> bool {
        Self::NAMES
            .iter()
            .position(|n| *n == name)
            .is_some_and(|i| self.0 & (1 << i) != 0)
    }

    fn list(self) -> String {
        Self::NAMES
            .iter()
            .filter(|n| self.has(n))
            .copied()
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Plan {
    fn full() -> Self {
        Plan {
            smoke: false,
            sections: Sections::all(),
            throughput_for: Duration::from_secs(16),
            throughput_block: Duration::from_millis(200),
            cpu_block: Duration::from_millis(1000),
            cpu_rounds: 11,
            latency_samples: 8000,
            rtt_samples: 50,
            takeover_reps: 9,
            handoff_reps: 20,
            renewal_leases: 10_000,
            renewal_leases_k8s: 10_000,
            renewal_ttl: Duration::from_secs(30),
            renewal_intervals: 3,
            shard_plan: shards::ShardPlan {
                shards: 10_000,
                workers: 10,
                ttl: Duration::from_secs(10),
            },
            shard_plan_k8s: shards::ShardPlan {
                shards: 10_000,
                workers: 10,
                ttl: Duration::from_secs(60),
            },
        }
    }

    fn smoke() -> Self {
        Plan {
            smoke: true,
            sections: Sections::all(),
            throughput_for: Duration::from_millis(1500),
            throughput_block: Duration::from_millis(50),
            cpu_block: Duration::from_millis(50),
            cpu_rounds: 1,
            latency_samples: 10,
            rtt_samples: 5,
            takeover_reps: 1,
            handoff_reps: 1,
            renewal_leases: 40,
            renewal_leases_k8s: 10,
            renewal_ttl: Duration::from_millis(1500),
            renewal_intervals: 1,
            shard_plan: shards::ShardPlan {
                shards: 40,
                workers: 3,
                ttl: Duration::from_secs(2),
            },
            shard_plan_k8s: shards::ShardPlan {
                shards: 40,
                workers: 3,
                ttl: Duration::from_secs(2),
            },
        }
    }
}

/// A connected backend: the library store, its own protocol issued directly, the minimal
/// hand-written lease, and the stores for the renewal load (each with its configuration's name).
struct Target {
    store: Arc<dyn LeaseStore>,
    raw: Arc<dyn Raw>,
    minimal: Arc<dyn Raw>,
    /// The minimal lease with one of the library's guarantees added, to price it in the CPU
    /// table (label, side).
    ablations: Vec<(&'static str, Arc<dyn Raw>)>,
    /// The server's processes on this machine, for its CPU per pair (`None`: in process).
    server: Option<sys::ServerProcs>,
    renewal_stores: Vec<(&'static str, Arc<dyn LeaseStore>)>,
    /// SQLite: the library's file, which a holder process must open too.
    file: Option<PathBuf>,
    version: String,
    cleanup: Cleanup,
}

enum Cleanup {
    None,
    Postgres(leasehold_postgres::PostgresLeaseStore),
    Redis(leasehold_redis::RedisLeaseStore),
    Files(Vec<PathBuf>),
    Kube(Box<kube::Api<k8s_openapi::api::coordination::v1::Lease>>),
}

/// The `host:port` of a URL (`redis://user@127.0.0.1:6379/0` gives `127.0.0.1:6379`).
fn url_addr(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest).to_string()
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

async fn connect(name: &str) -> Result<Target, String> {
    let e = |e: leasehold_core::Error| e.to_string();
    match name {
        "postgres" => {
            let url = env_or(
                "LEASE_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            );
            // Lazily, then migrate: a fresh database has no lease table yet.
            let store = leasehold_postgres::PostgresLeaseStore::connect_lazy(
                &url,
                leasehold_postgres::PostgresOptions::default(),
            )
            .map_err(e)?;
            store.migrate().await.map_err(e)?;
            let raw = raw::PgRaw::new(&store);
            let version = raw.version().await?;
            let minimal = minimal::PgMinimal::new(store.pool().clone()).await?;
            let mut ablations: Vec<(&'static str, Arc<dyn Raw>)> = Vec::new();
            for (label, ablation) in [
                (
                    "minimal on the library's table layout",
                    minimal::PgAblation::LibraryLayout,
                ),
                (
                    "minimal + update trigger (its WHEN false)",
                    minimal::PgAblation::UpdateTrigger,
                ),
                (
                    "minimal + the clock-floored token",
                    minimal::PgAblation::TokenFloor,
                ),
            ] {
                let side = minimal::PgMinimal::with(store.pool().clone(), ablation).await?;
                ablations.push((label, Arc::new(side)));
            }
            ablations.push((
                report::LIBRARY_ACQUIRE,
                Arc::new(raw::PgRaw::with_minimal_release(&store)),
            ));
            let pg = store.clone();
            let store: Arc<dyn LeaseStore> = Arc::new(store);
            Ok(Target {
                renewal_stores: vec![("default", store.clone())],
                store,
                raw: Arc::new(raw),
                minimal: Arc::new(minimal),
                ablations,
                server: Some(sys::ServerProcs {
                    matches: vec![("postgres", None)],
                }),
                file: None,
                version,
                cleanup: Cleanup::Postgres(pg),
            })
        }
        "redis" => {
            let url = env_or("LEASE_REDIS_URL", "redis://127.0.0.1:6379");
            let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
            let options = leasehold_redis::RedisOptions::default()
                .with_prefix("bench")
                .with_connect_timeout(Duration::from_secs(3));
            let store = leasehold_redis::RedisLeaseStore::connect_with(&url, options)
                .await
                .map_err(e)?;
            let raw = raw::RedisRaw::new(&store, client.clone());
            let version = raw.version().await?;
            let minimal = minimal::RedisMinimal::new(store.connection());
            let con = store.connection();
            let shared: Arc<dyn LeaseStore> = Arc::new(store.clone());
            Ok(Target {
                renewal_stores: vec![("default", shared.clone())],
                store: shared,
                raw: Arc::new(raw),
                minimal: Arc::new(minimal),
                ablations: vec![
                    (
                        "minimal + server clock (TIME)",
                        Arc::new(minimal::RedisMinimal::with(
                            con.clone(),
                            minimal::RedisAblation::ServerClock,
                        )),
                    ),
                    (
                        "minimal + the clock-floored token",
                        Arc::new(minimal::RedisMinimal::with(
                            con.clone(),
                            minimal::RedisAblation::TokenFloor,
                        )),
                    ),
                    (
                        "minimal + release notification (PUBLISH)",
                        Arc::new(minimal::RedisMinimal::with(
                            con,
                            minimal::RedisAblation::ReleaseNotification,
                        )),
                    ),
                    (
                        report::LIBRARY_ACQUIRE,
                        Arc::new(raw::RedisRaw::with_minimal_release(&store, client)),
                    ),
                ],
                server: Some(sys::ServerProcs {
                    matches: vec![("redis-server", Some(url_addr(&url)))],
                }),
                file: None,
                version,
                cleanup: Cleanup::Redis(store),
            })
        }
        "etcd" => {
            let endpoints = env_or("LEASE_ETCD_ENDPOINTS", "http://127.0.0.1:23790");
            let url = format!(
                "etcd://{}",
                endpoints
                    .split(',')
                    .map(|e| e.trim().trim_start_matches("http://").trim_end_matches('/'))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let config =
                leasehold_etcd::EtcdOptions::default().with_connect_timeout(Duration::from_secs(3));
            let store = leasehold_etcd::EtcdLeaseStore::connect_with(&url, config.clone())
                .await
                .map_err(e)?;
            let shared = leasehold_etcd::EtcdLeaseStore::connect_with(
                &url,
                config
                    .clone()
                    .with_lease_sharing(leasehold_etcd::LeaseSharing::PerTtl),
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
            let minimal = minimal::EtcdMinimal(store.client());
            let store: Arc<dyn LeaseStore> = Arc::new(store);
            Ok(Target {
                renewal_stores: vec![
                    ("default (LeaseSharing::PerGrant)", store.clone()),
                    ("LeaseSharing::PerTtl", Arc::new(shared)),
                ],
                store,
                raw: Arc::new(raw),
                minimal: Arc::new(minimal),
                ablations: Vec::new(),
                server: Some(sys::ServerProcs {
                    matches: endpoints
                        .split(',')
                        .map(|e| ("etcd", Some(url_addr(e.trim()))))
                        .collect(),
                }),
                file: None,
                version,
                cleanup: Cleanup::None,
            })
        }
        "k8s" => {
            if std::env::var_os("KUBECONFIG").is_none() {
                return Err("KUBECONFIG is not set".into());
            }
            let namespace = env_or("LEASE_K8S_NAMESPACE", "default");
            let client = leasehold_k8s::infer_client().await.map_err(e)?;
            let version = client
                .apiserver_version()
                .await
                .map(|v| format!("kube-apiserver {}", v.git_version))
                .map_err(|e| e.to_string())?;
            let kube_store = leasehold_k8s::K8sLeaseStore::from_client(
                client.clone(),
                leasehold_k8s::K8sOptions::default().with_namespace(namespace.clone()),
            )
            .map_err(e)?;
            let raw = raw::KubeRaw {
                api: kube::Api::namespaced(client, &namespace),
                store: kube_store.clone(),
            };
            let api = raw.api.clone();
            let minimal = minimal::KubeMinimal::new(api.clone());
            let store: Arc<dyn LeaseStore> = Arc::new(kube_store);
            Ok(Target {
                renewal_stores: vec![("default", store.clone())],
                store,
                raw: Arc::new(raw),
                minimal: Arc::new(minimal),
                ablations: vec![(
                    "minimal + the token annotations",
                    Arc::new(minimal::KubeMinimal::annotated(api.clone())),
                )],
                // The kube-apiserver and the etcd member scripts/services/k8s.sh starts for it.
                server: Some(sys::ServerProcs {
                    matches: vec![
                        ("kube-apiserver", None),
                        ("etcd", Some("leasehold-k8s".into())),
                    ],
                }),
                file: None,
                version,
                cleanup: Cleanup::Kube(Box::new(api)),
            })
        }
        "sqlite" => {
            let path = std::env::temp_dir().join(format!(
                "leasehold-bench-{}-{}.db",
                std::process::id(),
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ));
            let store = leasehold_sqlite::SqliteLeaseStore::open(&path)
                .await
                .map_err(e)?;
            // The raw side writes its own file with the same settings: on one shared file the
            // WAL's automatic checkpoints (one every 1,000 pages, run by whichever commit
            // crosses the mark) fell, in step with the alternation, on one side's acquires
            // more than on the other's, and decided its p99. Each side now pays for its own.
            let raw_path = path.with_extension("raw.db");
            // Opening a store creates the schema the raw side writes to.
            drop(
                leasehold_sqlite::SqliteLeaseStore::open(&raw_path)
                    .await
                    .map_err(e)?,
            );
            let raw = raw::SqliteRaw::open(&raw_path).await?;
            let version = raw.version().await?;
            let min_path = path.with_extension("minimal.db");
            let minimal = minimal::SqliteMinimal::open(&min_path).await?;
            let store: Arc<dyn LeaseStore> = Arc::new(store);
            Ok(Target {
                renewal_stores: vec![("default", store.clone())],
                store,
                raw: Arc::new(raw),
                minimal: Arc::new(minimal),
                ablations: Vec::new(),
                server: None,
                file: Some(path.clone()),
                version,
                cleanup: Cleanup::Files(vec![path, raw_path, min_path]),
            })
        }
        other => Err(format!("unknown backend {other}")),
    }
}

async fn cleanup(c: Cleanup, ns: &str) {
    match c {
        Cleanup::None => {}
        Cleanup::Postgres(store) => {
            // The library's rows (lease and fence tables) through its own helper, the minimal
            // baseline's table by hand.
            let _ = store.delete_prefix(ns).await;
            minimal::PgMinimal::floor(store.pool().clone())
                .cleanup(ns)
                .await;
        }
        Cleanup::Redis(store) => {
            minimal::RedisMinimal::new(store.connection())
                .cleanup(ns)
                .await;
            minimal::redis_delete_matching(store.connection(), &store.layout().scan_pattern(ns))
                .await;
        }
        Cleanup::Kube(api) => {
            if let Ok(list) = api.list(&kube::api::ListParams::default()).await {
                // Up to 10,000 shard leases: deleted 32 at a time, not one after the other.
                let names: Vec<String> = list
                    .items
                    .into_iter()
                    .filter_map(|obj| obj.metadata.name)
                    .filter(|name| name.contains(ns))
                    .collect();
                let api = &*api;
                futures::stream::iter(names.iter().map(|name| async move {
                    let _ = api.delete(name, &kube::api::DeleteParams::default()).await;
                }))
                .buffer_unordered(32)
                .collect::<Vec<_>>()
                .await;
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
    let raw = Some(&target.raw);
    run.rtt_what = target.raw.ping_name();
    run.rtt_ms = measure::rtt(raw, &store, &ns, plan.rtt_samples).await;
    eprintln!("[{name}] {} rtt {:?}", run.version, run.rtt_ms);

    // The sides of measure::SIDES, in that order.
    let side_ttl = legal_ttl(&caps, Duration::from_secs(10));
    let otel: Arc<dyn LeaseStore> =
        Arc::new(leasehold_otel::LeaseMetrics::global().store(store.clone()));
    let sides = [
        Side::Store(store.clone()),
        Side::Supervisor(Box::new(Supervisor::from_arc(
            store.clone(),
            SupervisorConfig::new(side_ttl),
        ))),
        Side::Store(otel),
        Side::Proto(target.raw.clone()),
        Side::Proto(target.minimal.clone()),
    ];

    // 1. throughput
    let throughput_clients: &[usize] = if plan.sections.has("throughput") {
        &[1, 8]
    } else {
        &[]
    };
    // The ablations (the minimal lease with one of the library's costs added) run with the
    // sides, interleaved, so that the report can say where a throughput gap goes; the run is
    // lengthened so that every side keeps the same time.
    let ablation_labels: Vec<&'static str> = target.ablations.iter().map(|(l, _)| *l).collect();
    let throughput_sides: Vec<Side> = sides
        .iter()
        .cloned()
        .chain(
            target
                .ablations
                .iter()
                .map(|(_, raw)| Side::Proto(raw.clone())),
        )
        .collect();
    let run_for = plan.throughput_for * u32::try_from(throughput_sides.len()).unwrap_or(1)
        / u32::try_from(sides.len()).unwrap_or(1);
    for &clients in throughput_clients {
        // Warm-up (connections, prepared statements, script cache), not counted.
        let _warm = measure::throughput_interleaved(
            &throughput_sides,
            side_ttl,
            &format!("{ns}-{clients}w"),
            clients,
            run_for / 6,
            plan.throughput_block,
        )
        .await;
        let rates = measure::throughput_interleaved(
            &throughput_sides,
            side_ttl,
            &format!("{ns}-{clients}m"),
            clients,
            run_for,
            plan.throughput_block,
        )
        .await;
        let labels = measure::SIDES.iter().chain(&ablation_labels);
        for (side, (rate, _)) in labels.zip(&rates) {
            eprintln!("[{name}] throughput {clients} clients, {side}: {rate:?}");
        }
        run.throughput.push(ThroughputRow {
            clients,
            rates,
            ablations: ablation_labels.clone(),
        });
    }

    // 2. latency: every side in turn, one sample each (in the order measure::round_order gives
    // each round), so that a burst of load on the machine hits all alike.
    let owner = leasehold_core::OwnerId::random();
    let mut lat: Vec<Result<Vec<Duration>, String>> = vec![Ok(Vec::new()); sides.len()];
    let latency_samples = if plan.sections.has("latency") {
        plan.latency_samples
    } else {
        0
    };
    for round in 0..latency_samples {
        measure::latency_round(
            &sides,
            side_ttl,
            &format!("{ns}-l"),
            &owner,
            round,
            &mut lat,
        )
        .await;
    }
    run.latency = lat;
    eprintln!("[{name}] latency done");

    // 1b. CPU per pair, on the client and the server: the sides above and the ablations that
    // price the library's guarantees one by one.
    if plan.sections.has("cpu") {
        let mut cpu_sides: Vec<(&'static str, Side)> = measure::SIDES
            .iter()
            .copied()
            .zip(sides.iter().cloned())
            .collect();
        for (label, raw) in &target.ablations {
            cpu_sides.push((label, Side::Proto(raw.clone())));
        }
        let (labels, only): (Vec<_>, Vec<_>) = cpu_sides.into_iter().unzip();
        let costs = measure::cpu_per_pair(
            &only,
            target.server.as_ref(),
            side_ttl,
            &format!("{ns}-cpu"),
            plan.cpu_block,
            plan.cpu_rounds,
        )
        .await;
        run.cpu_server = target.server.as_ref().map(sys::ServerProcs::describe);
        run.cpu = labels.into_iter().zip(costs).collect();
        eprintln!("[{name}] cpu per pair: {:?}", run.cpu);
    }

    // 3. takeover
    let ttl = legal_ttl(&caps, Duration::from_secs(1));
    run.takeover_ttl = ttl;
    let takeover_reps = if plan.sections.has("takeover") {
        plan.takeover_reps
    } else {
        0
    };
    for rep in 0..takeover_reps {
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
    // 3b. takeover from a SIGKILLed holder process (this binary, re-executed).
    match std::env::current_exe() {
        Ok(exe) => {
            for rep in 0..takeover_reps {
                let mut holder = tokio::process::Command::new(&exe);
                holder.arg(HOLD_COMMAND).arg(name);
                if let Some(file) = &target.file {
                    holder.env(HOLD_SQLITE_FILE, file);
                }
                run.takeover_killed
                    .push(measure::takeover_killed(&store, &ns, rep, ttl, holder).await);
            }
        }
        Err(e) => run.takeover_killed.push(Err(format!("no executable: {e}"))),
    }
    eprintln!(
        "[{name}] takeover watch {:?} poll {:?} killed process {:?} store expiry delay {:?}",
        run.takeover_watch, run.takeover_poll, run.takeover_killed, run.expiry_floor
    );

    // 4. handoff
    let r = &target.raw;
    let handoff_reps = if plan.sections.has("handoff") {
        run.handoff_floor =
            Some(measure::handoff_floor(r, &caps, &ns, "hf", plan.handoff_reps * 4).await);
        run.handoff_floor_minimal = Some(
            measure::handoff_floor(&target.minimal, &caps, &ns, "hfm", plan.handoff_reps * 4).await,
        );
        run.handoff_notified =
            Some(measure::handoff_notified(r, &caps, &ns, plan.handoff_reps * 2).await);
        plan.handoff_reps
    } else {
        0
    };
    for rep in 0..handoff_reps {
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

    // 6. shard ownership at scale (leasehold-shard): after the renewal load, whose releases land
    // (and PostgreSQL's delayed statistics flush) long before the shard run counts the
    // server's requests; on Kubernetes before it, since a shard scan is a paged LIST of the
    // namespace, which the renewal load's 10,000 Leases (kept until the cleanup) would make
    // twice as long (the apiserver counts requests at once, and the shard run waits for its
    // own releases before it returns).
    let shards_first = name == "k8s";
    if shards_first {
        shard_section(&mut run, &target, &ns, plan, name).await;
    }
    // 5. renewal load, in every configuration the backend has (the default first).
    let n = if name == "k8s" {
        plan.renewal_leases_k8s
    } else {
        plan.renewal_leases
    };
    let renewal_stores: &[_] = if plan.sections.has("renewal") {
        &target.renewal_stores
    } else {
        &[]
    };
    for (i, (config, renewal_store)) in renewal_stores.iter().enumerate() {
        let load = measure::renewal_load(
            renewal_store,
            raw,
            &format!("{ns}-r{i}"),
            n,
            plan.renewal_ttl,
            plan.renewal_intervals,
            name != "k8s",
        )
        .await;
        eprintln!("[{name}] renewal ({config}) {load:?}");
        run.renewal.push((config, load));
    }
    if !shards_first {
        shard_section(&mut run, &target, &ns, plan, name).await;
    }
    cleanup(target.cleanup, &ns).await;
    run
}

/// Section 6 on `target`: the shard run, on etcd with `LeaseSharing::PerTtl`.
async fn shard_section(run: &mut BackendRun, target: &Target, ns: &str, plan: Plan, name: &str) {
    if !plan.sections.has("shards") {
        return;
    }
    let shard_plan = if name == "k8s" {
        plan.shard_plan_k8s
    } else {
        plan.shard_plan
    };
    // etcd: 10,000 shards with one etcd lease (and keepalive) each would measure the
    // default's keepalive load, already in table 5; a fleet holding thousands of leases
    // shares etcd leases per TTL (leasehold-etcd's docs say so), and the row says which.
    let (shard_store, config) = match target
        .renewal_stores
        .iter()
        .find(|(config, _)| config.contains("PerTtl"))
    {
        Some((config, s)) => (s.clone(), Some(*config)),
        None => (target.store.clone(), None),
    };
    run.shards_config = config;
    let r = shards::shard_run(&shard_store, Some(&target.raw), ns, shard_plan).await;
    eprintln!("[{name}] shards {r:?}");
    run.shards = Some(r);
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
    let mut sections = Sections::all();
    let mut out_given = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--smoke" => smoke = true,
            "--out" => {
                out = PathBuf::from(args.next().ok_or("--out needs a path")?);
                out_given = true;
            }
            "--backends" => {
                let list = args.next().ok_or("--backends needs a list")?;
                backends = BACKENDS
                    .iter()
                    .copied()
                    .filter(|b| list.split(',').any(|x| x.trim() == *b))
                    .collect();
            }
            "--sections" => {
                sections = Sections::parse(&args.next().ok_or("--sections needs a list")?)?;
            }
            "-h" | "--help" => {
                println!(
                    "usage: leasehold-bench [--smoke] [--out PATH] [--backends postgres,redis,etcd,k8s,sqlite] [--sections {}]",
                    Sections::NAMES.join(",")
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    let command = std::iter::once("leasehold-bench".to_string())
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
    if sections != Sections::all() && !out_given {
        return Err(format!(
            "a run of some sections ({}) must not overwrite {}: give --out PATH",
            sections.list(),
            out.display()
        ));
    }
    plan.sections = sections;
    Ok(Args {
        plan,
        out,
        backends,
        command,
    })
}

/// The hidden subcommand of the holder process (`leasehold-bench __hold BACKEND KEY TTL_MS`).
const HOLD_COMMAND: &str = "__hold";
/// The SQLite file a holder process opens (the parent's library file).
const HOLD_SQLITE_FILE: &str = "LEASE_BENCH_HOLD_SQLITE_FILE";

/// The holder process: connects to `backend` on its own, holds the key, waits to be killed.
fn hold_main(args: &[String]) -> Result<(), String> {
    let [backend, key, ttl_ms] = args else {
        return Err(format!(
            "usage: leasehold-bench {HOLD_COMMAND} BACKEND KEY TTL_MS"
        ));
    };
    let ttl = Duration::from_millis(ttl_ms.parse().map_err(|e| format!("TTL_MS: {e}"))?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let store: Arc<dyn LeaseStore> = match std::env::var_os(HOLD_SQLITE_FILE) {
            Some(file) if backend == "sqlite" => Arc::new(
                leasehold_sqlite::SqliteLeaseStore::open(PathBuf::from(file))
                    .await
                    .map_err(|e| e.to_string())?,
            ),
            _ => {
                let name = BACKENDS
                    .iter()
                    .find(|b| **b == backend.as_str())
                    .ok_or_else(|| format!("unknown backend {backend}"))?;
                connect(name).await?.store
            }
        };
        measure::hold_until_killed(&store, key, ttl).await
    })
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(HOLD_COMMAND) {
        if let Err(e) = hold_main(&argv[2..]) {
            eprintln!("leasehold-bench {HOLD_COMMAND}: {e}");
            std::process::exit(1);
        }
        return;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("leasehold-bench: {e}");
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
        cpu_block: args.plan.cpu_block,
        cpu_rounds: args.plan.cpu_rounds,
    };
    println!("{}", report.summary());
    if let Some(dir) = args.out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(&args.out, report.markdown()) {
        eprintln!("leasehold-bench: writing {}: {e}", args.out.display());
        std::process::exit(1);
    }
    println!("report written to {}", args.out.display());
    rt.shutdown_timeout(Duration::from_secs(5));
}
