//! OpenTelemetry metrics of leasehold (`leasehold-otel`) served to Prometheus, with a
//! per-election leader gauge.
//!
//! The process joins an election with `--candidates N` candidates (`replica-1`, ...), records
//! the library's metrics with `leasehold-otel` (store calls, renewals, leadership transitions,
//! fencing rejections, leases held) plus an observable gauge `lease.leader` (1 for the candidate
//! that leads, 0 for the others, by `election` and `candidate`), and serves them in the
//! Prometheus text format at `http://--listen/metrics` (default `127.0.0.1:9464`). Names follow
//! the OpenTelemetry-to-Prometheus conventions: dots become underscores, a unit of seconds adds
//! `_seconds`, monotonic counters add `_total`. `examples/prometheus/alerts.yaml` has alert rules
//! over these names. SIGTERM or SIGINT resigns every candidate and exits.
//!
//! ```text
//! cargo run -p leasehold-examples --features prometheus --bin prometheus -- --store sqlite:///tmp/l.db
//! curl -s localhost:9464/metrics | grep lease_leader
//! ```
//!
//! The rendering here is a minimal bridge for the example (sums, gauges and histograms of one
//! SDK reader); a service would rather use an OpenTelemetry Collector's Prometheus exporter or
//! Prometheus's OTLP receiver, which produce the same names.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use leasehold::election::{Candidate, Election};
use leasehold::supervisor::SupervisorConfig;
use leasehold::{LeaseKey, OwnerId};
use leasehold_examples::{Backend, store_url};
use leasehold_otel::{LeaseMetrics, OtelConfig};
use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tokio::signal::unix::{SignalKind, signal};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn arg(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

/// The Prometheus name of an OpenTelemetry instrument.
fn prom_name(name: &str, unit: &str, counter: bool) -> String {
    let mut n: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if unit == "s" {
        n.push_str("_seconds");
    }
    if counter {
        n.push_str("_total");
    }
    n
}

/// `{a="x",b="y"}` from attributes (and `extra`), or nothing when there are none.
fn labels<'a>(attrs: impl Iterator<Item = &'a KeyValue>, extra: Option<(&str, String)>) -> String {
    let mut parts: Vec<String> = attrs
        .map(|kv| {
            let key = prom_name(kv.key.as_str(), "", false);
            let value = kv
                .value
                .to_string()
                .replace('\\', "\\\\")
                .replace('"', "\\\"");
            format!("{key}=\"{value}\"")
        })
        .collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{v}\""));
    }
    parts.sort();
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// Renders every metric of `rm` in the Prometheus text format.
fn render(rm: &ResourceMetrics) -> String {
    let mut out = String::new();
    for scope in rm.scope_metrics() {
        for m in scope.metrics() {
            macro_rules! points {
                ($data:expr) => {
                    match $data {
                        MetricData::Gauge(g) => {
                            let n = prom_name(m.name(), m.unit(), false);
                            let _ =
                                writeln!(out, "# HELP {n} {}\n# TYPE {n} gauge", m.description());
                            for p in g.data_points() {
                                let _ = writeln!(
                                    out,
                                    "{n}{} {}",
                                    labels(p.attributes(), None),
                                    p.value()
                                );
                            }
                        }
                        MetricData::Sum(s) => {
                            let n = prom_name(m.name(), m.unit(), s.is_monotonic());
                            let kind = if s.is_monotonic() { "counter" } else { "gauge" };
                            let _ =
                                writeln!(out, "# HELP {n} {}\n# TYPE {n} {kind}", m.description());
                            for p in s.data_points() {
                                let _ = writeln!(
                                    out,
                                    "{n}{} {}",
                                    labels(p.attributes(), None),
                                    p.value()
                                );
                            }
                        }
                        MetricData::Histogram(h) => {
                            let n = prom_name(m.name(), m.unit(), false);
                            let _ = writeln!(
                                out,
                                "# HELP {n} {}\n# TYPE {n} histogram",
                                m.description()
                            );
                            for p in h.data_points() {
                                let mut cumulative = 0;
                                let bounds: Vec<f64> = p.bounds().collect();
                                for (i, c) in p.bucket_counts().enumerate() {
                                    cumulative += c;
                                    let le = bounds
                                        .get(i)
                                        .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
                                    let _ = writeln!(
                                        out,
                                        "{n}_bucket{} {cumulative}",
                                        labels(p.attributes(), Some(("le", le)))
                                    );
                                }
                                let l = labels(p.attributes(), None);
                                let _ = writeln!(
                                    out,
                                    "{n}_sum{l} {}\n{n}_count{l} {}",
                                    p.sum(),
                                    p.count()
                                );
                            }
                        }
                        MetricData::ExponentialHistogram(_) => {}
                    }
                };
            }
            match m.data() {
                AggregatedMetrics::F64(d) => points!(d),
                AggregatedMetrics::U64(d) => points!(d),
                AggregatedMetrics::I64(d) => points!(d),
            }
        }
    }
    out
}

/// The SDK's latest cumulative export, rendered.
fn scrape(
    provider: &SdkMeterProvider,
    exporter: &InMemoryMetricExporter,
) -> Result<String, BoxError> {
    provider.force_flush()?;
    let batches = exporter.get_finished_metrics()?;
    exporter.reset();
    Ok(batches.last().map(render).unwrap_or_default())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = store_url();
    let listen = arg("--listen").unwrap_or_else(|| "127.0.0.1:9464".into());
    let name = arg("--election").unwrap_or_else(|| "example-election".into());
    let n: usize = arg("--candidates")
        .and_then(|c| c.parse().ok())
        .unwrap_or(2);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;

    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let meter = provider.meter("leasehold-example");
    let metrics = LeaseMetrics::with_config(&meter, OtelConfig::new().with_key_attribute());

    let backend = Backend::connect(&url).await?;
    let ttl = backend.ttl(Duration::from_secs(5));
    let election = Election::from_arc(
        backend.store.clone(),
        LeaseKey::new(&name)?,
        SupervisorConfig::new(ttl).with_acquire_wait(ttl),
    )
    .with_hook(metrics.hook(backend.store.backend()));
    let candidates: Arc<Mutex<Vec<Candidate>>> = Arc::new(Mutex::new(
        (1..=n)
            .map(|i| OwnerId::new(format!("replica-{i}")).map(|id| election.join(id)))
            .collect::<Result<_, _>>()?,
    ));
    // The per-election leader gauge: 1 for the candidate that leads, 0 for the others.
    let seen = candidates.clone();
    let election_name = name.clone();
    let _leader = meter
        .u64_observable_gauge("lease.leader")
        .with_description("1 if this candidate leads the election now, else 0.")
        .with_callback(move |gauge| {
            let list = seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for c in list.iter() {
                gauge.observe(
                    u64::from(c.is_leader()),
                    &[
                        KeyValue::new("election", election_name.clone()),
                        KeyValue::new("candidate", c.id().to_string()),
                    ],
                );
            }
        })
        .build();

    let scrape_provider = provider.clone();
    let scrape_exporter = exporter.clone();
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let (p, e) = (scrape_provider.clone(), scrape_exporter.clone());
            async move {
                // Flushing runs the SDK's collection on this thread; keep it off the runtime's.
                tokio::task::spawn_blocking(move || scrape(&p, &e))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
                    .unwrap_or_else(|e| format!("# scrape failed: {e}\n"))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("metrics on http://{}/metrics", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    let list: Vec<Candidate> = std::mem::take(
        &mut *candidates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    for c in list {
        c.resign().await;
    }
    println!("resigned");
    server.abort();
    provider.shutdown()?;
    Ok(())
}
