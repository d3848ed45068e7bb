//! Expiry is judged by the Redis server's wall clock (`PX`). A forward step of that clock expires
//! a lease early: the store grants the key to someone else while the holder, counting on its own
//! monotonic clock, still believes it holds it. This is a documented hole (ADR 0020), not a bug
//! this crate can close; the test shows that it happens and that fencing still rejects the old
//! holder.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseStore, OwnerId, RenewOutcome, WriteOp};
use leasehold_core::{FencedResource, WriteOutcome};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx};

use crate::cases::{acquire_on, store_at};
use crate::server::RedisServer;

/// A holds a key with a ten-minute TTL on a server whose wall clock is then stepped one hour
/// forward: B is granted at once (the early grant), with a greater token (the clock floor), while
/// A's own deadline is still ahead. The fenced resource (on the shared Redis, whose clock is
/// untouched) accepts B and rejects A's late writes; A's renewal is refused.
pub(crate) async fn a_forward_clock_step_expires_a_lease_early_and_fencing_holds(
    ctx: Ctx,
) -> CaseResult {
    let (server, clock) = RedisServer::start_with_fake_clock(&[]).await?;
    let store = store_at(&server.url(), "clock").await?;
    let res = ctx.resource();
    let key = ctx.key("clock-step");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = Duration::from_secs(600);

    let la = acquire_on(&store, &key, &a, ttl).await?;
    assert!(
        res.write(&key, la.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    // The control: with the server clock running normally, B is refused.
    let req_b = AcquireRequest::new(key.clone(), b.clone(), ttl);
    match store.acquire(&req_b).await? {
        AcquireOutcome::Held(h) if h.owner == a && h.token == la.token() => {}
        other => return Err(format!("before the step: expected Held by A, got {other:?}").into()),
    }

    // The server's wall clock jumps one hour forward (an NTP step, an operator's `date -s`).
    clock.step("+3600s")?;

    // The documented hole: B is granted long before A's TTL has run out on any real clock.
    let lb = match store.acquire(&req_b).await? {
        AcquireOutcome::Acquired(l) => l,
        AcquireOutcome::Held(h) => {
            return Err(format!(
                "after a one-hour forward step the lease (TTL {ttl:?}) should have expired at the \
                 server, but it is still held by {} (remaining {:?}): does expiry follow the \
                 faked clock?",
                h.owner, h.remaining
            )
            .into());
        }
    };
    assert!(
        la.is_valid() && lb.is_valid(),
        "A's local deadline is ten minutes away: both believe they hold the lease"
    );
    assert!(
        lb.token() > la.token(),
        "token went back: {} !> {}",
        lb.token(),
        la.token()
    );
    assert_eq!(store.renew(&la).await?, RenewOutcome::Lost);

    // Fencing keeps the data safe: B's write moves the high-water mark, A's late writes fail.
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
    assert_eq!((state.counter, state.high_water), (11, Some(lb.token())));
    Ok(())
}

/// This file's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![case!(
        "redis",
        a_forward_clock_step_expires_a_lease_early_and_fencing_holds
    )]
}
