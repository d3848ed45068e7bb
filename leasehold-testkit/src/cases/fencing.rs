//! The stale owner is rejected by the fenced resource.

use leasehold_core::{OwnerId, WriteOp, WriteOutcome};

use super::Case;
use crate::{CaseResult, Ctx};

/// This file's cases, with the capabilities each needs.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!("conformance", stale_owner_is_rejected_by_the_resource),
        crate::case!(
            "conformance",
            installed_generation_rejects_the_old_owner_before_the_new_writes
        ),
    ]
}

/// 9a. A acquires, its lease expires, B acquires and writes through the fenced resource; A's
///     write with its old token is rejected with both tokens in the outcome.
pub async fn stale_owner_is_rejected_by_the_resource(ctx: Ctx) -> CaseResult {
    let key = ctx.key("stale");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.short_ttl();
    let res = ctx.resource();
    let la = ctx.must_acquire(&key, &a, ttl).await?;
    assert!(
        res.write(&key, la.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    let other = ctx.other_client().await?;
    let lb = ctx
        .acquire_within(&*other, &key, &b, ctx.long_ttl(), ctx.expiry_deadline(ttl))
        .await?;
    assert!(
        res.write(&key, lb.token(), WriteOp::Add(10))
            .await?
            .is_accepted()
    );
    let late = res.write(&key, la.token(), WriteOp::Add(100)).await?;
    assert_eq!(
        late,
        WriteOutcome::Rejected {
            presented: la.token(),
            high_water: lb.token()
        }
    );
    let state = res.read(&key).await?;
    assert_eq!(state.counter, 11, "the stale write changed the resource");
    assert_eq!(state.high_water, Some(lb.token()));
    // Several writes within one generation are fine.
    assert!(
        res.write(&key, lb.token(), WriteOp::Put(b"v".to_vec()))
            .await?
            .is_accepted()
    );
    assert_eq!(res.read(&key).await?.value.as_deref(), Some(&b"v"[..]));
    Ok(())
}

/// 9b. With the new generation installed before B starts, A is rejected even before B writes.
pub async fn installed_generation_rejects_the_old_owner_before_the_new_writes(
    ctx: Ctx,
) -> CaseResult {
    let key = ctx.key("install");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.short_ttl();
    let res = ctx.resource();
    let la = ctx.must_acquire(&key, &a, ttl).await?;
    assert!(res.install(&key, la.token()).await?.is_accepted());
    let other = ctx.other_client().await?;
    let lb = ctx
        .acquire_within(&*other, &key, &b, ctx.long_ttl(), ctx.expiry_deadline(ttl))
        .await?;
    assert!(res.install(&key, lb.token()).await?.is_accepted());
    let late = res.write(&key, la.token(), WriteOp::Add(1)).await?;
    assert_eq!(
        late,
        WriteOutcome::Rejected {
            presented: la.token(),
            high_water: lb.token()
        }
    );
    assert_eq!(res.read(&key).await?.counter, 0);
    // Installing an older generation again is rejected too.
    let again = res.install(&key, la.token()).await?;
    assert!(
        !again.is_accepted(),
        "installing an older generation was accepted"
    );
    assert!(
        res.write(&key, lb.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert_eq!(res.read(&key).await?.counter, 1);
    Ok(())
}
