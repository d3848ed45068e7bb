//! [`EtcdLeaseStore`]: leases as etcd locks, one etcd lease per grant.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, ConnectOptions, KeyValue};
use lease_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, ExpiryClock, Holder, KeyState, KeyWatch,
    Lease, LeaseKey, LeaseStore, MAX_TTL, ReleaseOutcome, RenewOutcome, Result, TokenDurability,
};

use crate::config::{EtcdOptions, LeaseSharing, endpoints_of};
use crate::error::{BACKEND, map, protocol};
use crate::handle::{Handle, check_owner, our_owner, owner_of, parse_handle, secs, token_of};
use crate::protocol;
use crate::shared::{PutKind, Shared};

/// How many keepalives (or renewals of resumed leases) of one [`LeaseStore::renew_many`] batch
/// are in flight at once.
pub(crate) const BATCH_CONCURRENCY: usize = 64;

/// How often acquire re-reads the key when a transaction lost a race, before giving up with a
/// retryable error.
const MAX_ATTEMPTS: usize = 8;

/// A [`LeaseStore`] on etcd, compatible with etcd's own lock protocol.
///
/// A lease on key `k` is the etcd lock named `<prefix>k` (see [`EtcdOptions::with_prefix`]): the
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
/// use lease_etcd::EtcdLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// let store = EtcdLeaseStore::connect("etcd://127.0.0.1:2379").await?;
/// let req = AcquireRequest::new(LeaseKey::new("nightly-report")?, OwnerId::random(), Duration::from_secs(10));
/// if let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? {
///     println!("token {} on etcd lock {}", lease.token(), store.options().lock_name(lease.key()));
///     let _ = store.release(&lease).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdLeaseStore {
    pub(crate) client: Client,
    pub(crate) options: Arc<EtcdOptions>,
    pub(crate) endpoints: Arc<[String]>,
    pub(crate) min_ttl: Duration,
    /// Present with [`LeaseSharing::PerTtl`].
    pub(crate) shared: Option<Arc<Shared>>,
}

impl fmt::Debug for EtcdLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLeaseStore")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.options.prefix())
            .field("min_ttl", &self.min_ttl)
            .field("lease_sharing", &self.options.lease_sharing())
            .finish_non_exhaustive()
    }
}

impl EtcdLeaseStore {
    /// Connects to the etcd cluster named by `url` with the default [`EtcdOptions`]: see
    /// [`connect_with`](Self::connect_with).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
    /// let store = lease_etcd::EtcdLeaseStore::connect("etcd://10.0.0.1:2379,10.0.0.2:2379").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    ///
    /// # Cancellation safety
    /// Cancel safe: a dropped connect leaves at most a one-second etcd lease behind, which expires.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, EtcdOptions::default()).await
    }

    /// Connects to the etcd cluster named by `url` (`etcd://host:port,host:port`, or `etcds://`
    /// for TLS: the form the `lease` facade accepts) with `options`, and asks it for its minimum
    /// lease TTL (by granting and revoking a one-second lease), which becomes
    /// [`Capabilities::min_ttl`].
    ///
    /// ```no_run
    /// use lease_etcd::{EtcdLeaseStore, EtcdOptions, LeaseSharing};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
    /// let options = EtcdOptions::default().with_prefix("jobs/").with_lease_sharing(LeaseSharing::PerTtl);
    /// let store = EtcdLeaseStore::connect_with("etcd://127.0.0.1:2379", options).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] naming the problem for a malformed URL or a zero timeout;
    /// [`Error::Unavailable`] or [`Error::Timeout`] if no endpoint answers within the connect and
    /// request timeouts.
    ///
    /// # Cancellation safety
    /// Cancel safe: a dropped connect leaves at most a one-second etcd lease behind, which expires.
    pub async fn connect_with(url: &str, options: EtcdOptions) -> Result<Self> {
        let endpoints = endpoints_of(url)?;
        options.validate()?;
        let connect_options = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout())
            .with_keep_alive(Duration::from_secs(10), options.request_timeout());
        let connect = Client::connect(&endpoints, Some(connect_options));
        let client = match tokio::time::timeout(
            options.connect_timeout() + options.request_timeout(),
            connect,
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(map("connect", e, options.request_timeout())),
            Err(_) => {
                return Err(Error::unavailable(
                    BACKEND,
                    format!("no etcd endpoint of {endpoints:?} answered"),
                    None,
                ));
            }
        };
        let mut store = EtcdLeaseStore {
            client,
            options: Arc::new(options),
            endpoints: endpoints.into(),
            min_ttl: Duration::from_secs(1),
            shared: None,
        };
        store.min_ttl = store.probe_min_ttl().await?;
        if store.options.lease_sharing() == LeaseSharing::PerTtl {
            // The sweeper gets a handle without the shared state, so that it ends with the store.
            store.shared = Some(Shared::start(store.clone()));
        }
        Ok(store)
    }

    /// The options.
    pub fn options(&self) -> &EtcdOptions {
        &self.options
    }

    /// The endpoints (`http://host:port` or `https://host:port`) named by the URL.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The underlying `etcd-client` client (a cheap clone), for operations this crate does not
    /// cover.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    fn mutex_prefix(&self, key: &LeaseKey) -> String {
        protocol::mutex_prefix(self.options.prefix(), key)
    }

    /// See [`protocol::lock_key`].
    pub(crate) fn lock_key(&self, key: &LeaseKey, lease_id: i64, nonce: Option<u64>) -> String {
        protocol::lock_key(self.options.prefix(), key, lease_id, nonce)
    }

    /// The current holder's key: the key under the lock prefix with the lowest create revision
    /// (the lock protocol's rule), and how many keys there are under the prefix.
    async fn holder_kv(&self, key: &LeaseKey) -> Result<(Option<KeyValue>, i64)> {
        let opts = protocol::holder_query();
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
        lease_core::backend::validate_ttl(req.ttl, self.min_ttl)?;
        check_owner(&req.owner)?;
        let ttl_secs = lease_core::backend::ttl_secs(req.ttl)?.as_i64();
        let prefix = self.mutex_prefix(&req.key);
        for _ in 0..MAX_ATTEMPTS {
            let (current, count) = self.holder_kv(&req.key).await?;
            let previous = match current {
                None => None,
                // Our own key, alone under the prefix: replace it (a new grant, a greater token).
                Some(kv) if count == 1 && our_owner(&kv).as_ref() == Some(&req.owner) => Some(kv),
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
            let txn = protocol::acquire_txn(
                &prefix,
                previous.as_ref().map(|kv| (kv.key(), kv.create_revision())),
                &lock_key,
                &req.owner,
                lease_id,
            );
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
            let token = lease_core::backend::decode_token(BACKEND, req.key.as_str(), revision)?;
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
            let lease = lease_core::backend::granted_lease(
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
        // Every attempt's transaction failed its comparison: nothing was granted.
        Err(Error::refused(
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
        let txn = protocol::delete_txn(kv.key(), kv.create_revision(), kv.lease(), None);
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
        let opts = protocol::waiter_watch();
        let prefix = self.mutex_prefix(key);
        let mut stream = self
            .call("watch", || {
                let (mut wc, prefix, opts) =
                    (self.client.watch_client(), prefix.clone(), opts.clone());
                async move { wc.watch(prefix, Some(opts)).await }
            })
            .await?;
        // Wait until the server confirms the watch, so that no delete after this call is missed.
        let after = self.options.request_timeout();
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
