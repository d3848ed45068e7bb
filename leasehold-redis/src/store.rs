// This file stays whole past 600 lines (672 with its tests): connecting (single, cluster,
// Sentinel, TLS) and the `LeaseStore` implementation in the contract's order, each operation with
// its script call and error mapping; the scripts are in protocol.rs, batches in batch.rs and
// inspection in inspect.rs.
//! [`RedisLeaseStore`]: connecting, and the [`LeaseStore`] implementation.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::backend::{RoundedTtl, decode_token, granted_lease, ttl_millis, validate_ttl};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, ExpiryClock, KeyState, KeyWatch, Lease,
    LeaseKey, LeaseStore, ReleaseOutcome, RenewOutcome, Result, TokenDurability,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

use crate::config::{RedisOptions, ReplicaWait};
use crate::connection::{Conn, RedisConnection};
use crate::error::{BACKEND, RedisStoreError, map, unexpected};
use crate::inspect::parse_holder;
use crate::protocol::{self, KeyLayout};

/// The shortest TTL granted: 1 ms (`PX` resolution).
pub const MIN_TTL: Duration = Duration::from_millis(1);

/// A [`LeaseStore`] on Redis; [`fenced_resource`](Self::fenced_resource) gives the
/// [`FencedResource`](leasehold_core::FencedResource) in the same Redis.
///
/// A cheap-to-clone handle over one multiplexed, automatically reconnecting connection
/// ([`RedisConnection`]). Acquire, renew and release are each one Lua script; expiry is the
/// server's `PX` expiry. See the [crate docs](crate) for what Redis can and cannot promise.
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
/// use leasehold_redis::RedisLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
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
    /// Where new connections (the watch's pub/sub) come from: the server, or each cluster node
    /// in the order of the URL (a release is published to the whole cluster, so any node will
    /// do).
    pub(crate) clients: Vec<redis::Client>,
    pub(crate) con: RedisConnection,
    pub(crate) layout: KeyLayout,
    pub(crate) db: i64,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_deadline: Duration,
    pub(crate) replica_wait: Option<ReplicaWait>,
    pub(crate) poll_interval: Duration,
}

impl fmt::Debug for RedisLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLeaseStore")
            .field(
                "servers",
                &self
                    .inner
                    .con
                    .current_client()
                    .iter()
                    .chain(&self.inner.clients)
                    .map(|c| c.get_connection_info().addr().to_string())
                    .collect::<Vec<_>>(),
            )
            .field("cluster", &self.inner.con.is_cluster())
            .field("db", &self.inner.db)
            .field("prefix", &self.inner.layout.prefix())
            .field("replica_wait", &self.inner.replica_wait)
            .finish_non_exhaustive()
    }
}

impl RedisLeaseStore {
    /// Connects to `url` with the default [`RedisOptions`].
    ///
    /// `url` is `redis://[user:password@]host:port[/db]`, `rediss://...` (TLS) or
    /// `redis+unix:///path` for one server, and `redis+cluster://[user:password@]h1:p1,h2:p2,...`
    /// (or `rediss+cluster://` for TLS) for a Redis Cluster: the listed nodes are the seeds the
    /// cluster client discovers the topology from (one reachable node is enough). A TLS URL may
    /// name its CA and client certificate: `?tls_ca=<path>&tls_cert=<path>&tls_key=<path>` (see
    /// the crate docs, "Connecting").
    ///
    /// ```no_run
    /// use leasehold_redis::RedisLeaseStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = RedisLeaseStore::connect("redis://127.0.0.1:6379").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is held until the store is returned.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to `url` (see [`connect`](Self::connect)) with `options`.
    ///
    /// # Errors
    /// [`Error::Config`] for an unparsable URL, an illegal prefix, a zero response or connect
    /// timeout, a `WAIT` timeout not below the response timeout, or a server whose
    /// `maxmemory-policy` is not `noeviction` (unless [`RedisOptions::allow_eviction`]; see the
    /// crate docs, "Eviction"); [`Error::Unavailable`] if the
    /// server cannot be reached (refused, unreachable), [`Error::Timeout`] if it does not answer
    /// within the [operation deadline](Self::op_deadline).
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is held until the store is returned.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        let (target, options) = crate::tls::target(url, options)?;
        options.validate()?;
        if let Some(sentinel) = crate::sentinel::parse(&target.url)? {
            if target.secure || target.tls != crate::tls::TlsFiles::default() {
                return Err(Error::config(
                    BACKEND,
                    "TLS to sentinels is not supported (redis+sentinel:// only)",
                    None,
                ));
            }
            // Boxed, as is the cluster's: each connect path is a deep future, and callers that
            // nest `connect_with` deep in their own futures should not carry all three inline.
            return Box::pin(Self::connect_sentinel(&sentinel, options)).await;
        }
        if let Some(nodes) = cluster_nodes(&target.url)? {
            return Box::pin(Self::connect_cluster(nodes, &target, options)).await;
        }
        let client = crate::tls::client(&target.url, &target.tls, target.secure)?;
        Self::from_client(client, options).await
    }

    /// Connects through an existing client (for custom TLS or credentials) with `options`.
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is held until the store is returned.
    pub async fn from_client(client: redis::Client, options: RedisOptions) -> Result<Self> {
        let layout = options.validate()?;
        let op_deadline = options.op_deadline();
        let con = bounded(
            "connect",
            op_deadline,
            ConnectionManager::new_with_config(client.clone(), manager_config(&options)),
        )
        .await?
        .map_err(|e| map("connect", e, options.connect_timeout))?;
        let con = RedisConnection {
            inner: Conn::Single(con),
        };
        check_eviction(&con, &options, op_deadline).await?;
        let db = client.get_connection_info().redis_settings().db();
        Ok(RedisLeaseStore {
            inner: Arc::new(Inner {
                clients: vec![client],
                con,
                layout,
                db,
                response_timeout: options.response_timeout,
                connect_timeout: options.connect_timeout,
                op_deadline,
                replica_wait: options.replica_wait,
                poll_interval: options.poll_interval,
            }),
        })
    }

    /// Connects to the master that the sentinels of `url` name.
    async fn connect_sentinel(
        url: &crate::sentinel::SentinelUrl,
        options: RedisOptions,
    ) -> Result<Self> {
        let layout = options.validate()?;
        let op_deadline = options.op_deadline();
        let con = bounded(
            "connect",
            op_deadline,
            crate::sentinel::SentinelConnection::connect(
                url,
                manager_config(&options),
                options.connect_timeout,
            ),
        )
        .await??;
        let con = RedisConnection {
            inner: Conn::Sentinel(con),
        };
        check_eviction(&con, &options, op_deadline).await?;
        let db = redis::aio::ConnectionLike::get_db(&con);
        Ok(RedisLeaseStore {
            inner: Arc::new(Inner {
                clients: Vec::new(),
                con,
                layout,
                db,
                response_timeout: options.response_timeout,
                connect_timeout: options.connect_timeout,
                op_deadline,
                replica_wait: options.replica_wait,
                poll_interval: options.poll_interval,
            }),
        })
    }

    /// Connects to a Redis Cluster through its seed nodes (`redis://h:p` each).
    async fn connect_cluster(
        nodes: Vec<String>,
        target: &crate::tls::Target,
        options: RedisOptions,
    ) -> Result<Self> {
        let layout = options.validate()?;
        let op_deadline = options.op_deadline();
        let bad_url = |e: redis::RedisError| {
            Error::config(
                BACKEND,
                format!("unusable Redis Cluster node URL: {e}"),
                Some(Box::new(e) as leasehold_core::BoxError),
            )
        };
        let clients = nodes
            .iter()
            .map(|n| crate::tls::client(n, &target.tls, target.secure))
            .collect::<Result<Vec<_>>>()?;
        let mut builder = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.response_timeout)
            .retries(u32::try_from(options.connect_retries).unwrap_or(u32::MAX));
        if let Some(certs) = crate::tls::cluster_certificates(&target.tls, target.secure)? {
            builder = builder.certs(certs);
        }
        let cluster = builder.build().map_err(bad_url)?;
        let con = bounded("connect", op_deadline, cluster.get_async_connection())
            .await?
            .map_err(|e| map("connect", e, options.connect_timeout))?;
        let con = RedisConnection {
            inner: Conn::Cluster(con),
        };
        check_eviction(&con, &options, op_deadline).await?;
        Ok(RedisLeaseStore {
            inner: Arc::new(Inner {
                clients,
                con,
                layout,
                db: 0,
                response_timeout: options.response_timeout,
                connect_timeout: options.connect_timeout,
                op_deadline,
                replica_wait: options.replica_wait,
                poll_interval: options.poll_interval,
            }),
        })
    }

    /// The key layout in use.
    pub fn layout(&self) -> &KeyLayout {
        &self.inner.layout
    }

    /// A clone of the store's connection (for administration, baselines and tests).
    pub fn connection(&self) -> RedisConnection {
        self.inner.con.clone()
    }

    /// The longest any operation of this store waits before it fails with [`Error::Timeout`]:
    /// connect timeout + 2 × response timeout. It bounds every call of the
    /// [`LeaseStore`] and [`FencedResource`](leasehold_core::FencedResource) implementations,
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
        move |e| map(operation, e, self.inner.response_timeout)
    }
}

/// The seed node URLs of a `redis+cluster://` or `rediss+cluster://` URL, `None` for any other
/// URL. Credentials given on the first node apply to every node; a database other than 0 is
/// refused (a cluster has only database 0).
fn cluster_nodes(url: &str) -> Result<Option<Vec<String>>> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return Ok(None),
    };
    let bad = |why: &str| {
        Err(Error::config(
            BACKEND,
            format!(
                "unusable Redis Cluster URL {}: {why}",
                crate::tls::redact(url)
            ),
            None,
        ))
    };
    // The driver's query parameters and fragment (what `tls::target` left) go to every node.
    let cut = rest.find(['?', '#']).unwrap_or(rest.len());
    let (rest, suffix) = rest.split_at(cut);
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    let (hosts, db) = hosts.split_once('/').unwrap_or((hosts, ""));
    if !(db.is_empty() || db == "0") {
        return bad("a cluster has only database 0");
    }
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{userinfo}{h}{suffix}"))
        .collect();
    if nodes.is_empty() {
        return bad("no node listed (expected host:port,host:port,...)");
    }
    Ok(Some(nodes))
}

/// The connection manager's settings from `options`.
fn manager_config(options: &RedisOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(options.response_timeout))
        .set_connection_timeout(Some(options.connect_timeout))
        .set_number_of_retries(options.connect_retries)
        .set_max_delay(Duration::from_millis(500))
}

/// [`eviction::check_policy`](crate::eviction::check_policy) under the operation deadline.
async fn check_eviction(
    con: &RedisConnection,
    options: &RedisOptions,
    op_deadline: Duration,
) -> Result<()> {
    bounded(
        "connect",
        op_deadline,
        crate::eviction::check_policy(con, options.allow_eviction, options.response_timeout),
    )
    .await?
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

/// Keys per inspect script in [`LeaseStore::inspect_many`]. A script holds the server while it
/// runs: 256 keys took 0.6 to 1.7 ms of server time on a loaded 2-core machine (512 keys twice
/// that), while the total for 10,000 keys did not depend on the batch size within the noise.
pub(crate) const INSPECT_BATCH: usize = 256;

/// The most keys one script of a batched acquire decides.
pub(crate) const ACQUIRE_BATCH: usize = 1_000;

/// The holder a script reported for `key`: its record (`"<token> <owner> <ttl ms>"`, see
/// [`KeyLayout`]) and remaining ms.
/// The TTL this store grants for a requested `ttl`: checked against [`MIN_TTL`] and
/// [`MAX_TTL`](leasehold_core::MAX_TTL), in whole milliseconds rounded up (`PX`). The one check
/// of acquire, renew and their batches.
pub(crate) fn grantable_ttl(ttl: Duration) -> Result<RoundedTtl> {
    validate_ttl(ttl, MIN_TTL).and_then(|()| ttl_millis(ttl))
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

    /// One script per hash slot (one group on a single server), cut into scripts of at most
    /// 1,000 keys so that no script holds the server for long, all sent at once: each key
    /// decided by acquire's script body ([`acquire_many_lua`](crate::protocol::acquire_many_lua)).
    /// With replica acknowledgements on, a group's scripts are pipelined and followed by one
    /// `WAIT` on its connection, and the group's grants are released again, best effort (their
    /// slots carry the single acquire's [`Error::Unavailable`]), when too few replicas
    /// acknowledged them. On a cluster each hash slot is a group, and `WAIT`s of slots on one
    /// node run one after the other. Requests with an invalid TTL get their error in their slot
    /// and are not sent; with several scripts, a failed one's keys carry its error.
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        leasehold_core::store::validate_acquire_many(reqs)?;
        self.bounded("acquire_many", self.acquire_many_unbounded(reqs))
            .await
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

    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        self.bounded("inspect_many", self.inspect_many_unbounded(keys))
            .await
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        crate::watch::watch(self, key).await.map(Some)
    }
}

/// The operations themselves; the [`LeaseStore`] methods run them under the operation deadline.
impl RedisLeaseStore {
    async fn acquire_unbounded(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let ttl = grantable_ttl(req.ttl)?;
        let layout = &self.inner.layout;
        let mut con = self.inner.con.clone();
        let sent = Instant::now();
        let (reply, acked): (redis::Value, Option<i64>) = match self.inner.replica_wait {
            None => {
                let reply = protocol::ACQUIRE
                    .key(layout.lease(&req.key))
                    .key(layout.generation(&req.key))
                    .arg(req.owner.as_str())
                    .arg(ttl.as_u64())
                    .invoke_async(&mut con)
                    .await
                    .map_err(self.map("acquire"))?;
                (reply, None)
            }
            // One pipeline, so that `WAIT` runs on the connection that made the grant, right
            // after it (on a connection without writes `WAIT` would succeed vacuously).
            Some(wait) => {
                let (reply, acked): (redis::Value, i64) = redis::pipe()
                    .cmd("EVAL")
                    .arg(protocol::acquire_lua())
                    .arg(2)
                    .arg(layout.lease(&req.key))
                    .arg(layout.generation(&req.key))
                    .arg(req.owner.as_str())
                    .arg(ttl.as_u64())
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
        match &reply {
            redis::Value::Array(held) => match held.as_slice() {
                [
                    redis::Value::BulkString(record),
                    redis::Value::BulkString(pttl),
                ] => {
                    let holder = parse_holder(&req.key, record, pttl)?;
                    tracing::trace!(backend = BACKEND, key = %req.key, owner = %req.owner, holder = %holder.owner, token = %holder.token, "lease held by another owner");
                    Ok(AcquireOutcome::Held(holder))
                }
                _ => Err(unexpected("acquire", &reply)),
            },
            redis::Value::BulkString(token) => {
                let token = std::str::from_utf8(token)
                    .map_err(|_| unexpected("acquire", &reply))
                    .and_then(|t| decode_token(BACKEND, req.key.as_str(), t))?;
                tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, "lease acquired");
                let lease = granted_lease(
                    req.key.clone(),
                    req.owner.clone(),
                    token,
                    ttl.granted(),
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
        let ttl = grantable_ttl(lease.ttl())?;
        let mut con = self.inner.con.clone();
        let sent = Instant::now();
        let renewed: i64 = protocol::RENEW
            .key(self.inner.layout.lease(lease.key()))
            .arg(protocol::record_prefix(lease.token(), lease.owner()))
            .arg(ttl.as_u64())
            .invoke_async(&mut con)
            .await
            .map_err(self.map("renew"))?;
        Ok(renew_outcome(lease, renewed == 1, ttl.granted(), sent))
    }

    async fn release_unbounded(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let layout = &self.inner.layout;
        let mut con = self.inner.con.clone();
        let released: i64 = protocol::RELEASE
            .key(layout.lease(lease.key()))
            .arg(protocol::record_prefix(lease.token(), lease.owner()))
            .arg(layout.released_channel(lease.key()))
            .arg(lease.token().get())
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

    /// Fails the acquire (after releasing the grant, best effort) unless `WAIT` saw enough
    /// replicas.
    pub(crate) async fn check_replicas(
        &self,
        lease: &Lease,
        wait: ReplicaWait,
        acked: i64,
    ) -> Result<()> {
        if acked >= i64::from(wait.replicas) {
            return Ok(());
        }
        tracing::warn!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), acked, wanted = wait.replicas, "too few replicas acknowledged the grant; releasing it");
        let _ = self.release(lease).await;
        Err(RedisStoreError::TooFewReplicas {
            acked,
            wanted: wait.replicas,
            timeout: wait.timeout,
        }
        .into_error())
    }
}

/// The outcome of one renewal the server answered.
pub(crate) fn renew_outcome(
    lease: &Lease,
    renewed: bool,
    granted: Duration,
    sent: Instant,
) -> RenewOutcome {
    if renewed {
        tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
        RenewOutcome::Renewed(lease.renewed(granted, sent))
    } else {
        tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease lost");
        RenewOutcome::Lost
    }
}

/// A copy of a group's error for each of its leases (the error itself is not `Clone`).
pub(crate) fn clone_error(e: &Error) -> Error {
    match e {
        Error::Timeout {
            backend,
            operation,
            after,
        } => Error::Timeout {
            backend,
            operation,
            after: *after,
        },
        Error::Config { message, .. } => Error::config(BACKEND, message.clone(), None),
        e if e.is_retryable() && e.outcome_unknown() => {
            Error::unavailable(BACKEND, e.to_string(), None)
        }
        e if e.is_retryable() => Error::refused(BACKEND, e.to_string(), None),
        e => Error::store_fault(BACKEND, e.to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_list_their_seed_nodes() {
        assert_eq!(cluster_nodes("redis://h:6379").unwrap(), None);
        assert_eq!(
            cluster_nodes("redis+cluster://a:7000, b:7001/0").unwrap(),
            Some(vec![
                "redis://a:7000".to_string(),
                "redis://b:7001".to_string()
            ])
        );
        assert_eq!(
            cluster_nodes("REDISS+CLUSTER://u:pw@a:7000,b:7001").unwrap(),
            Some(vec![
                "rediss://u:pw@a:7000".to_string(),
                "rediss://u:pw@b:7001".to_string()
            ])
        );
        for bad in [
            "redis+cluster://",
            "redis+cluster://,,",
            "redis+cluster://a:1/3",
        ] {
            assert!(
                matches!(
                    cluster_nodes(bad),
                    Err(Error::Config {
                        backend: "redis",
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }
}
