//! The fenced-resource decorator: a span per write, stale-token rejections counted.

use async_trait::async_trait;
use leasehold_core::{
    FenceOp, FencedResource, FencingToken, LeaseKey, ResourceState, Result, WriteOp, WriteOutcome,
};
use opentelemetry::KeyValue;
use tracing::Instrument;
use tracing::field::{Empty, display};

use crate::metrics::LeaseMetrics;
use crate::names;

/// A [`FencedResource`] that forwards every call to `R`, in a DEBUG span (`lease.fenced.write`,
/// `lease.fenced.install`, `lease.fenced.read`) with the fields `backend`, `key`, `token` and
/// `outcome`, and counts `lease.fencing.rejections`.
///
/// Every rejection is a WARN event with `backend`, `key`, `token` and `high_water`: a stale
/// token reaching a resource means some holder kept acting after it lost its lease, and the
/// resource stopped it.
///
/// ```
/// use leasehold_core::{FencedResource, FencingToken, LeaseKey, MemoryFencedResource, WriteOp};
/// use leasehold_otel::LeaseMetrics;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let res = LeaseMetrics::global().resource(MemoryFencedResource::new(), "memory");
/// let key = LeaseKey::new("ledger")?;
/// assert!(res.write(&key, FencingToken::new(2)?, WriteOp::Add(1)).await?.is_accepted());
/// // Counted in `lease.fencing.rejections` and logged at WARN:
/// assert!(!res.write(&key, FencingToken::new(1)?, WriteOp::Add(1)).await?.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct InstrumentedResource<R> {
    inner: R,
    backend: &'static str,
    metrics: LeaseMetrics,
}

impl<R: FencedResource> InstrumentedResource<R> {
    /// Wraps `inner`; `backend` becomes the `lease.backend` attribute and span field.
    pub fn new(inner: R, backend: &'static str, metrics: LeaseMetrics) -> Self {
        InstrumentedResource {
            inner,
            backend,
            metrics,
        }
    }

    /// The wrapped resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// Unwraps the resource.
    pub fn into_inner(self) -> R {
        self.inner
    }

    fn observe(
        &self,
        span: &tracing::Span,
        key: &LeaseKey,
        operation: &'static str,
        result: &Result<WriteOutcome>,
    ) {
        match result {
            Ok(WriteOutcome::Accepted { .. }) => {
                span.record("outcome", "accepted");
            }
            Ok(WriteOutcome::Rejected {
                presented,
                high_water,
            }) => {
                span.record("outcome", "rejected");
                tracing::warn!(parent: span, backend = self.backend, key = %key, token = %presented, high_water = %high_water, operation, "stale fencing token rejected");
                let m = &self.metrics.inner;
                m.with_attrs(
                    [
                        KeyValue::new(names::ATTR_BACKEND, self.backend),
                        KeyValue::new(names::ATTR_FENCING_OPERATION, operation),
                    ],
                    Some(key),
                    |a| m.fencing_rejections.add(1, a),
                );
            }
            Err(e) => {
                span.record("outcome", "error");
                tracing::debug!(parent: span, error = %e, "fenced {operation} failed");
            }
        }
    }
}

fn op_name(op: &WriteOp) -> &'static str {
    match op {
        WriteOp::Put(_) => "put",
        WriteOp::Add(_) => "add",
        _ => "other",
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<R: FencedResource> FencedResource for InstrumentedResource<R> {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        let span = match &op {
            FenceOp::Write(w) => {
                tracing::debug_span!("lease.fenced.write", backend = self.backend, key = %key, token = %token, op = op_name(w), outcome = Empty)
            }
            _ => {
                tracing::debug_span!("lease.fenced.install", backend = self.backend, key = %key, token = %token, outcome = Empty)
            }
        };
        let name = op.name();
        let result = self
            .inner
            .apply(key, token, op)
            .instrument(span.clone())
            .await;
        self.observe(&span, key, name, &result);
        result
    }

    // `write` and `install` are provided by the trait; spelled out (through the instrumented
    // `apply`) because this impl denies `missing_trait_methods`, so a method added to the trait
    // later cannot go uninstrumented.
    async fn write(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: WriteOp,
    ) -> Result<WriteOutcome> {
        self.apply(key, token, FenceOp::Write(op)).await
    }

    async fn install(&self, key: &LeaseKey, token: FencingToken) -> Result<WriteOutcome> {
        self.apply(key, token, FenceOp::Install).await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        let span = tracing::debug_span!("lease.fenced.read", backend = self.backend, key = %key, token = Empty, outcome = Empty);
        let result = self.inner.read(key).instrument(span.clone()).await;
        match &result {
            Ok(state) => {
                if let Some(hw) = state.high_water {
                    span.record("token", display(hw));
                }
                span.record("outcome", "ok");
            }
            Err(e) => {
                span.record("outcome", "error");
                tracing::debug!(parent: &span, error = %e, "fenced read failed");
            }
        }
        result
    }
}
