//! The helpers the Redis cases share.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, AcquireRequest, Lease, LeaseKey, LeaseStore, OwnerId};
use leasehold_redis::{RedisLeaseStore, RedisOptions};
use leasehold_testkit::Failed;
use tokio::time::Instant;

#[path = "wipe.rs"]
#[allow(dead_code)]
mod wipe;

/// The key prefix the suite uses on the shared server.
pub(crate) const PREFIX: &str = "lease-test";

/// The shared server's URL: `LEASE_REDIS_URL`, or its default in leasehold-testkit's test store
/// table.
pub(crate) fn url() -> String {
    leasehold_testkit::stores::REDIS_URL.get()
}

/// Deletes every key matching `pattern` (best effort), over the store's connection.
pub(crate) async fn delete_matching(store: &RedisLeaseStore, pattern: &str) {
    wipe::delete_matching(store.connection(), pattern).await;
}

/// Retries `op` while it fails with a retryable error (a store reconnecting after a restart),
/// until `within` passes.
pub(crate) async fn retry_within<T, F, Fut>(within: Duration, mut op: F) -> Result<T, Failed>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = leasehold_core::Result<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("still failing after {within:?}: {e}").into()),
        }
    }
}

/// A store on a test server with short timeouts.
pub(crate) async fn store_at(url: &str, prefix: &str) -> Result<RedisLeaseStore, Failed> {
    let store = RedisLeaseStore::connect_with(
        url,
        RedisOptions::default()
            .with_prefix(prefix)
            .with_response_timeout(Duration::from_secs(3))
            .with_connect_timeout(Duration::from_secs(2)),
    )
    .await?;
    Ok(store)
}

/// Acquires `key` on `store`, failing the case if it is held.
pub(crate) async fn acquire_on(
    store: &dyn LeaseStore,
    key: &LeaseKey,
    owner: &OwnerId,
    ttl: Duration,
) -> Result<Lease, Failed> {
    match store
        .acquire(&AcquireRequest::new(key.clone(), owner.clone(), ttl))
        .await?
    {
        AcquireOutcome::Acquired(l) => Ok(l),
        AcquireOutcome::Held(h) => {
            Err(format!("{key} is held by {} with token {}", h.owner, h.token).into())
        }
    }
}

/// Whether `e` is this backend's `Unavailable`.
pub(crate) fn is_unavailable(e: &leasehold_core::Error) -> bool {
    matches!(
        e,
        leasehold_core::Error::Unavailable {
            backend: "redis",
            ..
        }
    )
}
