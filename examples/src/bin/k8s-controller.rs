//! A Kubernetes controller with kube-runtime's `Controller`, run only by the elected leader of
//! its replicas.
//!
//! - **Election**: the replicas of a Deployment elect a leader with a `coordination.k8s.io/v1`
//!   Lease (`LEASE_ELECTION`, default `example-controller`). Only the leader runs the
//!   `Controller`; it starts at each term and stops (gracefully, finishing the reconciles in
//!   flight) when the term ends.
//! - **Reconcile**: each ConfigMap matching `--selector` (default
//!   `leasehold.example/managed=true`) is reconciled by a write through the fenced resource (a
//!   ConfigMap whose high-water annotation rejects older terms) that carries the term, and then
//!   annotated with the term and the leader. A deposed leader that still runs has its write
//!   rejected and annotates nothing.
//! - **SIGTERM**: the pod's termination (a rolling update, a drain) sends SIGTERM; the controller
//!   stops, the leader resigns and releases the Lease, and another replica takes over at once
//!   instead of after the Lease's whole TTL. Ctrl-C does the same.
//! - **Probes** on `--probe-addr` (default `0.0.0.0:8080`): `/healthz` (liveness: fails when
//!   this replica leads but its Lease's renewal stalled past its deadline, as client-go's
//!   `HealthzAdaptor`), `/readyz` (readiness: the same check, so that followers are ready too and
//!   a rolling update proceeds), `/leader` (200 only on the leader, for a Service that should
//!   reach the leader alone; not a probe).
//!
//! In a cluster: `kubectl apply -f examples/k8s/` (RBAC + Deployment). Locally, with a kubeconfig:
//!
//! ```text
//! cargo run -p leasehold-examples --features k8s --bin k8s-controller -- --store k8s://default
//! ```

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use leasehold::election::{Election, ElectionEvent};
use leasehold::supervisor::SupervisorConfig;
use leasehold::{FencedResource, FencingToken, LeaseKey, OwnerId, WriteOp};
use leasehold_examples::{Backend, store_url};
use leasehold_http::LeaderTracker;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// The annotation a reconcile writes on each ConfigMap: the term it was reconciled under.
const TERM_ANNOTATION: &str = "leasehold.example/reconciled-term";
/// The annotation naming the leader that reconciled it.
const BY_ANNOTATION: &str = "leasehold.example/reconciled-by";

/// What every reconcile of one term needs.
struct Term {
    api: Api<ConfigMap>,
    resource: Arc<dyn FencedResource>,
    key: LeaseKey,
    term: FencingToken,
    me: OwnerId,
}

/// Why a reconcile failed.
#[derive(Debug)]
enum ReconcileError {
    /// The fenced resource or the API server failed.
    Failed(String),
}

impl std::fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReconcileError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ReconcileError {}

/// Reconciles one ConfigMap under the term: the fenced write first (rejected for a stale term),
/// then the annotations.
async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Term>) -> Result<Action, ReconcileError> {
    let name = cm.name_any();
    let note = format!("{name} reconciled by {} under term {}", ctx.me, ctx.term);
    let out = ctx
        .resource
        .write(&ctx.key, ctx.term, WriteOp::Put(note.into_bytes()))
        .await
        .map_err(|e| ReconcileError::Failed(e.to_string()))?;
    if !out.is_accepted() {
        println!(
            "{} reconciled {name} with term {}: REJECTED (stale term)",
            ctx.me, ctx.term
        );
        return Ok(Action::await_change());
    }
    let term = ctx.term.to_string();
    let seen = cm.annotations().get(TERM_ANNOTATION);
    if seen != Some(&term) {
        let patch = serde_json::json!({"metadata": {"annotations": {
            TERM_ANNOTATION: term,
            BY_ANNOTATION: ctx.me.as_str(),
        }}});
        ctx.api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| ReconcileError::Failed(e.to_string()))?;
    }
    println!(
        "{} reconciled {name} with term {}: accepted",
        ctx.me, ctx.term
    );
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn arg(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut url = store_url();
    if url.starts_with("memory") {
        url = "k8s://".into();
    }
    let selector = arg("--selector").unwrap_or_else(|| "leasehold.example/managed=true".into());
    let probe_addr = arg("--probe-addr").unwrap_or_else(|| "0.0.0.0:8080".into());
    let name = std::env::var("LEASE_ELECTION").unwrap_or_else(|_| "example-controller".into());
    let key = LeaseKey::new(&name)?;
    // In a Deployment, POD_NAME comes from the downward API (see examples/k8s/deployment.yaml).
    let me = OwnerId::with_label(&std::env::var("POD_NAME").unwrap_or_else(|_| "local".into()));
    // Signal handlers first: a SIGTERM from here on resigns instead of killing the process.
    let mut term_signal = signal(SignalKind::terminate())?;
    let mut int_signal = signal(SignalKind::interrupt())?;

    let backend = Backend::connect(&url).await?;
    let client = Client::try_default().await?;
    let namespace = url
        .strip_prefix("k8s://")
        .map(|n| n.split(['?', '/']).next().unwrap_or_default().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| client.default_namespace().to_string());
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);

    let ttl = Duration::from_secs(15);
    let tracker = LeaderTracker::new();
    let election = Election::from_arc(
        backend.store.clone(),
        key.clone(),
        SupervisorConfig::new(ttl).with_acquire_wait(ttl),
    )
    .with_hook(tracker.hook());
    let mut candidate = election.join(me.clone());
    let health = tracker.check(&election, &candidate);
    let app = axum::Router::new()
        .merge(health.router("/healthz"))
        .merge(health.router("/readyz"))
        .merge(health.clone().require_leading().router("/leader"));
    let listener = tokio::net::TcpListener::bind(&probe_addr).await?;
    println!("probes listening on {}", listener.local_addr()?);
    let probes = tokio::spawn(async move { axum::serve(listener, app).await });
    println!("{me} joined the election {key} in namespace {namespace}");

    // The running controller of the current term, if any.
    let mut running: Option<(CancellationToken, tokio::task::JoinHandle<()>)> = None;
    loop {
        tokio::select! {
            _ = term_signal.recv() => { println!("{me} got SIGTERM"); break; }
            _ = int_signal.recv() => { println!("{me} got SIGINT"); break; }
            ev = candidate.next_event() => match ev {
                Some(ElectionEvent::Elected { term, work, drain }) => {
                    println!("{me} leads with term {term}");
                    let ctx = Arc::new(Term {
                        api: api.clone(),
                        resource: backend.resource.clone(),
                        key: key.clone(),
                        term,
                        me: me.clone(),
                    });
                    let stop = work.clone();
                    let controller = Controller::new(api.clone(), watcher::Config::default().labels(&selector))
                        .graceful_shutdown_on(work.cancelled_owned())
                        .run(reconcile, |_cm, err, _ctx| {
                            eprintln!("reconcile failed: {err}");
                            Action::requeue(Duration::from_secs(2))
                        }, ctx);
                    let task = tokio::spawn(async move {
                        // The lease stays held (a planned end of the term waits) until this ends.
                        let _drain = drain;
                        controller.for_each(|_| async {}).await;
                    });
                    running = Some((stop, task));
                }
                Some(ElectionEvent::SteppedDown { term, reason }) => {
                    println!("{me} stepped down from term {term}: {reason}");
                    if let Some((stop, task)) = running.take() {
                        stop.cancel();
                        let _ = task.await;
                    }
                }
                Some(_) => {}
                None => break,
            },
        }
    }
    // Stop the controller (reconciles in flight finish), then release the Lease: the next
    // replica acquires it at once.
    if let Some((stop, task)) = running.take() {
        stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    candidate.resign().await;
    println!("{me} resigned");
    probes.abort();
    Ok(())
}
