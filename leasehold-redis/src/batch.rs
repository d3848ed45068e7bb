//! The batches of [`RedisLeaseStore`]: `acquire_many` and `renew_many`, one script per hash slot
//! (one group on a single server), all sent at once.

use std::time::Duration;

use leasehold_core::backend::{RoundedTtl, decode_token, granted_lease};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Error, FencingToken, Holder, Lease, RenewOutcome, Result,
};
use tokio::time::Instant;

use crate::error::{BACKEND, unexpected};
use crate::inspect::parse_holder;
use crate::protocol;
use crate::store::{ACQUIRE_BATCH, RedisLeaseStore, clone_error, grantable_ttl, renew_outcome};

impl RedisLeaseStore {
    pub(crate) async fn acquire_many_unbounded(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<Vec<Result<AcquireOutcome>>> {
        let layout = &self.inner.layout;
        let mut out: Vec<Option<Result<AcquireOutcome>>> = Vec::with_capacity(reqs.len());
        let mut groups: Vec<Vec<(usize, RoundedTtl)>> = Vec::new();
        let mut group_of = std::collections::HashMap::new();
        for (i, req) in reqs.iter().enumerate() {
            match grantable_ttl(req.ttl) {
                Ok(ttl) => {
                    let group = self.inner.con.group(&layout.lease(&req.key));
                    let g = *group_of.entry(group).or_insert_with(|| {
                        groups.push(Vec::new());
                        groups.len() - 1
                    });
                    groups[g].push((i, ttl));
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        // With replica acknowledgements on, a group's scripts go in one pipeline with one `WAIT`
        // after the last: `WAIT` blocks the connection, so a `WAIT` per script would make each
        // script's reply wait for every earlier script's `WAIT` as well.
        let units: Vec<Vec<&[(usize, RoundedTtl)]>> = if self.inner.replica_wait.is_some() {
            groups
                .iter()
                .map(|g| g.chunks(ACQUIRE_BATCH).collect())
                .collect()
        } else {
            groups
                .iter()
                .flat_map(|g| g.chunks(ACQUIRE_BATCH))
                .map(|c| vec![c])
                .collect()
        };
        let batches: Vec<Vec<(usize, RoundedTtl)>> = units.iter().map(|u| u.concat()).collect();
        let sent = Instant::now();
        let replies =
            futures::future::join_all(units.iter().map(|unit| self.acquire_script(reqs, unit)))
                .await;
        let several = units.iter().map(Vec::len).sum::<usize>() > 1;
        for (batch, reply) in batches.iter().zip(replies) {
            let outcomes = match reply {
                Ok(outcomes) => outcomes,
                Err(e) if !several => return Err(e),
                Err(e) => batch.iter().map(|_| Err(clone_error(&e))).collect(),
            };
            for (&(i, ttl), outcome) in batch.iter().zip(outcomes) {
                let req = &reqs[i];
                out[i] = Some(outcome.map(|token| match token {
                    Ok(token) => {
                        tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, "lease acquired (batch)");
                        AcquireOutcome::Acquired(granted_lease(
                            req.key.clone(),
                            req.owner.clone(),
                            token,
                            ttl.granted(),
                            req.drift_margin(),
                            sent,
                        ))
                    }
                    Err(holder) => AcquireOutcome::Held(holder),
                }));
            }
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| unexpected("acquire_many", &"a request without an outcome")))
            .collect()
    }

    pub(crate) async fn renew_many_unbounded(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<RenewOutcome>>> {
        // Invalid TTLs are reported in their slot and not sent; the rest go in one script per
        // group (one group on a single server, one per hash slot on a cluster).
        let mut out: Vec<Result<RenewOutcome>> = Vec::with_capacity(leases.len());
        let mut groups: Vec<Vec<(usize, u64, Duration)>> = Vec::new();
        let mut group_of = std::collections::HashMap::new();
        for (i, lease) in leases.iter().enumerate() {
            match grantable_ttl(lease.ttl()) {
                Ok(ttl) => {
                    let group = self.inner.con.group(&self.inner.layout.lease(lease.key()));
                    let g = *group_of.entry(group).or_insert_with(|| {
                        groups.push(Vec::new());
                        groups.len() - 1
                    });
                    groups[g].push((i, ttl.as_u64(), ttl.granted()));
                    out.push(Ok(RenewOutcome::Lost)); // overwritten below
                }
                Err(e) => out.push(Err(e)),
            }
        }
        let sent = Instant::now();
        // The groups go out together: on a cluster, the scripts for one node are pipelined on
        // that node's multiplexed connection.
        let replies = futures::future::join_all(groups.iter().map(|group| async move {
            let mut invocation = protocol::RENEW_MANY.prepare_invoke();
            for &(i, ms, _) in group {
                let lease = &leases[i];
                invocation
                    .key(self.inner.layout.lease(lease.key()))
                    .arg(protocol::record_prefix(lease.token(), lease.owner()))
                    .arg(ms);
            }
            let mut con = self.inner.con.clone();
            invocation
                .invoke_async::<Vec<i64>>(&mut con)
                .await
                .map_err(self.map("renew_many"))
        }))
        .await;
        for (group, reply) in groups.into_iter().zip(replies) {
            match reply {
                Ok(flags) if flags.len() == group.len() => {
                    for ((i, _, granted), flag) in group.into_iter().zip(flags) {
                        out[i] = Ok(renew_outcome(&leases[i], flag == 1, granted, sent));
                    }
                }
                Ok(flags) => return Err(unexpected("renew_many", &flags)),
                // One group failing fails the call when it is the only group (as before);
                // with several groups, the others' outcomes are kept and this group's leases
                // carry the error.
                Err(e) if group_of.len() == 1 => return Err(e),
                Err(e) => {
                    for (i, _, _) in group {
                        out[i] = Err(clone_error(&e));
                    }
                }
            }
        }
        Ok(out)
    }

    /// One [`ACQUIRE_MANY`](protocol::ACQUIRE_MANY) script for each of `scripts` (indexes into
    /// `reqs` whose keys share a hash slot on a cluster; one script without replica
    /// acknowledgements), pipelined and followed by one `WAIT` when replica acknowledgements are
    /// on: per request, in the scripts' order, its token or its holder, or its own error.
    async fn acquire_script(
        &self,
        reqs: &[AcquireRequest],
        scripts: &[&[(usize, RoundedTtl)]],
    ) -> Result<Vec<Result<std::result::Result<FencingToken, Holder>>>> {
        let layout = &self.inner.layout;
        let mut con = self.inner.con.clone();
        let batch: Vec<(usize, RoundedTtl)> = scripts.concat();
        let batch = batch.as_slice();
        let (reply, acked): (Vec<redis::Value>, Option<i64>) = match self.inner.replica_wait {
            None => {
                let mut invocation = protocol::ACQUIRE_MANY.prepare_invoke();
                for &(i, ttl) in batch {
                    let req = &reqs[i];
                    invocation
                        .key(layout.lease(&req.key))
                        .key(layout.generation(&req.key))
                        .arg(req.owner.as_str())
                        .arg(ttl.as_u64());
                }
                let reply = invocation
                    .invoke_async(&mut con)
                    .await
                    .map_err(self.map("acquire_many"))?;
                (reply, None)
            }
            Some(wait) => {
                let mut pipe = redis::pipe();
                for script in scripts {
                    let eval = pipe
                        .cmd("EVAL")
                        .arg(protocol::acquire_many_lua())
                        .arg(script.len() * 2);
                    for &(i, _) in *script {
                        eval.arg(layout.lease(&reqs[i].key))
                            .arg(layout.generation(&reqs[i].key));
                    }
                    for &(i, ttl) in *script {
                        eval.arg(reqs[i].owner.as_str()).arg(ttl.as_u64());
                    }
                }
                pipe.cmd("WAIT").arg(wait.replicas).arg(
                    u64::try_from(wait.timeout.as_millis())
                        .unwrap_or(u64::MAX)
                        .max(1),
                );
                let mut replies: Vec<redis::Value> = pipe
                    .query_async(&mut con)
                    .await
                    .map_err(self.map("acquire_many"))?;
                let acked = match replies.pop() {
                    Some(redis::Value::Int(acked)) if replies.len() == scripts.len() => acked,
                    other => return Err(unexpected("acquire_many", &other)),
                };
                let mut reply = Vec::with_capacity(batch.len());
                for script in replies {
                    match script {
                        redis::Value::Array(values) => reply.extend(values),
                        other => return Err(unexpected("acquire_many", &other)),
                    }
                }
                (reply, Some(acked))
            }
        };
        if reply.len() != batch.len() {
            return Err(unexpected("acquire_many", &reply));
        }
        let mut out = Vec::with_capacity(batch.len());
        for (&(i, _), value) in batch.iter().zip(&reply) {
            let key = &reqs[i].key;
            out.push(match value {
                redis::Value::BulkString(token) => std::str::from_utf8(token)
                    .map_err(|_| unexpected("acquire_many", value))
                    .and_then(|t| decode_token(BACKEND, key.as_str(), t))
                    .map(Ok),
                redis::Value::Array(held) => match held.as_slice() {
                    [
                        redis::Value::BulkString(record),
                        redis::Value::BulkString(pttl),
                    ] => parse_holder(key, record, pttl).map(Err),
                    _ => Err(unexpected("acquire_many", value)),
                },
                redis::Value::ServerError(e) => Err(Error::store_fault(
                    BACKEND,
                    format!(
                        "acquire_many of {key}: {}",
                        e.details().unwrap_or("script error")
                    ),
                    None,
                )),
                _ => Err(unexpected("acquire_many", value)),
            });
        }
        if let (Some(wait), Some(acked)) = (self.inner.replica_wait, acked)
            && acked < i64::from(wait.replicas)
        {
            // Too few replicas saw the script's writes: give its grants back and report the
            // error in their slots (as a single acquire does).
            for (&(i, ttl), o) in batch.iter().zip(out.iter_mut()) {
                if let Ok(Ok(token)) = o {
                    let req = &reqs[i];
                    let lease = granted_lease(
                        req.key.clone(),
                        req.owner.clone(),
                        *token,
                        ttl.granted(),
                        req.drift_margin(),
                        Instant::now(),
                    );
                    *o = self
                        .check_replicas(&lease, wait, acked)
                        .await
                        .map(|()| Ok(*token));
                }
            }
        }
        Ok(out)
    }
}
