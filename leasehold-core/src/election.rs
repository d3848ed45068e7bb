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
//! A **planned** end of a term ([`Candidate::handover`], a yield to a
//! [preferred](Election::with_preferred) candidate, [`Candidate::resign`], dropping the
//! candidate) drains before it releases: the term's work token is cancelled, then the leader
//! waits until every [`DrainGuard`] of the term is dropped, up to the
//! [drain timeout](Election::with_drain_timeout), still holding (and renewing) the lease, and
//! only then releases it. A lost lease is never drained: nothing is left to hold.
//!
//! # A leader flag is never authority
//! A leader can be paused past its lease and resume believing it still leads. Carry the term into
//! every downstream write and let the resource reject older terms:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leasehold_core::election::{Election, ElectionEvent};
//! use leasehold_core::supervisor::SupervisorConfig;
//! use leasehold_core::{FencedResource, LeaseKey, MemoryFencedResource, MemoryLeaseStore, OwnerId, WriteOp};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let election = Election::new(MemoryLeaseStore::new(), LeaseKey::new("scheduler")?,
//!     SupervisorConfig::new(Duration::from_secs(5)).with_acquire_wait(Duration::from_secs(5)));
//! let resource = MemoryFencedResource::new();
//! let mut me = election.join(OwnerId::with_label("node-1"));
//! if let Some(ElectionEvent::Elected { term, work, .. }) = me.next_event().await {
//!     // WRONG: `if me.is_leader() { write(..) }` -- a stale leader would still write.
//!     // RIGHT: every write carries the term; the resource rejects older terms.
//!     let out = resource.write(&LeaseKey::new("scheduler")?, term, WriteOp::Put(b"tick".to_vec())).await?;
//!     assert!(out.is_accepted());
//!     assert!(!work.is_cancelled());
//! }
//! me.resign().await;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - `election.rs`: the public types ([`Election`], [`Candidate`], [`Observer`], events, roles).
//! - `election/campaign.rs`: the campaign driver, a thin loop that reads the store, waits,
//!   acquires and holds each term through the supervisor (and the observer's task).
//! - `election/plan.rs`: the campaign's decisions as pure functions (whom a reservation is for,
//!   how long to reserve and to wait, when to give up on an unreadable reservation, why a term
//!   ended, whom to yield to), unit-tested without a store.
//! - `election/plan_model.rs` (tests only): a bounded model check that steps the plan's decisions
//!   for 2-3 candidates through every interleaving against an abstract store (one leader, terms
//!   ordered, reservations honoured, someone leads once faults stop), with a coverage guard and
//!   negative controls.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::fencing::FencingToken;
use crate::hook::Hook;
use crate::lease::{LeaseKey, OwnerId};
use crate::store::LeaseStore;
use crate::supervisor::{LossReason, Supervisor, SupervisorConfig};

mod campaign;
mod plan;

/// Why a leader stepped down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepDownReason {
    /// The lease was lost.
    Lost(LossReason),
    /// The candidate resigned.
    Resigned,
    /// The leader handed over to a named successor ([`Candidate::handover`]) or yielded to a
    /// preferred candidate ([`Election::with_preferred`]).
    HandedOver,
}

impl fmt::Display for StepDownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepDownReason::Lost(r) => write!(f, "lost: {r}"),
            StepDownReason::Resigned => f.write_str("resigned"),
            StepDownReason::HandedOver => f.write_str("handed over"),
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
        /// Held by leader-only work until it has stopped: a planned end of the term waits for
        /// every clone to be dropped (bounded by the drain timeout) before it releases the
        /// lease. Dropping it at once (`Elected { term, work, .. }`) opts out of draining.
        drain: DrainGuard,
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

/// Keeps a term's lease held while leader-only work drains.
///
/// Sent with [`ElectionEvent::Elected`]. When the term ends by plan (handover, a yield to a
/// preferred candidate, resign, drop), the leader first cancels the term's `work` token, then
/// waits until every clone of this guard is dropped, or the election's
/// [drain timeout](Election::with_drain_timeout) has passed, or the lease is lost, and only then
/// releases the lease. A successor therefore acquires after the work stopped, not while it still
/// runs. A lost lease is not waited for. An `Elected` event left unread holds its guard: a
/// candidate whose events nobody reads waits the full drain timeout.
///
/// Draining is a courtesy, not the safety mechanism: the term (fencing token) still has to go
/// with every write, since a paused process can outlive any wait.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::election::{Election, ElectionEvent};
/// use leasehold_core::supervisor::SupervisorConfig;
/// use leasehold_core::{LeaseKey, MemoryLeaseStore, OwnerId};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let ttl = Duration::from_secs(5);
/// let election = Election::new(MemoryLeaseStore::new(), LeaseKey::new("indexer")?,
///     SupervisorConfig::new(ttl).with_acquire_wait(ttl))
///     .with_drain_timeout(Duration::from_secs(2));
/// let mut me = election.join(OwnerId::with_label("node-1"));
/// if let Some(ElectionEvent::Elected { term, work, drain }) = me.next_event().await {
///     let job = tokio::spawn(async move {
///         let _drain = drain; // the lease stays held until this task ends (or 2 s pass)
///         work.cancelled().await;
///         // ... finish the batch in flight, writing with `term` ...
///         let _ = term;
///     });
///     me.resign().await; // cancels `work`, waits for `job` to drop its guard, releases
///     assert!(job.is_finished());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DrainGuard {
    _held: watch::Receiver<()>,
}

/// Who leads, as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leadership {
    /// The current leader's identity (the id it joined with, not the instance that holds the
    /// lease), if any.
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
    hook: Option<Arc<dyn Hook>>,
    preferred: Vec<OwnerId>,
    drain: Option<Duration>,
    reservation_bound: Option<Duration>,
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
            preferred: Vec::new(),
            drain: None,
            reservation_bound: None,
        }
    }

    /// How long a planned end of a term (handover, yield, resign, drop) waits for the term's
    /// [`DrainGuard`]s to be dropped before it releases the lease anyway (default: one renewal
    /// interval). The lease is held and renewed meanwhile; a lost lease ends the wait.
    pub fn with_drain_timeout(mut self, wait: Duration) -> Self {
        self.drain = Some(wait);
        self
    }

    /// How long a candidate that cannot read the handover reservation (its inspect fails or
    /// times out) stays out of the campaign before it campaigns anyway (default: the op
    /// timeout, so a second read is tried before it gives up). While the reservation's state is
    /// unknown, a candidate never takes the lead: it retries the read at the shortest backoff
    /// until the state is known or this bound has passed.
    ///
    /// A longer bound keeps a planned handover's successor safer from a candidate on a lossy
    /// link, at the price of liveness: a candidate that has just acquired the key holds it
    /// without leading while it waits, so after a partition heals the lead may come back this
    /// much later. The deterministic simulation's liveness check (someone leads within three
    /// TTLs of the heal, over 5,000 seeds with message loss) failed with the TTL as the default
    /// and passes with the op timeout.
    pub fn with_reservation_bound(mut self, bound: Duration) -> Self {
        self.reservation_bound = Some(bound);
        self
    }

    /// The reservation bound (see [`Election::with_reservation_bound`]).
    pub fn reservation_bound(&self) -> Duration {
        self.reservation_bound
            .unwrap_or_else(|| self.config.op_timeout())
    }

    /// The drain timeout (see [`Election::with_drain_timeout`]).
    pub fn drain_timeout(&self) -> Duration {
        self.drain.unwrap_or_else(|| self.config.renew_interval())
    }

    /// Preferred candidates, best first. A joined preferred candidate announces itself with a
    /// presence lease (`KEY.lease--preferred.I`, in the [reserved
    /// namespace](LeaseKey::reserved)); a leader that is not preferred, or less preferred, looks every
    /// renewal interval for a better one present and [hands over](Candidate::handover) to it
    /// (bounded by the TTL). Leadership is never taken by force: only the leader yields.
    ///
    /// The ids are identities, as given to [`Election::join`]. Of several candidates joined with
    /// one preferred id, one holds the presence lease; the leader hands over to the id, and
    /// whichever of them claims the lead first takes it.
    pub fn with_preferred(mut self, preferred: Vec<OwnerId>) -> Self {
        self.preferred = preferred;
        self
    }

    /// The reservation key of a handover, in the reserved namespace no user key can name:
    /// `KEY.lease--handover` (`None` for a key too long to have one: no handover then).
    fn reservation_key(&self) -> Option<LeaseKey> {
        self.key.reserved("handover").ok()
    }

    /// The presence key of the `i`-th preferred candidate, in the reserved namespace:
    /// `KEY.lease--preferred.I`.
    fn presence_key(&self, i: usize) -> Option<LeaseKey> {
        self.key.reserved(&format!("preferred.{i}")).ok()
    }

    /// The election's key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// Reports every step of every candidate (and leadership changes) to `hook`.
    pub fn with_hook(mut self, hook: Arc<dyn Hook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Joins as `id` and starts campaigning in a background task (see [`Election::try_join`]).
    ///
    /// An `id` or settings that [`Election::try_join`] refuses (an id longer than 111 bytes,
    /// leaving no room for the instance part; a TTL or timings that leave no time to renew)
    /// give a candidate that has left at once: it never leads and
    /// [`Candidate::next_event`] returns `None`; the error is logged. Use
    /// [`Election::try_join`] to get it.
    pub fn join(&self, id: OwnerId) -> Candidate {
        match self.try_join(id.clone()) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(key = %self.key, id = %id, error = %e, "cannot join the election");
                let (_, events) = mpsc::unbounded_channel();
                let (_, role) = watch::channel(Role::Follower);
                let (commands, _) = mpsc::unbounded_channel();
                Candidate {
                    owner: id.clone(),
                    id,
                    events,
                    role,
                    stop: CancellationToken::new(),
                    commands,
                    task: None,
                }
            }
        }
    }

    /// Joins as `id` and starts campaigning in a background task.
    ///
    /// `id` is the candidate's stable identity: what [`Candidate::id`], [`Leadership::leader`],
    /// [`Election::with_preferred`] and [`Candidate::handover`] speak of. The candidate holds its
    /// leases under an [instance](OwnerId::instance) of it ([`Candidate::owner`]), so two
    /// processes that join with the same id are two owners to the store and never both lead.
    ///
    /// # Errors
    /// - [`Error::InvalidOwner`](crate::Error::InvalidOwner) if `id` leaves no room for the
    ///   instance part (longer than 111 bytes).
    /// - The error of [`SupervisorConfig::validate`] if the election's settings leave no time to
    ///   renew (or the TTL is zero or over a day): such a candidate could never lead.
    pub fn try_join(&self, id: OwnerId) -> crate::Result<Candidate> {
        self.config.validate()?;
        let owner = OwnerId::instance(id.as_str())?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (role_tx, role_rx) = watch::channel(Role::Follower);
        let stop = CancellationToken::new();
        let mut sup =
            Supervisor::from_arc(self.store.clone(), self.config.clone()).with_owner(owner.clone());
        if let Some(h) = &self.hook {
            sup = sup.with_hook(h.clone());
        }
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let rank = self.preferred.iter().position(|p| *p == id);
        let presence: Vec<LeaseKey> = (0..self.preferred.len())
            .filter_map(|i| self.presence_key(i))
            .collect();
        let setup = Setup {
            identity: id.clone(),
            reservation: self.reservation_key(),
            presence,
            preferred: self.preferred.clone(),
            rank,
            commands: cmd_rx,
            drain: self.drain_timeout(),
            reservation_bound: self.reservation_bound(),
        };
        let task = tokio::spawn(campaign::campaign(
            sup,
            self.key.clone(),
            events_tx,
            role_tx,
            stop.clone(),
            setup,
        ));
        Ok(Candidate {
            id,
            owner,
            events: events_rx,
            role: role_rx,
            stop,
            commands: cmd_tx,
            task: Some(task),
        })
    }

    /// Watches who leads. Updates on change (woken by the store's watch where it has one, and by
    /// polling a few times per TTL otherwise).
    pub fn observe(&self) -> Observer {
        let (tx, rx) = watch::channel(Leadership::default());
        let stop = CancellationToken::new();
        let poll = (self.config.ttl() / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        tokio::spawn(campaign::observe(
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

/// One candidate in an election. Dropping it leaves the election (draining and releasing in the
/// background, as [`Candidate::resign`] does).
#[derive(Debug)]
pub struct Candidate {
    id: OwnerId,
    owner: OwnerId,
    events: mpsc::UnboundedReceiver<ElectionEvent>,
    role: watch::Receiver<Role>,
    stop: CancellationToken,
    commands: mpsc::UnboundedSender<Handover>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// A handover request to the campaign task.
type Handover = (OwnerId, Duration, oneshot::Sender<bool>);

/// What the campaign needs for handovers and preferred candidates.
struct Setup {
    /// The id the candidate joined with (its leases are held under an instance of it).
    identity: OwnerId,
    reservation: Option<LeaseKey>,
    presence: Vec<LeaseKey>,
    preferred: Vec<OwnerId>,
    rank: Option<usize>,
    commands: mpsc::UnboundedReceiver<Handover>,
    /// How long a planned end of a term waits for its drain guards.
    drain: Duration,
    /// How long an unreadable reservation is waited for.
    reservation_bound: Duration,
}

impl Candidate {
    /// Planned handover to `successor` (an id as given to [`Election::join`]; of several
    /// candidates joined with it, whichever claims first leads): if this candidate leads, it
    /// leaves a reservation (`KEY.lease--handover`, in the [reserved
    /// namespace](LeaseKey::reserved), held for `successor`), ends its term and drains: it
    /// cancels the term's `work` token and waits until every [`DrainGuard`] of the term is
    /// dropped (up to the [drain timeout](Election::with_drain_timeout), still holding the
    /// lease), then releases. Only `successor` may then take the lead: another candidate that
    /// acquires the key while the reservation stands gives it back at once without announcing a
    /// term. If the successor does not claim within `within` after the release, the reservation
    /// expires and anyone may. (The reservation is written before the drain, for `within` plus
    /// the drain timeout plus the op timeout, and cut back to `within` once the release
    /// returned; if the cut fails, the longer reservation stands.)
    ///
    /// A candidate that cannot read the reservation (its inspect fails or times out) does not
    /// take the lead while it cannot: it retries, and campaigns anyway only once the
    /// [reservation bound](Election::with_reservation_bound) has passed.
    ///
    /// Returns once the lease is released: `true` if this candidate was leading and handed over,
    /// `false` if it was not leading (nothing changes) or the reservation could not be written
    /// (it keeps leading; its work is not cancelled): the store refused or did not answer, the
    /// reservation would last over a day ([`MAX_TTL`](crate::MAX_TTL)), or the election's key
    /// is too long to have a reservation key (over 184 bytes).
    ///
    /// # Cancellation safety
    /// Cancel safe: the handover, once started, completes in the campaign task.
    pub async fn handover(&self, successor: &OwnerId, within: Duration) -> bool {
        if !self.is_leader() {
            return false;
        }
        let (tx, rx) = oneshot::channel();
        if self.commands.send((successor.clone(), within, tx)).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// The candidate's id: the identity it joined with.
    pub fn id(&self) -> &OwnerId {
        &self.id
    }

    /// The owner the candidate's leases are held under: an [instance](OwnerId::instance) of
    /// [`Candidate::id`], different for every candidate (what the store and the
    /// [`Hook`]'s leases show).
    pub fn owner(&self) -> &OwnerId {
        &self.owner
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

    /// Leaves the election: cancels leader-only work, waits for it to drain (see [`DrainGuard`];
    /// bounded by the drain timeout), releases the lease if leading (so another candidate takes
    /// over at once, without waiting for the TTL), and waits for that to finish.
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

#[cfg(test)]
mod handover_tests;
#[cfg(test)]
mod instance_tests;
#[cfg(test)]
mod namespace_tests;
#[cfg(test)]
mod plan_model;
#[cfg(test)]
mod reservation_tests;
