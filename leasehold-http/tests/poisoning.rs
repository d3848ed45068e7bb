//! The client cannot choose the key or the token so as to poison or sidestep the fence: route and
//! fixed keys refuse a `Fencing-Key` naming another key, and only tokens the lease store issued
//! move the high-water mark.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::routing::post;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, FencedResource, FencingToken, KeyState,
    Lease, LeaseKey, LeaseStore, MemoryFencedResource, MemoryLeaseStore, OwnerId, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_http::{AcceptedToken, FenceLayer, KeySource, Problem};
use tower::ServiceExt;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn head(path: &str, headers: &[(&str, &str)]) -> Result<http::request::Parts, http::Error> {
    let mut req = http::Request::post(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    Ok(req.body(())?.into_parts().0)
}

/// A grant of `key` on `store` (released at once when `release`, so the next grant is newer).
async fn grant(
    store: &dyn LeaseStore,
    key: &LeaseKey,
    release: bool,
) -> leasehold_core::Result<Lease> {
    let req = AcquireRequest::new(
        key.clone(),
        OwnerId::new("holder")?,
        Duration::from_secs(30),
    );
    match store.acquire(&req).await? {
        AcquireOutcome::Acquired(lease) => {
            if release {
                let _ = store.release(&lease).await?;
            }
            Ok(lease)
        }
        AcquireOutcome::Held(h) => Err(Error::InvalidInput(format!("held: {h:?}"))),
    }
}

/// The memory store, counting `inspect` calls, and failing them while `down` is set.
#[derive(Debug, Default)]
struct Counted {
    inner: MemoryLeaseStore,
    inspects: AtomicU64,
    down: AtomicBool,
}

#[async_trait]
impl LeaseStore for Counted {
    fn backend(&self) -> &'static str {
        "memory-counted"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> leasehold_core::Result<AcquireOutcome> {
        self.inner.acquire(req).await
    }
    async fn renew(&self, lease: &Lease) -> leasehold_core::Result<RenewOutcome> {
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> leasehold_core::Result<ReleaseOutcome> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> leasehold_core::Result<KeyState> {
        self.inspects.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::unavailable("memory-counted", "down", None));
        }
        self.inner.inspect(key).await
    }
}

#[tokio::test]
async fn fixed_key_refuses_a_mismatched_key_header() -> TestResult {
    let store = Arc::new(MemoryLeaseStore::new());
    let key = LeaseKey::new("ledger")?;
    let token = grant(&*store, &key, false).await?.token().get().to_string();
    let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
    let layer = FenceLayer::new(resource.clone(), store).key_source(KeySource::fixed(key.clone()));
    let parts = head(
        "/ledger",
        &[("Fencing-Token", &token), ("Fencing-Key", "other")],
    )?;
    match layer.check(&parts).await {
        Err(p) => {
            assert_eq!(p.status(), 400, "{p}");
            let v = p.to_json();
            assert_eq!(v["type"], "urn:lease:problem:fencing-key-mismatch", "{v}");
            assert_eq!(v["expected_key"], "ledger", "{v}");
            assert_eq!(v["presented_key"], "other", "{v}");
        }
        Ok(t) => return Err(format!("mismatched key accepted: {t:?}").into()),
    }
    assert_eq!(
        resource.read(&key).await?.high_water,
        None,
        "nothing recorded"
    );
    // The same key, or no key header at all, is fine.
    for extra in [&[("Fencing-Key", "ledger")][..], &[]] {
        let mut h = vec![("Fencing-Token", token.as_str())];
        h.extend_from_slice(extra);
        assert!(layer.check(&head("/ledger", &h)?).await?.is_some());
    }
    Ok(())
}

#[tokio::test]
async fn a_token_the_store_never_issued_does_not_raise_the_mark() -> TestResult {
    let store = Arc::new(MemoryLeaseStore::new());
    let key = LeaseKey::new("acct")?;
    let token = grant(&*store, &key, false).await?.token();
    let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
    let layer = FenceLayer::new(resource.clone(), store);
    let forged = format!("{}", i64::MAX);
    let parts = head("/", &[("Fencing-Token", &forged), ("Fencing-Key", "acct")])?;
    match layer.check(&parts).await {
        Err(p @ Problem::Unissued { .. }) => {
            assert_eq!(p.status(), 409, "{p}");
            let v = p.to_json();
            assert_eq!(v["type"], "urn:lease:problem:unissued-fencing-token", "{v}");
            assert_eq!(v["last_issued_token"], token.get(), "{v}");
            assert_eq!(v["presented_token"], i64::MAX, "{v}");
        }
        other => return Err(format!("a token the store never issued: {other:?}").into()),
    }
    assert_eq!(
        resource.read(&key).await?.high_water,
        None,
        "the mark did not move"
    );
    // The real holder goes on.
    let real = token.get().to_string();
    let parts = head("/", &[("Fencing-Token", &real), ("Fencing-Key", "acct")])?;
    assert!(layer.check(&parts).await?.is_some());
    Ok(())
}

#[tokio::test]
async fn a_token_of_another_store_is_refused() -> TestResult {
    let (ours, theirs) = (Arc::new(MemoryLeaseStore::new()), MemoryLeaseStore::new());
    let key = LeaseKey::new("acct")?;
    let holder = grant(&*ours, &key, false).await?.token();
    let mut foreign = holder;
    for _ in 0..5 {
        foreign = grant(&theirs, &key, true).await?.token();
    }
    assert!(foreign > holder);
    let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
    let layer = FenceLayer::new(resource.clone(), ours);
    let check = |t: FencingToken| {
        let parts = head(
            "/",
            &[
                ("Fencing-Token", &t.get().to_string()),
                ("Fencing-Key", "acct"),
            ],
        );
        let layer = layer.clone();
        async move {
            layer
                .check(&parts?)
                .await
                .map_err(|p| p.to_string())
                .map(|_| ())
                .map_err(Into::into)
        }
    };
    let refused: Result<(), Box<dyn std::error::Error + Send + Sync>> = check(foreign).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("never issued")));
    check(holder).await?;
    assert_eq!(resource.read(&key).await?.high_water, Some(holder));
    Ok(())
}

#[tokio::test]
async fn the_store_is_asked_once_per_new_maximum_and_its_failure_is_503() -> TestResult {
    let store = Arc::new(Counted::default());
    let key = LeaseKey::new("acct")?;
    let first = grant(&*store, &key, true).await?.token();
    let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
    let layer = FenceLayer::new(resource, store.clone());
    let check = |t: FencingToken| -> Result<http::request::Parts, http::Error> {
        head(
            "/",
            &[
                ("Fencing-Token", &t.get().to_string()),
                ("Fencing-Key", "acct"),
            ],
        )
    };
    for _ in 0..5 {
        assert!(layer.check(&check(first)?).await?.is_some());
    }
    assert_eq!(
        store.inspects.load(Ordering::SeqCst),
        1,
        "one confirmation for one token"
    );
    let second = grant(&*store, &key, false).await?.token();
    for _ in 0..5 {
        assert!(layer.check(&check(second)?).await?.is_some());
    }
    assert_eq!(
        store.inspects.load(Ordering::SeqCst),
        2,
        "one more for the new holder"
    );
    // The store is down: a confirmed token still passes (no round trip); a new one is 503.
    store.down.store(true, Ordering::SeqCst);
    assert!(layer.check(&check(second)?).await?.is_some());
    let third = FencingToken::new(second.get() + 1)?;
    match layer.check(&check(third)?).await {
        Err(
            p @ Problem::Unavailable {
                retryable: true, ..
            },
        ) => assert_eq!(p.status(), 503),
        other => return Err(format!("expected 503, got {other:?}").into()),
    }
    Ok(())
}

fn accounts_router() -> Router {
    Router::new().route(
        "/accounts/{id}/deposit",
        post(|t: AcceptedToken| async move { t.key().to_string() }),
    )
}

fn accounts(layer: FenceLayer, route_layer: bool) -> Router {
    let router = accounts_router();
    if route_layer {
        router.route_layer(layer)
    } else {
        router.layer(layer)
    }
}

async fn call(
    app: &Router,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), Box<dyn std::error::Error + Send + Sync>> {
    let mut req = http::Request::post(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = app
        .clone()
        .oneshot(req.body(axum::body::Body::empty())?)
        .await?;
    let status = res.status().as_u16();
    let body = axum::body::to_bytes(res.into_body(), 1 << 16).await?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test]
async fn route_keys_fence_the_account_the_request_writes() -> TestResult {
    let store = Arc::new(MemoryLeaseStore::new());
    let (a1, a2) = (LeaseKey::new("a-1")?, LeaseKey::new("a-2")?);
    let t1 = grant(&*store, &a1, false).await?.token().get().to_string();
    let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
    let base = FenceLayer::new(resource.clone(), store.clone());
    for (name, app) in [
        (
            "route_param",
            accounts(base.clone().key_source(KeySource::route_param("id")), true),
        ),
        (
            "path",
            accounts(
                base.clone()
                    .key_source(KeySource::path("/accounts/{id}/{*rest}", "id")?),
                false,
            ),
        ),
    ] {
        let (s, body) = call(&app, "/accounts/a-1/deposit", &[("Fencing-Token", &t1)]).await?;
        assert_eq!((s, body.as_str()), (200, "a-1"), "{name}");
        // a-1's token does not open a-2, even if the client names a-1 in the header.
        let (s, body) = call(
            &app,
            "/accounts/a-2/deposit",
            &[("Fencing-Token", &t1), ("Fencing-Key", "a-1")],
        )
        .await?;
        assert_eq!(s, 400, "{name}: {body}");
        assert!(
            body.contains("\"expected_key\":\"a-2\"") && body.contains("\"presented_key\":\"a-1\""),
            "{name}: {body}"
        );
        let (s, body) = call(&app, "/accounts/a-2/deposit", &[("Fencing-Token", &t1)]).await?;
        assert_eq!(s, 409, "{name}: a-2 never issued token {t1}: {body}");
        assert!(body.contains("unissued-fencing-token"), "{name}: {body}");
        let (s, body) = call(&app, "/accounts/BAD/deposit", &[("Fencing-Token", &t1)]).await?;
        assert_eq!(s, 400, "{name}: {body}");
    }
    assert_eq!(resource.read(&a2).await?.high_water, None);
    // Wrapped around the router, the layer runs before routing and there is no route parameter
    // yet: every request is 428, with a hint.
    let outside = tower::Layer::layer(
        &base.key_source(KeySource::route_param("id")),
        accounts_router(),
    );
    let req = http::Request::post("/accounts/a-1/deposit")
        .header("Fencing-Token", &t1)
        .body(axum::body::Body::empty())?;
    let res = outside.oneshot(req).await?;
    let s = res.status().as_u16();
    let body = axum::body::to_bytes(res.into_body(), 1 << 16).await?;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(s, 428, "{body}");
    assert!(body.contains("route_layer"), "{body}");
    Ok(())
}
