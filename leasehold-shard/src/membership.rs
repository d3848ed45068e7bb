//! Membership and scans: a worker's membership slot, and the one batched read of every slot and
//! shard (and the worker's mailbox) a rebalance plans from.

use std::collections::BTreeSet;

use leasehold_core::supervisor::Acquisition;
use leasehold_core::{Error, LeaseKey, Result};
use tokio::time::{Instant, timeout};

use crate::driver::{Run, State};
use crate::plan::{View, rank};
use crate::set::Inner;

/// What a scan read: the view a rebalance plans from, and when each member's slot expires at
/// the store unless the member renews it.
pub(crate) struct Scan {
    pub(crate) view: View,
    /// Each member's identity and the local instant by which its slot expires at the store
    /// unless renewed: the answer's arrival plus the time the store said was left, never
    /// earlier than the store's own expiry.
    pub(crate) expiries: Vec<(String, Instant)>,
}

/// Reads every slot (and `mailbox`, if given) with [`LeaseStore::inspect_many`], for the time
/// each member's slot has left, and, beside it, the holders of every shard with one
/// [`LeaseStore::holders_many`]: two calls in flight together, bounded by the rebalance interval
/// (or the op timeout, if longer). With `shards` false the shards are not read: the view's
/// `owners` is empty.
///
/// [`LeaseStore::inspect_many`]: leasehold_core::LeaseStore::inspect_many
/// [`LeaseStore::holders_many`]: leasehold_core::LeaseStore::holders_many
pub(crate) async fn scan(set: &Inner, mailbox: Option<&LeaseKey>, shards: bool) -> Result<Scan> {
    let slot_keys: Vec<LeaseKey> = set.slots.iter().chain(mailbox).cloned().collect();
    let shard_keys: Vec<LeaseKey> = if shards {
        set.shards.iter().map(|(_, k)| k.clone()).collect()
    } else {
        Vec::new()
    };
    let bound = set
        .config
        .rebalance_interval()
        .max(set.config.supervisor().op_timeout());
    let backend = set.store.backend();
    let read = async {
        let shard_read = async {
            if shard_keys.is_empty() {
                Ok(Vec::new())
            } else {
                set.store.holders_many(&shard_keys).await
            }
        };
        let (slots, owners) =
            futures::future::join(set.store.inspect_many(&slot_keys), shard_read).await;
        Ok::<_, Error>((slots?, owners?, Instant::now()))
    };
    let (slots, owners, answered) = match timeout(bound, read).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Error::Timeout {
                backend,
                operation: "inspect_many",
                after: bound,
            });
        }
    };
    for (what, got, asked) in [
        ("inspect_many", slots.len(), slot_keys.len()),
        ("holders_many", owners.len(), shard_keys.len()),
    ] {
        if got != asked {
            return Err(Error::store_fault(
                backend,
                format!("{what} answered {got} holders for {asked} keys"),
                None,
            ));
        }
    }
    let mut slots = slots.into_iter();
    let mut members = BTreeSet::new();
    let mut expiries = Vec::new();
    for _ in &set.slots {
        if let Some(h) = slots.next().expect("one state per key").holder {
            let who = h.owner.identity().to_string();
            expiries.push((who.clone(), answered + h.remaining));
            members.insert(who);
        }
    }
    let mailbox = match mailbox {
        Some(_) => slots
            .next()
            .expect("one state per key")
            .holder
            .map(|h| (h.owner.identity().to_string(), h.token)),
        None => None,
    };
    let owners = owners
        .into_iter()
        .map(|h| h.map(|h| (h.owner.identity().to_string(), h.token)))
        .collect();
    Ok(Scan {
        view: View {
            members: members.into_iter().collect(),
            owners,
            mailbox,
        },
        expiries,
    })
}

impl Run {
    /// Takes a membership slot if we hold none: first the slot this worker ranks first, without
    /// reading the slots (workers joining together rank the slots differently, so that attempt
    /// is granted unless another worker, or an earlier instance of this one, holds that slot);
    /// if refused, the free slots of a read of the slots alone, in rank order, one attempt each,
    /// at most two more. Returns whether a slot was taken now.
    pub(crate) async fn join_slot(&self, st: &mut State) -> bool {
        let slots = &self.set.slots;
        let mut order: Vec<usize> = (0..slots.len()).collect();
        order.sort_by_key(|i| std::cmp::Reverse(rank(&self.me, slots[*i].as_str())));
        let Some(&first) = order.first() else {
            return false;
        };
        if self.try_slot(st, first).await {
            return true;
        }
        let op = self.set.config.supervisor().op_timeout();
        let free: Vec<bool> = match timeout(op, self.set.store.holders_many(slots)).await {
            Ok(Ok(states)) if states.len() == slots.len() => {
                states.iter().map(Option::is_none).collect()
            }
            _ => return false,
        };
        for i in order
            .into_iter()
            .filter(|i| *i != first && free[*i])
            .take(2)
        {
            if self.try_slot(st, i).await {
                return true;
            }
        }
        false
    }

    /// One attempt at membership slot `i`; on a grant, it is our membership.
    async fn try_slot(&self, st: &mut State, i: usize) -> bool {
        if self.acquiring.is_cancelled() {
            return false;
        }
        if let Ok(Acquisition::Acquired(g)) = self.sup.try_acquire(&self.set.slots[i]).await {
            st.member = Some(g);
            return true;
        }
        false
    }
}
