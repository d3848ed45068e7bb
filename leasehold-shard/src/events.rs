//! What the application sees of a set: events, guards, the hook, snapshots and fair shares.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use leasehold_core::supervisor::{Health, LeaseGuardView, LossReason};
use leasehold_core::{FencingToken, Lease};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Why a worker no longer owns a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RevokeReason {
    /// Handed over to another worker (a steal): drained, then released.
    Handoff {
        /// The worker that asked for it.
        to: String,
    },
    /// The lease was lost (renewal refused or not confirmed in time); not drained.
    Lost(LossReason),
    /// The worker is leaving (drained and released) or was dropped (released at once).
    Leaving,
}

impl fmt::Display for RevokeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RevokeReason::Handoff { to } => write!(f, "handed over to {to}"),
            RevokeReason::Lost(r) => write!(f, "lost: {r}"),
            RevokeReason::Leaving => f.write_str("leaving"),
        }
    }
}

/// What happens to a worker's shards.
#[derive(Debug)]
#[non_exhaustive]
pub enum ShardEvent {
    /// The worker owns `shard` now.
    Assigned {
        /// The shard's name.
        shard: String,
        /// Its fencing token: carry it into every write for the shard.
        token: FencingToken,
        /// Health, cancellation and drain handle for the shard's work.
        guard: ShardGuard,
    },
    /// The worker no longer owns `shard` (its work has been cancelled).
    Revoked {
        /// The shard's name.
        shard: String,
        /// The token that ended.
        token: FencingToken,
        /// Why.
        reason: RevokeReason,
    },
}

/// The application's handle on one owned shard. Cloneable; a planned release (handover, leave)
/// waits, up to the drain timeout, until every clone is dropped: drop it when the shard's
/// in-flight work is done.
#[derive(Debug, Clone)]
pub struct ShardGuard {
    pub(crate) shard: Arc<str>,
    pub(crate) token: FencingToken,
    pub(crate) lease: LeaseGuardView,
    pub(crate) stop: CancellationToken,
    pub(crate) _drain: watch::Receiver<()>,
}

impl ShardGuard {
    /// The shard's name.
    pub fn shard(&self) -> &str {
        &self.shard
    }

    /// The fencing token of this ownership.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The lease's health.
    pub fn health(&self) -> Health {
        self.lease.health()
    }

    /// Whether to start a side effect now: the lease may act (see
    /// [`LeaseGuardView::may_act`]) and no release has started.
    pub fn may_act(&self) -> bool {
        !self.stop.is_cancelled() && self.lease.may_act()
    }

    /// Cancelled when the shard's work must stop: the lease is lost, or a handover or leave
    /// started (then finish in-flight work and drop the guard).
    pub fn cancellation(&self) -> CancellationToken {
        self.stop.clone()
    }
}

/// Observes a set's workers (metrics, audit, test recorders). Called synchronously from the
/// worker's tasks; implementations must be cheap and must not block. Every method has an empty
/// default. A worker is named by its id (two workers joined with one id share it); its leases'
/// owner is its instance ([`Worker::owner`](crate::Worker::owner)), which a lease and a token identify.
pub trait ShardHook: Send + Sync + fmt::Debug {
    /// `worker` was granted `shard` with `lease`.
    fn assigned(&self, worker: &str, shard: &str, lease: &Lease) {
        let _ = (worker, shard, lease);
    }
    /// `worker` is about to release `shard` (its belief ends here).
    fn releasing(&self, worker: &str, shard: &str, token: FencingToken, reason: &RevokeReason) {
        let _ = (worker, shard, token, reason);
    }
    /// `worker` no longer owns `shard`.
    fn revoked(&self, worker: &str, shard: &str, token: FencingToken, reason: &RevokeReason) {
        let _ = (worker, shard, token, reason);
    }
    /// `thief` asked `victim` for `shard`.
    fn steal_requested(&self, thief: &str, victim: &str, shard: &str) {
        let _ = (thief, victim, shard);
    }
}

#[derive(Debug)]
pub(crate) struct NoShardHook;
impl ShardHook for NoShardHook {}

/// Who owns what, as one scan of the store saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Live members (the ids of the workers holding a membership slot), sorted; two instances
    /// of one id are one member.
    pub members: Vec<String>,
    /// Each shard's current owner (the id of the worker holding it, whichever instance of that
    /// id it is) and token, `None` if free.
    pub owners: BTreeMap<String, Option<(String, FencingToken)>>,
}

impl Snapshot {
    /// How many shards each owner holds.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let mut out: BTreeMap<String, usize> = BTreeMap::new();
        for (o, _) in self.owners.values().flatten() {
            *out.entry(o.clone()).or_default() += 1;
        }
        out
    }
}

/// The fair share of `worker` among `members` (sorted) for `shards` shards: `shards / n`, plus
/// one for the first `shards % n` members. Zero for a non-member.
///
/// ```
/// let m = vec!["a".to_string(), "b".to_string(), "c".to_string()];
/// assert_eq!(leasehold_shard::fair_share(10, &m, "a"), 4);
/// assert_eq!(leasehold_shard::fair_share(10, &m, "c"), 3);
/// ```
pub fn fair_share(shards: usize, members: &[String], worker: &str) -> usize {
    let n = members.len();
    let Some(rank) = members.iter().position(|m| m == worker) else {
        return 0;
    };
    shards / n + usize::from(rank < shards % n)
}
