//! Release and inspect.

use leasehold_core::{KeyState, Lease, LeaseKey, OwnerId, ReleaseOutcome, RenewOutcome};

use super::Case;
use crate::{CaseResult, Ctx};

/// This file's cases, with the capabilities each needs.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!("conformance", release_by_holder_frees_the_key),
        crate::case!(
            "conformance",
            release_with_wrong_owner_or_token_changes_nothing
        ),
        crate::case!("conformance", inspect_agrees_with_grant_renew_and_release),
        crate::case!("conformance", inspect_many_matches_inspect),
    ]
}

/// 5a. Release by the holder frees the key; another owner acquires at once with a greater token.
pub async fn release_by_holder_frees_the_key(ctx: Ctx) -> CaseResult {
    let key = ctx.key("release");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    assert_eq!(ctx.store().release(&lease).await?, ReleaseOutcome::Released);
    assert!(ctx.store().inspect(&key).await?.holder.is_none());
    let next = ctx.must_acquire(&key, &b, ctx.long_ttl()).await?;
    assert!(next.token() > lease.token());
    // A second release of the old lease is refused and does not free the new holder.
    assert_eq!(ctx.store().release(&lease).await?, ReleaseOutcome::NotHeld);
    assert_eq!(ctx.store().renew(&lease).await?, RenewOutcome::Lost);
    assert_eq!(
        ctx.store().inspect(&key).await?.holder.map(|h| h.token),
        Some(next.token())
    );
    Ok(())
}

/// 5b. Release with a wrong owner or token changes nothing.
pub async fn release_with_wrong_owner_or_token_changes_nothing(ctx: Ctx) -> CaseResult {
    let key = ctx.key("release-wrong");
    let a = OwnerId::with_label("a");
    let ttl = ctx.long_ttl();
    let lease = ctx.must_acquire(&key, &a, ttl).await?;
    let wrong_owner = Lease::resume(key.clone(), OwnerId::with_label("b"), lease.token(), ttl);
    assert_eq!(
        ctx.store().release(&wrong_owner).await?,
        ReleaseOutcome::NotHeld
    );
    let wrong_token = Lease::resume(key.clone(), a.clone(), lease.token().next()?, ttl);
    assert_eq!(
        ctx.store().release(&wrong_token).await?,
        ReleaseOutcome::NotHeld
    );
    let state = ctx.store().inspect(&key).await?;
    assert_eq!(
        state.holder.map(|h| (h.owner, h.token)),
        Some((a, lease.token()))
    );
    assert!(matches!(
        ctx.store().renew(&lease).await?,
        RenewOutcome::Renewed(_)
    ));
    Ok(())
}

/// 12. Inspect agrees with the last grant, renew and release.
pub async fn inspect_agrees_with_grant_renew_and_release(ctx: Ctx) -> CaseResult {
    let key = ctx.key("inspect");
    let a = OwnerId::with_label("a");
    let fresh = ctx.store().inspect(&key).await?;
    assert_eq!(fresh.key, key);
    assert!(fresh.holder.is_none(), "a fresh key has no holder");
    let ttl = ctx.long_ttl();
    let lease = ctx.must_acquire(&key, &a, ttl).await?;
    let s = ctx.store().inspect(&key).await?;
    let h = s
        .holder
        .clone()
        .ok_or("inspect shows no holder after a grant")?;
    assert_eq!((h.owner.clone(), h.token), (a.clone(), lease.token()));
    assert!(
        h.remaining <= h.ttl && h.ttl >= ttl,
        "remaining {:?}, ttl {:?}",
        h.remaining,
        h.ttl
    );
    if let Some(last) = s.last_token {
        assert_eq!(last, lease.token(), "last_token must be the last grant's");
    }
    let RenewOutcome::Renewed(lease) = ctx.store().renew(&lease).await? else {
        return Err("renew refused".into());
    };
    let h2 = ctx
        .store()
        .inspect(&key)
        .await?
        .holder
        .ok_or("no holder after renew")?;
    assert_eq!(h2.token, lease.token());
    assert_eq!(ctx.store().release(&lease).await?, ReleaseOutcome::Released);
    let s3 = ctx.store().inspect(&key).await?;
    assert!(s3.holder.is_none(), "inspect shows a holder after release");
    if let Some(last) = s3.last_token {
        assert_eq!(last, lease.token(), "release must keep the generation");
    }
    Ok(())
}

/// What of a [`KeyState`] two reads of an unchanged key agree on exactly (the time left moves).
fn stable(s: &KeyState) -> (LeaseKey, Option<(OwnerId, u64)>, Option<u64>) {
    (
        s.key.clone(),
        s.holder.as_ref().map(|h| (h.owner.clone(), h.token.get())),
        s.last_token.map(|t| t.get()),
    )
}

/// Batched inspect: `inspect_many` reports, key by key and in input order, what `inspect` does
/// (held, released, expired and never-used keys, a key given twice, an empty batch, and a batch
/// larger than a page of the backends that read in pages), and `holders_many` the same holders.
pub async fn inspect_many_matches_inspect(ctx: Ctx) -> CaseResult {
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.long_ttl();
    assert!(ctx.store().inspect_many(&[]).await?.is_empty());
    // One key that expires: inspect and inspect_many must both see it free afterwards.
    let expiring = ctx.key("many-expiring");
    let short = ctx.must_acquire(&expiring, &a, ctx.short_ttl()).await?;
    let mut keys = Vec::new();
    for i in 0..150 {
        let key = ctx.key(&format!("many-{i}"));
        match i % 5 {
            0 => {
                ctx.must_acquire(&key, &a, ttl).await?;
            }
            1 => {
                ctx.must_acquire(&key, &b, ttl).await?;
            }
            2 if i % 3 == 0 => {
                let l = ctx.must_acquire(&key, &a, ttl).await?;
                assert_eq!(ctx.store().release(&l).await?, ReleaseOutcome::Released);
            }
            _ => {}
        }
        keys.push(key);
    }
    ctx.wait_free(&expiring, ctx.expiry_deadline(short.ttl()))
        .await?;
    keys.push(expiring);
    // A key given twice, out of order.
    keys.push(keys[5].clone());
    keys.push(keys[0].clone());
    let many = ctx.store().inspect_many(&keys).await?;
    assert_eq!(many.len(), keys.len(), "one state per key");
    for (key, state) in keys.iter().zip(&many) {
        let one = ctx.store().inspect(key).await?;
        assert_eq!(
            stable(state),
            stable(&one),
            "inspect_many and inspect disagree on {key}"
        );
        if let Some(h) = &state.holder {
            assert!(
                h.remaining <= h.ttl && h.ttl >= ttl,
                "{key}: remaining {:?}, ttl {:?}",
                h.remaining,
                h.ttl
            );
        }
    }
    let held = many.iter().filter(|s| s.holder.is_some()).count();
    assert_eq!(
        held,
        60 + 2,
        "30 keys of each owner, two of them asked twice"
    );
    // holders_many: the same holders, without the time left.
    let holders = ctx.store().holders_many(&keys).await?;
    assert_eq!(holders.len(), keys.len(), "one holder per key");
    for ((key, state), h) in keys.iter().zip(&many).zip(&holders) {
        assert_eq!(
            h.as_ref().map(|h| (h.owner.clone(), h.token)),
            state.holder.as_ref().map(|s| (s.owner.clone(), s.token)),
            "holders_many and inspect_many disagree on {key}"
        );
    }
    assert!(ctx.store().holders_many(&[]).await?.is_empty());
    Ok(())
}
