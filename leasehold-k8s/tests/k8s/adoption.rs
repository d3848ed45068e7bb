//! A renewal whose answer was lost (ADR 0041): the apiserver applied it, the holder never heard.
//! The store must recognise that write as its own at the next renewal and carry on, not report
//! the lease as taken. The answers are lost for real, through a TCP proxy that forwards requests
//! and drops responses.

use std::net::SocketAddr;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use leasehold_core::supervisor::{Health, Supervisor, SupervisorConfig};
use leasehold_core::{Lease, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome};
use leasehold_faults::proxy::{FaultProxy, Mode};
use leasehold_k8s::{K8sLeaseStore, K8sOptions};
use leasehold_testkit::{CaseResult, Ctx, Failed};
use tokio::time::Instant;

use super::env;

/// A store whose every request goes through a fault proxy in front of the apiserver.
async fn proxied_store(timeout: Duration) -> Result<(FaultProxy, K8sLeaseStore), Failed> {
    let kc = Kubeconfig::read_from(env::kubeconfig()).map_err(|e| e.to_string())?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let upstream: SocketAddr = config
        .cluster_url
        .authority()
        .ok_or("kubeconfig server without host:port")?
        .as_str()
        .parse()
        .map_err(|e| format!("kubeconfig server is not ip:port: {e}"))?;
    let proxy = FaultProxy::start(upstream)
        .await
        .map_err(|e| e.to_string())?;
    config.cluster_url = format!("https://127.0.0.1:{}", proxy.port())
        .parse()
        .map_err(|e| format!("{e}"))?;
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    let store = K8sLeaseStore::from_client(
        client,
        K8sOptions::default()
            .with_namespace(env::namespace())
            .with_request_timeout(timeout),
    )?;
    Ok((proxy, store))
}

/// The Lease's resourceVersion as the apiserver has it now.
async fn current_rv(key: &str) -> Result<String, Failed> {
    let obj = env::leases()
        .await?
        .get(key)
        .await
        .map_err(|e| e.to_string())?;
    Ok(obj.metadata.resource_version.unwrap_or_default())
}

/// Waits (bounded) until the apiserver has applied a write to the Lease after version `before`.
async fn applied_after(key: &str, before: &str) -> CaseResult {
    let deadline = Instant::now() + Duration::from_secs(20);
    while current_rv(key).await? == before {
        if Instant::now() >= deadline {
            return Err("the renewal never reached the apiserver".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Renews until the store answers (retrying retryable errors, as the supervisor does).
async fn renew_until_answered(store: &K8sLeaseStore, lease: &Lease) -> Result<Lease, Failed> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match store.renew(lease).await {
            Ok(RenewOutcome::Renewed(l)) => return Ok(l),
            Ok(RenewOutcome::Lost) => {
                return Err(
                    "Lost: our own renewal, whose answer was lost, was taken for someone else's write"
                        .into(),
                );
            }
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// After adoption the holder carries on: another renewal, and everyone sees the same holder.
async fn carries_on(
    ctx: &Ctx,
    store: &K8sLeaseStore,
    adopted: &Lease,
    owner: &OwnerId,
) -> CaseResult {
    let next = renew_until_answered(store, adopted).await?;
    assert_eq!(next.token(), adopted.token());
    let seen = ctx
        .other_client()
        .await?
        .inspect(adopted.key())
        .await?
        .holder
        .ok_or("not held after adoption")?;
    assert_eq!((&seen.owner, seen.token), (owner, adopted.token()));
    let mine = store
        .inspect(adopted.key())
        .await?
        .holder
        .ok_or("not held")?;
    assert_eq!((&mine.owner, mine.token), (owner, adopted.token()));
    Ok(())
}

/// The renewal is sent, applied, and its future dropped before the answer (what the supervisor
/// does when its call bound passes first); the next renewal adopts the applied write.
pub(crate) async fn renewal_dropped_after_sending_is_adopted(ctx: Ctx) -> CaseResult {
    let key = ctx.key("dropped-renewal");
    let a = OwnerId::with_label("a");
    let (proxy, store) = proxied_store(Duration::from_secs(60)).await?;
    let lease = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    let before = current_rv(key.as_str()).await?;
    proxy.set_mode(Mode::DropResponses);
    let renewal = tokio::spawn({
        let (store, lease) = (store.clone(), lease.clone());
        async move { store.renew(&lease).await }
    });
    applied_after(key.as_str(), &before).await?;
    if renewal.is_finished() {
        return Err(format!(
            "the renewal was answered through the proxy: {:?}",
            renewal.await
        )
        .into());
    }
    renewal.abort();
    let _ = renewal.await;
    proxy.heal();
    // Reading first (this store now sees a version it has no confirmation of) changes nothing:
    // the holder is still us, and the renewal still adopts the write.
    let seen = store.inspect(&key).await;
    let seen = match seen {
        Err(e) if e.is_retryable() => store.inspect(&key).await?,
        other => other?,
    };
    let seen = seen.holder.ok_or("not held after the lost renewal")?;
    assert_eq!((&seen.owner, seen.token), (&a, lease.token()));
    let adopted = renew_until_answered(&store, &lease).await?;
    assert_eq!(adopted.token(), lease.token());
    carries_on(&ctx, &store, &adopted, &a).await
}

/// The renewal is sent and applied, and the store's own request timeout passes without an
/// answer (`Error::Timeout`, outcome unknown); the next renewal adopts the applied write.
pub(crate) async fn renewal_timed_out_after_sending_is_adopted(ctx: Ctx) -> CaseResult {
    let key = ctx.key("timed-out-renewal");
    let a = OwnerId::with_label("a");
    let (proxy, store) = proxied_store(Duration::from_secs(2)).await?;
    let lease = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    let before = current_rv(key.as_str()).await?;
    proxy.set_mode(Mode::DropResponses);
    match store.renew(&lease).await {
        Err(e) if e.outcome_unknown() => {}
        other => return Err(format!("expected a timeout, got {other:?}").into()),
    }
    applied_after(key.as_str(), &before).await?;
    proxy.heal();
    let adopted = renew_until_answered(&store, &lease).await?;
    assert_eq!(adopted.token(), lease.token());
    carries_on(&ctx, &store, &adopted, &a).await
}

/// Waits (bounded) until the guard's health satisfies `done`; returns it.
async fn health_until(
    rx: &mut tokio::sync::watch::Receiver<Health>,
    within: Duration,
    done: impl Fn(Health) -> bool,
) -> Result<Health, Failed> {
    let deadline = Instant::now() + within;
    loop {
        let h = *rx.borrow_and_update();
        if done(h) {
            return Ok(h);
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(format!("supervisor gone at {h:?}").into()),
            Err(_) => return Err(format!("health still {h:?} after {within:?}").into()),
        }
    }
}

/// Through the supervisor: its call bound (1 s, below the store's 60 s request timeout) drops a
/// renewal the apiserver applied; once the network heals, the guard is `Held` again, never lost.
pub(crate) async fn supervised_renewal_dropped_by_its_bound_stays_held(ctx: Ctx) -> CaseResult {
    let key = ctx.key("sup-dropped");
    let (proxy, store) = proxied_store(Duration::from_secs(60)).await?;
    let cfg = SupervisorConfig::new(ctx.long_ttl())
        .with_renew_interval(Duration::from_millis(300))
        .with_op_timeout(Duration::from_secs(1));
    let supervisor = Supervisor::new(store, cfg);
    let guard = supervisor
        .acquire(&key)
        .await?
        .guard()
        .ok_or("not acquired")?;
    let token = guard.token();
    let mut rx = guard.subscribe();
    let before = current_rv(key.as_str()).await?;
    proxy.set_mode(Mode::DropResponses);
    applied_after(key.as_str(), &before).await?;
    let h = health_until(&mut rx, Duration::from_secs(20), |h| h != Health::Held).await?;
    assert_eq!(
        h,
        Health::AtRisk,
        "the supervisor did not give up on the call"
    );
    proxy.heal();
    let h = health_until(&mut rx, Duration::from_secs(20), |h| {
        h == Health::Held || h.is_final()
    })
    .await?;
    assert_eq!(h, Health::Held, "our own lost renewal ended the lease");
    assert!(guard.may_act());
    assert_eq!(guard.token(), token);
    let seen = ctx
        .other_client()
        .await?
        .inspect(&key)
        .await?
        .holder
        .ok_or("not held")?;
    assert_eq!((&seen.owner, seen.token), (supervisor.owner(), token));
    assert_eq!(guard.release().await?, ReleaseOutcome::Released);
    Ok(())
}
