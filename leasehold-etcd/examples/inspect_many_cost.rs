//! Measures `inspect_many` of many held keys against as many single `inspect`s (the trait's
//! default), in both lease sharing modes: wall time, and requests counted by the member itself
//! (`grpc_server_msg_received_total` on its `/metrics`, which also counts other clients of the
//! member during the span). The figures are quoted in `docs/adr/0030-etcd-lease-sharing.md`.
//!
//! ```text
//! LEASE_ETCD_ENDPOINTS=http://127.0.0.1:23790 \
//!     cargo run --release -p leasehold-etcd --example inspect_many_cost -- 10000
//! ```

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use leasehold_core::{AcquireRequest, Lease, LeaseKey, LeaseStore, OwnerId};
use leasehold_etcd::{EtcdLeaseStore, EtcdOptions, LeaseSharing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Every gRPC message the member received so far.
async fn requests(addr: &str) -> Res<u64> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    conn.read_to_string(&mut body).await?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum())
}

#[tokio::main]
async fn main() -> Res<()> {
    let n: usize = std::env::args().nth(1).map_or(Ok(10_000), |a| a.parse())?;
    let endpoint = std::env::var("LEASE_ETCD_ENDPOINTS")
        .unwrap_or_else(|_| "http://127.0.0.1:23790".to_string());
    let addr = endpoint
        .split(',')
        .next()
        .unwrap_or_default()
        .trim_start_matches("http://")
        .to_string();
    for sharing in [LeaseSharing::PerGrant, LeaseSharing::PerTtl] {
        let options = EtcdOptions::default()
            .with_prefix("inspect-many-cost/")
            .with_lease_sharing(sharing);
        let store = EtcdLeaseStore::connect_with(&format!("etcd://{addr}"), options).await?;
        let owner = OwnerId::with_label("inspect-many-cost");
        let keys: Vec<LeaseKey> = (0..n)
            .map(|i| LeaseKey::new(format!("k{i:06}")))
            .collect::<Result<_, _>>()?;
        let leases: Vec<Lease> = futures::stream::iter(keys.clone())
            .map(|k| {
                let (store, owner) = (store.clone(), owner.clone());
                async move {
                    let req = AcquireRequest::new(k, owner, Duration::from_secs(120));
                    store
                        .acquire(&req)
                        .await?
                        .lease()
                        .ok_or_else(|| "held".into())
                }
            })
            .buffer_unordered(64)
            .try_collect::<Vec<Lease>>()
            .await
            .map_err(|e: Box<dyn std::error::Error + Send + Sync>| e)?;

        for round in 0..2 {
            let (r0, t0) = (requests(&addr).await?, Instant::now());
            let many = store.inspect_many(&keys).await?;
            let (took_many, r1) = (t0.elapsed(), requests(&addr).await?);
            let t1 = Instant::now();
            let mut one = Vec::with_capacity(keys.len());
            for k in &keys {
                one.push(store.inspect(k).await?);
            }
            let (took_one, r2) = (t1.elapsed(), requests(&addr).await?);
            let held = many.iter().filter(|s| s.holder.is_some()).count();
            let agree = many.iter().zip(&one).all(|(a, b)| {
                a.holder.as_ref().map(|h| h.token) == b.holder.as_ref().map(|h| h.token)
            });
            println!(
                "{sharing:?} round {round}: {n} held keys ({held} reported held, agree: {agree}): \
                 inspect_many {:.0} ms, {} requests; {n} x inspect {:.0} ms, {} requests; \
                 ratio {:.1}x",
                took_many.as_secs_f64() * 1000.0,
                r1 - r0,
                took_one.as_secs_f64() * 1000.0,
                r2 - r1,
                took_one.as_secs_f64() / took_many.as_secs_f64()
            );
        }
        futures::stream::iter(leases)
            .map(|l| {
                let store = store.clone();
                async move { store.release(&l).await }
            })
            .buffer_unordered(64)
            .try_collect::<Vec<_>>()
            .await?;
    }
    Ok(())
}
