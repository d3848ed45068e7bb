//! Leader election over any [`LeaseStore`].
//!
//! Candidates campaign for one key; the leader's **term is its fencing token**. Each candidate
//! gets a stream of [`ElectionEvent`]s (elected with a term and a cancellation token for
//! leader-only work, stepped down with a reason); anyone can [`observe`](Election::observe) who
//! leads with which term.
//!
//! A term ends (leader-only work cancelled, [`ElectionEvent::SteppedDown`] sent, role back to
//! follower) whenever the leader's lease is lost: renewal refused or not confirmed in time, a host
//! suspend past the loss deadline (see [`clock`](crate::clock)), or the renewal or campaign task
//! ending early (a panicking hook). Store calls of campaigns and observers are bounded by the op
//! timeout.
//!
//! # A leader flag is never authority
//! A leader can be paused past its lease and resume believing it still leads. Carry the term into
//! every downstream write and let the resource reject older terms:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use lease_core::election::{Election, ElectionEvent};
//! use lease_core::supervisor::SupervisorConfig;
//! use lease_core::{FencedResource, LeaseKey, MemoryFencedResource, MemoryLeaseStore, OwnerId, WriteOp};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
//! let election = Election::new(MemoryLeaseStore::new(), LeaseKey::new("scheduler")?,
//!     SupervisorConfig::new(Duration::from_secs(5)).with_acquire_wait(Duration::from_secs(5)));
//! let resource = MemoryFencedResource::new();
//! let mut me = election.join(OwnerId::with_label("node-1"));
//! if let Some(ElectionEvent::Elected { term, work }) = me.next_event().await {
//!     // WRONG: `if me.is_leader() { write(..) }` -- a stale leader would still write.
//!     // RIGHT: every write carries the term; the resource rejects older terms.
//!     let out = resource.write(&LeaseKey::new("scheduler")?, term, WriteOp::Put(b"tick".to_vec())).await?;
//!     assert!(out.is_accepted());
//!     assert!(!work.is_cancelled());
//! }
//! me.resign().await;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

use crate::fencing::FencingToken;
use crate::lease::{LeaseKey, OwnerId};
use crate::store::LeaseStore;
use crate::supervisor::{Acquisition, Health, LossReason, Supervisor, SupervisorConfig};

/// Why a leader stepped down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepDownReason {
    /// The lease was lost.
    Lost(LossReason),
    /// The candidate resigned.
    Resigned,
}

impl fmt::Display for StepDownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepDownReason::Lost(r) => write!(f, "lost: {r}"),
            StepDownReason::Resigned => f.write_str("resigned"),
        }
    }
}

/// What happens to a candidate.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ElectionEvent {
    /// This candidate leads now.
    Elected {
        /// The term: the lease's fencing token. Carry it into every downstream write.
        term: FencingToken,
        /// Cancelled when this term ends: hand it to leader-only work.
        work: CancellationToken,
    },
    /// This candidate no longer leads (its leader-only work has been cancelled).
    SteppedDown {
        /// The term that ended.
        term: FencingToken,
        /// Why.
        reason: StepDownReason,
    },
}

/// A candidate's current role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not leading (campaigning or resigned).
    Follower,
    /// Leading with this term.
    Leader {
        /// The term.
        term: FencingToken,
    },
}

/// Who leads, as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leadership {
    /// The current leader, if any.
    pub leader: Option<OwnerId>,
    /// Its term.
    pub term: Option<FencingToken>,
}

/// An election on one key.
#[derive(Debug, Clone)]
pub struct Election {
    store: Arc<dyn LeaseStore>,
    key: LeaseKey,
    config: SupervisorConfig,
    hook: Option<Arc<dyn crate::supervisor::Hook>>,
}

impl Election {
    /// An election on `key`. `config` gives the lease TTL and how long each campaign round waits
    /// (a zero acquire wait is raised to the TTL so followers wake on expiry).
    pub fn new<S: LeaseStore + 'static>(store: S, key: LeaseKey, config: SupervisorConfig) -> Self {
        Self::from_arc(Arc::new(store), key, config)
    }

    /// An election over a shared store.
    pub fn from_arc(
        store: Arc<dyn LeaseStore>,
        key: LeaseKey,
        mut config: SupervisorConfig,
    ) -> Self {
        if config.acquire_wait().is_zero() {
            let ttl = config.ttl();
            config = config.with_acquire_wait(ttl);
        }
        Election {
            store,
            key,
            config,
            hook: None,
        }
    }

    /// The election's key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// Reports every step of every candidate (and leadership changes) to `hook`.
    pub fn with_hook(mut self, hook: Arc<dyn crate::supervisor::Hook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Joins as `id` and starts campaigning in a background task.
    pub fn join(&self, id: OwnerId) -> Candidate {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (role_tx, role_rx) = watch::channel(Role::Follower);
        let stop = CancellationToken::new();
        let mut sup =
            Supervisor::from_arc(self.store.clone(), self.config.clone()).with_owner(id.clone());
        if let Some(h) = &self.hook {
            sup = sup.with_hook(h.clone());
        }
        let task = tokio::spawn(campaign(
            sup,
            self.key.clone(),
            events_tx,
            role_tx,
            stop.clone(),
        ));
        Candidate {
            id,
            events: events_rx,
            role: role_rx,
            stop,
            task: Some(task),
        }
    }

    /// Watches who leads. Updates on change (woken by the store's watch where it has one, and by
    /// polling a few times per TTL otherwise).
    pub fn observe(&self) -> Observer {
        let (tx, rx) = watch::channel(Leadership::default());
        let stop = CancellationToken::new();
        let poll = (self.config.ttl() / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        tokio::spawn(observe(
            self.store.clone(),
            self.key.clone(),
            poll,
            self.config.op_timeout(),
            tx,
            stop.clone(),
        ));
        Observer {
            rx,
            _stop: stop.drop_guard(),
        }
    }
}

/// One candidate in an election. Dropping it leaves the election (releasing in the background).
#[derive(Debug)]
pub struct Candidate {
    id: OwnerId,
    events: mpsc::UnboundedReceiver<ElectionEvent>,
    role: watch::Receiver<Role>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Candidate {
    /// The candidate's id.
    pub fn id(&self) -> &OwnerId {
        &self.id
    }

    /// The next event, or `None` once the candidate left the election.
    ///
    /// # Cancellation safety
    /// Cancel safe: an event is either returned or stays queued.
    pub async fn next_event(&mut self) -> Option<ElectionEvent> {
        self.events.recv().await
    }

    /// The current role. A hint for dashboards, **not authority**: carry the term into writes.
    pub fn role(&self) -> Role {
        *self.role.borrow()
    }

    /// Whether this candidate currently believes it leads (see [`Candidate::role`]).
    pub fn is_leader(&self) -> bool {
        matches!(self.role(), Role::Leader { .. })
    }

    /// A receiver of role changes.
    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// Leaves the election: cancels leader-only work, releases the lease if leading (so another
    /// candidate takes over at once, without waiting for the TTL), and waits for that to finish.
    ///
    /// # Cancellation safety
    /// Cancel safe: the resignation completes in the background.
    pub async fn resign(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A view of who leads.
#[derive(Debug)]
pub struct Observer {
    rx: watch::Receiver<Leadership>,
    _stop: tokio_util::sync::DropGuard,
}

impl Observer {
    /// The leadership as last seen.
    pub fn current(&self) -> Leadership {
        self.rx.borrow().clone()
    }

    /// Waits for the next change and returns it; `None` if the observer task ended.
    ///
    /// # Cancellation safety
    /// Cancel safe.
    pub async fn changed(&mut self) -> Option<Leadership> {
        self.rx.changed().await.ok()?;
        Some(self.rx.borrow_and_update().clone())
    }
}

/// The campaign's outputs. If the campaign task ends without returning (a panicking hook, or
/// its runtime shutting down), dropping this ends the term it announced and leaves the candidate
/// a follower, so nobody is left believing it leads.
struct CampaignEnd {
    events: mpsc::UnboundedSender<ElectionEvent>,
    role: watch::Sender<Role>,
    /// The term announced and not yet ended.
    term: Option<FencingToken>,
}

impl Drop for CampaignEnd {
    fn drop(&mut self) {
        if let Some(term) = self.term.take() {
            let _ = self.events.send(ElectionEvent::SteppedDown {
                term,
                reason: StepDownReason::Lost(LossReason::RenewalTaskEnded),
            });
        }
        self.role.send_replace(Role::Follower);
    }
}

async fn campaign(
    sup: Supervisor,
    key: LeaseKey,
    events: mpsc::UnboundedSender<ElectionEvent>,
    role: watch::Sender<Role>,
    stop: CancellationToken,
) {
    let mut out = CampaignEnd {
        events,
        role,
        term: None,
    };
    let mut failures: u32 = 0;
    while !stop.is_cancelled() {
        match sup.acquire_until_cancelled(&key, &stop).await {
            Ok(Acquisition::Acquired(guard)) => {
                failures = 0;
                let term = guard.token();
                out.term = Some(term);
                out.role.send_replace(Role::Leader { term });
                tracing::info!(backend = sup.store().backend(), key = %key, owner = %sup.owner(), term = %term, "elected leader");
                sup.hook().leadership(&key, sup.owner(), Some(term));
                let _ = out.events.send(ElectionEvent::Elected {
                    term,
                    work: guard.cancellation(),
                });
                let reason = tokio::select! {
                    h = guard.lost() => match h {
                        Health::Lost(r) => StepDownReason::Lost(r),
                        _ => StepDownReason::Resigned,
                    },
                    _ = stop.cancelled() => {
                        let _ = guard.release().await;
                        StepDownReason::Resigned
                    }
                };
                out.role.send_replace(Role::Follower);
                out.term = None;
                sup.hook().leadership(&key, sup.owner(), None);
                if reason == StepDownReason::Resigned {
                    tracing::info!(backend = sup.store().backend(), key = %key, owner = %sup.owner(), term = %term, %reason, "stepped down");
                } else {
                    tracing::warn!(backend = sup.store().backend(), key = %key, owner = %sup.owner(), term = %term, %reason, "stepped down");
                }
                let _ = out.events.send(ElectionEvent::SteppedDown { term, reason });
            }
            Ok(Acquisition::NotAcquired { .. }) => {}
            Ok(Acquisition::Cancelled) => break,
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::debug!(key = %key, error = %e, "campaign attempt failed");
                let pause = sup.config().backoff(failures);
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = sleep(pause) => {}
                }
            }
        }
    }
}

async fn observe(
    store: Arc<dyn LeaseStore>,
    key: LeaseKey,
    poll: Duration,
    op_timeout: Duration,
    tx: watch::Sender<Leadership>,
    stop: CancellationToken,
) {
    // Every store call is bounded: a watch that does not open in time leaves us polling.
    let mut watch = timeout(op_timeout, store.watch(&key))
        .await
        .ok()
        .and_then(|w| w.ok())
        .flatten();
    loop {
        if let Ok(Ok(state)) = timeout(op_timeout, store.inspect(&key)).await {
            let now = Leadership {
                leader: state.holder.as_ref().map(|h| h.owner.clone()),
                term: state.holder.as_ref().map(|h| h.token),
            };
            tx.send_if_modified(|cur| {
                if *cur != now {
                    *cur = now;
                    true
                } else {
                    false
                }
            });
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tx.closed() => return,
            _ = sleep(poll) => {}
            changed = async {
                match watch.as_mut() {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                }
            } => {
                if !matches!(changed, Some(Ok(()))) {
                    watch = None;
                }
            }
        }
    }
}
