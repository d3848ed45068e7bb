//! Fence your API in ten lines: an axum service whose account writes need a current fencing
//! token for the account they write (the key is the route's `{id}`).
//!
//! ```text
//! cargo run -p leasehold-http --features axum --example fenced_api          # listens on 127.0.0.1:8080
//! ```
//! The example's lease store is in memory, so it grants the leases itself: it acquires `a-1`
//! twice (releasing the first) and prints the two tokens and the `curl` lines to try:
//! ```text
//! curl -i -X POST -H 'Fencing-Token: 2' http://127.0.0.1:8080/accounts/a-1/deposit  # 200
//! curl -i -X POST -H 'Fencing-Token: 1' http://127.0.0.1:8080/accounts/a-1/deposit  # 409 stale
//! curl -i -X POST -H 'Fencing-Token: 9' http://127.0.0.1:8080/accounts/a-1/deposit  # 409 never issued
//! curl -i -X POST http://127.0.0.1:8080/accounts/a-1/deposit                        # 428
//! ```
//! `LEASE_HTTP_ADDR` overrides the address (`127.0.0.1:0` picks a free port, printed on start).
//! In production pass your lease store (the one whose tokens clients present, e.g. what
//! `lease run` acquires from) and its fenced resource (`PgFencedResource`,
//! `SqliteLeaseStore::fenced_resource()`, ...) so every replica shares the marks.

use std::sync::Arc;
use std::time::Duration;

use axum::{Router, routing::post};
use leasehold_core::{
    AcquireRequest, FencedResource, LeaseKey, LeaseStore, MemoryFencedResource, MemoryLeaseStore,
    OwnerId, WriteOp,
};
use leasehold_http::{AcceptedToken, FenceLayer, KeySource};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryLeaseStore::new());
    let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
    let ledger = resource.clone();
    let app = Router::new()
        .route(
            "/accounts/{id}/deposit",
            post(move |t: AcceptedToken| async move {
                // Write through the same resource: the token is re-checked atomically with the write.
                let out = ledger.write(t.key(), t.token(), WriteOp::Add(1)).await;
                format!("token {} for {}: {out:?}\n", t.token(), t.key())
            }),
        )
        .route_layer(
            FenceLayer::new(resource, store.clone()).key_source(KeySource::route_param("id")),
        );
    let addr = std::env::var("LEASE_HTTP_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let url = format!("http://{}/accounts/a-1/deposit", listener.local_addr()?);
    let grant = |owner: &str| -> leasehold_core::Result<AcquireRequest> {
        Ok(AcquireRequest::new(
            LeaseKey::new("a-1")?,
            OwnerId::new(owner)?,
            Duration::from_secs(3600),
        ))
    };
    let old = store
        .acquire(&grant("old")?)
        .await?
        .lease()
        .ok_or("a-1 is held")?;
    let _ = store.release(&old).await?;
    let new = store
        .acquire(&grant("new")?)
        .await?
        .lease()
        .ok_or("a-1 is held")?;
    println!(
        "fenced API on {url}: old token {}, current token {}",
        old.token(),
        new.token()
    );
    println!("curl -i -X POST -H 'Fencing-Token: {}' {url}", new.token());
    axum::serve(listener, app).await?;
    Ok(())
}
