//! A Kubernetes controller-style leader election: replicas of a Deployment elect a leader with a
//! `coordination.k8s.io/v1` Lease; only the leader reconciles, and every object it writes carries
//! its term through the fenced resource (a ConfigMap whose high-water annotation rejects older
//! terms), so a deposed leader that still runs cannot overwrite its successor's work.
//!
//! In a cluster: `kubectl apply -f examples/k8s/` (RBAC + Deployment). Locally, with a kubeconfig:
//!
//! ```text
//! cargo run -p leasehold-examples --features k8s --bin k8s-controller -- --store k8s://default --rounds 3
//! ```
//! `--rounds N` reconciles N times, then resigns and exits (the default runs until SIGTERM).

use std::time::Duration;

use leasehold::election::{Election, ElectionEvent};
use leasehold::supervisor::SupervisorConfig;
use leasehold::{LeaseKey, OwnerId, WriteOp};
use leasehold_examples::{Backend, store_url};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut url = store_url();
    if url.starts_with("memory") {
        url = "k8s://".into();
    }
    let rounds: Option<u32> = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .and_then(|r| r.parse().ok());
    let name = std::env::var("LEASE_ELECTION").unwrap_or_else(|_| "example-controller".into());
    let key = LeaseKey::new(&name)?;
    // In a Deployment, POD_NAME comes from the downward API (see examples/k8s/deployment.yaml).
    let me = OwnerId::with_label(&std::env::var("POD_NAME").unwrap_or_else(|_| "local".into()));
    let backend = Backend::connect(&url).await?;
    let cfg =
        SupervisorConfig::new(Duration::from_secs(15)).with_acquire_wait(Duration::from_secs(15));
    let election = Election::from_arc(backend.store.clone(), key.clone(), cfg);
    let mut candidate = election.join(me.clone());
    println!("{me} joined the election {key}");
    let mut done = 0u32;
    let mut term_token = None;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            ev = candidate.next_event() => match ev {
                Some(ElectionEvent::Elected { term, work, .. }) => {
                    println!("{me} leads with term {term}");
                    term_token = Some((term, work));
                }
                Some(ElectionEvent::SteppedDown { term, reason }) => {
                    println!("{me} stepped down from term {term}: {reason}");
                    term_token = None;
                }
                Some(_) => {}
                None => break,
            },
            _ = tokio::time::sleep(Duration::from_secs(1)), if term_token.is_some() => {
                let Some((term, work)) = &term_token else { continue };
                if work.is_cancelled() {
                    continue;
                }
                // Reconcile: the write carries the term; an older term is rejected by the object.
                let out = backend.resource.write(&key, *term, WriteOp::Put(format!("reconciled by {me}").into_bytes())).await?;
                println!("{me} reconciled with term {term}: {}", if out.is_accepted() { "accepted" } else { "REJECTED (stale term)" });
                done += 1;
                if rounds.is_some_and(|r| done >= r) {
                    break;
                }
            }
        }
    }
    candidate.resign().await;
    println!("{me} resigned");
    Ok(())
}
