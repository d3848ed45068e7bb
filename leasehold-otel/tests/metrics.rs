//! The instruments, checked with the SDK's in-memory exporter in paused time, so every value is
//! exact: a scripted scenario (acquire, renew, forced loss, stale write, leader change) produces
//! exactly the data points the instrument table documents, and no others.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use leasehold_core::election::{Election, ElectionEvent};
use leasehold_core::supervisor::{Health, LossReason, Supervisor, SupervisorConfig};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, FencingToken, LeaseKey, LeaseStore,
    MemoryFencedResource, MemoryLeaseStore, OwnerId, ReleaseOutcome, WriteOp,
};
use leasehold_otel::{LeaseMetrics, OtelConfig};
use leasehold_testkit::faulty::{Fault, FaultyStore, Operation};
use opentelemetry::metrics::MeterProvider;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tokio::time::Instant;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One exported data point, flattened.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    /// Counter or up-down counter.
    Sum(i64),
    /// Histogram: count and sum.
    Hist(u64, f64),
    /// Gauge.
    Gauge(f64),
}

#[derive(Debug, Clone)]
struct Point {
    name: String,
    unit: String,
    kind: &'static str,
    attrs: BTreeMap<String, String>,
    value: Value,
}

/// An SDK meter provider whose reader exports into memory on demand.
struct Harness {
    provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
    metrics: LeaseMetrics,
}

impl Harness {
    fn new(config: OtelConfig) -> Self {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let metrics = LeaseMetrics::with_config(&provider.meter("leasehold-otel-test"), config);
        Harness {
            provider,
            exporter,
            metrics,
        }
    }

    /// Collects now and returns every data point (cumulative since the start).
    fn snapshot(&self) -> Vec<Point> {
        self.exporter.reset();
        self.provider.force_flush().expect("flush");
        let exported = self.exporter.get_finished_metrics().expect("metrics");
        let last = exported.last().expect("one export");
        let mut out = Vec::new();
        for scope in last.scope_metrics() {
            for m in scope.metrics() {
                flatten(m, &mut out);
            }
        }
        out
    }
}

fn attrs<'a>(kvs: impl Iterator<Item = &'a opentelemetry::KeyValue>) -> BTreeMap<String, String> {
    kvs.map(|kv| (kv.key.to_string(), kv.value.to_string()))
        .collect()
}

fn flatten(m: &opentelemetry_sdk::metrics::data::Metric, out: &mut Vec<Point>) {
    let mut push = |kind: &'static str, attrs: BTreeMap<String, String>, value: Value| {
        out.push(Point {
            name: m.name().to_string(),
            unit: m.unit().to_string(),
            kind,
            attrs,
            value,
        });
    };
    macro_rules! data {
        ($data:expr, $to_i64:expr, $to_f64:expr) => {
            match $data {
                MetricData::Sum(s) => {
                    let kind = if s.is_monotonic() {
                        "Counter"
                    } else {
                        "UpDownCounter"
                    };
                    for p in s.data_points() {
                        push(kind, attrs(p.attributes()), Value::Sum($to_i64(p.value())));
                    }
                }
                MetricData::Histogram(h) => {
                    for p in h.data_points() {
                        push(
                            "Histogram",
                            attrs(p.attributes()),
                            Value::Hist(p.count(), $to_f64(p.sum())),
                        );
                    }
                }
                MetricData::Gauge(g) => {
                    for p in g.data_points() {
                        push(
                            "Gauge",
                            attrs(p.attributes()),
                            Value::Gauge($to_f64(p.value())),
                        );
                    }
                }
                MetricData::ExponentialHistogram(_) => panic!("no exponential histograms expected"),
            }
        };
    }
    match m.data() {
        AggregatedMetrics::U64(d) => data!(d, |v: u64| i64::try_from(v).unwrap(), |v: u64| {
            f64::from(u32::try_from(v).unwrap())
        }),
        AggregatedMetrics::I64(d) => {
            data!(d, |v: i64| v, |v: i64| f64::from(i32::try_from(v).unwrap()))
        }
        AggregatedMetrics::F64(d) => data!(d, |_: f64| panic!("no f64 sums expected"), |v: f64| v),
    }
}

/// The documented instrument table: name -> (kind, unit, attribute keys).
struct Table(BTreeMap<String, (String, String, BTreeSet<String>)>);

/// The instrument table rows (`| \`lease.* | <kind> |`) of a markdown text, with `//! `
/// prefixes removed.
fn table_rows(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_start().trim_start_matches("//!").trim())
        .filter(|l| l.starts_with("| `lease."))
        .filter(|l| {
            let kind = l.split(" | ").nth(1).unwrap_or("");
            ["Counter", "UpDownCounter", "Histogram", "Gauge"].contains(&kind)
        })
        .map(str::to_string)
        .collect()
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

impl Table {
    fn load() -> Self {
        let lib = include_str!("../src/lib.rs");
        let mut rows = BTreeMap::new();
        for row in table_rows(lib) {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 5, "table row with 5 cells: {row}");
            let name = backticked(cells[0]).remove(0);
            let unit = backticked(cells[2]).remove(0);
            let keys = backticked(cells[3])
                .into_iter()
                .filter(|t| t.starts_with("lease.") || t.starts_with("error."))
                .collect();
            rows.insert(name, (cells[1].to_string(), unit, keys));
        }
        Table(rows)
    }

    /// Every point matches its row: documented name, kind, unit; `lease.backend` present; no
    /// undocumented attribute (`lease.key` only when `with_key`).
    fn check(&self, points: &[Point], with_key: bool) {
        for p in points {
            let (kind, unit, keys) = self
                .0
                .get(&p.name)
                .unwrap_or_else(|| panic!("{} is not in the table", p.name));
            assert_eq!(&p.kind, kind, "kind of {}", p.name);
            assert_eq!(&p.unit, unit, "unit of {}", p.name);
            assert_eq!(
                p.attrs.get("lease.backend").map(String::as_str),
                Some("memory"),
                "{p:?}"
            );
            for k in p.attrs.keys() {
                let allowed = keys.contains(k) || (with_key && k == "lease.key");
                assert!(allowed, "{} has undocumented attribute {k}", p.name);
            }
            // A batch concerns several keys: never `lease.key` there.
            let batch = p.attrs.get("lease.operation").map(String::as_str) == Some("renew_many");
            assert_eq!(
                p.attrs.contains_key("lease.key"),
                with_key && !batch,
                "lease.key on {p:?}"
            );
        }
    }
}

/// The expected point `name{backend=memory, attrs...} = value`.
fn pt(
    name: &str,
    attrs: &[(&str, &str)],
    value: Value,
) -> (String, BTreeMap<String, String>, Value) {
    let mut a: BTreeMap<String, String> = attrs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    a.insert("lease.backend".into(), "memory".into());
    (name.to_string(), a, value)
}

fn assert_points(actual: &[Point], mut expected: Vec<(String, BTreeMap<String, String>, Value)>) {
    let mut got: Vec<_> = actual
        .iter()
        .map(|p| (p.name.clone(), p.attrs.clone(), p.value.clone()))
        .collect();
    let order =
        |a: &(String, BTreeMap<String, String>, Value),
         b: &(String, BTreeMap<String, String>, Value)| { (&a.0, &a.1).cmp(&(&b.0, &b.1)) };
    got.sort_by(order);
    expected.sort_by(order);
    let close = |a: &Value, b: &Value| match (a, b) {
        (Value::Hist(c1, s1), Value::Hist(c2, s2)) => c1 == c2 && (s1 - s2).abs() < 1e-9,
        (Value::Gauge(g1), Value::Gauge(g2)) => (g1 - g2).abs() < 1e-9,
        _ => a == b,
    };
    let same = got.len() == expected.len()
        && got
            .iter()
            .zip(&expected)
            .all(|(g, e)| g.0 == e.0 && g.1 == e.1 && close(&g.2, &e.2));
    assert!(
        same,
        "data points differ\n got: {got:#?}\n expected: {expected:#?}"
    );
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// TTL 3 s, renew every second, no drift margin, loss 100 ms before the deadline, and a backoff
/// so large that a waiting acquirer sleeps exactly until the holder's expiry (or a watch wakes it).
fn config() -> SupervisorConfig {
    SupervisorConfig::new(Duration::from_secs(3))
        .with_renew_interval(Duration::from_secs(1))
        .with_op_timeout(Duration::from_secs(5))
        .with_drift_margin(Duration::ZERO)
        .with_loss_lead(ms(100))
        .with_backoff(Duration::from_secs(10), Duration::from_secs(10))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn scripted_scenario_produces_exactly_the_documented_metrics() -> TestResult {
    let h = Harness::new(OtelConfig::new());
    let table = Table::load();
    let t0 = Instant::now();
    let memory = MemoryLeaseStore::new();
    let faulty = FaultyStore::new(memory.clone());
    let store_a = h.metrics.store(faulty.clone());
    let store_b = h.metrics.store(memory.clone());
    let resource = h.metrics.resource(MemoryFencedResource::new(), "memory");
    let job = LeaseKey::new("job")?;

    // 1. A acquires through the supervisor (t = 0) and renews once (t = 1 s).
    let sup_a = Supervisor::new(store_a.clone(), config())
        .with_owner(OwnerId::new("a")?)
        .with_hook(store_a.hook());
    let guard = sup_a.acquire(&job).await?.guard().ok_or("job is free")?;
    let zombie = guard.token();
    assert_eq!(zombie, FencingToken::MIN);
    tokio::time::sleep_until(t0 + ms(1500)).await;
    let mid = h.snapshot();
    table.check(&mid, false);
    let gauge: Vec<_> = mid
        .iter()
        .filter(|p| p.name == "lease.since_last_renewal")
        .collect();
    assert_eq!(gauge.len(), 1, "{gauge:?}");
    assert_eq!(
        gauge[0].value,
        Value::Gauge(0.5),
        "0.5 s since the renewal at 1 s"
    );
    assert!(
        mid.iter()
            .any(|p| p.name == "lease.held" && p.value == Value::Sum(1))
    );

    // 2. The store stops answering renewals: the renewal sent at 2 s times out at the loss
    //    deadline (4 s - 100 ms) and the lease is lost there.
    faulty.set(Operation::Renew, Fault::Hang);
    assert_eq!(
        guard.lost().await,
        Health::Lost(LossReason::DeadlineReached)
    );
    assert_eq!(Instant::now() - t0, ms(3900));
    drop(guard);

    // 3. B finds the key still held for 100 ms, takes it over at 4 s, writes; A's late write
    //    and install with the old token are rejected. A bad request is an error attempt.
    let b = OwnerId::new("b")?;
    let req_b = AcquireRequest::new(job.clone(), b.clone(), Duration::from_secs(3))
        .with_drift_margin(Duration::ZERO);
    let AcquireOutcome::Held(holder) = store_b.acquire(&req_b).await? else {
        return Err("A's lease should still be held by the store".into());
    };
    assert_eq!(holder.remaining, ms(100));
    tokio::time::sleep(holder.remaining).await;
    let lease_b = store_b.acquire(&req_b).await?.lease().ok_or("expired")?;
    assert_eq!(lease_b.token().get(), 2);
    assert!(
        resource
            .write(&job, lease_b.token(), WriteOp::Put(b"b".to_vec()))
            .await?
            .is_accepted()
    );
    assert!(
        !resource
            .write(&job, zombie, WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert!(!resource.install(&job, zombie).await?.is_accepted());
    let bad = AcquireRequest::new(job.clone(), b.clone(), Duration::ZERO);
    assert!(store_b.acquire(&bad).await.unwrap_err().is_invalid_input());
    assert_eq!(store_b.release(&lease_b).await?, ReleaseOutcome::Released);
    assert_eq!(store_b.release(&lease_b).await?, ReleaseOutcome::NotHeld);
    assert!(store_b.inspect(&job).await?.holder.is_none());

    // 4. Leader change at 4 s: X is elected, Y campaigns (two `held` attempts: before and
    //    after opening its watch), X renews at 5 s
    //    and resigns at 5.5 s, Y is woken by the watch and elected, then resigns.
    let leader = LeaseKey::new("leader")?;
    let ex = Election::new(store_b.clone(), leader.clone(), config()).with_hook(store_b.hook());
    let mut x = ex.join(OwnerId::new("x")?);
    let Some(ElectionEvent::Elected { term: term_x, .. }) = x.next_event().await else {
        return Err("x should be elected".into());
    };
    let y_calls = FaultyStore::new(memory.clone());
    let store_y = h.metrics.store(y_calls.clone());
    let ey = Election::new(store_y.clone(), leader.clone(), config()).with_hook(store_y.hook());
    let mut y = ey.join(OwnerId::new("y")?);
    for _ in 0..1000 {
        if y_calls.calls(Operation::Acquire) >= 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    // The supervisor opens its watch after the first refusal and tries once more at once (a
    // release between the two would otherwise be missed), then waits.
    assert_eq!(
        y_calls.calls(Operation::Acquire),
        2,
        "y tried, opened its watch, tried once more and waits"
    );
    tokio::time::sleep(ms(1500)).await;
    x.resign().await;
    let Some(ElectionEvent::Elected { term: term_y, .. }) = y.next_event().await else {
        return Err("y should be elected".into());
    };
    assert!(term_y > term_x);
    assert_eq!(Instant::now() - t0, ms(5500));
    y.resign().await;

    let end = h.snapshot();
    table.check(&end, false);
    use Value::{Hist, Sum};
    assert_points(
        &end,
        vec![
            // A at 0, B at 4, X at 4, Y at 5.5 granted; B and Y found the key held once each.
            pt(
                "lease.acquire.attempts",
                &[("lease.outcome", "acquired")],
                Sum(4),
            ),
            // Y's two refused attempts (before and right after opening its watch) and the refused
            // attempt earlier in the script.
            pt(
                "lease.acquire.attempts",
                &[("lease.outcome", "held")],
                Sum(3),
            ),
            pt(
                "lease.acquire.attempts",
                &[("lease.outcome", "error"), ("error.type", "invalid_input")],
                Sum(1),
            ),
            // Supervised acquisitions: A and X at once, Y after 1.5 s.
            pt(
                "lease.acquire.wait",
                &[("lease.outcome", "acquired")],
                Hist(3, 1.5),
            ),
            // The memory store answers in zero (paused) time; the hanging renewal was dropped
            // by the supervisor after 1.9 s.
            pt(
                "lease.operation.duration",
                &[
                    ("lease.operation", "acquire"),
                    ("lease.outcome", "acquired"),
                ],
                Hist(4, 0.0),
            ),
            // Y's two refused attempts (before and right after opening its watch) and the refused
            // attempt earlier in the script.
            pt(
                "lease.operation.duration",
                &[("lease.operation", "acquire"), ("lease.outcome", "held")],
                Hist(3, 0.0),
            ),
            pt(
                "lease.operation.duration",
                &[
                    ("lease.operation", "acquire"),
                    ("lease.outcome", "error"),
                    ("error.type", "invalid_input"),
                ],
                Hist(1, 0.0),
            ),
            pt(
                "lease.operation.duration",
                &[("lease.operation", "renew"), ("lease.outcome", "renewed")],
                Hist(2, 0.0),
            ),
            pt(
                "lease.operation.duration",
                &[
                    ("lease.operation", "renew"),
                    ("lease.outcome", "error"),
                    ("error.type", "cancelled"),
                ],
                Hist(1, 1.9),
            ),
            pt(
                "lease.operation.duration",
                &[
                    ("lease.operation", "release"),
                    ("lease.outcome", "released"),
                ],
                Hist(3, 0.0),
            ),
            pt(
                "lease.operation.duration",
                &[
                    ("lease.operation", "release"),
                    ("lease.outcome", "not_held"),
                ],
                Hist(1, 0.0),
            ),
            // One explicit inspect (step 3) plus six by X's and Y's elections, which read their
            // free handover-reservation/candidate keys since the planned handover (e17d07a).
            pt(
                "lease.operation.duration",
                &[("lease.operation", "inspect"), ("lease.outcome", "free")],
                Hist(7, 0.0),
            ),
            // Only Y opens a watch: a supervised acquisition opens one after its first refusal.
            pt(
                "lease.operation.duration",
                &[("lease.operation", "watch"), ("lease.outcome", "watching")],
                Hist(1, 0.0),
            ),
            // A renewed at 1 s and X at 5 s, each with 2 s of validity left; A's renewal at
            // 2 s timed out at 3.9 s.
            pt("lease.renewals", &[("lease.outcome", "confirmed")], Sum(2)),
            pt("lease.renewals", &[("lease.outcome", "timed_out")], Sum(1)),
            pt(
                "lease.renewal.duration",
                &[("lease.outcome", "confirmed")],
                Hist(2, 0.0),
            ),
            pt(
                "lease.renewal.duration",
                &[("lease.outcome", "timed_out")],
                Hist(1, 1.9),
            ),
            pt("lease.renewal.remaining", &[], Hist(2, 4.0)),
            pt(
                "lease.lost",
                &[("lease.loss.reason", "deadline_reached")],
                Sum(1),
            ),
            // A held 3.9 s (lost); X 1.5 s and Y 0 s (released).
            pt(
                "lease.hold.duration",
                &[("lease.outcome", "lost")],
                Hist(1, 3.9),
            ),
            pt(
                "lease.hold.duration",
                &[("lease.outcome", "released")],
                Hist(2, 1.5),
            ),
            pt("lease.held", &[], Sum(0)),
            pt(
                "lease.leader.transitions",
                &[("lease.leader.event", "elected")],
                Sum(2),
            ),
            pt(
                "lease.leader.transitions",
                &[("lease.leader.event", "stepped_down")],
                Sum(2),
            ),
            pt(
                "lease.fencing.rejections",
                &[("lease.fencing.operation", "write")],
                Sum(1),
            ),
            pt(
                "lease.fencing.rejections",
                &[("lease.fencing.operation", "install")],
                Sum(1),
            ),
            // No lease is held any more: the gauge has no data point.
        ],
    );

    // Every documented instrument was exported at some point of the scenario.
    let seen: BTreeSet<&str> = mid.iter().chain(&end).map(|p| p.name.as_str()).collect();
    // (The shard instruments have their own test below.)
    let documented: BTreeSet<&str> = table
        .0
        .keys()
        .map(String::as_str)
        .filter(|n| !n.starts_with("lease.shard."))
        .collect();
    assert_eq!(seen, documented);
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn key_attribute_is_opt_in_and_then_on_every_point() -> TestResult {
    let h = Harness::new(OtelConfig::new().with_key_attribute());
    let table = Table::load();
    let store = h.metrics.store(MemoryLeaseStore::new());
    let resource = h.metrics.resource(MemoryFencedResource::new(), "memory");
    let key = LeaseKey::new("tenant-7")?;
    let sup = Supervisor::new(store.clone(), config()).with_hook(store.hook());
    let guard = sup.acquire(&key).await?.guard().ok_or("free")?;
    tokio::time::sleep(ms(1500)).await;
    let mid = h.snapshot();
    let token = guard.token();
    assert!(
        resource
            .write(&key, token.next()?, WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert!(
        !resource
            .write(&key, token, WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert_eq!(guard.release().await?, ReleaseOutcome::Released);
    let end = h.snapshot();
    table.check(&mid, true);
    table.check(&end, true);
    for p in mid.iter().chain(&end) {
        assert_eq!(
            p.attrs.get("lease.key").map(String::as_str),
            Some("tenant-7"),
            "{p:?}"
        );
    }
    let names: BTreeSet<&str> = mid.iter().chain(&end).map(|p| p.name.as_str()).collect();
    for n in [
        "lease.since_last_renewal",
        "lease.held",
        "lease.renewals",
        "lease.hold.duration",
        "lease.fencing.rejections",
        "lease.acquire.attempts",
    ] {
        assert!(names.contains(n), "{n} missing from {names:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn renew_many_is_forwarded_and_measured_once_per_batch() -> TestResult {
    let h = Harness::new(OtelConfig::new().with_key_attribute());
    let store = h.metrics.store(MemoryLeaseStore::new());
    let owner = OwnerId::new("batcher")?;
    let mut leases = Vec::new();
    for name in ["b1", "b2"] {
        let req = AcquireRequest::new(LeaseKey::new(name)?, owner.clone(), Duration::from_secs(3));
        leases.push(store.acquire(&req).await?.lease().ok_or("free")?);
    }
    assert_eq!(store.release(&leases[1]).await?, ReleaseOutcome::Released);
    let outcomes = store.renew_many(&leases).await?;
    assert!(matches!(
        outcomes[0],
        Ok(leasehold_core::RenewOutcome::Renewed(_))
    ));
    assert!(matches!(
        outcomes[1],
        Ok(leasehold_core::RenewOutcome::Lost)
    ));
    let points = h.snapshot();
    Table::load().check(&points, true);
    let batch: Vec<_> = points
        .iter()
        .filter(|p| p.attrs.get("lease.operation").map(String::as_str) == Some("renew_many"))
        .collect();
    assert_eq!(batch.len(), 1, "{batch:?}");
    assert_eq!(batch[0].value, Value::Hist(1, 0.0));
    assert_eq!(
        batch[0].attrs.get("lease.outcome").map(String::as_str),
        Some("completed")
    );
    assert!(
        !points
            .iter()
            .any(|p| p.attrs.get("lease.operation").map(String::as_str) == Some("renew")),
        "the batch is one call, not one per lease"
    );
    Ok(())
}

/// With renewal batching the supervisor renews through `renew_many`: the decorator sees one call
/// per batch, the hook still one renewal per lease.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn batched_supervisor_renewals_are_one_call_and_one_renewal_per_lease() -> TestResult {
    let h = Harness::new(OtelConfig::new());
    let store = h.metrics.store(MemoryLeaseStore::new());
    let sup = Supervisor::new(
        store.clone(),
        config().with_renewal_batching(Duration::from_millis(10)),
    )
    .with_hook(store.hook());
    let g1 = sup
        .acquire(&LeaseKey::new("one")?)
        .await?
        .guard()
        .ok_or("free")?;
    let g2 = sup
        .acquire(&LeaseKey::new("two")?)
        .await?
        .guard()
        .ok_or("free")?;
    tokio::time::sleep(ms(1500)).await;
    let points = h.snapshot();
    Table::load().check(&points, false);
    let get = |name: &str, op: Option<&str>, outcome: &str| -> Option<Value> {
        points
            .iter()
            .find(|p| {
                p.name == name
                    && p.attrs.get("lease.operation").map(String::as_str) == op
                    && p.attrs.get("lease.outcome").map(String::as_str) == Some(outcome)
            })
            .map(|p| p.value.clone())
    };
    assert_eq!(
        get("lease.renewals", None, "confirmed"),
        Some(Value::Sum(2))
    );
    assert!(
        matches!(
            get("lease.operation.duration", Some("renew_many"), "completed"),
            Some(Value::Hist(1, _))
        ),
        "{points:#?}"
    );
    assert_eq!(
        get("lease.operation.duration", Some("renew"), "renewed"),
        None
    );
    assert_eq!(g1.release().await?, ReleaseOutcome::Released);
    assert_eq!(g2.release().await?, ReleaseOutcome::Released);
    Ok(())
}

/// The supervisor reports `acquired` before it installs the token in the fence; when the install
/// is refused it releases and returns an error without ever reporting the end of that lease. The
/// hook must not count it as held forever.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_grant_refused_by_the_fence_is_not_held_forever() -> TestResult {
    let h = Harness::new(OtelConfig::new());
    let store = h.metrics.store(MemoryLeaseStore::new());
    let resource = std::sync::Arc::new(h.metrics.resource(MemoryFencedResource::new(), "memory"));
    let key = LeaseKey::new("fenced")?;
    assert!(
        resource
            .install(&key, FencingToken::new(100)?)
            .await?
            .is_accepted()
    );
    let sup = Supervisor::new(store.clone(), config())
        .with_hook(store.hook())
        .with_fence_on_acquire(resource.clone());
    assert!(
        sup.acquire(&key).await.is_err(),
        "the fence refuses token 1"
    );
    assert!(
        store.inspect(&key).await?.holder.is_none(),
        "released again"
    );
    // Past the lease's deadline (3 s) plus the grace, the orphan is dropped.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let points = h.snapshot();
    Table::load().check(&points, false);
    let held: Vec<_> = points.iter().filter(|p| p.name == "lease.held").collect();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].value, Value::Sum(0), "{held:?}");
    assert!(!points.iter().any(|p| p.name == "lease.since_last_renewal"));
    assert!(points.iter().any(|p| p.name == "lease.fencing.rejections"
        && p.attrs.get("lease.fencing.operation").map(String::as_str) == Some("install")
        && p.value == Value::Sum(1)));
    Ok(())
}

#[test]
fn the_docs_table_is_the_crate_docs_table() {
    let lib = table_rows(include_str!("../src/lib.rs"));
    let docs = table_rows(include_str!("../../docs/operations.md"));
    assert_eq!(lib.len(), 15, "fifteen instruments");
    // The crate docs link types (`[`InstrumentedStore`]`); the markdown file spells them plainly.
    let plain = |rows: Vec<String>| -> Vec<String> {
        rows.into_iter()
            .map(|r| r.replace("[`", "`").replace("`]", "`"))
            .collect()
    };
    assert_eq!(plain(lib), plain(docs));
}

/// Waits (paused time, so virtual seconds) until `ok` holds, at most 120 s.
async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ok() {
        assert!(Instant::now() < deadline, "not within 120 s: {what}");
        tokio::time::sleep(ms(50)).await;
    }
}

/// The value of the sum `name` for `worker` (and `reason`, if given); 0 if absent.
fn shard_sum(points: &[Point], name: &str, worker: &str, reason: Option<&str>) -> i64 {
    points
        .iter()
        .filter(|p| {
            p.name == name
                && p.attrs.get("lease.shard.worker").map(String::as_str) == Some(worker)
                && p.attrs.get("lease.shard.reason").map(String::as_str) == reason
        })
        .map(|p| match p.value {
            Value::Sum(v) => v,
            _ => panic!("not a sum: {p:?}"),
        })
        .sum()
}

/// A shard set with the [`ShardMetrics`] hook on the memory store: a second worker steals by
/// handover, the first loses every lease (its store hangs), the second leaves; every step shows
/// in `lease.shard.owned`, `lease.shard.moves` by reason and `lease.shard.steals`, and every data
/// point matches the documented table.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shard_hook_counts_owned_moves_and_steals() -> TestResult {
    use leasehold_shard::{ShardSet, ShardSetConfig};
    use std::sync::Arc;
    let h = Harness::new(OtelConfig::default());
    let hook = Arc::new(leasehold_otel::ShardMetrics::new(
        &h.provider.meter("leasehold-otel-test"),
        "memory",
        "orders",
    ));
    let memory = Arc::new(MemoryLeaseStore::new());
    let faulty = Arc::new(FaultyStore::new(memory.clone()));
    let shards: Vec<String> = (0..4).map(|i| format!("p{i}")).collect();
    let cfg = ShardSetConfig::new(Duration::from_secs(3));
    // w1 goes through a store that can be made to hang; w2 talks to the memory store directly.
    let set1 = ShardSet::new(faulty.clone(), "orders", &shards, cfg.clone())?
        .with_shard_hook(hook.clone());
    let set2 = ShardSet::new(memory.clone(), "orders", &shards, cfg)?.with_shard_hook(hook);
    let w1 = set1.join("w1")?;
    until("w1 owns all 4", || w1.assignment().len() == 4).await;
    let p = h.snapshot();
    Table::load().check(&p, false);
    assert_eq!(shard_sum(&p, "lease.shard.owned", "w1", None), 4);

    let w2 = set2.join("w2")?;
    until("2 + 2", || {
        w1.assignment().len() == 2 && w2.assignment().len() == 2
    })
    .await;
    until("the handovers are reported", || {
        let p = h.snapshot();
        shard_sum(&p, "lease.shard.moves", "w1", Some("handoff")) == 2
    })
    .await;
    let p = h.snapshot();
    Table::load().check(&p, false);
    assert_eq!(shard_sum(&p, "lease.shard.owned", "w1", None), 2);
    assert_eq!(shard_sum(&p, "lease.shard.owned", "w2", None), 2);
    assert!(
        shard_sum(&p, "lease.shard.steals", "w2", None) >= 2,
        "{p:#?}"
    );
    assert_eq!(shard_sum(&p, "lease.shard.steals", "w1", None), 0);
    for p in p.iter().filter(|p| p.name.starts_with("lease.shard.")) {
        assert_eq!(
            p.attrs.get("lease.shard.set").map(String::as_str),
            Some("orders")
        );
    }

    // w1's store hangs: its leases are lost, w2 takes everything.
    faulty.set_all(Fault::Hang);
    until("w2 owns all 4", || w2.assignment().len() == 4).await;
    until("w1's losses are reported", || {
        let p = h.snapshot();
        shard_sum(&p, "lease.shard.moves", "w1", Some("lost")) == 2
    })
    .await;
    let p = h.snapshot();
    assert_eq!(shard_sum(&p, "lease.shard.owned", "w1", None), 0);
    assert_eq!(shard_sum(&p, "lease.shard.owned", "w2", None), 4);

    w2.leave().await;
    let p = h.snapshot();
    Table::load().check(&p, false);
    assert_eq!(shard_sum(&p, "lease.shard.owned", "w2", None), 0);
    assert_eq!(shard_sum(&p, "lease.shard.moves", "w2", Some("leaving")), 4);
    assert_eq!(shard_sum(&p, "lease.shard.moves", "w2", Some("lost")), 0);
    drop(w1);
    Ok(())
}
