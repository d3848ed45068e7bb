//! A restart without persistence loses every key, the token counter included; tokens still go up.

use std::time::Duration;

use leasehold_core::{LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, TokenDurability};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx};

use crate::cases::{acquire_on, retry_within, store_at};
use crate::server::RedisServer;

/// A holds a lease on a server started by the test; the server is killed and started again empty
/// (no persistence). The counter is gone, yet B's token is greater than A's (clock floor), and A
/// can neither renew nor release.
pub(crate) async fn restart_without_persistence_keeps_tokens_increasing(ctx: Ctx) -> CaseResult {
    let mut server = RedisServer::start(&[]).await?;
    let store = store_at(&server.url(), "restart").await?;
    assert_eq!(
        store.capabilities().token_durability,
        TokenDurability::ClockFloored
    );
    let key = ctx.key("restart");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = Duration::from_millis(2500);

    // Several generations first, so that a counter-only token would be well above 1.
    for _ in 0..3 {
        let l = acquire_on(&store, &key, &a, ttl).await?;
        assert_eq!(store.release(&l).await?, ReleaseOutcome::Released);
    }
    let held = acquire_on(&store, &key, &a, ttl).await?;
    assert_eq!(store.inspect(&key).await?.last_token, Some(held.token()));

    server.restart().await?;

    // The same store reconnects by itself; the data, counter included, is gone.
    let state = retry_within(Duration::from_secs(10), || store.inspect(&key)).await?;
    assert!(
        state.holder.is_none(),
        "the holder survived a restart without persistence: {state:?}"
    );
    assert_eq!(
        state.last_token, None,
        "the counter survived a restart without persistence"
    );

    let next = acquire_on(&store, &key, &b, ttl).await?;
    assert!(
        next.token() > held.token(),
        "token went back after restart: {} !> {}",
        next.token(),
        held.token()
    );
    assert_eq!(store.renew(&held).await?, RenewOutcome::Lost);
    assert_eq!(store.release(&held).await?, ReleaseOutcome::NotHeld);
    assert_eq!(
        store.inspect(&key).await?.holder.map(|h| h.token),
        Some(next.token())
    );
    Ok(())
}

/// This file's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![case!(
        "redis",
        restart_without_persistence_keeps_tokens_increasing
    )]
}
