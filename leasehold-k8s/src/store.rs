// This file stays whole past 600 lines (782, no tests of its own): the `LeaseStore` implementation in
// the contract's order, each operation with its conditional request, its retry on a conflict and
// its local observation of expiry, which read one shared record cache; the requests' bodies are in
// protocol.rs and inspection in inspect.rs.
//! [`K8sLeaseStore`]: the [`LeaseStore`] over `coordination.k8s.io/v1` Lease objects.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::{StreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use kube::api::{Api, PostParams};
use leasehold_core::backend::{RoundedTtl, granted_lease, ttl_secs, validate_ttl};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, ExpiryClock, FencingToken, Holder,
    KeyState, KeyWatch, Lease, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result,
    TokenDurability,
};
use tokio::time::Instant;

use crate::config::{self, K8sOptions, TestHook, TestPoint};
use crate::error::{BACKEND, K8sError, timed};
use crate::protocol::{self, Record};
use leasehold_core::mutation;

/// How many lost create/replace races one `acquire` absorbs before it gives up (retryable).
const MAX_RACES: usize = 16;
/// How many renewals of unknown outcome are remembered per Lease (see `adopt_pending`).
const MAX_PENDING: usize = 64;
/// How many requests one [`renew_many`](LeaseStore::renew_many) (or a small
/// [`inspect_many`](LeaseStore::inspect_many)) of a [`K8sLeaseStore`] keeps in flight at once:
/// the Kubernetes API has no batch write, so N leases cost N conditional replaces.
///
/// ```
/// assert_eq!(leasehold_k8s::RENEW_MANY_IN_FLIGHT, 64);
/// ```
pub const RENEW_MANY_IN_FLIGHT: usize = 64;
/// Above this many keys, `inspect_many` lists the namespace instead of reading key by key.
pub(crate) const LIST_THRESHOLD: usize = 16;
/// Objects per page of that LIST.
pub(crate) const LIST_PAGE: u32 = 500;

/// The last version of one Lease object this store saw, and when it first saw that version (on
/// its own monotonic clock). A candidate judges expiry from `first_seen`, never from the
/// timestamps written in the object.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    rv: u64,
    first_seen: Instant,
    object: KubeLease,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) observed: HashMap<String, Observed>,
    /// The greatest token this store has issued or seen per object name: an extra floor.
    floor: HashMap<String, FencingToken>,
    /// Renewals sent whose outcome is unknown (timeout, dropped connection), per object name.
    /// All of them since the last confirmed write count: any one may be the one applied.
    pending: HashMap<String, Vec<KubeLease>>,
    /// The last version this store wrote, per object name.
    written: HashMap<String, u64>,
}

/// A [`LeaseStore`] that keeps each key in a Kubernetes `coordination.k8s.io/v1` **Lease**
/// object, interoperable with client-go's `LeaseLock` (see the [crate docs](crate) for the rules).
///
/// Every change is a `create` (a 409 `AlreadyExists` means another candidate won) or a `replace`
/// conditioned on `metadata.resourceVersion` (a 409 `Conflict` means someone else wrote first);
/// never an unconditional patch. Expiry is judged by observation on this store's monotonic clock,
/// so keep **one store per process** and share it (it is a cheap handle: clone it or wrap it in an
/// `Arc`); its observations are what lets it take over an abandoned Lease.
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
/// use leasehold_k8s::K8sLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// // The ambient configuration (KUBECONFIG, ~/.kube/config, or the in-cluster service account).
/// let store = K8sLeaseStore::connect("k8s:").await?;
/// let req = AcquireRequest::new(LeaseKey::new("my-controller")?, OwnerId::with_label("pod-a"), Duration::from_secs(15));
/// match store.acquire(&req).await? {
///     AcquireOutcome::Acquired(lease) => println!("leading with token {}", lease.token()),
///     AcquireOutcome::Held(h) => println!("{} leads; at most {:?} left", h.owner, h.remaining),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct K8sLeaseStore {
    pub(crate) api: Api<KubeLease>,
    pub(crate) client: kube::Client,
    namespace: String,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    state: Arc<Mutex<State>>,
    hook: Option<TestHook>,
    /// API requests this store (and its clones and grouped stores) sent: see
    /// [`requests_sent`](K8sLeaseStore::requests_sent).
    requests: Arc<AtomicU64>,
    /// Labels every Lease this store creates carries (a grouped store's membership Leases carry
    /// their set's, so that one LIST reads them all); none for a store a user made.
    pub(crate) claim_labels: Option<Arc<BTreeMap<String, String>>>,
}

impl fmt::Debug for K8sLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("K8sLeaseStore")
            .field("namespace", &self.namespace)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl K8sLeaseStore {
    /// The TTL this store grants for a requested `ttl`: checked against the
    /// [capabilities](LeaseStore::capabilities)' `min_ttl` and
    /// [`MAX_TTL`](leasehold_core::MAX_TTL), in whole seconds rounded up (`leaseDurationSeconds`). The one check of acquire,
    /// renew and their batches.
    pub(crate) fn grantable_ttl(&self, ttl: Duration) -> Result<RoundedTtl> {
        validate_ttl(ttl, self.capabilities().min_ttl).and_then(|()| ttl_secs(ttl))
    }

    /// A store from a `k8s://NAMESPACE` URL (or `k8s://`, `k8s:`: the configuration's default
    /// namespace) with the ambient configuration (`$KUBECONFIG`, `~/.kube/config`, or the
    /// in-cluster service account) and default options, then the options in the URL's query
    /// ([`K8sOptions::with_url`]: `namespace`, `name_prefix`, `request_timeout`, `kubeconfig`).
    /// The URL forms are those of the `lease` facade's `StoreUrl`.
    ///
    /// Sends nothing: an apiserver that cannot be reached shows as
    /// [`Error::Unavailable`] on the first call.
    ///
    /// ```no_run
    /// use leasehold_k8s::K8sLeaseStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = K8sLeaseStore::connect("k8s://payments").await?;
    /// assert_eq!(store.namespace(), "payments");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] for a URL that is not a `k8s://` URL or names an illegal namespace, for
    /// a query parameter that is unknown or does not parse (naming it), or without a usable
    /// configuration.
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is sent to the cluster.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, K8sOptions::default()).await
    }

    /// As [`connect`](Self::connect), with `options` (a kubeconfig file instead of the ambient
    /// configuration, a name prefix, a request timeout); the URL's query parameters apply on top
    /// of them.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use leasehold_k8s::{K8sLeaseStore, K8sOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let options = K8sOptions::default().with_request_timeout(Duration::from_secs(5));
    /// let store = K8sLeaseStore::connect_with("k8s:", options).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`Error::Config`] also for illegal options, a kubeconfig
    /// file that is missing or unusable, or a URL naming another namespace than
    /// [`K8sOptions::with_namespace`].
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is sent to the cluster.
    pub async fn connect_with(url: &str, options: K8sOptions) -> Result<Self> {
        let (url, mut options) = options.with_url(url)?;
        let url = url.as_str();
        if let Some(ns) = config::parse_url(url)? {
            match &options.namespace {
                Some(other) if *other != ns => {
                    return Err(Error::config(
                        BACKEND,
                        format!("{url:?} names namespace {ns:?}, the options {other:?}"),
                        None,
                    ));
                }
                _ => options.namespace = Some(ns),
            }
        }
        let client = options.client().await?;
        Self::from_client(client, options)
    }

    /// A store over an existing `client`, in the options' namespace (else the client's default
    /// namespace). Sends nothing.
    ///
    /// ```no_run
    /// use leasehold_k8s::{K8sLeaseStore, K8sOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let client = leasehold_k8s::infer_client().await?;
    /// let store = K8sLeaseStore::from_client(client, K8sOptions::default().with_namespace("payments"))?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] for a namespace that is not a DNS-1123 label, a prefix that cannot
    /// start an object name, or a zero request timeout.
    pub fn from_client(client: kube::Client, options: K8sOptions) -> Result<Self> {
        let namespace = options
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        options.validate(&namespace)?;
        Ok(K8sLeaseStore {
            api: Api::namespaced(client.clone(), &namespace),
            client,
            namespace,
            prefix: options.prefix,
            timeout: options.timeout,
            state: Arc::default(),
            hook: options.hook,
            requests: Arc::default(),
            claim_labels: None,
        })
    }

    /// The namespace of the Lease objects.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The name of the Lease object that stores `key`.
    ///
    /// ```no_run
    /// # async fn f(store: leasehold_k8s::K8sLeaseStore) -> leasehold_core::Result<()> {
    /// assert!(store.object_name(&leasehold_core::LeaseKey::new("a.b")?).ends_with("a.b"));
    /// # Ok(()) }
    /// ```
    pub fn object_name(&self, key: &LeaseKey) -> String {
        format!("{}{}", self.prefix, key)
    }

    pub(crate) fn api(&self) -> &Api<KubeLease> {
        &self.api
    }

    /// The timeout of each API request ([`K8sOptions::with_request_timeout`]).
    pub fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// How many API requests this store has sent since it was built: every GET, LIST, create
    /// and replace of its [`LeaseStore`] operations, counted when sent (whatever their outcome),
    /// shared by its clones and by the [`K8sGroupedStore`](crate::K8sGroupedStore)s made from
    /// it. Watches ([`LeaseStore::watch`]) and the [fenced resource](Self::fenced_resource) are
    /// not counted. For measuring what a workload costs the apiserver.
    ///
    /// ```no_run
    /// use leasehold_core::{LeaseKey, LeaseStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = leasehold_k8s::K8sLeaseStore::connect("k8s://payments").await?;
    /// let before = store.requests_sent();
    /// store.inspect(&LeaseKey::new("ledger")?).await?;
    /// assert_eq!(store.requests_sent() - before, 1); // one GET
    /// # Ok(()) }
    /// ```
    pub fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// [`timed`](crate::error::timed) with this store's request timeout, counting the request.
    pub(crate) async fn timed<T>(
        &self,
        operation: &'static str,
        fut: impl std::future::Future<Output = std::result::Result<T, kube::Error>>,
    ) -> std::result::Result<T, K8sError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        timed(operation, self.timeout, fut).await
    }

    /// Awaits the test hook at `point`, if one is installed.
    async fn pause(&self, point: TestPoint, name: &str) {
        if let Some(hook) = &self.hook {
            hook(point, name).await;
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an observation of `obj`; returns when this store first saw this version.
    pub(crate) fn observe(&self, name: &str, obj: &KubeLease, rec: &Record) -> Instant {
        let now = Instant::now();
        let mut st = self.lock();
        if let Some(t) = rec.token {
            let f = st.floor.entry(name.to_string()).or_insert(t);
            *f = (*f).max(t);
        }
        match st.observed.get(name) {
            Some(o) if o.rv == rec.rv => o.first_seen,
            // A read that raced with a newer one: do not regress, count it as seen just now.
            Some(o) if o.rv > rec.rv => now,
            _ => {
                st.observed.insert(
                    name.to_string(),
                    Observed {
                        rv: rec.rv,
                        first_seen: now,
                        object: obj.clone(),
                    },
                );
                now
            }
        }
    }

    /// Records an object this store just wrote.
    fn wrote(&self, name: &str, obj: &KubeLease) -> Result<Record> {
        let rec = Record::parse(obj)?;
        self.observe(name, obj, &rec);
        let mut st = self.lock();
        st.written.insert(name.to_string(), rec.rv);
        st.pending.remove(name);
        Ok(rec)
    }

    /// Remembers a renewal about to be sent, whose outcome stays unknown until a later write of
    /// ours is confirmed or the object is read again (`adopt_pending`).
    fn remember_pending(&self, name: &str, sent: &KubeLease) {
        let mut st = self.lock();
        let pending = st.pending.entry(name.to_string()).or_default();
        if pending.len() < MAX_PENDING {
            pending.push(sent.clone());
        }
    }

    /// Forgets a renewal that was certainly not applied (the server refused it).
    fn forget_pending(&self, name: &str, sent: &KubeLease) {
        if let Some(pending) = self.lock().pending.get_mut(name) {
            pending.retain(|p| p != sent);
        }
    }

    fn floor(&self, name: &str) -> Option<FencingToken> {
        self.lock().floor.get(name).copied()
    }

    /// Reads the object and records the observation.
    pub(crate) async fn read(&self, name: &str) -> Result<Option<(KubeLease, Record, Instant)>> {
        match self
            .timed("get", self.api.get_opt(name))
            .await
            .map_err(|e| e.into_error("get"))?
        {
            Some(obj) => {
                let rec = Record::parse(&obj)?;
                let first_seen = self.observe(name, &obj, &rec);
                Ok(Some((obj, rec, first_seen)))
            }
            None => {
                self.lock().observed.remove(name);
                Ok(None)
            }
        }
    }

    /// The object as of the last write of this lease's grant by this store, or `None` if anyone
    /// else wrote since (or it is gone): the version must be the lease's handle or the last
    /// version this store wrote. Without a handle (a resumed lease): the current object.
    async fn base_for(
        &self,
        name: &str,
        lease: &Lease,
    ) -> Result<Option<(KubeLease, Record, Instant)>> {
        let Some(handle) = lease.handle().and_then(|h| h.parse::<u64>().ok()) else {
            return self.read(name).await;
        };
        let (latest, own) = {
            let st = self.lock();
            (
                st.observed.get(name).cloned(),
                st.written.get(name).copied(),
            )
        };
        let ours = |rv: u64| rv == handle || Some(rv) == own;
        if let Some(o) = latest.filter(|o| ours(o.rv)) {
            let rec = Record::parse(&o.object)?;
            return Ok(Some((o.object, rec, o.first_seen)));
        }
        Ok(self.read(name).await?.filter(|(_, rec, _)| ours(rec.rv)))
    }

    /// The current object, if it is exactly one of the renewals this store sent without learning
    /// the outcome (same spec, annotations and labels: the renewTime makes each unique).
    async fn adopt_pending(&self, name: &str) -> Result<Option<(KubeLease, Record, Instant)>> {
        let Some(sent) = self.lock().pending.get(name).cloned() else {
            return Ok(None);
        };
        let current = self.read(name).await?;
        let adopted = current.filter(|(obj, _, _)| {
            sent.iter().any(|s| {
                obj.spec == s.spec
                    && obj.metadata.annotations == s.metadata.annotations
                    && obj.metadata.labels == s.metadata.labels
            })
        });
        // Known either way now: ours (adopted: the last version we wrote) or someone else's.
        let mut st = self.lock();
        st.pending.remove(name);
        if let Some((_, rec, _)) = &adopted {
            st.written.insert(name.to_string(), rec.rv);
        }
        Ok(adopted)
    }

    /// The token of a new grant (ADR 0040): `at_least` (the version of the create that decided
    /// the grant, or one above the version a granting replace is conditioned on), floored above
    /// every token this store knows for the name (a defence only: under etcd semantics the floor
    /// never exceeds `at_least`).
    fn next_token(
        &self,
        name: &str,
        at_least: u64,
        recorded: Option<FencingToken>,
    ) -> Result<FencingToken> {
        // Mutation switch points (false unless a mutant is active).
        if mutation::on("k8s.token.reuse_old")
            && let Some(old) = recorded
        {
            return Ok(old);
        }
        let floors = if mutation::on("k8s.token.skip_floor") {
            [None, None]
        } else {
            [recorded, self.floor(name)]
        };
        let mut t = at_least;
        for known in floors.into_iter().flatten() {
            t = t.max(known.get().saturating_add(1));
        }
        FencingToken::new(t)
    }

    fn granted(
        &self,
        req: &AcquireRequest,
        name: &str,
        obj: &KubeLease,
        token: FencingToken,
        ttl: Duration,
        sent: Instant,
    ) -> Result<Lease> {
        let rec = self.wrote(name, obj)?;
        tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, resource_version = rec.rv, "lease acquired");
        Ok(granted_lease(
            req.key.clone(),
            req.owner.clone(),
            token,
            ttl,
            req.drift_margin(),
            sent,
        )
        .with_handle(rec.rv.to_string()))
    }

    /// The state of `key` from a read of its object (`None`: absent).
    pub(crate) fn state_of(
        &self,
        key: &LeaseKey,
        name: &str,
        read: Option<(KubeLease, Record, Instant)>,
    ) -> Result<KeyState> {
        let Some((_, rec, first_seen)) = read else {
            return Ok(KeyState {
                key: key.clone(),
                holder: None,
                last_token: self.floor(name),
            });
        };
        let now = Instant::now();
        let holder = match rec.holder.as_deref() {
            Some(h) if !expired(&rec, first_seen, now) => Some(Holder {
                owner: owner_of(h)?,
                token: rec.holder_token()?,
                remaining: (first_seen + rec.duration).saturating_duration_since(now),
                ttl: rec.duration,
            }),
            _ => None,
        };
        let last_token = [rec.token, self.floor(name)].into_iter().flatten().max();
        Ok(KeyState {
            key: key.clone(),
            holder,
            last_token,
        })
    }
}

pub(crate) fn expired(rec: &Record, first_seen: Instant, now: Instant) -> bool {
    // Mutation switch points (false unless a mutant is active).
    if mutation::on("k8s.expiry.never") {
        return false;
    }
    if mutation::on("k8s.expiry.flipped") {
        return now < first_seen + rec.duration;
    }
    now >= first_seen + rec.duration
}

/// An [`OwnerId`] for a `holderIdentity` written by someone else (made legal if needed).
pub(crate) fn owner_of(holder: &str) -> Result<OwnerId> {
    OwnerId::new(holder).or_else(|_| {
        let clean: String = holder
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '_' })
            .take(leasehold_core::MAX_OWNER_LEN)
            .collect();
        OwnerId::new(clean)
    })
}

#[async_trait]
impl LeaseStore for K8sLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TokenDurability::Durable, ExpiryClock::ObservedLocally)
            .with_watch(true)
            .with_min_ttl(Duration::from_secs(1))
            .with_ttl_granularity(Duration::from_secs(1))
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let rounded = self.grantable_ttl(req.ttl)?;
        let (secs, ttl) = (rounded.as_i32(), rounded.granted());
        let name = self.object_name(&req.key);
        for _ in 0..MAX_RACES {
            match self.read(&name).await? {
                None => {
                    // The create decides the holder, but its version (the token) is assigned by
                    // the write itself: create a claim without a token, then write the token
                    // into it with a replace conditioned on the created version, and report the
                    // grant only after that (ADR 0040). Until then, readers report the claim's
                    // term as its resourceVersion, which is that same token.
                    let mut obj = protocol::new_claim(&name, &req.owner, secs);
                    if let Some(labels) = &self.claim_labels {
                        obj.metadata.labels = Some(labels.as_ref().clone());
                    }
                    self.pause(TestPoint::BeforeCreate, &name).await;
                    let sent = Instant::now();
                    let created = match self
                        .timed("create", self.api.create(&PostParams::default(), &obj))
                        .await
                    {
                        Ok(created) => created,
                        Err(K8sError::AlreadyExists) => continue,
                        Err(K8sError::NotFound(message)) => {
                            return Err(Error::config(
                                BACKEND,
                                format!(
                                    "cannot create Lease {name:?} in namespace {:?}: {message}",
                                    self.namespace
                                ),
                                None,
                            ));
                        }
                        Err(e) => return Err(e.into_error("create")),
                    };
                    let rec = Record::parse(&created)?;
                    self.observe(&name, &created, &rec);
                    let token = self.next_token(&name, rec.rv, None)?;
                    let next = protocol::with_token(&created, &req.owner, token);
                    match self
                        .timed(
                            "replace",
                            self.api.replace(&name, &PostParams::default(), &next),
                        )
                        .await
                    {
                        Ok(obj) => {
                            return Ok(AcquireOutcome::Acquired(
                                self.granted(req, &name, &obj, token, ttl, sent)?,
                            ));
                        }
                        // Someone wrote or deleted the claim first: no grant; look again.
                        Err(K8sError::Conflict | K8sError::NotFound(_)) => continue,
                        Err(e) => return Err(e.into_error("replace")),
                    }
                }
                Some((obj, rec, first_seen)) => {
                    let now = Instant::now();
                    if let Some(holder) = rec.holder.as_deref()
                        && holder != req.owner.as_str()
                        && !expired(&rec, first_seen, now)
                        && !mutation::on("k8s.acquire.ignore_live_holder")
                    {
                        return Ok(AcquireOutcome::Held(Holder {
                            owner: owner_of(holder)?,
                            token: rec.holder_token()?,
                            remaining: (first_seen + rec.duration).saturating_duration_since(now),
                            ttl: rec.duration,
                        }));
                    }
                    // The replace writes a version above `rec.rv`: the token is the first
                    // revision of that interval, never the version replaced (which a client-go
                    // holder reports as its term).
                    let at_least = rec.rv.checked_add(1).ok_or_else(|| {
                        Error::store_fault(
                            BACKEND,
                            format!("resourceVersion {} overflows", rec.rv),
                            None,
                        )
                    })?;
                    let token = self.next_token(&name, at_least, rec.token)?;
                    let next = protocol::regrant(&obj, &req.owner, token, secs);
                    let sent = Instant::now();
                    match self
                        .timed(
                            "replace",
                            self.api.replace(&name, &PostParams::default(), &next),
                        )
                        .await
                    {
                        Ok(obj) => {
                            return Ok(AcquireOutcome::Acquired(
                                self.granted(req, &name, &obj, token, ttl, sent)?,
                            ));
                        }
                        Err(K8sError::Conflict | K8sError::NotFound(_)) => continue,
                        Err(e) => return Err(e.into_error("replace")),
                    }
                }
            }
        }
        // Every write lost its race (a 409): none was applied.
        Err(Error::refused(
            BACKEND,
            format!("lost {MAX_RACES} consecutive write races on Lease {name:?}"),
            None,
        ))
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        let rounded = self.grantable_ttl(lease.ttl())?;
        let secs = rounded.as_i32();
        let name = self.object_name(lease.key());
        let mut current = match self.base_for(&name, lease).await? {
            Some(c) => Some(c),
            None => self.adopt_pending(&name).await?,
        };
        for _ in 0..2 {
            let Some((base, rec, first_seen)) = current.take() else {
                break;
            };
            if (!rec.is_held_by(lease.owner(), lease.token())
                && !mutation::on("k8s.renew.no_holder_check"))
                || expired(&rec, first_seen, Instant::now())
            {
                return Ok(RenewOutcome::Lost);
            }
            let next = protocol::renewal(&base, secs);
            // Remembered before it is sent: if the answer is lost (a timeout, a dropped
            // connection, or the caller dropping this future, as the supervisor does when its
            // bound passes first), the write may have been applied, and the next renewal must
            // recognise it as ours. A confirmed write forgets it.
            self.remember_pending(&name, &next);
            let sent = Instant::now();
            match self
                .timed(
                    "replace",
                    self.api.replace(&name, &PostParams::default(), &next),
                )
                .await
            {
                Ok(obj) => {
                    let rec = self.wrote(&name, &obj)?;
                    tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
                    return Ok(RenewOutcome::Renewed(
                        lease
                            .renewed(rounded.granted(), sent)
                            .with_handle(rec.rv.to_string()),
                    ));
                }
                // Someone else wrote, unless the write we find is our own earlier renewal whose
                // answer was lost: then it is exactly what we sent, and we renew on top of it.
                Err(K8sError::Conflict) => {
                    self.forget_pending(&name, &next);
                    current = self.adopt_pending(&name).await?;
                }
                Err(K8sError::NotFound(_)) => break,
                Err(e) => {
                    let e = e.into_error("replace");
                    if !e.outcome_unknown() {
                        self.forget_pending(&name, &next);
                    }
                    return Err(e);
                }
            }
        }
        tracing::info!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "renewal lost: someone else wrote or deleted the Lease");
        Ok(RenewOutcome::Lost)
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let name = self.object_name(lease.key());
        for attempt in 0..2 {
            let current = if attempt == 0 {
                self.base_for(&name, lease).await?
            } else {
                None
            };
            let current = match current {
                Some(c) => Some(c),
                None => self.read(&name).await?,
            };
            let Some((obj, rec, first_seen)) = current else {
                return Ok(ReleaseOutcome::NotHeld);
            };
            if (!rec.is_held_by(lease.owner(), lease.token())
                && !mutation::on("k8s.release.no_holder_check"))
                || expired(&rec, first_seen, Instant::now())
            {
                return Ok(ReleaseOutcome::NotHeld);
            }
            match self
                .timed(
                    "replace",
                    self.api
                        .replace(&name, &PostParams::default(), &protocol::released(&obj)),
                )
                .await
            {
                Ok(obj) => {
                    self.wrote(&name, &obj)?;
                    tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease released");
                    return Ok(ReleaseOutcome::Released);
                }
                Err(K8sError::Conflict) => continue,
                Err(K8sError::NotFound(_)) => return Ok(ReleaseOutcome::NotHeld),
                Err(e) => return Err(e.into_error("replace")),
            }
        }
        Ok(ReleaseOutcome::NotHeld)
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        let name = self.object_name(key);
        let read = self.read(&name).await?;
        self.state_of(key, &name, read)
    }

    /// Kubernetes has no batch write: the renewals go out concurrently, at most 64
    /// in flight (kube-client speaks HTTP/1.1, so each in-flight request
    /// holds one pooled connection), each exactly the conditional replace of
    /// [`renew`](LeaseStore::renew). A renewal that fails reports its error in its own slot.
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        // Collected first: a lazy `map` closure in the stream trips async-trait's Send check.
        let calls: Vec<_> = leases.iter().map(|l| self.renew(l)).collect();
        Ok(stream::iter(calls)
            .buffered(RENEW_MANY_IN_FLIGHT)
            .collect()
            .await)
    }

    /// Up to 16 keys: one GET each, concurrently. More: one paged LIST of the
    /// namespace (a consistent read, 500 objects a page), matched by object name, so
    /// 10,000 keys cost some twenty requests instead of 10,000. Every object read counts as an
    /// observation, exactly as a GET would.
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        self.inspect_batch(keys).await
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        crate::watch::start(self, &self.object_name(key))
            .await
            .map(Some)
    }
}
