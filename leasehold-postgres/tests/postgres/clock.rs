//! A forward step of the server's clock. PostgreSQL judges expiry by
//! `clock_timestamp()`, so a step of the server's wall clock by S ends every lease S early. The
//! step is reproduced on the row: `lease_until` moved back by S is exactly what the comparison
//! `lease_until <= clock_timestamp()` sees after the clock jumped forward by S (stepping the
//! shared server's real clock would disturb every other test on the machine).

use std::time::Duration;

use leasehold_core::{FencedResource, LeaseStore, OwnerId, WriteOp};
use leasehold_postgres::{FencedTx, LeaseRowFence};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case};
use sqlx::AssertSqlSafe;

use super::{store, table};

/// The early grant happens while the old holder's local deadline is still far away, and every
/// fenced path rejects the old holder afterwards: the fenced transaction reports `LeaseLost`, the
/// lease-row fence and the high-water table reject its token.
pub(crate) async fn forward_clock_step_grants_early_and_fencing_rejects_the_old_holder(
    ctx: Ctx,
) -> CaseResult {
    let store = store().await?;
    let key = ctx.key("clock-step");
    let ttl = Duration::from_secs(60);
    let old = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("old"), ttl)
        .await?;
    let row_fence = LeaseRowFence::new(store.clone());
    let table_fence = store.fenced_resource();
    assert!(
        row_fence
            .write(&key, old.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert!(
        table_fence
            .write(&key, old.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );

    // The server's clock steps forward by two minutes (more than the TTL).
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {} SET lease_until = lease_until - interval '120 seconds' WHERE resource_key = $1",
        table()
    )))
    .bind(key.as_str())
    .execute(store.pool())
    .await?;

    // The early grant: the old holder still believes (about a minute left locally).
    let new = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("new"), ttl)
        .await?;
    assert!(
        old.remaining() > Duration::from_secs(30),
        "the old holder's local deadline should still be far away"
    );
    assert!(new.token() > old.token());
    assert!(table_fence.install(&key, new.token()).await?.is_accepted());

    // Fencing rejects the old holder everywhere.
    let tx = store
        .fenced_transaction(&old, |conn| {
            Box::pin(async move {
                sqlx::query("SELECT 1")
                    .execute(&mut *conn)
                    .await
                    .map(|_| ())
            })
        })
        .await?;
    assert_eq!(tx, FencedTx::LeaseLost);
    assert!(
        !row_fence
            .write(&key, old.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert!(
        !table_fence
            .write(&key, old.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert!(
        row_fence
            .write(&key, new.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert_eq!(
        store.release(&new).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    Ok(())
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![case!(
        "postgres",
        forward_clock_step_grants_early_and_fencing_rejects_the_old_holder
    )]
}
