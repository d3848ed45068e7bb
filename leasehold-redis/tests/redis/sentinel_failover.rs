//! A coordinated failover of a Redis Sentinel group under a holder (`SENTINEL FAILOVER`), in a
//! target of its own so that no other test runs against the group while its master moves. Needs
//! the group of `scripts/services/redis-sentinel.sh` (`LEASE_REDIS_SENTINEL_URL`); an unreachable
//! group fails the test. Leaves the group with its replica in sync again.

#[allow(dead_code)]
mod cases;
mod sentinel_common;

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, FencedResource, LeaseKey, LeaseStore, MemoryFencedResource, OwnerId,
    RenewOutcome, WriteOp,
};
use leasehold_testkit::CaseResult;
use tokio::time::Instant;

use cases::{acquire_on, retry_within, store_at};
use sentinel_common::{
    MASTER, ask_sentinels, master_addr, record_on, url, wait_replicated, wait_role,
};

/// A holds a lease whose grant the replica acknowledged (`WAIT 1` on the store's own
/// connection); the sentinels fail the master over to the replica (`SENTINEL FAILOVER`).
///
/// - Right after the switch, while the old master may still take writes (the sentinels demote it
///   a few seconds later), C acquires a second key through the same store.
/// - Once the old master is a replica, the store follows the sentinels to the new master by
///   itself: A's renewal is granted there within a few retryable errors, and a contender is
///   refused (the record was replicated before the failover).
/// - The second key behaves as the README's table says for a failover: C's grant survived (the
///   contender is refused) or it was made on the old master and lost with it, and the key is
///   granted again, with a greater token that a fenced resource outside this Redis uses to
///   reject C's late write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_under_a_holder() -> CaseResult {
    wait_replicated(Duration::from_secs(30)).await?;
    let run = fastrand::u64(..);
    let store = store_at(&url(), "sentinel-failover").await?;
    let (key, second) = (
        LeaseKey::new(format!("failover-{run}"))?,
        LeaseKey::new(format!("window-{run}"))?,
    );
    let (a, b, c) = (
        OwnerId::with_label("a"),
        OwnerId::with_label("b"),
        OwnerId::with_label("c"),
    );
    // Longer than the sentinels take to demote the old master (a few seconds, up to their 10 s
    // INFO period), so that the renewal after it is still in time.
    let ttl = Duration::from_secs(20);
    let held = acquire_on(&store, &key, &a, ttl).await?;
    let mut con = store.connection();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut con)
        .await
        .map_err(|e| format!("WAIT: {e}"))?;
    assert_eq!(acked, 1, "the replica did not acknowledge the grant");

    let before = master_addr().await?;
    fail_over(&before).await?;
    let in_window = retry_within(Duration::from_secs(10), || async {
        match store
            .acquire(&leasehold_core::AcquireRequest::new(
                second.clone(),
                c.clone(),
                ttl,
            ))
            .await?
        {
            AcquireOutcome::Acquired(l) => Ok(l),
            AcquireOutcome::Held(h) => Err(leasehold_core::Error::store_fault(
                "redis",
                format!("a fresh key is held by {}", h.owner),
                None,
            )),
        }
    })
    .await?;

    // Until the sentinels demote the old master it still takes writes; from then on only the new
    // master can grant.
    wait_role(&before, "slave", Duration::from_secs(30)).await?;

    let renewed = retry_within(Duration::from_secs(10), || async {
        match store.renew(&held).await? {
            RenewOutcome::Renewed(l) => Ok(l),
            RenewOutcome::Lost => Err(leasehold_core::Error::store_fault(
                "redis",
                "the replicated lease was lost in a coordinated failover",
                None,
            )),
        }
    })
    .await?;
    assert_eq!(renewed.token(), held.token());
    match store
        .acquire(&leasehold_core::AcquireRequest::new(
            key.clone(),
            b.clone(),
            ttl,
        ))
        .await?
    {
        AcquireOutcome::Held(h) => assert_eq!(h.token, held.token()),
        AcquireOutcome::Acquired(l) => {
            return Err(format!("B was granted a held key after the failover: {l:?}").into());
        }
    }
    let after = master_addr().await?;
    assert_ne!(after, before);
    let record = record_on(&after, &store.layout().lease(&key)).await?;
    assert!(
        record.starts_with(&format!("{} ", held.token())),
        "{record:?}"
    );

    // The key granted in the window: kept, or lost with the old master and fenced.
    let fence = MemoryFencedResource::new();
    assert!(
        fence
            .write(&second, in_window.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    match store
        .acquire(&leasehold_core::AcquireRequest::new(
            second.clone(),
            b.clone(),
            ttl,
        ))
        .await?
    {
        AcquireOutcome::Held(h) => {
            assert_eq!(h.token, in_window.token());
            eprintln!("the grant made right after the switch survived the failover");
        }
        AcquireOutcome::Acquired(again) => {
            eprintln!("the grant made right after the switch was lost: granted twice, fenced");
            assert!(
                again.token() > in_window.token(),
                "{} !> {}",
                again.token(),
                in_window.token()
            );
            assert!(
                fence
                    .write(&second, again.token(), WriteOp::Add(1))
                    .await?
                    .is_accepted()
            );
            assert!(
                !fence
                    .write(&second, in_window.token(), WriteOp::Add(1))
                    .await?
                    .is_accepted()
            );
            let record = record_on(&after, &store.layout().lease(&second)).await?;
            assert!(
                record.starts_with(&format!("{} ", again.token())),
                "{record:?}"
            );
        }
    }
    // Leave the group as found: the demoted master in sync with the new one.
    wait_replicated(Duration::from_secs(30)).await
}

/// Asks the sentinels to fail `before` over and waits until they name another master. A sentinel
/// refuses or drops a failover shortly after an earlier one (twice its failover timeout) or
/// before it has seen the replica in sync, so the request is repeated every 5 s, for 45 s at most.
async fn fail_over(before: &(String, String)) -> CaseResult {
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let asked: Result<String, _> =
            ask_sentinels(redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER)).await;
        let retry_at = Instant::now() + Duration::from_secs(5);
        while Instant::now() < retry_at {
            if master_addr().await? != *before {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the sentinels still name {before:?} after 45 s (last answer: {asked:?})"
            )
            .into());
        }
    }
}
