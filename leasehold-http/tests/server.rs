//! The server layer against a real HTTP server on loopback (axum + tokio `TcpListener`), with
//! concurrent writers holding old and new tokens issued by a real lease store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, FencingToken, LeaseKey, LeaseStore,
    MemoryFencedResource, MemoryLeaseStore, OwnerId, WriteOp, WriteOutcome,
};
use leasehold_http::{AcceptedToken, FenceLayer, KeySource, PROBLEM_JSON, Requirement};
use serde_json::Value;

/// The test store table of leasehold-testkit (one source file, std only).
#[path = "../../leasehold-testkit/src/stores.rs"]
#[allow(dead_code, unreachable_pub)]
mod stores;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const TTL: Duration = Duration::from_secs(30);

/// A fake issuer for the header-parsing cases: the memory store, but `inspect` reports that it
/// issued every token up to `i64::MAX`, so the layer's confirmation never refuses.
#[derive(Debug, Default)]
struct IssuedEverything(MemoryLeaseStore);

#[async_trait::async_trait]
impl LeaseStore for IssuedEverything {
    fn backend(&self) -> &'static str {
        "issued-everything"
    }
    fn capabilities(&self) -> leasehold_core::Capabilities {
        self.0.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> leasehold_core::Result<AcquireOutcome> {
        self.0.acquire(req).await
    }
    async fn renew(
        &self,
        lease: &leasehold_core::Lease,
    ) -> leasehold_core::Result<leasehold_core::RenewOutcome> {
        self.0.renew(lease).await
    }
    async fn release(
        &self,
        lease: &leasehold_core::Lease,
    ) -> leasehold_core::Result<leasehold_core::ReleaseOutcome> {
        self.0.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> leasehold_core::Result<leasehold_core::KeyState> {
        let mut state = self.0.inspect(key).await?;
        state.last_token = Some(FencingToken::new(i64::MAX.unsigned_abs())?);
        Ok(state)
    }
}

async fn serve(app: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// Two successive holders of `key` on `store`: the first releases, the second acquires. Returns
/// their (old, new) tokens, issued by the store itself.
async fn two_generations(
    store: &dyn LeaseStore,
    key: &LeaseKey,
) -> Result<(FencingToken, FencingToken), Box<dyn std::error::Error + Send + Sync>> {
    let req = |o: &str| -> leasehold_core::Result<AcquireRequest> {
        Ok(AcquireRequest::new(key.clone(), OwnerId::new(o)?, TTL))
    };
    let AcquireOutcome::Acquired(old) = store.acquire(&req("old-holder")?).await? else {
        return Err("old holder did not acquire".into());
    };
    let _ = store.release(&old).await?;
    let AcquireOutcome::Acquired(new) = store.acquire(&req("new-holder")?).await? else {
        return Err("new holder did not acquire".into());
    };
    assert!(new.token() > old.token());
    Ok((old.token(), new.token()))
}

/// A ledger service: the handler writes through the same resource with the accepted token and
/// counts how often it ran.
fn ledger_app(
    resource: Arc<dyn FencedResource>,
    calls: Arc<AtomicU64>,
    layer: FenceLayer,
) -> Router {
    let handler = move |t: AcceptedToken| {
        let (resource, calls) = (resource.clone(), calls.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            match resource.write(t.key(), t.token(), WriteOp::Add(1)).await {
                Ok(WriteOutcome::Accepted { .. }) => (StatusCode::OK, t.token().to_string()),
                Ok(WriteOutcome::Rejected { .. }) => (StatusCode::CONFLICT, "raced".into()),
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            }
        }
    };
    Router::new()
        .route("/ledger", post(handler.clone()))
        .route("/accounts/{id}/deposit", post(handler))
        .layer(layer)
}

#[derive(Debug, Default)]
struct Tally {
    /// Passed the layer and written through the resource.
    ok: u64,
    /// Refused by the layer: 409 problem+json.
    stale: u64,
    /// Passed the layer, then the handler's own write-through was rejected because a newer token
    /// was accepted in between (the documented gap between check and write).
    raced: u64,
}

/// Sends `n` writes with `old` and `n` with `new`, all at once, to `url`, and checks every answer:
/// a 200 carries the token echoed, a 409 is problem+json naming `expect_high` as the highest
/// accepted token and `old` as the presented one.
async fn storm(
    url: &str,
    key: Option<&LeaseKey>,
    old: FencingToken,
    new: FencingToken,
    n: usize,
    expect_high: FencingToken,
) -> Result<(Tally, Tally), Box<dyn std::error::Error + Send + Sync>> {
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..2 * n {
        let token = if i % 2 == 0 { old } else { new };
        let mut req = client
            .post(url)
            .header("Fencing-Token", token.get().to_string());
        if let Some(key) = key {
            req = req.header("Fencing-Key", key.as_str());
        }
        tasks.spawn(async move {
            let res = req.send().await?;
            let status = res.status();
            let ctype = res
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body = res.bytes().await?;
            Ok::<_, reqwest::Error>((token, status, ctype, body))
        });
    }
    let (mut olds, mut news) = (Tally::default(), Tally::default());
    while let Some(joined) = tasks.join_next().await {
        let (token, status, ctype, body) = joined??;
        let tally = if token == old { &mut olds } else { &mut news };
        match status {
            reqwest::StatusCode::OK => {
                assert_eq!(&body[..], token.to_string().as_bytes());
                tally.ok += 1;
            }
            reqwest::StatusCode::CONFLICT if &body[..] == b"raced" => tally.raced += 1,
            reqwest::StatusCode::CONFLICT => {
                assert_eq!(ctype, PROBLEM_JSON);
                let v: Value = serde_json::from_slice(&body)?;
                assert_eq!(v["status"], 409, "{v}");
                assert_eq!(v["type"], "urn:lease:problem:stale-fencing-token");
                assert_eq!(v["highest_accepted_token"], expect_high.get(), "{v}");
                assert_eq!(v["presented_token"], token.get(), "{v}");
                assert!(v["title"].is_string() && v["detail"].is_string());
                tally.stale += 1;
            }
            other => return Err(format!("unexpected status {other}: {body:?}").into()),
        }
    }
    Ok((olds, news))
}

/// Exact counts: once the new holder's first request is accepted, all N old-token writes get 409
/// naming the new token, all N new-token writes reach the handler, and the resource saw exactly
/// the accepted ones.
async fn stale_and_fresh_writers(
    store: Arc<dyn LeaseStore>,
    resource: Arc<dyn FencedResource>,
    route_key: bool,
) -> TestResult {
    const N: usize = 40;
    let key = LeaseKey::new(format!("acct-{}", uuid::Uuid::new_v4().simple()))?;
    let (old, new) = two_generations(&*store, &key).await?;
    let calls = Arc::new(AtomicU64::new(0));
    let mut layer = FenceLayer::new(resource.clone(), store);
    if route_key {
        layer = layer.key_source(KeySource::path("/accounts/{id}/deposit", "id")?);
    }
    let addr = serve(ledger_app(resource.clone(), calls.clone(), layer)).await?;
    let (url, header_key) = if route_key {
        (format!("http://{addr}/accounts/{key}/deposit"), None)
    } else {
        (format!("http://{addr}/ledger"), Some(&key))
    };

    // Phase 1: old and new writers race; whatever the interleaving, every new write is accepted,
    // every old write refused by the layer names the new token, and an old write that passed the
    // layer just before a new one is caught by the handler's write-through ("raced").
    let (olds, news) = storm(&url, header_key, old, new, N, new).await?;
    assert_eq!(
        (news.ok, news.stale, news.raced),
        (N as u64, 0, 0),
        "{news:?}"
    );
    assert_eq!(olds.ok + olds.stale + olds.raced, N as u64, "{olds:?}");
    let after_race = olds.ok + news.ok;
    assert_eq!(calls.load(Ordering::SeqCst), after_race + olds.raced);
    eprintln!("race phase: old {olds:?}, new {news:?}");

    // Phase 2: the new token is recorded, so every old write is refused.
    let (olds2, news2) = storm(&url, header_key, old, new, N, new).await?;
    assert_eq!(
        (olds2.ok, olds2.stale, olds2.raced),
        (0, N as u64, 0),
        "{olds2:?}"
    );
    assert_eq!(
        (news2.ok, news2.stale, news2.raced),
        (N as u64, 0, 0),
        "{news2:?}"
    );
    let total = after_race + N as u64;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        total + olds.raced,
        "the handler ran only for tokens the layer accepted"
    );
    let state = resource.read(&key).await?;
    assert_eq!(state.counter, i64::try_from(total)?);
    assert_eq!(state.accepted, total);
    assert_eq!(state.high_water, Some(new));

    // A token above every token the store issued is refused and does not move the mark.
    let forged = (new.get() + 1_000).to_string();
    let mut headers = vec![("Fencing-Token", forged.as_str())];
    if !route_key {
        headers.push(("Fencing-Key", key.as_str()));
    }
    let (s, v) = send(&url, &headers).await?;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["type"], "urn:lease:problem:unissued-fencing-token", "{v}");
    assert_eq!(v["last_issued_token"], new.get(), "{v}");
    assert_eq!(resource.read(&key).await?.high_water, Some(new));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stale_writers_get_409_fresh_reach_handler() -> TestResult {
    let store = Arc::new(MemoryLeaseStore::new());
    stale_and_fresh_writers(store, Arc::new(MemoryFencedResource::new()), false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_fenced_resource_key_from_route() -> TestResult {
    let path = std::env::temp_dir().join(format!("leasehold-http-{}.db", uuid::Uuid::new_v4()));
    let store = Arc::new(leasehold_sqlite::SqliteLeaseStore::open(&path).await?);
    let resource: Arc<dyn FencedResource> = Arc::new(store.fenced_resource());
    let result = stale_and_fresh_writers(store.clone(), resource, true).await;
    store.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    result
}

async fn send(
    url: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, Value), Box<dyn std::error::Error + Send + Sync>> {
    let mut req = reqwest::Client::new().post(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = req.send().await?;
    let status = res.status().as_u16();
    let is_problem = res
        .headers()
        .get("content-type")
        .is_some_and(|v| v == PROBLEM_JSON);
    let body = res.bytes().await?;
    let v = if is_problem {
        let v: Value = serde_json::from_slice(&body)?;
        assert_eq!(v["status"], status, "{v}");
        assert!(v["type"].is_string() && v["title"].is_string() && v["detail"].is_string());
        v
    } else {
        Value::String(String::from_utf8_lossy(&body).into_owned())
    };
    Ok((status, v))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_malformed_and_optional_tokens() -> TestResult {
    let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
    let calls = Arc::new(AtomicU64::new(0));
    let issuer: Arc<dyn LeaseStore> = Arc::new(IssuedEverything::default());
    let required = ledger_app(
        resource.clone(),
        calls.clone(),
        FenceLayer::new(resource.clone(), issuer.clone()),
    );
    let optional = Router::new()
        .route(
            "/maybe",
            post(|t: Option<AcceptedToken>| async move {
                t.map_or_else(|| "none".to_owned(), |t| t.token().to_string())
            }),
        )
        .layer(FenceLayer::new(resource.clone(), issuer).requirement(Requirement::Optional));
    let addr = serve(required.merge(optional)).await?;
    let ledger = format!("http://{addr}/ledger");

    let (s, v) = send(&ledger, &[]).await?;
    assert_eq!((s, &v["missing"]), (428, &Value::from("fencing-token")));
    let (s, v) = send(&ledger, &[("Fencing-Token", "3")]).await?;
    assert_eq!((s, &v["missing"]), (428, &Value::from("fencing-key")));
    for bad in ["abc", "0", "-1", "9223372036854775808", "", "1.5"] {
        let (s, v) = send(&ledger, &[("Fencing-Token", bad), ("Fencing-Key", "k")]).await?;
        assert_eq!(
            (s, &v["header"]),
            (400, &Value::from("fencing-token")),
            "{bad:?}: {v}"
        );
    }
    let (s, v) = send(
        &ledger,
        &[("Fencing-Token", "3"), ("Fencing-Key", "Bad/Key")],
    )
    .await?;
    assert_eq!((s, &v["header"]), (400, &Value::from("fencing-key")), "{v}");
    let (s, _) = send(
        &ledger,
        &[
            ("Fencing-Token", "3"),
            ("Fencing-Token", "4"),
            ("Fencing-Key", "k"),
        ],
    )
    .await?;
    assert_eq!(s, 400);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "no refused request reached the handler"
    );
    assert_eq!(resource.read(&LeaseKey::new("k")?).await?.high_water, None);

    let (s, v) = send(
        &ledger,
        &[
            ("Fencing-Token", "9223372036854775807"),
            ("Fencing-Key", "k"),
        ],
    )
    .await?;
    assert_eq!((s, v), (200, Value::from("9223372036854775807")));

    let maybe = format!("http://{addr}/maybe");
    assert_eq!(send(&maybe, &[]).await?, (200, Value::from("none")));
    assert_eq!(
        send(&maybe, &[("Fencing-Token", "5"), ("Fencing-Key", "m")]).await?,
        (200, Value::from("5"))
    );
    let (s, v) = send(&maybe, &[("Fencing-Token", "4"), ("Fencing-Key", "m")]).await?;
    assert_eq!((s, &v["highest_accepted_token"]), (409, &Value::from(5)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_failure_is_503_and_handler_does_not_run() -> TestResult {
    let path = std::env::temp_dir().join(format!("leasehold-http-{}.db", uuid::Uuid::new_v4()));
    let store = Arc::new(leasehold_sqlite::SqliteLeaseStore::open(&path).await?);
    let resource: Arc<dyn FencedResource> = Arc::new(store.fenced_resource());
    let calls = Arc::new(AtomicU64::new(0));
    let addr = serve(ledger_app(
        resource.clone(),
        calls.clone(),
        FenceLayer::new(resource, store.clone()),
    ))
    .await?;
    let url = format!("http://{addr}/ledger");
    let key = LeaseKey::new("k")?;
    let (_, token) = two_generations(&*store, &key).await?;
    let token = token.get().to_string();
    let (s, _) = send(&url, &[("Fencing-Token", &token), ("Fencing-Key", "k")]).await?;
    assert_eq!(s, 200);
    store.close().await; // the pool is closed: every check now fails
    let (s, v) = send(&url, &[("Fencing-Token", &token), ("Fencing-Key", "k")]).await?;
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["type"], "urn:lease:problem:fencing-unavailable");
    assert!(v["retryable"].is_boolean(), "{v}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(())
}

/// The same storm against PostgreSQL's high-water table (`LEASE_POSTGRES_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`), tokens issued by the PostgreSQL lease store. An
/// unreachable server fails the test under `CI` / `LEASE_TEST_REQUIRE`, and is reported otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_high_water_table() -> TestResult {
    use leasehold_postgres::{PostgresLeaseStore, PostgresOptions, TableName};
    let url = stores::POSTGRES_URL.get();
    let options = PostgresOptions::new(TableName::parse("lease_http_test.leases")?)
        .with_max_connections(4)
        .with_acquire_timeout(Duration::from_secs(5));
    let store = Arc::new(PostgresLeaseStore::connect_lazy(&url, options)?);
    if let Err(e) = store.migrate().await {
        let required = ["CI", "LEASE_TEST_REQUIRE"]
            .iter()
            .any(|v| std::env::var(v).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes")));
        if required {
            return Err(format!("PostgreSQL at {url} is required: {e}").into());
        }
        eprintln!("SKIPPED postgres_high_water_table: PostgreSQL at {url} unavailable: {e}");
        return Ok(());
    }
    let resource: Arc<dyn FencedResource> = Arc::new(store.fenced_resource());
    stale_and_fresh_writers(store, resource, false).await
}
