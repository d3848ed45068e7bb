//! Measures what a grant costs on each path against a real apiserver: the first grant of a key
//! (the Lease does not exist: create path) and a grant of a released Lease (replace path).
//!
//! ```text
//! KUBECONFIG=/tmp/lease-test/k8s/kubeconfig cargo run -p leasehold-k8s --example create_cost -- 200
//! ```
//! Prints one line per path (median, 90th percentile and mean latency of `acquire`), with the
//! date, the host and the command; deletes the Leases it created.

use std::time::Duration;

use kube::api::{Api, DeleteParams};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome,
};
use leasehold_k8s::{K8sLeaseStore, K8sOptions};
use tokio::time::Instant;

fn summary(name: &str, mut v: Vec<Duration>) -> String {
    v.sort();
    let n = v.len().max(1);
    let mean = v.iter().sum::<Duration>() / u32::try_from(n).unwrap_or(u32::MAX);
    let at = |q: usize| {
        v.get((v.len() * q / 100).min(v.len().saturating_sub(1)))
            .copied()
    };
    format!(
        "{name}: n={} p50={:?} p90={:?} mean={mean:?}",
        v.len(),
        at(50).unwrap_or_default(),
        at(90).unwrap_or_default()
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).map_or(Ok(100), |a| a.parse())?;
    let ns = std::env::var("LEASE_K8S_NAMESPACE").unwrap_or_else(|_| "default".into());
    let kubeconfig = std::env::var("KUBECONFIG")?;
    let client = leasehold_k8s::client_from_kubeconfig(&kubeconfig).await?;
    let store = K8sLeaseStore::from_client(
        client.clone(),
        K8sOptions::default().with_namespace(ns.clone()),
    )?;
    let raw: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client, &ns);
    let owner = OwnerId::with_label("cost");
    let tag = std::process::id();
    let (mut create, mut replace) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let key = LeaseKey::new(format!("cost-{tag}-{i}"))?;
        let req = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(30));
        let t0 = Instant::now();
        let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? else {
            return Err(format!("{key} held").into());
        };
        create.push(t0.elapsed());
        assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
        let t0 = Instant::now();
        let AcquireOutcome::Acquired(_) = store.acquire(&req).await? else {
            return Err(format!("{key} held").into());
        };
        replace.push(t0.elapsed());
        raw.delete(key.as_str(), &DeleteParams::default()).await?;
    }
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    println!(
        "# {} host={} cpus={} command={:?}",
        jiff::Timestamp::now(),
        host.trim(),
        std::thread::available_parallelism().map_or(0, usize::from),
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    println!("{}", summary("create path (first grant)", create));
    println!(
        "{}",
        summary("replace path (grant of a released Lease)", replace)
    );
    Ok(())
}
