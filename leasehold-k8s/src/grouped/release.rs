//! Releases of a [`K8sGroupedStore`], coalesced per group: a release joins its group's queue, and
//! one task per group writes every queued release with one conditional replace. A worker handing
//! dozens of shards over at once thus writes each group once instead of racing its own writes
//! (which lost conditional-write races to each other, took seconds, and were cut off by the
//! caller's operation timeout; an entry whose release never landed stayed assigned for as long
//! as the owner's term lived, since the term, not the key, is what renewal keeps alive). The
//! write runs in a task of its own, so a release whose caller stops waiting still lands.

use std::collections::{BTreeSet, HashMap};

use leasehold_core::{FencingToken, Lease, OwnerId, ReleaseOutcome, Result};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::coalesce::{self, Queue};
use super::entry::{Entry, Term, group_of, judge_term};
use super::{K8sGroupedStore, MAX_RACES};
use crate::error::{BACKEND, K8sError};

/// A release waiting for its group's write.
pub(super) struct Pending {
    lease: Lease,
    done: oneshot::Sender<Result<ReleaseOutcome>>,
}

impl K8sGroupedStore {
    /// Queues the release of `lease` on its group and has a task write the queue; returns that
    /// release's outcome.
    pub(super) async fn release_queued(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let index = group_of(lease.key().as_str(), self.groups);
        let (done, answer) = oneshot::channel();
        self.queue(index).push(Pending {
            lease: lease.clone(),
            done,
        });
        let this = self.clone();
        tokio::spawn(async move { this.flush(index).await });
        coalesce::answered(answer, "release").await
    }

    fn queue(&self, index: u16) -> &Queue<Pending> {
        &self.queues[usize::from(index) % self.queues.len().max(1)]
    }

    /// Writes every release queued on group `index` (none if an earlier flush took them), under
    /// the group's write lock.
    async fn flush(&self, index: u16) {
        let _writer = self.writer(index).await;
        let batch = self.queue(index).take();
        if batch.is_empty() {
            return;
        }
        let leases: Vec<&Lease> = batch.iter().map(|p| &p.lease).collect();
        let result = self.release_in_group(index, &leases).await;
        coalesce::answer(batch.into_iter().map(|p| p.done).collect(), result);
    }

    /// Frees each key that its lease still holds (same owner, token and term, the term live)
    /// with one replace of group `index` conditioned on the version read, retrying lost races;
    /// the entries keep their tokens. Outcomes in input order.
    async fn release_in_group(&self, index: u16, leases: &[&Lease]) -> Result<Vec<ReleaseOutcome>> {
        for _ in 0..MAX_RACES {
            let group = self.read_group(index).await?;
            let mut entries = group.entries.clone();
            let mut out = vec![ReleaseOutcome::NotHeld; leases.len()];
            let mut freed: BTreeSet<&str> = BTreeSet::new();
            let mut live: HashMap<(OwnerId, u32, FencingToken), bool> = HashMap::new();
            for (i, lease) in leases.iter().enumerate() {
                let key = lease.key().as_str();
                let Some(entry) = group.entries.get(key) else {
                    continue;
                };
                let Some(held) = &entry.held else {
                    continue;
                };
                if &held.owner != lease.owner()
                    || entry.token != lease.token()
                    || Self::term_of(lease).is_some_and(|t| t != held.inc)
                    || freed.contains(key)
                {
                    continue;
                }
                let slot = (held.owner.clone(), held.secs, held.inc);
                let is_live = match live.get(&slot) {
                    Some(v) => *v,
                    None => {
                        let v = self.term_is_live(&held.owner, held.secs, held.inc).await?;
                        live.insert(slot, v);
                        v
                    }
                };
                if !is_live {
                    continue;
                }
                entries.insert(
                    key.to_string(),
                    Entry {
                        token: entry.token,
                        held: None,
                    },
                );
                freed.insert(key);
                out[i] = ReleaseOutcome::Released;
            }
            if freed.is_empty() {
                return Ok(out);
            }
            match self.write_group(&group, &entries).await {
                Ok(()) => {
                    tracing::debug!(backend = BACKEND, group = %group.name, released = freed.len(), "grouped leases released");
                    return Ok(out);
                }
                Err(K8sError::Conflict) => continue,
                Err(K8sError::NotFound(_)) => {
                    return Ok(vec![ReleaseOutcome::NotHeld; leases.len()]);
                }
                Err(e) => return Err(e.into_error("replace")),
            }
        }
        Err(self.races_lost(index))
    }

    /// Whether `owner`'s term `inc` (leases of `secs` seconds) is live: this store's own
    /// membership Lease if it holds that term, else a read of the membership Lease.
    async fn term_is_live(&self, owner: &OwnerId, secs: u32, inc: FencingToken) -> Result<bool> {
        let local = self
            .members
            .lock()
            .await
            .get(&(owner.clone(), secs))
            .is_some_and(|(m, _)| m.token() == inc && m.is_valid());
        if local {
            return Ok(true);
        }
        let name = self.inner.object_name(&self.member_key(owner, secs)?);
        let read = self.inner.read(&name).await?;
        let term = judge_term(
            owner,
            inc,
            read.as_ref().map(|(_, rec, seen)| (rec, *seen)),
            Instant::now(),
        );
        Ok(matches!(term, Term::Live { .. }))
    }
}
