//! Fence your API in ten lines: an axum service whose writes need a current fencing token.
//!
//! ```text
//! cargo run -p lease-http --features axum --example fenced_api          # listens on 127.0.0.1:8080
//! curl -i -X POST -H 'Fencing-Token: 2' -H 'Fencing-Key: k' http://127.0.0.1:8080/ledger   # 200
//! curl -i -X POST -H 'Fencing-Token: 1' -H 'Fencing-Key: k' http://127.0.0.1:8080/ledger   # 409
//! curl -i -X POST http://127.0.0.1:8080/ledger                                               # 428
//! ```
//! With a real lease (`lease run` exports the token it holds):
//! ```text
//! lease run --key k --ttl 30s -- sh -c \
//!   'curl -fsS -X POST -H "Fencing-Token: $LEASE_FENCING_TOKEN" -H "Fencing-Key: k" http://127.0.0.1:8080/ledger'
//! ```
//! `LEASE_HTTP_ADDR` overrides the address (`127.0.0.1:0` picks a free port, printed on start).
//! Here the high-water marks live in memory; in production pass the fenced resource of your lease
//! store (`PgFencedResource`, `SqliteLeaseStore::fenced_resource()`, ...) so every replica shares them.

use std::sync::Arc;

use axum::{Router, routing::post};
use lease_core::{FencedResource, MemoryFencedResource, WriteOp};
use lease_http::{AcceptedToken, FenceLayer};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
    let ledger = resource.clone();
    let app = Router::new()
        .route(
            "/ledger",
            post(move |t: AcceptedToken| async move {
                // Write through the same resource: the token is re-checked atomically with the write.
                let out = ledger.write(t.key(), t.token(), WriteOp::Add(1)).await;
                format!("token {} for {}: {out:?}\n", t.token(), t.key())
            }),
        )
        .layer(FenceLayer::new(resource));
    let addr = std::env::var("LEASE_HTTP_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("fenced API on http://{}/ledger", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
