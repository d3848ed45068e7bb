//! A steal, the thief's side: a request in the victim's mailbox, then a batched wait for the
//! shards the victim releases.
//!
//! The victim answers a request by releasing the shards asked of it, all at about the same time
//! (each drains on its own, then releases). The thief does not wait on each shard apart (one
//! acquire loop, watch and backoff per shard: thousands of store calls for one handover of a
//! thousand shards); it watches one shard still awaited and, on each change or backoff, tries
//! every shard still awaited in batched calls ([`Supervisor::try_acquire_many`]). A handover
//! of `n` shards costs a few batched rounds of `n / TAKE_BATCH` calls.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::supervisor::{Acquisition, Supervisor};
use leasehold_core::{AcquireOutcome, AcquireRequest, KeyWatch, LeaseKey, OwnerId};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use crate::driver::{Internal, Run, TAKE_BATCH, later};
use crate::mailbox::store_ttl;
use crate::set::Inner;

impl Run {
    /// Asks `victim` for `shards` (a request `ME/N` in its mailbox, held while we wait) and
    /// takes them as it releases them, up to the steal wait ([`await_handover`]).
    pub(crate) fn spawn_steal(
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
            let deadline = Instant::now() + wait;
            await_handover(&sup, &set, &victim, shards, deadline, &cancel, &tx).await;
            let _ = timeout(op, set.store.release(&mail)).await;
        });
    }
}

/// Takes `shards` as they are released, until every one is ours, `deadline` passes or `cancel`
/// fires; reports each shard's outcome on `tx` as soon as it is known (a steal's).
///
/// Each round waits first (the victim has yet to answer): for a change of the first shard still
/// awaited (the store's watch, opened before the round so that no release is missed), or a
/// jittered backoff from the supervisor's configuration (capped at an eighth of the rebalance
/// interval: a store without a watch, or a release the watch missed, is noticed that soon), or
/// the deadline. Then it tries every shard still awaited, [`TAKE_BATCH`] per call, the calls
/// side by side. A round that took something starts the backoff over.
///
/// A shard is given up before the deadline when it will not come: held by a worker other than
/// `victim` (another thief's now, or taken free by someone else), or still held by `victim` a
/// drain timeout plus an op timeout after the first shard of the handover arrived (the victim
/// answered without it: its holdings differed from those our scan saw). The victim drains and
/// releases every shard of one answer side by side, so that bound covers all of them.
pub(crate) async fn await_handover(
    sup: &Supervisor,
    set: &Arc<Inner>,
    victim: &str,
    shards: Vec<usize>,
    deadline: Instant,
    cancel: &CancellationToken,
    tx: &mpsc::UnboundedSender<Internal>,
) {
    let cap = (set.config.rebalance_interval() / 8).max(Duration::from_millis(1));
    let watches = set.store.capabilities().watch;
    let grace = set
        .config
        .drain_timeout()
        .saturating_add(sup.config().op_timeout());
    let mut deadline = deadline;
    let mut answered = false;
    let mut left = shards;
    let mut attempt: u32 = 0;
    while !left.is_empty() && !cancel.is_cancelled() {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let mut watch = if watches {
            open_watch(sup, &set.shards[left[0]].1, deadline - now).await
        } else {
            None
        };
        let wake = later(Instant::now(), sup.config().backoff(attempt).min(cap)).min(deadline);
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = sleep_until(wake) => {}
            _ = async {
                match watch.as_mut() {
                    Some(w) => { w.changed().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
        drop(watch);
        let before = left.len();
        let (rest, gone) = try_round(sup, set, victim, left, tx).await;
        left = rest;
        for idx in gone {
            let _ = tx.send(Internal::NotAcquired { idx, steal: true });
        }
        if left.len() < before {
            attempt = 0;
            if !answered {
                answered = true;
                deadline = deadline.min(later(Instant::now(), grace));
            }
        } else {
            attempt = attempt.saturating_add(1);
        }
    }
    for idx in left {
        let _ = tx.send(Internal::NotAcquired { idx, steal: true });
    }
}

/// One try at each of `shards`, [`TAKE_BATCH`] keys per batched call, the calls side by side;
/// reports each grant on `tx` and returns the shards not granted: those still to wait for, and
/// those held by a worker other than `victim` (which will not come).
async fn try_round(
    sup: &Supervisor,
    set: &Arc<Inner>,
    victim: &str,
    shards: Vec<usize>,
    tx: &mpsc::UnboundedSender<Internal>,
) -> (Vec<usize>, Vec<usize>) {
    let calls = shards.chunks(TAKE_BATCH).map(|chunk| async move {
        let keys: Vec<LeaseKey> = chunk.iter().map(|i| set.shards[*i].1.clone()).collect();
        let out = match sup.try_acquire_many(&keys).await {
            Ok(out) => out,
            Err(e) => {
                tracing::debug!(shards = keys.len(), error = %e, "batched steal attempt failed");
                return (chunk.to_vec(), Vec::new());
            }
        };
        let (mut left, mut gone) = (Vec::new(), Vec::new());
        for (idx, o) in chunk.iter().zip(out) {
            match o {
                Ok(Acquisition::Acquired(guard)) => {
                    let _ = tx.send(Internal::Acquired {
                        idx: *idx,
                        guard,
                        steal: true,
                    });
                }
                Ok(Acquisition::NotAcquired {
                    holder: Some(h), ..
                }) if h.owner.identity() != victim => gone.push(*idx),
                _ => left.push(*idx),
            }
        }
        (left, gone)
    });
    let mut left = Vec::new();
    let mut gone = Vec::new();
    for (l, g) in futures::future::join_all(calls).await {
        left.extend(l);
        gone.extend(g);
    }
    (left, gone)
}

/// Opens a watch on `key`, bounded by the op timeout and `within`; `None` where none opens in
/// time (the caller polls).
async fn open_watch(sup: &Supervisor, key: &LeaseKey, within: Duration) -> Option<KeyWatch> {
    let bound = sup.config().op_timeout().min(within);
    match timeout(bound, sup.store().watch(key)).await {
        Ok(Ok(w)) => w,
        _ => None,
    }
}
