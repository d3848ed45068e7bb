//! The whole leasehold-testkit suite against a real Redis (`LEASE_REDIS_URL`, default
//! `redis://127.0.0.1:6379`), plus the Redis-specific cases in this directory: restart without
//! persistence, the failover race, `WAIT`, watch wake-up and fallback, and bad configuration.

mod cases;
mod clock;
mod eviction;
mod failover;
mod fence;
mod input;
mod many;
mod options;
mod protocol;
mod restart;
mod server;
mod watch;

use std::sync::Arc;

use leasehold_core::{FencedResource, LeaseStore};
use leasehold_redis::{RedisLeaseStore, RedisOptions};
use leasehold_testkit::{Backend, BoxFuture};

use cases::{PREFIX, url};

#[derive(Debug)]
struct Redis {
    url: String,
}

impl Redis {
    async fn store(&self) -> leasehold_core::Result<RedisLeaseStore> {
        RedisLeaseStore::connect_with(
            &self.url.clone(),
            RedisOptions::default().with_prefix(PREFIX),
        )
        .await
    }
}

impl Backend for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(self.store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(self.store().await?.fenced_resource()) as Arc<dyn FencedResource>)
        })
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = self.store().await {
                cases::delete_matching(&store, &store.layout().scan_pattern(namespace)).await;
            }
        })
    }
}

fn main() {
    let extra = [
        input::cases(),
        restart::cases(),
        failover::cases(),
        clock::cases(),
        eviction::cases(),
        options::cases(),
        watch::cases(),
        protocol::cases(),
        fence::cases(),
    ]
    .concat();
    leasehold_testkit::run_with(Redis { url: url() }, extra);
}
