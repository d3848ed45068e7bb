//! Shared helpers for the runnable examples: `--store URL` parsing and TTL choice.

use std::sync::Arc;
use std::time::Duration;

use lease::{FencedResource, LeaseStore};

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
    /// As `lease::connect_with_resource`.
    pub async fn connect(url: &str) -> lease::Result<Self> {
        let (store, resource) = lease::connect_with_resource(url).await?;
        Ok(Backend {
            url: url.to_string(),
            store,
            resource,
        })
    }

    /// Another client (another connection) of the same store.
    ///
    /// # Errors
    /// As `lease::connect`.
    pub async fn client(&self) -> lease::Result<Arc<dyn LeaseStore>> {
        if self.url.starts_with("memory") {
            Ok(self.store.clone())
        } else {
            lease::connect(&self.url).await
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
