//! The whole lease-testkit suite against a Redis Sentinel group (a master, a replica and three
//! sentinels: `LEASE_REDIS_SENTINEL_URL`, started by `scripts/services/redis-sentinel.sh`). The
//! failover under a holder is the `redis-sentinel-failover` target.

#[allow(dead_code)]
mod cases;
#[allow(dead_code)]
mod sentinel_common;

use std::sync::Arc;

use lease_core::{FencedResource, LeaseStore};
use lease_redis::{RedisLeaseStore, RedisOptions};
use lease_testkit::{Backend, BoxFuture};

use cases::PREFIX;
use sentinel_common::url;

#[derive(Debug)]
struct Sentinel;

async fn store() -> lease_core::Result<RedisLeaseStore> {
    RedisLeaseStore::connect_with(&url(), RedisOptions::default().with_prefix(PREFIX)).await
}

impl Backend for Sentinel {
    fn name(&self) -> &'static str {
        "redis-sentinel"
    }

    fn connect(&self) -> BoxFuture<'_, lease_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, lease_core::Result<Arc<dyn FencedResource>>> {
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

fn main() {
    lease_testkit::run_with(Sentinel, Vec::new());
}
