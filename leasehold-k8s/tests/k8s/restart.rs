//! The apiserver restarted while a lease is held: the holder rides it out with retryable errors,
//! keeps its lease and token, and a watcher reconnects.
//!
//! A separate test binary because it restarts the shared apiserver: cargo runs test binaries one
//! after another, so no other case sees the outage. Restarts with `LEASE_K8S_RESTART` (written
//! by `scripts/services/k8s.sh` into `k8s.env`); reads `KUBECONFIG` and `LEASE_K8S_NAMESPACE`.

use std::time::Duration;

use kube::api::{Api, DeleteParams};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome,
};
use leasehold_k8s::{K8sLeaseStore, K8sOptions};
use leasehold_testkit::require_services;
use leasehold_testkit::stores;
use tokio::time::Instant;

/// `KUBECONFIG`, or its default in leasehold-testkit's test store table.
fn kubeconfig() -> std::path::PathBuf {
    stores::KUBECONFIG.get().into()
}

async fn store() -> leasehold_core::Result<K8sLeaseStore> {
    let ns = stores::K8S_NAMESPACE.get();
    let options = K8sOptions::default()
        .with_kubeconfig(kubeconfig())
        .with_request_timeout(Duration::from_secs(2));
    K8sLeaseStore::connect_with(&format!("k8s://{ns}"), options).await
}

/// Skips (or, under CI/LEASE_TEST_REQUIRE, fails) when the service or the restart command is
/// missing.
async fn setup() -> Option<(K8sLeaseStore, String)> {
    let probe = async {
        store()
            .await?
            .inspect(&LeaseKey::new("lt-availability-probe")?)
            .await
    };
    let restart = std::env::var("LEASE_K8S_RESTART").unwrap_or_default();
    let problem = match probe.await {
        Err(e) => Some(format!("kube-apiserver unavailable: {e}")),
        Ok(_) if restart.is_empty() => Some("LEASE_K8S_RESTART is not set".to_string()),
        Ok(_) => None,
    };
    match problem {
        Some(p) if require_services() => {
            panic!("k8s restart test required (CI or LEASE_TEST_REQUIRE) but {p}")
        }
        Some(p) => {
            eprintln!("WARNING: apiserver_restart_while_held not run: {p}");
            None
        }
        None => Some((store().await.ok()?, restart)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_while_held() {
    let Some((holder, restart)) = setup().await else {
        return;
    };
    let key = LeaseKey::new(format!("lt-restart-{}", std::process::id())).unwrap();
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    // Long enough to outlive the outage (a graceful apiserver stop plus start takes 7 to 30 s on
    // a loaded machine); a lease whose TTL passes during the outage is correctly lost.
    let ttl = Duration::from_secs(90);
    let mut lease = holder
        .acquire(&AcquireRequest::new(key.clone(), a.clone(), ttl))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let token = lease.token();
    let watcher = store().await.unwrap();
    let mut watch = watcher.watch(&key).await.unwrap().expect("watch supported");

    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&restart)
        .spawn()
        .expect("run LEASE_K8S_RESTART");
    let mut errors = 0;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        match holder.renew(&lease).await {
            Ok(RenewOutcome::Renewed(next)) => lease = next,
            Ok(RenewOutcome::Lost) => {
                let api: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(
                    leasehold_k8s::client_from_kubeconfig(kubeconfig())
                        .await
                        .unwrap(),
                    "default",
                );
                let obj = api.get(key.as_str()).await;
                panic!(
                    "the lease was lost during the restart: handle {:?} token {} errors {errors}; object {obj:#?}",
                    lease.handle(),
                    lease.token()
                )
            }
            Err(e) => {
                assert!(
                    e.is_retryable(),
                    "non-retryable error during the restart: {e}"
                );
                errors += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(status.success(), "restart command failed: {status}");
    assert!(
        errors > 0,
        "no renewal failed: the apiserver did not go down"
    );

    // Back: the holder renews with the same token, others still see it held.
    let deadline = Instant::now() + Duration::from_secs(20);
    lease = loop {
        match holder.renew(&lease).await {
            Ok(RenewOutcome::Renewed(next)) => break next,
            Ok(RenewOutcome::Lost) => panic!("lost after the restart"),
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("renew after the restart: {e}"),
        }
    };
    assert_eq!(lease.token(), token);
    let other = store().await.unwrap();
    match other
        .acquire(&AcquireRequest::new(key.clone(), b.clone(), ttl))
        .await
        .unwrap()
    {
        AcquireOutcome::Held(h) => assert_eq!((h.owner, h.token), (a.clone(), token)),
        AcquireOutcome::Acquired(_) => panic!("another owner took a held lease after the restart"),
    }

    // The watch survived (reconnected): drain outage hints, then it signals the release.
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(50), watch.changed()).await {
    }
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    match tokio::time::timeout(Duration::from_secs(10), watch.changed()).await {
        Ok(Some(Ok(()))) => {}
        other => panic!("watch did not signal the release after the restart: {other:?}"),
    }
    let next = other
        .acquire(&AcquireRequest::new(key.clone(), b, ttl))
        .await
        .unwrap()
        .lease()
        .expect("free after release");
    assert!(next.token() > token);

    let api: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(
        leasehold_k8s::client_from_kubeconfig(kubeconfig())
            .await
            .unwrap(),
        &stores::K8S_NAMESPACE.get(),
    );
    let _ = api.delete(key.as_str(), &DeleteParams::default()).await;
}
