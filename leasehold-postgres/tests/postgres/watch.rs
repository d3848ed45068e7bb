//! `watch` over LISTEN/NOTIFY against the real server: per-key wake-ups, table isolation,
//! unsubscribe on drop, a killed listener, notifications off, a supervisor handoff that only
//! the watch can make in time, releases that notify only when an acquire was refused, and no
//! lost wake-up when a refusal races the release (ADR 0017).
//!
//! "Nothing arrived" is never checked with a sleep. Notifications reach a listener in commit
//! order and the store's listener handles them one at a time, so after a *later* release's hint
//! has arrived (a barrier key), every earlier notification has been handled: a hint that was
//! going to be delivered is already waiting in its watch.

use std::time::Duration;

use futures::FutureExt;
use leasehold_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, KeyWatch, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome,
};
use leasehold_postgres::{PostgresLeaseStore, PostgresOptions, TableName};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, Failed, case};
use sqlx::AssertSqlSafe;

use super::{SCHEMA, eventually, options, store, url};

/// Generous: a loaded 2-core machine. Only the success path waits this long.
const WITHIN: Duration = Duration::from_secs(10);

/// The `application_name` of listener connections (documented on `PostgresLeaseStore`).
const LISTENER_APP: &str = "leasehold-postgres-listener";

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
    refused(store, key).await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    hint(w, "barrier").await
}

/// An acquire of `key` by another owner, which must be refused: it marks the row, so that the
/// next release notifies (what a waiting supervisor's attempt does).
async fn refused(store: &PostgresLeaseStore, key: &LeaseKey) -> CaseResult {
    let req = AcquireRequest::new(
        key.clone(),
        OwnerId::with_label("waiter"),
        Duration::from_secs(5),
    );
    match store.acquire(&req).await? {
        AcquireOutcome::Held(_) => Ok(()),
        AcquireOutcome::Acquired(l) => Err(format!("{key} was free: granted {}", l.token()).into()),
    }
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

    refused(&store, &a).await?;
    refused(&store, &b).await?;
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

    // The refusal of A before the re-acquire is still pending: the grant keeps the mark.
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

        refused(&other, &k).await?;
        refused(&main, &k).await?;
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
    refused(&store, &b).await?;
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
        // Both keys held: a watch polled before its listener sees the kill marks its row first,
        // and a free key would rightly answer that mark with a hint ("freed before the mark");
        // held, the mark waits, so ending is the only right answer.
        let holder = OwnerId::with_label("h");
        let la = ctx
            .must_acquire_with(&store, &a, &holder, ctx.long_ttl())
            .await?;
        let lb = ctx
            .must_acquire_with(&store, &b, &holder, ctx.long_ttl())
            .await?;
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
        assert_eq!(store.release(&la).await?, ReleaseOutcome::Released);
        assert_eq!(store.release(&lb).await?, ReleaseOutcome::Released);

        let mut again = store.watch(&a).await?.ok_or("watch on")?;
        let new_pids = listener_pids(&admin, &channel).await?;
        assert_eq!(new_pids.len(), 1, "a new listener: {new_pids:?}");
        assert_ne!(new_pids, pids);
        let lease = ctx
            .must_acquire_with(&store, &a, &OwnerId::with_label("h"), ctx.long_ttl())
            .await?;
        refused(&store, &a).await?;
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

/// A release with no mark before it sends no notification (no `NOTIFY`, so no cluster-wide
/// commit lock); after a refusal, the next release notifies once and consumes the mark. Seen
/// with a plain `LISTEN` of the table's channel (a store's watch would mark the row itself).
pub(crate) async fn an_uncontended_release_notifies_nothing(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let (a, c) = (ctx.key("quiet"), ctx.key("barrier"));
    let mut listener = sqlx::postgres::PgListener::connect(&url()).await?;
    listener.listen(store.notify_channel()).await?;
    // The payloads received up to and including the barrier key's (notifications arrive in
    // commit order, so every earlier one has arrived by then).
    let until_barrier =
        async |listener: &mut sqlx::postgres::PgListener| -> Result<Vec<String>, Failed> {
            let lease = ctx
                .must_acquire_with(&store, &c, &OwnerId::with_label("barrier"), ctx.long_ttl())
                .await?;
            refused(&store, &c).await?;
            assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
            let mut seen = Vec::new();
            loop {
                let n = tokio::time::timeout(WITHIN, listener.recv())
                    .await
                    .map_err(|_| "no barrier notification")??;
                if n.payload() == c.as_str() {
                    return Ok(seen);
                }
                seen.push(n.payload().to_string());
            }
        };
    for _ in 0..3 {
        let lease = ctx
            .must_acquire_with(&store, &a, &OwnerId::with_label("h"), ctx.long_ttl())
            .await?;
        assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    }
    let seen = until_barrier(&mut listener).await?;
    assert!(
        !seen.contains(&a.to_string()),
        "an unmarked release notified: {seen:?}"
    );

    let lease = ctx
        .must_acquire_with(&store, &a, &OwnerId::with_label("h"), ctx.long_ttl())
        .await?;
    refused(&store, &a).await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    let lease = ctx
        .must_acquire_with(&store, &a, &OwnerId::with_label("h"), ctx.long_ttl())
        .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    let seen = until_barrier(&mut listener).await?;
    let of_a = seen.iter().filter(|p| *p == a.as_str()).count();
    assert_eq!(
        of_a, 1,
        "one notification for the release after the refusal, none for the next: {seen:?}"
    );
    Ok(())
}

/// A watch that waits marks the row itself: a release after it notifies even though nobody was
/// refused, and a release before it (the key already free when the watch first waits) is
/// reported at once by the mark.
pub(crate) async fn a_waiting_watch_marks_the_row(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let key = ctx.key("observed");
    let lease = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("h"), ctx.long_ttl())
        .await?;
    let mut w = store.watch(&key).await?.ok_or("watch on")?;
    // The first wait marks the row (held: no hint), then the release notifies.
    let waiting = tokio::spawn(async move {
        let r = tokio::time::timeout(WITHIN, w.changed()).await;
        (w, r)
    });
    eventually(WITHIN, "the watch to mark the row", || async {
        sqlx::query_scalar::<_, i16>(AssertSqlSafe(format!(
            "SELECT wake FROM {SCHEMA}.leases WHERE resource_key = $1"
        )))
        .bind(key.as_str())
        .fetch_one(store.pool())
        .await
        .is_ok_and(|wake| wake == 1)
    })
    .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    let (mut w, r) = waiting.await.map_err(|e| format!("task: {e}"))?;
    if !matches!(r, Ok(Some(Ok(())))) {
        return Err(format!("the release after the watch's mark did not wake it: {r:?}").into());
    }
    // Released before this wait: the mark sees the key free and says so once.
    let lease = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("h2"), ctx.long_ttl())
        .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    hint(&mut w, "the mark of a key released before the wait").await
}

/// Two waiters are refused; the holder's lease expires and the first waiter takes the key over
/// (a grant without a release). The second waiter is still waiting: the grant must keep its
/// mark, so that the new holder's release notifies. Heard on a plain `LISTEN` (a store's watch
/// would also mark the row itself when it waits).
pub(crate) async fn a_takeover_keeps_the_mark_of_the_other_waiters(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let key = ctx.key("takeover");
    let mut listener = sqlx::postgres::PgListener::connect(&url()).await?;
    listener.listen(store.notify_channel()).await?;
    let first = ctx
        .must_acquire_with(
            &store,
            &key,
            &OwnerId::with_label("h"),
            Duration::from_millis(300),
        )
        .await?;
    refused(&store, &key).await?; // the second waiter
    eventually(WITHIN, "the first holder's lease to expire", || async {
        store.inspect(&key).await.is_ok_and(|s| s.holder.is_none())
    })
    .await?;
    let next = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("w1"), ctx.long_ttl())
        .await?;
    assert!(next.token() > first.token());
    assert_eq!(store.release(&next).await?, ReleaseOutcome::Released);
    loop {
        let n = tokio::time::timeout(WITHIN, listener.recv())
            .await
            .map_err(|_| "the new holder's release did not notify the second waiter")??;
        if n.payload() == key.as_str() {
            return Ok(());
        }
    }
}

/// Waits (polling, up to [`WITHIN`]) until a backend other than those in `known` is blocked by
/// one of `blocked_by`, and returns its pid.
async fn queued(
    admin: &PostgresLeaseStore,
    blocked_by: &[i32],
    known: &[i32],
) -> Result<i32, Failed> {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity \
             WHERE pg_blocking_pids(pid) && $1::int[] AND NOT pid = ANY($2::int[]) LIMIT 1",
        )
        .bind(blocked_by)
        .bind(known)
        .fetch_optional(admin.pool())
        .await?;
        if let Some(pid) = pid {
            return Ok(pid);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("nothing queued behind {blocked_by:?} within {WITHIN:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Holds the row lock of `key` in a transaction of `admin`'s (so that statements on the row
/// queue behind it in the order they arrive); returns it and its backend pid.
async fn lock_row(
    admin: &PostgresLeaseStore,
    key: &LeaseKey,
) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, i32), Failed> {
    let mut blocker = admin.pool().begin().await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *blocker)
        .await?;
    sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM {SCHEMA}.leases WHERE resource_key = $1 FOR UPDATE"
    )))
    .bind(key.as_str())
    .execute(&mut *blocker)
    .await?;
    Ok((blocker, pid))
}

/// The lost wake-up race, forced: the row is locked by a third transaction; the statement that
/// marks the row (a refused acquire, or the mark a waiting watch sends) and the holder's release
/// queue behind it in a chosen order; then the lock goes. The release's snapshot is then older
/// than the mark's commit. Whatever the order, the waiter is woken (or granted, when the release
/// came before its acquire). A release that decided from its snapshot, or a mark that did not
/// mark, leaves the waiter unwoken. Refusals are heard on a plain `LISTEN` (as the benchmark's
/// raw protocol waits), watches through the store.
pub(crate) async fn no_wake_up_is_lost_when_a_refusal_races_the_release(ctx: Ctx) -> CaseResult {
    let holder = store().await?;
    let waiter = store().await?;
    let admin = store().await?;
    let mut listener = sqlx::postgres::PgListener::connect(&url()).await?;
    listener.listen(holder.notify_channel()).await?;
    let mut lost = Vec::new();
    for round in 0..12 {
        let key = ctx.key(&format!("race{round}"));
        let lease = ctx
            .must_acquire_with(
                &holder,
                &key,
                &OwnerId::with_label("holder"),
                ctx.long_ttl(),
            )
            .await?;
        let (hs, hl) = (holder.clone(), lease.clone());
        let release = async move { hs.release(&hl).await };
        let mark_first = round % 2 == 0;
        let by_watch = round % 4 >= 2;
        let (blocker, blocker_pid) = lock_row(&admin, &key).await?;
        if by_watch {
            let mut w = waiter.watch(&key).await?.ok_or("watch on")?;
            // The first wait sends the watch's mark.
            let wait = async move { tokio::time::timeout(WITHIN, w.changed()).await };
            let (waiting, releasing, first) = if mark_first {
                let waiting = tokio::spawn(wait);
                let first = queued(&admin, &[blocker_pid], &[]).await?;
                (waiting, tokio::spawn(release), first)
            } else {
                let releasing = tokio::spawn(release);
                let first = queued(&admin, &[blocker_pid], &[]).await?;
                (tokio::spawn(wait), releasing, first)
            };
            queued(&admin, &[blocker_pid, first], &[first]).await?;
            blocker.commit().await?;
            let released = releasing.await.map_err(|e| format!("{e}"))??;
            assert_eq!(released, ReleaseOutcome::Released, "round {round}");
            let woken = waiting.await.map_err(|e| format!("{e}"))?;
            if !matches!(woken, Ok(Some(Ok(())))) {
                lost.push(format!(
                    "round {round} (watch, mark first = {mark_first}): not woken: {woken:?}"
                ));
            }
            continue;
        }
        let (wk, ws) = (key.clone(), waiter.clone());
        let attempt = async move {
            let req =
                AcquireRequest::new(wk, OwnerId::with_label("waiter"), Duration::from_secs(30));
            ws.acquire(&req).await
        };
        let (attempt, release) = if mark_first {
            let a = tokio::spawn(attempt);
            let first = queued(&admin, &[blocker_pid], &[]).await?;
            let r = tokio::spawn(release);
            queued(&admin, &[blocker_pid, first], &[first]).await?;
            (a, r)
        } else {
            let r = tokio::spawn(release);
            let first = queued(&admin, &[blocker_pid], &[]).await?;
            let a = tokio::spawn(attempt);
            queued(&admin, &[blocker_pid, first], &[first]).await?;
            (a, r)
        };
        blocker.commit().await?;
        let attempt = attempt.await.map_err(|e| format!("acquire task: {e}"))??;
        let released = release.await.map_err(|e| format!("release task: {e}"))??;
        assert_eq!(released, ReleaseOutcome::Released, "round {round}");
        match (mark_first, attempt) {
            (true, AcquireOutcome::Held(_)) => loop {
                match tokio::time::timeout(WITHIN, listener.recv()).await {
                    Err(_) => {
                        lost.push(format!(
                            "round {round} (refusal first): the release did not notify"
                        ));
                        break;
                    }
                    Ok(n) => {
                        if n?.payload() == key.as_str() {
                            break;
                        }
                    }
                }
            },
            (false, AcquireOutcome::Acquired(l)) => {
                assert_eq!(waiter.release(&l).await?, ReleaseOutcome::Released);
            }
            (first, other) => {
                return Err(format!(
                    "round {round}: refusal first = {first}, but the acquire gave {other:?}"
                )
                .into());
            }
        }
    }
    if lost.is_empty() {
        Ok(())
    } else {
        Err(format!("lost wake-ups: {lost:?}").into())
    }
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
        case!("postgres", an_uncontended_release_notifies_nothing),
        case!("postgres", a_waiting_watch_marks_the_row),
        case!("postgres", a_takeover_keeps_the_mark_of_the_other_waiters),
        case!(
            "postgres",
            no_wake_up_is_lost_when_a_refusal_races_the_release
        ),
    ]
}
