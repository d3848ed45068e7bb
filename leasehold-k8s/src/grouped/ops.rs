//! The [`LeaseStore`] implementation of [`K8sGroupedStore`], in the contract's order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use leasehold_core::backend::validate_acquire_many;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, FencingToken, Holder, KeyState, KeyWatch,
    Lease, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result,
};

use super::K8sGroupedStore;
use super::entry::{Entry, Term, group_of};
use crate::error::BACKEND;

#[async_trait]
impl LeaseStore for K8sGroupedStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Those of [`K8sLeaseStore`](crate::K8sLeaseStore): durable tokens, expiry observed locally, whole-second TTLs
    /// of at least 1 s, and watch.
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    /// A batch of one ([`acquire_many`](LeaseStore::acquire_many)): a membership renewal (or a
    /// new term), a GET and a replace of the key's group.
    ///
    /// Not cancel safe: a dropped acquire may have granted the key (it is then held until the
    /// owner's term ends or the owner acquires it again).
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let mut out = self.acquire_many(std::slice::from_ref(req)).await?;
        out.pop().unwrap_or_else(|| {
            Err(Error::store_fault(
                BACKEND,
                "acquire_many returned no outcome",
                None,
            ))
        })
    }

    /// A batch of one ([`renew_many`](LeaseStore::renew_many)): a GET of the key's group and,
    /// if its entry still names the lease, a replace of the owner's membership Lease.
    ///
    /// Cancel safe in the sense of [`LeaseStore::renew`]: a dropped renewal may or may not have
    /// extended the owner's term, and the previous deadline stays correct either way.
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        let mut out = self.renew_many(std::slice::from_ref(lease)).await?;
        out.pop().unwrap_or_else(|| {
            Err(Error::store_fault(
                BACKEND,
                "renew_many returned no outcome",
                None,
            ))
        })
    }

    /// Frees the key if `lease` holds it: the release joins its group's queue, and one task
    /// writes every release queued on the group with a GET and one replace conditioned on it
    /// (plus a GET of an owner's membership Lease when this store does not hold a valid one). The
    /// entry keeps the key's token.
    ///
    /// Cancel safe in effect: once called, the write is carried out by a task of its own, so a
    /// release whose caller stops waiting still lands (or finds the key no longer held).
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.release_queued(lease).await
    }

    /// A GET of the key's group and, if the key is assigned, of its owner's membership Lease.
    ///
    /// Cancel safe (read only).
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        let mut out = self.inspect_many(std::slice::from_ref(key)).await?;
        out.pop()
            .ok_or_else(|| Error::store_fault(BACKEND, "inspect_many returned no state", None))
    }

    /// One read of the groups the leases live in (a GET each for one or two groups, else one
    /// LIST of the set), then one membership write per distinct owner, TTL and term among the
    /// leases whose entries still name them with their token: those are renewed when the write
    /// succeeds, every other lease is lost, and a lost lease changes nothing (no membership is
    /// written for it). Outcomes in input order; an invalid TTL is reported in its slot.
    ///
    /// Cancel safe in the sense of [`LeaseStore::renew`]: a dropped batch may or may not have
    /// extended the owners' terms; the previous deadlines stay correct either way.
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        let mut out: Vec<Option<Result<RenewOutcome>>> = (0..leases.len()).map(|_| None).collect();
        let mut granted = vec![Duration::ZERO; leases.len()];
        let mut valid = Vec::with_capacity(leases.len());
        for (i, lease) in leases.iter().enumerate() {
            match self.inner.grantable_ttl(lease.ttl()) {
                Ok(r) => {
                    granted[i] = r.granted();
                    valid.push((i, r.get()));
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        if valid.is_empty() {
            return Ok(out.into_iter().flatten().collect());
        }
        let mut indices: Vec<u16> = valid
            .iter()
            .map(|(i, _)| group_of(leases[*i].key().as_str(), self.groups))
            .collect();
        indices.sort_unstable();
        indices.dedup();
        let groups = self.read_groups(&indices).await?;
        // The leases whose entries name them, by membership Lease (owner, seconds) and term.
        let mut by_term: BTreeMap<(OwnerId, u32, FencingToken), Vec<usize>> = BTreeMap::new();
        for (i, secs) in valid {
            let lease = &leases[i];
            let group = &groups[&group_of(lease.key().as_str(), self.groups)];
            let term = group
                .entries
                .get(lease.key().as_str())
                .filter(|e| e.token == lease.token())
                .and_then(|e| e.held.as_ref())
                .filter(|a| {
                    &a.owner == lease.owner()
                        && a.secs == secs
                        && Self::term_of(lease).is_none_or(|t| t == a.inc)
                })
                .map(|a| a.inc);
            match term {
                Some(inc) => by_term
                    .entry((lease.owner().clone(), secs, inc))
                    .or_default()
                    .push(i),
                None => out[i] = Some(Ok(RenewOutcome::Lost)),
            }
        }
        for ((owner, secs, inc), idxs) in by_term {
            let ttl = granted[idxs[0]];
            let renewed = self.renew_member(&owner, secs, ttl, inc).await?;
            for i in idxs {
                let lease = &leases[i];
                out[i] = Some(Ok(match renewed {
                    Some(sent) => RenewOutcome::Renewed(
                        lease
                            .renewed(granted[i], sent)
                            .with_handle(inc.get().to_string()),
                    ),
                    None => {
                        tracing::info!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), term = %inc, "grouped renewal lost: the owner's term ended");
                        RenewOutcome::Lost
                    }
                }));
            }
        }
        Ok(out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(Error::store_fault(BACKEND, "renewal without outcome", None))
                })
            })
            .collect())
    }

    /// The groups the keys live in (a GET each for one or two, else one LIST of the set) and
    /// the membership Leases their entries name (a GET each, at most 16 at once).
    ///
    /// Cancel safe (read only).
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        let mut indices: Vec<u16> = keys
            .iter()
            .map(|k| group_of(k.as_str(), self.groups))
            .collect();
        indices.sort_unstable();
        indices.dedup();
        let groups = self.read_groups(&indices).await?;
        let entries: Vec<Option<&Entry>> = keys
            .iter()
            .map(|k| {
                groups[&group_of(k.as_str(), self.groups)]
                    .entries
                    .get(k.as_str())
            })
            .collect();
        let terms = self.terms_of(entries.iter().flatten().copied()).await?;
        Ok(keys
            .iter()
            .zip(entries)
            .map(|(key, entry)| {
                let holder = entry.and_then(|e| {
                    let a = e.held.as_ref()?;
                    match terms.get(&(a.owner.clone(), a.secs, a.inc)) {
                        Some(Term::Live { remaining, ttl }) => Some(Holder {
                            owner: a.owner.clone(),
                            token: e.token,
                            remaining: *remaining,
                            ttl: *ttl,
                        }),
                        _ => None,
                    }
                });
                KeyState {
                    key: key.clone(),
                    holder,
                    last_token: entry.map(|e| e.token),
                }
            })
            .collect())
    }

    /// Validates the batch, renews (or takes) each distinct owner's membership Lease once, then
    /// writes each group touched with one conditional replace granting all its free keys,
    /// retrying lost races per group. Batches of one store running at the same time share their
    /// writes: one membership renewal per owner, and one read and replace per group for every
    /// batch queued on it by then.
    ///
    /// Not cancel safe: a dropped batch may have granted any of its keys (its group writes are
    /// carried out by tasks of their own).
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        validate_acquire_many(reqs)?;
        let mut out: Vec<Option<Result<AcquireOutcome>>> = (0..reqs.len()).map(|_| None).collect();
        let mut members: BTreeMap<(OwnerId, u32), Duration> = BTreeMap::new();
        let mut by_group: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, req) in reqs.iter().enumerate() {
            match self.inner.grantable_ttl(req.ttl) {
                Ok(r) => {
                    members.insert((req.owner.clone(), r.get()), r.granted());
                    by_group
                        .entry(group_of(req.key.as_str(), self.groups))
                        .or_default()
                        .push(i);
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let mut terms = HashMap::with_capacity(members.len());
        for ((owner, secs), ttl) in members {
            let (inc, sent) = self.ensure_member(&owner, secs, ttl).await?;
            terms.insert((owner, secs), (inc, sent, ttl));
        }
        let terms = Arc::new(terms);
        let calls = by_group.into_iter().map(|(index, idxs)| {
            let group_reqs = idxs.iter().map(|&i| reqs[i].clone()).collect();
            let granted = self.acquire_queued(index, group_reqs, terms.clone());
            async move { (idxs, granted.await) }
        });
        for (idxs, granted) in join_all(calls).await {
            for (i, outcome) in idxs.into_iter().zip(granted?) {
                out[i] = Some(Ok(outcome));
            }
        }
        Ok(out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(Error::store_fault(BACKEND, "acquire without outcome", None))
                })
            })
            .collect())
    }

    /// Watches the key's group object: any change of the group is a hint.
    ///
    /// Cancel safe: nothing is held until the watch is returned.
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        crate::watch::start_on(
            self.maps.clone(),
            &self.group_object_name(key),
            self.inner.request_timeout(),
        )
        .await
        .map(Some)
    }
}
