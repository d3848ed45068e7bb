//! Failure cases: deletion under a holder, a foreign write during renewal, bad configuration.

use std::time::Duration;

use kube::api::{DeleteParams, PostParams};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Error, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_k8s::{K8sLeaseStore, K8sOptions};
use leasehold_testkit::{CaseResult, Ctx};

use super::env;

/// The Lease object is deleted under its holder: renewal is `Lost`, release is `NotHeld`, and the
/// next grant (by a fresh client that never saw the old token) still gets a greater token.
pub(crate) async fn lease_deleted_under_holder_is_lost_and_tokens_keep_increasing(
    ctx: Ctx,
) -> CaseResult {
    let key = ctx.key("deleted");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let name = key.to_string();
    env::leases()
        .await?
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(
        ctx.store().renew(&lease).await?,
        RenewOutcome::Lost,
        "renewed a deleted Lease"
    );
    assert_eq!(ctx.store().release(&lease).await?, ReleaseOutcome::NotHeld);
    assert!(ctx.store().inspect(&key).await?.holder.is_none());

    let fresh = env::store().await?;
    let next = ctx
        .must_acquire_with(&fresh, &key, &b, ctx.long_ttl())
        .await?;
    assert!(
        next.token() > lease.token(),
        "token went back after deletion: {} !> {}",
        next.token(),
        lease.token()
    );
    // Again, with the object deleted after a release (the generation annotation is gone too).
    assert_eq!(fresh.release(&next).await?, ReleaseOutcome::Released);
    env::leases()
        .await?
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let third = ctx
        .must_acquire_with(&env::store().await?, &key, &a, ctx.long_ttl())
        .await?;
    assert!(
        third.token() > next.token(),
        "{} !> {}",
        third.token(),
        next.token()
    );
    Ok(())
}

/// Someone else writes the Lease (here: adds a label) while it is held: the holder's next renewal
/// is a 409 Conflict and the lease is `Lost` at once, without waiting for the TTL.
pub(crate) async fn foreign_write_makes_renew_conflict_and_lose_at_once(ctx: Ctx) -> CaseResult {
    let key = ctx.key("conflict");
    let a = OwnerId::with_label("a");
    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let api = env::leases().await?;
    let mut obj = api.get(key.as_str()).await.map_err(|e| e.to_string())?;
    obj.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("touched-by".into(), "someone-else".into());
    api.replace(key.as_str(), &PostParams::default(), &obj)
        .await
        .map_err(|e| e.to_string())?;

    let t0 = tokio::time::Instant::now();
    assert_eq!(
        ctx.store().renew(&lease).await?,
        RenewOutcome::Lost,
        "renewed across a foreign write"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "loss took {:?}",
        t0.elapsed()
    );
    // The object still names the holder (the foreign write was harmless); nobody else gets it
    // before it expires, and the same owner gets a fresh grant with a greater token.
    let b = OwnerId::with_label("b");
    let other = ctx.other_client().await?;
    assert!(matches!(
        other
            .acquire(&ctx.request(&key, &b, ctx.long_ttl()))
            .await?,
        AcquireOutcome::Held(_)
    ));
    let again = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    assert!(again.token() > lease.token());
    let labels = api
        .get(key.as_str())
        .await
        .map_err(|e| e.to_string())?
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        labels.get("touched-by").map(String::as_str),
        Some("someone-else"),
        "our write dropped a foreign label"
    );
    Ok(())
}

/// A watcher is woken when the Lease object is deleted.
pub(crate) async fn watch_wakes_on_deletion(ctx: Ctx) -> CaseResult {
    let key = ctx.key("watch-del");
    let a = OwnerId::with_label("a");
    ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let other = ctx.other_client().await?;
    let mut watch = other.watch(&key).await?.ok_or("no watch")?;
    env::leases()
        .await?
        .delete(key.as_str(), &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(10), watch.changed()).await {
        Ok(Some(Ok(()))) => {}
        other => return Err(format!("no wake-up on deletion: {other:?}").into()),
    }
    let b = OwnerId::with_label("b");
    ctx.must_acquire_with(&*other, &key, &b, ctx.long_ttl())
        .await?;
    Ok(())
}

/// No kubeconfig, a bad URL, an illegal namespace, an illegal name prefix: `Error::Config`,
/// nothing sent.
pub(crate) async fn bad_configuration_is_a_typed_error(_ctx: Ctx) -> CaseResult {
    let missing = std::env::temp_dir().join(format!("no-such-kubeconfig-{}", std::process::id()));
    let with_missing = K8sOptions::default().with_kubeconfig(&missing);
    match K8sLeaseStore::connect_with("k8s:", with_missing).await {
        Err(e @ Error::Config { .. }) => assert!(!e.is_retryable()),
        other => return Err(format!("missing kubeconfig: expected Config, got {other:?}").into()),
    }
    let kubeconfig = || K8sOptions::default().with_kubeconfig(env::kubeconfig());
    for url in ["k8s://Team_A", "k8s://a/b", "redis://x", "k8s"] {
        match K8sLeaseStore::connect_with(url, kubeconfig()).await {
            Err(e @ Error::Config { .. }) => assert!(!e.is_retryable()),
            other => return Err(format!("URL {url:?}: expected Config, got {other:?}").into()),
        }
    }
    let conflicting = kubeconfig().with_namespace("other");
    assert!(matches!(
        K8sLeaseStore::connect_with("k8s://one", conflicting).await,
        Err(Error::Config { .. })
    ));
    let named = K8sLeaseStore::connect_with("k8s://team-a/", kubeconfig()).await?;
    assert_eq!(named.namespace(), "team-a");
    let client = env::client().await?;
    for ns in ["", "Upper", "under_score", "-lead", &"n".repeat(64)] {
        let r =
            K8sLeaseStore::from_client(client.clone(), K8sOptions::default().with_namespace(ns));
        assert!(matches!(r, Err(Error::Config { .. })), "namespace {ns:?}");
    }
    for prefix in ["Upper-", "-lead", "a..", "a/b", &"p".repeat(54)] {
        let r = K8sLeaseStore::from_client(
            client.clone(),
            K8sOptions::default().with_name_prefix(prefix),
        );
        assert!(matches!(r, Err(Error::Config { .. })), "prefix {prefix:?}");
    }
    let ok = K8sLeaseStore::from_client(client, K8sOptions::default().with_name_prefix("lease-"))?;
    assert_eq!(ok.object_name(&LeaseKey::new("a.b")?), "lease-a.b");
    Ok(())
}

/// An apiserver that does not listen: `Error::Unavailable` (retryable), promptly.
pub(crate) async fn unreachable_server_is_unavailable(_ctx: Ctx) -> CaseResult {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    drop(listener);
    let url = format!("https://127.0.0.1:{port}")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let client = kube::Client::try_from(kube::Config::new(url)).map_err(|e| e.to_string())?;
    let store = K8sLeaseStore::from_client(
        client,
        K8sOptions::default()
            .with_namespace("default")
            .with_request_timeout(Duration::from_secs(5)),
    )?;
    let key = LeaseKey::new("unreachable")?;
    let req = AcquireRequest::new(key.clone(), OwnerId::random(), Duration::from_secs(5));
    for result in [
        store.acquire(&req).await.map(|_| ()),
        store.inspect(&key).await.map(|_| ()),
    ] {
        match result {
            Err(e @ Error::Unavailable { .. }) => assert!(e.is_retryable()),
            other => return Err(format!("expected Unavailable, got {other:?}").into()),
        }
    }
    Ok(())
}

/// A namespace that does not exist: acquire is `Error::Config`, and nothing is created.
pub(crate) async fn missing_namespace_is_a_config_error(ctx: Ctx) -> CaseResult {
    let ns = format!("{}-missing", ctx.namespace());
    let store = K8sLeaseStore::from_client(
        env::client().await?,
        K8sOptions::default().with_namespace(ns.clone()),
    )?;
    let key = ctx.key("nsless");
    let req = AcquireRequest::new(key.clone(), OwnerId::random(), Duration::from_secs(5));
    match store.acquire(&req).await {
        Err(e @ Error::Config { .. }) => assert!(e.to_string().contains(&ns), "{e}"),
        other => return Err(format!("expected Config, got {other:?}").into()),
    }
    assert!(store.inspect(&key).await?.holder.is_none());
    Ok(())
}

/// `leaseDurationSeconds` is an integer: a 1.2 s request is granted (and reported) as 2 s.
pub(crate) async fn ttl_is_rounded_up_to_whole_seconds(ctx: Ctx) -> CaseResult {
    let key = ctx.key("rounding");
    let a = OwnerId::with_label("a");
    let caps = ctx.store().capabilities();
    assert_eq!(
        (caps.min_ttl, caps.ttl_granularity),
        (Duration::from_secs(1), Duration::from_secs(1))
    );
    let lease = ctx
        .must_acquire(&key, &a, Duration::from_millis(1200))
        .await?;
    assert_eq!(lease.ttl(), Duration::from_secs(2));
    let obj = env::leases()
        .await?
        .get(key.as_str())
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(obj.spec.and_then(|s| s.lease_duration_seconds), Some(2));
    let h = ctx.store().inspect(&key).await?.holder.ok_or("not held")?;
    assert_eq!(h.ttl, Duration::from_secs(2));
    Ok(())
}

/// `connect` takes the facade's URL and the ambient configuration (`KUBECONFIG` here): the URL's
/// namespace is used, and the store and its fenced resource work.
pub(crate) async fn connect_url_uses_the_ambient_configuration(ctx: Ctx) -> CaseResult {
    if std::env::var_os("KUBECONFIG").is_none_or(|p| p.is_empty()) {
        return Err(
            "KUBECONFIG is not set: the ambient configuration is not the test cluster".into(),
        );
    }
    let ns = env::namespace();
    let store = K8sLeaseStore::connect(&format!("k8s://{ns}")).await?;
    assert_eq!(store.namespace(), ns);
    let key = ctx.key("connect-url");
    let a = OwnerId::with_label("a");
    let lease = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    let resource = store.fenced_resource();
    let out = leasehold_core::FencedResource::write(
        &resource,
        &key,
        lease.token(),
        leasehold_core::WriteOp::Add(1),
    )
    .await?;
    assert!(out.is_accepted(), "{out:?}");
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    Ok(())
}
