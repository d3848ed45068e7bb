//! `watch` over LISTEN/NOTIFY against the real server: per-key wake-ups, table isolation,
//! unsubscribe on drop, a killed listener, notifications off, and a supervisor handoff that only
//! the watch can make in time.
//!
//! "Nothing arrived" is never checked with a sleep. Notifications reach a listener in commit
//! order and the store's listener handles them one at a time, so after a *later* release's hint
//! has arrived (a barrier key), every earlier notification has been handled: a hint that was
//! going to be delivered is already waiting in its watch.

use std::time::Duration;

use futures::FutureExt;
use lease_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
use lease_core::{KeyWatch, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome};
use lease_postgres::{PostgresLeaseStore, PostgresOptions, TableName};
use lease_testkit::cases::Case;
use lease_testkit::{CaseResult, Ctx, Failed, case};
use sqlx::AssertSqlSafe;

use super::{SCHEMA, eventually, options, store, url};

/// Generous: a loaded 2-core machine. Only the success path waits this long.
const WITHIN: Duration = Duration::from_secs(10);

/// The `application_name` of listener connections (documented on `PostgresLeaseStore`).
const LISTENER_APP: &str = "lease-postgres-listener";

/// A migrated store on `SCHEMA.<table>`.
async fn store_on(table: &str) -> Result<PostgresLeaseStore, Failed> {
    let opts = PostgresOptions::new(TableName::parse(&format!("{SCHEMA}.{table}"))?)
        .with_max_connections(2)
        .with_acquire_timeout(Duration::from_secs(5));
    PostgresLeaseStore::connect_lazy(&url(), opts.clone())?
        .migrate()
        .await?;
    Ok(PostgresLeaseStore::connect_with(&url(), opts).await?)
}

/// Waits for the next hint, failing if the watch ends or nothing comes within [`WITHIN`].
async fn hint(w: &mut KeyWatch, what: &str) -> CaseResult {
    match tokio::time::timeout(WITHIN, w.changed()).await {
        Ok(Some(Ok(()))) => Ok(()),
        Ok(other) => {
            Err(format!("{what}: the watch ended instead of signalling: {other:?}").into())
        }
        Err(_) => Err(format!("{what}: no hint within {WITHIN:?}").into()),
    }
}

/// Whether a hint is waiting right now (no waiting).
fn pending(w: &mut KeyWatch) -> bool {
    matches!(w.changed().now_or_never(), Some(Some(Ok(()))))
}

/// Acquires and releases `key` through `store`, then waits for `w`'s hint: afterwards every
/// notification committed before it has been handled by `w`'s listener.
async fn barrier(
    ctx: &Ctx,
    store: &PostgresLeaseStore,
    key: &LeaseKey,
    w: &mut KeyWatch,
) -> CaseResult {
    let lease = ctx
        .must_acquire_with(store, key, &OwnerId::with_label("barrier"), ctx.long_ttl())
        .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    hint(w, "barrier").await
}

/// A watcher of A is woken by A's release, not by B's release, not by a release of A that
/// frees nothing (a stale lease), and not by acquires.
pub(crate) async fn watch_wakes_only_the_released_key(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let (a, b, c) = (ctx.key("a"), ctx.key("b"), ctx.key("c"));
    let owner = OwnerId::with_label("holder");
    let la = ctx
        .must_acquire_with(&store, &a, &owner, ctx.long_ttl())
        .await?;
    let lb = ctx
        .must_acquire_with(&store, &b, &owner, ctx.long_ttl())
        .await?;
    let mut wa = store.watch(&a).await?.ok_or("watch is on by default")?;
    let mut wb = store.watch(&b).await?.ok_or("watch is on by default")?;
    let mut wc = store.watch(&c).await?.ok_or("watch is on by default")?;

    assert_eq!(store.release(&lb).await?, ReleaseOutcome::Released);
    hint(&mut wb, "B's release").await?;
    // Re-acquiring A makes `la` stale: its release frees nothing and must not notify.
    let la2 = ctx
        .must_acquire_with(&store, &a, &owner, ctx.long_ttl())
        .await?;
    assert_eq!(store.release(&la).await?, ReleaseOutcome::NotHeld);
    barrier(&ctx, &store, &c, &mut wc).await?;
    assert!(
        !pending(&mut wa),
        "A's watch was woken by B's release, an acquire or a no-op release"
    );
    assert!(!pending(&mut wb), "B's watch got a second hint");

    assert_eq!(store.release(&la2).await?, ReleaseOutcome::Released);
    hint(&mut wa, "A's release").await?;
    // The waiter can now take it.
    ctx.must_acquire_with(&store, &a, &OwnerId::with_label("next"), ctx.long_ttl())
        .await?;
    Ok(())
}

/// Stores on different tables use different channels: a release on one never wakes a watcher of
/// the same key on the other.
pub(crate) async fn watches_of_different_tables_are_separate(ctx: Ctx) -> CaseResult {
    let main = store().await?;
    let other = store_on("leases_watch").await?;
    assert_ne!(main.notify_channel(), other.notify_channel());
    let result = async {
        let (k, barrier_key) = (ctx.key("shared"), ctx.key("barrier"));
        let mut w_main = main.watch(&k).await?.ok_or("watch on")?;
        let mut w_other = other.watch(&k).await?.ok_or("watch on")?;
        let mut w_barrier = main.watch(&barrier_key).await?.ok_or("watch on")?;
        let owner = OwnerId::with_label("holder");
        let l_other = ctx
            .must_acquire_with(&other, &k, &owner, ctx.long_ttl())
            .await?;
        let l_main = ctx
            .must_acquire_with(&main, &k, &owner, ctx.long_ttl())
            .await?;

        assert_eq!(other.release(&l_other).await?, ReleaseOutcome::Released);
        hint(&mut w_other, "the other table's release").await?;
        barrier(&ctx, &main, &barrier_key, &mut w_barrier).await?;
        assert!(
            !pending(&mut w_main),
            "a release on another table woke this table's watch"
        );

        assert_eq!(main.release(&l_main).await?, ReleaseOutcome::Released);
        hint(&mut w_main, "this table's release").await?;
        Ok::<_, Failed>(())
    }
    .await;
    other.delete_prefix(ctx.namespace()).await?;
    result
}

/// Watches are counted per store (clones share one listener) and unsubscribe when dropped.
pub(crate) async fn dropped_watches_unsubscribe(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let clone = store.clone();
    let (a, b) = (ctx.key("a"), ctx.key("b"));
    assert_eq!(store.open_watches(), 0);
    let w1 = store.watch(&a).await?.ok_or("watch on")?;
    let w2 = clone.watch(&a).await?.ok_or("watch on")?;
    let mut w3 = store.watch(&b).await?.ok_or("watch on")?;
    assert_eq!(store.open_watches(), 3);
    assert_eq!(clone.open_watches(), 3, "clones share the listener");
    drop(w1);
    assert_eq!(store.open_watches(), 2);
    drop(w2);
    assert_eq!(store.open_watches(), 1);
    // The survivor still works.
    let lease = ctx
        .must_acquire_with(&store, &b, &OwnerId::with_label("h"), ctx.long_ttl())
        .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    hint(&mut w3, "b's release").await?;
    drop(w3);
    assert_eq!(store.open_watches(), 0);
    Ok(())
}

/// The pids of this channel's listener connections.
async fn listener_pids(admin: &PostgresLeaseStore, channel: &str) -> Result<Vec<i32>, Failed> {
    Ok(sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query = $2",
    )
    .bind(LISTENER_APP)
    .bind(format!("LISTEN \"{channel}\""))
    .fetch_all(admin.pool())
    .await?)
}

/// Killing the listener's backend ends every open watch (waiters fall back to polling); the next
/// watch connects again and works. Dropping the store and its watches closes the listener.
pub(crate) async fn killed_listener_ends_watches_and_next_watch_reconnects(ctx: Ctx) -> CaseResult {
    // A table of its own, so that the kill cannot touch other cases' listeners.
    let store = store_on("leases_watch_kill").await?;
    let admin = super::store().await?;
    let channel = store.notify_channel().to_string();
    let result = async {
        let (a, b) = (ctx.key("a"), ctx.key("b"));
        let mut wa = store.watch(&a).await?.ok_or("watch on")?;
        let mut wb = store.watch(&b).await?.ok_or("watch on")?;
        let pids = listener_pids(&admin, &channel).await?;
        assert_eq!(pids.len(), 1, "one listener per store: {pids:?}");
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pids[0])
            .fetch_one(admin.pool())
            .await?;
        assert!(killed);
        for (w, name) in [(&mut wa, "a"), (&mut wb, "b")] {
            match tokio::time::timeout(WITHIN, w.changed()).await {
                Ok(None | Some(Err(_))) => {}
                Ok(Some(Ok(()))) => {
                    return Err(format!("watch {name} signalled instead of ending").into());
                }
                Err(_) => {
                    return Err(format!("watch {name} still open {WITHIN:?} after the kill").into());
                }
            }
        }
        assert_eq!(store.open_watches(), 0);

        let mut again = store.watch(&a).await?.ok_or("watch on")?;
        let new_pids = listener_pids(&admin, &channel).await?;
        assert_eq!(new_pids.len(), 1, "a new listener: {new_pids:?}");
        assert_ne!(new_pids, pids);
        let lease = ctx
            .must_acquire_with(&store, &a, &OwnerId::with_label("h"), ctx.long_ttl())
            .await?;
        assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
        hint(&mut again, "release after reconnect").await?;

        // No leak: with the store and its watches gone, the listener disconnects.
        store.delete_prefix(ctx.namespace()).await?;
        drop((wa, wb, again));
        Ok::<_, Failed>(new_pids[0])
    }
    .await;
    let pid = match result {
        Ok(pid) => pid,
        Err(e) => {
            let _ = store.delete_prefix(ctx.namespace()).await;
            return Err(e);
        }
    };
    drop(store);
    eventually(WITHIN, "the listener to disconnect", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(admin.pool())
            .await
            .map(|n| n == 0)
            .unwrap_or(false)
    })
    .await
}

/// `with_notify(false)`: no watch capability, `watch` is `None`, release still works.
pub(crate) async fn notify_off_offers_no_watch(ctx: Ctx) -> CaseResult {
    let store = PostgresLeaseStore::connect_with(&url(), options().with_notify(false)).await?;
    assert!(!store.capabilities().watch);
    let key = ctx.key("quiet");
    assert!(store.watch(&key).await?.is_none());
    assert_eq!(store.open_watches(), 0);
    let lease = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("h"), ctx.long_ttl())
        .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::NotHeld);
    Ok(())
}

/// A supervisor waiting on a key held with a 30 s TTL, with a 60 s minimum backoff and a 25 s
/// acquire wait, would next try at its deadline; only the watch can get it the key within 5 s of
/// the holder's release.
pub(crate) async fn supervisor_handoff_is_woken_by_the_watch(ctx: Ctx) -> CaseResult {
    let holder_store = store().await?;
    let waiter_store = store().await?;
    let key = ctx.key("handoff");
    let lease = ctx
        .must_acquire_with(
            &holder_store,
            &key,
            &OwnerId::with_label("holder"),
            Duration::from_secs(30),
        )
        .await?;
    let version = || async {
        sqlx::query_scalar::<_, String>(AssertSqlSafe(format!(
            "SELECT xmin::text FROM {SCHEMA}.leases WHERE resource_key = $1"
        )))
        .bind(key.as_str())
        .fetch_one(holder_store.pool())
        .await
    };
    let before = version().await?;

    let config = SupervisorConfig::new(Duration::from_secs(30))
        .with_acquire_wait(Duration::from_secs(25))
        .with_backoff(Duration::from_secs(60), Duration::from_secs(60));
    let supervisor =
        Supervisor::new(waiter_store.clone(), config).with_owner(OwnerId::with_label("waiter"));
    let k = key.clone();
    let waiting = tokio::spawn(async move { supervisor.acquire(&k).await });

    // The supervisor watches before its first attempt; a refused attempt rewrites the row (a new
    // xmin). After both, it is asleep until its deadline unless the watch wakes it.
    eventually(WITHIN, "the supervisor to watch and try once", || async {
        waiter_store.open_watches() == 1 && version().await.is_ok_and(|v| v != before)
    })
    .await?;
    assert_eq!(
        holder_store.release(&lease).await?,
        ReleaseOutcome::Released
    );
    let granted = match tokio::time::timeout(Duration::from_secs(5), waiting).await {
        Ok(joined) => joined.map_err(|e| format!("supervisor task: {e}"))??,
        Err(_) => {
            return Err(
                "the waiting supervisor was not granted within 5 s of the release \
                        (the watch did not wake it)"
                    .into(),
            );
        }
    };
    let Acquisition::Acquired(guard) = granted else {
        return Err(format!("expected a grant, got {granted:?}").into());
    };
    assert_eq!(guard.release().await?, ReleaseOutcome::Released);
    assert_eq!(
        waiter_store.open_watches(),
        0,
        "the supervisor's watch was dropped"
    );
    Ok(())
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("postgres", watch_wakes_only_the_released_key),
        case!("postgres", watches_of_different_tables_are_separate),
        case!("postgres", dropped_watches_unsubscribe),
        case!(
            "postgres",
            killed_listener_ends_watches_and_next_watch_reconnects
        ),
        case!("postgres", notify_off_offers_no_watch),
        case!("postgres", supervisor_handoff_is_woken_by_the_watch),
    ]
}
