//! This backend's own cases against the real server: the token floor under hand-made deletes and
//! writes, the fenced transaction, concurrent first acquisitions, advisory locks, the schema
//! check and URL options.

use std::time::Duration;

use futures::future::BoxFuture;

use leasehold_core::{AcquireOutcome, Error, LeaseStore, OwnerId, ReleaseOutcome};
use leasehold_mysql::{AdvisoryLocks, FencedTx, MysqlLeaseStore, MysqlOptions, TableName};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case};
use sqlx::AssertSqlSafe;

use super::{TABLE, options, store, url};

pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(
            "mysql",
            tokens_never_go_back_after_deletes_and_foreign_writes
        ),
        case!("mysql", tokens_are_floored_by_the_server_clock),
        case!("mysql", concurrent_first_acquires_grant_exactly_one),
        case!("mysql", fenced_transaction_commits_only_under_the_lease),
        case!(
            "mysql",
            fenced_transaction_rechecks_expiry_before_commit_and_before_the_closure
        ),
        case!("mysql", release_after_expiry_is_not_held),
        case!("mysql", advisory_lock_excludes_and_dies_with_its_connection),
        case!("mysql", a_missing_schema_is_a_config_error),
        case!("mysql", url_options_and_the_mariadb_scheme),
        case!("mysql", acquire_many_of_mixed_owners_decides_each_key),
        case!("mysql", acquire_many_timing_by_path),
        case!("mysql", inspect_many_across_statements_matches_inspect),
    ]
}

/// A batch whose requests do not share one owner and TTL (decided request by request): each key
/// granted to its own request's owner with that request's TTL, a key held by another owner
/// refused naming it, and a second mixed batch over the same keys refused where the first one
/// granted to someone else.
async fn acquire_many_of_mixed_owners_decides_each_key(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let (a, b, c) = (
        OwnerId::with_label("a"),
        OwnerId::with_label("b"),
        OwnerId::with_label("c"),
    );
    let held = ctx.key("mixed-held");
    let by_c = ctx
        .must_acquire_with(&store, &held, &c, ctx.long_ttl())
        .await?;
    let keys: Vec<_> = (0..6).map(|i| ctx.key(&format!("mixed-{i}"))).collect();
    let mut reqs: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let (owner, ttl) = if i % 2 == 0 {
                (&a, ctx.long_ttl())
            } else {
                (&b, ctx.long_ttl() + Duration::from_secs(1))
            };
            ctx.request(k, owner, ttl)
        })
        .collect();
    reqs.push(ctx.request(&held, &a, ctx.long_ttl()));
    let out = store.acquire_many(&reqs).await?;
    for (req, got) in reqs.iter().zip(&out) {
        match got {
            Ok(AcquireOutcome::Acquired(l)) => {
                assert_ne!(req.key, held, "the key held by c was granted");
                assert_eq!((l.owner(), l.ttl()), (&req.owner, req.ttl), "{}", req.key);
            }
            Ok(AcquireOutcome::Held(h)) => {
                assert_eq!(req.key, held, "{} refused: {h:?}", req.key);
                assert_eq!((&h.owner, h.token), (&c, by_c.token()));
            }
            Err(e) => return Err(format!("{}: {e}", req.key).into()),
        }
    }
    // The same keys with the owners swapped: every key is now held by the other one.
    let swapped: Vec<_> = reqs[..6]
        .iter()
        .map(|r| {
            let other = if r.owner == a { &b } else { &a };
            ctx.request(&r.key, other, r.ttl)
        })
        .collect();
    for (req, got) in reqs.iter().zip(store.acquire_many(&swapped).await?) {
        match got? {
            AcquireOutcome::Held(h) => assert_eq!(h.owner, req.owner, "{}", req.key),
            AcquireOutcome::Acquired(l) => {
                return Err(format!("{} granted to {} while held", req.key, l.owner()).into());
            }
        }
    }
    Ok(())
}

/// `inspect_many` reads a thousand keys per statement: 2,500 keys (three statements) with every
/// seventh held by one owner and every eleventh by another, the rest never seen, plus keys given
/// twice across the statements' boundaries, answer as `inspect` answers each.
async fn inspect_many_across_statements_matches_inspect(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let mut keys: Vec<_> = (0..2500).map(|i| ctx.key(&format!("im-{i}"))).collect();
    for (owner, every) in [(&a, 7), (&b, 11)] {
        let reqs: Vec<_> = keys
            .iter()
            .enumerate()
            .filter(|(i, _)| i % every == 0 && (every == 7 || i % 7 != 0))
            .map(|(_, k)| ctx.request(k, owner, ctx.long_ttl()))
            .collect();
        for got in store.acquire_many(&reqs).await? {
            assert!(matches!(got?, AcquireOutcome::Acquired(_)));
        }
    }
    let index: Vec<usize> = (0..2500).chain([999, 1000, 0]).collect();
    keys.extend([keys[999].clone(), keys[1000].clone(), keys[0].clone()]);
    let many = store.inspect_many(&keys).await?;
    assert_eq!(many.len(), keys.len());
    for (i, (key, state)) in keys.iter().zip(&many).enumerate() {
        let one = store.inspect(key).await?;
        let owner =
            |s: &leasehold_core::KeyState| s.holder.as_ref().map(|h| (h.owner.clone(), h.token));
        assert_eq!(owner(state), owner(&one), "{i}: {key}");
        assert_eq!(state.last_token, one.last_token, "{i}: {key}");
        let want = match index[i] {
            j if j % 7 == 0 => Some(&a),
            j if j % 11 == 0 => Some(&b),
            _ => None,
        };
        assert_eq!(state.holder.as_ref().map(|h| &h.owner), want, "{i}: {key}");
    }
    Ok(())
}

/// Prints (does not assert) how long `acquire_many` takes for `LEASE_ACQUIRE_MANY_KEYS` keys
/// (default 2,000; at most `MAX_ACQUIRE_MANY`) of one owner: keys without a row, the same keys
/// granted again to their owner, and the same keys refused to another owner. Every key must
/// be granted, granted again with a greater token, and refused.
async fn acquire_many_timing_by_path(ctx: Ctx) -> CaseResult {
    let n = std::env::var("LEASE_ACQUIRE_MANY_KEYS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(2_000)
        .clamp(1, leasehold_core::store::MAX_ACQUIRE_MANY);
    let store = store().await?;
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let keys: Vec<_> = (0..n).map(|i| ctx.key(&format!("timing-{i}"))).collect();
    let batch = |owner: &OwnerId| -> Vec<_> {
        keys.iter()
            .map(|k| ctx.request(k, owner, ctx.long_ttl()))
            .collect()
    };
    let mut took = Vec::new();
    let mut first = Vec::new();
    for (what, owner) in [("new keys", &a), ("granted again", &a), ("refused", &b)] {
        let start = std::time::Instant::now();
        let out = store.acquire_many(&batch(owner)).await?;
        took.push((what, start.elapsed()));
        for (i, got) in out.into_iter().enumerate() {
            match (what, got?) {
                ("new keys", AcquireOutcome::Acquired(l)) => first.push(l.token()),
                ("granted again", AcquireOutcome::Acquired(l)) => {
                    assert!(l.token() > first[i], "{}: token did not rise", keys[i]);
                }
                ("refused", AcquireOutcome::Held(h)) => assert_eq!(h.owner, a),
                (what, other) => return Err(format!("{what}: {}: {other:?}", keys[i]).into()),
            }
        }
    }
    eprintln!("acquire_many timing [mysql] {n} keys of one owner: {took:?}");
    Ok(())
}

/// A token written by hand far above the clock, then the row deleted by hand: the key's next
/// grant is still above it (the delete trigger kept it in the floor row). A hand-made insert of
/// token 1 and a hand-made update lowering the token are both lifted by the triggers.
async fn tokens_never_go_back_after_deletes_and_foreign_writes(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let key = ctx.key("floor");
    let a = OwnerId::with_label("a");
    let lease = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    // Far above any clock in µs: only the floor row can keep the next token above it.
    let high: i64 = 7_000_000_000_000_000_000;
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {TABLE} SET fencing_token = ? WHERE resource_key = ?"
    )))
    .bind(high)
    .bind(key.as_str())
    .execute(store.pool())
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {TABLE} WHERE resource_key = ?"
    )))
    .bind(key.as_str())
    .execute(store.pool())
    .await?;
    let again = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    assert!(
        again.token().to_i64() > high && again.token() > lease.token(),
        "the token went back after a delete: {} after {high}",
        again.token()
    );
    // Someone else's statements: an update that lowers the token is lifted above the old one.
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {TABLE} SET fencing_token = 1 WHERE resource_key = ?"
    )))
    .bind(key.as_str())
    .execute(store.pool())
    .await?;
    let st = store.inspect(&key).await?;
    let t = st.last_token.ok_or("no token")?;
    assert!(
        t > again.token(),
        "a foreign update lowered the token to {t}"
    );
    // A foreign delete and insert of token 1: the insert is lifted above the floor.
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {TABLE} WHERE resource_key = ?"
    )))
    .bind(key.as_str())
    .execute(store.pool())
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {TABLE} (resource_key, owner, lease_until, fencing_token) \
         VALUES (?, 'seed', '1970-01-01', 1)"
    )))
    .bind(key.as_str())
    .execute(store.pool())
    .await?;
    let st = store.inspect(&key).await?;
    let t2 = st.last_token.ok_or("no token")?;
    assert!(
        t2 > t,
        "a foreign insert after a delete went back: {t2} after {t}"
    );
    let last = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    assert!(last.token() > t2);
    Ok(())
}

/// A grant's token is at least the server's clock in µs at the grant (what keeps tokens rising
/// across a failover to a replica that lost the newest grants) and never ahead of it.
async fn tokens_are_floored_by_the_server_clock(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let key = ctx.key("clock");
    let clock = || async {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
            "SELECT {}",
            leasehold_mysql::protocol::CLOCK_US
        )))
        .fetch_one(store.pool())
        .await
    };
    for owner in ["a", "b", "a"] {
        let before = clock().await?;
        let lease = ctx
            .must_acquire_with(&store, &key, &OwnerId::with_label(owner), ctx.short_ttl())
            .await?;
        let after = clock().await?;
        let t = lease.token().to_i64();
        assert!(
            (before..=after).contains(&t),
            "token {t} not within the server clock {before}..={after}"
        );
        let _ = store.release(&lease).await?;
    }
    Ok(())
}

/// Eight clients race for a key that has no row: exactly one is granted, the others see it
/// held by the winner; nobody gets an error (a duplicate key or deadlock is retried).
async fn concurrent_first_acquires_grant_exactly_one(ctx: Ctx) -> CaseResult {
    let key = ctx.key("race");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store().await?;
        let req = ctx.request(&key, &OwnerId::with_label(&format!("c{i}")), ctx.long_ttl());
        tasks.push(tokio::spawn(async move { store.acquire(&req).await }));
    }
    let mut granted = Vec::new();
    let mut held = Vec::new();
    for t in tasks {
        match t.await.map_err(|e| e.to_string())?? {
            AcquireOutcome::Acquired(l) => granted.push(l),
            AcquireOutcome::Held(h) => held.push(h),
        }
    }
    assert_eq!(granted.len(), 1, "grants: {granted:?}");
    for h in held {
        assert_eq!(
            (h.owner, h.token),
            (granted[0].owner().clone(), granted[0].token())
        );
    }
    Ok(())
}

/// The fenced transaction commits the caller's rows under a held lease, writes nothing once the
/// lease is lost, and rolls back when the closure fails.
async fn fenced_transaction_commits_only_under_the_lease(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let audit = format!("{TABLE}_audit");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {audit} (k VARCHAR(255) NOT NULL, token BIGINT NOT NULL) \
         ENGINE=InnoDB"
    )))
    .execute(store.pool())
    .await?;
    let key = ctx.key("ftx");
    let lease = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("a"), ctx.long_ttl())
        .await?;
    let insert = |k: String, t: i64, fail: bool| audit_insert(audit.clone(), k, t, fail);
    let count = || async {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {audit} WHERE k = ?"
        )))
        .bind(key.as_str())
        .fetch_one(store.pool())
        .await
    };
    let t = lease.token().to_i64();
    let out = store
        .fenced_transaction(&lease, insert(key.as_str().into(), t, false))
        .await?;
    assert_eq!(out, FencedTx::Committed(()));
    assert_eq!(count().await?, 1);
    let err = store
        .fenced_transaction(&lease, insert(key.as_str().into(), t, true))
        .await;
    assert!(err.is_err(), "a failing closure committed: {err:?}");
    assert_eq!(count().await?, 1, "a failed closure's row was committed");
    let _ = store.release(&lease).await?;
    let out = store
        .fenced_transaction(&lease, insert(key.as_str().into(), t, false))
        .await?;
    assert_eq!(out, FencedTx::LeaseLost);
    assert_eq!(count().await?, 1, "a lost lease wrote");
    sqlx::query(AssertSqlSafe(format!("DELETE FROM {audit} WHERE k = ?")))
        .bind(key.as_str())
        .execute(store.pool())
        .await?;
    Ok(())
}

/// A lease that expires while the fenced transaction's closure runs: the re-check before
/// `COMMIT` finds it expired, so the transaction rolls back (`LeaseLost`, the closure's row is
/// not written). A fenced transaction on a lease that has already expired does not run its
/// closure at all (the row lock's validation refuses it first).
async fn fenced_transaction_rechecks_expiry_before_commit_and_before_the_closure(
    ctx: Ctx,
) -> CaseResult {
    let store = store().await?;
    let audit = format!("{TABLE}_audit");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {audit} (k VARCHAR(255) NOT NULL, token BIGINT NOT NULL) \
         ENGINE=InnoDB"
    )))
    .execute(store.pool())
    .await?;
    let key = ctx.key("ftx-expiry");
    let lease = ctx
        .must_acquire_with(
            &store,
            &key,
            &OwnerId::with_label("a"),
            Duration::from_millis(1000),
        )
        .await?;
    let body = insert_then_wait_for_expiry(
        audit.clone(),
        key.as_str().to_string(),
        lease.token().to_i64(),
    );
    let out = store.fenced_transaction(&lease, body).await?;
    let count = sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM {audit} WHERE k = ?"
    )))
    .bind(key.as_str())
    .fetch_one(store.pool())
    .await?;
    assert_eq!(
        (out, count),
        (FencedTx::LeaseLost, 0),
        "a fenced transaction committed although its lease expired before COMMIT"
    );

    // The lease has expired: the closure is not run.
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ran.clone();
    let out = store.fenced_transaction(&lease, mark_ran(flag)).await?;
    assert_eq!(out, FencedTx::LeaseLost);
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the closure ran on an expired lease"
    );
    sqlx::query(AssertSqlSafe(format!("DELETE FROM {audit} WHERE k = ?")))
        .bind(key.as_str())
        .execute(store.pool())
        .await?;
    Ok(())
}

/// A release that arrives after the lease expired by the server's clock is `NotHeld` and changes
/// nothing: the ownership had ended, and the release must not report it as its own (the same
/// answer the other stores give, whose release statements carry the same expiry check).
async fn release_after_expiry_is_not_held(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let key = ctx.key("late-release");
    let a = OwnerId::with_label("a");
    let lease = ctx
        .must_acquire_with(&store, &key, &a, ctx.short_ttl())
        .await?;
    let mut conn = store.pool().acquire().await?;
    wait_for_server_expiry(
        &mut conn,
        key.as_str(),
        ctx.expiry_deadline(ctx.short_ttl()),
    )
    .await?;
    drop(conn);
    assert_eq!(
        store.release(&lease).await?,
        ReleaseOutcome::NotHeld,
        "a release after expiry reported the ended ownership as released"
    );
    let state = store.inspect(&key).await?;
    assert!(state.holder.is_none(), "the expired key is held: {state:?}");
    assert_eq!(state.last_token, Some(lease.token()));
    Ok(())
}

/// A fenced-transaction body: one audit row, then a poll of the server's clock (the one that
/// decides expiry) until the lease row of `k`, locked by this transaction, has expired.
fn insert_then_wait_for_expiry(
    audit: String,
    k: String,
    t: i64,
) -> impl for<'c> FnOnce(&'c mut sqlx::MySqlConnection) -> BoxFuture<'c, Result<(), sqlx::Error>> + Send
{
    move |conn| {
        Box::pin(async move {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {audit} (k, token) VALUES (?, ?)"
            )))
            .bind(&k)
            .bind(t)
            .execute(&mut *conn)
            .await?;
            wait_for_server_expiry(conn, &k, Duration::from_secs(8)).await
        })
    }
}

/// Polls the server's clock (the one that decides expiry) on `conn` until the lease row of `key`
/// has expired, for at most `within`.
async fn wait_for_server_expiry(
    conn: &mut sqlx::MySqlConnection,
    key: &str,
    within: Duration,
) -> Result<(), sqlx::Error> {
    let give_up = tokio::time::Instant::now() + within;
    loop {
        let expired: bool = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT lease_until <= UTC_TIMESTAMP(6) FROM {TABLE} WHERE resource_key = ?"
        )))
        .bind(key)
        .fetch_one(&mut *conn)
        .await?;
        if expired {
            return Ok(());
        }
        if tokio::time::Instant::now() >= give_up {
            return Err(sqlx::Error::Protocol(format!(
                "the lease did not expire within {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fenced-transaction body that only records that it ran.
fn mark_ran(
    ran: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> impl for<'c> FnOnce(&'c mut sqlx::MySqlConnection) -> BoxFuture<'c, Result<(), sqlx::Error>> + Send
{
    move |_conn| {
        ran.store(true, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

/// A fenced-transaction body: one audit row, then (if `fail`) a failing statement.
fn audit_insert(
    audit: String,
    k: String,
    t: i64,
    fail: bool,
) -> impl for<'c> FnOnce(&'c mut sqlx::MySqlConnection) -> BoxFuture<'c, Result<(), sqlx::Error>> + Send
{
    move |conn| {
        Box::pin(async move {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {audit} (k, token) VALUES (?, ?)"
            )))
            .bind(k)
            .bind(t)
            .execute(&mut *conn)
            .await?;
            if fail {
                sqlx::query("SELECT * FROM no_such_table_at_all")
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        })
    }
}

/// One session holds the key's `GET_LOCK`: another's `try_with_lock` reports busy; after the
/// holder's closure ends the lock is free; a holder whose call is dropped leaks no lock.
async fn advisory_lock_excludes_and_dies_with_its_connection(ctx: Ctx) -> CaseResult {
    let a = AdvisoryLocks::new(store().await?.pool().clone());
    let b = AdvisoryLocks::new(store().await?.pool().clone());
    let key = ctx.key("adv");
    let (tx_in, rx_in) = tokio::sync::oneshot::channel::<()>();
    let (tx_done, rx_done) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let a = a.clone();
        let key = key.clone();
        tokio::spawn(async move {
            a.try_with_lock(&key, |_| {
                Box::pin(async move {
                    let _ = tx_in.send(());
                    let _ = rx_done.await;
                    Ok(42)
                })
            })
            .await
        })
    };
    rx_in.await.map_err(|_| "the holder never ran")?;
    let busy = b
        .try_with_lock(&key, |_| Box::pin(async { Ok(()) }))
        .await?;
    assert_eq!(busy, None, "ran while another session held the lock");
    let _ = tx_done.send(());
    assert_eq!(holder.await.map_err(|e| e.to_string())??, Some(42));
    let free = b.try_with_lock(&key, |_| Box::pin(async { Ok(7) })).await?;
    assert_eq!(free, Some(7));

    // A call dropped while holding the lock: its connection is closed, so the lock is free.
    let (tx_in, rx_in) = tokio::sync::oneshot::channel::<()>();
    let stuck = {
        let a = a.clone();
        let key = key.clone();
        tokio::spawn(async move {
            a.try_with_lock(&key, |_| {
                Box::pin(async move {
                    let _ = tx_in.send(());
                    std::future::pending::<()>().await;
                    Ok(())
                })
            })
            .await
        })
    };
    rx_in.await.map_err(|_| "the holder never ran")?;
    stuck.abort();
    let _ = stuck.await;
    super::eventually(
        Duration::from_secs(10),
        "the dropped lock to be freed",
        || async {
            matches!(
                b.try_with_lock(&key, |_| Box::pin(async { Ok(()) })).await,
                Ok(Some(()))
            )
        },
    )
    .await
}

/// A table that was never migrated is a configuration error naming what is missing.
async fn a_missing_schema_is_a_config_error(_ctx: Ctx) -> CaseResult {
    let opts = MysqlOptions::new(TableName::parse("lease_my_never_created")?).with_migrate(false);
    let err = MysqlLeaseStore::connect_with(&url(), opts)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("0 of 3 tables"), "{err}");
    Ok(())
}

/// The URL's own options configure the store; `mariadb://` is the same as `mysql://`; an
/// unknown parameter is refused.
async fn url_options_and_the_mariadb_scheme(ctx: Ctx) -> CaseResult {
    let u = url();
    let base = u.split_once("://").map(|(_, r)| r).ok_or("no scheme")?;
    let sep = if base.contains('?') { '&' } else { '?' };
    let maria = format!("mariadb://{base}{sep}table={TABLE}&migrate=false&op_timeout=3s");
    let store = MysqlLeaseStore::connect(&maria).await?;
    assert_eq!(store.options().op_timeout(), Duration::from_secs(3));
    assert_eq!(store.table().table(), TABLE);
    let lease = ctx
        .must_acquire_with(
            &store,
            &ctx.key("url"),
            &OwnerId::with_label("u"),
            ctx.short_ttl(),
        )
        .await?;
    let _ = store.release(&lease).await?;
    let err = MysqlLeaseStore::connect(&format!("mysql://{base}{sep}tabel=x"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config { .. }) && err.to_string().contains("tabel"));
    let _ = options();
    Ok(())
}
