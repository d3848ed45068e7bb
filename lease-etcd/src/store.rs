//! [`EtcdLeaseStore`]: leases as etcd locks, one etcd lease per grant.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, WatchFilterType, WatchOptions,
};
use lease_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, ExpiryClock, FencingToken, Holder,
    KeyState, KeyWatch, Lease, LeaseKey, LeaseStore, MAX_TTL, ReleaseOutcome, RenewOutcome, Result,
    TokenDurability, validate_ttl,
};

use crate::BACKEND;
use crate::config::EtcdConfig;
use crate::config::LeaseSharing;
use crate::error::{map, protocol};
use crate::keys::{
    Handle, check_owner, encode_owner, our_owner, owner_of, parse_handle, secs, token_of,
    whole_secs,
};
use crate::shared::{PutKind, Shared};

/// How many keepalives (or renewals of resumed leases) of one [`LeaseStore::renew_many`] batch
/// are in flight at once.
pub(crate) const BATCH_CONCURRENCY: usize = 64;

/// How often acquire re-reads the key when a transaction lost a race, before giving up with a
/// retryable error.
const MAX_ATTEMPTS: usize = 8;

/// A [`LeaseStore`] on etcd, compatible with etcd's own lock protocol.
///
/// A lease on key `k` is the etcd lock named `<prefix>k` (see [`EtcdConfig::with_prefix`]): the
/// holder is the key under `<prefix>k/` with the lowest create revision, exactly as for
/// `etcdctl lock` and Go's `concurrency.Mutex`, so all three exclude each other. Each grant
/// attaches its key to an etcd lease with the granted TTL (its own, or one shared per TTL with
/// [`LeaseSharing::PerTtl`]), so etcd's clock decides expiry, and the fencing token is the key's
/// create revision (see the crate docs for why it never goes back). Every ownership change is one
/// transaction that compares create revisions.
///
/// Cloning is cheap; clones share the connection.
///
/// ```no_run
/// use std::time::Duration;
/// use lease_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
/// use lease_etcd::{EtcdConfig, EtcdLeaseStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// let store = EtcdLeaseStore::connect(EtcdConfig::from_list("http://127.0.0.1:2379")).await?;
/// let req = AcquireRequest::new(LeaseKey::new("nightly-report")?, OwnerId::random(), Duration::from_secs(10));
/// if let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? {
///     println!("token {} on etcd lock {}", lease.token(), store.config().lock_name(lease.key()));
///     let _ = store.release(&lease).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdLeaseStore {
    pub(crate) client: Client,
    pub(crate) config: Arc<EtcdConfig>,
    pub(crate) min_ttl: Duration,
    /// Present with [`LeaseSharing::PerTtl`].
    pub(crate) shared: Option<Arc<Shared>>,
}

impl fmt::Debug for EtcdLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLeaseStore")
            .field("endpoints", &self.config.endpoints())
            .field("prefix", &self.config.prefix())
            .field("min_ttl", &self.min_ttl)
            .field("lease_sharing", &self.config.lease_sharing())
            .finish_non_exhaustive()
    }
}

impl EtcdLeaseStore {
    /// Connects to etcd and asks it for its minimum lease TTL (by granting and revoking a
    /// one-second lease), which becomes [`Capabilities::min_ttl`].
    ///
    /// # Errors
    /// [`Error::Config`] for an empty or malformed endpoint list; [`Error::Unavailable`] or
    /// [`Error::Timeout`] if no endpoint answers within the connect and request timeouts.
    ///
    /// # Cancellation safety
    /// Cancel safe: a dropped connect leaves at most a one-second etcd lease behind, which expires.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout())
            .with_keep_alive(Duration::from_secs(10), config.request_timeout());
        let connect = Client::connect(config.endpoints(), Some(options));
        let client = match tokio::time::timeout(
            config.connect_timeout() + config.request_timeout(),
            connect,
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(map("connect", e, config.request_timeout())),
            Err(_) => {
                return Err(Error::unavailable(
                    BACKEND,
                    format!("no etcd endpoint of {:?} answered", config.endpoints()),
                    None,
                ));
            }
        };
        let mut store = EtcdLeaseStore {
            client,
            config: Arc::new(config),
            min_ttl: Duration::from_secs(1),
            shared: None,
        };
        store.min_ttl = store.probe_min_ttl().await?;
        if store.config.lease_sharing() == LeaseSharing::PerTtl {
            // The sweeper gets a handle without the shared state, so that it ends with the store.
            store.shared = Some(Shared::start(store.clone()));
        }
        Ok(store)
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// The underlying `etcd-client` client (a cheap clone), for operations this crate does not
    /// cover.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    fn mutex_prefix(&self, key: &LeaseKey) -> String {
        format!("{}/", self.config.lock_name(key))
    }

    /// `<prefix><key>/<lease id hex>`, as Go's mutex names its keys; with a shared etcd lease a
    /// `-<nonce hex>` suffix tells apart the keys of one lease (the protocol only reads revisions).
    pub(crate) fn lock_key(&self, key: &LeaseKey, lease_id: i64, nonce: Option<u64>) -> String {
        match nonce {
            None => format!("{}{:x}", self.mutex_prefix(key), lease_id),
            Some(n) => format!("{}{:x}-{:x}", self.mutex_prefix(key), lease_id, n),
        }
    }

    /// The current holder's key: the key under the lock prefix with the lowest create revision
    /// (the lock protocol's rule), and how many keys there are under the prefix.
    async fn holder_kv(&self, key: &LeaseKey) -> Result<(Option<KeyValue>, i64)> {
        let opts = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let mut resp = self.get(self.mutex_prefix(key), Some(opts)).await?;
        let count = resp.count();
        Ok((resp.take_kvs().into_iter().next(), count))
    }

    /// The holder as reported to callers, with the remaining TTL of its etcd lease.
    async fn holder_of(&self, kv: &KeyValue) -> Result<Holder> {
        let token = token_of(kv)?;
        let owner = owner_of(kv);
        let (remaining, ttl) = if kv.lease() == 0 {
            // A lock key without a lease (written by hand) never expires.
            (MAX_TTL, MAX_TTL)
        } else {
            let r = self.time_to_live(kv.lease()).await?;
            let remaining = secs(r.ttl().max(0));
            (remaining, secs(r.granted_ttl().max(0)).max(remaining))
        };
        Ok(Holder {
            owner,
            token,
            remaining,
            ttl,
        })
    }

    /// The lock key of `lease` if it still exists with the lease's token and owner, and is backed
    /// by an etcd lease.
    pub(crate) async fn held_kv(&self, lease: &Lease) -> Result<Option<KeyValue>> {
        let kv = match parse_handle(lease.handle()) {
            Some(Handle { named, nonce, .. }) => {
                let mut resp = self
                    .get(self.lock_key(lease.key(), named, nonce), None)
                    .await?;
                resp.take_kvs().into_iter().next()
            }
            None => self.holder_kv(lease.key()).await?.0,
        };
        Ok(kv.filter(|kv| {
            kv.create_revision() == lease.token().to_i64()
                && kv.lease() != 0
                && our_owner(kv).as_ref() == Some(lease.owner())
        }))
    }
}

#[async_trait]
impl LeaseStore for EtcdLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TokenDurability::Durable, ExpiryClock::Server)
            .with_watch(true)
            .with_min_ttl(self.min_ttl)
            .with_ttl_granularity(Duration::from_secs(1))
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        validate_ttl(req.ttl, self.min_ttl)?;
        check_owner(&req.owner)?;
        let ttl_secs = whole_secs(req.ttl);
        let prefix = self.mutex_prefix(&req.key);
        for _ in 0..MAX_ATTEMPTS {
            let (current, count) = self.holder_kv(&req.key).await?;
            let (compares, previous) = match current {
                None => (
                    vec![
                        Compare::create_revision(prefix.clone(), CompareOp::Equal, 0).with_prefix(),
                    ],
                    None,
                ),
                // Our own key, alone under the prefix: replace it (a new grant, a greater token).
                Some(kv) if count == 1 && our_owner(&kv).as_ref() == Some(&req.owner) => (
                    vec![
                        Compare::create_revision(
                            prefix.clone(),
                            CompareOp::Less,
                            kv.create_revision() + 1,
                        )
                        .with_prefix(),
                        Compare::create_revision(
                            kv.key().to_vec(),
                            CompareOp::Equal,
                            kv.create_revision(),
                        ),
                    ],
                    Some(kv),
                ),
                // Held by someone else, or by us with `etcdctl lock` waiters queued behind (they
                // come first: replacing our key would hand the lock to the oldest waiter).
                Some(kv) => return Ok(AcquireOutcome::Held(self.holder_of(&kv).await?)),
            };
            let (lease_id, sent, nonce) = match &self.shared {
                Some(shared) => {
                    let (id, sent) = shared.lease_or_grant(self, req, ttl_secs).await?;
                    (id, sent, Some(shared.next_nonce()))
                }
                None => {
                    let (id, sent) = self.grant_exactly(req, ttl_secs).await?;
                    (id, sent, None)
                }
            };
            let lock_key = self.lock_key(&req.key, lease_id, nonce);
            // With a shared etcd lease, the key is recorded before the put is sent: if the outcome
            // never becomes known (an error, or this future dropped), the sweeper deletes it.
            let pending = self.shared.as_ref().map(|shared| {
                shared.pending(
                    lock_key.as_bytes(),
                    lease_id,
                    secs(ttl_secs),
                    PutKind::Acquire,
                )
            });
            let mut ops = Vec::with_capacity(2);
            if let Some(kv) = &previous {
                ops.push(TxnOp::delete(kv.key().to_vec(), None));
            }
            ops.push(TxnOp::put(
                lock_key.clone(),
                encode_owner(&req.owner),
                Some(PutOptions::new().with_lease(lease_id)),
            ));
            let txn = Txn::new().when(compares).and_then(ops);
            let resp = match self.txn(txn).await {
                Ok(resp) => resp,
                Err(e) => {
                    // The outcome is unknown: revoking removes a grant that may have happened;
                    // with a shared etcd lease, `pending` is dropped here and the sweeper
                    // deletes the key if the put happened.
                    if self.shared.is_none() {
                        self.revoke_quietly(lease_id).await;
                    }
                    return Err(e);
                }
            };
            if !resp.succeeded() {
                match pending {
                    Some(pending) => pending.cancel(),
                    None => self.revoke_quietly(lease_id).await,
                }
                continue;
            }
            let revision = resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| protocol("txn without header"))?;
            let token = FencingToken::try_from(revision).map_err(|e| protocol(e.to_string()))?;
            match (&self.shared, pending, previous) {
                (Some(shared), Some(pending), previous) => {
                    if let Some(old) = previous {
                        shared.forget(old.key());
                    }
                    pending.confirm(revision, sent + secs(ttl_secs));
                }
                (None, _, Some(old)) => self.revoke_quietly(old.lease()).await,
                _ => {}
            }
            tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, lease_id, "lease acquired");
            let lease = Lease::granted(
                req.key.clone(),
                req.owner.clone(),
                token,
                secs(ttl_secs),
                req.drift_margin(),
                sent,
            )
            .with_handle(
                Handle {
                    lease_id,
                    ttl_secs,
                    nonce,
                    named: lease_id,
                }
                .to_string(),
            );
            return Ok(AcquireOutcome::Acquired(lease));
        }
        Err(Error::unavailable(
            BACKEND,
            format!(
                "{} changed hands {MAX_ATTEMPTS} times during one acquire",
                req.key
            ),
            None,
        ))
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        // A lease this store issued names its etcd lease in its handle: keep that alive, then
        // check the key. A lease without a handle (resumed) is checked first, so that a stale or
        // foreign one never extends somebody else's etcd lease. A lease whose key is on another
        // store's shared etcd lease is moved onto this store's (see `renew_many`).
        self.renew_batch(std::slice::from_ref(lease))
            .await?
            .pop()
            .unwrap_or(Ok(RenewOutcome::Lost))
    }

    /// Renews the batch with one keepalive per distinct etcd lease (at most 64 in flight; with
    /// [`LeaseSharing::PerTtl`] that is about one per TTL in use), then reads all lock keys back
    /// with range requests over the span of the batch's keys, 5,000 keys a page: 10,000 leases
    /// on one shared etcd lease cost about three requests. Leases without a handle (resumed) are
    /// renewed one by one, as by [`renew`](LeaseStore::renew).
    ///
    /// # Cancellation safety
    /// As [`renew`](LeaseStore::renew): a dropped batch may or may not have extended each lease.
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        self.renew_batch(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        check_owner(lease.owner())?;
        let Some(kv) = self.held_kv(lease).await? else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let txn = Txn::new()
            .when(vec![
                Compare::create_revision(kv.key().to_vec(), CompareOp::Equal, kv.create_revision()),
                Compare::lease(kv.key().to_vec(), CompareOp::Equal, kv.lease()),
            ])
            .and_then(vec![TxnOp::delete(kv.key().to_vec(), None)]);
        if !self.txn(txn).await?.succeeded() {
            return Ok(ReleaseOutcome::NotHeld);
        }
        match &self.shared {
            // Other keys may live on the shared etcd lease; unused, it simply expires.
            Some(shared) => shared.forget(kv.key()),
            None => self.revoke_quietly(kv.lease()).await,
        }
        tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease released");
        Ok(ReleaseOutcome::Released)
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        let holder = match self.holder_kv(key).await?.0 {
            Some(kv) => Some(self.holder_of(&kv).await?),
            None => None,
        };
        let last_token = holder.as_ref().map(|h| h.token);
        Ok(KeyState {
            key: key.clone(),
            holder,
            last_token,
        })
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        let prefix = self.mutex_prefix(key);
        let mut stream = self
            .call("watch", || {
                let (mut wc, prefix, opts) =
                    (self.client.watch_client(), prefix.clone(), opts.clone());
                async move { wc.watch(prefix, Some(opts)).await }
            })
            .await?;
        // Wait until the server confirms the watch, so that no delete after this call is missed.
        let after = self.config.request_timeout();
        let confirmed = match tokio::time::timeout(after, stream.message()).await {
            Ok(Ok(first)) => first,
            Ok(Err(e)) => return Err(map("watch", e, after)),
            Err(_) => {
                return Err(Error::Timeout {
                    backend: BACKEND,
                    operation: "watch",
                    after,
                });
            }
        };
        match confirmed {
            Some(resp) if resp.created() => {}
            _ => return Err(protocol("etcd did not confirm the watch")),
        }
        let hints = futures::stream::unfold(Some(stream), move |state| async move {
            let mut stream = state?;
            loop {
                match stream.message().await {
                    Ok(Some(resp)) if resp.canceled() => {
                        let msg = format!("etcd cancelled the watch: {}", resp.cancel_reason());
                        return Some((Err(protocol(msg)), None));
                    }
                    Ok(Some(resp)) if !resp.events().is_empty() => {
                        return Some((Ok(()), Some(stream)));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => return None,
                    Err(e) => return Some((Err(map("watch", e, after)), None)),
                }
            }
        });
        Ok(Some(KeyWatch::new(Box::pin(hints))))
    }
}
