//! The Redis Cluster the cluster targets run against (`LEASE_TEST_REDIS_CLUSTER_URL`, started by
//! `scripts/services/redis-cluster.sh`), and cleaning it up.

use leasehold_redis::{RedisLeaseStore, RedisOptions};

/// The key prefix the cluster tests use.
pub(crate) const PREFIX: &str = "lease-test";

/// The cluster's URL: `LEASE_TEST_REDIS_CLUSTER_URL`, default the service script's ports.
pub(crate) fn url() -> String {
    std::env::var("LEASE_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        "redis+cluster://127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103,\
         127.0.0.1:7104,127.0.0.1:7105,127.0.0.1:7106"
            .to_string()
    })
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
    for node in node_urls() {
        let Ok(client) = redis::Client::open(node.as_str()) else {
            continue;
        };
        let Ok(mut con) = client.get_multiplexed_async_connection().await else {
            continue;
        };
        let mut cursor: u64 = 0;
        loop {
            let page: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut con)
                .await;
            let Ok((next, keys)) = page else { break };
            for key in keys {
                let _: redis::RedisResult<i64> =
                    redis::cmd("DEL").arg(&key).query_async(&mut con).await;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
}
