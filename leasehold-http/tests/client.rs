//! The client side: the tower layer and the reqwest helper attach the guard's token, and refuse to
//! send once the holder may no longer act.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use leasehold_core::supervisor::{Acquisition, Health, Supervisor, SupervisorConfig};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, FencedResource, KeyState, Lease, LeaseKey,
    LeaseStore, MemoryFencedResource, MemoryLeaseStore, ReleaseOutcome, RenewOutcome,
};
use leasehold_http::{
    AcceptedToken, ClientError, FenceLayer, FencedRequestExt, FencingClientLayer, NotHolder,
    SendError,
};
use tower::{Layer, ServiceExt};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn serve(app: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

fn request(url: &str) -> Result<http::Request<Full<bytes::Bytes>>, http::Error> {
    http::Request::post(url).body(Full::new(bytes::Bytes::from_static(b"+1")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_layer_and_reqwest_attach_token_and_refuse_after_release() -> TestResult {
    let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
    let store = Arc::new(MemoryLeaseStore::new());
    let calls = Arc::new(AtomicU64::new(0));
    let seen = calls.clone();
    let app = Router::new()
        .route(
            "/ledger",
            post(move |t: AcceptedToken| async move {
                seen.fetch_add(1, Ordering::SeqCst);
                format!("{} {}", t.key(), t.token())
            }),
        )
        .layer(FenceLayer::new(resource, store.clone()));
    let addr = serve(app).await?;
    let url = format!("http://{addr}/ledger");

    let sup = Supervisor::from_arc(store, SupervisorConfig::new(Duration::from_secs(30)));
    let key = LeaseKey::new("ledger")?;
    let Acquisition::Acquired(guard) = sup.acquire(&key).await? else {
        return Err("not acquired".into());
    };
    let guard_ref = guard.view();
    let expected = format!("ledger {}", guard.token());

    let hyper = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let client = FencingClientLayer::new(guard_ref.clone()).layer(hyper);
    let res = client.clone().oneshot(request(&url)?).await?;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.into_body().collect().await?.to_bytes(),
        expected.as_bytes()
    );

    let res = reqwest::Client::new()
        .post(&url)
        .fenced(&guard_ref)
        .send()
        .await?;
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await?, expected);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let _ = guard.release().await?;
    assert!(!guard_ref.may_act());
    let refused = NotHolder {
        key: key.clone(),
        token: guard_ref.token(),
        health: Health::Released,
    };
    match client.oneshot(request(&url)?).await {
        Err(ClientError::NotHolder(e)) => assert_eq!(e, refused),
        other => return Err(format!("expected NotHolder, got {other:?}").into()),
    }
    match reqwest::Client::new()
        .post(&url)
        .fenced(&guard_ref)
        .send()
        .await
    {
        Err(SendError::NotHolder(e)) => assert_eq!(e, refused),
        other => return Err(format!("expected NotHolder, got {other:?}").into()),
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "no request left after release"
    );
    Ok(())
}

/// The memory store, with renewals failing while `cut` is set (a partition from the store).
#[derive(Debug, Default)]
struct CuttableStore {
    inner: MemoryLeaseStore,
    cut: AtomicBool,
}

#[async_trait]
impl LeaseStore for CuttableStore {
    fn backend(&self) -> &'static str {
        "memory-cuttable"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> leasehold_core::Result<AcquireOutcome> {
        self.inner.acquire(req).await
    }
    async fn renew(&self, lease: &Lease) -> leasehold_core::Result<RenewOutcome> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(Error::unavailable("memory-cuttable", "partitioned", None));
        }
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> leasehold_core::Result<ReleaseOutcome> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> leasehold_core::Result<KeyState> {
        self.inner.inspect(key).await
    }
}

/// In paused time: once renewals fail, the guard goes AtRisk and then Lost before the lease's
/// deadline, and from the first moment `may_act()` is false the layer calls nothing.
#[tokio::test(start_paused = true)]
async fn client_layer_refuses_once_renewals_fail() -> TestResult {
    let store = Arc::new(CuttableStore::default());
    let ttl = Duration::from_secs(3);
    let sup = Supervisor::from_arc(store.clone(), SupervisorConfig::new(ttl));
    let Acquisition::Acquired(guard) = sup.acquire(&LeaseKey::new("job")?).await? else {
        return Err("not acquired".into());
    };
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    let inner = tower::service_fn(move |req: http::Request<()>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::convert::Infallible>(req.headers().clone())
        }
    });
    let client = FencingClientLayer::new(guard.view()).layer(inner);

    let headers = client.clone().oneshot(http::Request::new(())).await?;
    assert_eq!(
        headers["fencing-token"],
        guard.token().get().to_string().as_str()
    );
    assert_eq!(headers["fencing-key"], "job");

    store.cut.store(true, Ordering::SeqCst);
    let health = tokio::time::timeout(ttl * 2, guard.lost()).await?;
    assert!(matches!(health, Health::Lost(_)), "{health:?}");
    match client.clone().oneshot(http::Request::new(())).await {
        Err(ClientError::NotHolder(e)) => assert_eq!(e.health, health),
        other => return Err(format!("expected NotHolder, got {other:?}").into()),
    }
    assert_eq!(sent.load(Ordering::SeqCst), 1, "nothing sent after loss");
    Ok(())
}
