//! # leasehold-shard
//!
//! Shard ownership across a fleet: N workers split K shards (tenants, queue partitions, index
//! ranges) so that every shard has at most one **fenced** owner at a time, on any
//! [`LeaseStore`] (memory, PostgreSQL, Redis, etcd, Kubernetes, SQLite), through its public
//! contract only.
//!
//! - A worker [joins](ShardSet::join) with an id. It announces itself with a **membership
//!   lease** (one of [`ShardSetConfig::with_max_workers`] slot keys) and computes its **fair
//!   share** from the live members: `K / N`, plus one for the first `K % N` members in id order.
//! - Each interval it reads every slot and shard in one batched read
//!   ([`LeaseStore::holders_many`]: one statement, script, range read or list on the real
//!   backends), takes **free or expired** shards first (up to its share; a shard seen free on two
//!   scans in a row is taken by anyone, one share per interval at most, so ownership never waits
//!   for balance), then **steals** from the members most above their share, at most
//!   [`ShardSetConfig::with_max_steals`] shards in flight.
//! - A steal is a **graceful handover**: the thief leaves a request for `n` shards in the
//!   victim's mailbox key and waits on the `n` shards it ranks first with the store's watch; the
//!   victim, if still above its share, picks the same shards by the same rank, cancels their
//!   work, waits for the application to drop their [`ShardGuard`]s (bounded by the drain
//!   timeout), then releases, and the thief acquires on the release wake-up, not on expiry.
//! - A **graceful leave** ([`Worker::leave`]) is a handover too: the leaver gives up its
//!   membership, leaves a note in every other member's mailbox, then drains and releases its
//!   shards. The members, woken by the note, rescan at once; a shard held by a worker that is no
//!   longer a member is handed out like a free one, and its new owner waits on it with the store's
//!   watch, so it takes the shard on the release wake-up, not at its next rebalance.
//! - A **death** (a membership that expired with shards free or still held) is told by the
//!   first member to see it on its own rebalance: a note in every other member's mailbox wakes
//!   them, so all take their parts of the dead worker's shards at once instead of each at its
//!   next rebalance. Without a watch (or if the note is missed) each sees the death at its next
//!   rebalance: every shard has a live owner again within TTL plus one interval of the death,
//!   plus the scan and the acquisitions themselves.
//! - A worker that just joined waits a quarter of an interval before its first take, so that
//!   workers started together count each other instead of each taking every shard; free shards
//!   are tried once each, at most [`ShardSetConfig::with_acquire_concurrency`] at a time.
//! - Every held shard is a supervised lease ([`Supervisor`]) with its own fencing token and its
//!   own cancellation. All of a worker's leases (shards and membership) share one supervisor with
//!   renewal batching, so they renew through `renew_many` in O(1) round trips per interval.
//! - The application sees a stream of [`ShardEvent::Assigned`] and [`ShardEvent::Revoked`] and
//!   the current [assignment](Worker::assignment).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leasehold_core::MemoryLeaseStore;
//! use leasehold_shard::{ShardEvent, ShardSet, ShardSetConfig};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = Arc::new(MemoryLeaseStore::new());
//! let shards: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
//! let set = ShardSet::new(store, "orders", &shards, ShardSetConfig::new(Duration::from_secs(3)))?;
//! let mut worker = set.join("worker-a")?;
//! // Alone, the worker owns every shard; each comes with its own fencing token.
//! let mut owned = 0;
//! while owned < shards.len() {
//!     match worker.next_event().await {
//!         Some(ShardEvent::Assigned { shard, token, guard }) => {
//!             // carry `token` into every write for `shard`; stop when `guard.cancellation()` fires
//!             assert!(guard.may_act());
//!             owned += 1;
//!         }
//!         _ => unreachable!("alone, nothing is revoked"),
//!     }
//! }
//! assert_eq!(worker.assignment().len(), 8);
//! worker.leave().await;
//! # Ok(()) }
//! ```
//!
//! # Workers with one id
//! A worker holds every lease (its shards, its membership slot, the requests and notes it leaves
//! in mailboxes) under its own [instance](OwnerId::instance) of its id (`ID#` and 16 random hex
//! digits; [`Worker::owner`]). Two workers joined with one id (two processes started with one
//! fixed id, a restarted pod whose predecessor still runs) are two owners to the store: the
//! store never grants one shard to both, neither renews or releases the other's leases, and
//! neither takes a shard the other holds as its own. The other members count them as one
//! member, by id: one fair share, which the two split between them, and one mailbox.
//! [`ShardSet::try_join`] reads the membership first and refuses an id that is already live;
//! two joins at the same instant can both pass that read, and are then two owners as above.
//!
//! # Keys
//! A set named `NAME` uses the [reserved](LeaseKey::reserved) keys `NAME.lease--s.SHARD` per
//! shard, `NAME.lease--m.I` per membership slot and `NAME.lease--x.WORKER` per mailbox.
//! [`LeaseKey::new`] refuses `--`, so no lease a user names, in this set's store or any other,
//! can have one of the set's keys: an unrelated lease never collides with a set, and two sets
//! with different names never share a key. `NAME` must be a legal [`LeaseKey`], and shard
//! names and worker ids legal key labels without `--` ([`ShardSet::new`] and
//! [`ShardSet::join`] refuse others with [`Error::InvalidKey`]).
//!
//! ```
//! use leasehold_core::LeaseKey;
//! let orders = LeaseKey::new("orders")?;
//! assert_eq!(orders.reserved("s.p0")?.as_str(), "orders.lease--s.p0");
//! assert!(LeaseKey::new("orders.lease--s.p0").is_err());
//! # Ok::<(), leasehold_core::Error>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::supervisor::{
    Acquisition, Health, Hook, LeaseGuard, LeaseGuardRef, LossReason, Supervisor, SupervisorConfig,
};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Error, FencingToken, Lease, LeaseKey, LeaseStore, MAX_TTL,
    OwnerId, Result,
};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

/// How a [`ShardSet`] behaves. Everything is derived from the lease TTL unless set.
///
/// No value of any setting panics: each either works or is refused by [`ShardSet::new`] (and
/// [`ShardSet::join`]) with [`Error::InvalidInput`] naming the setting, as each setter says.
///
/// ```
/// use std::time::Duration;
/// use leasehold_shard::ShardSetConfig;
/// let cfg = ShardSetConfig::new(Duration::from_secs(9)).with_max_steals(2);
/// assert_eq!(cfg.rebalance_interval(), Duration::from_secs(3));
/// assert_eq!(cfg.max_steals(100), 2);
/// // By default, an eighth of the fair share (at least four) is in flight at once.
/// assert_eq!(ShardSetConfig::new(Duration::from_secs(9)).max_steals(909), 113);
/// ```
#[derive(Debug, Clone)]
pub struct ShardSetConfig {
    supervisor: SupervisorConfig,
    rebalance_interval: Option<Duration>,
    max_steals: Option<usize>,
    steal_wait: Option<Duration>,
    drain_timeout: Option<Duration>,
    max_workers: usize,
    acquire_concurrency: usize,
}

impl ShardSetConfig {
    /// Leases of `ttl`, renewed every third of it; a rebalance every renewal interval.
    pub fn new(ttl: Duration) -> Self {
        Self::with_supervisor(SupervisorConfig::new(ttl))
    }

    /// Uses `config` for every lease (TTL, renewal interval, op timeout, clock). Renewal
    /// batching is switched on by the set (a window of a twentieth of the renewal interval) if
    /// `config` has none.
    pub fn with_supervisor(config: SupervisorConfig) -> Self {
        ShardSetConfig {
            supervisor: config,
            rebalance_interval: None,
            max_steals: None,
            steal_wait: None,
            drain_timeout: None,
            max_workers: 32,
            acquire_concurrency: 32,
        }
    }

    /// How often a worker scans membership and ownership and rebalances (default: the renewal
    /// interval). At most [`MAX_TTL`] ([`ShardSet::new`] refuses more); below a millisecond it
    /// is a millisecond.
    pub fn with_rebalance_interval(mut self, every: Duration) -> Self {
        self.rebalance_interval = Some(every);
        self
    }

    /// At most this many shards being stolen (handed over to this worker) at once; 0 turns
    /// stealing off. The default is an eighth of the worker's fair share, at least four: a
    /// worker joining a fleet of 10 over 10,000 shards takes its 909 in about eight rounds of
    /// handovers. A round ends when its handovers do (the victim answers on its mailbox's
    /// watch, at once); the next starts an eighth of a rebalance interval later, so at most
    /// eight rounds run per interval.
    pub fn with_max_steals(mut self, n: usize) -> Self {
        self.max_steals = Some(n);
        self
    }

    /// How long a thief waits for the victim to hand a shard over (default: two rebalance
    /// intervals plus the drain timeout, at most [`MAX_TTL`]). It is also the lifetime of the
    /// thief's request in the victim's mailbox, a lease: more than zero and at most
    /// [`MAX_TTL`] ([`ShardSet::new`] refuses others).
    pub fn with_steal_wait(mut self, wait: Duration) -> Self {
        self.steal_wait = Some(wait);
        self
    }

    /// How long a planned release waits for the application to drop the shard's guards
    /// (default: one rebalance interval; zero releases at once). A lost lease is never drained.
    /// At most [`MAX_TTL`] ([`ShardSet::new`] refuses more).
    pub fn with_drain_timeout(mut self, wait: Duration) -> Self {
        self.drain_timeout = Some(wait);
        self
    }

    /// The number of membership slots, the most workers a set counts (default 32): from 1 to
    /// [`MAX_WORKERS`]; [`ShardSet::new`] refuses others. Every scan reads every slot.
    pub fn with_max_workers(mut self, n: usize) -> Self {
        self.max_workers = n;
        self
    }

    /// How many acquisitions of free shards a worker keeps in flight (default 32), at least 1
    /// ([`ShardSet::new`] refuses 0); a bound above the number of shards is the number of
    /// shards. Each is one attempt: a shard someone else took meanwhile is left alone until the
    /// next scan.
    pub fn with_acquire_concurrency(mut self, n: usize) -> Self {
        self.acquire_concurrency = n;
        self
    }

    /// The lease configuration.
    pub fn supervisor(&self) -> &SupervisorConfig {
        &self.supervisor
    }

    /// The rebalance interval.
    pub fn rebalance_interval(&self) -> Duration {
        self.rebalance_interval
            .unwrap_or_else(|| self.supervisor.renew_interval())
            .max(Duration::from_millis(1))
    }

    /// The steal bound for a worker whose fair share is `share`.
    pub fn max_steals(&self, share: usize) -> usize {
        self.max_steals.unwrap_or_else(|| (share / 8).max(4))
    }

    /// The bound on acquisitions of free shards in flight.
    pub fn acquire_concurrency(&self) -> usize {
        self.acquire_concurrency
    }

    /// The drain timeout.
    pub fn drain_timeout(&self) -> Duration {
        self.drain_timeout
            .unwrap_or_else(|| self.rebalance_interval())
    }

    /// How long a thief waits for a handover.
    pub fn steal_wait(&self) -> Duration {
        self.steal_wait.unwrap_or_else(|| {
            self.rebalance_interval()
                .saturating_mul(2)
                .saturating_add(self.drain_timeout())
                .min(MAX_TTL)
        })
    }

    /// The number of membership slots.
    pub fn max_workers(&self) -> usize {
        self.max_workers
    }

    /// Refuses the settings no set can run with: counts and durations out of the ranges their
    /// setters document.
    fn validate(&self) -> Result<()> {
        if self.max_workers == 0 || self.max_workers > MAX_WORKERS {
            return Err(Error::InvalidInput(format!(
                "max workers {} is out of range: a shard set has from 1 to {MAX_WORKERS} \
                 membership slots",
                self.max_workers
            )));
        }
        if self.acquire_concurrency == 0 {
            return Err(Error::InvalidInput(
                "acquire concurrency 0 would never take a shard: it must be at least 1".into(),
            ));
        }
        for (what, value) in [
            ("rebalance interval", self.rebalance_interval),
            ("drain timeout", self.drain_timeout),
            ("steal wait", self.steal_wait),
        ] {
            if let Some(d) = value.filter(|d| *d > MAX_TTL) {
                return Err(Error::InvalidInput(format!(
                    "{what} {d:?} is longer than the longest lease ({MAX_TTL:?})"
                )));
            }
        }
        if self.steal_wait.is_some_and(|d| d.is_zero()) {
            return Err(Error::InvalidInput(
                "a steal wait of zero gives no handover time to complete".into(),
            ));
        }
        Ok(())
    }

    /// The supervisor configuration the workers run with: batching on, and an acquire wait long
    /// enough for a steal (each attempt is bounded on its own).
    fn worker_supervisor(&self) -> Result<SupervisorConfig> {
        self.validate()?;
        let mut c = self.supervisor.clone();
        if c.renewal_batching().is_none() {
            let window = (c.renew_interval() / 20)
                .max(Duration::from_millis(1))
                .min(c.op_timeout() / 2);
            c = c.with_renewal_batching(window);
        }
        let wait = self.steal_wait().max(self.rebalance_interval());
        c = c.with_acquire_wait(wait);
        c.validate()?;
        Ok(c)
    }
}

/// The most membership slots a set may have ([`ShardSetConfig::with_max_workers`]).
pub const MAX_WORKERS: usize = 4096;

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
    shard: Arc<str>,
    token: FencingToken,
    lease: LeaseGuardRef,
    stop: CancellationToken,
    _drain: watch::Receiver<()>,
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
    /// [`LeaseGuardRef::may_act`]) and no release has started.
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
/// owner is its instance ([`Worker::owner`]), which a lease and a token identify.
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
struct NoShardHook;
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

#[derive(Debug, Clone)]
struct Inner {
    store: Arc<dyn LeaseStore>,
    name: String,
    /// The set's name as a key: its shard, slot and mailbox keys are reserved keys beside it.
    name_key: LeaseKey,
    shards: Vec<(Arc<str>, LeaseKey)>,
    slots: Vec<LeaseKey>,
    config: ShardSetConfig,
    hook: Arc<dyn ShardHook>,
    lease_hook: Option<Arc<dyn Hook>>,
}

impl Inner {
    /// The mailbox key of `worker`.
    fn mailbox(&self, worker: &str) -> Result<LeaseKey> {
        self.name_key.reserved(&format!("x.{worker}"))
    }
}

/// A set of shards shared by a fleet of workers over one store.
#[derive(Debug, Clone)]
pub struct ShardSet {
    inner: Arc<Inner>,
}

impl ShardSet {
    /// A set named `name` over `shards` (names; duplicates are ignored).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] if the name or a shard name does not make a legal key,
    /// [`Error::InvalidInput`] for an empty set or invalid timings.
    pub fn new<S: AsRef<str>>(
        store: Arc<dyn LeaseStore>,
        name: &str,
        shards: &[S],
        config: ShardSetConfig,
    ) -> Result<Self> {
        config.worker_supervisor()?;
        let name_key = LeaseKey::new(name)?;
        let mut seen = BTreeSet::new();
        let mut list = Vec::new();
        for s in shards {
            let s = s.as_ref();
            if seen.insert(s.to_string()) {
                list.push((Arc::from(s), name_key.reserved(&format!("s.{s}"))?));
            }
        }
        if list.is_empty() {
            return Err(Error::InvalidInput(
                "a shard set needs at least one shard".into(),
            ));
        }
        let slots = (0..config.max_workers)
            .map(|i| name_key.reserved(&format!("m.{i}")))
            .collect::<Result<Vec<_>>>()?;
        Ok(ShardSet {
            inner: Arc::new(Inner {
                store,
                name: name.to_string(),
                name_key,
                shards: list,
                slots,
                config,
                hook: Arc::new(NoShardHook),
                lease_hook: None,
            }),
        })
    }

    /// Reports assignments, releases and steals to `hook`.
    pub fn with_shard_hook(mut self, hook: Arc<dyn ShardHook>) -> Self {
        Arc::make_mut(&mut self.inner).hook = hook;
        self
    }

    /// Reports every lease step (acquire, renewal, loss) of every worker to `hook`.
    pub fn with_lease_hook(mut self, hook: Arc<dyn Hook>) -> Self {
        Arc::make_mut(&mut self.inner).lease_hook = Some(hook);
        self
    }

    /// The set's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The shard names, in the order given.
    pub fn shards(&self) -> Vec<String> {
        self.inner
            .shards
            .iter()
            .map(|(s, _)| s.to_string())
            .collect()
    }

    /// The configuration.
    pub fn config(&self) -> &ShardSetConfig {
        &self.inner.config
    }

    /// Joins as `worker` and starts owning shards in a background task, without reading the
    /// store first (see [`ShardSet::try_join`] for a join that refuses an id already live).
    ///
    /// The worker holds every lease under its own [instance](OwnerId::instance) of `worker`:
    /// another worker joined with the same id (a second process started with one fixed id) is
    /// another owner to the store, so the two never both own a shard; the other members count
    /// them as one member `worker` (one fair share, which the two split between them).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] / [`Error::InvalidOwner`] if `worker` does not make a legal key
    /// label and owner id with room for its instance part.
    pub fn join(&self, worker: &str) -> Result<Worker> {
        let (mailbox, owner) = self.worker_names(worker)?;
        let mut sup = Supervisor::from_arc(
            self.inner.store.clone(),
            self.inner.config.worker_supervisor()?,
        )
        .with_owner(owner.clone());
        if let Some(h) = &self.inner.lease_hook {
            sup = sup.with_hook(h.clone());
        }
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (assign_tx, assign_rx) = watch::channel(BTreeMap::new());
        let stop = CancellationToken::new();
        let leave = CancellationToken::new();
        let id: Arc<str> = Arc::from(worker);
        let task = tokio::spawn(
            Run {
                set: self.inner.clone(),
                sup,
                me: id.clone(),
                mailbox,
                events: events_tx,
                assignment: assign_tx,
                acquiring: stop.child_token(),
                takes: Arc::new(Semaphore::new(
                    self.inner
                        .config
                        .acquire_concurrency
                        .min(self.inner.shards.len())
                        .min(Semaphore::MAX_PERMITS),
                )),
            }
            .run(stop.clone(), leave.clone()),
        );
        Ok(Worker {
            id,
            owner,
            events: events_rx,
            assignment: assign_rx,
            stop,
            leave,
            task: Some(task),
        })
    }

    /// Joins as `worker` like [`ShardSet::join`], after one read of the membership slots: if
    /// another instance of `worker` holds one (another process joined with this id and has not
    /// left, or died less than a TTL ago), the join is refused and nothing is written.
    ///
    /// Two joins at the same instant can both pass the read; they are then two owners as with
    /// [`ShardSet::join`], never two owners of one shard.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the id, the set and the live instance if `worker` is
    /// already live in the set; the errors of [`ShardSet::join`]; the store's error, or
    /// [`Error::Timeout`] after the op timeout, if the slots cannot be read.
    ///
    /// # Cancellation safety
    /// Cancel safe: cancelled before it returns, it has joined nothing.
    pub async fn try_join(&self, worker: &str) -> Result<Worker> {
        self.worker_names(worker)?;
        let set = &self.inner;
        let op = set.config.supervisor.op_timeout();
        let holders = match timeout(op, set.store.holders_many(&set.slots)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::Timeout {
                    backend: set.store.backend(),
                    operation: "holders_many",
                    after: op,
                });
            }
        };
        if let Some(live) = holders
            .iter()
            .flatten()
            .find(|h| h.owner.identity() == worker)
        {
            return Err(Error::InvalidInput(format!(
                "worker id {worker} is already live in set {} (instance {}): stop that worker, \
                 or join once its membership has expired (within one TTL of its end)",
                set.name, live.owner
            )));
        }
        self.join(worker)
    }

    /// The mailbox key and a fresh instance owner for `worker`, checking that its steal
    /// requests' owners (`WORKER/N`, up to every shard) are legal too.
    fn worker_names(&self, worker: &str) -> Result<(LeaseKey, OwnerId)> {
        let mailbox = self.inner.mailbox(worker)?;
        let owner = OwnerId::instance(worker)?;
        OwnerId::instance(&format!("{worker}/{}", self.inner.shards.len()))?;
        Ok((mailbox, owner))
    }

    /// Scans the store once: live members and each shard's owner.
    ///
    /// # Errors
    /// The first store error.
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    pub async fn snapshot(&self) -> Result<Snapshot> {
        let v = scan(&self.inner, None).await?;
        Ok(Snapshot {
            members: v.members,
            owners: self
                .inner
                .shards
                .iter()
                .zip(v.owners)
                .map(|((s, _), o)| (s.to_string(), o))
                .collect(),
        })
    }
}

/// One member of a shard set. Dropping it leaves at once (shards released without draining);
/// [`Worker::leave`] drains first.
#[derive(Debug)]
pub struct Worker {
    id: Arc<str>,
    owner: OwnerId,
    events: mpsc::UnboundedReceiver<ShardEvent>,
    assignment: watch::Receiver<BTreeMap<String, FencingToken>>,
    stop: CancellationToken,
    leave: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Worker {
    /// The worker's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The owner this worker holds its leases under: an [instance](OwnerId::instance) of its
    /// id, unique to this worker, so that another worker joined with the same id is another
    /// owner to the store.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }

    /// The next event, `None` once the worker stopped.
    ///
    /// # Cancellation safety
    /// Cancel safe: an event is either returned or stays queued.
    pub async fn next_event(&mut self) -> Option<ShardEvent> {
        self.events.recv().await
    }

    /// The shards this worker owns now, with their tokens.
    pub fn assignment(&self) -> BTreeMap<String, FencingToken> {
        self.assignment.borrow().clone()
    }

    /// A receiver of assignment changes.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, FencingToken>> {
        self.assignment.clone()
    }

    /// Leaves gracefully: gives up the membership slot, tells the other members (a note in each
    /// one's mailbox, so they wait on this worker's shards now), cancels every shard's work,
    /// drains (bounded by the drain timeout), releases every shard, and waits for all of it.
    ///
    /// # Cancellation safety
    /// Cancel safe: the leave completes in the background.
    pub async fn leave(mut self) {
        self.leave.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.task.is_some() {
            self.stop.cancel();
        }
    }
}

enum Internal {
    Acquired {
        idx: usize,
        guard: LeaseGuard,
        steal: bool,
    },
    NotAcquired {
        idx: usize,
        steal: bool,
    },
    Ended {
        idx: usize,
        token: FencingToken,
        reason: RevokeReason,
    },
}

impl Internal {
    /// The outcome of one acquisition of shard `idx` (a steal's, or not).
    fn outcome(idx: usize, got: Option<LeaseGuard>, steal: bool) -> Self {
        match got {
            Some(guard) => Internal::Acquired { idx, guard, steal },
            None => Internal::NotAcquired { idx, steal },
        }
    }
}

struct Held {
    token: FencingToken,
    release: Option<oneshot::Sender<RevokeReason>>,
}

#[derive(Default)]
struct State {
    held: BTreeMap<usize, Held>,
    pending: BTreeSet<usize>,
    steals: usize,
    member: Option<LeaseGuard>,
    prev_free: BTreeSet<usize>,
    /// The mailbox request (its token) this worker last answered: each is answered once.
    answered: Option<FencingToken>,
    /// Our fair share as of the last scan (what a mailbox request is answered against).
    target: Option<usize>,
    /// The members as of the last scan (told of a graceful leave).
    members: Vec<String>,
    /// A round of steals just ended below our share.
    retick: bool,
    /// The next rebalance was called by another member's note (`WORKER/0`: it left, or it saw a
    /// member die): that rebalance tells nobody in turn.
    woken: bool,
    /// Quick rescans left after a death while its shards are not all owned again.
    follow_ups: u8,
}

impl State {
    /// Shards counted as ours: held and not being released, plus acquisitions in flight.
    fn mine(&self) -> usize {
        self.held.values().filter(|h| h.release.is_some()).count() + self.pending.len()
    }
}

struct View {
    members: Vec<String>,
    owners: Vec<Option<(String, FencingToken)>>,
    /// The request in the mailbox: its owner (`THIEF/N`) and token.
    mailbox: Option<(String, FencingToken)>,
}

/// Reads the holders of every slot and shard (and `mailbox`, if given) in one
/// [`LeaseStore::holders_many`], bounded by the rebalance interval (or the op timeout, if
/// longer).
async fn scan(set: &Inner, mailbox: Option<&LeaseKey>) -> Result<View> {
    let keys: Vec<LeaseKey> = set
        .slots
        .iter()
        .chain(set.shards.iter().map(|(_, k)| k))
        .chain(mailbox)
        .cloned()
        .collect();
    let bound = set
        .config
        .rebalance_interval()
        .max(set.config.supervisor.op_timeout());
    let states = match timeout(bound, set.store.holders_many(&keys)).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Error::Timeout {
                backend: set.store.backend(),
                operation: "holders_many",
                after: bound,
            });
        }
    };
    if states.len() != keys.len() {
        return Err(Error::store_fault(
            set.store.backend(),
            format!(
                "holders_many answered {} holders for {} keys",
                states.len(),
                keys.len()
            ),
            None,
        ));
    }
    let mut states = states.into_iter();
    let mut members = BTreeSet::new();
    for _ in &set.slots {
        if let Some(h) = states.next().expect("one holder per key") {
            members.insert(h.owner.identity().to_string());
        }
    }
    let mut owners = Vec::with_capacity(set.shards.len());
    for _ in &set.shards {
        let h = states.next().expect("one holder per key");
        owners.push(h.map(|h| (h.owner.identity().to_string(), h.token)));
    }
    let mailbox = match mailbox {
        Some(_) => states
            .next()
            .expect("one holder per key")
            .map(|h| (h.owner.identity().to_string(), h.token)),
        None => None,
    };
    Ok(View {
        members: members.into_iter().collect(),
        owners,
        mailbox,
    })
}

/// A stable pseudo-random rank of `shard` for `worker` (FNV-1a): spreads concurrent takers over
/// different shards.
fn rank(worker: &str, shard: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in worker.bytes().chain([0u8]).chain(shard.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Acquires `key` through `sup`, giving up after `wait` (or when `cancel` fires). An attempt in
/// flight at the bound finishes; a grant it obtains is released.
async fn acquire_bounded(
    sup: &Supervisor,
    key: &LeaseKey,
    wait: Duration,
    cancel: &CancellationToken,
) -> Option<LeaseGuard> {
    let mine = cancel.child_token();
    let acq = sup.acquire_until_cancelled(key, &mine);
    tokio::pin!(acq);
    let r = tokio::select! {
        r = &mut acq => r,
        _ = sleep(wait) => {
            mine.cancel();
            acq.await
        }
    };
    match r {
        Ok(Acquisition::Acquired(g)) => Some(g),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(key = %key, error = %e, "shard acquisition failed");
            None
        }
    }
}

/// `at + d`, or a moment thirty years after `at` if that is not representable (a timer that
/// never fires in practice; tokio bounds its own far-future deadlines the same way).
fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(Duration::from_secs(30 * 365 * 24 * 3600)))
        .unwrap_or(at)
}

/// Rounds `d` up to the store's TTL granularity and minimum.
fn store_ttl(store: &dyn LeaseStore, d: Duration) -> Duration {
    let caps = store.capabilities();
    let d = d.max(caps.min_ttl).max(Duration::from_millis(1));
    let g = caps.ttl_granularity.as_nanos();
    if g <= 1 {
        return d;
    }
    let n = d.as_nanos().div_ceil(g) * g;
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

/// Leaves a note `ME/0` of `ttl` in the mailbox of every member of `members` but `me`, each
/// attempt bounded by the op timeout, all at once (nothing on a store without a watch: nobody
/// would be woken). Returns the notes left; a mailbox already held (a thief's request, another
/// note) is skipped.
async fn post_notes(set: &Arc<Inner>, me: &str, members: &[String], ttl: Duration) -> Vec<Lease> {
    if !set.store.capabilities().watch {
        return Vec::new();
    }
    let op = set.config.supervisor.op_timeout();
    let Ok(owner) = OwnerId::instance(&format!("{me}/0")) else {
        return Vec::new();
    };
    let notes = members.iter().filter(|m| **m != *me).filter_map(|m| {
        let key = set.mailbox(m).ok()?;
        let req = AcquireRequest::new(key, owner.clone(), ttl);
        let store = set.store.clone();
        Some(async move {
            match timeout(op, store.acquire(&req)).await {
                Ok(Ok(AcquireOutcome::Acquired(l))) => Some(l),
                _ => None,
            }
        })
    });
    futures::future::join_all(notes)
        .await
        .into_iter()
        .flatten()
        .collect()
}

struct Run {
    set: Arc<Inner>,
    sup: Supervisor,
    /// The worker's id: what the other members know it by (fair share, steals, mailbox). Its
    /// leases are held under an instance of it (the supervisor's owner).
    me: Arc<str>,
    mailbox: LeaseKey,
    events: mpsc::UnboundedSender<ShardEvent>,
    assignment: watch::Sender<BTreeMap<String, FencingToken>>,
    /// Cancels every acquisition in flight (leave or drop).
    acquiring: CancellationToken,
    /// Bounds the acquisitions of free shards in flight.
    takes: Arc<Semaphore>,
}

impl Run {
    async fn run(self, stop: CancellationToken, leave: CancellationToken) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut st = State::default();
        let mut next = Instant::now();
        let every = self.set.config.rebalance_interval();
        // A request in our mailbox is answered when it arrives (the store's watch), not at our
        // next tick; without a watch, or once it breaks, at the next tick.
        let mut mail = self.watch_mailbox().await;
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => {
                    self.acquiring.cancel();
                    return; // dropping the release senders releases every shard at once
                }
                _ = leave.cancelled() => break,
                Some(msg) = rx.recv() => {
                    self.handle(&mut st, msg, &tx);
                    if std::mem::take(&mut st.retick) {
                        // A round of steals ended below our share: the next round soon.
                        next = next.min(later(Instant::now(), every / 8));
                    }
                }
                changed = async {
                    match mail.as_mut() {
                        Some(w) => w.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if matches!(changed, Some(Ok(()))) {
                        if self.answer_mailbox(&mut st).await {
                            // A member left or died: rebalance now, waiting on its shards.
                            next = Instant::now();
                            st.woken = true;
                        }
                    } else {
                        mail = None;
                    }
                }
                _ = sleep_until(next) => {
                    // The cadence is kept from the start of each rebalance, so that a scan's
                    // own duration does not stretch the interval (the dead-member bound is one
                    // interval); a rebalance that overran starts the next an eighth later.
                    let started = Instant::now();
                    let after = self.tick(&mut st, &tx).await;
                    next = later(started, after).max(later(Instant::now(), after / 8));
                    if mail.is_none() {
                        mail = self.watch_mailbox().await;
                    }
                }
            }
        }
        // Graceful leave: stop taking, give up membership, tell the other members (so they
        // wait on our shards now, not at their next rebalance), then drain and release every
        // shard: each is taken on its release wake-up.
        self.acquiring.cancel();
        if let Some(m) = st.member.take() {
            let _ = m.release().await;
        }
        let told = if st.held.is_empty() {
            Vec::new()
        } else {
            self.announce_leave(&st.members).await
        };
        for h in st.held.values_mut() {
            if let Some(r) = h.release.take() {
                let _ = r.send(RevokeReason::Leaving);
            }
        }
        while !(st.held.is_empty() && st.pending.is_empty()) {
            tokio::select! {
                _ = stop.cancelled() => break,
                msg = rx.recv() => match msg {
                    Some(msg) => self.handle(&mut st, msg, &tx),
                    None => break,
                },
            }
        }
        let op = self.set.config.supervisor.op_timeout();
        let store = &*self.set.store;
        futures::future::join_all(told.iter().map(|l| timeout(op, store.release(l)))).await;
    }

    /// Leaves `ME/0` in the mailbox of every other member of `members`, each attempt bounded by
    /// the op timeout, all at once: woken by its mailbox's watch, a member rebalances at once and
    /// waits on the shards of ours it is due (see [`Run::tick`]). A mailbox held by a thief's
    /// request is skipped (that member takes ours at its next rebalance). Returns the notes left,
    /// to release once our shards are released.
    async fn announce_leave(&self, members: &[String]) -> Vec<Lease> {
        let wait = store_ttl(&*self.set.store, self.set.config.steal_wait());
        post_notes(&self.set, &self.me, members, wait).await
    }

    /// Tells every other member of `members` that a member is gone (it died: its membership
    /// expired while it still held or had just held shards), so that each rebalances now and
    /// takes its part of the dead member's shards together with us instead of at its own next
    /// rebalance, up to an interval later. The notes (`ME/0`, as a leave's) are released an
    /// eighth of an interval later, in the background; they expire on their own after a
    /// quarter (rounded up to the store's TTL granularity) if that release fails.
    fn tell_death(&self, members: &[String]) {
        let every = self.set.config.rebalance_interval();
        let (set, me, members) = (self.set.clone(), self.me.clone(), members.to_vec());
        let cancel = self.acquiring.clone();
        tokio::spawn(async move {
            let ttl = store_ttl(&*set.store, every / 4);
            let notes = post_notes(&set, &me, &members, ttl).await;
            if notes.is_empty() {
                return;
            }
            tokio::select! {
                _ = sleep(every / 8) => {}
                _ = cancel.cancelled() => {}
            }
            let op = set.config.supervisor.op_timeout();
            let store = &*set.store;
            futures::future::join_all(notes.iter().map(|l| timeout(op, store.release(l)))).await;
        });
    }

    fn publish(&self, st: &State) {
        let map = st
            .held
            .iter()
            .map(|(i, h)| (self.set.shards[*i].0.to_string(), h.token))
            .collect();
        self.assignment.send_replace(map);
    }

    fn handle(&self, st: &mut State, msg: Internal, tx: &mpsc::UnboundedSender<Internal>) {
        match msg {
            Internal::NotAcquired { idx, steal } => {
                st.pending.remove(&idx);
                if steal {
                    st.steals = st.steals.saturating_sub(1);
                    st.retick |= st.steals == 0;
                }
            }
            Internal::Acquired { idx, guard, steal } => {
                st.pending.remove(&idx);
                if steal {
                    st.steals = st.steals.saturating_sub(1);
                    st.retick |= st.steals == 0 && st.target.is_some_and(|t| st.mine() + 1 < t);
                }
                if self.acquiring.is_cancelled() || st.held.contains_key(&idx) {
                    // Leaving (or a duplicate, which cannot happen): give it back at once.
                    self.set.hook.releasing(
                        &self.me,
                        &self.set.shards[idx].0,
                        guard.token(),
                        &RevokeReason::Leaving,
                    );
                    drop(guard);
                    return;
                }
                self.start(st, idx, guard, tx.clone());
            }
            Internal::Ended { idx, token, reason } => {
                if st.held.get(&idx).is_some_and(|h| h.token == token) {
                    st.held.remove(&idx);
                }
                let shard = self.set.shards[idx].0.to_string();
                self.set.hook.revoked(&self.me, &shard, token, &reason);
                tracing::info!(worker = %self.me, shard = %shard, token = %token, %reason, "shard revoked");
                self.publish(st);
                let _ = self.events.send(ShardEvent::Revoked {
                    shard,
                    token,
                    reason,
                });
            }
        }
    }

    fn start(
        &self,
        st: &mut State,
        idx: usize,
        guard: LeaseGuard,
        tx: mpsc::UnboundedSender<Internal>,
    ) {
        let (shard, _) = self.set.shards[idx].clone();
        let token = guard.token();
        self.set.hook.assigned(&self.me, &shard, &guard.lease());
        tracing::info!(worker = %self.me, shard = %shard, token = %token, "shard assigned");
        let (drain_tx, drain_rx) = watch::channel(());
        let stop = guard.cancellation();
        let sg = ShardGuard {
            shard: shard.clone(),
            token,
            lease: guard.guard_ref(),
            stop: stop.clone(),
            _drain: drain_rx,
        };
        let (rel_tx, rel_rx) = oneshot::channel();
        st.held.insert(
            idx,
            Held {
                token,
                release: Some(rel_tx),
            },
        );
        self.publish(st);
        let _ = self.events.send(ShardEvent::Assigned {
            shard: shard.to_string(),
            token,
            guard: sg,
        });
        let hook = self.set.hook.clone();
        let me = self.me.clone();
        let drain = self.set.config.drain_timeout();
        tokio::spawn(async move {
            let reason = tokio::select! {
                h = guard.lost() => {
                    let r = match h {
                        Health::Lost(r) => r,
                        _ => LossReason::RenewalTaskEnded,
                    };
                    drop(guard);
                    RevokeReason::Lost(r)
                }
                r = rel_rx => match r {
                    Ok(reason) => {
                        stop.cancel();
                        tokio::select! {
                            _ = timeout(drain, drain_tx.closed()) => {}
                            _ = guard.lost() => {}
                        }
                        hook.releasing(&me, &shard, token, &reason);
                        let _ = guard.release().await;
                        reason
                    }
                    Err(_) => {
                        // The worker was dropped: release at once, no drain.
                        hook.releasing(&me, &shard, token, &RevokeReason::Leaving);
                        drop(guard);
                        RevokeReason::Leaving
                    }
                },
            };
            let _ = tx.send(Internal::Ended { idx, token, reason });
        });
    }

    /// Watches our mailbox key, if the store can.
    async fn watch_mailbox(&self) -> Option<leasehold_core::KeyWatch> {
        if !self.set.store.capabilities().watch {
            return None;
        }
        let op = self.set.config.supervisor.op_timeout();
        match timeout(op, self.set.store.watch(&self.mailbox)).await {
            Ok(Ok(w)) => w,
            _ => None,
        }
    }

    /// Reads the mailbox now and answers a request in it (woken by the mailbox's watch).
    /// Returns whether it holds another member's note (`WORKER/0`: that worker is leaving, or it
    /// saw a member die) not seen before.
    async fn answer_mailbox(&self, st: &mut State) -> bool {
        let op = self.set.config.supervisor.op_timeout();
        if let Ok(Ok(state)) = timeout(op, self.set.store.inspect(&self.mailbox)).await
            && let Some(h) = state.holder
        {
            let owner = h.owner.identity();
            if let Some((who, "0")) = owner.rsplit_once('/') {
                let new = who != &*self.me && st.answered != Some(h.token);
                st.answered = Some(h.token);
                return new;
            }
            self.answer(st, owner, h.token);
        }
        false
    }

    /// Answers the request `owner` (`THIEF/N`) with `token`, once: hands over what we have above
    /// our share (as of the last scan), up to the number asked, choosing as the thief did (its
    /// rank of each shard).
    fn answer(&self, st: &mut State, owner: &str, token: FencingToken) {
        let Some(target) = st.target else { return };
        let mine = st.mine();
        if st.answered == Some(token) || mine <= target {
            return;
        }
        let Some((thief, n)) = owner.rsplit_once('/') else {
            return;
        };
        let Ok(n) = n.parse::<usize>() else { return };
        if thief == &*self.me {
            return;
        }
        st.answered = Some(token);
        let mut ours: Vec<usize> = st
            .held
            .iter()
            .filter(|(_, h)| h.release.is_some())
            .map(|(i, _)| *i)
            .collect();
        ours.sort_by_key(|i| std::cmp::Reverse(rank(thief, &self.set.shards[*i].0)));
        for idx in ours.into_iter().take(n.min(mine - target)) {
            if let Some(r) = st.held.get_mut(&idx).and_then(|h| h.release.take()) {
                tracing::info!(worker = %self.me, shard = %self.set.shards[idx].0, thief, "handing shard over");
                let _ = r.send(RevokeReason::Handoff {
                    to: thief.to_string(),
                });
            }
        }
    }

    /// Takes a membership slot if we hold none: the free slots of a scan of the slots alone,
    /// tried in this worker's rank order (so workers joining together spread over them), one
    /// attempt each, at most three. Returns whether a slot was taken now.
    async fn join_slot(&self, st: &mut State) -> bool {
        let slots = &self.set.slots;
        let op = self.set.config.supervisor.op_timeout();
        let free: Vec<usize> = match timeout(op, self.set.store.holders_many(slots)).await {
            Ok(Ok(states)) if states.len() == slots.len() => states
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_none())
                .map(|(i, _)| i)
                .collect(),
            _ => return false,
        };
        let mut order = free;
        order.sort_by_key(|i| std::cmp::Reverse(rank(&self.me, slots[*i].as_str())));
        for i in order.into_iter().take(3) {
            if self.acquiring.is_cancelled() {
                return false;
            }
            if let Ok(Acquisition::Acquired(g)) = self.sup.try_acquire(&slots[i]).await {
                st.member = Some(g);
                return true;
            }
        }
        false
    }

    /// One rebalance; returns the time until the next.
    async fn tick(&self, st: &mut State, tx: &mpsc::UnboundedSender<Internal>) -> Duration {
        let every = self.set.config.rebalance_interval();
        // Forget a lost membership lease; a new slot is taken below.
        if st.member.as_ref().is_some_and(|m| m.health().is_final()) {
            st.member = None;
        }
        if st.member.is_none() && self.join_slot(st).await {
            // Just joined: let workers started at the same moment take their slots too, so that
            // the first take counts them instead of each taking every shard.
            return every / 4;
        }
        // A quick rescan after a death is for a member still below its share (its handout fell
        // short of what the others' views left it): at its share, counting its acquisitions in
        // flight, a member leaves the store to the members still taking (on SQLite the scans of
        // 10,000 keys share one process and one write queue with their acquisitions) and
        // rescans at the usual cadence.
        if st.follow_ups > 0 && !st.woken && st.target.is_some_and(|t| st.mine() >= t) {
            st.follow_ups -= 1;
            return every / 8;
        }
        let view = match scan(&self.set, Some(&self.mailbox)).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(worker = %self.me, error = %e, "shard scan failed; keeping the assignment");
                return every;
            }
        };
        let mut members = view.members.clone();
        if !members.iter().any(|m| **m == *self.me) {
            members.push(self.me.to_string());
            members.sort();
        }
        let k = self.set.shards.len();
        let target = fair_share(k, &members, &self.me);
        st.target = Some(target);
        // Members of the last scan that are gone now (a membership that expired or was given
        // up), told to the others below if they left shards to take.
        let woken = std::mem::take(&mut st.woken);
        let gone = st
            .members
            .iter()
            .any(|m| *m != *self.me && !members.contains(m));
        st.members = members.clone();
        if let Some((owner, token)) = &view.mailbox {
            self.answer(st, owner, *token);
        }
        let mine = st.mine();

        // Free shards: handed out, in a way every worker with the same view computes alike,
        // to the members furthest below their share (so concurrent takers do not collide);
        // a shard seen free on two scans in a row is taken by whoever sees it, at most one
        // share's worth per worker and interval.
        let free: BTreeSet<usize> = (0..k)
            .filter(|i| view.owners[*i].is_none())
            .filter(|i| !st.held.contains_key(i) && !st.pending.contains(i))
            .collect();
        let mut have: BTreeMap<&str, usize> = BTreeMap::new();
        for (w, _) in view.owners.iter().flatten() {
            *have.entry(w.as_str()).or_default() += 1;
        }
        let mut deficit: Vec<(String, usize)> = members
            .iter()
            .map(|m| {
                let h = have.get(m.as_str()).copied().unwrap_or(0);
                let h = if **m == *self.me { h.max(mine) } else { h };
                (m.clone(), fair_share(k, &members, m).saturating_sub(h))
            })
            .collect();
        // Shards held by a worker that is no longer a member (it left gracefully and is
        // draining them, or it died) are handed out alike, with the free ones; ours of them we
        // wait on, and take on their release wake-up (or expiry).
        let left_by = |i: usize| {
            view.owners[i]
                .as_ref()
                .is_some_and(|(w, _)| *w != *self.me && !members.iter().any(|m| m == w))
        };
        // A member gone with shards free or still held by non-members: a death (a graceful
        // leaver told everyone itself). Whoever notices it first on its own rebalance wakes the
        // others, so that they take their parts now rather than up to an interval later; the
        // members it wakes tell nobody in turn.
        let unowned = (0..k).any(|i| view.owners[i].is_none() || left_by(i));
        if gone && !woken && unowned {
            self.tell_death(&members);
        }
        // After a death (told or woken), rescan every eighth of an interval while shards are
        // still free or held by non-members, for one interval at most: members that scanned at
        // different moments of the takeover hand its shards out from different views, and a
        // shard each believes is another's would otherwise wait for the next interval's scans
        // (it is taken by whoever sees it free on two scans in a row).
        if (woken || gone) && unowned {
            st.follow_ups = 8;
        } else if !unowned {
            st.follow_ups = 0;
        }
        let mut take: BTreeSet<usize> = BTreeSet::new();
        let mut inherit: Vec<usize> = Vec::new();
        for i in (0..k).filter(|i| view.owners[*i].is_none() || left_by(*i)) {
            let shard = &self.set.shards[i].0;
            let Some(best) = deficit
                .iter_mut()
                .filter(|(_, d)| *d > 0)
                .max_by_key(|(m, d)| (*d, rank(m, shard)))
            else {
                break;
            };
            best.1 -= 1;
            if best.0 == *self.me {
                if free.contains(&i) {
                    take.insert(i);
                } else if !st.held.contains_key(&i) && !st.pending.contains(&i) {
                    inherit.push(i);
                }
            }
        }
        let mut extra = target.max(1);
        for i in &free {
            if extra == 0 {
                break;
            }
            if st.prev_free.contains(i) && take.insert(*i) {
                extra -= 1;
            }
        }
        st.prev_free = free;
        for idx in take {
            st.pending.insert(idx);
            self.spawn_take(idx, tx);
        }
        for idx in inherit {
            st.pending.insert(idx);
            self.spawn_inherit(idx, tx);
        }

        // Steal: below our share with nothing free, from the members most above their own,
        // at most `max_steals` shards in flight, one request per victim at a time.
        let max_steals = self.set.config.max_steals(target);
        if st.mine() < target && st.steals < max_steals && st.prev_free.is_empty() {
            let mut lists: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
            for (i, o) in view.owners.iter().enumerate() {
                if let Some((owner, _)) = o {
                    lists.entry(owner.as_str()).or_default().push(i);
                }
            }
            let mut victims: Vec<(usize, &str, Vec<usize>)> = lists
                .into_iter()
                .filter(|(w, _)| *w != &*self.me && members.iter().any(|m| m == *w))
                .map(|(w, list)| {
                    let excess = list.len().saturating_sub(fair_share(k, &members, w));
                    (excess, w, list)
                })
                .filter(|(excess, _, _)| *excess > 0)
                .collect();
            victims.sort_by_key(|(excess, w, _)| (std::cmp::Reverse(*excess), *w));
            let mut want = target - st.mine();
            for (excess, victim, mut list) in victims {
                let room = max_steals.saturating_sub(st.steals).min(want).min(excess);
                if room == 0 {
                    break;
                }
                list.retain(|i| !st.pending.contains(i));
                list.sort_by_key(|i| std::cmp::Reverse(rank(&self.me, &self.set.shards[*i].0)));
                list.truncate(room);
                if list.is_empty() {
                    continue;
                }
                st.steals += list.len();
                want -= list.len();
                st.pending.extend(list.iter().copied());
                self.spawn_steal(victim.to_string(), list, tx);
            }
        }
        self.publish(st);
        if st.follow_ups > 0 {
            st.follow_ups -= 1;
            return every / 8;
        }
        every
    }

    /// One attempt at a free shard, at most `acquire_concurrency` at once.
    fn spawn_take(&self, idx: usize, tx: &mpsc::UnboundedSender<Internal>) {
        let (sup, set, tx, cancel, takes) = (
            self.sup.clone(),
            self.set.clone(),
            tx.clone(),
            self.acquiring.clone(),
            self.takes.clone(),
        );
        tokio::spawn(async move {
            let got = tokio::select! {
                _ = cancel.cancelled() => None,
                permit = takes.acquire_owned() => match permit {
                    Ok(_permit) if !cancel.is_cancelled() => {
                        match sup.try_acquire(&set.shards[idx].1).await {
                            Ok(Acquisition::Acquired(g)) => Some(g),
                            Ok(_) => None,
                            Err(e) => {
                                tracing::debug!(shard = %set.shards[idx].0, error = %e, "shard acquisition failed");
                                None
                            }
                        }
                    }
                    _ => None,
                },
            };
            let _ = tx.send(Internal::outcome(idx, got, false));
        });
    }

    /// Waits (up to the steal wait) on a shard whose holder is no longer a member, and takes it
    /// on its release wake-up or expiry.
    fn spawn_inherit(&self, idx: usize, tx: &mpsc::UnboundedSender<Internal>) {
        let (sup, set, tx, cancel) = (
            self.sup.clone(),
            self.set.clone(),
            tx.clone(),
            self.acquiring.clone(),
        );
        tokio::spawn(async move {
            let wait = set.config.steal_wait();
            let got = acquire_bounded(&sup, &set.shards[idx].1, wait, &cancel).await;
            let _ = tx.send(Internal::outcome(idx, got, false));
        });
    }

    /// Asks `victim` for `shards` (a request `ME/N` in its mailbox, held while we wait) and waits
    /// on each of them with the store's watch, up to the steal wait.
    fn spawn_steal(
        &self,
        victim: String,
        shards: Vec<usize>,
        tx: &mpsc::UnboundedSender<Internal>,
    ) {
        let (sup, set, me, tx, cancel) = (
            self.sup.clone(),
            self.set.clone(),
            self.me.clone(),
            tx.clone(),
            self.acquiring.clone(),
        );
        tokio::spawn(async move {
            let wait = set.config.steal_wait();
            let op = sup.config().op_timeout();
            let req = OwnerId::instance(&format!("{me}/{}", shards.len())).and_then(|owner| {
                Ok(AcquireRequest::new(
                    set.mailbox(&victim)?,
                    owner,
                    store_ttl(&*set.store, wait),
                ))
            });
            let mail = match req {
                Ok(req) => match timeout(op, set.store.acquire(&req)).await {
                    Ok(Ok(AcquireOutcome::Acquired(l))) => Some(l),
                    _ => None,
                },
                Err(_) => None,
            };
            let Some(mail) = mail else {
                for idx in shards {
                    let _ = tx.send(Internal::NotAcquired { idx, steal: true });
                }
                return;
            };
            for idx in &shards {
                set.hook.steal_requested(&me, &victim, &set.shards[*idx].0);
            }
            let waits = shards.iter().map(|idx| {
                let (sup, set, tx, cancel) = (&sup, &set, &tx, &cancel);
                async move {
                    let got = acquire_bounded(sup, &set.shards[*idx].1, wait, cancel).await;
                    let _ = tx.send(Internal::outcome(*idx, got, true));
                }
            });
            futures::future::join_all(waits).await;
            let _ = timeout(op, set.store.release(&mail)).await;
        });
    }
}

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
