//! The shard hook: shards owned per worker, moves by reason, steal requests.

use std::sync::Arc;

use leasehold_core::{FencingToken, Lease};
use leasehold_shard::{RevokeReason, ShardHook};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Meter, UpDownCounter};

use crate::names;

/// A [`ShardHook`] recording a [`ShardSet`](leasehold_shard::ShardSet)'s metrics: shards owned now
/// per worker (`lease.shard.owned`), ownership ends by reason (`lease.shard.moves`) and steal
/// requests (`lease.shard.steals`). Every data point carries `lease.backend`, `lease.shard.set`
/// and `lease.shard.worker` (worker ids are as many as the fleet, so bounded).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use leasehold_core::MemoryLeaseStore;
/// use leasehold_otel::ShardMetrics;
/// use leasehold_shard::{ShardEvent, ShardSet, ShardSetConfig};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// // After `opentelemetry::global::set_meter_provider(..)`:
/// let meter = opentelemetry::global::meter("app");
/// let store = Arc::new(MemoryLeaseStore::new());
/// let hook = ShardMetrics::new(&meter, "memory", "orders");
/// let set = ShardSet::new(store, "orders", &["p0", "p1"], ShardSetConfig::new(Duration::from_secs(3)))?
///     .with_shard_hook(Arc::new(hook));
/// let mut w = set.join("worker-a")?;
/// assert!(matches!(w.next_event().await, Some(ShardEvent::Assigned { .. })));
/// w.leave().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ShardMetrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: KeyValue,
    set: KeyValue,
    owned: UpDownCounter<i64>,
    moves: Counter<u64>,
    steals: Counter<u64>,
}

impl ShardMetrics {
    /// The shard instruments of `meter`, recording with `lease.backend = backend` and
    /// `lease.shard.set = set`.
    pub fn new(meter: &Meter, backend: &'static str, set: &str) -> Self {
        ShardMetrics {
            inner: Arc::new(Inner {
                backend: KeyValue::new(names::ATTR_BACKEND, backend),
                set: KeyValue::new(names::ATTR_SHARD_SET, set.to_owned()),
                owned: meter
                    .i64_up_down_counter(names::SHARD_OWNED)
                    .with_unit("{shard}")
                    .with_description("Shards a worker owns now.")
                    .build(),
                moves: meter
                    .u64_counter(names::SHARD_MOVES)
                    .with_unit("{shard}")
                    .with_description("Shard ownerships that ended, by reason.")
                    .build(),
                steals: meter
                    .u64_counter(names::SHARD_STEALS)
                    .with_unit("{steal}")
                    .with_description("Handover requests a worker left with a more loaded one.")
                    .build(),
            }),
        }
    }

    fn attrs(&self, worker: &str) -> [KeyValue; 3] {
        [
            self.inner.backend.clone(),
            self.inner.set.clone(),
            KeyValue::new(names::ATTR_SHARD_WORKER, worker.to_owned()),
        ]
    }
}

/// The `lease.shard.reason` value of a revocation.
fn reason_label(reason: &RevokeReason) -> &'static str {
    match reason {
        RevokeReason::Handoff { .. } => "handoff",
        RevokeReason::Lost(_) => "lost",
        RevokeReason::Leaving => "leaving",
        _ => "other",
    }
}

impl ShardHook for ShardMetrics {
    fn assigned(&self, worker: &str, _shard: &str, _lease: &Lease) {
        self.inner.owned.add(1, &self.attrs(worker));
    }

    fn revoked(&self, worker: &str, _shard: &str, _token: FencingToken, reason: &RevokeReason) {
        let a = self.attrs(worker);
        self.inner.owned.add(-1, &a);
        let [b, s, w] = a;
        let r = KeyValue::new(names::ATTR_SHARD_REASON, reason_label(reason));
        self.inner.moves.add(1, &[b, s, w, r]);
    }

    fn steal_requested(&self, thief: &str, _victim: &str, _shard: &str) {
        self.inner.steals.add(1, &self.attrs(thief));
    }
}
