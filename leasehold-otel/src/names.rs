//! The names of every instrument and attribute this crate records, for dashboards and alerts.
//!
//! The crate docs hold the full table (kind, unit, attributes, meaning).

/// Counter of acquire calls that reached the store decorator, by `lease.outcome`.
pub const ACQUIRE_ATTEMPTS: &str = "lease.acquire.attempts";
/// Histogram of the time a supervised acquisition waited before it ended, by `lease.outcome`.
pub const ACQUIRE_WAIT: &str = "lease.acquire.wait";
/// Histogram of the latency of every store call, by `lease.operation` and `lease.outcome`.
pub const OPERATION_DURATION: &str = "lease.operation.duration";
/// Counter of supervisor renewal attempts, by `lease.outcome`.
pub const RENEWALS: &str = "lease.renewals";
/// Histogram of the latency of supervisor renewal attempts, by `lease.outcome`.
pub const RENEWAL_DURATION: &str = "lease.renewal.duration";
/// Histogram of the local validity left when a renewal was confirmed.
pub const RENEWAL_REMAINING: &str = "lease.renewal.remaining";
/// Gauge of the time since the last confirmed renewal (or the grant) of held leases.
pub const SINCE_LAST_RENEWAL: &str = "lease.since_last_renewal";
/// Counter of supervised leases lost, by `lease.loss.reason`.
pub const LOST: &str = "lease.lost";
/// Histogram of how long supervised leases were held, by `lease.outcome`.
pub const HOLD_DURATION: &str = "lease.hold.duration";
/// Up-down counter of supervised leases currently held.
pub const HELD: &str = "lease.held";
/// Counter of leadership changes, by `lease.leader.event`.
pub const LEADER_TRANSITIONS: &str = "lease.leader.transitions";
/// Counter of writes and installs a fenced resource rejected for a stale token.
pub const FENCING_REJECTIONS: &str = "lease.fencing.rejections";
/// Up-down counter of shards a worker owns now ([`ShardMetrics`](crate::ShardMetrics)).
pub const SHARD_OWNED: &str = "lease.shard.owned";
/// Counter of shard ownerships that ended, by `lease.shard.reason`.
pub const SHARD_MOVES: &str = "lease.shard.moves";
/// Counter of handover requests (steals) a worker left with a more loaded one.
pub const SHARD_STEALS: &str = "lease.shard.steals";

/// Attribute: the backend name (`memory`, `postgres`, ...). On every data point.
pub const ATTR_BACKEND: &str = "lease.backend";
/// Attribute: the lease key. Only with [`OtelConfig::with_key_attribute`](crate::OtelConfig::with_key_attribute).
pub const ATTR_KEY: &str = "lease.key";
/// Attribute: how an operation ended (values depend on the instrument, see the table).
pub const ATTR_OUTCOME: &str = "lease.outcome";
/// Attribute: the store operation (`acquire`, `acquire_many`, `renew`, `renew_many`, `release`,
/// `inspect`, `watch`).
pub const ATTR_OPERATION: &str = "lease.operation";
/// Attribute: why a lease was lost.
pub const ATTR_LOSS_REASON: &str = "lease.loss.reason";
/// Attribute: `elected` or `stepped_down`.
pub const ATTR_LEADER_EVENT: &str = "lease.leader.event";
/// Attribute: the fenced operation that was rejected (`write` or `install`).
pub const ATTR_FENCING_OPERATION: &str = "lease.fencing.operation";
/// Attribute: the kind of error, when `lease.outcome` is `error` (OpenTelemetry's `error.type`).
pub const ATTR_ERROR_TYPE: &str = "error.type";
/// Attribute: the shard set's name.
pub const ATTR_SHARD_SET: &str = "lease.shard.set";
/// Attribute: the worker id a shard data point concerns (the owner, or the thief for steals).
pub const ATTR_SHARD_WORKER: &str = "lease.shard.worker";
/// Attribute: why a shard ownership ended (`handoff`, `lost`, `leaving`, `other`).
pub const ATTR_SHARD_REASON: &str = "lease.shard.reason";
