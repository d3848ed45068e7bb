//! Mailboxes: a steal request (`THIEF/N`) or a note (`WORKER/0`: it is leaving, or it saw a member
//! die) is a lease on the recipient's mailbox key, which the recipient watches. Posting notes,
//! reading and answering the mailbox (through the [plan](crate::plan)).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{AcquireOutcome, AcquireRequest, Lease, LeaseStore, OwnerId};
use tokio::time::{sleep, timeout};

use crate::driver::{Run, State};
use crate::set::Inner;

/// Rounds `d` up to the store's TTL granularity and minimum.
pub(crate) fn store_ttl(store: &dyn LeaseStore, d: Duration) -> Duration {
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
    let op = set.config.supervisor().op_timeout();
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

impl Run {
    /// Leaves `ME/0` in the mailbox of every other member of `members`, each attempt bounded by
    /// the op timeout, all at once: woken by its mailbox's watch, a member rebalances at once and
    /// waits on the shards of ours it is due (see the plan's handout). A mailbox held by a thief's
    /// request is skipped (that member takes ours at its next rebalance). Returns the notes left,
    /// to release once our shards are released.
    pub(crate) async fn announce_leave(&self, members: &[String]) -> Vec<Lease> {
        let wait = store_ttl(&*self.set.store, self.set.config.steal_wait());
        post_notes(&self.set, &self.me, members, wait).await
    }

    /// Tells every other member of `members` that a member is gone (it died: its membership
    /// expired while it still held or had just held shards), so that each rebalances now and
    /// takes its part of the dead member's shards together with us instead of at its own next
    /// rebalance, up to an interval later. The notes (`ME/0`, as a leave's) are released an
    /// eighth of an interval later, in the background; they expire on their own after a
    /// quarter (rounded up to the store's TTL granularity) if that release fails.
    pub(crate) fn tell_death(&self, members: &[String]) {
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
            let op = set.config.supervisor().op_timeout();
            let store = &*set.store;
            futures::future::join_all(notes.iter().map(|l| timeout(op, store.release(l)))).await;
        });
    }

    /// Watches our mailbox key, if the store can.
    pub(crate) async fn watch_mailbox(&self) -> Option<leasehold_core::KeyWatch> {
        if !self.set.store.capabilities().watch {
            return None;
        }
        let op = self.set.config.supervisor().op_timeout();
        match timeout(op, self.set.store.watch(&self.mailbox)).await {
            Ok(Ok(w)) => w,
            _ => None,
        }
    }

    /// Reads the mailbox now and answers a request in it (woken by the mailbox's watch).
    /// Returns whether it holds another member's note (`WORKER/0`: that worker is leaving, or it
    /// saw a member die) not seen before.
    pub(crate) async fn answer_mailbox(&self, st: &mut State) -> bool {
        let op = self.set.config.supervisor().op_timeout();
        if let Ok(Ok(state)) = timeout(op, self.set.store.inspect(&self.mailbox)).await
            && let Some(h) = state.holder
        {
            let owner = h.owner.identity();
            if let Some(new) = st.book.note(&self.me, owner, h.token) {
                return new;
            }
            if let Some(h) = st.book.answer(&self.ctx(), owner, h.token) {
                self.hand_over(st, &h.thief, &h.shards);
            }
        }
        false
    }
}
