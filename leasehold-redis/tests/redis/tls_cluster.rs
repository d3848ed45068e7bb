//! The whole leasehold-testkit suite against a Redis Cluster that speaks only TLS (3 masters, 3
//! replicas: `LEASE_REDIS_TLS_CLUSTER_URL`, started by `scripts/services/redis-tls-cluster.sh`):
//! the certificates given once in the URL reach every node the cluster client discovers.

#[allow(dead_code)]
mod cases;

use std::sync::Arc;

use leasehold_core::{FencedResource, LeaseStore};
use leasehold_redis::{RedisLeaseStore, RedisOptions};
use leasehold_testkit::{Backend, BoxFuture};

use cases::PREFIX;

/// The cluster's URL: `LEASE_REDIS_TLS_CLUSTER_URL`, default the service script's.
fn url() -> String {
    leasehold_testkit::stores::REDIS_TLS_CLUSTER_URL.get()
}

/// `rediss://host:port?<query>` of each node the URL lists.
fn node_urls() -> Vec<String> {
    let url = url();
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
    hosts
        .split(',')
        .map(|h| format!("rediss://{}?{query}", h.trim()))
        .collect()
}

async fn store() -> leasehold_core::Result<RedisLeaseStore> {
    RedisLeaseStore::connect_with(&url(), RedisOptions::default().with_prefix(PREFIX)).await
}

#[derive(Debug)]
struct TlsCluster;

impl Backend for TlsCluster {
    fn name(&self) -> &'static str {
        "redis-tls-cluster"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(store().await?.fenced_resource()) as Arc<dyn FencedResource>)
        })
    }

    /// Deletes the namespace's keys on every node (a replica refuses; its master does them).
    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            for node in node_urls() {
                if let Ok(one) = RedisLeaseStore::connect_with(
                    &node,
                    RedisOptions::default().with_prefix(PREFIX),
                )
                .await
                {
                    cases::delete_matching(&one, &one.layout().scan_pattern(namespace)).await;
                }
            }
        })
    }
}

fn main() {
    leasehold_testkit::run_with(TlsCluster, Vec::new());
}
