//! Membership and scans: a worker's membership slot, and the one batched read of every slot and
//! shard (and the worker's mailbox) a rebalance plans from.

use std::collections::BTreeSet;

use leasehold_core::supervisor::Acquisition;
use leasehold_core::{Error, LeaseKey, Result};
use tokio::time::timeout;

use crate::driver::{Run, State};
use crate::plan::{View, rank};
use crate::set::Inner;

/// Reads the holders of every slot and shard (and `mailbox`, if given) in one
/// [`LeaseStore::holders_many`], bounded by the rebalance interval (or the op timeout, if
/// longer). With `shards` false the shards are not read: the view's `owners` is empty.
pub(crate) async fn scan(set: &Inner, mailbox: Option<&LeaseKey>, shards: bool) -> Result<View> {
    let shard_keys: &[(std::sync::Arc<str>, LeaseKey)] = if shards { &set.shards } else { &[] };
    let keys: Vec<LeaseKey> = set
        .slots
        .iter()
        .chain(shard_keys.iter().map(|(_, k)| k))
        .chain(mailbox)
        .cloned()
        .collect();
    let bound = set
        .config
        .rebalance_interval()
        .max(set.config.supervisor().op_timeout());
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
    let mut owners = Vec::with_capacity(shard_keys.len());
    for _ in shard_keys {
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
