//! The stale owner is rejected by the fenced resource.

use std::sync::Arc;

use leasehold_core::{
    FencedResource, FencingToken, LeaseKey, OwnerId, ReleaseOutcome, WriteOp, WriteOutcome,
};

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
        crate::case!(
            "conformance",
            concurrent_writes_are_neither_lost_nor_let_the_mark_go_back
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

/// How many writes each concurrent writer of [`concurrent_writes_are_neither_lost_nor_let_the_mark_go_back`]
/// makes, and how many writers there are per generation.
const RACE_WRITES: usize = 6;
const RACE_WRITERS: usize = 3;

/// 9c. Two generations of one key write through two independent handles of the resource at
///     once, several writers each. A resource that checks the mark and writes in two steps
///     without making them one atomic step (a read-modify-write without a version condition)
///     loses updates and lets a write of the older generation put its mark back over the newer
///     one; this case sees both. Afterwards the counter is the sum of the accepted adds (give or
///     take writes whose outcome is unknown: an error may have landed), the mark is the newer
///     generation, and the older generation is rejected.
pub async fn concurrent_writes_are_neither_lost_nor_let_the_mark_go_back(ctx: Ctx) -> CaseResult {
    let key = ctx.key("race");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let la = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    assert_eq!(ctx.store().release(&la).await?, ReleaseOutcome::Released);
    let lb = ctx.must_acquire(&key, &b, ctx.long_ttl()).await?;
    let (old, new) = (la.token(), lb.token());
    assert!(
        new > old,
        "the second grant's token {new} is not above {old}"
    );
    let first = ctx.resource().clone();
    let second = ctx.backend().resource().await?;
    let mut writers = tokio::task::JoinSet::new();
    for i in 0..RACE_WRITERS * 2 {
        let res = if i % 2 == 0 {
            first.clone()
        } else {
            second.clone()
        };
        // Half the writers write with the older generation; the first write of the newer one
        // goes in as soon as the race starts.
        let token = if i < RACE_WRITERS { old } else { new };
        writers.spawn(race_writer(res, key.clone(), token));
    }
    let (mut accepted, mut unknown) = (0i64, 0i64);
    let mut new_accepted = false;
    while let Some(joined) = writers.join_next().await {
        let (token, acc, unk) = joined.map_err(|e| format!("a writer task failed: {e}"))?;
        accepted += acc;
        unknown += unk;
        new_accepted |= token == new && acc > 0;
    }
    assert!(
        new_accepted,
        "no write of the newer generation {new} was accepted"
    );
    let state = ctx.resource().read(&key).await?;
    assert!(
        state.counter >= accepted && state.counter <= accepted + unknown,
        "the resource counts {} but {accepted} adds were accepted ({unknown} with an unknown \
         outcome): accepted writes were lost",
        state.counter
    );
    assert_eq!(
        state.high_water,
        Some(new),
        "the mark went back from {new} to {:?} under concurrent writes",
        state.high_water
    );
    let late = ctx.resource().write(&key, old, WriteOp::Add(1)).await?;
    assert!(
        !late.is_accepted(),
        "a write of {old} was accepted after {new}'s"
    );
    Ok(())
}

/// Writes `Add(1)` with `token` [`RACE_WRITES`] times; returns the token and how many writes were
/// accepted and how many ended in an error (outcome unknown).
async fn race_writer(
    res: Arc<dyn FencedResource>,
    key: LeaseKey,
    token: FencingToken,
) -> (FencingToken, i64, i64) {
    let (mut accepted, mut unknown) = (0, 0);
    for _ in 0..RACE_WRITES {
        match res.write(&key, token, WriteOp::Add(1)).await {
            Ok(out) if out.is_accepted() => accepted += 1,
            Ok(_) => {}
            Err(_) => unknown += 1,
        }
    }
    (token, accepted, unknown)
}
