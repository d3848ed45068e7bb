//! Health checks and the leader gate with real elections and supervisors on the in-memory store
//! (local state only: no backend behaviour is exercised), served through tower and axum.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold_core::election::{Election, ElectionEvent};
use leasehold_core::supervisor::{Supervisor, SupervisorConfig};
use leasehold_core::{LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId};
use leasehold_http::{HealthCheck, LEASE_LEADER, LeaderGateLayer, LeaderTracker, PROBLEM_JSON};
use serde_json::Value;
use tower::ServiceExt;

type Res = Result<(), Box<dyn std::error::Error>>;

async fn get(
    app: &Router,
    path: &str,
) -> Result<(StatusCode, http::HeaderMap, Value), Box<dyn std::error::Error>> {
    let res = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty())?)
        .await?;
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await?.to_bytes();
    let v = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    Ok((status, headers, v))
}

fn election(
    store: Arc<dyn LeaseStore>,
    tracker: &LeaderTracker,
) -> Result<Election, leasehold_core::Error> {
    let ttl = Duration::from_secs(3);
    Ok(Election::from_arc(
        store,
        LeaseKey::new("controller")?,
        SupervisorConfig::new(ttl).with_acquire_wait(ttl),
    )
    .with_hook(tracker.hook()))
}

/// Two candidates, each with its app: the leader's gated route serves, the follower's answers
/// 503 problem+json naming the leader (body and `Lease-Leader` header); both liveness checks
/// pass, only the leader's `require_leading` check does. After the leader resigns, the other
/// takes over and the answers swap.
#[tokio::test(start_paused = true)]
async fn the_gate_serves_only_on_the_leader_and_names_it_elsewhere() -> Res {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let tracker = LeaderTracker::new();
    let election = election(store, &tracker)?;
    let app_of = |c: &leasehold_core::election::Candidate| {
        let check = tracker.check(&election, c);
        Router::new()
            .route("/work", axum::routing::get(|| async { "leader work" }))
            .route_layer(LeaderGateLayer::new(c, election.observe()))
            .merge(check.router("/healthz"))
            .merge(check.require_leading().router("/leader"))
    };
    let mut a = election.join(OwnerId::new("pod-a")?);
    assert!(matches!(
        a.next_event().await,
        Some(ElectionEvent::Elected { .. })
    ));
    let mut b = election.join(OwnerId::new("pod-b")?);
    let (app_a, app_b) = (app_of(&a), app_of(&b));
    // Let b's observer see a lead.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (s, _, body) = get(&app_a, "/work").await?;
    assert_eq!(
        (s, body),
        (StatusCode::OK, Value::String("leader work".into()))
    );
    let (s, h, body) = get(&app_b, "/work").await?;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(h[http::header::CONTENT_TYPE], PROBLEM_JSON);
    assert_eq!(h[http::header::RETRY_AFTER], "1");
    assert_eq!(h[LEASE_LEADER], "pod-a");
    assert_eq!(body["type"], "urn:lease:problem:not-leader");
    assert_eq!(body["leader"], "pod-a");
    assert!(body["term"].as_u64().is_some(), "{body}");

    for app in [&app_a, &app_b] {
        let (s, h, body) = get(app, "/healthz").await?;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(h[http::header::CONTENT_TYPE], "application/json");
        assert_eq!(body["healthy"], true);
    }
    let (_, _, body) = get(&app_a, "/healthz").await?;
    assert_eq!(body["state"], "leader");
    let (_, _, body) = get(&app_b, "/healthz").await?;
    assert_eq!(body["state"], "follower");
    assert_eq!(get(&app_a, "/leader").await?.0, StatusCode::OK);
    let (s, _, body) = get(&app_b, "/leader").await?;
    assert_eq!(
        (s, body["state"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, "not_leading".into())
    );

    a.resign().await;
    assert!(matches!(
        b.next_event().await,
        Some(ElectionEvent::Elected { .. })
    ));
    assert_eq!(get(&app_b, "/work").await?.0, StatusCode::OK);
    assert_eq!(get(&app_b, "/leader").await?.0, StatusCode::OK);
    let (s, _, body) = get(&app_a, "/work").await?;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    // a's observer may not have seen b yet; once it has, the refusal names b.
    if !body["leader"].is_null() {
        assert_eq!(body["leader"], "pod-b");
    }
    b.resign().await;
    Ok(())
}

/// A holder's check: healthy while held; once the lease is taken away in the store, the renewal
/// is refused and the check says `lost` (503) until the process does something about it.
#[tokio::test(start_paused = true)]
async fn a_holder_check_fails_once_its_lease_is_lost() -> Res {
    let store = Arc::new(MemoryLeaseStore::new());
    let sup = Supervisor::new(store.clone(), SupervisorConfig::new(Duration::from_secs(3)));
    let key = LeaseKey::new("singleton")?;
    let guard = sup.acquire(&key).await?.guard().ok_or("not acquired")?;
    let check = HealthCheck::holder(guard.view());
    let svc = check.service::<Body>();
    let report = check.report();
    assert!(report.healthy && report.state == "held", "{report:?}");
    assert_eq!(
        svc.clone().oneshot(Request::new(())).await?.status(),
        StatusCode::OK
    );

    // Someone releases it in the store: the next renewal is refused.
    let _ = store.release(&guard.lease()).await?;
    let lost = guard.lost().await;
    assert!(
        matches!(lost, leasehold_core::supervisor::Health::Lost(_)),
        "{lost:?}"
    );
    let report = check.report();
    assert!(!report.healthy && report.state == "lost", "{report:?}");
    assert_eq!(
        svc.oneshot(Request::new(())).await?.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    Ok(())
}
