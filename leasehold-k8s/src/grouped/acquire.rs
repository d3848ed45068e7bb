//! Grants of a [`K8sGroupedStore`], coalesced per group: each batch (`acquire_many`) queues its
//! requests on the groups their keys live in, and one task per group writes every batch queued
//! there with one conditional replace. A shard set takes its share in several batches at once
//! (128 keys each); written one batch at a time, each of them read and replaced every group
//! (eight batches of a thousand shards over 16 groups: 256 requests), where one read and one
//! replace per group carry them all. The task reads the group before it takes the queue, so the
//! batches queued during that read join the write. It runs on its own, so a batch whose caller
//! stops waiting is still written (a dropped `acquire_many` may have granted its keys, as the
//! contract allows).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::granted_lease;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Error, FencingToken, Holder, OwnerId, Result,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::coalesce::{self, Queue};
use super::entry::{Assigned, Entry, Term, next_token};
use super::{Group, Judged, K8sGroupedStore, MAX_RACES};
use crate::error::{BACKEND, K8sError};

/// The owners' terms a batch was granted under, by owner and TTL in seconds: the term, when the
/// renewal that vouched for it was sent, and the TTL granted.
pub(super) type Terms = HashMap<(OwnerId, u32), (FencingToken, Instant, Duration)>;

/// One batch's requests on one group, waiting for the group's write.
pub(super) struct Asked {
    reqs: Vec<AcquireRequest>,
    terms: Arc<Terms>,
    done: oneshot::Sender<Result<Vec<AcquireOutcome>>>,
}

/// A request of the queue being written: which batch, which of its requests.
type Pick = (usize, usize);

impl K8sGroupedStore {
    /// Queues `reqs` (all in group `index`, each owner's term in `terms`) on the group and has a
    /// task write the queue; returns their outcomes in order.
    pub(super) async fn acquire_queued(
        &self,
        index: u16,
        reqs: Vec<AcquireRequest>,
        terms: Arc<Terms>,
    ) -> Result<Vec<AcquireOutcome>> {
        let (done, answer) = oneshot::channel();
        self.grant_queue(index).push(Asked { reqs, terms, done });
        let this = self.clone();
        tokio::spawn(async move { this.flush_grants(index).await });
        coalesce::answered(answer, "grant").await
    }

    fn grant_queue(&self, index: u16) -> &Queue<Asked> {
        &self.grants[usize::from(index) % self.grants.len().max(1)]
    }

    /// Writes every batch queued on group `index` (none if an earlier task took them), under the
    /// group's write lock: reads the group, then takes the queue as it is then.
    async fn flush_grants(&self, index: u16) {
        let _writer = self.writer(index).await;
        if self.grant_queue(index).is_empty() {
            return;
        }
        let read = self.read_group(index).await;
        let batch = self.grant_queue(index).take();
        if batch.is_empty() {
            return;
        }
        let result = match read {
            Ok(group) => self.grant_in_group(index, group, &batch).await,
            Err(e) => Err(e),
        };
        coalesce::answer(batch.into_iter().map(|a| a.done).collect(), result);
    }

    /// Grants what it can of every request of `batch`, `group` being the group as just read.
    /// A key asked for by several batches is decided once per write, in queue order: the first
    /// request of a key in one write, the second in the next, and so on (each sees the one
    /// before). Outcomes per batch, in its order.
    async fn grant_in_group(
        &self,
        index: u16,
        group: Group,
        batch: &[Asked],
    ) -> Result<Vec<Vec<AcquireOutcome>>> {
        let mut rounds: Vec<Vec<Pick>> = Vec::new();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (a, asked) in batch.iter().enumerate() {
            for (j, req) in asked.reqs.iter().enumerate() {
                let n = seen.entry(req.key.as_str()).or_default();
                if rounds.len() <= *n {
                    rounds.push(Vec::new());
                }
                rounds[*n].push((a, j));
                *n += 1;
            }
        }
        let mut out: Vec<Vec<Option<AcquireOutcome>>> =
            batch.iter().map(|a| vec![None; a.reqs.len()]).collect();
        let judged = Judged::default();
        let mut group = Some(group);
        for picks in rounds {
            let read = match group.take() {
                Some(g) => g,
                None => self.read_group(index).await?,
            };
            for (a, j, outcome) in self
                .grant_round(index, read, &picks, batch, &judged)
                .await?
            {
                out[a][j] = Some(outcome);
            }
        }
        out.into_iter()
            .map(|outcomes| {
                outcomes
                    .into_iter()
                    .map(|o| {
                        o.ok_or_else(|| {
                            Error::store_fault(BACKEND, "acquire without outcome", None)
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// One conditional replace of group `index` granting the free keys among `picks` (distinct
    /// keys), starting from `group` as read and retrying lost races.
    async fn grant_round(
        &self,
        index: u16,
        mut group: Group,
        picks: &[Pick],
        batch: &[Asked],
        judged: &Judged,
    ) -> Result<Vec<(usize, usize, AcquireOutcome)>> {
        for _ in 0..MAX_RACES {
            if group.object.is_none() {
                self.create_group(index).await?;
                group = self.read_group(index).await?;
                continue;
            }
            let mut out = Vec::with_capacity(picks.len());
            let mut entries: BTreeMap<String, Entry> = group.entries.clone();
            let mut grants = Vec::new();
            for &(a, j) in picks {
                let req = &batch[a].reqs[j];
                let previous = group.entries.get(req.key.as_str());
                if let Some(Entry {
                    token,
                    held: Some(held),
                }) = previous
                    && held.owner != req.owner
                    && let Term::Live { remaining, ttl } =
                        self.judge(held, &req.owner, judged).await?
                {
                    let holder = Holder {
                        owner: held.owner.clone(),
                        token: *token,
                        remaining,
                        ttl,
                    };
                    out.push((a, j, AcquireOutcome::Held(holder)));
                    continue;
                }
                let secs = self.inner.grantable_ttl(req.ttl)?.get();
                let Some(&(inc, _, _)) = batch[a].terms.get(&(req.owner.clone(), secs)) else {
                    return Err(Error::store_fault(
                        BACKEND,
                        format!("no membership term for owner {} ({secs} s)", req.owner),
                        None,
                    ));
                };
                let token = next_token(group.rv, previous.map(|e| e.token))?;
                let assigned = Assigned {
                    inc,
                    secs,
                    owner: req.owner.clone(),
                };
                entries.insert(
                    req.key.as_str().to_string(),
                    Entry {
                        token,
                        held: Some(assigned),
                    },
                );
                grants.push((a, j, token, secs));
            }
            if grants.is_empty() {
                return Ok(out);
            }
            match self.write_group(&group, &entries).await {
                Ok(()) => {
                    for (a, j, token, secs) in grants {
                        let req = &batch[a].reqs[j];
                        let (inc, sent, ttl) = batch[a].terms[&(req.owner.clone(), secs)];
                        tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, term = %inc, "grouped lease acquired");
                        let lease = granted_lease(
                            req.key.clone(),
                            req.owner.clone(),
                            token,
                            ttl,
                            req.drift_margin(),
                            sent,
                        )
                        .with_handle(inc.get().to_string());
                        out.push((a, j, AcquireOutcome::Acquired(lease)));
                    }
                    return Ok(out);
                }
                Err(K8sError::Conflict | K8sError::NotFound(_)) => {
                    group = self.read_group(index).await?;
                }
                Err(e) => return Err(e.into_error("replace")),
            }
        }
        Err(self.races_lost(index))
    }
}
