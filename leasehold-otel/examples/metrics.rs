//! A leader election on the in-memory store with the OpenTelemetry SDK and a stdout exporter
//! installed: the metrics a real deployment would export, printed live every two seconds.
//!
//! ```text
//! cargo run -p leasehold-otel --example metrics              # about 8 s
//! cargo run -p leasehold-otel --example metrics -- --seconds 20
//! RUST_LOG=debug cargo run -p leasehold-otel --example metrics   # with the DEBUG spans' events
//! ```
//!
//! Three nodes campaign for `scheduler` (TTL 1 s). The leader increments a fenced counter with
//! its term every 100 ms. After 1.5 s the leader is cut off from the store (its renewals hang):
//! it loses its lease (`lease.lost{lease.loss.reason=deadline_reached}`) and, like a process that
//! was paused, tries one more write with its old term a little later, which the resource rejects
//! (`lease.fencing.rejections`). Another node takes over (`lease.leader.transitions`). Later the
//! new leader resigns and hands over at once. Watch `lease.renewal.remaining`,
//! `lease.since_last_renewal` and `lease.held` as it goes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::election::{Election, ElectionEvent};
use leasehold_core::supervisor::SupervisorConfig;
use leasehold_core::{
    FencedResource, LeaseKey, MemoryFencedResource, MemoryLeaseStore, OwnerId, WriteOp,
};
use leasehold_otel::{InstrumentedResource, LeaseMetrics};
use leasehold_testkit::faulty::{Fault, FaultyStore};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use tokio::sync::oneshot;

type Res = Arc<InstrumentedResource<MemoryFencedResource>>;

/// One node: its own (fault-injectable) connection to the shared store and its campaign task.
struct Node {
    name: &'static str,
    faulty: FaultyStore<MemoryLeaseStore>,
    resign: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args()
        .skip_while(|a| a != "--seconds")
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(8);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        .init();

    // The application's part: the SDK, an exporter, the global meter provider.
    let provider = SdkMeterProvider::builder()
        .with_reader(
            PeriodicReader::builder(opentelemetry_stdout::MetricExporter::default())
                .with_interval(Duration::from_secs(2))
                .build(),
        )
        .with_resource(
            Resource::builder()
                .with_service_name("leasehold-otel-example")
                .build(),
        )
        .build();
    opentelemetry::global::set_meter_provider(provider.clone());

    // The library's part: instruments from the global provider, decorators, hooks.
    let metrics = LeaseMetrics::global();
    let memory = MemoryLeaseStore::new();
    let resource: Res = Arc::new(metrics.resource(MemoryFencedResource::new(), "memory"));
    let key = LeaseKey::new("scheduler")?;
    let config = SupervisorConfig::new(Duration::from_secs(1));
    let leader: Arc<Mutex<Option<usize>>> = Arc::default();

    let mut nodes = Vec::new();
    for (i, name) in ["node-1", "node-2", "node-3"].into_iter().enumerate() {
        let faulty = FaultyStore::new(memory.clone());
        let store = metrics.store(faulty.clone());
        let election =
            Election::new(store.clone(), key.clone(), config.clone()).with_hook(store.hook());
        let candidate = election.join(OwnerId::with_label(name));
        let (resign, resigned) = oneshot::channel();
        let task = tokio::spawn(campaign(
            i,
            candidate,
            resigned,
            resource.clone(),
            key.clone(),
            leader.clone(),
        ));
        nodes.push(Node {
            name,
            faulty,
            resign: Some(resign),
            task,
        });
        // Let node-1 win the first round, so the story reads the same every time.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let current = *leader.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = current {
        println!(">>> cutting {} off from the store", nodes[i].name);
        nodes[i].faulty.set_all(Fault::Hang);
        tokio::time::sleep(Duration::from_secs(3)).await;
        println!(">>> {} reconnects", nodes[i].name);
        nodes[i].faulty.heal();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let current = *leader.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = current {
        println!(">>> {} resigns", nodes[i].name);
        if let Some(tx) = nodes[i].resign.take() {
            let _ = tx.send(());
        }
    }
    tokio::time::sleep(Duration::from_secs(seconds.saturating_sub(6).max(1))).await;

    println!(">>> shutting down");
    for node in &mut nodes {
        if let Some(tx) = node.resign.take() {
            let _ = tx.send(());
        }
    }
    for node in nodes {
        let _ = node.task.await;
    }
    let state = resource.read(&key).await?;
    println!(
        ">>> fenced counter {} after {} accepted writes, high-water term {:?}",
        state.counter,
        state.accepted,
        state.high_water.map(|t| t.get())
    );
    provider.shutdown()?; // exports the final values
    Ok(())
}

/// Campaigns; while leading, writes with the term every 100 ms. After losing the lease it acts
/// like a process that was paused: one late write with the old term, which must be rejected.
async fn campaign(
    me: usize,
    mut candidate: leasehold_core::election::Candidate,
    mut resigned: oneshot::Receiver<()>,
    resource: Res,
    key: LeaseKey,
    leader: Arc<Mutex<Option<usize>>>,
) {
    loop {
        let event = tokio::select! {
            e = candidate.next_event() => e,
            _ = &mut resigned => {
                candidate.resign().await;
                return;
            }
        };
        match event {
            Some(ElectionEvent::Elected { term, work, .. }) => {
                *leader.lock().unwrap_or_else(|p| p.into_inner()) = Some(me);
                let (res, key) = (resource.clone(), key.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(100));
                    loop {
                        tokio::select! {
                            _ = work.cancelled() => return,
                            _ = tick.tick() => {
                                let _ = res.write(&key, term, WriteOp::Add(1)).await;
                            }
                        }
                    }
                });
            }
            Some(ElectionEvent::SteppedDown { term, reason }) => {
                {
                    let mut l = leader.lock().unwrap_or_else(|p| p.into_inner());
                    if *l == Some(me) {
                        *l = None;
                    }
                }
                if reason.to_string().starts_with("lost") {
                    let (res, key) = (resource.clone(), key.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                        let _ = res.write(&key, term, WriteOp::Add(1)).await;
                    });
                }
            }
            Some(_) => {}
            None => return,
        }
    }
}
