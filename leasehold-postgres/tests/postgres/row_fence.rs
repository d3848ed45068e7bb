//! The shared fencing and contention cases, unchanged, against the lease-row fenced resource.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{FencedResource, LeaseStore};
use leasehold_postgres::LeaseRowFence;
use leasehold_testkit::cases::Case;
use leasehold_testkit::cases::{contention, fencing};
use leasehold_testkit::{Backend, BoxFuture, CaseResult, Ctx, case};

use super::store;

/// The same store, with [`LeaseRowFence`] as the resource.
#[derive(Debug)]
struct LeaseRow;

impl Backend for LeaseRow {
    fn name(&self) -> &'static str {
        "postgres-lease-row"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(LeaseRowFence::new(store().await?)) as Arc<dyn FencedResource>)
        })
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_millis(2000)
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = store().await {
                let _ = store.delete_prefix(namespace).await;
            }
        })
    }
}

async fn with_lease_row<F, Fut>(case: F) -> CaseResult
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = CaseResult>,
{
    let backend: Arc<dyn Backend> = Arc::new(LeaseRow);
    let ctx = Ctx::new(backend.clone()).await?;
    let ns = ctx.namespace().to_string();
    let out = case(ctx).await;
    backend.cleanup(&ns).await;
    out
}

/// `fencing::stale_owner_is_rejected_by_the_resource` with the lease-row fence.
pub(crate) async fn lease_row_fence_rejects_the_stale_owner(_ctx: Ctx) -> CaseResult {
    with_lease_row(fencing::stale_owner_is_rejected_by_the_resource).await
}

/// `fencing::installed_generation_rejects_the_old_owner_before_the_new_writes` with the
/// lease-row fence.
pub(crate) async fn lease_row_fence_installed_generation_rejects_the_old_owner(
    _ctx: Ctx,
) -> CaseResult {
    with_lease_row(fencing::installed_generation_rejects_the_old_owner_before_the_new_writes).await
}

/// `contention::contention_gives_exact_count_and_legal_history` with the lease-row fence.
pub(crate) async fn lease_row_fence_contention_gives_exact_count(_ctx: Ctx) -> CaseResult {
    with_lease_row(contention::contention_gives_exact_count_and_legal_history).await
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("postgres", lease_row_fence_rejects_the_stale_owner),
        case!(
            "postgres",
            lease_row_fence_installed_generation_rejects_the_old_owner
        ),
        case!("postgres", lease_row_fence_contention_gives_exact_count),
    ]
}
