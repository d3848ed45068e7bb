//! `inspect_many` over more keys than one script carries (the store cuts batches of 256 keys per
//! script and, on a cluster, one script per hash slot): shared by the single-server and the
//! cluster targets.

use leasehold_core::{KeyState, OwnerId, ReleaseOutcome};
use leasehold_testkit::{CaseResult, Ctx};

fn stable(s: &KeyState) -> (String, Option<(OwnerId, u64)>, Option<u64>) {
    (
        s.key.as_str().to_string(),
        s.holder.as_ref().map(|h| (h.owner.clone(), h.token.get())),
        s.last_token.map(|t| t.get()),
    )
}

/// 1,100 keys (held by two owners, released, never used), then a few of them again out of order:
/// `inspect_many` answers exactly what `inspect` does, key by key and in input order.
pub(crate) async fn inspect_many_in_batches_matches_inspect(ctx: Ctx) -> CaseResult {
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.long_ttl();
    let mut keys = Vec::new();
    for i in 0..1100 {
        let key = ctx.key(&format!("batch-{i}"));
        match i % 4 {
            0 => {
                ctx.must_acquire(&key, &a, ttl).await?;
            }
            1 => {
                ctx.must_acquire(&key, &b, ttl).await?;
            }
            2 => {
                let l = ctx.must_acquire(&key, &a, ttl).await?;
                assert_eq!(ctx.store().release(&l).await?, ReleaseOutcome::Released);
            }
            _ => {}
        }
        keys.push(key);
    }
    for i in [1099, 0, 257, 0, 255, 256] {
        keys.push(keys[i].clone());
    }
    let many = ctx.store().inspect_many(&keys).await?;
    assert_eq!(many.len(), keys.len(), "one state per key");
    for (key, state) in keys.iter().zip(&many) {
        let one = ctx.store().inspect(key).await?;
        assert_eq!(stable(state), stable(&one), "{key}");
    }
    let held = many.iter().filter(|s| s.holder.is_some()).count();
    // 550 held keys, plus the repeated ones that are held (i % 4 is 0 or 1).
    let repeated_held = [1099, 0, 257, 0, 255, 256]
        .iter()
        .filter(|&&i| i % 4 < 2)
        .count();
    assert_eq!(held, 550 + repeated_held);
    let released = many
        .iter()
        .filter(|s| s.holder.is_none() && s.last_token.is_some())
        .count();
    assert_eq!(released, 275, "released keys keep their last token");
    Ok(())
}
