//! A fenced transaction on PostgreSQL: the protected write runs in the same transaction that
//! locks and validates the lease row (owner, token, unexpired), so a holder whose lease expired
//! cannot commit anything, even if it never noticed.
//!
//! ```text
//! cargo run -p leasehold-examples --features postgres --bin fenced-transaction -- --store postgres://postgres@127.0.0.1:5432/test
//! ```

use std::time::Duration;

use leasehold::postgres::{FencedTx, PostgresLeaseStore};
use leasehold::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
use leasehold_examples::store_url;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut url = store_url();
    if url.starts_with("memory") {
        url = std::env::var("LEASE_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    }
    let store = PostgresLeaseStore::connect(&url).await?;
    store.migrate().await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS lease_example_ledger (tenant text PRIMARY KEY, balance bigint NOT NULL)")
        .execute(store.pool())
        .await?;
    let key = LeaseKey::derive(&format!("ledger {}", OwnerId::random()));
    let tenant = key.to_string();
    let ttl = Duration::from_millis(800);

    let a = OwnerId::new("worker-a")?;
    let AcquireOutcome::Acquired(lease_a) = store
        .acquire(&AcquireRequest::new(key.clone(), a, ttl))
        .await?
    else {
        return Err("the fresh key was held".into());
    };
    println!("worker-a holds {key} with token {}", lease_a.token());
    match store
        .fenced_transaction(&lease_a, credit(tenant.clone()))
        .await?
    {
        FencedTx::Committed(balance) => {
            println!("worker-a credits 100 in a fenced transaction: committed, balance {balance}")
        }
        FencedTx::LeaseLost => return Err("worker-a's valid lease was refused".into()),
    }

    println!("worker-a pauses for {:?} (longer than its ttl)...", ttl * 2);
    tokio::time::sleep(ttl * 2).await;
    let b = OwnerId::new("worker-b")?;
    let AcquireOutcome::Acquired(lease_b) = store
        .acquire(&AcquireRequest::new(key.clone(), b, ttl * 10))
        .await?
    else {
        return Err("the expired key was still held".into());
    };
    println!("worker-b takes over with token {}", lease_b.token());

    let late = store
        .fenced_transaction(&lease_a, credit(tenant.clone()))
        .await?;
    let balance: (i64,) =
        sqlx::query_as("SELECT balance FROM lease_example_ledger WHERE tenant = $1")
            .bind(&tenant)
            .fetch_one(store.pool())
            .await?;
    sqlx::query("DELETE FROM lease_example_ledger WHERE tenant = $1")
        .bind(&tenant)
        .execute(store.pool())
        .await?;
    match late {
        FencedTx::LeaseLost => {
            println!(
                "worker-a wakes up and tries again: LeaseLost, nothing written (balance still {})",
                balance.0
            );
            Ok(())
        }
        FencedTx::Committed(_) => Err("BUG: a stale holder committed".into()),
    }
}

/// The boxed future type the fenced transaction's closure returns.
type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// The protected write: credit 100 to `tenant`, inside the fenced transaction.
fn credit(
    tenant: String,
) -> impl for<'c> FnOnce(&'c mut sqlx::PgConnection) -> BoxFuture<'c, Result<i64, sqlx::Error>> + Send
{
    move |conn| {
        Box::pin(async move {
            let row: (i64,) = sqlx::query_as(
                "INSERT INTO lease_example_ledger (tenant, balance) VALUES ($1, 100) \
                 ON CONFLICT (tenant) DO UPDATE SET balance = lease_example_ledger.balance + 100 RETURNING balance",
            )
            .bind(tenant)
            .fetch_one(&mut *conn)
            .await?;
            Ok(row.0)
        })
    }
}
