//! The whole conformance suite through the decorators: `InstrumentedStore` over the memory
//! store and `InstrumentedResource` over the memory resource must behave exactly like them.
//!
//! The instruments come from an SDK meter provider with an in-memory exporter, so every call
//! really records; the suite itself is unchanged. No service is needed.

use std::sync::{Arc, OnceLock};

use leasehold_core::{FencedResource, LeaseStore, MemoryFencedResource, MemoryLeaseStore};
use leasehold_otel::{LeaseMetrics, OtelConfig};
use leasehold_testkit::{Backend, BoxFuture};
use opentelemetry::metrics::MeterProvider;
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

/// One shared store and resource, instrumented; every "client" is a handle to the same state.
#[derive(Debug)]
struct Instrumented {
    store: MemoryLeaseStore,
    resource: MemoryFencedResource,
    metrics: LeaseMetrics,
}

fn provider() -> &'static SdkMeterProvider {
    static PROVIDER: OnceLock<SdkMeterProvider> = OnceLock::new();
    PROVIDER.get_or_init(|| {
        SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(InMemoryMetricExporter::default()).build())
            .build()
    })
}

impl Backend for Instrumented {
    fn name(&self) -> &'static str {
        "memory+otel"
    }
    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async {
            Ok(Arc::new(self.metrics.store(self.store.clone())) as Arc<dyn LeaseStore>)
        })
    }
    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(
                Arc::new(self.metrics.resource(self.resource.clone(), "memory"))
                    as Arc<dyn FencedResource>,
            )
        })
    }
}

fn main() {
    let meter = provider().meter("leasehold-otel-conformance");
    let metrics = LeaseMetrics::with_config(&meter, OtelConfig::new().with_key_attribute());
    leasehold_testkit::run(Instrumented {
        store: MemoryLeaseStore::new(),
        resource: MemoryFencedResource::new(),
        metrics,
    });
}
