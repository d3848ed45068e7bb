//! The whole leasehold-testkit suite against a Redis Sentinel group (a master, a replica and three
//! sentinels: `LEASE_REDIS_SENTINEL_URL`, started by `scripts/services/redis-sentinel.sh`). The
//! failover under a holder is the `redis-sentinel-failover` target.

#[allow(dead_code)]
mod cases;
#[allow(dead_code)]
mod sentinel_common;

use std::sync::Arc;

use std::time::Duration;

use leasehold_core::{Error, FencedResource, LeaseStore};
use leasehold_redis::{RedisLeaseStore, RedisOptions};
use leasehold_testkit::{Backend, BoxFuture, CaseResult, Ctx, case};

use cases::PREFIX;
use sentinel_common::url;

#[derive(Debug)]
struct Sentinel;

async fn store() -> leasehold_core::Result<RedisLeaseStore> {
    RedisLeaseStore::connect_with(&url(), RedisOptions::default().with_prefix(PREFIX)).await
}

impl Backend for Sentinel {
    fn name(&self) -> &'static str {
        "redis-sentinel"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(store().await?.fenced_resource()) as Arc<dyn FencedResource>)
        })
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = store().await {
                cases::delete_matching(&store, &store.layout().scan_pattern(namespace)).await;
            }
        })
    }
}

/// A master name the sentinels do not monitor is a `Config` error naming it; sentinels that are
/// all down are `Unavailable` (retryable); each within the connect timeout, never a hang.
async fn bad_sentinel_targets_are_typed_errors(_ctx: Ctx) -> CaseResult {
    let options = || {
        RedisOptions::default()
            .with_connect_timeout(Duration::from_secs(1))
            .with_response_timeout(Duration::from_secs(1))
            .with_connect_retries(0)
    };
    let hung = Duration::from_secs(20);
    let unknown = url().replace(sentinel_common::MASTER, "no-such-master");
    match tokio::time::timeout(hung, RedisLeaseStore::connect_with(&unknown, options())).await {
        Ok(Err(Error::Config { message, .. })) => {
            eprintln!("as expected: {message}");
        }
        other => return Err(format!("{unknown}: expected Config, got {other:?}").into()),
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let down = format!(
        "redis+sentinel://127.0.0.1:{port}/{}",
        sentinel_common::MASTER
    );
    match tokio::time::timeout(hung, RedisLeaseStore::connect_with(&down, options())).await {
        Ok(Err(e @ Error::Unavailable { .. })) => {
            assert!(e.is_retryable());
            eprintln!("as expected: {e}");
        }
        other => return Err(format!("{down}: expected Unavailable, got {other:?}").into()),
    }
    Ok(())
}

fn main() {
    leasehold_testkit::run_with(
        Sentinel,
        vec![case!(
            "redis_sentinel",
            bad_sentinel_targets_are_typed_errors
        )],
    );
}
