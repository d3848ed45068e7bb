//! The instruments, built once from a [`Meter`] and shared by every decorator and hook.

use std::fmt;
use std::sync::Arc;

use leasehold_core::{Error, FencedResource, LeaseKey, LeaseStore};
use opentelemetry::metrics::{Counter, Histogram, Meter, ObservableGauge, UpDownCounter};
use opentelemetry::{InstrumentationScope, KeyValue};

use crate::config::OtelConfig;
use crate::held::HeldLeases;
use crate::hook::OtelHook;
use crate::names;
use crate::resource::InstrumentedResource;
use crate::store::InstrumentedStore;

/// Bucket boundaries (seconds) for store and renewal latencies.
const LATENCY_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Bucket boundaries (seconds) for acquire waits and the validity left at renewal.
const WAIT_BOUNDS: &[f64] = &[
    0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
/// Bucket boundaries (seconds) for hold durations: a second to a day.
const HOLD_BOUNDS: &[f64] = &[
    1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0,
];

/// The lease instruments of one meter: build once, clone freely (a cheap handle).
///
/// Everything this crate records goes through a `LeaseMetrics`: the store decorator
/// ([`LeaseMetrics::store`]), the fenced-resource decorator ([`LeaseMetrics::resource`]) and the
/// supervisor/election hook ([`LeaseMetrics::hook`]). The crate docs list every instrument.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{LeaseKey, MemoryLeaseStore};
/// use leasehold_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
/// use leasehold_otel::LeaseMetrics;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// // The application installs the SDK and an exporter; without one the global meter is a no-op.
/// let metrics = LeaseMetrics::global();
/// let store = metrics.store(MemoryLeaseStore::new());
/// let hook = store.hook();
/// let sup = Supervisor::new(store, SupervisorConfig::new(Duration::from_secs(10))).with_hook(hook);
/// if let Acquisition::Acquired(guard) = sup.acquire(&LeaseKey::new("nightly")?).await? {
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseMetrics {
    pub(crate) inner: Arc<Instruments>,
}

impl fmt::Debug for LeaseMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseMetrics")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Instruments {
    pub(crate) config: OtelConfig,
    pub(crate) acquire_attempts: Counter<u64>,
    pub(crate) acquire_wait: Histogram<f64>,
    pub(crate) operation_duration: Histogram<f64>,
    pub(crate) renewals: Counter<u64>,
    pub(crate) renewal_duration: Histogram<f64>,
    pub(crate) renewal_remaining: Histogram<f64>,
    pub(crate) lost: Counter<u64>,
    pub(crate) hold_duration: Histogram<f64>,
    pub(crate) held: UpDownCounter<i64>,
    pub(crate) leader_transitions: Counter<u64>,
    pub(crate) fencing_rejections: Counter<u64>,
    pub(crate) held_leases: Arc<HeldLeases>,
    _since_last_renewal: ObservableGauge<f64>,
}

impl LeaseMetrics {
    /// The instruments of `meter`, without the key attribute.
    pub fn new(meter: &Meter) -> Self {
        Self::with_config(meter, OtelConfig::default())
    }

    /// The instruments of `meter` with `config`.
    pub fn with_config(meter: &Meter, config: OtelConfig) -> Self {
        let held_leases = Arc::new(HeldLeases::default());
        let observed = held_leases.clone();
        let by_key = config.key_attribute();
        let held = meter
            .i64_up_down_counter(names::HELD)
            .with_unit("{lease}")
            .with_description("Supervised leases held now.")
            .build();
        let held_in_callback = held.clone();
        let since_last_renewal = meter
            .f64_observable_gauge(names::SINCE_LAST_RENEWAL)
            .with_unit("s")
            .with_description(
                "Time since the last confirmed renewal (or the grant) of supervised leases held now; the largest per attribute set.",
            )
            .with_callback(move |gauge| {
                let orphaned = |backend: &'static str, key: &LeaseKey| {
                    let b = KeyValue::new(names::ATTR_BACKEND, backend);
                    if by_key {
                        let k = KeyValue::new(names::ATTR_KEY, key.as_str().to_owned());
                        held_in_callback.add(-1, &[b, k]);
                    } else {
                        held_in_callback.add(-1, &[b]);
                    }
                };
                for (backend, key, secs) in observed.observe(by_key, orphaned) {
                    let backend = KeyValue::new(names::ATTR_BACKEND, backend);
                    match key {
                        Some(k) => gauge.observe(
                            secs,
                            &[backend, KeyValue::new(names::ATTR_KEY, k.as_str().to_owned())],
                        ),
                        None => gauge.observe(secs, &[backend]),
                    }
                }
            })
            .build();
        let instruments = Instruments {
            config,
            acquire_attempts: meter
                .u64_counter(names::ACQUIRE_ATTEMPTS)
                .with_unit("{attempt}")
                .with_description("Acquire calls to the store, by outcome.")
                .build(),
            acquire_wait: meter
                .f64_histogram(names::ACQUIRE_WAIT)
                .with_unit("s")
                .with_description(
                    "Time a supervised acquisition waited until it was granted or gave up.",
                )
                .with_boundaries(WAIT_BOUNDS.to_vec())
                .build(),
            operation_duration: meter
                .f64_histogram(names::OPERATION_DURATION)
                .with_unit("s")
                .with_description("Latency of store calls, by operation and outcome.")
                .with_boundaries(LATENCY_BOUNDS.to_vec())
                .build(),
            renewals: meter
                .u64_counter(names::RENEWALS)
                .with_unit("{renewal}")
                .with_description("Renewal attempts of the supervisor, by outcome.")
                .build(),
            renewal_duration: meter
                .f64_histogram(names::RENEWAL_DURATION)
                .with_unit("s")
                .with_description("Latency of supervisor renewal attempts, by outcome.")
                .with_boundaries(LATENCY_BOUNDS.to_vec())
                .build(),
            renewal_remaining: meter
                .f64_histogram(names::RENEWAL_REMAINING)
                .with_unit("s")
                .with_description("Local validity left when a renewal was confirmed.")
                .with_boundaries(WAIT_BOUNDS.to_vec())
                .build(),
            lost: meter
                .u64_counter(names::LOST)
                .with_unit("{lease}")
                .with_description("Supervised leases lost, by reason.")
                .build(),
            hold_duration: meter
                .f64_histogram(names::HOLD_DURATION)
                .with_unit("s")
                .with_description("How long supervised leases were held, by how they ended.")
                .with_boundaries(HOLD_BOUNDS.to_vec())
                .build(),
            held,
            leader_transitions: meter
                .u64_counter(names::LEADER_TRANSITIONS)
                .with_unit("{transition}")
                .with_description(
                    "Leadership changes of election candidates (elected, stepped down).",
                )
                .build(),
            fencing_rejections: meter
                .u64_counter(names::FENCING_REJECTIONS)
                .with_unit("{write}")
                .with_description(
                    "Writes and installs a fenced resource rejected for a stale token.",
                )
                .build(),
            held_leases,
            _since_last_renewal: since_last_renewal,
        };
        LeaseMetrics {
            inner: Arc::new(instruments),
        }
    }

    /// The instruments of the global meter provider (scope `leasehold-otel`), without the key
    /// attribute. A no-op until the application installs a meter provider, so build this
    /// *after* `opentelemetry::global::set_meter_provider`.
    pub fn global() -> Self {
        Self::global_with_config(OtelConfig::default())
    }

    /// The instruments of the global meter provider with `config`.
    pub fn global_with_config(config: OtelConfig) -> Self {
        let scope = InstrumentationScope::builder("leasehold-otel")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        Self::with_config(&opentelemetry::global::meter_with_scope(scope), config)
    }

    /// The configuration.
    pub fn config(&self) -> OtelConfig {
        self.inner.config
    }

    /// Wraps `store` so that every call gets a span and its metrics.
    pub fn store<S: LeaseStore>(&self, store: S) -> InstrumentedStore<S> {
        InstrumentedStore::new(store, self.clone())
    }

    /// Wraps `resource` so that every fenced write gets a span and stale-token rejections are
    /// counted. `backend` names where the resource lives (it becomes `lease.backend`).
    pub fn resource<R: FencedResource>(
        &self,
        resource: R,
        backend: &'static str,
    ) -> InstrumentedResource<R> {
        InstrumentedResource::new(resource, backend, self.clone())
    }

    /// A hook for [`Supervisor::with_hook`](leasehold_core::supervisor::Supervisor::with_hook) and
    /// [`Election::with_hook`](leasehold_core::election::Election::with_hook), recording with
    /// `lease.backend = backend`.
    pub fn hook(&self, backend: &'static str) -> Arc<OtelHook> {
        Arc::new(OtelHook::new(backend, self.clone()))
    }
}

impl Instruments {
    /// Calls `f` with `base` plus, if configured, the `lease.key` attribute.
    pub(crate) fn with_attrs<const N: usize>(
        &self,
        base: [KeyValue; N],
        key: Option<&LeaseKey>,
        f: impl FnOnce(&[KeyValue]),
    ) {
        match key.filter(|_| self.config.key_attribute()) {
            None => f(&base),
            Some(k) => {
                let mut all = Vec::with_capacity(N + 1);
                all.extend(base);
                all.push(KeyValue::new(names::ATTR_KEY, k.as_str().to_owned()));
                f(&all);
            }
        }
    }
}

/// The `error.type` value of an error: its [`ErrorKind`](leasehold_core::ErrorKind) label.
pub(crate) fn error_type(e: &Error) -> &'static str {
    e.kind().as_str()
}
