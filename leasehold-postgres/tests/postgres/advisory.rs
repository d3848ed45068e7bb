//! Transaction-scoped advisory locks on the real server.

use std::time::Duration;

use leasehold_core::Error;
use leasehold_postgres::{AdvisoryLocks, TxTimeouts, advisory_lock_id};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case};

use super::store;

/// One transaction holds the key's lock: `try_with_lock` reports busy at once, `with_lock` gives
/// up after `lock_timeout`; after the holder commits the lock is free. The id mapping is the one
/// documented (SHA-256 computed by the server agrees).
pub(crate) async fn advisory_xact_lock_excludes_and_try_reports_busy(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let locks = AdvisoryLocks::new(store.pool().clone())
        .with_timeouts(TxTimeouts::default().with_lock_timeout(Duration::from_millis(200)));
    let key = ctx.key("adv");

    let server_id: i64 = sqlx::query_scalar(
        "SELECT ('x' || substr(encode(sha256(convert_to('leasehold-postgres/advisory/v1:' || $1, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint",
    )
    .bind(key.as_str())
    .fetch_one(store.pool())
    .await?;
    assert_eq!(
        server_id,
        advisory_lock_id(&key),
        "documented mapping disagrees"
    );

    let other = super::store().await?;
    let other_locks = AdvisoryLocks::new(other.pool().clone())
        .with_timeouts(TxTimeouts::default().with_lock_timeout(Duration::from_millis(200)));
    let (tx_in, rx_in) = tokio::sync::oneshot::channel::<()>();
    let (tx_done, rx_done) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let locks = locks.clone();
        let key = key.clone();
        tokio::spawn(async move {
            locks
                .with_lock(&key, |_conn| {
                    Box::pin(async move {
                        let _ = tx_in.send(());
                        let _ = rx_done.await;
                        Ok(42)
                    })
                })
                .await
        })
    };
    rx_in.await.map_err(|_| "holder never ran")?;
    let busy = other_locks
        .try_with_lock(&key, |_| Box::pin(async { Ok(()) }))
        .await?;
    assert_eq!(
        busy, None,
        "try_with_lock ran while another transaction held the lock"
    );
    let err = other_locks
        .with_lock(&key, |_| Box::pin(async { Ok(()) }))
        .await
        .expect_err("with_lock must give up after lock_timeout");
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    let _ = tx_done.send(());
    assert_eq!(holder.await.map_err(|e| format!("join: {e}"))??, 42);
    let ran = other_locks
        .try_with_lock(&key, |_| Box::pin(async { Ok(1) }))
        .await?;
    assert_eq!(
        ran,
        Some(1),
        "the lock was not released with the transaction"
    );
    Ok(())
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![case!(
        "postgres",
        advisory_xact_lock_excludes_and_try_reports_busy
    )]
}
