// This file stays whole past 600 lines (664 with its tests): the `LeaseStore` implementation in
// the contract's order, each operation with its txn, retries and error mapping; the protocol's
// txns are in protocol.rs, inspection in inspect.rs and the watch in watch.rs.
//! [`EtcdLeaseStore`]: leases as etcd locks, one etcd lease per grant.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use etcd_client::{Client, ConnectOptions, KeyValue, TxnOpResponse};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, ExpiryClock, HeldBy, Holder, KeyState,
    KeyWatch, Lease, LeaseKey, LeaseStore, ReleaseOutcome, RenewOutcome, Result, TokenDurability,
};

#[cfg(doc)]
use crate::config::LeaseSharing;
use crate::config::{EtcdOptions, Target, target_of};
use crate::error::{BACKEND, map, protocol};
use crate::handle::{Handle, Secret, Tag, check_owner, our_owner, parse_handle, secs};
use crate::inspect::holder_with;
use crate::protocol;
use crate::shared::{PutKind, Shared};

/// How many keepalives (or renewals of resumed leases) of one [`LeaseStore::renew_many`] batch
/// are in flight at once.
pub(crate) const BATCH_CONCURRENCY: usize = 64;

/// How often the connection sends an HTTP/2 ping (answered within
/// [`EtcdOptions::keep_alive_timeout`], or the connection is dropped).
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);

/// How often acquire re-reads the key when a transaction lost a race, before giving up with a
/// retryable error.
pub(crate) const MAX_ATTEMPTS: usize = 8;

/// A [`LeaseStore`] on etcd, compatible with etcd's own lock protocol.
///
/// A lease on key `k` is the etcd lock named `<prefix>k` (see [`EtcdOptions::with_prefix`]): the
/// holder is the key under `<prefix>k/` with the lowest create revision, exactly as for
/// `etcdctl lock` and Go's `concurrency.Mutex`, so all three exclude each other. Each grant
/// attaches its key to an etcd lease with the granted TTL (its own, or one shared per TTL: see
/// [`LeaseSharing`]; by default a key a caller names has its own and the library's reserved
/// keys share one), so etcd's clock decides expiry, and the fencing token is the key's
/// create revision (see the crate docs for why it never goes back). Every ownership change is one
/// transaction that compares create revisions.
///
/// Cloning is cheap; clones share the connection.
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
/// use leasehold_etcd::EtcdLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
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
    /// Present unless the store runs [`LeaseSharing::PerGrant`]: the shared etcd leases of the
    /// keys [`EtcdOptions::lease_sharing`] puts on one ([`EtcdLeaseStore::shared_for`]).
    pub(crate) shared: Option<Arc<Shared>>,
    /// The key of the tags this store puts in handles (see [`Secret`]).
    pub(crate) secret: Arc<Secret>,
    /// A test hook: how long (in microseconds) an acquire's transaction waits before it is sent,
    /// in a task of its own that outlives the acquire (see
    /// [`delay_acquire_puts`](EtcdLeaseStore::delay_acquire_puts)). Zero: sent at once.
    pub(crate) put_delay: Arc<AtomicU64>,
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
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = leasehold_etcd::EtcdLeaseStore::connect("etcd://10.0.0.1:2379,10.0.0.2:2379").await?;
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
    /// for TLS, with optional `user:password@` and `?tls_ca=..&tls_cert=..&tls_key=..`: the form
    /// the `lease` facade accepts) with `options` (the URL's values win), and asks it for its minimum
    /// lease TTL (by granting and revoking a one-second lease), which becomes
    /// [`Capabilities::min_ttl`].
    ///
    /// ```no_run
    /// use leasehold_etcd::{EtcdLeaseStore, EtcdOptions, LeaseSharing};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let options = EtcdOptions::default().with_prefix("jobs/").with_lease_sharing(LeaseSharing::PerTtl);
    /// let store = EtcdLeaseStore::connect_with("etcd://127.0.0.1:2379", options).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] naming the problem for a malformed URL (an unknown query parameter, TLS
    /// files on `etcd://`, ...), a zero timeout, a TLS file that is missing or holds no
    /// certificate or key, a server certificate the CA does not vouch for or that expired, and
    /// credentials etcd refuses; [`Error::Unavailable`] or [`Error::Timeout`] if no endpoint
    /// answers within the connect and request timeouts; [`Error::Backend`] if the operating
    /// system's random generator fails (the store draws the key of its handle tags from it). See
    /// the crate docs' section on URLs, TLS and authentication.
    ///
    /// # Cancellation safety
    /// Cancel safe: a dropped connect leaves at most a one-second etcd lease behind, which expires.
    pub async fn connect_with(url: &str, options: EtcdOptions) -> Result<Self> {
        let Target {
            endpoints,
            tls,
            options,
        } = target_of(url, options)?;
        options.validate()?;
        let mut connect_options = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout())
            .with_keep_alive(KEEP_ALIVE_EVERY, options.keep_alive_timeout());
        if tls {
            connect_options = connect_options.with_tls(crate::tls::tls_options(&options)?);
        }
        if let Some((user, password)) = options.credentials() {
            connect_options = connect_options
                .with_user(user, password)
                .with_auto_token_refresh(true);
        }
        let connect = Client::connect(&endpoints, Some(connect_options));
        let client = match tokio::time::timeout(
            options
                .connect_timeout()
                .saturating_add(options.request_timeout()),
            connect,
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(connect_error(e, &options)),
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
            secret: Arc::new(Secret::random()?),
            put_delay: Arc::new(AtomicU64::new(0)),
        };
        store.min_ttl = store.probe_min_ttl().await?;
        if store.options.lease_sharing().shares_any() {
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

    /// A test hook, not part of the API: from now on every acquire's transaction is sent `by`
    /// later, from a task of its own that goes on when the acquire is dropped, as a request
    /// already on its way to etcd does. Tests use it to make a put commit after the caller gave
    /// up on it. `Duration::ZERO` turns it off. Applies to this store and its clones.
    #[doc(hidden)]
    pub fn delay_acquire_puts(&self, by: Duration) {
        let micros = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.put_delay.store(micros, Ordering::Relaxed);
    }

    /// An acquire's transaction: sent at once, or (test hook) after the delay, by a task that
    /// outlives this future.
    async fn acquire_txn(&self, txn: etcd_client::Txn) -> Result<etcd_client::TxnResponse> {
        let delay = self.put_delay.load(Ordering::Relaxed);
        if delay == 0 {
            return self.txn(txn).await;
        }
        let store = self.clone();
        let sent = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(delay)).await;
            store.txn(txn).await
        });
        match sent.await {
            Ok(r) => r,
            Err(e) => Err(protocol(format!(
                "the delayed acquire transaction failed: {e}"
            ))),
        }
    }

    /// The TTL this store grants for a requested `ttl`: checked against the store's minimum
    /// ([`Capabilities::min_ttl`]) and
    /// [`MAX_TTL`](leasehold_core::MAX_TTL), in whole seconds rounded up (etcd lease TTLs). The one
    /// check of acquire, renew and their batches.
    pub(crate) fn grantable_ttl(
        &self,
        ttl: Duration,
    ) -> Result<leasehold_core::backend::RoundedTtl> {
        leasehold_core::backend::validate_ttl(ttl, self.min_ttl)
            .and_then(|()| leasehold_core::backend::ttl_secs(ttl))
    }

    pub(crate) fn mutex_prefix(&self, key: &LeaseKey) -> String {
        protocol::mutex_prefix(self.options.prefix(), key)
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
    pub(crate) async fn holder_of(&self, kv: &KeyValue) -> Result<Holder> {
        let ttl = if kv.lease() == 0 {
            None
        } else {
            let r = self.time_to_live(kv.lease()).await?;
            Some((r.ttl(), r.granted_ttl()))
        };
        holder_with(kv, ttl)
    }

    /// The shared state a grant of `key` goes through, if this store's
    /// [`LeaseSharing`] puts `key` on a shared etcd lease
    /// ([`LeaseSharing::shares_etcd_lease`]); `None`: an etcd lease of its own.
    pub(crate) fn shared_for(&self, key: &LeaseKey) -> Option<&Arc<Shared>> {
        self.shared
            .as_ref()
            .filter(|_| self.options.lease_sharing().shares_etcd_lease(key))
    }

    /// Gives back the etcd lease an acquire granted and did not use: revoked if it is one of
    /// its own (`shared` false); a shared one stays for the store's other keys.
    async fn give_back(&self, lease_id: i64, shared: bool) {
        if !shared {
            self.revoke_quietly(lease_id).await;
        }
    }

    /// The tag with which this store vouches that `lock_key` sits alone on etcd lease
    /// `lease_id`, for `owner` and `token`.
    pub(crate) fn tag(
        &self,
        lock_key: &str,
        owner: &leasehold_core::OwnerId,
        token: leasehold_core::FencingToken,
        lease_id: i64,
        ttl_secs: i64,
    ) -> Tag {
        self.secret.tag(lock_key, owner, token, lease_id, ttl_secs)
    }

    /// The etcd lease `lease` may be released by revoking alone: the one its handle names, if
    /// this store tagged the handle (it then checked that the lock key sits alone on it).
    fn revocable(&self, lease: &Lease) -> Option<i64> {
        let h = parse_handle(lease.handle())?;
        let tag = h.tag?;
        if !h.alone() {
            return None;
        }
        let lock_key = h.lock_key(self.options.prefix(), lease.key());
        self.secret
            .verify(
                tag,
                &lock_key,
                lease.owner(),
                lease.token(),
                h.lease_id,
                h.ttl_secs,
            )
            .then_some(h.lease_id)
    }

    /// Release by the lock key: one transaction deleting it if it still has the lease's token
    /// and owner, then (if it sat alone on its etcd lease) that etcd lease revoked.
    async fn release_key(&self, lease: &Lease, lock_key: &[u8]) -> Result<ReleaseOutcome> {
        let txn = protocol::release_txn(lock_key, lease.token(), lease.owner());
        let resp = self.txn(txn).await?;
        if !resp.succeeded() {
            return Ok(ReleaseOutcome::NotHeld);
        }
        let deleted = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Delete(mut d) => d.take_prev_kvs().pop(),
            _ => None,
        });
        if let Some(shared) = &self.shared {
            shared.forget(lock_key);
        }
        // Only an etcd lease that carried this key alone is revoked: a shared one (with a nonce
        // in the key's name) carries other holders' keys.
        if let Some(kv) = deleted
            && protocol::alone_on_its_lease(kv.key(), kv.lease())
        {
            self.revoke_quietly(kv.lease()).await;
        }
        Ok(ReleaseOutcome::Released)
    }

    /// The lock key of `lease` if it still exists with the lease's token and owner, and is backed
    /// by an etcd lease.
    pub(crate) async fn held_kv(&self, lease: &Lease) -> Result<Option<KeyValue>> {
        let kv = match parse_handle(lease.handle()) {
            Some(h) => {
                let mut resp = self
                    .get(h.lock_key(self.options.prefix(), lease.key()), None)
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

    /// Grants (or, for a key the store's [`LeaseSharing`] shares, reuses) the etcd lease
    /// first, then sends one transaction that creates the lock key if the lock is free and
    /// otherwise reads its holder: two requests for a grant, as the minimal etcd lease takes. A
    /// refused acquire then asks the holder's etcd lease for its remaining TTL and revokes the
    /// etcd lease it granted for itself (concurrently). The same owner re-acquiring its own key replaces it in a second
    /// transaction and revokes the old key's etcd lease.
    ///
    /// # Cancellation safety
    /// Not cancel safe: a dropped acquire may have granted the key (it then expires after its
    /// TTL, or on a shared etcd lease is deleted by the sweeper: within about 100 ms of
    /// being given up if the put has committed by then, else within about one TTL of its commit;
    /// see [`LeaseSharing::PerTtl`]).
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let ttl_secs = self.grantable_ttl(req.ttl)?.as_i64();
        check_owner(&req.owner)?;
        let prefix = self.mutex_prefix(&req.key);
        let sharing = self.shared_for(&req.key);
        let (lease_id, sent, nonce) = match sharing {
            Some(shared) => {
                let (id, sent) = shared.lease_or_grant(self, req, ttl_secs).await?;
                (id, sent, Some(shared.next_nonce()))
            }
            None => {
                let (id, sent) = self.grant_exactly(req, ttl_secs).await?;
                (id, sent, None)
            }
        };
        // Our own key, alone under the prefix, seen by the previous attempt: replace it.
        let mut previous: Option<KeyValue> = None;
        for _ in 0..MAX_ATTEMPTS {
            // With an etcd lease of its own the key takes the first slot name, or the other one
            // when it replaces our key in that slot (one transaction cannot delete and create
            // one key); on a shared etcd lease, a name of its own.
            let slot = match (nonce, &previous) {
                (Some(_), _) => None,
                (None, Some(old)) if protocol::slot_of(old.key()) == Some(0) => Some(1),
                (None, _) => Some(0),
            };
            let handle = match slot {
                Some(slot) => Handle::in_slot(lease_id, ttl_secs, slot),
                None => Handle {
                    nonce,
                    ..Handle::per_grant(lease_id, ttl_secs)
                },
            };
            let lock_key = handle.lock_key(self.options.prefix(), &req.key);
            // With a shared etcd lease, the key is recorded before the put is sent: if the
            // outcome never becomes known (an error, or this future dropped), the sweeper deletes
            // it.
            let pending = sharing.map(|shared| {
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
            let resp = match self.acquire_txn(txn).await {
                Ok(resp) => resp,
                Err(e) => {
                    // The outcome is unknown: revoking removes a grant that may have happened;
                    // with a shared etcd lease, `pending` is dropped here and the sweeper
                    // deletes the key if the put happened.
                    if sharing.is_none() {
                        self.revoke_quietly(lease_id).await;
                    }
                    return Err(e);
                }
            };
            if !resp.succeeded() {
                if let Some(pending) = pending {
                    pending.cancel();
                }
                // The holder, read by the same transaction: the key with the lowest create
                // revision under the prefix, and how many keys there are.
                let read = resp.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Get(mut g) => {
                        let count = g.count();
                        Some((g.take_kvs().into_iter().next(), count))
                    }
                    _ => None,
                });
                let Some((current, count)) = read else {
                    self.give_back(lease_id, sharing.is_some()).await;
                    return Err(protocol("acquire txn failed without its holder read"));
                };
                previous = match current {
                    // Freed since the comparison of a replacement failed: try again.
                    None => None,
                    // Our own key, alone under the prefix: replace it (a new grant, a greater
                    // token).
                    Some(kv) if count == 1 && our_owner(&kv).as_ref() == Some(&req.owner) => {
                        Some(kv)
                    }
                    // Held by someone else, or by us with `etcdctl lock` waiters queued behind
                    // (they come first: replacing our key would hand the lock to the oldest
                    // waiter). The etcd lease granted for this acquire is not needed.
                    Some(kv) => {
                        let gone = self.give_back(lease_id, sharing.is_some());
                        let (holder, ()) = futures::join!(self.holder_of(&kv), gone);
                        return Ok(AcquireOutcome::Held(holder?));
                    }
                };
                continue;
            }
            let revision = resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| protocol("txn without header"))?;
            let token = leasehold_core::backend::decode_token(BACKEND, req.key.as_str(), revision)?;
            if let Some(pending) = pending {
                pending.confirm(revision, sent + secs(ttl_secs));
            }
            if let Some(old) = previous {
                if let Some(shared) = &self.shared {
                    shared.forget(old.key());
                }
                // The replaced key's etcd lease, if it carried that key alone.
                if protocol::alone_on_its_lease(old.key(), old.lease()) {
                    self.revoke_quietly(old.lease()).await;
                }
            }
            tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, lease_id, "lease acquired");
            let mut handle = handle;
            if nonce.is_none() {
                // The etcd lease was granted for this acquire and carries this key alone.
                handle = handle.tagged(self.tag(&lock_key, &req.owner, token, lease_id, ttl_secs));
            }
            let lease = leasehold_core::backend::granted_lease(
                req.key.clone(),
                req.owner.clone(),
                token,
                secs(ttl_secs),
                req.drift_margin(),
                sent,
            )
            .with_handle(handle.to_string());
            return Ok(AcquireOutcome::Acquired(lease));
        }
        // Every attempt's transaction failed its comparison: nothing was granted.
        self.give_back(lease_id, sharing.is_some()).await;
        Err(Error::refused(
            BACKEND,
            format!(
                "{} changed hands {MAX_ATTEMPTS} times during one acquire",
                req.key
            ),
            None,
        ))
    }

    /// Each key's etcd lease comes first: for a key with an etcd lease of its own
    /// ([`LeaseSharing::PerGrant`], and the keys a caller names with the default
    /// [`LeaseSharing::ReservedPerTtl`]) a grant (at most 64 in flight); for a key the store
    /// shares ([`LeaseSharing::shares_etcd_lease`]) the store's shared etcd lease for its TTL,
    /// kept alive or granted once per batch. Then the lock keys are created by transactions of
    /// up to 128 keys ([`protocol::acquire_many_txn`]: every lock free, or nothing is created and
    /// every holder is read): 10,000 shared keys of one TTL cost about 80 transactions. A
    /// transaction that found some locks held refuses those keys (reporting their holders) and
    /// tries the free ones again in the next transaction. Keys held by their own owner alone (a
    /// same-owner re-acquire replaces the key) and keys that changed hands in every attempt are
    /// acquired by [`acquire`](LeaseStore::acquire), 64 at once. A key put on a shared etcd
    /// lease is recorded for the sweeper before its transaction is sent, as by `acquire`.
    ///
    /// # Cancellation safety
    /// Not cancel safe, as [`acquire`](LeaseStore::acquire): a dropped batch may have created
    /// keys, which expire with their etcd leases after their TTL (on a shared etcd lease, the
    /// sweeper deletes them, as for a dropped `acquire`).
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        leasehold_core::store::validate_acquire_many(reqs)?;
        self.acquire_batch(reqs).await
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
    /// shared etcd leases that is about one per TTL in use), then reads all lock keys back
    /// with range requests over the span of the batch's keys, 5,000 keys a page: 10,000 leases
    /// on one shared etcd lease cost about three requests. Leases without a handle (resumed) are
    /// renewed one by one, as by [`renew`](LeaseStore::renew).
    ///
    /// # Cancellation safety
    /// As [`renew`](LeaseStore::renew): a dropped batch may or may not have extended each lease.
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        self.renew_batch(leases).await
    }

    /// A lease whose handle this store tagged (its lock key sits alone on an etcd lease granted
    /// for it, [`LeaseSharing::PerGrant`]) is released by revoking that etcd lease: one request,
    /// which deletes the key in the same write. `NotHeld` if etcd no longer knows the etcd lease
    /// (it expired, or the lease was released or replaced before). Any other lease is released
    /// by one transaction that deletes its lock key if the key still has the lease's token and
    /// owner (found through the handle, or, for a resumed lease, by reading the lock's holder
    /// first), followed by a revoke of the key's etcd lease if the key sat alone on it.
    ///
    /// One report can be wrong, never an effect: if the lock key of a tagged lease was deleted
    /// by hand (or by a same-owner re-acquire whose revoke of the old etcd lease failed) while
    /// its etcd lease lives, the revoke finds the etcd lease without keys, deletes nothing, and
    /// the release reports `Released`. See `docs/adr/0031-etcd-lock-protocol-and-revision-tokens.md`.
    ///
    /// # Cancellation safety
    /// Not cancel safe: a dropped release may or may not have freed the key; the lease then
    /// expires on its own.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        check_owner(lease.owner())?;
        if let Some(lease_id) = self.revocable(lease) {
            let revoked = self.revoke(lease_id).await?;
            tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), revoked, "lease released by revoking its etcd lease");
            return Ok(if revoked {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            });
        }
        let lock_key = match parse_handle(lease.handle()) {
            Some(h) => h.lock_key(self.options.prefix(), lease.key()).into_bytes(),
            None => match self.holder_kv(lease.key()).await?.0 {
                Some(kv) => kv.key().to_vec(),
                None => return Ok(ReleaseOutcome::NotHeld),
            },
        };
        let out = self.release_key(lease, &lock_key).await?;
        tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), outcome = ?out, "lease released");
        Ok(out)
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

    /// Reads the holders of all `keys` with range requests over the span of their lock prefixes
    /// (5,000 keys a page, each page jumping to the next prefix still wanted, all pages at the
    /// revision of the first, so every state is of one instant), then asks each distinct etcd
    /// lease of a holder for its remaining TTL (at most 64 requests in flight). With
    /// shared etcd leases the holders of one store share few etcd leases; with one etcd
    /// lease per grant, the TTL requests are one per held key.
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        self.inspect_batch(keys).await
    }

    /// The range reads of [`inspect_many`](LeaseStore::inspect_many) without its TTL requests
    /// (one per distinct etcd lease): a lock key exists exactly while its holder holds it (its
    /// etcd lease deletes it when it ends), so who holds what needs only the ranges.
    async fn holders_many(&self, keys: &[LeaseKey]) -> Result<Vec<Option<HeldBy>>> {
        self.holders_batch(keys).await
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        self.watch_key(key).await
    }
}

/// A failed connect: the client's TLS settings refused before any I/O, or etcd refusing the
/// user's credentials, are configuration errors naming the cause; the rest as any request's.
fn connect_error(e: etcd_client::Error, options: &EtcdOptions) -> Error {
    match (&e, options.user()) {
        (etcd_client::Error::TransportError(_), _) => Error::config(
            BACKEND,
            format!("connect: the TLS settings are unusable: {e}"),
            Some(Box::new(e) as _),
        ),
        (etcd_client::Error::GRpcStatus(status), Some(user))
            if crate::error::is_auth_refusal(&e) =>
        {
            Error::config(
                BACKEND,
                format!(
                    "connect: etcd refused the credentials of user {user:?}: {}",
                    status.message()
                ),
                Some(Box::new(e) as _),
            )
        }
        _ => map("connect", e, options.request_timeout()),
    }
}
