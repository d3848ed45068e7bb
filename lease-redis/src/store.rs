//! [`RedisLeaseStore`]: connection, configuration and the [`LeaseStore`] implementation.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, ExpiryClock, FencingToken, Holder,
    KeyState, KeyWatch, Lease, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result,
    TokenDurability, validate_ttl,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

use crate::BACKEND;
use crate::error::{RedisStoreError, map_redis};
use crate::layout::{DEFAULT_PREFIX, KeyLayout};
use crate::scripts;

/// The shortest TTL granted: 1 ms (`PEXPIRE` resolution).
pub const MIN_TTL: Duration = Duration::from_millis(1);

/// Wait for replicas after each grant (`WAIT numreplicas timeout`); see
/// [`RedisStoreBuilder::wait_for_replicas`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    /// How many replicas must acknowledge the grant.
    pub replicas: u32,
    /// How long to wait for them.
    pub timeout: Duration,
}

/// Configures and connects a [`RedisLeaseStore`].
///
/// ```no_run
/// use std::time::Duration;
/// use lease_redis::RedisLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// let store = RedisLeaseStore::builder("redis://127.0.0.1:6379")
///     .prefix("jobs")
///     .response_timeout(Duration::from_secs(2))
///     .wait_for_replicas(1, Duration::from_millis(200))
///     .connect()
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    source: Source,
    prefix: String,
    response_timeout: Duration,
    connect_timeout: Duration,
    connect_retries: usize,
    replica_wait: Option<ReplicaWait>,
    poll_interval: Duration,
}

#[derive(Debug, Clone)]
enum Source {
    Url(String),
    Client(redis::Client),
}

impl RedisStoreBuilder {
    fn new(source: Source) -> Self {
        RedisStoreBuilder {
            source,
            prefix: DEFAULT_PREFIX.to_string(),
            response_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            connect_retries: 2,
            replica_wait: None,
            poll_interval: Duration::from_millis(250),
        }
    }

    /// The key prefix (default `lease`); see [`KeyLayout`] for the names built from it.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a command may take before it fails with [`Error::Timeout`] (default 5 s). Must
    /// not be zero.
    ///
    /// Together with the connect timeout it also sets the **operation deadline**, the longest any
    /// operation of the store waits, reconnecting included: connect timeout + 2 × response
    /// timeout (one reconnection attempt, then at most two round trips: a script's `EVALSHA` and,
    /// on a server that lost its script cache, `EVAL`). See [`RedisLeaseStore::op_deadline`].
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take (default 5 s). Must not be zero.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How often the connection manager retries a failed (re)connection before an operation
    /// fails with [`Error::Unavailable`] (default 2). Retries happen within the
    /// [operation deadline](RedisLeaseStore::op_deadline): an operation waiting for a
    /// reconnection fails with [`Error::Timeout`] when the deadline passes, however many retries
    /// are left (the reconnection goes on in the background).
    pub fn connect_retries(mut self, retries: usize) -> Self {
        self.connect_retries = retries;
        self
    }

    /// After each grant, run `WAIT replicas timeout` (pipelined right after the acquire script on
    /// the same connection, since `WAIT` counts only that connection's writes) and fail the
    /// acquire with
    /// [`Error::Unavailable`] (after releasing the grant, best effort) unless at least `replicas`
    /// replicas acknowledged it.
    ///
    /// **What it promises:** a successful acquire was received by that many replicas, which
    /// narrows the window in which a failover to a replica loses the grant. **What it does not:**
    /// `WAIT` is not consensus. A replica that acknowledged may still not be the one promoted, the
    /// grant is already visible on the primary while waiting, renewals and releases are not waited
    /// for, and `WAIT` blocks this store's multiplexed connection for up to `timeout`. Safety
    /// still comes from the fencing token (see the crate docs). `timeout` must be shorter than the
    /// response timeout.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_wait = Some(ReplicaWait { replicas, timeout });
        self
    }

    /// How often a [`watch`](LeaseStore::watch) signals "look again" when the server does not
    /// publish keyspace notifications for expiry (default 250 ms). Releases wake a watcher at once
    /// regardless, through the release channel.
    pub fn watch_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Validates the configuration and connects.
    ///
    /// # Errors
    /// [`Error::Config`] for an unparsable URL, an illegal prefix, a zero response or connect
    /// timeout, or a `WAIT` timeout not below the response timeout; [`Error::Unavailable`] if the
    /// server cannot be reached (refused, unreachable), [`Error::Timeout`] if it does not answer
    /// within the [operation deadline](RedisLeaseStore::op_deadline).
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is held until the store is returned.
    pub async fn connect(self) -> Result<RedisLeaseStore> {
        let layout = KeyLayout::new(self.prefix.clone())?;
        for (name, value) in [
            ("response timeout", self.response_timeout),
            ("connect timeout", self.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::config(
                    BACKEND,
                    format!("the {name} must not be zero"),
                    None,
                ));
            }
        }
        let op_deadline = self
            .connect_timeout
            .saturating_add(self.response_timeout.saturating_mul(2));
        if let Some(w) = self.replica_wait
            && w.timeout >= self.response_timeout
        {
            return Err(Error::config(
                BACKEND,
                format!(
                    "WAIT timeout {:?} must be below the response timeout {:?}",
                    w.timeout, self.response_timeout
                ),
                None,
            ));
        }
        let client = match &self.source {
            Source::Client(c) => c.clone(),
            Source::Url(url) => redis::Client::open(url.as_str()).map_err(|e| {
                Error::config(
                    BACKEND,
                    format!("unusable Redis URL {url:?}: {e}"),
                    Some(Box::new(e) as lease_core::BoxError),
                )
            })?,
        };
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connect_timeout))
            .set_number_of_retries(self.connect_retries)
            .set_max_delay(Duration::from_millis(500));
        let con = bounded(
            "connect",
            op_deadline,
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await?
        .map_err(|e| map_redis("connect", self.connect_timeout, e))?;
        let db = client.get_connection_info().redis_settings().db();
        Ok(RedisLeaseStore {
            inner: Arc::new(Inner {
                client,
                con,
                layout,
                db,
                response_timeout: self.response_timeout,
                connect_timeout: self.connect_timeout,
                op_deadline,
                replica_wait: self.replica_wait,
                poll_interval: self.poll_interval,
            }),
        })
    }
}

/// A [`LeaseStore`] (and [`FencedResource`](lease_core::FencedResource)) on Redis.
///
/// A cheap-to-clone handle over one multiplexed, automatically reconnecting connection
/// ([`ConnectionManager`]). Acquire, renew and release are each one Lua script; expiry is the
/// server's `PEXPIRE`. See the [crate docs](crate) for what Redis can and cannot promise.
///
/// ```no_run
/// use std::time::Duration;
/// use lease_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
/// use lease_redis::RedisLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// let store = RedisLeaseStore::connect("redis://127.0.0.1:6379").await?;
/// let req = AcquireRequest::new(LeaseKey::new("nightly")?, OwnerId::random(), Duration::from_secs(10));
/// if let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? {
///     println!("holding with token {}", lease.token());
///     let _ = store.release(&lease).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLeaseStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: redis::Client,
    pub(crate) con: ConnectionManager,
    pub(crate) layout: KeyLayout,
    pub(crate) db: i64,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_deadline: Duration,
    replica_wait: Option<ReplicaWait>,
    pub(crate) poll_interval: Duration,
}

impl fmt::Debug for RedisLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLeaseStore")
            .field(
                "server",
                &self.inner.client.get_connection_info().addr().to_string(),
            )
            .field("db", &self.inner.db)
            .field("prefix", &self.inner.layout.prefix())
            .field("replica_wait", &self.inner.replica_wait)
            .finish_non_exhaustive()
    }
}

impl RedisLeaseStore {
    /// A builder for a store at `url` (`redis://host:port/db`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Source::Url(url.into()))
    }

    /// A builder for a store using an existing client (for custom TLS or credentials).
    pub fn builder_from_client(client: redis::Client) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Source::Client(client))
    }

    /// Connects to `url` with the default configuration.
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::connect`].
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is held until the store is returned.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// The key layout in use.
    pub fn layout(&self) -> &KeyLayout {
        &self.inner.layout
    }

    /// A clone of the underlying connection (for administration and tests).
    pub fn connection(&self) -> ConnectionManager {
        self.inner.con.clone()
    }

    /// The longest any operation of this store waits before it fails with [`Error::Timeout`]:
    /// connect timeout + 2 × response timeout. It bounds every call of the
    /// [`LeaseStore`] and [`FencedResource`](lease_core::FencedResource) implementations,
    /// [`watch`](LeaseStore::watch) included, whatever the connection manager's retries, and an
    /// open watch checks its connection within it (see [`watch`](LeaseStore::watch)).
    pub fn op_deadline(&self) -> Duration {
        self.inner.op_deadline
    }

    /// Runs one store operation under the [operation deadline](Self::op_deadline).
    pub(crate) async fn bounded<T>(
        &self,
        operation: &'static str,
        op: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        bounded(operation, self.inner.op_deadline, op).await?
    }

    pub(crate) fn map(
        &self,
        operation: &'static str,
    ) -> impl FnOnce(redis::RedisError) -> Error + '_ {
        move |e| map_redis(operation, self.inner.response_timeout, e)
    }
}

/// `op` unless `deadline` passes first, then [`Error::Timeout`] (retryable, outcome unknown).
pub(crate) async fn bounded<F: Future>(
    operation: &'static str,
    deadline: Duration,
    op: F,
) -> Result<F::Output> {
    tokio::time::timeout(deadline, op)
        .await
        .map_err(|_| Error::Timeout {
            backend: BACKEND,
            operation,
            after: deadline,
        })
}

fn ttl_millis(ttl: Duration) -> Result<(u64, Duration)> {
    let ms = u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).map_err(|_| Error::InvalidTtl {
        ttl,
        reason: "does not fit in milliseconds".into(),
    })?;
    Ok((ms, Duration::from_millis(ms)))
}

fn unexpected(script: &'static str, reply: &impl fmt::Debug) -> Error {
    RedisStoreError::UnexpectedReply {
        script,
        reply: format!("{reply:?}"),
    }
    .into_backend()
}

fn parse_holder(
    script: &'static str,
    owner: &str,
    token: &str,
    pttl: &str,
    ttl: &str,
) -> Result<Holder> {
    let bad = |_| unexpected(script, &(owner, token, pttl, ttl));
    let owner = OwnerId::new(owner).map_err(|_| unexpected(script, &owner))?;
    let token: FencingToken = token.parse().map_err(bad)?;
    let pttl: i64 = pttl.parse().map_err(|_| unexpected(script, &pttl))?;
    let ttl: u64 = ttl.parse().map_err(|_| unexpected(script, &ttl))?;
    let remaining = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
    Ok(Holder {
        owner,
        token,
        remaining,
        ttl: Duration::from_millis(ttl),
    })
}

#[async_trait]
impl LeaseStore for RedisLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TokenDurability::ClockFloored, ExpiryClock::Server)
            .with_watch(true)
            .with_min_ttl(MIN_TTL)
            .with_ttl_granularity(Duration::from_millis(1))
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.bounded("acquire", self.acquire_unbounded(req)).await
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        self.bounded("renew", self.renew_unbounded(lease)).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        self.bounded("renew_many", self.renew_many_unbounded(leases))
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.bounded("release", self.release_unbounded(lease)).await
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.bounded("inspect", self.inspect_unbounded(key)).await
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        crate::watch::watch(self, key).await.map(Some)
    }
}

/// The operations themselves; the [`LeaseStore`] methods run them under the operation deadline.
impl RedisLeaseStore {
    async fn acquire_unbounded(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        validate_ttl(req.ttl, MIN_TTL)?;
        let (ms, granted_ttl) = ttl_millis(req.ttl)?;
        let layout = &self.inner.layout;
        let mut con = self.inner.con.clone();
        let sent = Instant::now();
        let (reply, acked): (Vec<String>, Option<i64>) = match self.inner.replica_wait {
            None => {
                let reply = scripts::ACQUIRE
                    .key(layout.lease(&req.key))
                    .key(layout.generation(&req.key))
                    .arg(req.owner.as_str())
                    .arg(ms)
                    .invoke_async(&mut con)
                    .await
                    .map_err(self.map("acquire"))?;
                (reply, None)
            }
            // One pipeline, so that `WAIT` runs on the connection that made the grant, right
            // after it (on a connection without writes `WAIT` would succeed vacuously).
            Some(wait) => {
                let (reply, acked): (Vec<String>, i64) = redis::pipe()
                    .cmd("EVAL")
                    .arg(scripts::ACQUIRE_LUA)
                    .arg(2)
                    .arg(layout.lease(&req.key))
                    .arg(layout.generation(&req.key))
                    .arg(req.owner.as_str())
                    .arg(ms)
                    .cmd("WAIT")
                    .arg(wait.replicas)
                    .arg(
                        u64::try_from(wait.timeout.as_millis())
                            .unwrap_or(u64::MAX)
                            .max(1),
                    )
                    .query_async(&mut con)
                    .await
                    .map_err(self.map("acquire"))?;
                (reply, Some(acked))
            }
        };
        match reply.as_slice() {
            [tag, owner, token, pttl, ttl] if tag == "held" => {
                let holder = parse_holder("acquire", owner, token, pttl, ttl)?;
                tracing::trace!(backend = BACKEND, key = %req.key, owner = %req.owner, holder = %holder.owner, token = %holder.token, "lease held by another owner");
                Ok(AcquireOutcome::Held(holder))
            }
            [tag, token] if tag == "granted" => {
                let token: FencingToken =
                    token.parse().map_err(|_| unexpected("acquire", &reply))?;
                tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, "lease acquired");
                let lease = Lease::granted(
                    req.key.clone(),
                    req.owner.clone(),
                    token,
                    granted_ttl,
                    req.drift_margin(),
                    sent,
                );
                if let (Some(wait), Some(acked)) = (self.inner.replica_wait, acked) {
                    self.check_replicas(&lease, wait, acked).await?;
                }
                Ok(AcquireOutcome::Acquired(lease))
            }
            _ => Err(unexpected("acquire", &reply)),
        }
    }

    async fn renew_unbounded(&self, lease: &Lease) -> Result<RenewOutcome> {
        validate_ttl(lease.ttl(), MIN_TTL)?;
        let (ms, granted_ttl) = ttl_millis(lease.ttl())?;
        let mut con = self.inner.con.clone();
        let sent = Instant::now();
        let renewed: i64 = scripts::RENEW
            .key(self.inner.layout.lease(lease.key()))
            .arg(lease.owner().as_str())
            .arg(lease.token().get())
            .arg(ms)
            .invoke_async(&mut con)
            .await
            .map_err(self.map("renew"))?;
        if renewed == 1 {
            tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
            Ok(RenewOutcome::Renewed(lease.renewed(granted_ttl, sent)))
        } else {
            tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease lost");
            Ok(RenewOutcome::Lost)
        }
    }

    async fn renew_many_unbounded(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        // Invalid TTLs are reported in their slot and not sent; the rest go in one script.
        let mut out: Vec<Result<RenewOutcome>> = Vec::with_capacity(leases.len());
        let mut sendable: Vec<(usize, Duration)> = Vec::with_capacity(leases.len());
        let mut invocation = scripts::RENEW_MANY.prepare_invoke();
        for (i, lease) in leases.iter().enumerate() {
            match validate_ttl(lease.ttl(), MIN_TTL).and_then(|()| ttl_millis(lease.ttl())) {
                Ok((ms, granted_ttl)) => {
                    invocation
                        .key(self.inner.layout.lease(lease.key()))
                        .arg(lease.owner().as_str())
                        .arg(lease.token().get())
                        .arg(ms);
                    sendable.push((i, granted_ttl));
                    out.push(Ok(RenewOutcome::Lost)); // overwritten below
                }
                Err(e) => out.push(Err(e)),
            }
        }
        if sendable.is_empty() {
            return Ok(out);
        }
        let mut con = self.inner.con.clone();
        let sent = Instant::now();
        let renewed: Vec<i64> = invocation
            .invoke_async(&mut con)
            .await
            .map_err(self.map("renew_many"))?;
        if renewed.len() != sendable.len() {
            return Err(unexpected("renew_many", &renewed));
        }
        for ((i, granted_ttl), flag) in sendable.into_iter().zip(renewed) {
            let lease = &leases[i];
            out[i] = if flag == 1 {
                tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
                Ok(RenewOutcome::Renewed(lease.renewed(granted_ttl, sent)))
            } else {
                tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease lost");
                Ok(RenewOutcome::Lost)
            };
        }
        Ok(out)
    }

    async fn release_unbounded(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let layout = &self.inner.layout;
        let mut con = self.inner.con.clone();
        let released: i64 = scripts::RELEASE
            .key(layout.lease(lease.key()))
            .arg(lease.owner().as_str())
            .arg(lease.token().get())
            .arg(layout.released_channel(lease.key()))
            .invoke_async(&mut con)
            .await
            .map_err(self.map("release"))?;
        if released == 1 {
            tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease released");
            Ok(ReleaseOutcome::Released)
        } else {
            Ok(ReleaseOutcome::NotHeld)
        }
    }

    async fn inspect_unbounded(&self, key: &LeaseKey) -> Result<KeyState> {
        let layout = &self.inner.layout;
        let mut con = self.inner.con.clone();
        let reply: Vec<String> = scripts::INSPECT
            .key(layout.lease(key))
            .key(layout.generation(key))
            .invoke_async(&mut con)
            .await
            .map_err(self.map("inspect"))?;
        let (generation, holder) = match reply.as_slice() {
            [generation] => (generation, None),
            [generation, owner, token, pttl, ttl] => (
                generation,
                Some(parse_holder("inspect", owner, token, pttl, ttl)?),
            ),
            _ => return Err(unexpected("inspect", &reply)),
        };
        let last_token = if generation.is_empty() {
            None
        } else {
            Some(
                generation
                    .parse::<FencingToken>()
                    .map_err(|_| unexpected("inspect", &reply))?,
            )
        };
        Ok(KeyState {
            key: key.clone(),
            holder,
            last_token,
        })
    }
}

impl RedisLeaseStore {
    /// Fails the acquire (after releasing the grant, best effort) unless `WAIT` saw enough
    /// replicas.
    async fn check_replicas(&self, lease: &Lease, wait: ReplicaWait, acked: i64) -> Result<()> {
        if acked >= i64::from(wait.replicas) {
            return Ok(());
        }
        tracing::warn!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), acked, wanted = wait.replicas, "too few replicas acknowledged the grant; releasing it");
        let _ = self.release(lease).await;
        let err = RedisStoreError::TooFewReplicas {
            acked,
            wanted: wait.replicas,
            timeout: wait.timeout,
        };
        Err(Error::unavailable(
            BACKEND,
            err.to_string(),
            Some(Box::new(err) as lease_core::BoxError),
        ))
    }
}
