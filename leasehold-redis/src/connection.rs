//! [`RedisConnection`]: the store's one multiplexed, reconnecting connection, to one server or
//! to a Redis Cluster.

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::sentinel::SentinelConnection;

/// The store's connection, shared by every clone of the store: a multiplexed, automatically
/// reconnecting [`ConnectionManager`] to one server, or a
/// [`ClusterConnection`] that routes each command by its key's hash slot (following `MOVED` and
/// `ASK` redirections and topology changes). It implements
/// [`ConnectionLike`](redis::aio::ConnectionLike), so any `redis` command, pipeline or script
/// runs on it (for administration, baselines and tests).
///
/// Cancel safe: dropping a query future abandons only that query.
#[derive(Clone)]
pub struct RedisConnection {
    pub(crate) inner: Conn,
}

#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConnection),
}

impl RedisConnection {
    /// The group of `key` for batching: all keys of one group may go in one script. One group
    /// on a single server; on a cluster, the key's hash slot.
    pub(crate) fn group(&self, key: &str) -> Option<Slot> {
        match &self.inner {
            Conn::Single(_) | Conn::Sentinel(_) => None,
            Conn::Cluster(_) => Some(Slot::for_key(key)),
        }
    }

    /// Where a watch opens its pub/sub connection: the current master of a sentinel-managed
    /// group, or `None` (the store's own clients).
    pub(crate) fn current_client(&self) -> Option<redis::Client> {
        match &self.inner {
            Conn::Sentinel(c) => Some(c.client()),
            _ => None,
        }
    }

    /// Whether this is a cluster connection.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.inner, Conn::Cluster(_))
    }
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Conn::Single(_) => f.write_str("RedisConnection::Single"),
            Conn::Cluster(_) => f.write_str("RedisConnection::Cluster"),
            Conn::Sentinel(c) => write!(f, "RedisConnection::Sentinel({})", c.addr()),
        }
    }
}

impl redis::aio::ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.inner {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.inner {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}
