//! The campaign driver: a candidate's background task. A thin loop that reads the store, waits,
//! acquires and renews through the supervisor, and asks the pure [plan](super::plan) what each
//! reading means; and the observer's task.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

use super::plan::{self, Gate, Reservation, Won};
use super::{DrainGuard, ElectionEvent, Leadership, Role, Setup, StepDownReason};
use crate::fencing::FencingToken;
use crate::lease::{AcquireOutcome, AcquireRequest, Lease, LeaseKey, OwnerId};
use crate::store::LeaseStore;
use crate::supervisor::{Acquisition, LeaseGuard, LossReason, Supervisor, SupervisorConfig};

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

/// Campaigns for `key` until `stop`: claims the presence lease of a preferred candidate, stays
/// out while a handover reservation stands for another, acquires, and leads each term won
/// ([`lead`]) until it ends.
pub(super) async fn campaign(
    sup: Supervisor,
    key: LeaseKey,
    events: mpsc::UnboundedSender<ElectionEvent>,
    role: watch::Sender<Role>,
    stop: CancellationToken,
    mut setup: Setup,
) {
    let mut out = CampaignEnd {
        events,
        role,
        term: None,
    };
    let store = sup.store().clone();
    let tick = sup.config().renew_interval();
    // A preferred candidate announces itself with a presence lease (one attempt per round).
    let presence_sup = Supervisor::from_arc(
        store.clone(),
        sup.config().clone().with_acquire_wait(Duration::ZERO),
    )
    .with_owner(sup.owner().clone());
    let mut presence: Option<LeaseGuard> = None;
    let mut failures: u32 = 0;
    while !stop.is_cancelled() {
        while let Ok((_, _, reply)) = setup.commands.try_recv() {
            let _ = reply.send(false); // not leading
        }
        claim_presence(&presence_sup, &setup, &mut presence).await;
        // A handover reserved for someone else: stay out until it is claimed or expires. A
        // reservation that cannot be read is waited for (up to the bound), never ignored.
        let Some(seen) = known_reservation(&*store, &setup, sup.owner(), sup.config(), &stop).await
        else {
            break;
        };
        if let Gate::StayOut(wait) = plan::gate(seen, tick) {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = sleep(wait) => {}
            }
            continue;
        }
        match sup.acquire_until_cancelled(&key, &stop).await {
            Ok(Acquisition::Acquired(guard)) => {
                // Acquired while a reservation for someone else stands (or may stand: it cannot
                // be read): give the key back, without announcing a term.
                let seen =
                    known_reservation(&*store, &setup, sup.owner(), sup.config(), &stop).await;
                match seen.map(plan::after_acquire) {
                    None => {
                        let _ = guard.release().await;
                        break;
                    }
                    Some(Won::GiveBack) => {
                        let _ = guard.release().await;
                        continue;
                    }
                    Some(Won::Lead) => {}
                }
                failures = 0;
                lead(&sup, &key, guard, &mut out, &stop, &mut setup).await;
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

/// A preferred candidate's presence lease: claimed (one attempt through `sup`) if it holds none
/// that is live.
async fn claim_presence(sup: &Supervisor, setup: &Setup, presence: &mut Option<LeaseGuard>) {
    let held_final = presence.as_ref().map(|g| g.health().is_final());
    if let Some(k) = plan::presence_to_claim(setup.rank, held_final, &setup.presence) {
        *presence = match sup.acquire(k).await {
            Ok(Acquisition::Acquired(g)) => Some(g),
            _ => None,
        };
    }
}

/// One term, from the acquisition of the key to the step-down: clears a reservation held for
/// this candidate, announces the term, holds it ([`hold`]) and announces its end.
async fn lead(
    sup: &Supervisor,
    key: &LeaseKey,
    guard: LeaseGuard,
    out: &mut CampaignEnd,
    stop: &CancellationToken,
    setup: &mut Setup,
) {
    let store = sup.store().clone();
    let (op, ttl) = (sup.config().op_timeout(), sup.config().ttl());
    clear_reservation(&*store, setup, sup.owner(), ttl, op).await;
    let term = guard.token();
    out.term = Some(term);
    out.role.send_replace(Role::Leader { term });
    tracing::info!(backend = sup.store().backend(), key = %key, owner = %sup.owner(), term = %term, "elected leader");
    sup.hook().leadership(key, &setup.identity, Some(term));
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
        wait: setup.drain,
    };
    let reason = hold(sup, key, guard, &end, out, stop, setup).await;
    out.role.send_replace(Role::Follower);
    out.term = None;
    sup.hook().leadership(key, &setup.identity, None);
    if matches!(reason, StepDownReason::Lost(_)) {
        tracing::warn!(backend = sup.store().backend(), key = %key, owner = %sup.owner(), term = %term, %reason, "stepped down");
    } else {
        tracing::info!(backend = sup.store().backend(), key = %key, owner = %sup.owner(), term = %term, %reason, "stepped down");
    }
    let _ = out.events.send(ElectionEvent::SteppedDown { term, reason });
}

/// Holds a term until the lease is lost, the candidate resigns, a handover is asked for and
/// reserved, or (every renewal interval) a better preferred candidate is present and the lead
/// is reserved for it. A planned end drains and releases before it returns; the guard is
/// dropped on return, before the term's end is announced.
async fn hold(
    sup: &Supervisor,
    key: &LeaseKey,
    guard: LeaseGuard,
    end: &TermEnd,
    out: &CampaignEnd,
    stop: &CancellationToken,
    setup: &mut Setup,
) -> StepDownReason {
    let store = sup.store().clone();
    // Preferred candidates better than this one (all of them if it is not preferred).
    let better = plan::better_than(setup.rank, setup.preferred.len());
    let (op, ttl, tick) = (
        sup.config().op_timeout(),
        sup.config().ttl(),
        sup.config().renew_interval(),
    );
    let mut guard = Some(guard);
    loop {
        let g = guard.as_ref().expect("held while leading");
        tokio::select! {
            h = g.lost() => return plan::lost_reason(h),
            _ = stop.cancelled() => {
                // Not a leader from the moment the drain starts.
                out.role.send_replace(Role::Follower);
                if let Some(g) = guard.take() {
                    end.drain(&g).await;
                    let _ = g.release().await;
                }
                return StepDownReason::Resigned;
            }
            Some((successor, within, reply)) = setup.commands.recv() => {
                if let Some(reserved) = reserve(&*store, setup.reservation.as_ref(), &successor, end.reserve_for(within, op), op).await {
                    out.role.send_replace(Role::Follower);
                    if let Some(g) = guard.take() {
                        end.drain_and_release(g, &*store, setup.reservation.as_ref(), (&successor, reserved), within, op).await;
                    }
                    let _ = reply.send(true);
                    return StepDownReason::HandedOver;
                }
                let _ = reply.send(false);
            }
            _ = sleep(tick), if better > 0 => {
                let present = better_present(&*store, &setup.presence[..better], op).await;
                if let Some(successor) = plan::yield_to(present, &setup.identity)
                    && let Some(reserved) = reserve(&*store, setup.reservation.as_ref(), &successor, end.reserve_for(ttl, op), op).await
                {
                    tracing::info!(key = %key, owner = %sup.owner(), successor = %successor, "yielding to a preferred candidate");
                    out.role.send_replace(Role::Follower);
                    if let Some(g) = guard.take() {
                        end.drain_and_release(g, &*store, setup.reservation.as_ref(), (&successor, reserved), ttl, op).await;
                    }
                    return StepDownReason::HandedOver;
                }
            }
        }
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
    /// How long to reserve the lead for a successor that may claim `within` after the release
    /// ([`plan::reserve_for`], draining while some work still holds a drain guard of the term).
    fn reserve_for(&self, within: Duration, op: Duration) -> Duration {
        plan::reserve_for(within, self.wait, !self.drained.is_closed(), op)
    }

    /// Cancels the term's work and waits until it has drained (every guard dropped), the drain
    /// timeout has passed or the lease is lost.
    async fn drain(&self, guard: &LeaseGuard) {
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
        guard: LeaseGuard,
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
            && plan::still_reserved(state.holder.as_ref(), successor, reserved)
        {
            let _ = reserve(store, Some(key), successor, within, op).await;
        }
    }
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
    Some(plan::reservation_of(state.holder, identity, instance))
}

/// Reads the reservation until its state is known. While it is unknown (the inspect fails or
/// times out) the read is retried ([`plan::unreadable_pause`]), and only once the setup's
/// reservation bound has passed since the first failed read is it taken as clear (logged): a
/// candidate never takes the lead while a reservation may stand for someone else, unless the
/// bound passed. `None` once `stop` is cancelled.
async fn known_reservation(
    store: &dyn LeaseStore,
    setup: &Setup,
    instance: &OwnerId,
    config: &SupervisorConfig,
    stop: &CancellationToken,
) -> Option<Reservation> {
    let op = config.op_timeout();
    let key = setup.reservation.as_ref();
    let mut since: Option<tokio::time::Instant> = None;
    loop {
        if stop.is_cancelled() {
            return None;
        }
        if let Some(known) = read_reservation(store, key, &setup.identity, instance, op).await {
            return Some(known);
        }
        let first = *since.get_or_insert_with(tokio::time::Instant::now);
        let bound = setup.reservation_bound;
        let Some(pause) = plan::unreadable_pause(first.elapsed(), bound, config.backoff(0)) else {
            tracing::warn!(key = ?key, owner = %instance, bound = ?bound, "handover reservation unreadable for the whole bound; campaigning");
            return Some(Reservation::Clear);
        };
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = sleep(pause) => {}
        }
    }
}

/// Writes a reservation of the lead for `successor`, valid for `within` (rounded up to what the
/// store grants, [`plan::reservation_ttl`]); its token if it was granted.
async fn reserve(
    store: &dyn LeaseStore,
    reservation: Option<&LeaseKey>,
    successor: &OwnerId,
    within: Duration,
    op: Duration,
) -> Option<FencingToken> {
    let key = reservation?;
    let ttl = plan::reservation_ttl(within, &store.capabilities())?;
    let req = AcquireRequest::new(key.clone(), successor.clone(), ttl);
    match timeout(op, store.acquire(&req)).await {
        Ok(Ok(AcquireOutcome::Acquired(lease))) => Some(lease.token()),
        _ => None,
    }
}

/// Removes a reservation held for this candidate once it leads (best effort: it expires anyway).
async fn clear_reservation(
    store: &dyn LeaseStore,
    setup: &Setup,
    instance: &OwnerId,
    ttl: Duration,
    op: Duration,
) {
    let Some(key) = setup.reservation.as_ref() else {
        return;
    };
    if let Ok(Ok(state)) = timeout(op, store.inspect(key)).await
        && let Some(h) = plan::to_clear(state.holder, &setup.identity, instance)
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

/// The observer's task: publishes who leads on `tx`, woken by the store's watch where it has
/// one and every `poll` otherwise, each store call bounded by `op_timeout`.
pub(super) async fn observe(
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
