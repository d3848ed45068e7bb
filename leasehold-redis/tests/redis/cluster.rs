//! The whole leasehold-testkit suite against a real Redis Cluster of 3 masters and 3 replicas
//! (`LEASE_TEST_REDIS_CLUSTER_URL`, started by `scripts/services/redis-cluster.sh`), plus a
//! `renew_many` across many hash slots (and so across every master).

mod cluster_common;
mod many;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{FencedResource, LeaseStore, OwnerId, RenewOutcome};
use leasehold_testkit::{Backend, BoxFuture, CaseResult, Ctx, case};

#[derive(Debug)]
struct Cluster;

impl Backend for Cluster {
    fn name(&self) -> &'static str {
        "redis-cluster"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(cluster_common::store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(cluster_common::store().await?.fenced_resource())
                as Arc<dyn FencedResource>)
        })
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = cluster_common::store().await {
                cluster_common::delete_matching(&store.layout().scan_pattern(namespace)).await;
            }
        })
    }
}

/// 64 leases, whose keys fall in (almost certainly) 64 different hash slots spread over the
/// three masters, renewed in one `renew_many`: every one is renewed, and a released one is lost.
async fn renew_many_spans_every_master(ctx: Ctx) -> CaseResult {
    let store = ctx.store();
    let owner = OwnerId::with_label("many");
    let mut leases = Vec::new();
    for i in 0..64 {
        let key = ctx.key(&format!("many-{i}"));
        leases.push(
            ctx.must_acquire(&key, &owner, Duration::from_secs(30))
                .await?,
        );
    }
    let out = store.renew_many(&leases).await?;
    assert_eq!(out.len(), leases.len());
    for (lease, r) in leases.iter().zip(&out) {
        assert!(
            matches!(r, Ok(RenewOutcome::Renewed(_))),
            "{}: {r:?}",
            lease.key()
        );
    }
    let _ = store.release(&leases[5]).await?;
    let out = store.renew_many(&leases).await?;
    assert!(matches!(out[5], Ok(RenewOutcome::Lost)), "{:?}", out[5]);
    assert!(
        matches!(out[6], Ok(RenewOutcome::Renewed(_))),
        "{:?}",
        out[6]
    );
    Ok(())
}

fn main() {
    leasehold_testkit::run_with(
        Cluster,
        vec![
            case!("redis_cluster", renew_many_spans_every_master),
            case!(
                "redis_cluster",
                many::inspect_many_in_batches_matches_inspect
            ),
        ],
    );
}
