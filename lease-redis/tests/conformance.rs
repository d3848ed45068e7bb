//! The whole lease-testkit suite against a real Redis (`LEASE_REDIS_URL`, default
//! `redis://127.0.0.1:6379`), plus the Redis-specific cases in `redis_cases/`: restart without
//! persistence, the failover race, `WAIT`, watch wake-up and fallback, and bad configuration.

mod redis_cases;

use std::sync::Arc;

use lease_core::{FencedResource, LeaseStore};
use lease_redis::RedisLeaseStore;
use lease_testkit::{Backend, BoxFuture, case};

use redis_cases::{PREFIX, url};

#[derive(Debug)]
struct Redis {
    url: String,
}

impl Redis {
    async fn store(&self) -> lease_core::Result<RedisLeaseStore> {
        RedisLeaseStore::builder(self.url.clone())
            .prefix(PREFIX)
            .connect()
            .await
    }
}

impl Backend for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn connect(&self) -> BoxFuture<'_, lease_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(self.store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, lease_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async { Ok(Arc::new(self.store().await?) as Arc<dyn FencedResource>) })
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = self.store().await {
                redis_cases::delete_matching(&store, &store.layout().scan_pattern(namespace)).await;
            }
        })
    }
}

fn main() {
    use redis_cases::{clock, failover, input, restart, watch};
    let extra = vec![
        case!("redis", input::bad_configuration_is_a_typed_error),
        case!("redis", input::a_frozen_server_is_a_timeout),
        case!(
            "redis",
            restart::restart_without_persistence_keeps_tokens_increasing
        ),
        case!("redis", failover::failover_to_a_lagging_replica_is_fenced),
        case!(
            "redis",
            failover::split_brain_lets_the_same_redis_accept_a_lower_token
        ),
        case!(
            "redis",
            clock::a_forward_clock_step_expires_a_lease_early_and_fencing_holds
        ),
        case!(
            "redis",
            failover::wait_for_replicas_fails_and_releases_without_acks
        ),
        case!(
            "redis",
            watch::watch_wakes_on_expiry_through_keyspace_events
        ),
        case!("redis", watch::watch_polls_without_keyspace_notifications),
        case!("redis", watch::a_black_holed_watch_fails_in_bounded_time),
        case!(
            "redis",
            input::operations_are_bounded_while_the_connection_is_being_reset
        ),
    ];
    lease_testkit::run_with(Redis { url: url() }, extra);
}
