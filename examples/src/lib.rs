//! Shared helpers for the runnable examples: `--store URL` parsing, TTL choice, and a node's
//! freezable network.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold::{
    AcquireOutcome, AcquireRequest, Capabilities, FencedResource, KeyState, KeyWatch, Lease,
    LeaseKey, LeaseStore, ReleaseOutcome, RenewOutcome,
};

/// The value of `--store URL` (or `LEASE_STORE`), defaulting to `memory:`.
pub fn store_url() -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--store")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var("LEASE_STORE").ok())
        .unwrap_or_else(|| "memory:".to_string())
}

/// A store, its fenced resource, and a way to open more clients of the same store (the memory
/// store is per process, so "more clients" are handles to the same one).
#[derive(Debug, Clone)]
pub struct Backend {
    /// The URL.
    pub url: String,
    /// The first client.
    pub store: Arc<dyn LeaseStore>,
    /// The backend's fenced resource.
    pub resource: Arc<dyn FencedResource>,
}

impl Backend {
    /// Connects to `url`.
    ///
    /// # Errors
    /// As `leasehold::connect_with_resource`.
    pub async fn connect(url: &str) -> leasehold::Result<Self> {
        let (store, resource) = leasehold::connect_with_resource(url).await?;
        Ok(Backend {
            url: url.to_string(),
            store,
            resource,
        })
    }

    /// Another client (another connection) of the same store.
    ///
    /// # Errors
    /// As `leasehold::connect`.
    pub async fn client(&self) -> leasehold::Result<Arc<dyn LeaseStore>> {
        if self.url.starts_with("memory") {
            Ok(self.store.clone())
        } else {
            leasehold::connect(&self.url).await
        }
    }

    /// A short TTL the backend can grant: `wanted`, raised to its minimum and rounded up to its
    /// granularity.
    pub fn ttl(&self, wanted: Duration) -> Duration {
        let caps = self.store.capabilities();
        let d = wanted.max(caps.min_ttl);
        let g = caps.ttl_granularity.as_nanos().max(1);
        Duration::from_nanos(u64::try_from(d.as_nanos().div_ceil(g) * g).unwrap_or(u64::MAX))
    }
}

/// One node's "network" to the store: every call passes through until [`Network::freeze`], after
/// which every new call hangs forever (the node is cut off; its callers give up on their own
/// deadlines).
#[derive(Debug, Clone)]
pub struct Network {
    inner: Arc<dyn LeaseStore>,
    frozen: Arc<AtomicBool>,
}

impl Network {
    /// A network to `inner`, passing every call.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        Network {
            inner,
            frozen: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Cuts the node off: every call from now on never answers.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    async fn pass(&self) {
        if self.frozen.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

/// Each call is cancel safe exactly when the wrapped store's is.
#[leasehold::async_trait]
impl LeaseStore for Network {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> leasehold::Result<AcquireOutcome> {
        self.pass().await;
        self.inner.acquire(req).await
    }
    async fn renew(&self, lease: &Lease) -> leasehold::Result<RenewOutcome> {
        self.pass().await;
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> leasehold::Result<ReleaseOutcome> {
        self.pass().await;
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> leasehold::Result<KeyState> {
        self.pass().await;
        self.inner.inspect(key).await
    }
    async fn watch(&self, key: &LeaseKey) -> leasehold::Result<Option<KeyWatch>> {
        self.pass().await;
        self.inner.watch(key).await
    }
}
