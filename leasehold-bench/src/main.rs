//! # leasehold-bench
//!
//! Measures every reachable backend in one run, interleaved, on six sides: the library's bare
//! store, the supervisor over it, the `leasehold-otel` decorated store, the library's own protocol
//! issued directly (the wrapper overhead), a minimal hand-written lease with a fencing
//! counter (`minimal.rs`, the floor the goals are judged against), and that minimal lease again
//! as a side of its own (the A/A pair, the run's noise); then takeover (also from a holder
//! process killed with SIGKILL: the binary re-executes itself with a hidden `__hold`
//! subcommand), handoff and renewal load, and writes the report to `docs/benchmarks.md`.
//!
//! Throughput runs in five processes of its own, one after the other (the binary re-executes
//! itself with a hidden `__throughput` subcommand, which connects afresh): every round of a
//! process gives each side one block, so each round gives a paired ratio of any two sides, and
//! the report pools those ratios over the processes into a geometric mean with a bootstrap
//! interval (`stats.rs`). A goal on a ratio is met only when its interval clears the goal,
//! missed when the interval falls short of it, and inconclusive otherwise.
//!
//! ```text
//! cargo run --release -p leasehold-bench                 # full run, writes docs/benchmarks.md
//! cargo run -p leasehold-bench -- --smoke --out /tmp/b.md   # every measurement, tiny counts
//! ```
//!
//! Backends come from the environment: `LEASE_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), `LEASE_REDIS_URL` (default
//! `redis://127.0.0.1:6379`), `LEASE_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`),
//! `LEASE_ETCD_ENDPOINTS` (default `http://127.0.0.1:23790`),
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
mod split;
mod stats;
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
const BACKENDS: [&str; 6] = ["postgres", "mysql", "redis", "sqlite", "etcd", "k8s"];

/// How much to measure.
#[derive(Debug, Clone, Copy)]
struct Plan {
    smoke: bool,
    /// The sections to run (all, unless `--sections` names some).
    sections: Sections,
    /// Each throughput process's measuring time (per side: this over the number of sides).
    throughput_for: Duration,
    throughput_block: Duration,
    /// How many processes the throughput section runs in, one after the other.
    repeats: usize,
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
            throughput_for: Duration::from_secs(8),
            throughput_block: Duration::from_millis(200),
            repeats: 5,
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
                split_runs: 5,
                ttl: Duration::from_secs(10),
            },
            shard_plan_k8s: shards::ShardPlan {
                shards: 10_000,
                workers: 10,
                split_runs: 5,
                ttl: Duration::from_secs(60),
            },
        }
    }

    fn smoke() -> Self {
        Plan {
            smoke: true,
            sections: Sections::all(),
            throughput_for: Duration::from_millis(1000),
            throughput_block: Duration::from_millis(50),
            repeats: 2,
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
                split_runs: 2,
                ttl: Duration::from_secs(2),
            },
            shard_plan_k8s: shards::ShardPlan {
                shards: 40,
                workers: 3,
                split_runs: 2,
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
    /// The library's store in another configuration, measured beside the sides in the
    /// throughput table (label, store): etcd's `LeaseSharing::PerTtl`.
    configs: Vec<(&'static str, Arc<dyn LeaseStore>)>,
    /// Kubernetes: the store a shard set of thousands of shards uses there, its grouped mode
    /// (`K8sLeaseStore::grouped`, made per run with the run's namespace as its set).
    kube: Option<leasehold_k8s::K8sLeaseStore>,
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
    Mysql(leasehold_mysql::MysqlLeaseStore),
    Redis(leasehold_redis::RedisLeaseStore),
    Files(Vec<PathBuf>),
    /// The run's Leases, and the group ConfigMaps of the shard section's grouped store (both
    /// named after the run).
    Kube(
        Box<(
            kube::Api<k8s_openapi::api::coordination::v1::Lease>,
            kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
        )>,
    ),
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
                configs: Vec::new(),
                kube: None,
                server: Some(sys::ServerProcs {
                    matches: vec![("postgres", None)],
                }),
                file: None,
                version,
                cleanup: Cleanup::Postgres(pg),
            })
        }
        "mysql" => {
            let url = env_or("LEASE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
            // Lazily, then migrate: a fresh database has no lease table yet.
            let store = leasehold_mysql::MysqlLeaseStore::connect_lazy(
                &url,
                leasehold_mysql::MysqlOptions::default(),
            )
            .map_err(e)?;
            store.migrate().await.map_err(e)?;
            let raw = raw::MysqlRaw::new(&store);
            let version = raw.version().await?;
            let minimal = minimal::MysqlMinimal::new(store.pool().clone()).await?;
            let ablations: Vec<(&'static str, Arc<dyn Raw>)> = vec![
                (
                    "minimal + the clock-floored token",
                    Arc::new(minimal::MysqlMinimal::token_floor(store.pool().clone()).await?),
                ),
                (
                    report::LIBRARY_ACQUIRE,
                    Arc::new(raw::MysqlRaw::with_minimal_release(&store)),
                ),
            ];
            let port = url_addr(&url).rsplit_once(':').map(|(_, p)| p.to_string());
            let daemon = if version.contains("MariaDB") {
                "mariadbd"
            } else {
                "mysqld"
            };
            let my = store.clone();
            let store: Arc<dyn LeaseStore> = Arc::new(store);
            Ok(Target {
                renewal_stores: vec![("default", store.clone())],
                store,
                raw: Arc::new(raw),
                minimal: Arc::new(minimal),
                ablations,
                configs: Vec::new(),
                kube: None,
                // The server of that port.
                server: Some(sys::ServerProcs {
                    matches: vec![(daemon, port)],
                }),
                file: None,
                version,
                cleanup: Cleanup::Mysql(my),
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
                configs: Vec::new(),
                kube: None,
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
            let minimal = minimal::EtcdMinimal::new(store.client());
            let store: Arc<dyn LeaseStore> = Arc::new(store);
            let shared: Arc<dyn LeaseStore> = Arc::new(shared);
            Ok(Target {
                renewal_stores: vec![
                    (
                        "default (named keys: an etcd lease per grant)",
                        store.clone(),
                    ),
                    ("LeaseSharing::PerTtl", shared.clone()),
                ],
                store,
                raw: Arc::new(raw),
                minimal: Arc::new(minimal),
                ablations: Vec::new(),
                configs: vec![("LeaseSharing::PerTtl", shared)],
                kube: None,
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
            let maps = kube::Api::namespaced(client.clone(), &namespace);
            let raw = raw::KubeRaw {
                api: kube::Api::namespaced(client, &namespace),
                store: kube_store.clone(),
            };
            let api = raw.api.clone();
            let minimal = minimal::KubeMinimal::new(api.clone());
            let grouped = kube_store.clone();
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
                configs: Vec::new(),
                kube: Some(grouped),
                // The kube-apiserver and the etcd member scripts/services/k8s.sh starts for it.
                server: Some(sys::ServerProcs {
                    matches: vec![
                        ("kube-apiserver", None),
                        ("etcd", Some("leasehold-k8s".into())),
                    ],
                }),
                file: None,
                version,
                cleanup: Cleanup::Kube(Box::new((api, maps))),
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
                configs: Vec::new(),
                kube: None,
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
        Cleanup::Mysql(store) => {
            let _ = store.delete_prefix(ns).await;
            minimal::MysqlMinimal::floor(store.pool().clone())
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
        Cleanup::Kube(apis) => {
            let (leases, maps) = &*apis;
            delete_named(leases, ns).await;
            delete_named(maps, ns).await;
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

/// Deletes the objects of `api` whose names contain `ns` (up to 10,000 shard Leases: 32 at a
/// time, not one after the other).
async fn delete_named<K>(api: &kube::Api<K>, ns: &str)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    if let Ok(list) = api.list(&kube::api::ListParams::default()).await {
        let names: Vec<String> = list
            .items
            .into_iter()
            .filter_map(|obj| obj.meta().name.clone())
            .filter(|name| name.contains(ns))
            .collect();
        futures::stream::iter(names.iter().map(|name| async move {
            let _ = api.delete(name, &kube::api::DeleteParams::default()).await;
        }))
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    }
}

/// The client counts of the throughput section.
const THROUGHPUT_CLIENTS: [usize; 2] = [1, 8];

/// The sides of [`measure::SIDES`] on `target`, in that order.
fn sides_of(target: &Target, side_ttl: Duration) -> Vec<Side> {
    let store = &target.store;
    let otel: Arc<dyn LeaseStore> =
        Arc::new(leasehold_otel::LeaseMetrics::global().store(store.clone()));
    vec![
        Side::Store(store.clone()),
        Side::Supervisor(Box::new(Supervisor::from_arc(
            store.clone(),
            SupervisorConfig::new(side_ttl),
        ))),
        Side::Store(otel),
        Side::Proto(target.raw.clone()),
        Side::Proto(target.minimal.clone()),
        // The A/A copy: the same minimal lease, as a side of its own (keys of its own).
        Side::Proto(target.minimal.clone()),
    ]
}

/// The sides of the throughput section: `sides` ([`sides_of`]), then the ablations (the
/// minimal lease with one of the library's costs added, so that the report can say where a
/// throughput gap goes), then the library's other configurations.
fn throughput_sides(target: &Target, sides: &[Side]) -> Vec<Side> {
    sides
        .iter()
        .cloned()
        .chain(
            target
                .ablations
                .iter()
                .map(|(_, raw)| Side::Proto(raw.clone())),
        )
        .chain(target.configs.iter().map(|(_, s)| Side::Store(s.clone())))
        .collect()
}

/// How long a throughput process measures `n` sides: [`Plan::throughput_for`] for the sides of
/// [`measure::SIDES`], lengthened so that every further side keeps the same time.
fn throughput_run_for(plan: Plan, n: usize) -> Duration {
    plan.throughput_for * u32::try_from(n).unwrap_or(1)
        / u32::try_from(measure::SIDES.len()).unwrap_or(1)
}

/// The hidden subcommand of a throughput process (`leasehold-bench __throughput BACKEND
/// RUN_FOR_MS BLOCK_MS`).
const THROUGHPUT_COMMAND: &str = "__throughput";

/// One throughput process: connects to `backend` on its own, runs the throughput section
/// (a warm-up, then the measurement, at each client count), prints it in the form
/// [`parse_throughput`] reads, and cleans up.
fn throughput_main(args: &[String]) -> Result<(), String> {
    let [backend, run_for_ms, block_ms] = args else {
        return Err(format!(
            "usage: leasehold-bench {THROUGHPUT_COMMAND} BACKEND RUN_FOR_MS BLOCK_MS"
        ));
    };
    let ms = |v: &str| {
        v.parse()
            .map(Duration::from_millis)
            .map_err(|e| format!("{v}: {e}"))
    };
    let (throughput_for, block) = (ms(run_for_ms)?, ms(block_ms)?);
    let name = BACKENDS
        .iter()
        .find(|b| **b == backend.as_str())
        .ok_or_else(|| format!("unknown backend {backend}"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let target = timeout(Duration::from_secs(20), connect(name))
            .await
            .map_err(|_| "no answer within 20 s".to_string())??;
        let ns = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let side_ttl = legal_ttl(&target.store.capabilities(), Duration::from_secs(10));
        let all = throughput_sides(&target, &sides_of(&target, side_ttl));
        let run_for = throughput_for * u32::try_from(all.len()).unwrap_or(1)
            / u32::try_from(measure::SIDES.len()).unwrap_or(1);
        let mut out = String::new();
        for clients in THROUGHPUT_CLIENTS {
            // Warm-up (connections, prepared statements, script cache), not counted.
            let _warm = measure::throughput_interleaved(
                &all,
                side_ttl,
                &format!("{ns}-{clients}w"),
                clients,
                run_for / 6,
                block,
            )
            .await;
            let t = measure::throughput_interleaved(
                &all,
                side_ttl,
                &format!("{ns}-{clients}m"),
                clients,
                run_for,
                block,
            )
            .await;
            out.push_str(&format_throughput(clients, &t));
        }
        cleanup(target.cleanup, &ns).await;
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|e| e.to_string())
    })
}

/// A throughput process's result as lines: `rate CLIENTS SIDE ok VALUE` or `rate CLIENTS SIDE
/// err MESSAGE`, and `round CLIENTS ROUND V0 V1 ..` (`-` for no figure).
fn format_throughput(clients: usize, t: &measure::Throughput) -> String {
    let mut out = String::new();
    for (i, r) in t.rates.iter().enumerate() {
        match r {
            Ok(x) => out.push_str(&format!("rate {clients} {i} ok {x:e}\n")),
            Err(e) => out.push_str(&format!(
                "rate {clients} {i} err {}\n",
                e.replace(['\n', '\r'], " ")
            )),
        }
    }
    for (r, round) in t.rounds.iter().enumerate() {
        let v: Vec<String> = round
            .iter()
            .map(|x| x.map_or("-".into(), |x| format!("{x:e}")))
            .collect();
        out.push_str(&format!("round {clients} {r} {}\n", v.join(" ")));
    }
    out
}

/// Reads [`format_throughput`]'s lines for `clients` into a result for `n` sides.
fn parse_throughput(text: &str, clients: usize, n: usize) -> Result<measure::Throughput, String> {
    let mut t = measure::Throughput {
        rates: vec![Err("not reported".into()); n],
        rounds: Vec::new(),
    };
    let c = clients.to_string();
    for line in text.lines() {
        let mut w = line.splitn(5, ' ');
        match (w.next(), w.next()) {
            (Some("rate"), Some(x)) if x == c => {
                let i: usize = w.next().and_then(|i| i.parse().ok()).ok_or(line)?;
                let slot = t.rates.get_mut(i).ok_or(line)?;
                *slot = match (w.next(), w.next()) {
                    (Some("ok"), Some(v)) => Ok(v.parse().map_err(|_| line.to_string())?),
                    (Some("err"), Some(e)) => Err(e.to_string()),
                    _ => return Err(format!("unreadable line {line:?}")),
                };
            }
            (Some("round"), Some(x)) if x == c => {
                let _round = w.next();
                let rest = [w.next(), w.next()]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(" ");
                let v: Vec<Option<f64>> = rest
                    .split(' ')
                    .map(|x| {
                        if x == "-" {
                            Ok(None)
                        } else {
                            x.parse().map(Some)
                        }
                    })
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("unreadable line {line:?}"))?;
                if v.len() != n {
                    return Err(format!("{} sides in {line:?}, expected {n}", v.len()));
                }
                t.rounds.push(v);
            }
            _ => {}
        }
    }
    Ok(t)
}

/// Runs one throughput process for `name` and reads its result per client count.
async fn throughput_child(
    name: &str,
    plan: Plan,
    n: usize,
) -> Result<Vec<(usize, measure::Throughput)>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("no executable: {e}"))?;
    let mut child = tokio::process::Command::new(exe);
    child
        .arg(THROUGHPUT_COMMAND)
        .arg(name)
        .arg(plan.throughput_for.as_millis().to_string())
        .arg(plan.throughput_block.as_millis().to_string())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    // Two client counts, each a sixth longer for its warm-up, plus connecting and cleaning up.
    let bound = throughput_run_for(plan, n) * 3 + Duration::from_secs(120);
    let out = timeout(bound, child.output())
        .await
        .map_err(|_| format!("the throughput process did not finish within {bound:?}"))?
        .map_err(|e| format!("starting the throughput process: {e}"))?;
    if !out.status.success() {
        return Err(format!("the throughput process failed: {}", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    THROUGHPUT_CLIENTS
        .iter()
        .map(|&c| parse_throughput(&text, c, n).map(|t| (c, t)))
        .collect()
}

/// One throughput row pooled over the processes: each side's mean rate (an error if any process
/// failed it) and every process's rounds.
#[allow(clippy::type_complexity)]
fn pool_processes(
    processes: &[Result<Vec<(usize, measure::Throughput)>, String>],
    clients: usize,
    n: usize,
) -> (Vec<Result<f64, String>>, Vec<Vec<Vec<Option<f64>>>>) {
    let mut sums: Vec<Result<(f64, u32), String>> = vec![Ok((0.0, 0)); n];
    let mut rounds = Vec::new();
    for p in processes {
        let t = match p {
            Ok(rows) => rows.iter().find(|(c, _)| *c == clients).map(|(_, t)| t),
            Err(e) => {
                sums.iter_mut().for_each(|s| *s = Err(e.clone()));
                continue;
            }
        };
        let Some(t) = t else { continue };
        for (sum, rate) in sums.iter_mut().zip(&t.rates) {
            *sum = match (&*sum, rate) {
                (Ok((a, k)), Ok(x)) => Ok((a + x, k + 1)),
                (Err(e), _) | (_, Err(e)) => Err(e.clone()),
            };
        }
        rounds.push(t.rounds.clone());
    }
    let rates = sums
        .into_iter()
        .map(|s| match s {
            Ok((_, 0)) => Err("not measured".into()),
            Ok((sum, k)) => Ok(sum / f64::from(k)),
            Err(e) => Err(e),
        })
        .collect();
    (rates, rounds)
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

    let side_ttl = legal_ttl(&caps, Duration::from_secs(10));
    let sides = sides_of(&target, side_ttl);

    // 1. throughput, in processes of its own (this binary, re-executed), one after the other.
    if plan.sections.has("throughput") {
        let n = throughput_sides(&target, &sides).len();
        let labels: Vec<&'static str> = measure::SIDES
            .iter()
            .copied()
            .chain(target.ablations.iter().map(|(l, _)| *l))
            .chain(target.configs.iter().map(|(l, _)| *l))
            .collect();
        let mut processes = Vec::new();
        for rep in 0..plan.repeats {
            let p = throughput_child(name, plan, n).await;
            if let Err(e) = &p {
                eprintln!("[{name}] throughput process {rep}: {e}");
            }
            processes.push(p);
        }
        for clients in THROUGHPUT_CLIENTS {
            let row = pool_processes(&processes, clients, n);
            for (side, rate) in labels.iter().zip(&row.0) {
                eprintln!("[{name}] throughput {clients} clients, {side}: {rate:?}");
            }
            run.throughput.push(ThroughputRow {
                clients,
                rates: row.0,
                rounds: row.1,
                ablations: target.ablations.iter().map(|(l, _)| *l).collect(),
                configs: target.configs.iter().map(|(l, _)| *l).collect(),
            });
        }
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
            // The A/A copy is the minimal side again: its CPU is the minimal's.
            .filter(|(label, _)| *label != measure::SIDES[measure::AA])
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

/// Section 6 on `target`: the shard run, on the library's default store (on etcd the default
/// puts a shard set's reserved keys on one etcd lease per store and TTL), on Kubernetes on its
/// grouped mode.
async fn shard_section(run: &mut BackendRun, target: &Target, ns: &str, plan: Plan, name: &str) {
    if !plan.sections.has("shards") {
        return;
    }
    let shard_plan = if name == "k8s" {
        plan.shard_plan_k8s
    } else {
        plan.shard_plan
    };
    // Kubernetes: the grouped mode, whose renewal costs requests per worker, not per shard (one
    // Lease per shard would cost 10,000 requests per interval).
    let store = match &target.kube {
        Some(kube) => match kube.grouped(ns, leasehold_k8s::DEFAULT_GROUPS) {
            Ok(g) => {
                run.shards_config = Some("grouped, 16 groups");
                Arc::new(g) as Arc<dyn LeaseStore>
            }
            Err(e) => {
                run.shards = Some(Err(e.to_string()));
                return;
            }
        },
        None => {
            run.shards_config = None;
            target.store.clone()
        }
    };
    // Each split run's sides on a group set of their own on Kubernetes: a group object keeps an
    // entry for every key ever granted in it, so sets sharing one group set would make every
    // later run write objects holding all the earlier runs' entries.
    let fresh: Option<split::FreshStore> = target.kube.clone().map(|kube| {
        Arc::new(move |set: &str| {
            kube.grouped(set, leasehold_k8s::DEFAULT_GROUPS)
                .map(|g| Arc::new(g) as Arc<dyn LeaseStore>)
                .map_err(|e| e.to_string())
        }) as split::FreshStore
    });
    let r = shards::shard_run(fresh.as_ref(), &store, Some(&target.raw), ns, shard_plan).await;
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
                    "usage: leasehold-bench [--smoke] [--out PATH] [--backends postgres,mysql,redis,etcd,k8s,sqlite] [--sections {}]",
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
    if argv.get(1).map(String::as_str) == Some(THROUGHPUT_COMMAND) {
        if let Err(e) = throughput_main(&argv[2..]) {
            eprintln!("leasehold-bench {THROUGHPUT_COMMAND}: {e}");
            std::process::exit(1);
        }
        return;
    }
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
        repeats: args.plan.repeats,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A throughput process's lines read back as written, per client count; a failed side keeps
    /// its message; a process that failed fails every side of the pooled row.
    #[test]
    fn throughput_processes_are_read_back_and_pooled() {
        let one = measure::Throughput {
            rates: vec![Ok(100.5), Err("boom\nagain".into()), Ok(3.0)],
            rounds: vec![
                vec![Some(1.5), None, Some(2.25)],
                vec![Some(1e6), Some(0.0), None],
            ],
        };
        let text = format_throughput(1, &one)
            + &format_throughput(
                8,
                &measure::Throughput {
                    rates: vec![Ok(1.0); 3],
                    rounds: vec![vec![Some(9.0); 3]],
                },
            );
        let back = parse_throughput(&text, 1, 3).expect("readable");
        assert_eq!(back.rates[0], Ok(100.5));
        assert_eq!(back.rates[1], Err("boom again".into()));
        assert_eq!(back.rounds, one.rounds);
        assert_eq!(
            parse_throughput(&text, 8, 3).expect("readable").rounds,
            vec![vec![Some(9.0); 3]]
        );
        assert!(
            parse_throughput(&text, 1, 4).is_err(),
            "a round of 3 sides for 4"
        );

        let ok = |r: f64| {
            Ok(vec![(
                1,
                measure::Throughput {
                    rates: vec![Ok(r); 2],
                    rounds: vec![vec![Some(r); 2]],
                },
            )])
        };
        let (rates, rounds) = pool_processes(&[ok(10.0), ok(20.0)], 1, 2);
        assert_eq!(rates, vec![Ok(15.0), Ok(15.0)]);
        assert_eq!(rounds.len(), 2, "one group of rounds per process");
        let (rates, _) = pool_processes(&[ok(10.0), Err("killed".into())], 1, 2);
        assert_eq!(rates, vec![Err("killed".into()), Err("killed".into())]);
    }
}
