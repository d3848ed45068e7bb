//! The fenced resource of a store with a name prefix: its ConfigMaps are its own.

use leasehold_core::{FencedResource, LeaseStore, OwnerId, WriteOp, WriteOutcome};
use leasehold_k8s::{K8sLeaseStore, K8sOptions};
use leasehold_testkit::{CaseResult, Ctx};

use super::env;

async fn prefixed(prefix: &str) -> leasehold_core::Result<K8sLeaseStore> {
    K8sLeaseStore::from_client(
        env::client().await?,
        K8sOptions::default()
            .with_namespace(env::namespace())
            .with_name_prefix(prefix),
    )
}

/// Two stores with different prefixes in one namespace hold the same key name as two Leases;
/// their fenced resources keep two high-water marks. B is granted first, A after (so A's token is
/// greater); A's fenced write must not reject B's, which belongs to another resource.
pub(crate) async fn prefixes_keep_separate_fence_marks(ctx: Ctx) -> CaseResult {
    let key = ctx.key("k");
    let (a, b) = (
        prefixed(&format!("{}-a.", ctx.namespace())).await?,
        prefixed(&format!("{}-b.", ctx.namespace())).await?,
    );
    let owner = OwnerId::with_label("w");
    let lease_b = ctx
        .must_acquire_with(&b, &key, &owner, ctx.long_ttl())
        .await?;
    let lease_a = ctx
        .must_acquire_with(&a, &key, &owner, ctx.long_ttl())
        .await?;
    assert!(lease_a.token() > lease_b.token());
    let (res_a, res_b) = (a.fenced_resource(), b.fenced_resource());
    let out = res_a.write(&key, lease_a.token(), WriteOp::Add(1)).await?;
    assert!(out.is_accepted(), "{out:?}");
    let out = res_b.write(&key, lease_b.token(), WriteOp::Add(1)).await?;
    assert!(
        matches!(out, WriteOutcome::Accepted { .. }),
        "store B's fenced write was judged by store A's mark: {out:?}"
    );
    assert_eq!(res_a.read(&key).await?.high_water, Some(lease_a.token()));
    assert_eq!(res_b.read(&key).await?.high_water, Some(lease_b.token()));
    let _ = a.release(&lease_a).await?;
    let _ = b.release(&lease_b).await?;
    Ok(())
}
