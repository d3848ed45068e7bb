//! The tracing side: spans carry `backend`, `key`, `owner`, `token`; a healthy steady state is
//! quiet at INFO; every loss is a WARN with its reason and the lease's fields; a stale-token
//! rejection is a WARN with both tokens. Captured with a small recording `Layer`, in paused time.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::supervisor::{Health, LossReason, Supervisor, SupervisorConfig};
use leasehold_core::{
    FencedResource, LeaseKey, MemoryFencedResource, MemoryLeaseStore, OwnerId, WriteOp,
};
use leasehold_otel::LeaseMetrics;
use leasehold_testkit::faulty::{Fault, FaultyStore, Operation};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

type Fields = BTreeMap<String, String>;

#[derive(Debug, Clone)]
struct Captured {
    level: Level,
    message: String,
    fields: Fields,
}

#[derive(Debug, Clone)]
struct SpanRec {
    name: String,
    fields: Fields,
}

#[derive(Default)]
struct Visitor(Fields);

impl Visit for Visitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

/// Records every event and every span's fields.
#[derive(Clone, Default)]
struct Capture {
    events: Arc<Mutex<Vec<Captured>>>,
    spans: Arc<Mutex<Vec<SpanRec>>>,
    index: Arc<Mutex<HashMap<Id, usize>>>,
}

impl Capture {
    fn events(&self) -> Vec<Captured> {
        self.events.lock().unwrap().clone()
    }
    fn spans(&self, name: &str) -> Vec<SpanRec> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut v = Visitor::default();
        attrs.record(&mut v);
        let mut spans = self.spans.lock().unwrap();
        spans.push(SpanRec {
            name: attrs.metadata().name().to_string(),
            fields: v.0,
        });
        self.index
            .lock()
            .unwrap()
            .insert(id.clone(), spans.len() - 1);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut v = Visitor::default();
        values.record(&mut v);
        if let Some(i) = self.index.lock().unwrap().get(id) {
            self.spans.lock().unwrap()[*i].fields.extend(v.0);
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut v = Visitor::default();
        event.record(&mut v);
        let message = v.0.remove("message").unwrap_or_default();
        self.events.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            message,
            fields: v.0,
        });
    }
}

fn fields(pairs: &[(&str, &str)]) -> Fields {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

fn has(actual: &Fields, expected: &Fields) -> bool {
    expected.iter().all(|(k, v)| actual.get(k) == Some(v))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn steady_state_is_quiet_and_every_loss_is_a_warn_with_its_fields()
-> Result<(), Box<dyn std::error::Error>> {
    let capture = Capture::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    // The no-op global meter: this test is about tracing only.
    let metrics = LeaseMetrics::global();
    let faulty = FaultyStore::new(MemoryLeaseStore::new());
    let store = metrics.store(faulty.clone());
    let resource = metrics.resource(MemoryFencedResource::new(), "memory");
    let key = LeaseKey::new("job")?;
    let cfg =
        SupervisorConfig::new(Duration::from_secs(3)).with_renew_interval(Duration::from_secs(1));
    let sup = Supervisor::new(store.clone(), cfg)
        .with_owner(OwnerId::new("worker-a")?)
        .with_hook(store.hook());
    let guard = sup.acquire(&key).await?.guard().ok_or("free")?;
    let token = guard.token().to_string();
    let lease_fields = fields(&[
        ("backend", "memory"),
        ("key", "job"),
        ("owner", "worker-a"),
        ("token", &token),
    ]);

    let acquire = capture.spans("lease.acquire");
    assert_eq!(acquire.len(), 1);
    assert!(has(&acquire[0].fields, &lease_fields), "{acquire:?}");
    assert_eq!(
        acquire[0].fields.get("outcome").map(String::as_str),
        Some("acquired")
    );

    // Five renewals in a healthy steady state: nothing at INFO or above.
    let before = capture.events().len();
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let steady: Vec<_> = capture.events()[before..].to_vec();
    let loud: Vec<_> = steady.iter().filter(|e| e.level <= Level::INFO).collect();
    assert!(
        loud.is_empty(),
        "steady state logged at INFO or above: {loud:?}"
    );
    let renews = capture.spans("lease.renew");
    assert_eq!(renews.len(), 5, "{renews:?}");
    for s in &renews {
        assert!(has(&s.fields, &lease_fields), "{s:?}");
        assert_eq!(s.fields.get("outcome").map(String::as_str), Some("renewed"));
    }
    assert!(
        steady
            .iter()
            .any(|e| e.level == Level::TRACE && e.message == "renewal confirmed"),
        "renewals are visible at TRACE: {steady:?}"
    );

    // The store stops answering: the loss is a WARN with the lease's fields and the reason.
    faulty.set(Operation::Renew, Fault::Hang);
    assert_eq!(
        guard.lost().await,
        Health::Lost(LossReason::DeadlineReached)
    );
    let events = capture.events();
    let lost: Vec<_> = events
        .iter()
        .filter(|e| e.message == "lease lost")
        .collect();
    assert_eq!(lost.len(), 1, "{events:?}");
    assert_eq!(lost[0].level, Level::WARN);
    let mut expected = lease_fields.clone();
    expected.insert("reason".into(), LossReason::DeadlineReached.to_string());
    assert!(has(&lost[0].fields, &expected), "{:?}", lost[0]);

    // A stale write is rejected: WARN with the presented and the newer token.
    let newer = guard.token().next()?;
    assert!(resource.install(&key, newer).await?.is_accepted());
    assert!(
        !resource
            .write(&key, guard.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    let events = capture.events();
    let stale: Vec<_> = events
        .iter()
        .filter(|e| e.message == "stale fencing token rejected")
        .collect();
    assert_eq!(stale.len(), 1, "{events:?}");
    assert_eq!(stale[0].level, Level::WARN);
    let newer_s = newer.to_string();
    assert!(
        has(
            &stale[0].fields,
            &fields(&[
                ("backend", "memory"),
                ("key", "job"),
                ("token", &token),
                ("high_water", &newer_s),
                ("operation", "write"),
            ])
        ),
        "{:?}",
        stale[0]
    );
    let writes = capture.spans("lease.fenced.write");
    assert_eq!(writes.len(), 1);
    assert_eq!(
        writes[0].fields.get("outcome").map(String::as_str),
        Some("rejected")
    );
    Ok(())
}
