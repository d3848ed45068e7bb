//! The supervisor and election hook: renewals, losses, hold times, leadership.

use std::time::Duration;

use leasehold_core::supervisor::{Health, Hook, LossReason, RenewalResult};
use leasehold_core::{FencingToken, Lease, LeaseKey, OwnerId, ReleaseOutcome};
use opentelemetry::KeyValue;

use crate::metrics::LeaseMetrics;
use crate::names;

/// A [`Hook`] recording the supervisor's and the election's metrics: acquire waits, renewals
/// (count, latency, validity left), time since the last confirmed renewal, losses by reason,
/// hold durations, leases held, leader transitions.
///
/// It adds no log lines of its own above TRACE: the supervisor already logs every health change
/// (a loss at WARN with `backend`, `key`, `owner`, `token` and `reason`) and the election every
/// leadership change. Confirmed renewals are TRACE events here.
///
/// A lease reported as acquired but never ended (the supervisor's fence install was refused) is
/// dropped from `lease.held` and `lease.since_last_renewal` one second past its local deadline.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{LeaseKey, MemoryLeaseStore};
/// use leasehold_core::election::{Election, ElectionEvent};
/// use leasehold_core::supervisor::SupervisorConfig;
/// use leasehold_otel::LeaseMetrics;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let metrics = LeaseMetrics::global();
/// let store = metrics.store(MemoryLeaseStore::new());
/// let hook = store.hook();
/// let election = Election::new(store, LeaseKey::new("scheduler")?, SupervisorConfig::new(Duration::from_secs(5)))
///     .with_hook(hook);
/// let mut me = election.join(leasehold_core::OwnerId::with_label("node-1"));
/// assert!(matches!(me.next_event().await, Some(ElectionEvent::Elected { .. })));
/// me.resign().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct OtelHook {
    backend: &'static str,
    metrics: LeaseMetrics,
}

impl OtelHook {
    /// A hook recording into `metrics` with `lease.backend = backend`.
    pub fn new(backend: &'static str, metrics: LeaseMetrics) -> Self {
        OtelHook { backend, metrics }
    }

    /// The backend label.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    fn backend_kv(&self) -> KeyValue {
        KeyValue::new(names::ATTR_BACKEND, self.backend)
    }

    fn forget(&self, lease: &Lease) {
        let m = &self.metrics.inner;
        if m.held_leases.remove(self.backend, lease) {
            m.with_attrs([self.backend_kv()], Some(lease.key()), |a| {
                m.held.add(-1, a)
            });
        }
    }
}

fn renewal_outcome(result: RenewalResult) -> &'static str {
    match result {
        RenewalResult::Confirmed { .. } => "confirmed",
        RenewalResult::Refused => "refused",
        RenewalResult::Failed => "failed",
        RenewalResult::TimedOut => "timed_out",
        _ => "other",
    }
}

/// The `lease.loss.reason` value of a loss reason.
pub(crate) fn loss_reason(reason: LossReason) -> &'static str {
    match reason {
        LossReason::RenewalRefused => "renewal_refused",
        LossReason::DeadlineReached => "deadline_reached",
        LossReason::StoreError => "store_error",
        LossReason::NotHeldAtRelease => "not_held_at_release",
        LossReason::RenewalTaskEnded => "renewal_task_ended",
        _ => "other",
    }
}

impl Hook for OtelHook {
    fn acquired(&self, lease: &Lease, waited: Duration) {
        let m = &self.metrics.inner;
        m.with_attrs(
            [
                self.backend_kv(),
                KeyValue::new(names::ATTR_OUTCOME, "acquired"),
            ],
            Some(lease.key()),
            |a| m.acquire_wait.record(waited.as_secs_f64(), a),
        );
        if m.held_leases.insert(self.backend, lease) {
            m.with_attrs([self.backend_kv()], Some(lease.key()), |a| m.held.add(1, a));
        }
    }

    fn not_acquired(&self, key: &LeaseKey, waited: Duration) {
        let m = &self.metrics.inner;
        m.with_attrs(
            [
                self.backend_kv(),
                KeyValue::new(names::ATTR_OUTCOME, "not_acquired"),
            ],
            Some(key),
            |a| m.acquire_wait.record(waited.as_secs_f64(), a),
        );
    }

    fn renewal(&self, lease: &Lease, result: RenewalResult, latency: Duration) {
        let m = &self.metrics.inner;
        let outcome = KeyValue::new(names::ATTR_OUTCOME, renewal_outcome(result));
        m.with_attrs([self.backend_kv(), outcome], Some(lease.key()), |a| {
            m.renewals.add(1, a);
            m.renewal_duration.record(latency.as_secs_f64(), a);
        });
        if let RenewalResult::Confirmed { remaining_before } = result {
            m.with_attrs([self.backend_kv()], Some(lease.key()), |a| {
                m.renewal_remaining
                    .record(remaining_before.as_secs_f64(), a);
            });
            m.held_leases.confirmed(self.backend, lease);
            tracing::trace!(backend = self.backend, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), remaining_before = ?remaining_before, latency = ?latency, "renewal confirmed");
        }
    }

    fn health_changed(&self, lease: &Lease, from: Health, to: Health) {
        let _ = from;
        let m = &self.metrics.inner;
        if let Health::Lost(reason) = to {
            m.with_attrs(
                [
                    self.backend_kv(),
                    KeyValue::new(names::ATTR_LOSS_REASON, loss_reason(reason)),
                ],
                Some(lease.key()),
                |a| m.lost.add(1, a),
            );
        }
        if to.is_final() {
            self.forget(lease);
        }
    }

    fn ended(&self, lease: &Lease, held_for: Duration, released: Option<ReleaseOutcome>) {
        let m = &self.metrics.inner;
        let how = match released {
            Some(ReleaseOutcome::Released) => "released",
            _ => "lost",
        };
        m.with_attrs(
            [self.backend_kv(), KeyValue::new(names::ATTR_OUTCOME, how)],
            Some(lease.key()),
            |a| m.hold_duration.record(held_for.as_secs_f64(), a),
        );
        self.forget(lease);
    }

    fn leadership(&self, key: &LeaseKey, candidate: &OwnerId, term: Option<FencingToken>) {
        let _ = candidate;
        let m = &self.metrics.inner;
        let event = if term.is_some() {
            "elected"
        } else {
            "stepped_down"
        };
        m.with_attrs(
            [
                self.backend_kv(),
                KeyValue::new(names::ATTR_LEADER_EVENT, event),
            ],
            Some(key),
            |a| m.leader_transitions.add(1, a),
        );
    }
}
