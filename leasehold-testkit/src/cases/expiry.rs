//! Expiry and token monotonicity.

use leasehold_core::{OwnerId, ReleaseOutcome, RenewOutcome};

use super::Case;
use crate::{CaseResult, Ctx};

/// This file's cases, with the capabilities each needs.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!(
            "conformance",
            after_expiry_another_owner_takes_over_without_revival
        ),
        crate::case!(
            "conformance",
            tokens_increase_across_release_expiry_and_reacquire
        ),
    ]
}

/// 6. After expiry another owner acquires with a greater token; the old holder's renew is refused
///    (no revival) and its release does not free the new holder.
pub async fn after_expiry_another_owner_takes_over_without_revival(ctx: Ctx) -> CaseResult {
    let key = ctx.key("expiry");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.short_ttl();
    let old = ctx.must_acquire(&key, &a, ttl).await?;
    let other = ctx.other_client().await?;
    let new = ctx
        .acquire_within(&*other, &key, &b, ctx.long_ttl(), ctx.expiry_deadline(ttl))
        .await?;
    assert!(
        new.token() > old.token(),
        "takeover token {} !> {}",
        new.token(),
        old.token()
    );
    assert!(
        !old.is_valid(),
        "the store granted the key to another owner before the old holder's local deadline"
    );
    assert_eq!(
        ctx.store().renew(&old).await?,
        RenewOutcome::Lost,
        "an expired lease was revived"
    );
    assert_eq!(ctx.store().release(&old).await?, ReleaseOutcome::NotHeld);
    let s = ctx.store().inspect(&key).await?;
    assert_eq!(s.holder.map(|h| (h.owner, h.token)), Some((b, new.token())));
    Ok(())
}

/// 7. Tokens strictly increase across acquire-release-acquire, acquire-expiry-acquire, and the
///    same owner re-acquiring.
pub async fn tokens_increase_across_release_expiry_and_reacquire(ctx: Ctx) -> CaseResult {
    let key = ctx.key("tokens");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.short_ttl();
    let mut tokens = Vec::new();

    let l1 = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    tokens.push(l1.token());
    assert_eq!(ctx.store().release(&l1).await?, ReleaseOutcome::Released);
    let l2 = ctx.must_acquire(&key, &b, ttl).await?;
    tokens.push(l2.token());
    let l3 = ctx
        .acquire_within(&**ctx.store(), &key, &a, ttl, ctx.expiry_deadline(ttl))
        .await?;
    tokens.push(l3.token());
    let l4 = ctx.must_acquire(&key, &a, ttl).await?;
    tokens.push(l4.token());
    assert_eq!(ctx.store().release(&l4).await?, ReleaseOutcome::Released);
    let l5 = ctx.must_acquire(&key, &a, ttl).await?;
    tokens.push(l5.token());
    for w in tokens.windows(2) {
        assert!(w[1] > w[0], "tokens did not strictly increase: {tokens:?}");
    }
    Ok(())
}
