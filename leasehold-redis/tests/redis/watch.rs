//! Waking waiters: keyspace events for expiry, the release channel, and polling without events.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome,
};
use leasehold_faults::proxy::{FaultProxy, Mode};
use leasehold_redis::{RedisLeaseStore, RedisOptions};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, Failed};
use tokio::time::Instant;

use crate::cases::{acquire_on, retry_within};
use crate::server::RedisServer;

async fn store(server: &RedisServer, poll: Duration) -> Result<RedisLeaseStore, Failed> {
    Ok(RedisLeaseStore::connect_with(
        &server.url(),
        RedisOptions::default()
            .with_prefix("watch")
            .with_watch_poll_interval(poll),
    )
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

/// Waits until `channel` on `server` has a subscriber (the watcher is in place), or fails.
async fn wait_subscribed(server: &RedisServer, channel: &str) -> CaseResult {
    let mut admin = server.admin().await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut admin)
            .await
            .map_err(|e| e.to_string())?;
        if subscribers > 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("nobody subscribed to {channel} within 10 s").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// With keyspace notifications on, an expiry wakes the watcher (the poll interval is a minute,
/// so the wake-up cannot come from polling), and the holder's renewals do not.
pub(crate) async fn watch_wakes_on_expiry_through_keyspace_events(ctx: Ctx) -> CaseResult {
    let server = RedisServer::start(&["--notify-keyspace-events", "KEA"]).await?;
    let s = store(&server, Duration::from_secs(60)).await?;
    let key = ctx.key("watch-expiry");
    let ttl = Duration::from_millis(600);
    let mut held = acquire_on(&s, &key, &OwnerId::with_label("a"), ttl).await?;
    let waiter = {
        let (s, key) = (s.clone(), key.clone());
        let b = OwnerId::with_label("b");
        tokio::spawn(async move { acquire_woken(&s, &key, &b, Duration::from_secs(10)).await })
    };
    wait_subscribed(
        &server,
        &format!("__keyspace@0__:{}", s.layout().lease(&key)),
    )
    .await?;
    for _ in 0..2 {
        match s.renew(&held).await? {
            RenewOutcome::Renewed(next) => held = next,
            RenewOutcome::Lost => return Err("renew by the holder was refused".into()),
        }
    }
    let last_renewal = Instant::now();
    let hints = waiter.await.map_err(|e| e.to_string())??;
    assert!(
        last_renewal.elapsed() >= ttl,
        "granted before the holder expired"
    );
    assert_eq!(
        hints, 1,
        "renewals must not wake the watcher; only the expiry"
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
    // Release once the waiter's subscription is in place.
    wait_subscribed(&server, &slow.layout().released_channel(&key)).await?;
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

/// How long a case waits before it calls an operation hung. Generous: the store's own deadlines
/// in these cases are a few hundred milliseconds.
const HUNG: Duration = Duration::from_secs(30);

/// A watch through a TCP proxy that starts black-holing (accepts bytes, answers nothing, never
/// resets): an established watch yields a retryable error instead of waiting forever (so the
/// caller falls back to polling), and a new watch fails with a retryable error instead of hanging
/// in `SUBSCRIBE`. Keyspace notifications are on, so the watch has no poll ticks to hide a dead
/// connection behind. After the proxy heals, watching works again.
pub(crate) async fn a_black_holed_watch_fails_in_bounded_time(ctx: Ctx) -> CaseResult {
    let server = RedisServer::start(&["--notify-keyspace-events", "KEA"]).await?;
    let proxy = FaultProxy::start(([127, 0, 0, 1], server.port()).into())
        .await
        .map_err(|e| format!("proxy: {e}"))?;
    let store = RedisLeaseStore::connect_with(
        &format!("redis://127.0.0.1:{}", proxy.port()),
        RedisOptions::default()
            .with_prefix("watch")
            .with_response_timeout(Duration::from_millis(300))
            .with_connect_timeout(Duration::from_millis(300))
            .with_watch_poll_interval(Duration::from_secs(60)),
    )
    .await?;
    let key = ctx.key("watch-blackhole");

    // An established watch, then the network goes silent.
    let mut watch = store.watch(&key).await?.ok_or("redis claims watch")?;
    wait_subscribed(&server, &store.layout().released_channel(&key)).await?;
    proxy.set_mode(Mode::Blackhole);
    match tokio::time::timeout(HUNG, watch.changed()).await {
        Ok(Some(Err(e))) if e.is_retryable() => {}
        Ok(other) => {
            return Err(
                format!("black-holed watch: expected a retryable error, got {other:?}").into(),
            );
        }
        Err(_) => {
            return Err(format!("an established watch hung for {HUNG:?} on a black hole").into());
        }
    }

    // A new watch while the network is silent.
    match tokio::time::timeout(HUNG, store.watch(&key)).await {
        Ok(Err(e)) if e.is_retryable() => {}
        Ok(other) => {
            return Err(format!(
                "watch on a black hole: expected a retryable error, got {other:?}"
            )
            .into());
        }
        Err(_) => return Err(format!("watch() hung for {HUNG:?} on a black hole").into()),
    }

    // Healed: a watch is woken by a release again. (The proxy *discarded* the bytes sent into the
    // black hole, which TCP never does, so the store's multiplexed connection that had requests
    // swallowed stays out of step with its replies; a fresh store acquires and releases.)
    proxy.heal();
    let mut watch = retry_within(Duration::from_secs(10), || store.watch(&key))
        .await?
        .ok_or("redis claims watch")?;
    let other =
        RedisLeaseStore::connect_with(&server.url(), RedisOptions::default().with_prefix("watch"))
            .await?;
    let held = acquire_on(
        &other,
        &key,
        &OwnerId::with_label("a"),
        Duration::from_secs(30),
    )
    .await?;
    assert_eq!(other.release(&held).await?, ReleaseOutcome::Released);
    match tokio::time::timeout(HUNG, watch.changed()).await {
        Ok(Some(Ok(()))) => Ok(()),
        other => {
            Err(format!("healed watch: expected a hint after the release, got {other:?}").into())
        }
    }
}

/// This file's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("redis", watch_wakes_on_expiry_through_keyspace_events),
        case!("redis", watch_polls_without_keyspace_notifications),
        case!("redis", a_black_holed_watch_fails_in_bounded_time),
    ]
}
