//! The driver: a worker's background task. A thin loop over timers, the mailbox's watch and the
//! outcomes of its acquisitions; it reads the store ([`scan`]), steps the pure
//! [plan](crate::plan) with what it read, and carries out what the plan decided (spawn the
//! takes, inherits and steals, send the releases, tell a death).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::supervisor::{Acquisition, Health, LeaseGuard, LossReason, Supervisor};
use leasehold_core::{FencingToken, LeaseKey};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use crate::events::{RevokeReason, ShardEvent, ShardGuard};
use crate::membership::scan;
use crate::plan::{Book, Ctx, JOIN_SETTLE};
use crate::set::Inner;

/// The most free shards one batched take asks for at once. A split of 10,000 shards over ten
/// workers goes out in about 80 store calls; the batches of one rebalance run side by side
/// (up to `acquire_concurrency`), and a batch must be answered within one op timeout even on a
/// store without a batched acquire (the default runs 16 acquires at a time: 8 rounds).
pub(crate) const TAKE_BATCH: usize = 128;

/// What a worker's spawned tasks report back to its loop.
pub(crate) enum Internal {
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

/// The worker's state: the plan's book and what only the driver holds (the release of each
/// held shard, the membership lease).
#[derive(Default)]
pub(crate) struct State {
    pub(crate) book: Book,
    /// Starts the planned release of a held shard (dropped: released at once, no drain).
    releases: BTreeMap<usize, oneshot::Sender<RevokeReason>>,
    pub(crate) member: Option<LeaseGuard>,
}

/// A worker's background task.
pub(crate) struct Run {
    pub(crate) set: Arc<Inner>,
    pub(crate) sup: Supervisor,
    /// The worker's id: what the other members know it by (fair share, steals, mailbox). Its
    /// leases are held under an instance of it (the supervisor's owner).
    pub(crate) me: Arc<str>,
    pub(crate) mailbox: LeaseKey,
    pub(crate) events: mpsc::UnboundedSender<ShardEvent>,
    pub(crate) assignment: watch::Sender<BTreeMap<String, FencingToken>>,
    /// Cancels every acquisition in flight (leave or drop).
    pub(crate) acquiring: CancellationToken,
    /// Bounds the acquisitions of free shards in flight.
    pub(crate) takes: Arc<Semaphore>,
}

impl Run {
    /// The plan's view of this worker.
    pub(crate) fn ctx(&self) -> Ctx<'_> {
        Ctx {
            me: &self.me,
            shards: &self.set.shards,
            config: &self.set.config,
        }
    }

    pub(crate) async fn run(self, stop: CancellationToken, leave: CancellationToken) {
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
                    if std::mem::take(&mut st.book.retick) {
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
                            st.book.woken = true;
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
        self.leave(st, &stop, &tx, &mut rx).await;
    }

    /// Graceful leave: stop taking, give up membership, tell the other members (so they wait on
    /// our shards now, not at their next rebalance), then drain and release every shard: each
    /// is taken on its release wake-up.
    async fn leave(
        &self,
        mut st: State,
        stop: &CancellationToken,
        tx: &mpsc::UnboundedSender<Internal>,
        rx: &mut mpsc::UnboundedReceiver<Internal>,
    ) {
        self.acquiring.cancel();
        if let Some(m) = st.member.take() {
            let _ = m.release().await;
        }
        let told = if st.book.held.is_empty() {
            Vec::new()
        } else {
            self.announce_leave(&st.book.members).await
        };
        for idx in st.book.leave() {
            if let Some(r) = st.releases.remove(&idx) {
                let _ = r.send(RevokeReason::Leaving);
            }
        }
        while !st.book.settled() {
            tokio::select! {
                _ = stop.cancelled() => break,
                msg = rx.recv() => match msg {
                    Some(msg) => self.handle(&mut st, msg, tx),
                    None => break,
                },
            }
        }
        let op = self.set.config.supervisor().op_timeout();
        let store = &*self.set.store;
        futures::future::join_all(told.iter().map(|l| timeout(op, store.release(l)))).await;
    }

    /// One rebalance; returns the time until the next.
    async fn tick(&self, st: &mut State, tx: &mpsc::UnboundedSender<Internal>) -> Duration {
        let started = Instant::now();
        let every = self.set.config.rebalance_interval();
        // Forget a lost membership lease; a new slot is taken below.
        if st.member.as_ref().is_some_and(|m| m.health().is_final()) {
            st.member = None;
        }
        if st.member.is_none() && self.join_slot(st).await {
            // Just joined: let workers started at the same moment take their slots too, so that
            // the first scan counts them. That scan sees every member as new and defers (see the
            // plan's `defer`), so it reads the slots and the mailbox alone: the first takes come
            // after a rescan an eighth of an interval later that sees the same members.
            return (every / 8).min(JOIN_SETTLE);
        }
        if st.book.skip_scan() {
            return every / 8;
        }
        let shards = !st.book.first_scan_defers();
        let scan = match scan(&self.set, Some(&self.mailbox), shards).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(worker = %self.me, error = %e, "shard scan failed; keeping the assignment");
                return every;
            }
        };
        let view = scan.view;
        let plan = st.book.rebalance(&self.ctx(), &view);
        if let Some(h) = plan.handover {
            self.hand_over(st, &h.thief, &h.shards);
        }
        if plan.tell_death {
            self.tell_death(&st.book.members);
        }
        if plan.take.len() > 1 {
            for chunk in plan.take.chunks(TAKE_BATCH) {
                self.spawn_take_many(chunk.to_vec(), tx);
            }
        } else {
            for idx in plan.take {
                self.spawn_take(idx, tx);
            }
        }
        for idx in plan.inherit {
            self.spawn_inherit(idx, tx);
        }
        for (victim, shards) in plan.steals {
            self.spawn_steal(victim, shards, tx);
        }
        self.publish(st);
        let after = match (plan.deferred, plan.soon) {
            (true, _) => every / 8,
            (false, true) => every / 8,
            (false, false) => every,
        };
        // A member that stopped renewing (it died, or its link did) is gone from the store when
        // its slot expires: rescan then rather than at the next rebalance, so that its shards
        // are taken within a scan of their expiry by every member, told or not (a store without
        // a watch tells nobody). A member that renews keeps its slot's expiry further away than
        // the interval, and changes nothing.
        let soonest = scan
            .expiries
            .iter()
            .filter(|(who, _)| *who != *self.me)
            .map(|(_, at)| *at)
            .min();
        match soonest {
            Some(at) => {
                let wake = (at + every / 64).saturating_duration_since(started);
                after.min(wake.max(every / 16))
            }
            None => after,
        }
    }

    /// Starts the handover of `shards` to `thief` (the plan marked them as being released).
    pub(crate) fn hand_over(&self, st: &mut State, thief: &str, shards: &[usize]) {
        for idx in shards {
            if let Some(r) = st.releases.remove(idx) {
                tracing::info!(worker = %self.me, shard = %self.set.shards[*idx].0, thief, "handing shard over");
                let _ = r.send(RevokeReason::Handoff {
                    to: thief.to_string(),
                });
            }
        }
    }

    fn publish(&self, st: &State) {
        let map = st
            .book
            .held
            .iter()
            .map(|(i, h)| (self.set.shards[*i].0.to_string(), h.token))
            .collect();
        self.assignment.send_replace(map);
    }

    fn handle(&self, st: &mut State, msg: Internal, tx: &mpsc::UnboundedSender<Internal>) {
        match msg {
            Internal::NotAcquired { idx, steal } => st.book.not_acquired(idx, steal),
            Internal::Acquired { idx, guard, steal } => {
                if !st.book.acquired(idx, steal, self.acquiring.is_cancelled()) {
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
                if st.book.ended(idx, token) {
                    st.releases.remove(&idx);
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

    /// We own shard `idx` now: record it, tell the application, and watch the lease until it is
    /// lost or a planned release (handover, leave) drains and releases it.
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
            lease: guard.view(),
            stop: stop.clone(),
            _drain: drain_rx,
        };
        let (rel_tx, rel_rx) = oneshot::channel();
        st.book.hold(idx, token);
        st.releases.insert(idx, rel_tx);
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

    /// One attempt at several free shards (a split), with one batched store call
    /// ([`Supervisor::try_acquire_many`]); it takes one of the `acquire_concurrency` permits.
    fn spawn_take_many(&self, shards: Vec<usize>, tx: &mpsc::UnboundedSender<Internal>) {
        let (sup, set, tx, cancel, takes) = (
            self.sup.clone(),
            self.set.clone(),
            tx.clone(),
            self.acquiring.clone(),
            self.takes.clone(),
        );
        tokio::spawn(async move {
            let keys: Vec<LeaseKey> = shards.iter().map(|i| set.shards[*i].1.clone()).collect();
            let got = tokio::select! {
                _ = cancel.cancelled() => None,
                permit = takes.acquire_owned() => match permit {
                    Ok(_permit) if !cancel.is_cancelled() => {
                        match sup.try_acquire_many(&keys).await {
                            Ok(out) => Some(out),
                            Err(e) => {
                                tracing::debug!(shards = keys.len(), error = %e, "batched shard acquisition failed");
                                None
                            }
                        }
                    }
                    _ => None,
                },
            };
            let mut got = got.map(Vec::into_iter);
            for idx in shards {
                let guard = match got.as_mut().and_then(Iterator::next) {
                    Some(Ok(Acquisition::Acquired(g))) => Some(g),
                    Some(Err(e)) => {
                        tracing::debug!(shard = %set.shards[idx].0, error = %e, "shard acquisition failed");
                        None
                    }
                    _ => None,
                };
                let _ = tx.send(Internal::outcome(idx, guard, false));
            }
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
pub(crate) fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(Duration::from_secs(30 * 365 * 24 * 3600)))
        .unwrap_or(at)
}
