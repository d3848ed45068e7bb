//! The set and its members: [`ShardSet`] (the shards, their keys, joining, snapshots) and
//! [`Worker`] (one member's handle on its background task, the [driver](crate::driver)).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use leasehold_core::supervisor::{Hook, Supervisor};
use leasehold_core::{Error, FencingToken, LeaseKey, LeaseStore, OwnerId, Result};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use crate::ShardSetConfig;
use crate::driver::Run;
use crate::events::{NoShardHook, ShardEvent, ShardHook, Snapshot};
use crate::membership::scan;

/// What every worker of a set shares: the store, the keys, the configuration and the hooks.
#[derive(Debug, Clone)]
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) name: String,
    /// The set's name as a key: its shard, slot and mailbox keys are reserved keys beside it.
    pub(crate) name_key: LeaseKey,
    pub(crate) shards: Vec<(Arc<str>, LeaseKey)>,
    pub(crate) slots: Vec<LeaseKey>,
    pub(crate) config: ShardSetConfig,
    pub(crate) hook: Arc<dyn ShardHook>,
    pub(crate) lease_hook: Option<Arc<dyn Hook>>,
}

impl Inner {
    /// The mailbox key of `worker`.
    pub(crate) fn mailbox(&self, worker: &str) -> Result<LeaseKey> {
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
        let slots = (0..config.max_workers())
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
                        .acquire_concurrency()
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
        let op = set.config.supervisor().op_timeout();
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
        let v = scan(&self.inner, None, true).await?.view;
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
