//! [`connect`] and [`connect_resource`]: a store (or fenced resource) from a URL.

use std::sync::Arc;

use leasehold_core::{
    Error, FencedResource, LeaseStore, MemoryFencedResource, MemoryLeaseStore, Result,
};

use crate::url::StoreUrl;

/// Connects to the lease store named by `url` and returns it as a shared `dyn LeaseStore`.
///
/// The URL forms are listed at [`StoreUrl`]. A backend whose cargo feature is off returns
/// [`Error::Config`](crate::Error::Config) naming the feature to enable; an unparsable URL
/// returns [`Error::Config`](crate::Error::Config) too. `memory:` makes a new, empty in-process
/// store on every call (it is useful for tests and demos, never shared between processes).
///
/// The URL is handed to the backend as written, user information and query included: the
/// backend reads its options from the query (table names, prefixes, timeouts, TLS files; see
/// "Options in the URL" in each backend crate's docs) and refuses a parameter it does not know
/// with [`Error::Config`](crate::Error::Config) naming it. Without a query each backend uses its
/// defaults:
/// - **postgres**: builds a pool, then creates the lease tables if they are missing
///   (`PostgresLeaseStore::connect`: idempotent, under an advisory lock); a role
///   without DDL rights may use tables that already exist.
/// - **mysql**: builds a pool, then creates the lease tables and token triggers if they are
///   missing (`MysqlLeaseStore::connect`: idempotent, under `GET_LOCK`).
/// - **redis**: connects with the default key prefix.
/// - **etcd**: connects to the listed endpoints with the default prefixes.
/// - **k8s**: uses the ambient configuration (`$KUBECONFIG`, `~/.kube/config`, or the in-cluster
///   service account) and the URL's namespace, else the configuration's default namespace;
///   with `group_set=SET` in the query, the grouped mode (`K8sGroupedStore::connect`).
/// - **sqlite**: opens (creating) the file and its tables.
///
/// For what a URL cannot say (a client you built, a test hook), build the backend's store with
/// its own constructor and wrap it in an `Arc`.
///
/// ```
/// use std::time::Duration;
/// use leasehold::{AcquireRequest, LeaseKey, OwnerId};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let store = leasehold::connect("memory:").await?;
/// let req = AcquireRequest::new(LeaseKey::new("nightly")?, OwnerId::random(), Duration::from_secs(10));
/// let lease = store.acquire(&req).await?.lease().expect("a fresh store has no holder");
/// assert_eq!(store.backend(), "memory");
/// # let _ = lease; Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Config`](crate::Error::Config) for a bad URL or a disabled backend; whatever the
/// backend's constructor reports otherwise (typically [`Error::Unavailable`](crate::Error::Unavailable)
/// when the server cannot be reached).
///
/// # Cancellation safety
/// Cancel safe: nothing is held until the store is returned.
pub async fn connect(url: &str) -> Result<Arc<dyn LeaseStore>> {
    let parsed = StoreUrl::parse(url)?;
    if !parsed.is_enabled() {
        return Err(parsed.feature_off());
    }
    match &parsed {
        StoreUrl::Memory => Ok(Arc::new(MemoryLeaseStore::new())),
        StoreUrl::Postgres(u) => backends::postgres(u).await.map(|(s, _)| s),
        StoreUrl::Mysql(u) => backends::mysql(u).await.map(|(s, _)| s),
        StoreUrl::Redis(u) => backends::redis(u).await.map(|(s, _)| s),
        StoreUrl::Etcd { url, .. } => backends::etcd(url).await.map(|(s, _)| s),
        StoreUrl::Kubernetes { url, .. } => backends::k8s(url).await.map(|(s, _)| s),
        StoreUrl::Sqlite(u) => backends::sqlite(u).await.map(|(s, _)| s),
    }
}

/// Connects to the [`FencedResource`] that the backend named by `url` offers next to its leases
/// (the protected side: writes carrying fencing tokens).
///
/// For `memory:` this is a new, empty [`MemoryFencedResource`]. The other backends keep the
/// resource's state in the same service as the leases (a table, a hash, a key); see each
/// backend's documentation.
///
/// **Redis**: the resource's high-water mark lives in Redis, which replicates asynchronously;
/// after a failover or in a split brain it can accept a lower token after a higher one
/// ([`StoreUrl::resource_shares_failover`]). This function returns it anyway and logs a
/// `tracing` warning ([`SharedFailover::Warn`]); use [`connect_with_resource_policy`] to refuse
/// it or to accept it without the warning.
///
/// ```
/// use leasehold::{FencingToken, LeaseKey, WriteOp};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let resource = leasehold::connect_resource("memory:").await?;
/// let key = LeaseKey::new("ledger")?;
/// let t7 = FencingToken::new(7)?;
/// assert!(resource.write(&key, t7, WriteOp::Add(1)).await?.is_accepted());
/// assert!(!resource.write(&key, FencingToken::new(6)?, WriteOp::Add(1)).await?.is_accepted());
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`connect`]; [`Error::Config`](crate::Error::Config) for a backend that offers no
/// fenced resource.
///
/// # Cancellation safety
/// Cancel safe: nothing is held until the resource is returned.
pub async fn connect_resource(url: &str) -> Result<Arc<dyn FencedResource>> {
    connect_with_resource(url).await.map(|(_, r)| r)
}

/// What [`connect_with_resource_policy`] does when the backend's fenced resource shares the
/// store's asynchronous failover ([`StoreUrl::resource_shares_failover`]: Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SharedFailover {
    /// Return the pair and log a `tracing` warning (target `lease`). What
    /// [`connect_with_resource`] and [`connect_resource`] do.
    #[default]
    Warn,
    /// Return [`Error::Config`](crate::Error::Config) without connecting. Pair the store with
    /// a resource elsewhere instead ([`connect`] for the store, [`connect_resource`] with
    /// another URL, or your own [`FencedResource`]).
    Refuse,
    /// Return the pair without a warning: the caller knows that a failover (or split brain) can
    /// make the resource accept a lower token after a higher one, and accepts it (for example,
    /// a Redis without replicas or automatic failover).
    Accept,
}

/// As [`connect_with_resource`], with an explicit choice for a fenced resource that shares the
/// store's asynchronous failover (Redis; see [`StoreUrl::resource_shares_failover`] and
/// `docs/adr/0021-redis-failover-wait-and-fencing.md`). For every other backend the policy
/// changes nothing.
///
/// ```
/// use leasehold::SharedFailover;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// // Refused before connecting: nothing is opened.
/// match leasehold::connect_with_resource_policy("redis://127.0.0.1:6379", SharedFailover::Refuse).await {
///     Err(leasehold::Error::Config { message, .. }) => assert!(message.contains("lower token")),
///     other => panic!("{other:?}"),
/// }
/// let (store, _resource) = leasehold::connect_with_resource_policy("memory:", SharedFailover::Refuse).await?;
/// assert_eq!(store.backend(), "memory");
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`connect_with_resource`]; [`Error::Config`](crate::Error::Config) for a shared failover
/// under [`SharedFailover::Refuse`].
///
/// # Cancellation safety
/// Cancel safe: nothing is held until the pair is returned.
pub async fn connect_with_resource_policy(
    url: &str,
    policy: SharedFailover,
) -> Result<(Arc<dyn LeaseStore>, Arc<dyn FencedResource>)> {
    let parsed = StoreUrl::parse(url)?;
    if parsed.resource_shares_failover() {
        match policy {
            SharedFailover::Refuse => {
                return Err(Error::config(
                    parsed.backend(),
                    format!(
                        "the fenced resource of {parsed} keeps its high-water mark in the same \
                         asynchronously replicated Redis as the leases: after a failover or in a \
                         split brain it can accept a lower token after a higher one (ADR 0021); \
                         keep the fence elsewhere, or pass SharedFailover::Accept"
                    ),
                    None,
                ));
            }
            SharedFailover::Warn if parsed.is_enabled() => tracing::warn!(
                target: "lease",
                store = %parsed,
                "the fenced resource shares the Redis store's asynchronous failover: after a \
                 failover or in a split brain it can accept a lower token after a higher one \
                 (ADR 0021); keep the fence elsewhere, or choose SharedFailover::Accept"
            ),
            SharedFailover::Warn | SharedFailover::Accept => {}
        }
    }
    connect_parsed(&parsed).await
}

/// Connects once and returns both the store and its fenced resource (sharing connections where
/// the backend can). For `memory:` the two are new and in-process.
///
/// **Redis**: the pair shares one asynchronously replicated Redis, so a failover (or split
/// brain) that lets two owners hold the lease can also make the resource accept a lower token
/// after a higher one: the fence fails together with the lease it should back up
/// ([`StoreUrl::resource_shares_failover`], `docs/adr/0021-redis-failover-wait-and-fencing.md`).
/// This function returns the pair anyway and logs a `tracing` warning
/// ([`SharedFailover::Warn`]); [`connect_with_resource_policy`] refuses it or accepts it
/// silently.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let (store, resource) = leasehold::connect_with_resource("memory:").await?;
/// assert_eq!(store.backend(), "memory");
/// # let _ = resource; Ok(()) }
/// ```
///
/// # Errors
/// As [`connect_resource`].
///
/// # Cancellation safety
/// Cancel safe: nothing is held until the pair is returned.
pub async fn connect_with_resource(
    url: &str,
) -> Result<(Arc<dyn LeaseStore>, Arc<dyn FencedResource>)> {
    connect_with_resource_policy(url, SharedFailover::Warn).await
}

async fn connect_parsed(
    parsed: &StoreUrl,
) -> Result<(Arc<dyn LeaseStore>, Arc<dyn FencedResource>)> {
    if !parsed.is_enabled() {
        return Err(parsed.feature_off());
    }
    match parsed {
        StoreUrl::Memory => Ok((
            Arc::new(MemoryLeaseStore::new()),
            Arc::new(MemoryFencedResource::new()),
        )),
        StoreUrl::Postgres(u) => backends::postgres(u).await,
        StoreUrl::Mysql(u) => backends::mysql(u).await,
        StoreUrl::Redis(u) => backends::redis(u).await,
        StoreUrl::Etcd { url, .. } => backends::etcd(url).await,
        StoreUrl::Kubernetes { url, .. } => backends::k8s(url).await,
        StoreUrl::Sqlite(u) => backends::sqlite(u).await,
    }
}

/// One function per backend; each exists in an enabled and a disabled form, so that `connect`
/// reads the same under every feature combination. The disabled forms are unreachable because
/// `connect` checks [`StoreUrl::is_enabled`] first, but they still report the missing feature.
#[allow(clippy::unused_async)]
mod backends {
    use super::*;

    type Pair = (Arc<dyn LeaseStore>, Arc<dyn FencedResource>);

    /// Every backend crate has the same shape (`<B>LeaseStore::connect(url)` and
    /// `store.fenced_resource()`), so every backend is one line here.
    macro_rules! backend {
        ($name:ident, $feature:literal, $store:ty) => {
            #[cfg(feature = $feature)]
            pub(super) async fn $name(url: &str) -> Result<Pair> {
                let store = <$store>::connect(url).await?;
                let resource = store.fenced_resource();
                Ok((Arc::new(store), Arc::new(resource)))
            }
            #[cfg(not(feature = $feature))]
            pub(super) async fn $name(url: &str) -> Result<Pair> {
                Err(StoreUrl::parse(url)?.feature_off())
            }
        };
    }

    backend!(postgres, "postgres", leasehold_postgres::PostgresLeaseStore);
    backend!(mysql, "mysql", leasehold_mysql::MysqlLeaseStore);
    backend!(redis, "redis", leasehold_redis::RedisLeaseStore);
    backend!(etcd, "etcd", leasehold_etcd::EtcdLeaseStore);
    backend!(sqlite, "sqlite", leasehold_sqlite::SqliteLeaseStore);

    /// Kubernetes: one Lease per key, or the grouped mode where the URL's query selects it
    /// (`group_set=SET`, `groups=N`).
    #[cfg(feature = "k8s")]
    pub(super) async fn k8s(url: &str) -> Result<Pair> {
        let (_, options) = leasehold_k8s::K8sOptions::default().with_url(url)?;
        if options.grouped().is_some() {
            let store = leasehold_k8s::K8sGroupedStore::connect(url).await?;
            let resource = store.fenced_resource();
            return Ok((Arc::new(store), Arc::new(resource)));
        }
        let store = leasehold_k8s::K8sLeaseStore::connect(url).await?;
        let resource = store.fenced_resource();
        Ok((Arc::new(store), Arc::new(resource)))
    }
    #[cfg(not(feature = "k8s"))]
    pub(super) async fn k8s(url: &str) -> Result<Pair> {
        Err(StoreUrl::parse(url)?.feature_off())
    }
}
