//! 64 shards over 4 worker processes: each process is a `ShardSet` worker; the parent prints the
//! assignment table over time, kills one worker (SIGKILL: no release, its leases expire), adds a
//! fifth, and prints the table again after each change.
//!
//! ```text
//! cargo run -p leasehold-examples --bin shards                      # a temporary SQLite file
//! cargo run -p leasehold-examples --features redis --bin shards -- --store redis://127.0.0.1:6379
//! cargo run -p leasehold-examples --bin shards -- --shards 16 --workers 3 --ttl-ms 1000 --metrics
//! ```
//! The store must be shared between processes, so `memory:` is replaced by a temporary SQLite
//! file. A worker process is the same binary run with `--worker ID`; it leaves gracefully
//! (draining and releasing its shards) when its stdin closes.
//!
//! Defaults: 64 shards, 4 workers (`w1`..`w4`; `w2` is killed, `w5` added), a 2 s TTL. With
//! `--metrics` every worker records the shard set's OpenTelemetry metrics (`leasehold_otel::ShardMetrics`:
//! `lease.shard.owned`, `lease.shard.moves` by reason, `lease.shard.steals`) into an in-memory
//! exporter and prints them when it leaves (the killed worker prints nothing).

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold_examples::store_url;
use leasehold_otel::ShardMetrics;
use leasehold_shard::{ShardSet, ShardSetConfig, Snapshot};
use opentelemetry::metrics::MeterProvider;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tokio::time::{Instant, sleep};

type BoxError = Box<dyn std::error::Error>;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// The run's parameters, shared by the parent and its worker processes.
#[derive(Debug, Clone)]
struct Params {
    url: String,
    name: String,
    shards: usize,
    workers: usize,
    ttl: Duration,
    metrics: bool,
}

impl Params {
    fn parse() -> Result<Self, BoxError> {
        let num = |name: &str, default: u64| -> Result<u64, BoxError> {
            match arg(name) {
                None => Ok(default),
                Some(v) => v.parse().map_err(|e| format!("{name} {v}: {e}").into()),
            }
        };
        let shards = usize::try_from(num("--shards", 64)?)?;
        let workers = usize::try_from(num("--workers", 4)?)?;
        let ttl = Duration::from_millis(num("--ttl-ms", 2000)?);
        if shards == 0 || workers < 2 {
            return Err("--shards must be at least 1 and --workers at least 2".into());
        }
        Ok(Params {
            url: store_url(),
            name: arg("--set").unwrap_or_else(|| format!("demo{}", std::process::id())),
            shards,
            workers,
            ttl,
            metrics: flag("--metrics"),
        })
    }

    async fn set(&self) -> Result<ShardSet, BoxError> {
        let store = leasehold::connect(&self.url).await?;
        let shards: Vec<String> = (0..self.shards).map(|i| format!("s{i}")).collect();
        Ok(ShardSet::new(
            store,
            &self.name,
            &shards,
            ShardSetConfig::new(self.ttl),
        )?)
    }

    fn spawn(&self, id: &str) -> std::io::Result<Child> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["--store", &self.url, "--set", &self.name, "--worker", id])
            .args(["--shards", &self.shards.to_string()])
            .args(["--ttl-ms", &self.ttl.as_millis().to_string()]);
        if self.metrics {
            cmd.arg("--metrics");
        }
        cmd.stdin(Stdio::piped()).spawn()
    }
}

/// A worker process: joins, runs until stdin closes, leaves gracefully; with `--metrics`, prints
/// its shard metrics after leaving.
async fn worker(p: &Params, id: &str) -> Result<(), BoxError> {
    let mut set = p.set().await?;
    let mut otel = None;
    if p.metrics {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let store = leasehold::connect(&p.url).await?;
        let hook = ShardMetrics::new(&provider.meter("shards"), store.backend(), &p.name);
        set = set.with_shard_hook(std::sync::Arc::new(hook));
        otel = Some((provider, exporter));
    }
    let mut w = set.join(id)?;
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        let _ = tx.send(());
    });
    // Consume the events (dropping each guard: this worker does no work per shard) until stdin
    // closes.
    loop {
        tokio::select! {
            _ = &mut rx => break,
            e = w.next_event() => if e.is_none() { break },
        }
    }
    w.leave().await;
    if let Some((provider, exporter)) = otel {
        provider.force_flush()?;
        println!("metrics {id}: {}", summary(&exporter)?);
    }
    Ok(())
}

/// `owned=N moves.handoff=N moves.lost=N moves.leaving=N steals=N` from the last export.
fn summary(exporter: &InMemoryMetricExporter) -> Result<String, BoxError> {
    let mut sums: BTreeMap<String, i64> = BTreeMap::new();
    for name in [
        "owned",
        "moves.handoff",
        "moves.lost",
        "moves.leaving",
        "steals",
    ] {
        sums.insert(name.to_string(), 0);
    }
    let exported = exporter.get_finished_metrics()?;
    let Some(last) = exported.last() else {
        return Err("no metrics exported".into());
    };
    for scope in last.scope_metrics() {
        for m in scope.metrics() {
            let short = m.name().trim_start_matches("lease.shard.");
            let points: Vec<(Option<String>, i64)> = match m.data() {
                AggregatedMetrics::I64(MetricData::Sum(s)) => s
                    .data_points()
                    .map(|p| (reason(p.attributes()), p.value()))
                    .collect(),
                AggregatedMetrics::U64(MetricData::Sum(s)) => s
                    .data_points()
                    .map(|p| Ok((reason(p.attributes()), i64::try_from(p.value())?)))
                    .collect::<Result<_, std::num::TryFromIntError>>()?,
                _ => continue,
            };
            for (r, v) in points {
                let key = match r {
                    Some(r) => format!("{short}.{r}"),
                    None => short.to_string(),
                };
                *sums.entry(key).or_default() += v;
            }
        }
    }
    Ok(sums
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" "))
}

fn reason<'a>(attrs: impl Iterator<Item = &'a opentelemetry::KeyValue>) -> Option<String> {
    attrs
        .filter(|kv| kv.key.as_str() == leasehold_otel::names::ATTR_SHARD_REASON)
        .map(|kv| kv.value.to_string())
        .next()
}

fn table(t0: Instant, what: &str, s: &Snapshot) {
    let counts = s.counts();
    let free = s.owners.values().filter(|o| o.is_none()).count();
    let cells: Vec<String> = counts.iter().map(|(w, n)| format!("{w}={n:<3}")).collect();
    println!(
        "[{:>6.1} s] {what:<28} {} free={free}",
        t0.elapsed().as_secs_f64(),
        cells.join(" ")
    );
}

/// Waits (at most `within`) until every shard is owned by one of `workers`, each within one of
/// its fair share; prints the table whenever it changes.
async fn settle(
    shards: usize,
    set: &ShardSet,
    t0: Instant,
    what: &str,
    workers: &[&str],
    within: Duration,
) -> Result<Snapshot, BoxError> {
    let mut members: Vec<String> = workers.iter().map(|w| w.to_string()).collect();
    members.sort();
    let deadline = Instant::now() + within;
    let mut last: Option<BTreeMap<String, usize>> = None;
    loop {
        let s = set.snapshot().await?;
        let counts = s.counts();
        if last.as_ref() != Some(&counts) {
            table(t0, what, &s);
            last = Some(counts.clone());
        }
        let owned = s.owners.values().all(|o| {
            o.as_ref()
                .is_some_and(|(w, _)| workers.contains(&w.as_str()))
        });
        let fair = workers.iter().all(|w| {
            let have = counts.get(*w).copied().unwrap_or(0);
            have.abs_diff(leasehold_shard::fair_share(shards, &members, w)) <= 1
        });
        if owned && fair {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: not settled within {within:?}").into());
        }
        sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut p = Params::parse()?;
    if let Some(id) = arg("--worker") {
        return worker(&p, &id).await;
    }
    let _tmp;
    if p.url.starts_with("memory") {
        let dir = std::env::temp_dir().join(format!("lease-shards-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        p.url = format!("sqlite://{}", dir.join("shards.db").display());
        _tmp = Cleanup(dir);
    }
    let (shards, ttl, url) = (p.shards, p.ttl, p.url.clone());
    let observer = p.set().await?;
    let interval = observer.config().rebalance_interval();
    println!(
        "{shards} shards over worker processes on {url} (ttl {ttl:?}, rebalance every {interval:?})"
    );
    let t0 = Instant::now();
    let ids: Vec<String> = (1..=p.workers).map(|i| format!("w{i}")).collect();
    let mut kids: BTreeMap<String, Child> = BTreeMap::new();
    for id in &ids {
        kids.insert(id.clone(), p.spawn(id)?);
    }
    let limit = ttl * 30;
    let all: Vec<&str> = ids.iter().map(String::as_str).collect();
    settle(
        shards,
        &observer,
        t0,
        &format!("{} workers", ids.len()),
        &all,
        limit,
    )
    .await?;

    // Kill w2: no release; its shards expire after the TTL and are taken over.
    let killed = Instant::now();
    if let Some(mut c) = kids.remove("w2") {
        c.kill()?;
        c.wait()?;
    }
    println!("killed w2 (SIGKILL)");
    let mut live: Vec<&str> = all.iter().copied().filter(|w| *w != "w2").collect();
    settle(shards, &observer, t0, "after killing w2", &live, limit).await?;
    println!(
        "every shard owned and balanced {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );

    // Add a new worker: it steals by drained handover, only what it must.
    let new = format!("w{}", p.workers + 1);
    let before = observer.snapshot().await?;
    kids.insert(new.clone(), p.spawn(&new)?);
    println!("added {new}");
    live.push(&new);
    let after = settle(
        shards,
        &observer,
        t0,
        &format!("after adding {new}"),
        &live,
        limit,
    )
    .await?;
    let moved = before
        .owners
        .iter()
        .filter(|(s, o)| after.owners[*s].as_ref().map(|x| &x.0) != o.as_ref().map(|x| &x.0))
        .map(|(s, _)| after.owners[s].as_ref().map(|x| x.0.as_str()))
        .collect::<Vec<_>>();
    let to_new = moved.iter().filter(|o| **o == Some(new.as_str())).count();
    println!(
        "{new} joined: {} shard(s) moved, {to_new} of them to {new} (its share is {}; settled means within one)",
        moved.len(),
        shards / live.len()
    );

    // Stop: closing stdin makes each worker leave gracefully.
    for (_, mut c) in std::mem::take(&mut kids) {
        drop(c.stdin.take());
        c.wait()?;
    }
    let s = observer.snapshot().await?;
    table(t0, "after all left", &s);
    Ok(())
}

struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
