//! The Redis Cluster the cluster targets run against (`LEASE_TEST_REDIS_CLUSTER_URL`, started by
//! `scripts/services/redis-cluster.sh`), and cleaning it up.

use leasehold_redis::{RedisLeaseStore, RedisOptions};

#[path = "wipe.rs"]
#[allow(dead_code)]
mod wipe;

/// The key prefix the cluster tests use.
pub(crate) const PREFIX: &str = "lease-test";

/// The cluster's URL: `LEASE_TEST_REDIS_CLUSTER_URL`, or its default (the service script's
/// ports) in leasehold-testkit's test store table.
pub(crate) fn url() -> String {
    leasehold_testkit::stores::REDIS_CLUSTER_URL.get()
}

/// The `redis://host:port` of every node the URL lists.
pub(crate) fn node_urls() -> Vec<String> {
    let url = url();
    let hosts = url.split_once("://").map_or("", |(_, h)| h);
    hosts
        .split(',')
        .map(|h| format!("redis://{}", h.trim()))
        .collect()
}

/// A store on the cluster.
pub(crate) async fn store() -> leasehold_core::Result<RedisLeaseStore> {
    RedisLeaseStore::connect_with(&url(), RedisOptions::default().with_prefix(PREFIX)).await
}

/// Deletes every key matching `pattern` on every node (best effort: a replica refuses the
/// `DEL`s, its master does them).
pub(crate) async fn delete_matching(pattern: &str) {
    wipe::delete_matching_on_nodes(&node_urls(), pattern).await;
}
