//! Bad input: typed errors, and nothing changes.

use std::time::Duration;

use leasehold_core::{
    AcquireRequest, Error, Lease, LeaseKey, MAX_TTL, OwnerId, ReleaseOutcome, RenewOutcome,
};

use super::Case;
use crate::{CaseResult, Ctx};

/// This file's cases, with the capabilities each needs.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!(
            "conformance",
            bad_input_is_a_typed_error_and_changes_nothing
        ),
        crate::case!("conformance", token_of_another_key_changes_nothing),
    ]
}

/// 11. Empty, oversized or illegal keys; zero, below-minimum or absurd TTLs: each a typed error,
///     and the store is unchanged.
pub async fn bad_input_is_a_typed_error_and_changes_nothing(ctx: Ctx) -> CaseResult {
    for bad in [
        "",
        "UPPER",
        "a/b",
        "-lead",
        "trail-",
        "a..b",
        "ünï",
        &"x".repeat(201),
    ] {
        match LeaseKey::new(bad) {
            Err(Error::InvalidKey { .. }) => {}
            other => return Err(format!("key {bad:?}: expected InvalidKey, got {other:?}").into()),
        }
    }
    for bad in ["", "has space", &"o".repeat(129)] {
        assert!(
            matches!(OwnerId::new(bad), Err(Error::InvalidOwner { .. })),
            "owner {bad:?}"
        );
    }

    let key = ctx.key("input");
    let a = OwnerId::with_label("a");
    let caps = ctx.store().capabilities();
    let mut bad_ttls = vec![
        Duration::ZERO,
        MAX_TTL + Duration::from_secs(1),
        Duration::from_secs(u64::MAX / 4),
    ];
    if caps.min_ttl > Duration::from_millis(1) {
        bad_ttls.push(caps.min_ttl - Duration::from_millis(1));
    }
    for ttl in bad_ttls {
        match ctx
            .store()
            .acquire(&AcquireRequest::new(key.clone(), a.clone(), ttl))
            .await
        {
            Err(Error::InvalidTtl { .. }) => {}
            other => return Err(format!("ttl {ttl:?}: expected InvalidTtl, got {other:?}").into()),
        }
    }
    let state = ctx.store().inspect(&key).await?;
    assert!(
        state.holder.is_none(),
        "a rejected acquire created a holder"
    );
    assert!(
        state.last_token.is_none(),
        "a rejected acquire issued a token"
    );

    // A held lease: renewing it with an invalid TTL is an error and changes nothing.
    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let bad = Lease::resume(key.clone(), a.clone(), lease.token(), Duration::ZERO);
    assert!(matches!(
        ctx.store().renew(&bad).await,
        Err(Error::InvalidTtl { .. })
    ));
    let s = ctx.store().inspect(&key).await?;
    assert_eq!(s.holder.map(|h| h.token), Some(lease.token()));
    Ok(())
}

/// 11b. A token that belongs to another key: renewing or releasing key A with key B's token is
///      refused and changes neither key.
pub async fn token_of_another_key_changes_nothing(ctx: Ctx) -> CaseResult {
    let (ka, kb) = (ctx.key("tok-a"), ctx.key("tok-b"));
    let a = OwnerId::with_label("a");
    let ttl = ctx.long_ttl();
    // Give the two keys different generations so the tokens differ on every backend.
    let la = ctx.must_acquire(&ka, &a, ttl).await?;
    let _ = ctx.must_acquire(&kb, &a, ttl).await?;
    let lb = ctx.must_acquire(&kb, &a, ttl).await?;
    assert_ne!(la.token(), lb.token());
    let mixed = Lease::resume(ka.clone(), a.clone(), lb.token(), ttl);
    assert_eq!(ctx.store().renew(&mixed).await?, RenewOutcome::Lost);
    assert_eq!(ctx.store().release(&mixed).await?, ReleaseOutcome::NotHeld);
    let sa = ctx
        .store()
        .inspect(&ka)
        .await?
        .holder
        .ok_or("key a was freed")?;
    let sb = ctx
        .store()
        .inspect(&kb)
        .await?
        .holder
        .ok_or("key b was freed")?;
    assert_eq!((sa.token, sb.token), (la.token(), lb.token()));
    Ok(())
}
