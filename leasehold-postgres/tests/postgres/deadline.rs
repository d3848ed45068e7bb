//! Client-side deadlines: a fenced transaction, a lease-row fenced write and
//! an advisory lock on a connection that a fault proxy black-holes (bytes go in, nothing comes
//! back, no reset) must each return a retryable timeout within their deadline, not hang, and
//! the black-holed connection must not go back to the pool.
//!
//! The pools here skip sqlx's ping before handing out a connection (`test_before_acquire(false)`,
//! a pool a caller may well pass in), so the statement itself meets the black hole. The deadline
//! is short (300 ms); the test bound (30 s) is generous and only decides "hung".

use std::time::Duration;

use leasehold_core::{Error, FencedResource, LeaseStore, OwnerId, WriteOp};
use leasehold_faults::proxy::{FaultProxy, Mode};
use leasehold_postgres::{AdvisoryLocks, LeaseRowFence, PostgresLeaseStore, TxTimeouts};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case};
use sqlx::postgres::PgPoolOptions;

use super::{options, store, url};

const DEADLINE: Duration = Duration::from_millis(300);
const HUNG: Duration = Duration::from_secs(30);

/// A proxy in front of the test server and a one-connection pool through it, warmed up.
async fn proxied() -> Result<(FaultProxy, sqlx::PgPool), leasehold_testkit::Failed> {
    let u = url();
    let rest = u.split_once('@').map(|(_, r)| r).ok_or("url without '@'")?;
    let (hostport, db) = rest.split_once('/').ok_or("url without a database")?;
    let upstream = tokio::net::lookup_host(hostport)
        .await?
        .next()
        .ok_or("cannot resolve the server")?;
    let proxy = FaultProxy::start(upstream).await?;
    let user = u
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .map(|(user, _)| user)
        .ok_or("url without a user")?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        // sqlx gives an abandoned connection up to 5 s to close before its slot is free again.
        .acquire_timeout(Duration::from_secs(15))
        .connect(&format!("postgres://{user}@{}/{db}", proxy.addr()))
        .await?;
    sqlx::query("SELECT 1").execute(&pool).await?;
    Ok((proxy, pool))
}

/// Long server-side bounds (a server that ends an idle transaction after 5 s would also close the
/// connection, which the proxy passes on as an end of stream: a real black hole does not), a short
/// client-side deadline.
fn timeouts() -> TxTimeouts {
    TxTimeouts::default()
        .with_idle_timeout(Duration::from_secs(120))
        .with_statement_timeout(Duration::from_secs(120))
        .with_deadline(DEADLINE)
}

/// The call's result must be a retryable timeout; then, healed, the next call must work on a new
/// connection (the black-holed one was closed, not pooled).
fn expect_timeout<T: std::fmt::Debug>(
    what: &str,
    out: Result<leasehold_core::Result<T>, tokio::time::error::Elapsed>,
) -> CaseResult {
    match out {
        Err(_) => Err(format!("{what} hung on a black-holed connection for {HUNG:?}").into()),
        Ok(Err(e @ Error::Timeout { .. })) if e.is_retryable() => Ok(()),
        Ok(other) => Err(format!("{what}: expected a retryable timeout, got {other:?}").into()),
    }
}

pub(crate) async fn fenced_transaction_has_a_client_deadline(ctx: Ctx) -> CaseResult {
    let direct = store().await?;
    let (proxy, pool) = proxied().await?;
    let through =
        PostgresLeaseStore::from_pool(pool.clone(), options().with_tx_timeouts(timeouts()));
    // The check after healing has the default deadline: it opens a new connection.
    let healed = PostgresLeaseStore::from_pool(pool, options());
    let key = ctx.key("deadline-tx");
    let lease = ctx
        .must_acquire_with(&direct, &key, &OwnerId::with_label("a"), ctx.long_ttl())
        .await?;
    let proxy = std::sync::Arc::new(proxy);
    let p = proxy.clone();
    let out = tokio::time::timeout(
        HUNG,
        through.fenced_transaction(&lease, |conn| {
            Box::pin(async move {
                p.set_mode(Mode::Blackhole);
                sqlx::query("SELECT 1")
                    .execute(&mut *conn)
                    .await
                    .map(|_| ())
            })
        }),
    )
    .await;
    expect_timeout("fenced_transaction", out)?;
    proxy.heal();
    let before = proxy.accepted();
    let ok = healed
        .fenced_transaction(&lease, |conn| {
            Box::pin(async move {
                sqlx::query("SELECT 1")
                    .execute(&mut *conn)
                    .await
                    .map(|_| ())
            })
        })
        .await?;
    assert!(ok.committed().is_some());
    assert!(
        proxy.accepted() > before,
        "the black-holed connection was reused"
    );
    assert_eq!(
        direct.release(&lease).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    Ok(())
}

pub(crate) async fn lease_row_fence_has_a_client_deadline(ctx: Ctx) -> CaseResult {
    let direct = store().await?;
    let (proxy, pool) = proxied().await?;
    let through =
        PostgresLeaseStore::from_pool(pool.clone(), options().with_tx_timeouts(timeouts()));
    let fence = LeaseRowFence::new(through);
    let healed = LeaseRowFence::new(PostgresLeaseStore::from_pool(pool, options()));
    let key = ctx.key("deadline-row");
    let lease = ctx
        .must_acquire_with(&direct, &key, &OwnerId::with_label("a"), ctx.long_ttl())
        .await?;
    proxy.set_mode(Mode::Blackhole);
    let out = tokio::time::timeout(HUNG, fence.write(&key, lease.token(), WriteOp::Add(1))).await;
    expect_timeout("LeaseRowFence::write", out)?;
    proxy.heal();
    let before = proxy.accepted();
    assert!(
        healed
            .write(&key, lease.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert!(
        proxy.accepted() > before,
        "the black-holed connection was reused"
    );
    assert_eq!(
        direct.release(&lease).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    Ok(())
}

pub(crate) async fn advisory_locks_have_a_client_deadline(ctx: Ctx) -> CaseResult {
    let (proxy, pool) = proxied().await?;
    let locks = AdvisoryLocks::new(pool.clone()).with_timeouts(timeouts());
    let healed = AdvisoryLocks::new(pool);
    let key = ctx.key("deadline-lock");
    let proxy = std::sync::Arc::new(proxy);
    let p = proxy.clone();
    let out = tokio::time::timeout(
        HUNG,
        locks.with_lock(&key, |conn| {
            Box::pin(async move {
                p.set_mode(Mode::Blackhole);
                sqlx::query("SELECT 1")
                    .execute(&mut *conn)
                    .await
                    .map(|_| ())
            })
        }),
    )
    .await;
    expect_timeout("AdvisoryLocks::with_lock", out)?;
    proxy.heal();
    let before = proxy.accepted();
    let ran = healed
        .try_with_lock(&key, |conn| {
            Box::pin(async move {
                sqlx::query("SELECT 1")
                    .execute(&mut *conn)
                    .await
                    .map(|_| ())
            })
        })
        .await?;
    assert!(ran.is_some(), "the lock was left held");
    assert!(
        proxy.accepted() > before,
        "the black-holed connection was reused"
    );
    Ok(())
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("postgres", fenced_transaction_has_a_client_deadline),
        case!("postgres", lease_row_fence_has_a_client_deadline),
        case!("postgres", advisory_locks_have_a_client_deadline),
    ]
}
