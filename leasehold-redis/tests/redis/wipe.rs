//! Wiping what a case left on a Redis server or on each node of a cluster, with
//! leasehold-testkit's `SCAN`/`DEL` loop (`leasehold_testkit::wipe`) over a `redis` connection.

use leasehold_testkit::BoxFuture;
use leasehold_testkit::wipe::{DelBatch, RedisKeyspace, redis_delete_matching};

/// A `redis` connection as leasehold-testkit's wipe takes it.
struct Keyspace<C>(C);

impl<C: redis::aio::ConnectionLike + Send> RedisKeyspace for Keyspace<C> {
    fn scan_page<'a>(
        &'a mut self,
        cursor: u64,
        pattern: &'a str,
        count: usize,
    ) -> BoxFuture<'a, Result<(u64, Vec<String>), String>> {
        Box::pin(async move {
            redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(count)
                .query_async(&mut self.0)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn del<'a>(&'a mut self, keys: &'a [String]) -> BoxFuture<'a, Result<u64, String>> {
        Box::pin(async move {
            redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut self.0)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// Deletes every key matching `pattern` over `con` (one server: one `DEL` per page), best
/// effort.
pub(crate) async fn delete_matching(con: impl redis::aio::ConnectionLike + Send, pattern: &str) {
    redis_delete_matching(&mut Keyspace(con), pattern, DelBatch::Page).await;
}

/// Deletes every key matching `pattern` on each of `nodes` (`redis://host:port` of a cluster's
/// nodes: one `DEL` per key, since a node refuses a `DEL` across slots and a replica refuses
/// every `DEL`, which its master then does), best effort.
pub(crate) async fn delete_matching_on_nodes(nodes: &[String], pattern: &str) {
    for node in nodes {
        let Ok(client) = redis::Client::open(node.as_str()) else {
            continue;
        };
        let Ok(con) = client.get_multiplexed_async_connection().await else {
            continue;
        };
        redis_delete_matching(&mut Keyspace(con), pattern, DelBatch::Key).await;
    }
}
