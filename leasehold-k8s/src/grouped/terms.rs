//! The owners' membership terms: taking or renewing a term, ending a dead owner's term, and
//! judging the terms that group entries name.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Error, FencingToken, Lease, LeaseStore, OwnerId, RenewOutcome,
    Result,
};
use tokio::time::Instant;

use super::entry::{Assigned, Entry, Term, judge_term};
use super::{
    GET_THRESHOLD, GROUP_SET_LABEL, Judged, K8sGroupedStore, MEMBER_ATTEMPTS, MEMBER_FRESH,
    MEMBERS_IN_FLIGHT, REVOKE_TTL,
};
use crate::error::BACKEND;
use crate::protocol::Record;
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use kube::api::ListParams;

impl K8sGroupedStore {
    /// Renews `owner`'s membership Lease for `secs`: the term this store holds, else a live term
    /// of the owner that another store (a process with the same owner id) holds, else takes the
    /// Lease (a new term). Returns the term and when the deciding write was sent (a lower bound:
    /// the grants of the term are valid until `sent + ttl - drift`).
    ///
    /// A renewal of this store's sent less than [`MEMBER_FRESH`] ago (at most a sixteenth of the
    /// TTL) serves as this call's own: batches of one owner at the same time, which wait for each
    /// other on the store's lock of its membership Leases, share one renewal. Their grants count
    /// their validity from when that renewal was sent, so they are as safe as with one of their
    /// own and at most that much shorter; and the term cannot have been revoked since, as a
    /// revocation needs the Lease seen unchanged for the whole TTL.
    pub(super) async fn ensure_member(
        &self,
        owner: &OwnerId,
        secs: u32,
        ttl: Duration,
    ) -> Result<(FencingToken, Instant)> {
        let mut members = self.members.lock().await;
        let slot = (owner.clone(), secs);
        let key = self.member_key(owner, secs)?;
        if let Some((m, sent)) = members.get(&slot)
            && sent.elapsed() <= MEMBER_FRESH.min(ttl / 16)
            && m.is_valid()
        {
            return Ok((m.token(), *sent));
        }
        if let Some((m, _)) = members.get(&slot).filter(|(m, _)| m.is_valid()).cloned()
            && let Some((next, sent)) = self.renew_term(&m).await?
        {
            let term = next.token();
            members.insert(slot, (next, sent));
            return Ok((term, sent));
        }
        members.remove(&slot);
        // The owner's live term, if the Lease carries one: renewed, not replaced, so that every
        // store of one owner id shares one term (and none ends the others' grants).
        if let Some((_, rec, seen)) = self.inner.read(&self.inner.object_name(&key)).await?
            && let Ok(term) = rec.holder_token()
            && matches!(
                judge_term(owner, term, Some((&rec, seen)), Instant::now()),
                Term::Live { .. }
            )
            && let Some((next, sent)) = self
                .renew_term(&Lease::resume(key.clone(), owner.clone(), term, ttl))
                .await?
        {
            members.insert(slot, (next, sent));
            return Ok((term, sent));
        }
        let req = AcquireRequest::new(key, owner.clone(), ttl);
        for attempt in 1..=MEMBER_ATTEMPTS {
            let sent = Instant::now();
            match self.inner.acquire(&req).await? {
                AcquireOutcome::Acquired(m) => {
                    let term = m.token();
                    tracing::debug!(backend = BACKEND, set = %self.set, owner = %owner, term = %term, "membership term started");
                    members.insert(slot, (m, sent));
                    return Ok((term, sent));
                }
                // Another candidate holds it for a moment to end our previous term (a REVOKE_TTL
                // grant it releases at once): wait for it.
                AcquireOutcome::Held(_) => {
                    tokio::time::sleep(Duration::from_millis(50) * attempt).await;
                }
            }
        }
        Err(Error::refused(
            BACKEND,
            format!(
                "membership Lease {:?} stayed held by another owner",
                self.inner.object_name(&req.key)
            ),
            None,
        ))
    }

    /// Renews the membership term `lease` stands for: with the version this store last wrote,
    /// and, if someone else wrote since (another store of the same owner renewing the same
    /// term), once more on top of the current version if `lease` is still valid (its local
    /// deadline has not passed), the Lease still carries the term and this store has not seen it
    /// expire. Returns the renewed Lease and when the deciding write
    /// was sent, or `None` if the term is over.
    pub(super) async fn renew_term(&self, lease: &Lease) -> Result<Option<(Lease, Instant)>> {
        let sent = Instant::now();
        if let RenewOutcome::Renewed(next) = self.inner.renew(lease).await? {
            return Ok(Some((next, sent)));
        }
        // Only for a conflict on a term still valid here: a lease past its local deadline is
        // never renewed on top of another store's write (that would revive it).
        if lease.handle().is_none() || !lease.is_valid() {
            return Ok(None);
        }
        let resumed = Lease::resume(
            lease.key().clone(),
            lease.owner().clone(),
            lease.token(),
            lease.ttl(),
        );
        let sent = Instant::now();
        Ok(match self.inner.renew(&resumed).await? {
            RenewOutcome::Renewed(next) => Some((next, sent)),
            RenewOutcome::Lost => None,
        })
    }

    /// Whether the term of `held` is live, as this store judges it; a term seen expired is
    /// revoked (by `taker`) so that its owner cannot renew it any more.
    pub(super) async fn judge(
        &self,
        held: &Assigned,
        taker: &OwnerId,
        judged: &Judged,
    ) -> Result<Term> {
        let key = self.member_key(&held.owner, held.secs)?;
        let name = self.inner.object_name(&key);
        let mut judged = judged.lock().await;
        if let Some(t) = judged.get(&(name.clone(), held.inc)) {
            return Ok(t.clone());
        }
        let read = self.inner.read(&name).await?;
        let term = match judge_term(
            &held.owner,
            held.inc,
            read.as_ref().map(|(_, rec, seen)| (rec, *seen)),
            Instant::now(),
        ) {
            Term::Expired => {
                // A conditional write on the dead owner's membership Lease (the single-Lease
                // acquire: conditioned on the version seen expired) ends the term: its owner's
                // next renewal is a conflict. Released at once; the term never returns.
                let req = AcquireRequest::new(key, taker.clone(), REVOKE_TTL);
                match self.inner.acquire(&req).await? {
                    AcquireOutcome::Acquired(l) => {
                        tracing::debug!(backend = BACKEND, set = %self.set, owner = %held.owner, term = %held.inc, "expired membership term revoked");
                        if let Err(e) = self.inner.release(&l).await {
                            tracing::debug!(backend = BACKEND, error = %e, "release after revocation failed; it expires in 1 s");
                        }
                        Term::Over
                    }
                    AcquireOutcome::Held(h) if h.owner == held.owner && h.token == held.inc => {
                        Term::Live {
                            remaining: h.remaining,
                            ttl: h.ttl,
                        }
                    }
                    AcquireOutcome::Held(_) => Term::Over,
                }
            }
            other => other,
        };
        judged.insert((name, held.inc), term.clone());
        Ok(term)
    }

    /// Renews term `term` of `owner`'s membership Lease for `secs` ([`renew_term`]): the Lease
    /// this store holds if it has that term, else the term as the Lease carries it. Returns when
    /// the renewal was sent (the term's keys are valid until `sent + ttl - drift`), or `None` if
    /// the term is over.
    ///
    /// [`renew_term`]: Self::renew_term
    pub(super) async fn renew_member(
        &self,
        owner: &OwnerId,
        secs: u32,
        ttl: Duration,
        term: FencingToken,
    ) -> Result<Option<Instant>> {
        let mut members = self.members.lock().await;
        let slot = (owner.clone(), secs);
        let lease = match members.get(&slot) {
            Some((m, _)) if m.token() == term => m.clone(),
            _ => Lease::resume(self.member_key(owner, secs)?, owner.clone(), term, ttl),
        };
        match self.renew_term(&lease).await? {
            Some((next, sent)) => {
                members.insert(slot, (next, sent));
                Ok(Some(sent))
            }
            None => {
                if members.get(&slot).map(|(m, _)| m.token()) == Some(term) {
                    members.remove(&slot);
                }
                Ok(None)
            }
        }
    }

    /// The set's membership Leases (those labelled [`GROUP_SET_LABEL`]`=<set>`), by name: one
    /// LIST.
    async fn list_members(&self) -> Result<HashMap<String, KubeLease>> {
        let lp = ListParams::default().labels(&format!("{GROUP_SET_LABEL}={}", self.set));
        let list = self
            .inner
            .timed("list", self.inner.api.list(&lp))
            .await
            .map_err(|e| e.into_error("list"))?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|l| l.metadata.name.clone().map(|n| (n, l)))
            .collect())
    }

    /// Reads the membership Leases named by the assigned entries among `entries` (one GET each
    /// for one or two owners, else one LIST of the set's), and judges each term (without
    /// revoking anything).
    pub(super) async fn terms_of<'a>(
        &self,
        entries: impl Iterator<Item = &'a Entry>,
    ) -> Result<HashMap<(OwnerId, u32, FencingToken), Term>> {
        let mut wanted: HashSet<(OwnerId, u32)> = HashSet::new();
        let mut terms: HashSet<(OwnerId, u32, FencingToken)> = HashSet::new();
        for e in entries {
            if let Some(a) = &e.held {
                wanted.insert((a.owner.clone(), a.secs));
                terms.insert((a.owner.clone(), a.secs, a.inc));
            }
        }
        let mut listed = if wanted.len() > GET_THRESHOLD {
            self.list_members().await?
        } else {
            HashMap::new()
        };
        let reads: Vec<_> = wanted
            .into_iter()
            .map(|(owner, secs)| {
                let found = self
                    .member_key(&owner, secs)
                    .map(|k| self.inner.object_name(&k))
                    .map(|name| {
                        let obj = listed.remove(&name);
                        (name, obj)
                    });
                async move {
                    let (name, obj) = found?;
                    // A Lease the LIST did not return (created by a version of this store that
                    // did not label it, or gone) is read alone.
                    let read = match obj {
                        Some(obj) => {
                            let rec = Record::parse(&obj)?;
                            let first_seen = self.inner.observe(&name, &obj, &rec);
                            Some((obj, rec, first_seen))
                        }
                        None => self.inner.read(&name).await?,
                    };
                    Ok::<_, Error>(((owner, secs), read))
                }
            })
            .collect();
        let read: HashMap<_, _> = stream::iter(reads)
            .buffer_unordered(MEMBERS_IN_FLIGHT)
            .try_collect()
            .await?;
        let now = Instant::now();
        Ok(terms
            .into_iter()
            .map(|(owner, secs, inc)| {
                let rec = read
                    .get(&(owner.clone(), secs))
                    .and_then(|r| r.as_ref())
                    .map(|(_, rec, seen)| (rec, *seen));
                let term = judge_term(&owner, inc, rec, now);
                ((owner, secs, inc), term)
            })
            .collect())
    }
}
