//! Failures against the real server: killed connections, an exhausted pool, bad configuration,
//! concurrent migrations, batched renewal.

use std::time::Duration;

use leasehold_core::{Error, FencedResource, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome};
use leasehold_postgres::{AdvisoryLocks, FencedTx, PostgresLeaseStore, PostgresOptions, TableName};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case};
use sqlx::AssertSqlSafe;
use tokio::time::Instant;

use super::{SCHEMA, eventually, options, store, url};

fn with_path(db: &str) -> String {
    let u = url();
    match u.rfind('/') {
        Some(i) if i > "postgres://".len() => format!("{}/{db}", &u[..i]),
        _ => format!("{u}/{db}"),
    }
}

/// `pg_terminate_backend` on the holder's connection: the lease lives in a row, not in the
/// session, so it survives; the next call either succeeds on a fresh connection or fails with a
/// retryable error, and a retry renews it. A fenced transaction whose connection dies commits
/// nothing and reports a retryable error. An advisory lock dies with its connection.
pub(crate) async fn terminated_connections_lose_no_lease_and_leak_no_lock(ctx: Ctx) -> CaseResult {
    let store = PostgresLeaseStore::connect_with(&url(), options().with_max_connections(1)).await?;
    let admin = super::store().await?;
    let key = ctx.key("killed");
    let a = OwnerId::with_label("a");
    let lease = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(store.pool())
        .await?;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(admin.pool())
        .await?;
    assert!(killed);
    eventually(Duration::from_secs(10), "the backend to exit", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(admin.pool())
            .await
            .map(|n| n == 0)
            .unwrap_or(false)
    })
    .await?;
    let renewed = match store.renew(&lease).await {
        Ok(out) => out,
        Err(e) if e.is_retryable() => store.renew(&lease).await?,
        Err(e) => {
            return Err(format!("not a retryable error after a killed connection: {e:?}").into());
        }
    };
    let RenewOutcome::Renewed(lease) = renewed else {
        return Err("the lease was lost with its connection".into());
    };
    let h = admin.inspect(&key).await?.holder.ok_or("not held")?;
    assert_eq!((h.owner, h.token), (a.clone(), lease.token()));

    // A fenced transaction whose connection dies in the middle writes nothing.
    let marker = format!("{}-marker", key.as_str());
    let m = marker.clone();
    let err = store
        .fenced_transaction(&lease, |conn| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(format!(
                    "INSERT INTO {SCHEMA}.leases_fence (resource_key, last_fencing_token) VALUES ($1, 1)"
                )))
                .bind(m)
                .execute(&mut *conn)
                .await?;
                sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())").execute(&mut *conn).await?;
                Ok(())
            })
        })
        .await;
    match err {
        Err(e) => assert!(e.is_retryable(), "{e:?}"),
        Ok(out) => {
            return Err(format!("a transaction on a killed connection returned {out:?}").into());
        }
    }
    let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {SCHEMA}.leases_fence WHERE resource_key = $1"
    )))
    .bind(&marker)
    .fetch_one(admin.pool())
    .await?;
    assert_eq!(n, 0, "a write of the killed transaction was committed");
    // The store recovers: the same lease still works through a fresh connection.
    let out = match store
        .fenced_transaction(&lease, |_| Box::pin(async { Ok(()) }))
        .await
    {
        Err(e) if e.is_retryable() => {
            store
                .fenced_transaction(&lease, |_| Box::pin(async { Ok(()) }))
                .await?
        }
        other => other?,
    };
    assert_eq!(out, FencedTx::Committed(()));

    // An advisory lock held by a connection that is killed is released with it.
    let locks = AdvisoryLocks::new(store.pool().clone());
    let other_locks = AdvisoryLocks::new(admin.pool().clone());
    let (tx_pid, rx_pid) = tokio::sync::oneshot::channel::<i32>();
    let holder = {
        let key = key.clone();
        tokio::spawn(async move {
            locks
                .with_lock(&key, |conn| {
                    Box::pin(async move {
                        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                            .fetch_one(&mut *conn)
                            .await?;
                        let _ = tx_pid.send(pid);
                        sqlx::query("SELECT pg_sleep(30)")
                            .execute(&mut *conn)
                            .await?;
                        Ok(())
                    })
                })
                .await
        })
    };
    let pid = rx_pid.await.map_err(|_| "lock holder never ran")?;
    assert_eq!(
        other_locks
            .try_with_lock(&key, |_| Box::pin(async { Ok(()) }))
            .await?,
        None
    );
    let _: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(admin.pool())
        .await?;
    let held = holder.await.map_err(|e| format!("join: {e}"))?;
    assert!(
        held.is_err_and(|e| e.is_retryable()),
        "the killed holder must see a retryable error"
    );
    eventually(
        Duration::from_secs(10),
        "the advisory lock to be released",
        || async {
            matches!(
                other_locks
                    .try_with_lock(&key, |_| Box::pin(async { Ok(()) }))
                    .await,
                Ok(Some(()))
            )
        },
    )
    .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    Ok(())
}

/// All pooled connections busy: the call fails after the pool's acquire timeout with a
/// retryable `Unavailable`, not a hang; once a connection is free it works again.
pub(crate) async fn pool_exhausted_is_a_retryable_error_without_hang(ctx: Ctx) -> CaseResult {
    let store = PostgresLeaseStore::connect_with(
        &url(),
        options()
            .with_max_connections(1)
            .with_acquire_timeout(Duration::from_millis(300)),
    )
    .await?;
    let key = ctx.key("pool");
    let a = OwnerId::with_label("a");
    let busy = store.pool().acquire().await?;
    let t0 = Instant::now();
    let err = store
        .acquire(&ctx.request(&key, &a, ctx.long_ttl()))
        .await
        .expect_err("no connection is free");
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t0.elapsed()
    );
    let err = store
        .fenced_resource()
        .read(&key)
        .await
        .expect_err("no connection is free");
    assert!(err.is_retryable(), "{err:?}");
    drop(busy);
    let lease = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    Ok(())
}

/// Bad configuration: each a typed error naming the problem, and nothing created.
///
/// The local server trusts every loopback login, so a *wrong password* cannot be produced here;
/// a login the server refuses (an unknown role, SQLSTATE 28000, the same class as a wrong
/// password's 28P01) and a missing database stand in for it.
pub(crate) async fn bad_configuration_is_a_typed_error(ctx: Ctx) -> CaseResult {
    let opts = || options().with_acquire_timeout(Duration::from_secs(3));
    let is_config = |r: leasehold_core::Result<PostgresLeaseStore>, what: &str| -> CaseResult {
        match r {
            Err(e @ Error::Config { .. }) => {
                assert!(!e.is_retryable());
                eprintln!("{what}: {e}");
                Ok(())
            }
            other => Err(format!("{what}: expected Error::Config, got {other:?}").into()),
        }
    };
    for bad in [
        "not a url",
        "postgres://[::1",
        "mysql://127.0.0.1/test",
        "postgres://h:notaport/db",
    ] {
        is_config(PostgresLeaseStore::connect_lazy(bad, opts()), bad)?;
        is_config(PostgresLeaseStore::connect_with(bad, opts()).await, bad)?;
    }
    is_config(
        PostgresLeaseStore::connect_with(&with_path("lease_no_such_database"), opts()).await,
        "missing database",
    )?;
    let mut u = url();
    if let Some(rest) = u.strip_prefix("postgres://") {
        let host = rest.split_once('@').map_or(rest, |(_, h)| h).to_string();
        u = format!("postgres://lease_no_such_role:wrong@{host}");
    }
    is_config(
        PostgresLeaseStore::connect_with(&u, opts()).await,
        "refused login",
    )?;

    // A table that was never migrated: connect says so, and so does an operation on an
    // unchecked store.
    let table = TableName::parse(&format!("{SCHEMA}.never_migrated_{}", fastrand::u32(..)))?;
    is_config(
        PostgresLeaseStore::connect_with(
            &url(),
            PostgresOptions::new(table.clone()).with_migrate(false),
        )
        .await,
        "missing table",
    )?;
    let unchecked = PostgresLeaseStore::connect_lazy(&url(), PostgresOptions::new(table))?;
    let key = ctx.key("no-table");
    match unchecked
        .acquire(&ctx.request(&key, &OwnerId::with_label("a"), ctx.long_ttl()))
        .await
    {
        Err(e @ Error::Config { .. }) => assert!(e.to_string().contains("migrate"), "{e}"),
        other => return Err(format!("acquire on a missing table: {other:?}").into()),
    }

    // Illegal table names are refused before any SQL exists.
    for bad in [
        "",
        "a.b.c",
        "Leases",
        "leases; drop table x",
        "le\"ases",
        "1leases",
        ".leases",
        "s.",
        &"t".repeat(41),
    ] {
        match TableName::parse(bad) {
            Err(Error::Config { message, .. }) => {
                assert!(message.contains("illegal table name"), "{message}")
            }
            other => return Err(format!("table name {bad:?}: {other:?}").into()),
        }
    }

    // An unreachable server is retryable, not a configuration problem.
    let err = PostgresLeaseStore::connect_with(
        "postgres://postgres@127.0.0.1:1/test",
        options().with_acquire_timeout(Duration::from_millis(500)),
    )
    .await
    .expect_err("nothing listens on port 1");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(!err.outcome_unknown(), "nothing was sent: {err:?}");
    Ok(())
}

/// `migrate()` run concurrently from several clients succeeds everywhere and leaves a schema
/// that `verify_schema` accepts; the objects are dropped afterwards.
pub(crate) async fn migrate_is_idempotent_and_concurrent_safe(_ctx: Ctx) -> CaseResult {
    let name = format!("mig_{}", fastrand::u32(..));
    let table = TableName::parse(&format!("{SCHEMA}.{name}"))?;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let s = PostgresLeaseStore::connect_lazy(
            &url(),
            PostgresOptions::new(table.clone()).with_max_connections(1),
        )?;
        tasks.push(tokio::spawn(async move { s.migrate().await }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("join: {e}"))??;
    }
    let s = PostgresLeaseStore::connect_with(
        &url(),
        PostgresOptions::new(table.clone()).with_migrate(false),
    )
    .await?;
    s.migrate().await?;
    s.verify_schema().await?;
    let key = leasehold_core::LeaseKey::new("mig-probe")?;
    let lease = s
        .acquire(&leasehold_core::AcquireRequest::new(
            key,
            OwnerId::random(),
            Duration::from_secs(5),
        ))
        .await?
        .lease()
        .ok_or("fresh table refused")?;
    assert_eq!(s.release(&lease).await?, ReleaseOutcome::Released);
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE {SCHEMA}.{name}; DROP TABLE {SCHEMA}.{name}_fence; DROP SEQUENCE {SCHEMA}.{name}_token_seq;"
    )))
    .execute(s.pool())
    .await?;
    Ok(())
}

/// `renew_many` (one `UPDATE .. FROM unnest(..)` here) renews exactly the leases that are still
/// held by their owner and token, reports the others lost, and the renewal really extends.
pub(crate) async fn renew_many_renews_exactly_the_held_leases(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let a = OwnerId::with_label("a");
    let ttl = Duration::from_secs(2);
    let k: Vec<_> = (0..4).map(|i| ctx.key(&format!("many{i}"))).collect();
    let l0 = ctx.must_acquire_with(&store, &k[0], &a, ttl).await?;
    let l1 = ctx.must_acquire_with(&store, &k[1], &a, ttl).await?;
    assert_eq!(store.release(&l1).await?, ReleaseOutcome::Released);
    let l2 = ctx.must_acquire_with(&store, &k[2], &a, ttl).await?;
    let stale = ctx.must_acquire_with(&store, &k[3], &a, ttl).await?;
    let l3 = ctx.must_acquire_with(&store, &k[3], &a, ttl).await?;
    let before = store
        .inspect(&k[0])
        .await?
        .holder
        .ok_or("not held")?
        .remaining;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = store.renew_many(&[l0.clone(), l1, l2, stale, l3]).await?;
    let kinds: Vec<bool> = out
        .iter()
        .map(|o| matches!(o, Ok(RenewOutcome::Renewed(_))))
        .collect();
    assert_eq!(kinds, vec![true, false, true, false, true]);
    let after = store
        .inspect(&k[0])
        .await?
        .holder
        .ok_or("not held")?
        .remaining;
    assert!(
        after > before.saturating_sub(Duration::from_millis(100)),
        "not extended: {before:?} -> {after:?}"
    );
    assert!(store.renew_many(&[]).await?.is_empty());
    Ok(())
}

/// The renewal supervisor over a one-connection pool whose connection is killed three times.
/// The lease lives in a row, so the supervisor recovers on a fresh connection and keeps its
/// token; if reconnecting is too slow (a loaded machine), it must go `AtRisk` and then
/// `Lost(DeadlineReached)`, never stay `Held` past its local deadline.
pub(crate) async fn supervisor_recovers_from_killed_connections(ctx: Ctx) -> CaseResult {
    use leasehold_core::supervisor::{Health, LossReason, Supervisor, SupervisorConfig};
    let store = PostgresLeaseStore::connect_with(&url(), options().with_max_connections(1)).await?;
    let admin = super::store().await?;
    let key = ctx.key("sup-killed");
    let ttl = Duration::from_millis(2400);
    let guard = Supervisor::new(store.clone(), SupervisorConfig::new(ttl))
        .acquire(&key)
        .await?
        .guard()
        .ok_or("not acquired")?;
    let token = guard.token();
    let mut seen = vec![guard.health()];
    'kills: for _ in 0..3 {
        let mine: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(store.pool())
            .await?;
        let _: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(mine)
            .fetch_one(admin.pool())
            .await?;
        let end = Instant::now() + ttl;
        while Instant::now() < end {
            let h = guard.health();
            if seen.last() != Some(&h) {
                seen.push(h);
            }
            if h == Health::Held {
                assert!(
                    guard.lease().deadline() + Duration::from_millis(20) > Instant::now(),
                    "Held past the local deadline: {seen:?}"
                );
            }
            if h.is_final() {
                break 'kills;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    match guard.health() {
        Health::Lost(reason) => {
            // Too slow to reconnect: the loss must have been announced by AtRisk and be due to
            // the deadline, not a refusal (nobody else touched the key).
            assert_eq!(reason, LossReason::DeadlineReached, "{seen:?}");
            assert!(
                seen.contains(&Health::AtRisk),
                "lost without AtRisk: {seen:?}"
            );
            eprintln!("supervisor lost the lease while reconnecting (allowed): {seen:?}");
        }
        _ => {
            eventually(
                Duration::from_secs(5),
                "the supervisor to be Held again",
                || async { guard.health() == Health::Held },
            )
            .await?;
            let h = admin.inspect(&key).await?.holder.ok_or("not held")?;
            assert_eq!(h.token, token, "{seen:?}");
            assert_eq!(guard.release().await?, ReleaseOutcome::Released);
        }
    }
    Ok(())
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(
            "postgres",
            terminated_connections_lose_no_lease_and_leak_no_lock
        ),
        case!("postgres", supervisor_recovers_from_killed_connections),
        case!("postgres", pool_exhausted_is_a_retryable_error_without_hang),
        case!("postgres", bad_configuration_is_a_typed_error),
        case!("postgres", migrate_is_idempotent_and_concurrent_safe),
        case!("postgres", renew_many_renews_exactly_the_held_leases),
    ]
}
