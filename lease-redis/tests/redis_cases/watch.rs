//! Waking waiters: keyspace events for expiry, the release channel, and polling without events.

use std::time::Duration;

use lease_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome};
use lease_redis::RedisLeaseStore;
use lease_testkit::{CaseResult, Ctx, Failed};
use tokio::time::Instant;

use super::acquire_on;
use super::server::RedisServer;

async fn store(server: &RedisServer, poll: Duration) -> Result<RedisLeaseStore, Failed> {
    Ok(RedisLeaseStore::builder(server.url())
        .prefix("watch")
        .watch_poll_interval(poll)
        .connect()
        .await?)
}

/// Waits on `store`'s watch of `key` and tries to acquire after each hint, until granted or
/// `within` passes. Returns the number of hints it took.
async fn acquire_woken(
    store: &RedisLeaseStore,
    key: &LeaseKey,
    owner: &OwnerId,
    within: Duration,
) -> Result<usize, Failed> {
    let mut watch = store.watch(key).await?.ok_or("redis claims watch")?;
    let deadline = Instant::now() + within;
    let mut hints = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, watch.changed()).await {
            Ok(Some(Ok(()))) => hints += 1,
            Ok(other) => return Err(format!("watch ended: {other:?}").into()),
            Err(_) => {
                return Err(
                    format!("not woken into a grant within {within:?} ({hints} hints)").into(),
                );
            }
        }
        let req = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(30));
        if let AcquireOutcome::Acquired(_) = store.acquire(&req).await? {
            return Ok(hints);
        }
    }
}

/// With keyspace notifications on, an expiry wakes the watcher (the poll interval is a minute,
/// so the wake-up cannot come from polling).
pub(crate) async fn watch_wakes_on_expiry_through_keyspace_events(ctx: Ctx) -> CaseResult {
    let server = RedisServer::start(&["--notify-keyspace-events", "KEA"]).await?;
    let s = store(&server, Duration::from_secs(60)).await?;
    let key = ctx.key("watch-expiry");
    let ttl = Duration::from_millis(600);
    let started = Instant::now();
    let _a = acquire_on(&s, &key, &OwnerId::with_label("a"), ttl).await?;
    acquire_woken(
        &s,
        &key,
        &OwnerId::with_label("b"),
        ttl + Duration::from_secs(5),
    )
    .await?;
    assert!(
        started.elapsed() >= ttl,
        "granted before the holder expired"
    );
    Ok(())
}

/// Without keyspace notifications a release still wakes the watcher at once (release channel),
/// and an expiry is noticed through bounded polling.
pub(crate) async fn watch_polls_without_keyspace_notifications(ctx: Ctx) -> CaseResult {
    let server = RedisServer::start(&["--notify-keyspace-events", ""]).await?;
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));

    let slow = store(&server, Duration::from_secs(60)).await?;
    let key = ctx.key("watch-release");
    let held = acquire_on(&slow, &key, &a, Duration::from_secs(30)).await?;
    let waiter = {
        let (slow, key, b) = (slow.clone(), key.clone(), b.clone());
        tokio::spawn(async move { acquire_woken(&slow, &key, &b, Duration::from_secs(10)).await })
    };
    // Release once the waiter's subscription is in place (PUBSUB NUMSUB on the release channel).
    let channel = slow.layout().released_channel(&key);
    let mut admin = server.admin().await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut admin)
            .await
            .map_err(|e| e.to_string())?;
        if subscribers > 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err("the watcher never subscribed".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(slow.release(&held).await?, ReleaseOutcome::Released);
    let hints = waiter.await.map_err(|e| e.to_string())??;
    assert_eq!(hints, 1, "one release, one hint");

    let polling = store(&server, Duration::from_millis(100)).await?;
    let key = ctx.key("watch-poll");
    let ttl = Duration::from_millis(600);
    let started = Instant::now();
    let _a = acquire_on(&polling, &key, &a, ttl).await?;
    acquire_woken(&polling, &key, &b, ttl + Duration::from_secs(5)).await?;
    assert!(
        started.elapsed() >= ttl,
        "granted before the holder expired"
    );
    Ok(())
}
