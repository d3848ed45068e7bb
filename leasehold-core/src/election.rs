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

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

use crate::fencing::FencingToken;
use crate::hook::Hook;
use crate::lease::{AcquireOutcome, AcquireRequest, Lease, LeaseKey, OwnerId};
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
        let plan = Plan {
            identity: id.clone(),
            reservation: self.reservation_key(),
            presence,
            preferred: self.preferred.clone(),
            rank,
            commands: cmd_rx,
            drain: self.drain_timeout(),
            reservation_bound: self.reservation_bound(),
        };
        let task = tokio::spawn(campaign(
            sup,
            self.key.clone(),
            events_tx,
            role_tx,
            stop.clone(),
            plan,
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
struct Plan {
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
    mut plan: Plan,
) {
    let mut out = CampaignEnd {
        events,
        role,
        term: None,
    };
    let store = sup.store().clone();
    let op = sup.config().op_timeout();
    let ttl = sup.config().ttl();
    let tick = sup.config().renew_interval();
    // A preferred candidate announces itself with a presence lease (one attempt per round).
    let presence_sup = Supervisor::from_arc(
        store.clone(),
        sup.config().clone().with_acquire_wait(Duration::ZERO),
    )
    .with_owner(sup.owner().clone());
    let mut presence: Option<crate::supervisor::LeaseGuard> = None;
    // Preferred candidates better than this one (all of them if it is not preferred).
    let better = plan.rank.unwrap_or(plan.preferred.len());
    let mut failures: u32 = 0;
    while !stop.is_cancelled() {
        while let Ok((_, _, reply)) = plan.commands.try_recv() {
            let _ = reply.send(false); // not leading
        }
        if let Some(r) = plan.rank
            && presence.as_ref().is_none_or(|g| g.health().is_final())
            && let Some(k) = plan.presence.get(r)
        {
            presence = match presence_sup.acquire(k).await {
                Ok(Acquisition::Acquired(g)) => Some(g),
                _ => None,
            };
        }
        // A handover reserved for someone else: stay out until it is claimed or expires. A
        // reservation that cannot be read is waited for (up to the bound), never ignored.
        match known_reservation(&*store, &plan, sup.owner(), sup.config(), &stop).await {
            None => break,
            Some(Reservation::ForOther(left)) => {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = sleep(left.min(tick).max(Duration::from_millis(1))) => {}
                }
                continue;
            }
            Some(Reservation::Clear) => {}
        }
        match sup.acquire_until_cancelled(&key, &stop).await {
            Ok(Acquisition::Acquired(guard)) => {
                // Acquired while a reservation for someone else stands (or may stand: it cannot
                // be read): give the key back, without announcing a term.
                match known_reservation(&*store, &plan, sup.owner(), sup.config(), &stop).await {
                    None => {
                        let _ = guard.release().await;
                        break;
                    }
                    Some(Reservation::ForOther(_)) => {
                        let _ = guard.release().await;
                        continue;
                    }
                    Some(Reservation::Clear) => {}
                }
                clear_reservation(
                    &*store,
                    plan.reservation.as_ref(),
                    &plan.identity,
                    sup.owner(),
                    ttl,
                    op,
                )
                .await;
                failures = 0;
                let term = guard.token();
                out.term = Some(term);
                out.role.send_replace(Role::Leader { term });
                tracing::info!(backend = sup.store().backend(), key = %key, owner = %sup.owner(), term = %term, "elected leader");
                sup.hook().leadership(&key, &plan.identity, Some(term));
                let work = guard.cancellation();
                let (drained, held) = watch::channel(());
                let _ = out.events.send(ElectionEvent::Elected {
                    term,
                    work: work.clone(),
                    drain: DrainGuard { _held: held },
                });
                let end = TermEnd {
                    work,
                    drained,
                    wait: plan.drain,
                };
                let mut guard = Some(guard);
                let reason = loop {
                    let g = guard.as_ref().expect("held while leading");
                    tokio::select! {
                        h = g.lost() => break match h {
                            Health::Lost(r) => StepDownReason::Lost(r),
                            _ => StepDownReason::Resigned,
                        },
                        _ = stop.cancelled() => {
                            // Not a leader from the moment the drain starts.
                            out.role.send_replace(Role::Follower);
                            if let Some(g) = guard.take() {
                                end.drain(&g).await;
                                let _ = g.release().await;
                            }
                            break StepDownReason::Resigned;
                        }
                        Some((successor, within, reply)) = plan.commands.recv() => {
                            if let Some(reserved) = reserve(&*store, plan.reservation.as_ref(), &successor, end.reserve_for(within, op), op).await {
                                out.role.send_replace(Role::Follower);
                                if let Some(g) = guard.take() {
                                    end.drain_and_release(g, &*store, plan.reservation.as_ref(), (&successor, reserved), within, op).await;
                                }
                                let _ = reply.send(true);
                                break StepDownReason::HandedOver;
                            }
                            let _ = reply.send(false);
                        }
                        _ = sleep(tick), if better > 0 => {
                            if let Some(successor) = better_present(&*store, &plan.presence[..better], op).await
                                && successor != plan.identity
                                && let Some(reserved) = reserve(&*store, plan.reservation.as_ref(), &successor, end.reserve_for(ttl, op), op).await
                            {
                                tracing::info!(key = %key, owner = %sup.owner(), successor = %successor, "yielding to a preferred candidate");
                                out.role.send_replace(Role::Follower);
                                if let Some(g) = guard.take() {
                                    end.drain_and_release(g, &*store, plan.reservation.as_ref(), (&successor, reserved), ttl, op).await;
                                }
                                break StepDownReason::HandedOver;
                            }
                        }
                    }
                };
                drop(guard);
                out.role.send_replace(Role::Follower);
                out.term = None;
                sup.hook().leadership(&key, &plan.identity, None);
                if matches!(reason, StepDownReason::Lost(_)) {
                    tracing::warn!(backend = sup.store().backend(), key = %key, owner = %sup.owner(), term = %term, %reason, "stepped down");
                } else {
                    tracing::info!(backend = sup.store().backend(), key = %key, owner = %sup.owner(), term = %term, %reason, "stepped down");
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
    if let Some(p) = presence {
        let _ = p.release().await;
    }
}

/// How a term ends by plan.
struct TermEnd {
    /// The term's work token (the one sent with `Elected`).
    work: CancellationToken,
    /// Closed once every [`DrainGuard`] of the term is dropped.
    drained: watch::Sender<()>,
    /// The drain timeout.
    wait: Duration,
}

impl TermEnd {
    /// Whether some work still holds a drain guard of the term.
    fn draining(&self) -> bool {
        !self.drained.is_closed()
    }

    /// How long to reserve the lead for a successor that may claim `within` after the release:
    /// the reservation is written before the drain and the release, so it also covers the drain
    /// timeout (while work holds a drain guard) and the release (bounded by the op timeout
    /// `op`); once the release returned it is cut back to `within` from then.
    fn reserve_for(&self, within: Duration, op: Duration) -> Duration {
        let drain = if self.draining() {
            self.wait
        } else {
            Duration::ZERO
        };
        within.saturating_add(drain).saturating_add(op)
    }

    /// Cancels the term's work and waits until it has drained (every guard dropped), the drain
    /// timeout has passed or the lease is lost.
    async fn drain(&self, guard: &crate::supervisor::LeaseGuard) {
        self.work.cancel();
        tokio::select! {
            _ = timeout(self.wait, self.drained.closed()) => {}
            _ = guard.lost() => {}
        }
    }

    /// A handover's end of term: drains, releases, and cuts the reservation for `successor`
    /// (written with token `reserved` for [`TermEnd::reserve_for`]) back to `within` from the
    /// release. The cut is made only if that reservation still stands (the successor has not
    /// claimed it); if it cannot be made, the longer reservation stands (closed, not open).
    async fn drain_and_release(
        &self,
        guard: crate::supervisor::LeaseGuard,
        store: &dyn LeaseStore,
        reservation: Option<&LeaseKey>,
        (successor, reserved): (&OwnerId, FencingToken),
        within: Duration,
        op: Duration,
    ) {
        self.drain(&guard).await;
        let _ = guard.release().await;
        let Some(key) = reservation else { return };
        if let Ok(Ok(state)) = timeout(op, store.inspect(key)).await
            && state
                .holder
                .is_some_and(|h| h.owner == *successor && h.token == reserved)
        {
            let _ = reserve(store, Some(key), successor, within, op).await;
        }
    }
}

/// Whether a reservation held by `holder` is for this candidate: for its identity (as the
/// leader names successors) or for its instance itself.
fn reserved_for_me(holder: &OwnerId, identity: &OwnerId, instance: &OwnerId) -> bool {
    holder == identity || holder == instance
}

/// What a candidate knows of the handover reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reservation {
    /// None stands, or it is for this candidate.
    Clear,
    /// One stands for someone else, for this much longer.
    ForOther(Duration),
}

/// Reads the reservation once: `None` if its state is unknown (the inspect failed or timed out).
async fn read_reservation(
    store: &dyn LeaseStore,
    reservation: Option<&LeaseKey>,
    identity: &OwnerId,
    instance: &OwnerId,
    op: Duration,
) -> Option<Reservation> {
    let Some(key) = reservation else {
        return Some(Reservation::Clear);
    };
    let state = timeout(op, store.inspect(key)).await.ok()?.ok()?;
    Some(
        match state
            .holder
            .filter(|h| !reserved_for_me(&h.owner, identity, instance))
        {
            Some(h) => Reservation::ForOther(h.remaining),
            None => Reservation::Clear,
        },
    )
}

/// Reads the reservation until its state is known. While it is unknown (the inspect fails or
/// times out) the read is retried with the supervisor's backoff, and only once the plan's
/// reservation bound has passed since the first failed read is it taken as clear (logged):
/// a candidate never takes the lead while a reservation may stand for someone else, unless the
/// bound passed. `None` once `stop` is cancelled.
async fn known_reservation(
    store: &dyn LeaseStore,
    plan: &Plan,
    instance: &OwnerId,
    config: &SupervisorConfig,
    stop: &CancellationToken,
) -> Option<Reservation> {
    let op = config.op_timeout();
    let key = plan.reservation.as_ref();
    let mut since: Option<tokio::time::Instant> = None;
    loop {
        if stop.is_cancelled() {
            return None;
        }
        if let Some(known) = read_reservation(store, key, &plan.identity, instance, op).await {
            return Some(known);
        }
        let first = *since.get_or_insert_with(tokio::time::Instant::now);
        let left = plan.reservation_bound.saturating_sub(first.elapsed());
        if left.is_zero() {
            tracing::warn!(key = ?key, owner = %instance, bound = ?plan.reservation_bound, "handover reservation unreadable for the whole bound; campaigning");
            return Some(Reservation::Clear);
        }
        // Each read is already paced by the op timeout it may wait out, and the candidate may be
        // holding the key meanwhile: retry at the shortest backoff, not a growing one.
        let pause = config.backoff(0).min(left).max(Duration::from_millis(1));
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = sleep(pause) => {}
        }
    }
}

/// Writes a reservation of the lead for `successor`, valid for `within` (rounded up to what the
/// store grants); its token if it was granted.
async fn reserve(
    store: &dyn LeaseStore,
    reservation: Option<&LeaseKey>,
    successor: &OwnerId,
    within: Duration,
    op: Duration,
) -> Option<FencingToken> {
    let key = reservation?;
    let caps = store.capabilities();
    let mut ttl = within.max(caps.min_ttl).max(Duration::from_millis(1));
    let g = caps.ttl_granularity.as_nanos();
    if g > 1 {
        let n = ttl.as_nanos().div_ceil(g).saturating_mul(g);
        ttl = Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX));
    }
    if ttl > crate::lease::MAX_TTL {
        return None;
    }
    let req = AcquireRequest::new(key.clone(), successor.clone(), ttl);
    match timeout(op, store.acquire(&req)).await {
        Ok(Ok(AcquireOutcome::Acquired(lease))) => Some(lease.token()),
        _ => None,
    }
}

/// Removes a reservation held for this candidate once it leads (best effort: it expires anyway).
async fn clear_reservation(
    store: &dyn LeaseStore,
    reservation: Option<&LeaseKey>,
    identity: &OwnerId,
    instance: &OwnerId,
    ttl: Duration,
    op: Duration,
) {
    let Some(key) = reservation else { return };
    if let Ok(Ok(state)) = timeout(op, store.inspect(key)).await
        && let Some(h) = state
            .holder
            .filter(|h| reserved_for_me(&h.owner, identity, instance))
    {
        let lease = Lease::resume(key.clone(), h.owner, h.token, ttl);
        let _ = timeout(op, store.release(&lease)).await;
    }
}

/// The identity of the first preferred candidate present (holding its presence lease), best
/// first.
async fn better_present(
    store: &dyn LeaseStore,
    keys: &[LeaseKey],
    op: Duration,
) -> Option<OwnerId> {
    for k in keys {
        if let Ok(Ok(state)) = timeout(op, store.inspect(k)).await
            && let Some(h) = state.holder
        {
            return Some(h.owner.to_identity());
        }
    }
    None
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
                leader: state.holder.as_ref().map(|h| h.owner.to_identity()),
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

#[cfg(test)]
mod handover_tests {
    use super::*;
    use crate::MemoryLeaseStore;
    use tokio::time::Instant;

    const TTL: Duration = Duration::from_secs(3);

    fn election(store: &MemoryLeaseStore) -> Election {
        Election::new(
            store.clone(),
            LeaseKey::new("handover").unwrap(),
            SupervisorConfig::new(TTL).with_acquire_wait(TTL),
        )
    }

    async fn elected(c: &mut Candidate) -> FencingToken {
        loop {
            match c.next_event().await.expect("events") {
                ElectionEvent::Elected { term, .. } => return term,
                ElectionEvent::SteppedDown { .. } => {}
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_named_successor_and_nobody_else_takes_the_lead() {
        let store = MemoryLeaseStore::new();
        let e = election(&store);
        let mut a = e.join(OwnerId::new("a").unwrap());
        let t1 = elected(&mut a).await;
        let mut b = e.join(OwnerId::new("b").unwrap());
        let mut c = e.join(OwnerId::new("c").unwrap());
        tokio::time::sleep(TTL).await; // b and c campaign against a
        // Not leading: nothing happens.
        assert!(!b.handover(&OwnerId::new("c").unwrap(), TTL).await);
        let at = Instant::now();
        assert!(a.handover(&OwnerId::new("c").unwrap(), TTL).await);
        match a.next_event().await.unwrap() {
            ElectionEvent::SteppedDown { term, reason } => {
                assert_eq!((term, reason), (t1, StepDownReason::HandedOver));
            }
            other => panic!("{other:?}"),
        }
        let t2 = tokio::time::timeout(TTL, elected(&mut c))
            .await
            .expect("c leads");
        assert!(t2 > t1);
        // c took over on the release wake-up, not on expiry.
        assert!(at.elapsed() < TTL / 2, "{:?}", at.elapsed());
        // b never led, even once the reservation is gone.
        tokio::time::sleep(TTL * 3).await;
        assert!(
            tokio::time::timeout(Duration::ZERO, b.next_event())
                .await
                .is_err()
        );
        assert!(c.is_leader() && !b.is_leader() && !a.is_leader());
    }

    #[tokio::test(start_paused = true)]
    async fn others_take_over_only_after_an_absent_successor_s_bound() {
        let store = MemoryLeaseStore::new();
        let e = election(&store);
        let mut a = e.join(OwnerId::new("a").unwrap());
        let t1 = elected(&mut a).await;
        let b = e.join(OwnerId::new("b").unwrap());
        tokio::time::sleep(TTL).await;
        let bound = Duration::from_secs(5);
        assert!(a.handover(&OwnerId::new("ghost").unwrap(), bound).await);
        // Nobody leads while the reservation stands ...
        tokio::time::sleep(bound - Duration::from_millis(100)).await;
        assert!(!a.is_leader() && !b.is_leader());
        // ... and someone does within a TTL after it expired, with a greater term.
        tokio::time::sleep(TTL).await;
        let term = match (a.role(), b.role()) {
            (Role::Leader { term }, Role::Follower) | (Role::Follower, Role::Leader { term }) => {
                term
            }
            other => panic!("{other:?}"),
        };
        assert!(term > t1);
    }

    /// Elected with the event's drain guard; work that stops `stops_after` after its token is
    /// cancelled keeps the guard until then. Returns the term and when the work stopped.
    async fn elected_with_work(
        c: &mut Candidate,
        stops_after: Duration,
    ) -> (FencingToken, oneshot::Receiver<Instant>) {
        loop {
            if let ElectionEvent::Elected { term, work, drain } = c.next_event().await.unwrap() {
                let (tx, rx) = oneshot::channel();
                tokio::spawn(async move {
                    work.cancelled().await;
                    sleep(stops_after).await;
                    drop(drain);
                    let _ = tx.send(Instant::now());
                });
                return (term, rx);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_handover_waits_for_the_term_s_work_to_drain() {
        let store = MemoryLeaseStore::new();
        let e = election(&store).with_drain_timeout(TTL * 3);
        let mut a = e.join(OwnerId::new("a").unwrap());
        let (t1, stopped) = elected_with_work(&mut a, Duration::from_secs(2)).await;
        let mut c = e.join(OwnerId::new("c").unwrap());
        tokio::time::sleep(TTL).await;
        let at = Instant::now();
        assert!(a.handover(&OwnerId::new("c").unwrap(), TTL).await);
        let returned = Instant::now();
        let t2 = tokio::time::timeout(TTL * 3, elected(&mut c))
            .await
            .expect("c leads");
        let c_led = Instant::now();
        let stopped = stopped.await.unwrap();
        assert!(t2 > t1);
        // The lease was held (and renewed, past a TTL) while the work drained; the handover
        // returned once released, and c took over on the release, not on expiry.
        assert!(
            c_led >= stopped,
            "c led {:?} before the work stopped",
            stopped - c_led
        );
        assert_eq!(stopped - at, Duration::from_secs(2));
        assert!(returned >= stopped);
        assert!(c_led - stopped < TTL / 2, "{:?}", c_led - stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_is_bounded_by_the_drain_timeout() {
        let store = MemoryLeaseStore::new();
        let drain = Duration::from_secs(1);
        let e = election(&store).with_drain_timeout(drain);
        let mut a = e.join(OwnerId::new("a").unwrap());
        // Work that never gives its guard back.
        let (t1, _never) = elected_with_work(&mut a, Duration::MAX).await;
        let mut c = e.join(OwnerId::new("c").unwrap());
        tokio::time::sleep(TTL).await;
        let at = Instant::now();
        assert!(a.handover(&OwnerId::new("c").unwrap(), TTL).await);
        assert_eq!(at.elapsed(), drain);
        let t2 = tokio::time::timeout(TTL, elected(&mut c))
            .await
            .expect("c leads");
        assert!(t2 > t1);
        assert!(at.elapsed() < drain + TTL / 2, "{:?}", at.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn resigning_drains_and_an_ignored_guard_costs_nothing() {
        let store = MemoryLeaseStore::new();
        let e = election(&store).with_drain_timeout(TTL * 3);
        let mut a = e.join(OwnerId::new("a").unwrap());
        let (_, stopped) = elected_with_work(&mut a, Duration::from_secs(2)).await;
        let at = Instant::now();
        a.resign().await;
        let returned = Instant::now();
        assert!(store.inspect(e.key()).await.unwrap().holder.is_none());
        let stopped = stopped.await.unwrap();
        assert_eq!(stopped - at, Duration::from_secs(2));
        assert!(
            returned >= stopped,
            "resigned {:?} early",
            stopped - returned
        );
        // A candidate that drops the guard with the event releases at once.
        let mut b = e.join(OwnerId::new("b").unwrap());
        elected(&mut b).await;
        let at = Instant::now();
        b.resign().await;
        assert!(
            at.elapsed() < Duration::from_millis(10),
            "{:?}",
            at.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_yields_to_a_preferred_candidate() {
        let store = MemoryLeaseStore::new();
        let e = election(&store).with_preferred(vec![OwnerId::new("p").unwrap()]);
        let mut a = e.join(OwnerId::new("a").unwrap());
        let t1 = elected(&mut a).await;
        tokio::time::sleep(TTL * 2).await;
        assert!(a.is_leader());
        let joined = Instant::now();
        let mut p = e.join(OwnerId::new("p").unwrap());
        let t2 = tokio::time::timeout(TTL * 2, elected(&mut p))
            .await
            .expect("p leads");
        assert!(t2 > t1);
        // within one renewal interval (the leader's check) and the handover
        assert!(
            joined.elapsed() <= TTL / 3 + Duration::from_millis(100),
            "{:?}",
            joined.elapsed()
        );
        match a.next_event().await.unwrap() {
            ElectionEvent::SteppedDown { reason, .. } => {
                assert_eq!(reason, StepDownReason::HandedOver)
            }
            other => panic!("{other:?}"),
        }
        // p keeps the lead; a does not take it back.
        tokio::time::sleep(TTL * 3).await;
        assert!(p.is_leader() && !a.is_leader());
    }
}

#[cfg(test)]
mod instance_tests {
    use super::*;
    use crate::MemoryLeaseStore;

    const TTL: Duration = Duration::from_secs(3);

    fn election(store: &MemoryLeaseStore) -> Election {
        Election::new(
            store.clone(),
            LeaseKey::new("instances").unwrap(),
            SupervisorConfig::new(TTL).with_acquire_wait(TTL),
        )
    }

    /// Two processes joined with one stable id are two owners to the store: the second never
    /// believes it leads while the first does, and users still see the id they chose.
    #[tokio::test(start_paused = true)]
    async fn two_candidates_with_one_id_never_both_lead() {
        let store = MemoryLeaseStore::new();
        let e = election(&store);
        let id = OwnerId::new("node-1").unwrap();
        let a = e.join(id.clone());
        let mut role_a = a.subscribe();
        role_a
            .wait_for(|r| matches!(r, Role::Leader { .. }))
            .await
            .unwrap();
        let mut observer = e.observe();
        let b = e.join(id.clone());
        let mut role_b = b.subscribe();
        // Sample both beliefs over several TTLs of campaigning and renewals.
        let until = tokio::time::Instant::now() + TTL * 4;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => break,
                _ = role_a.changed() => {}
                _ = role_b.changed() => {}
            }
            assert!(
                !(a.is_leader() && b.is_leader()),
                "two instances of one id both lead: {:?} {:?}",
                a.role(),
                b.role()
            );
        }
        assert!(
            a.is_leader() && !b.is_leader(),
            "{:?} {:?}",
            a.role(),
            b.role()
        );
        assert_eq!(a.id(), &id);
        assert_eq!(b.id(), &id);
        let seen = observer.current();
        let seen = if seen.leader.is_some() {
            seen
        } else {
            observer.changed().await.unwrap()
        };
        assert_eq!(seen.leader, Some(id.clone()));
        // The store sees two owners: the holder is an instance of the id, not the id itself.
        let holder = store.inspect(e.key()).await.unwrap().holder.unwrap();
        assert_ne!(holder.owner, id);
        assert_eq!(holder.owner.identity(), id.as_str());
        // Once the leader leaves, the other instance takes over.
        a.resign().await;
        role_b
            .wait_for(|r| matches!(r, Role::Leader { .. }))
            .await
            .unwrap();
    }

    /// A handover names an identity: of its two live instances exactly one takes the lead, and
    /// no other candidate does.
    #[tokio::test(start_paused = true)]
    async fn a_handover_to_an_id_with_two_instances_elects_one_of_them() {
        let store = MemoryLeaseStore::new();
        let e = election(&store);
        let a = e.join(OwnerId::new("a").unwrap());
        a.subscribe()
            .wait_for(|r| matches!(r, Role::Leader { .. }))
            .await
            .unwrap();
        let c = OwnerId::new("c").unwrap();
        let (c1, c2) = (e.join(c.clone()), e.join(c.clone()));
        let b = e.join(OwnerId::new("b").unwrap());
        tokio::time::sleep(TTL).await;
        assert!(a.handover(&c, TTL).await);
        let mut r1 = c1.subscribe();
        let mut r2 = c2.subscribe();
        tokio::time::timeout(TTL, async {
            tokio::select! {
                r = r1.wait_for(|r| matches!(r, Role::Leader { .. })) => { r.unwrap(); }
                r = r2.wait_for(|r| matches!(r, Role::Leader { .. })) => { r.unwrap(); }
            }
        })
        .await
        .expect("an instance of c leads");
        tokio::time::sleep(TTL * 3).await;
        assert!(
            c1.is_leader() != c2.is_leader(),
            "{:?} {:?}",
            c1.role(),
            c2.role()
        );
        assert!(!a.is_leader() && !b.is_leader());
        assert_eq!(e.observe().changed().await.unwrap().leader, Some(c));
    }

    #[tokio::test]
    async fn an_id_without_room_for_the_instance_is_refused() {
        let e = election(&MemoryLeaseStore::new());
        let long = OwnerId::new("x".repeat(112)).unwrap();
        assert!(matches!(
            e.try_join(long.clone()),
            Err(crate::Error::InvalidOwner { .. })
        ));
        let mut c = e.join(long);
        assert!(c.next_event().await.is_none());
        assert!(!c.is_leader());
        assert!(e.try_join(OwnerId::new("x".repeat(111)).unwrap()).is_ok());
    }
}

#[cfg(test)]
mod reservation_tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use tokio::time::Instant;

    use super::*;
    use crate::{
        Capabilities, KeyState, KeyWatch, MemoryLeaseStore, ReleaseOutcome, RenewOutcome, Result,
    };

    const TTL: Duration = Duration::from_secs(3);

    /// How the reservation key's inspect behaves.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Inspect {
        Works,
        Fails,
        Hangs,
    }

    /// The memory store, with the reservation's inspect failing or hanging on demand, and the
    /// election key's release taking `release_takes`.
    #[derive(Debug, Clone)]
    struct Flaky {
        mem: MemoryLeaseStore,
        inspect: Arc<Mutex<Inspect>>,
        release_takes: Arc<Mutex<Duration>>,
    }

    impl Flaky {
        fn new() -> Self {
            Flaky {
                mem: MemoryLeaseStore::new(),
                inspect: Arc::new(Mutex::new(Inspect::Works)),
                release_takes: Arc::new(Mutex::new(Duration::ZERO)),
            }
        }

        fn set(&self, how: Inspect) {
            *self.inspect.lock().unwrap() = how;
        }
    }

    fn is_reservation(key: &LeaseKey) -> bool {
        key.as_str().ends_with("handover")
    }

    #[async_trait]
    #[deny(clippy::missing_trait_methods)]
    impl LeaseStore for Flaky {
        fn backend(&self) -> &'static str {
            "flaky"
        }
        fn capabilities(&self) -> Capabilities {
            self.mem.capabilities()
        }
        async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
            self.mem.acquire(req).await
        }
        async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
            self.mem.renew(lease).await
        }
        async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
            self.mem.renew_many(leases).await
        }
        async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
            self.mem.inspect_many(keys).await
        }
        async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
            if !is_reservation(lease.key()) {
                let takes = *self.release_takes.lock().unwrap();
                sleep(takes).await;
            }
            self.mem.release(lease).await
        }
        async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
            let how = *self.inspect.lock().unwrap();
            match how {
                _ if !is_reservation(key) => self.mem.inspect(key).await,
                Inspect::Works => self.mem.inspect(key).await,
                Inspect::Fails => Err(crate::Error::refused("flaky", "inspect refused", None)),
                Inspect::Hangs => std::future::pending().await,
            }
        }
        async fn holders_many(&self, keys: &[LeaseKey]) -> Result<Vec<Option<crate::HeldBy>>> {
            self.mem.holders_many(keys).await
        }
        async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
            self.mem.watch(key).await
        }
    }

    fn election(store: &Flaky) -> Election {
        Election::new(
            store.clone(),
            LeaseKey::new("jobs").unwrap(),
            SupervisorConfig::new(TTL).with_acquire_wait(TTL),
        )
    }

    async fn leads(c: &Candidate) {
        c.subscribe()
            .wait_for(|r| matches!(r, Role::Leader { .. }))
            .await
            .unwrap();
    }

    /// Waits until one of `a` and `b` leads (the old leader campaigns again after a handover).
    async fn one_leads(a: &Candidate, b: &Candidate) {
        tokio::select! {
            _ = leads(a) => {}
            _ = leads(b) => {}
        }
    }

    /// While the reservation cannot be read (for less than the bound), a candidate that is not
    /// the successor stays out; once it can be read again, it stays out until the reservation
    /// expires `within` after the release.
    async fn unreadable_reservation_keeps_others_out(how: Inspect) {
        let store = Flaky::new();
        let e = election(&store);
        let a = e.join(OwnerId::new("a").unwrap());
        leads(&a).await;
        let b = e.join(OwnerId::new("b").unwrap());
        sleep(TTL).await;
        let within = TTL * 2;
        store.set(how);
        assert!(a.handover(&OwnerId::new("ghost").unwrap(), within).await);
        let released = Instant::now();
        let outage = e.reservation_bound() / 2;
        let early = tokio::time::timeout(outage, one_leads(&a, &b)).await;
        assert!(
            early.is_err(),
            "{:?} {:?} while the reservation was unreadable ({how:?})",
            a.role(),
            b.role()
        );
        store.set(Inspect::Works);
        let led = tokio::time::timeout(within + TTL * 2, one_leads(&a, &b)).await;
        assert!(led.is_ok(), "nobody led");
        assert!(
            released.elapsed() >= within,
            "led {:?} after the release, the reservation being for {within:?}",
            released.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_reservation_inspect_keeps_others_out() {
        unreadable_reservation_keeps_others_out(Inspect::Fails).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_reservation_inspect_keeps_others_out() {
        unreadable_reservation_keeps_others_out(Inspect::Hangs).await;
    }

    /// A reservation that stays unreadable keeps others out for the bound, not forever.
    #[tokio::test(start_paused = true)]
    async fn an_unreadable_reservation_is_waited_for_up_to_the_bound() {
        let store = Flaky::new();
        let e = election(&store);
        let a = e.join(OwnerId::new("a").unwrap());
        leads(&a).await;
        let b = e.join(OwnerId::new("b").unwrap());
        sleep(TTL).await;
        store.set(Inspect::Fails);
        assert!(a.handover(&OwnerId::new("ghost").unwrap(), TTL * 10).await);
        let released = Instant::now();
        let bound = e.reservation_bound();
        let led = tokio::time::timeout(bound + TTL * 2, one_leads(&a, &b)).await;
        assert!(led.is_ok(), "nobody led");
        assert!(
            released.elapsed() >= bound,
            "led {:?} after the release, before the bound {bound:?}",
            released.elapsed()
        );
    }

    /// `within` counts from the release, however long the release takes.
    #[tokio::test(start_paused = true)]
    async fn within_counts_from_the_release() {
        let store = Flaky::new();
        let e = election(&store);
        let a = e.join(OwnerId::new("a").unwrap());
        leads(&a).await;
        let b = e.join(OwnerId::new("b").unwrap());
        sleep(TTL).await;
        let takes = Duration::from_millis(800);
        *store.release_takes.lock().unwrap() = takes;
        let within = TTL;
        assert!(a.handover(&OwnerId::new("ghost").unwrap(), within).await);
        let released = Instant::now();
        one_leads(&a, &b).await;
        assert!(
            released.elapsed() >= within,
            "led {:?} after the release, the reservation being for {within:?}",
            released.elapsed()
        );
    }
}

#[cfg(test)]
mod namespace_tests {
    use super::*;
    use crate::MemoryLeaseStore;

    const TTL: Duration = Duration::from_secs(3);

    async fn leads_within(c: &Candidate, within: Duration) -> bool {
        let mut role = c.subscribe();
        tokio::time::timeout(within, role.wait_for(|r| matches!(r, Role::Leader { .. })))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Holds `key` for an unrelated user for a long time.
    async fn user_holds(store: &MemoryLeaseStore, key: &str) {
        let req = AcquireRequest::new(
            LeaseKey::new(key).unwrap(),
            OwnerId::new("someone-else").unwrap(),
            TTL * 100,
        );
        assert!(matches!(
            store.acquire(&req).await.unwrap(),
            AcquireOutcome::Acquired(_)
        ));
    }

    /// A user's lease on `jobs.handover` is not a handover reservation of election `jobs`.
    #[tokio::test(start_paused = true)]
    async fn a_user_lease_beside_the_key_does_not_block_the_election() {
        let store = MemoryLeaseStore::new();
        user_holds(&store, "jobs.handover").await;
        let e = Election::new(
            store.clone(),
            LeaseKey::new("jobs").unwrap(),
            SupervisorConfig::new(TTL),
        );
        let a = e.join(OwnerId::new("a").unwrap());
        assert!(leads_within(&a, TTL).await, "{:?}", a.role());
    }

    /// A user's lease on `jobs.c.0` is not a preferred candidate's presence: the leader does not
    /// yield to it.
    #[tokio::test(start_paused = true)]
    async fn a_user_lease_beside_the_key_is_not_a_preferred_candidate() {
        let store = MemoryLeaseStore::new();
        user_holds(&store, "jobs.c.0").await;
        let e = Election::new(
            store.clone(),
            LeaseKey::new("jobs").unwrap(),
            SupervisorConfig::new(TTL),
        )
        .with_preferred(vec![OwnerId::new("p").unwrap()]);
        let a = e.join(OwnerId::new("a").unwrap());
        assert!(leads_within(&a, TTL).await);
        tokio::time::sleep(TTL * 3).await;
        assert!(a.is_leader(), "yielded to a user's lease: {:?}", a.role());
    }

    /// The election's own keys lie in the reserved namespace, which no user key can name.
    #[tokio::test(start_paused = true)]
    async fn the_reservation_is_a_reserved_key() {
        let store = MemoryLeaseStore::new();
        let jobs = LeaseKey::new("jobs").unwrap();
        let e = Election::new(store.clone(), jobs.clone(), SupervisorConfig::new(TTL));
        let a = e.join(OwnerId::new("a").unwrap());
        assert!(leads_within(&a, TTL).await);
        let ghost = OwnerId::new("ghost").unwrap();
        assert!(a.handover(&ghost, TTL).await);
        let reservation = jobs.reserved("handover").unwrap();
        let held = store.inspect(&reservation).await.unwrap().holder.unwrap();
        assert_eq!(held.owner, ghost);
        assert!(LeaseKey::new(reservation.as_str()).is_err());
    }
}
