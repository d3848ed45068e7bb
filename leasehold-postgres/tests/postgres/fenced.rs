//! The fenced transaction and the high-water-mark helper on the real server.

use std::time::Duration;

use leasehold_core::{Error, FencedResource, LeaseStore, OwnerId, WriteOutcome};
use leasehold_postgres::{FencedTx, PostgresLeaseStore, TxTimeouts};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::time::Instant;

use super::{SCHEMA, options, store, url};

async fn scratch(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {SCHEMA}.fenced_writes \
         (id bigserial PRIMARY KEY, resource_key text NOT NULL, fencing_token bigint NOT NULL)"
    )))
    .execute(pool)
    .await
    .map(|_| ())
}

async fn written(pool: &PgPool, key: &str) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT fencing_token FROM {SCHEMA}.fenced_writes WHERE resource_key = $1 ORDER BY id"
    )))
    .bind(key)
    .fetch_all(pool)
    .await
}

fn insert_sql() -> String {
    format!("INSERT INTO {SCHEMA}.fenced_writes (resource_key, fencing_token) VALUES ($1, $2)")
}

/// The holder's statements commit; a lost lease writes nothing and says so; a failing closure
/// rolls everything back and returns its error.
pub(crate) async fn fenced_transaction_commits_only_for_the_valid_holder(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    scratch(store.pool()).await?;
    let key = ctx.key("ftx");
    let k = key.as_str().to_string();
    let ttl = ctx.short_ttl();
    let a = OwnerId::with_label("a");
    let la = ctx.must_acquire_with(&store, &key, &a, ttl).await?;
    let (k1, t1) = (k.clone(), la.token().to_i64());
    let out = store
        .fenced_transaction(&la, |conn| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(insert_sql()))
                    .bind(k1)
                    .bind(t1)
                    .execute(&mut *conn)
                    .await?;
                Ok(7)
            })
        })
        .await?;
    assert_eq!(out, FencedTx::Committed(7));

    // A failing closure: rolled back, error returned, lease untouched.
    let (k2, t2) = (k.clone(), la.token().to_i64());
    let err = store
        .fenced_transaction(&la, |conn| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(insert_sql()))
                    .bind(k2)
                    .bind(t2)
                    .execute(&mut *conn)
                    .await?;
                sqlx::query("SELECT 1/0").execute(&mut *conn).await?;
                Ok(())
            })
        })
        .await
        .expect_err("division by zero must fail the transaction");
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");

    // B takes over after expiry; A's fenced transaction is refused and writes nothing.
    let b = OwnerId::with_label("b");
    let lb = ctx
        .acquire_within(&store, &key, &b, ctx.long_ttl(), ctx.expiry_deadline(ttl))
        .await?;
    let (k3, t3) = (k.clone(), la.token().to_i64());
    let out = store
        .fenced_transaction(&la, |conn| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(insert_sql()))
                    .bind(k3)
                    .bind(t3)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        })
        .await?;
    assert_eq!(out, FencedTx::LeaseLost);
    assert_eq!(written(store.pool(), &k).await?, vec![la.token().to_i64()]);
    assert!(
        store
            .fenced_transaction(&lb, |_| Box::pin(async { Ok(()) }))
            .await?
            .committed()
            .is_some()
    );
    Ok(())
}

/// While a fenced transaction holds the lease row, a takeover waits; a transaction that outlives
/// the lease is rolled back at the end (re-checked before commit), and then the takeover proceeds.
pub(crate) async fn fenced_transaction_holds_off_takeover_and_rechecks_expiry(
    ctx: Ctx,
) -> CaseResult {
    let store = store().await?;
    scratch(store.pool()).await?;
    let key = ctx.key("ftx-slow");
    let k = key.as_str().to_string();
    let ttl = Duration::from_millis(500);
    let a = OwnerId::with_label("a");
    let la = ctx.must_acquire_with(&store, &key, &a, ttl).await?;
    let (k1, t1) = (k.clone(), la.token().to_i64());
    let slow = {
        let store = store.clone();
        let la = la.clone();
        tokio::spawn(async move {
            store
                .fenced_transaction(&la, |conn| {
                    Box::pin(async move {
                        sqlx::query(AssertSqlSafe(insert_sql()))
                            .bind(k1)
                            .bind(t1)
                            .execute(&mut *conn)
                            .await?;
                        // Outlive the lease while holding the row.
                        sqlx::query("SELECT pg_sleep(1.2)")
                            .execute(&mut *conn)
                            .await?;
                        Ok(())
                    })
                })
                .await
        })
    };
    // Give the transaction time to lock the row, then wait past the lease's expiry.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let other = store_b().await?;
    let b = OwnerId::with_label("b");
    let t0 = Instant::now();
    let lb = ctx
        .acquire_within(&other, &key, &b, ctx.long_ttl(), Duration::from_secs(10))
        .await?;
    let out = slow.await.map_err(|e| format!("join: {e}"))??;
    assert_eq!(
        out,
        FencedTx::LeaseLost,
        "a transaction that outlived its lease committed"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(200),
        "takeover did not wait for the row lock"
    );
    assert!(lb.token() > la.token());
    assert!(
        written(store.pool(), &k).await?.is_empty(),
        "the rolled-back write is visible"
    );
    Ok(())
}

async fn store_b() -> leasehold_core::Result<PostgresLeaseStore> {
    store().await
}

/// `lock_timeout` bounds the wait for the lease row and `statement_timeout` bounds a stuck
/// statement: each is a typed, retryable timeout, and nothing is written.
pub(crate) async fn fenced_transaction_is_bounded_by_server_timeouts(ctx: Ctx) -> CaseResult {
    let bounded = PostgresLeaseStore::connect_with(
        &url(),
        options().with_tx_timeouts(
            TxTimeouts::default()
                .with_lock_timeout(Duration::from_millis(200))
                .with_statement_timeout(Duration::from_millis(400)),
        ),
    )
    .await?;
    scratch(bounded.pool()).await?;
    let key = ctx.key("ftx-bound");
    let k = key.as_str().to_string();
    let a = OwnerId::with_label("a");
    let la = ctx
        .must_acquire_with(&bounded, &key, &a, ctx.long_ttl())
        .await?;

    // A stuck statement.
    let t0 = Instant::now();
    let (k1, t1) = (k.clone(), la.token().to_i64());
    let err = bounded
        .fenced_transaction(&la, |conn| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(insert_sql()))
                    .bind(k1)
                    .bind(t1)
                    .execute(&mut *conn)
                    .await?;
                sqlx::query("SELECT pg_sleep(30)")
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        })
        .await
        .expect_err("statement_timeout must cancel the sleep");
    assert!(
        matches!(err, Error::Timeout { .. }) && err.is_retryable(),
        "{err:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "not bounded: {:?}",
        t0.elapsed()
    );

    // The row held by another transaction of the same holder: the second waits at most lock_timeout.
    let (tx_in, rx_in) = tokio::sync::oneshot::channel::<()>();
    let (tx_done, rx_done) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let store = bounded.clone();
        let la = la.clone();
        tokio::spawn(async move {
            store
                .fenced_transaction(&la, |_conn| {
                    Box::pin(async move {
                        let _ = tx_in.send(());
                        let _ = rx_done.await;
                        Ok(())
                    })
                })
                .await
        })
    };
    rx_in.await.map_err(|_| "first transaction never started")?;
    let t0 = Instant::now();
    let err = bounded
        .fenced_transaction(&la, |_| Box::pin(async { Ok(()) }))
        .await
        .expect_err("lock_timeout must end the wait");
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "lock wait not bounded: {:?}",
        t0.elapsed()
    );
    let _ = tx_done.send(());
    assert!(
        holder
            .await
            .map_err(|e| format!("join: {e}"))??
            .committed()
            .is_some()
    );
    assert!(written(bounded.pool(), &k).await?.is_empty());
    // The lease itself is unaffected.
    assert!(matches!(
        bounded.renew(&la).await?,
        leasehold_core::RenewOutcome::Renewed(_)
    ));
    Ok(())
}

/// `advance_in` fences the caller's own transaction: a newer generation installed first makes the
/// old one's transaction see `Rejected` before it writes.
pub(crate) async fn advance_in_fences_a_callers_own_transaction(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let res = store.fenced_resource();
    let key = ctx.key("advance");
    let a = OwnerId::with_label("a");
    let la = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    let lb = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    let mut tx = store.pool().begin().await?;
    assert!(
        res.advance_in(&mut tx, &key, la.token())
            .await?
            .is_accepted()
    );
    tx.commit().await?;
    assert!(res.install(&key, lb.token()).await?.is_accepted());
    let mut tx = store.pool().begin().await?;
    let out = res.advance_in(&mut tx, &key, la.token()).await?;
    tx.rollback().await?;
    assert_eq!(
        out,
        WriteOutcome::Rejected {
            presented: la.token(),
            high_water: lb.token()
        }
    );
    assert_eq!(res.read(&key).await?.high_water, Some(lb.token()));
    Ok(())
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(
            "postgres",
            fenced_transaction_commits_only_for_the_valid_holder
        ),
        case!(
            "postgres",
            fenced_transaction_holds_off_takeover_and_rechecks_expiry
        ),
        case!("postgres", fenced_transaction_is_bounded_by_server_timeouts),
        case!("postgres", advance_in_fences_a_callers_own_transaction),
    ]
}
