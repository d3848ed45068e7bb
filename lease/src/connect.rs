//! [`connect`] and [`connect_resource`]: a store (or fenced resource) from a URL.

use std::sync::Arc;

use lease_core::{FencedResource, LeaseStore, MemoryFencedResource, MemoryLeaseStore, Result};

use crate::url::StoreUrl;

/// Connects to the lease store named by `url` and returns it as a shared `dyn LeaseStore`.
///
/// The URL forms are listed at [`StoreUrl`]. A backend whose cargo feature is off returns
/// [`Error::Config`](crate::Error::Config) naming the feature to enable; an unparsable URL
/// returns [`Error::Config`](crate::Error::Config) too. `memory:` makes a new, empty in-process
/// store on every call (it is useful for tests and demos, never shared between processes).
///
/// ```
/// use std::time::Duration;
/// use lease::{AcquireRequest, LeaseKey, OwnerId};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease::Result<()> {
/// let store = lease::connect("memory:").await?;
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
        StoreUrl::Redis(u) => backends::redis(u).await.map(|(s, _)| s),
        StoreUrl::Etcd { endpoints } => backends::etcd(endpoints).await.map(|(s, _)| s),
        StoreUrl::Kubernetes { namespace } => {
            backends::k8s(namespace.as_deref()).await.map(|(s, _)| s)
        }
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
/// ```
/// use lease::{FencingToken, LeaseKey, WriteOp};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease::Result<()> {
/// let resource = lease::connect_resource("memory:").await?;
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

/// Connects once and returns both the store and its fenced resource (sharing connections where
/// the backend can). For `memory:` the two are new and in-process.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease::Result<()> {
/// let (store, resource) = lease::connect_with_resource("memory:").await?;
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
    let parsed = StoreUrl::parse(url)?;
    if !parsed.is_enabled() {
        return Err(parsed.feature_off());
    }
    match &parsed {
        StoreUrl::Memory => Ok((
            Arc::new(MemoryLeaseStore::new()),
            Arc::new(MemoryFencedResource::new()),
        )),
        StoreUrl::Postgres(u) => backends::postgres(u).await,
        StoreUrl::Redis(u) => backends::redis(u).await,
        StoreUrl::Etcd { endpoints } => backends::etcd(endpoints).await,
        StoreUrl::Kubernetes { namespace } => backends::k8s(namespace.as_deref()).await,
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

    #[cfg(feature = "postgres")]
    pub(super) async fn postgres(url: &str) -> Result<Pair> {
        let store = lease_postgres::PostgresLeaseStore::connect(url).await?;
        let resource = store.fenced_resource();
        Ok((Arc::new(store), Arc::new(resource)))
    }
    #[cfg(not(feature = "postgres"))]
    pub(super) async fn postgres(url: &str) -> Result<Pair> {
        Err(StoreUrl::Postgres(url.to_string()).feature_off())
    }

    #[cfg(feature = "redis")]
    pub(super) async fn redis(url: &str) -> Result<Pair> {
        let store = lease_redis::RedisLeaseStore::connect(url).await?;
        Ok((Arc::new(store.clone()), Arc::new(store)))
    }
    #[cfg(not(feature = "redis"))]
    pub(super) async fn redis(url: &str) -> Result<Pair> {
        Err(StoreUrl::Redis(url.to_string()).feature_off())
    }

    #[cfg(feature = "etcd")]
    pub(super) async fn etcd(endpoints: &[String]) -> Result<Pair> {
        let config = lease_etcd::EtcdConfig::new(endpoints.iter().cloned());
        let store = lease_etcd::EtcdLeaseStore::connect(config).await?;
        let resource = lease_etcd::EtcdFencedResource::from_store(&store);
        Ok((Arc::new(store), Arc::new(resource)))
    }
    #[cfg(not(feature = "etcd"))]
    pub(super) async fn etcd(endpoints: &[String]) -> Result<Pair> {
        Err(StoreUrl::Etcd {
            endpoints: endpoints.to_vec(),
        }
        .feature_off())
    }

    #[cfg(feature = "k8s")]
    pub(super) async fn k8s(namespace: Option<&str>) -> Result<Pair> {
        let store = lease_k8s::K8sLeaseStore::connect(namespace).await?;
        let resource = store.fenced_resource();
        Ok((Arc::new(store), Arc::new(resource)))
    }
    #[cfg(not(feature = "k8s"))]
    pub(super) async fn k8s(namespace: Option<&str>) -> Result<Pair> {
        Err(StoreUrl::Kubernetes {
            namespace: namespace.map(str::to_string),
        }
        .feature_off())
    }

    #[cfg(feature = "sqlite")]
    pub(super) async fn sqlite(url: &str) -> Result<Pair> {
        let store = lease_sqlite::SqliteLeaseStore::connect(url).await?;
        let resource = store.fenced_resource();
        Ok((Arc::new(store), Arc::new(resource)))
    }
    #[cfg(not(feature = "sqlite"))]
    pub(super) async fn sqlite(url: &str) -> Result<Pair> {
        Err(StoreUrl::Sqlite(url.to_string()).feature_off())
    }
}
