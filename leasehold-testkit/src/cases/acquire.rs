//! Acquisition: first grant, refusal naming the holder, same-owner re-acquire, independent keys,
//! watch wake-up.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, OwnerId};

use super::{Case, Need};
use crate::{CaseResult, Ctx};

/// This file's cases, with the capabilities each needs.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!("conformance", first_acquire_is_granted),
        crate::case!("conformance", other_owner_is_refused_and_told_the_holder),
        crate::case!("conformance", same_owner_reacquire_gets_a_greater_token),
        crate::case!("conformance", keys_are_independent),
        crate::case!("conformance", watch_agrees_with_capabilities),
        crate::case!("conformance", watch_wakes_on_release).needs(&[Need::Watch]),
    ]
}

/// 1. The first acquire of a fresh key is granted, with a local deadline within the TTL.
pub async fn first_acquire_is_granted(ctx: Ctx) -> CaseResult {
    let key = ctx.key("first");
    let owner = OwnerId::with_label("a");
    let ttl = ctx.long_ttl();
    let lease = ctx.must_acquire(&key, &owner, ttl).await?;
    assert_eq!(lease.key(), &key);
    assert_eq!(lease.owner(), &owner);
    assert!(
        lease.ttl() >= ttl,
        "granted ttl {:?} < requested {ttl:?}",
        lease.ttl()
    );
    assert!(lease.is_valid());
    assert!(lease.remaining() <= lease.ttl());
    Ok(())
}

/// 2. Another owner is refused while the lease is valid, and told who holds it with which token.
pub async fn other_owner_is_refused_and_told_the_holder(ctx: Ctx) -> CaseResult {
    let key = ctx.key("refused");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let other = ctx.other_client().await?;
    match other
        .acquire(&ctx.request(&key, &b, ctx.long_ttl()))
        .await?
    {
        AcquireOutcome::Held(h) => {
            assert_eq!(h.owner, a);
            assert_eq!(h.token, lease.token());
            assert!(
                h.remaining > Duration::ZERO && h.remaining <= h.ttl,
                "remaining {:?}",
                h.remaining
            );
        }
        AcquireOutcome::Acquired(l) => {
            return Err(format!("second owner was granted token {}", l.token()).into());
        }
    }
    let state = ctx.store().inspect(&key).await?;
    assert_eq!(
        state.holder.map(|h| h.owner),
        Some(a),
        "refused acquire changed the holder"
    );
    Ok(())
}

/// 3. The same owner acquiring a key it holds gets a new grant with a greater token; the old token
///    is stale from then on (renewing with it is refused).
pub async fn same_owner_reacquire_gets_a_greater_token(ctx: Ctx) -> CaseResult {
    let key = ctx.key("reacquire");
    let a = OwnerId::with_label("a");
    let first = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let second = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    assert!(
        second.token() > first.token(),
        "{} !> {}",
        second.token(),
        first.token()
    );
    assert!(
        matches!(
            ctx.store().renew(&first).await?,
            leasehold_core::RenewOutcome::Lost
        ),
        "the superseded token must not renew"
    );
    assert!(matches!(
        ctx.store().renew(&second).await?,
        leasehold_core::RenewOutcome::Renewed(_)
    ));
    Ok(())
}

/// 8. Keys are independent: holding one does not affect another.
pub async fn keys_are_independent(ctx: Ctx) -> CaseResult {
    let (k1, k2) = (ctx.key("one"), ctx.key("two"));
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let l1 = ctx.must_acquire(&k1, &a, ctx.long_ttl()).await?;
    let l2 = ctx.must_acquire(&k2, &b, ctx.long_ttl()).await?;
    assert_eq!(
        ctx.store().release(&l1).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    let s2 = ctx.store().inspect(&k2).await?;
    assert_eq!(
        s2.holder.map(|h| h.token),
        Some(l2.token()),
        "releasing k1 changed k2"
    );
    assert!(ctx.store().inspect(&k1).await?.holder.is_none());
    Ok(())
}

/// Watch and capabilities agree: `watch()` returns a watch exactly when the backend claims
/// [`watch`](leasehold_core::Capabilities::watch). Every backend runs this one.
pub async fn watch_agrees_with_capabilities(ctx: Ctx) -> CaseResult {
    let key = ctx.key("watch-caps");
    let watch = ctx.other_client().await?.watch(&key).await?;
    let claimed = ctx.store().capabilities().watch;
    match (watch.is_some(), claimed) {
        (true, true) | (false, false) => Ok(()),
        (false, true) => Err("capabilities claim watch, but watch() returned None".into()),
        (true, false) => Err("watch() returned a watch, but capabilities do not claim it".into()),
    }
}

/// Watch (needs [`Need::Watch`]): a watcher is woken when the holder releases, and another owner
/// then acquires.
pub async fn watch_wakes_on_release(ctx: Ctx) -> CaseResult {
    let key = ctx.key("watch");
    let a = OwnerId::with_label("a");
    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let other = ctx.other_client().await?;
    let mut watch = other
        .watch(&key)
        .await?
        .ok_or("the backend claims watch, but watch() returned None")?;
    assert_eq!(
        ctx.store().release(&lease).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    match tokio::time::timeout(Duration::from_secs(10), watch.changed()).await {
        Ok(Some(Ok(()))) => {}
        Ok(other) => return Err(format!("watch ended instead of signalling: {other:?}").into()),
        Err(_) => return Err("no watch signal within 10 s of the release".into()),
    }
    let b = OwnerId::with_label("b");
    ctx.must_acquire(&key, &b, ctx.long_ttl()).await?;
    Ok(())
}
