//! Renewal.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, AcquireRequest, FencingToken, Lease, OwnerId, RenewOutcome};

use super::Case;
use crate::{CaseResult, Ctx};

/// This file's cases, with the capabilities each needs.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!("conformance", renew_by_holder_extends),
        crate::case!(
            "conformance",
            renew_with_wrong_owner_or_token_changes_nothing
        ),
        crate::case!("conformance", renew_many_matches_renew),
        crate::case!("conformance", renew_many_over_many_leases_of_two_owners),
        crate::case!(
            "conformance",
            renew_after_expiry_is_lost_and_revives_nothing
        ),
    ]
}

/// 4a. Renew by the holder extends the lease: it outlives its original TTL.
pub async fn renew_by_holder_extends(ctx: Ctx) -> CaseResult {
    let key = ctx.key("renew");
    let a = OwnerId::with_label("a");
    let ttl = ctx.short_ttl();
    let mut lease = ctx.must_acquire(&key, &a, ttl).await?;
    let first_deadline = lease.deadline();
    // Renew at a third of the TTL for two whole TTLs; the lease must stay ours throughout.
    let end = tokio::time::Instant::now() + ttl * 2;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(ttl / 3).await;
        match ctx.store().renew(&lease).await? {
            RenewOutcome::Renewed(next) => {
                assert_eq!(next.token(), lease.token(), "renew must keep the token");
                assert!(
                    next.deadline() >= lease.deadline(),
                    "renew moved the deadline back"
                );
                lease = next;
            }
            RenewOutcome::Lost => return Err("renew by the holder was refused".into()),
        }
    }
    assert!(
        lease.deadline() > first_deadline + ttl,
        "deadline did not move forward"
    );
    let state = ctx.store().inspect(&key).await?;
    let holder = state
        .holder
        .ok_or("renewed lease is not held after two TTLs")?;
    assert_eq!(holder.token, lease.token());
    Ok(())
}

/// 4b. Renew with a wrong owner or a wrong token is refused and changes nothing.
pub async fn renew_with_wrong_owner_or_token_changes_nothing(ctx: Ctx) -> CaseResult {
    let key = ctx.key("renew-wrong");
    let a = OwnerId::with_label("a");
    let ttl = ctx.short_ttl();
    let lease = ctx.must_acquire(&key, &a, ttl).await?;
    let before = ctx.store().inspect(&key).await?.holder.ok_or("not held")?;

    let wrong_owner = Lease::resume(key.clone(), OwnerId::with_label("b"), lease.token(), ttl);
    assert_eq!(ctx.store().renew(&wrong_owner).await?, RenewOutcome::Lost);
    let wrong_token = Lease::resume(key.clone(), a.clone(), lease.token().next()?, ttl);
    assert_eq!(ctx.store().renew(&wrong_token).await?, RenewOutcome::Lost);
    let low = if lease.token() > FencingToken::MIN {
        FencingToken::new(lease.token().get() - 1)?
    } else {
        lease.token().next()?.next()?
    };
    let lower_token = Lease::resume(key.clone(), a.clone(), low, ttl);
    assert_eq!(ctx.store().renew(&lower_token).await?, RenewOutcome::Lost);

    let after = ctx
        .store()
        .inspect(&key)
        .await?
        .holder
        .ok_or("refused renew freed the key")?;
    assert_eq!(
        (after.owner.clone(), after.token),
        (before.owner, before.token)
    );
    assert!(
        after.remaining <= before.remaining + Duration::from_millis(50),
        "a refused renew extended the lease"
    );
    // And the refused renews did not keep the lease alive: it expires on time.
    ctx.wait_free(&key, ctx.expiry_deadline(ttl)).await?;
    Ok(())
}

/// Batched renewal: `renew_many` gives, slot by slot, exactly what `renew` would, in input order,
/// and changes nothing for refused or invalid slots.
pub async fn renew_many_matches_renew(ctx: Ctx) -> CaseResult {
    let a = OwnerId::with_label("a");
    let ttl = ctx.short_ttl();
    let (k1, k2, k3) = (ctx.key("batch-1"), ctx.key("batch-2"), ctx.key("batch-3"));
    let l1 = ctx.must_acquire(&k1, &a, ttl).await?;
    let l2 = ctx.must_acquire(&k2, &a, ttl).await?;
    let l3 = ctx.must_acquire(&k3, &a, ctx.long_ttl()).await?;
    let stale = Lease::resume(k3.clone(), a.clone(), l3.token().next()?, ttl);
    let invalid = Lease::resume(k2.clone(), a.clone(), l2.token(), Duration::ZERO);
    let out = ctx
        .store()
        .renew_many(&[l1.clone(), stale, l2.clone(), invalid])
        .await?;
    assert_eq!(out.len(), 4, "one outcome per lease");
    match (&out[0], &out[1], &out[2], &out[3]) {
        (
            Ok(RenewOutcome::Renewed(r1)),
            Ok(RenewOutcome::Lost),
            Ok(RenewOutcome::Renewed(r2)),
            Err(leasehold_core::Error::InvalidTtl { .. }),
        ) => {
            assert_eq!((r1.token(), r2.token()), (l1.token(), l2.token()));
            assert_eq!(r1.key(), &k1);
            assert_eq!(r2.key(), &k2);
        }
        other => return Err(format!("unexpected batch outcomes: {other:?}").into()),
    }
    let h3 = ctx
        .store()
        .inspect(&k3)
        .await?
        .holder
        .ok_or("refused slot freed its key")?;
    assert_eq!(h3.token, l3.token());
    // An empty batch is fine.
    assert!(ctx.store().renew_many(&[]).await?.is_empty());
    // Renewed through the batch, the short leases outlive their first TTL.
    tokio::time::sleep(ttl / 2).await;
    let again = ctx.store().renew_many(&[l1.clone(), l2.clone()]).await?;
    assert!(
        again
            .iter()
            .all(|r| matches!(r, Ok(RenewOutcome::Renewed(_)))),
        "{again:?}"
    );
    tokio::time::sleep(ttl * 3 / 4).await;
    assert_eq!(
        ctx.store().inspect(&k1).await?.holder.map(|h| h.token),
        Some(l1.token()),
        "batched renewal did not extend"
    );
    Ok(())
}

/// How many keys each of the two owners of [`renew_many_over_many_leases_of_two_owners`] holds:
/// more than one statement's worth on the stores that renew in chunks.
pub const MANY_RENEWALS: usize = 300;

/// A batch as a worker sends it, at scale: the leases of two owners interleaved, with stale
/// tokens, a wrong owner, a released lease and an invalid TTL among them. Each slot is what
/// `renew` would give; the refused slots change nothing; every key keeps its holder and token.
pub async fn renew_many_over_many_leases_of_two_owners(ctx: Ctx) -> CaseResult {
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.long_ttl();
    let mut held = Vec::new();
    for (owner, name) in [(&a, "a"), (&b, "b")] {
        let reqs: Vec<AcquireRequest> = (0..MANY_RENEWALS)
            .map(|i| ctx.request(&ctx.key(&format!("many-{name}-{i:03}")), owner, ttl))
            .collect();
        for (req, out) in reqs.iter().zip(ctx.store().acquire_many(&reqs).await?) {
            match out? {
                AcquireOutcome::Acquired(lease) => held.push(lease),
                AcquireOutcome::Held(h) => {
                    return Err(format!("{}: a fresh key is held by {}", req.key, h.owner).into());
                }
            }
        }
    }
    // A lease that expires before the batch: lost, and revived by nothing.
    let expiring = ctx.key("many-expiring");
    let short = ctx.short_ttl();
    let expired = ctx.must_acquire(&expiring, &a, short).await?;
    ctx.wait_free(&expiring, ctx.expiry_deadline(short)).await?;
    let released = held[7].clone();
    assert_eq!(
        ctx.store().release(&released).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    // Interleave the owners' leases (a0, b0, a1, b1, ..) and slip the refusals in between.
    let (of_a, of_b) = held.split_at(MANY_RENEWALS);
    let mut batch = Vec::new();
    let mut want = Vec::new();
    for (i, (la, lb)) in of_a.iter().zip(of_b).enumerate() {
        batch.push(la.clone());
        want.push(la.key() != released.key());
        batch.push(lb.clone());
        want.push(true);
        if i % 25 == 3 {
            let stale = Lease::resume(la.key().clone(), a.clone(), la.token().next()?, ttl);
            batch.push(stale);
            want.push(false);
            let wrong = Lease::resume(lb.key().clone(), a.clone(), lb.token(), ttl);
            batch.push(wrong);
            want.push(false);
        }
    }
    let at = batch.len() / 3;
    batch.insert(at, expired);
    want.insert(at, false);
    let invalid = Lease::resume(
        of_a[0].key().clone(),
        a.clone(),
        of_a[0].token(),
        Duration::ZERO,
    );
    batch.insert(batch.len() / 2, invalid);
    let out = ctx.store().renew_many(&batch).await?;
    assert_eq!(out.len(), batch.len(), "one outcome per lease");
    let mut want = want.into_iter();
    for (lease, slot) in batch.iter().zip(&out) {
        if lease.ttl().is_zero() {
            assert!(
                matches!(slot, Err(leasehold_core::Error::InvalidTtl { .. })),
                "{}: a zero TTL: {slot:?}",
                lease.key()
            );
            continue;
        }
        let renewed = want.next().ok_or("more outcomes than expected")?;
        match slot {
            Ok(RenewOutcome::Renewed(r)) if renewed => {
                assert_eq!(
                    (r.key(), r.owner(), r.token()),
                    (lease.key(), lease.owner(), lease.token())
                );
            }
            Ok(RenewOutcome::Lost) if !renewed => {}
            other => {
                return Err(format!(
                    "{} of {} with token {}: expected {}, got {other:?}",
                    lease.key(),
                    lease.owner(),
                    lease.token(),
                    if renewed { "renewed" } else { "lost" }
                )
                .into());
            }
        }
    }
    assert_eq!(
        ctx.store()
            .inspect(&expiring)
            .await?
            .holder
            .map(|h| h.token),
        None,
        "a batched renewal revived an expired lease"
    );
    // Nothing changed hands: the released key stays free, every other key keeps its holder.
    let keys: Vec<_> = held.iter().map(|l| l.key().clone()).collect();
    for (lease, h) in held.iter().zip(ctx.store().holders_many(&keys).await?) {
        let now = h.map(|h| (h.owner, h.token));
        if lease.key() == released.key() {
            assert_eq!(now, None, "a renewal revived the released key");
        } else {
            assert_eq!(
                now,
                Some((lease.owner().clone(), lease.token())),
                "{}",
                lease.key()
            );
        }
    }
    Ok(())
}

/// 4c. A renewal sent after the store has judged the lease expired is [`RenewOutcome::Lost`],
/// even though nobody took the key over meanwhile, and it revives nothing: the key stays free
/// and another owner acquires it at once with a greater token. (The contract: an expired lease
/// is never revived. A store that renewed it would hand the old holder a new deadline for a
/// lease that every other client has already seen end.)
pub async fn renew_after_expiry_is_lost_and_revives_nothing(ctx: Ctx) -> CaseResult {
    let key = ctx.key("renew-expired");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.short_ttl();
    let lease = ctx.must_acquire(&key, &a, ttl).await?;
    // Deadline-bounded: the store itself says the key is free (expired, not taken over).
    ctx.wait_free(&key, ctx.expiry_deadline(ttl)).await?;
    assert_eq!(
        ctx.store().renew(&lease).await?,
        RenewOutcome::Lost,
        "a lease renewed after the store judged it expired was revived"
    );
    let batch = ctx.store().renew_many(std::slice::from_ref(&lease)).await?;
    assert!(
        matches!(batch.as_slice(), [Ok(RenewOutcome::Lost)]),
        "renew_many revived an expired lease: {batch:?}"
    );
    let state = ctx.store().inspect(&key).await?;
    assert!(
        state.holder.is_none(),
        "the refused renewals left a holder: {:?}",
        state.holder
    );
    let next = ctx.must_acquire(&key, &b, ttl).await?;
    assert!(
        next.token() > lease.token(),
        "takeover token {} !> {}",
        next.token(),
        lease.token()
    );
    Ok(())
}
