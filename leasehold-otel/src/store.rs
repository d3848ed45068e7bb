//! The store decorator: a span per call, call latency, acquire attempts.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, HeldBy, KeyState, KeyWatch, Lease, LeaseKey,
    LeaseStore, ReleaseOutcome, RenewOutcome, Result,
};
use opentelemetry::KeyValue;
use tokio::time::Instant;
use tracing::field::{Empty, display};
use tracing::{Instrument, Span};

use crate::hook::OtelHook;
use crate::metrics::{Instruments, LeaseMetrics, error_type};
use crate::names;

/// A [`LeaseStore`] that forwards every call to `S`, wrapped in a `tracing` span and measured.
///
/// Per call it records `lease.operation.duration` (and, for acquire, `lease.acquire.attempts`),
/// and opens a DEBUG span (`lease.acquire`, `lease.renew`, `lease.release`, `lease.inspect`,
/// `lease.watch`) with the fields `backend`, `key`, `owner`, `token` and `outcome`. Grants,
/// releases and refusals are DEBUG events, renewals TRACE: the decorator never logs above DEBUG,
/// because whether a refusal is a *loss* is the supervisor's judgement (it logs losses at WARN).
/// A call whose future is dropped before it finished (a caller's timeout) is recorded with
/// `lease.outcome = error`, `error.type = cancelled`.
///
/// Semantics are exactly the inner store's: the conformance suite runs unchanged over it.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId};
/// use leasehold_otel::LeaseMetrics;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = LeaseMetrics::global().store(MemoryLeaseStore::new());
/// let req = AcquireRequest::new(LeaseKey::new("report")?, OwnerId::random(), Duration::from_secs(5));
/// let lease = store.acquire(&req).await?.lease().expect("free key");
/// assert_eq!(store.backend(), "memory");
/// let _ = store.release(&lease).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct InstrumentedStore<S> {
    inner: S,
    metrics: LeaseMetrics,
}

impl<S: LeaseStore> InstrumentedStore<S> {
    /// Wraps `inner`, recording into `metrics`.
    pub fn new(inner: S, metrics: LeaseMetrics) -> Self {
        InstrumentedStore { inner, metrics }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Unwraps the store.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The instruments this store records into.
    pub fn metrics(&self) -> &LeaseMetrics {
        &self.metrics
    }

    /// A supervisor/election hook recording into the same instruments, labelled with this
    /// store's backend.
    pub fn hook(&self) -> Arc<OtelHook> {
        self.metrics.hook(self.inner.backend())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Acquire,
    AcquireMany,
    Renew,
    RenewMany,
    Release,
    Inspect,
    InspectMany,
    HoldersMany,
    Watch,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::AcquireMany => "acquire_many",
            Op::Renew => "renew",
            Op::RenewMany => "renew_many",
            Op::Release => "release",
            Op::Inspect => "inspect",
            Op::InspectMany => "inspect_many",
            Op::HoldersMany => "holders_many",
            Op::Watch => "watch",
        }
    }
}

/// One measured call; records on `finish`, or as cancelled when dropped unfinished.
struct Call<'a> {
    metrics: &'a Instruments,
    backend: &'static str,
    op: Op,
    /// `None` for a batch (several keys): never a `lease.key` attribute then.
    key: Option<&'a LeaseKey>,
    started: Instant,
    done: bool,
}

impl<'a> Call<'a> {
    fn start(
        metrics: &'a Instruments,
        backend: &'static str,
        op: Op,
        key: Option<&'a LeaseKey>,
    ) -> Self {
        Call {
            metrics,
            backend,
            op,
            key,
            started: Instant::now(),
            done: false,
        }
    }

    fn finish(mut self, outcome: &'static str, error: Option<&'static str>) {
        self.done = true;
        self.record(outcome, error);
    }

    fn record(&self, outcome: &'static str, error: Option<&'static str>) {
        let m = self.metrics;
        let secs = self.started.elapsed().as_secs_f64();
        let backend = KeyValue::new(names::ATTR_BACKEND, self.backend);
        let op = KeyValue::new(names::ATTR_OPERATION, self.op.name());
        let out = KeyValue::new(names::ATTR_OUTCOME, outcome);
        let key = self.key;
        match error {
            None => {
                if self.op == Op::Acquire {
                    m.with_attrs([backend.clone(), out.clone()], key, |a| {
                        m.acquire_attempts.add(1, a);
                    });
                }
                m.with_attrs([backend, op, out], key, |a| {
                    m.operation_duration.record(secs, a);
                });
            }
            Some(kind) => {
                let err = KeyValue::new(names::ATTR_ERROR_TYPE, kind);
                if self.op == Op::Acquire {
                    m.with_attrs([backend.clone(), out.clone(), err.clone()], key, |a| {
                        m.acquire_attempts.add(1, a);
                    });
                }
                m.with_attrs([backend, op, out, err], key, |a| {
                    m.operation_duration.record(secs, a);
                });
            }
        }
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            self.record("error", Some("cancelled"));
            tracing::debug!(backend = self.backend, key = ?self.key.map(LeaseKey::as_str), operation = self.op.name(), "store call cancelled before it finished");
        }
    }
}

fn failed(call: Call<'_>, span: &Span, e: &leasehold_core::Error) {
    span.record("outcome", "error");
    tracing::debug!(parent: span, error = %e, "store call failed");
    call.finish("error", Some(error_type(e)));
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: LeaseStore> LeaseStore for InstrumentedStore<S> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let backend = self.inner.backend();
        let span = tracing::debug_span!("lease.acquire", backend, key = %req.key, owner = %req.owner, token = Empty, outcome = Empty);
        let call = Call::start(&self.metrics.inner, backend, Op::Acquire, Some(&req.key));
        let result = self.inner.acquire(req).instrument(span.clone()).await;
        match &result {
            Ok(AcquireOutcome::Acquired(lease)) => {
                span.record("token", display(lease.token()));
                span.record("outcome", "acquired");
                tracing::debug!(parent: &span, ttl = ?lease.ttl(), "lease granted");
                call.finish("acquired", None);
            }
            Ok(AcquireOutcome::Held(holder)) => {
                span.record("outcome", "held");
                tracing::trace!(parent: &span, holder = %holder.owner, holder_token = %holder.token, remaining = ?holder.remaining, "key held by another owner");
                call.finish("held", None);
            }
            Err(e) => failed(call, &span, e),
        }
        result
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        let backend = self.inner.backend();
        let span = tracing::debug_span!("lease.renew", backend, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), outcome = Empty);
        let call = Call::start(&self.metrics.inner, backend, Op::Renew, Some(lease.key()));
        let result = self.inner.renew(lease).instrument(span.clone()).await;
        match &result {
            Ok(RenewOutcome::Renewed(l)) => {
                span.record("outcome", "renewed");
                tracing::trace!(parent: &span, ttl = ?l.ttl(), "lease renewed");
                call.finish("renewed", None);
            }
            Ok(RenewOutcome::Lost) => {
                span.record("outcome", "lost");
                tracing::debug!(parent: &span, "renewal refused: the lease is gone");
                call.finish("lost", None);
            }
            Err(e) => failed(call, &span, e),
        }
        result
    }

    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        let backend = self.inner.backend();
        let span = tracing::debug_span!(
            "lease.acquire_many",
            backend,
            count = reqs.len(),
            acquired = Empty,
            held = Empty,
            failed = Empty,
            outcome = Empty
        );
        let call = Call::start(&self.metrics.inner, backend, Op::AcquireMany, None);
        let result = self.inner.acquire_many(reqs).instrument(span.clone()).await;
        match &result {
            Ok(outcomes) => {
                let (mut acquired, mut held, mut failed) = (0usize, 0usize, 0usize);
                for (req, outcome) in reqs.iter().zip(outcomes) {
                    let (what, token) = match outcome {
                        Ok(AcquireOutcome::Acquired(lease)) => {
                            acquired += 1;
                            ("acquired", Some(lease.token()))
                        }
                        Ok(AcquireOutcome::Held(holder)) => {
                            held += 1;
                            ("held", Some(holder.token))
                        }
                        Err(_) => {
                            failed += 1;
                            ("error", None)
                        }
                    };
                    tracing::trace!(parent: &span, key = %req.key, owner = %req.owner, token = ?token, outcome = what, "batched acquire");
                }
                span.record("acquired", acquired);
                span.record("held", held);
                span.record("failed", failed);
                span.record("outcome", "completed");
                call.finish("completed", None);
            }
            Err(e) => failed(call, &span, e),
        }
        result
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        let backend = self.inner.backend();
        let span = tracing::debug_span!(
            "lease.renew_many",
            backend,
            count = leases.len(),
            renewed = Empty,
            lost = Empty,
            failed = Empty,
            outcome = Empty
        );
        let call = Call::start(&self.metrics.inner, backend, Op::RenewMany, None);
        let result = self.inner.renew_many(leases).instrument(span.clone()).await;
        match &result {
            Ok(outcomes) => {
                let (mut renewed, mut lost, mut failed) = (0usize, 0usize, 0usize);
                for (lease, outcome) in leases.iter().zip(outcomes) {
                    let what = match outcome {
                        Ok(RenewOutcome::Renewed(_)) => {
                            renewed += 1;
                            "renewed"
                        }
                        Ok(RenewOutcome::Lost) => {
                            lost += 1;
                            "lost"
                        }
                        Err(_) => {
                            failed += 1;
                            "error"
                        }
                    };
                    tracing::trace!(parent: &span, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), outcome = what, "batched renewal");
                }
                span.record("renewed", renewed);
                span.record("lost", lost);
                span.record("failed", failed);
                span.record("outcome", "completed");
                call.finish("completed", None);
            }
            Err(e) => failed(call, &span, e),
        }
        result
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let backend = self.inner.backend();
        let span = tracing::debug_span!("lease.release", backend, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), outcome = Empty);
        let call = Call::start(&self.metrics.inner, backend, Op::Release, Some(lease.key()));
        let result = self.inner.release(lease).instrument(span.clone()).await;
        match &result {
            Ok(ReleaseOutcome::Released) => {
                span.record("outcome", "released");
                tracing::debug!(parent: &span, "lease released");
                call.finish("released", None);
            }
            Ok(ReleaseOutcome::NotHeld) => {
                span.record("outcome", "not_held");
                tracing::debug!(parent: &span, "release of a lease that was not held");
                call.finish("not_held", None);
            }
            Err(e) => failed(call, &span, e),
        }
        result
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        let backend = self.inner.backend();
        let span = tracing::debug_span!("lease.inspect", backend, key = %key, owner = Empty, token = Empty, outcome = Empty);
        let call = Call::start(&self.metrics.inner, backend, Op::Inspect, Some(key));
        let result = self.inner.inspect(key).instrument(span.clone()).await;
        match &result {
            Ok(state) => {
                let outcome = match &state.holder {
                    Some(h) => {
                        span.record("owner", display(&h.owner));
                        span.record("token", display(h.token));
                        "held"
                    }
                    None => "free",
                };
                span.record("outcome", outcome);
                call.finish(outcome, None);
            }
            Err(e) => failed(call, &span, e),
        }
        result
    }

    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        let backend = self.inner.backend();
        let span = tracing::debug_span!(
            "lease.inspect_many",
            backend,
            count = keys.len(),
            held = Empty,
            outcome = Empty
        );
        let call = Call::start(&self.metrics.inner, backend, Op::InspectMany, None);
        let result = self.inner.inspect_many(keys).instrument(span.clone()).await;
        match &result {
            Ok(states) => {
                let held = states.iter().filter(|s| s.holder.is_some()).count();
                span.record("held", held);
                span.record("outcome", "completed");
                call.finish("completed", None);
            }
            Err(e) => failed(call, &span, e),
        }
        result
    }

    async fn holders_many(&self, keys: &[LeaseKey]) -> Result<Vec<Option<HeldBy>>> {
        let backend = self.inner.backend();
        let span = tracing::debug_span!(
            "lease.holders_many",
            backend,
            count = keys.len(),
            held = Empty,
            outcome = Empty
        );
        let call = Call::start(&self.metrics.inner, backend, Op::HoldersMany, None);
        let result = self.inner.holders_many(keys).instrument(span.clone()).await;
        match &result {
            Ok(holders) => {
                span.record("held", holders.iter().filter(|h| h.is_some()).count());
                span.record("outcome", "completed");
                call.finish("completed", None);
            }
            Err(e) => failed(call, &span, e),
        }
        result
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        let backend = self.inner.backend();
        let span = tracing::debug_span!("lease.watch", backend, key = %key, outcome = Empty);
        let call = Call::start(&self.metrics.inner, backend, Op::Watch, Some(key));
        let result = self.inner.watch(key).instrument(span.clone()).await;
        match &result {
            Ok(w) => {
                let outcome = if w.is_some() {
                    "watching"
                } else {
                    "unsupported"
                };
                span.record("outcome", outcome);
                call.finish(outcome, None);
            }
            Err(e) => failed(call, &span, e),
        }
        result
    }
}
