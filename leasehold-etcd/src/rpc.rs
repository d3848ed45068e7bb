//! The requests [`EtcdLeaseStore`] sends: each under the request timeout, with errors mapped by
//! kind, and resent when it certainly never left this process.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    GetOptions, GetResponse, LeaseGrantResponse, LeaseTimeToLiveOptions, LeaseTimeToLiveResponse,
    Txn, TxnResponse,
};
use leasehold_core::{AcquireRequest, Error, Result};
use tokio::time::Instant;

use crate::error::{BACKEND, is_not_found, map, not_sent, protocol};
use crate::handle::secs;
use crate::store::EtcdLeaseStore;

impl EtcdLeaseStore {
    pub(crate) async fn probe_min_ttl(&self) -> Result<Duration> {
        let grant = self.grant(1).await?;
        self.revoke_quietly(grant.id()).await;
        Ok(secs(grant.ttl().max(1)))
    }

    /// Runs one request under the request timeout and maps its error. A request that certainly
    /// never left this process (connection refused, typically a dead member among several
    /// endpoints) is sent again, to the next endpoint, while the timeout allows.
    pub(crate) async fn call<T, F, Fut>(&self, op: &'static str, mut request: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let after = self.options.request_timeout();
        // A timeout too long to add to the clock is no deadline at all.
        let deadline = Instant::now().checked_add(after);
        let remaining = || match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => Duration::MAX,
        };
        let mut attempt: u32 = 0;
        loop {
            let left = remaining();
            match tokio::time::timeout(left, request()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if not_sent(&e) && attempt < self.retries() => {
                    attempt += 1;
                    let pause = Duration::from_millis(10 * u64::from(attempt));
                    if deadline.is_some_and(|d| Instant::now() + pause >= d) {
                        return Err(map(op, e, after));
                    }
                    tracing::debug!(backend = BACKEND, operation = op, attempt, error = %e, "request not sent; trying again");
                    tokio::time::sleep(pause).await;
                }
                Ok(Err(e)) => return Err(map(op, e, after)),
                Err(_) => {
                    return Err(Error::Timeout {
                        backend: BACKEND,
                        operation: op,
                        after,
                    });
                }
            }
        }
    }

    fn retries(&self) -> u32 {
        u32::try_from(self.endpoints.len() * 2).unwrap_or(u32::MAX)
    }

    pub(crate) async fn get(&self, key: String, opts: Option<GetOptions>) -> Result<GetResponse> {
        self.call("get", || {
            let (mut kv, key, opts) = (self.client.kv_client(), key.clone(), opts.clone());
            async move { kv.get(key, opts).await }
        })
        .await
    }

    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.call("txn", || {
            let (mut kv, txn) = (self.client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    pub(crate) async fn grant(&self, ttl_secs: i64) -> Result<LeaseGrantResponse> {
        self.call("lease_grant", || {
            let mut lc = self.client.lease_client();
            async move { lc.grant(ttl_secs, None).await }
        })
        .await
    }

    /// Grants an etcd lease of exactly `ttl_secs`, returning its id and the instant the grant was
    /// sent. An etcd lease longer than asked (the server raised it to its minimum) is revoked and
    /// reported as [`Error::InvalidTtl`]: the caller must never believe in a shorter lease than
    /// the one that blocks everybody else.
    pub(crate) async fn grant_exactly(
        &self,
        req: &AcquireRequest,
        ttl_secs: i64,
    ) -> Result<(i64, Instant)> {
        let sent = Instant::now();
        let grant = self.grant(ttl_secs).await?;
        if grant.ttl() == ttl_secs {
            return Ok((grant.id(), sent));
        }
        self.revoke_quietly(grant.id()).await;
        if grant.ttl() > ttl_secs {
            return Err(Error::InvalidTtl {
                ttl: req.ttl,
                reason: format!(
                    "etcd raised it to its minimum of {} s; ask for at least that",
                    grant.ttl()
                ),
            });
        }
        Err(protocol(format!(
            "etcd granted {} s for a {ttl_secs} s lease",
            grant.ttl()
        )))
    }

    pub(crate) async fn time_to_live(&self, lease_id: i64) -> Result<LeaseTimeToLiveResponse> {
        self.call("lease_time_to_live", || {
            let mut lc = self.client.lease_client();
            async move { lc.time_to_live(lease_id, None).await }
        })
        .await
    }

    /// The keys attached to etcd lease `lease_id` (`LeaseTimeToLive` with `keys`), or `None` if
    /// etcd no longer knows the lease (it expired or was revoked: nothing can be put on it).
    pub(crate) async fn lease_keys(&self, lease_id: i64) -> Result<Option<Vec<Vec<u8>>>> {
        let resp = self
            .call("lease_time_to_live", || {
                let mut lc = self.client.lease_client();
                let opts = LeaseTimeToLiveOptions::new().with_keys();
                async move { lc.time_to_live(lease_id, Some(opts)).await }
            })
            .await?;
        Ok((resp.ttl() >= 0).then(|| resp.keys().to_vec()))
    }

    /// One keepalive: `false` if etcd answered that the lease does not exist (TTL <= 0).
    pub(crate) async fn keep_alive_once(&self, lease_id: i64) -> Result<bool> {
        self.call("lease_keep_alive", || {
            let mut lc = self.client.lease_client();
            async move {
                match lc.keep_alive(lease_id).await {
                    Ok(_keeper_and_stream) => Ok(true),
                    // The only error `keep_alive` reports after a successful exchange: TTL <= 0.
                    Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                    Err(e) => Err(e),
                }
            }
        })
        .await
    }

    /// Revokes etcd lease `lease_id` (etcd deletes every key on it in the same write): `false`
    /// if etcd answered that it does not know the lease (expired or revoked before).
    pub(crate) async fn revoke(&self, lease_id: i64) -> Result<bool> {
        self.call("lease_revoke", || {
            let mut lc = self.client.lease_client();
            async move {
                match lc.revoke(lease_id).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_not_found(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            }
        })
        .await
    }

    pub(crate) async fn revoke_quietly(&self, lease_id: i64) {
        if let Err(e) = self.revoke(lease_id).await {
            tracing::debug!(backend = BACKEND, lease_id, error = %e, "revoking an etcd lease failed; it will expire");
        }
    }
}
