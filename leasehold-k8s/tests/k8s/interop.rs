//! Interoperability with client-go's LeaseLock: the fields mean what client-go means, and a Go
//! holder (simulated here by writing the Lease exactly as client-go does) is respected.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease as KubeLease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use leasehold_core::{AcquireOutcome, LeaseStore, OwnerId, ReleaseOutcome};
use leasehold_k8s::protocol::{TOKEN_ANNOTATION, TOKEN_HOLDER_ANNOTATION};
use leasehold_testkit::{CaseResult, Ctx, require_services};
use tokio::time::Instant;

use super::env;

fn go_record(
    name: &str,
    holder: &str,
    secs: i32,
    renew: jiff::Timestamp,
    transitions: i32,
) -> KubeLease {
    KubeLease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(secs),
            acquire_time: Some(MicroTime(renew)),
            renew_time: Some(MicroTime(renew)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    }
}

fn ks(e: kube::Error) -> String {
    e.to_string()
}

/// A Go controller holds the Lease and keeps renewing it: we stay out for as long as it renews
/// (every renewal is a new record, so observation starts over), and take over only after seeing
/// the same record unchanged for its `leaseDurationSeconds`, incrementing `leaseTransitions` and
/// setting `acquireTime` as client-go does.
pub(crate) async fn client_go_holder_is_respected_until_observed_expired(ctx: Ctx) -> CaseResult {
    let key = ctx.key("go-holder");
    let api = env::leases().await?;
    let start = jiff::Timestamp::now();
    api.create(
        &PostParams::default(),
        &go_record(key.as_str(), "go-controller-0", 1, start, 3),
    )
    .await
    .map_err(ks)?;

    let renewer = {
        let api = api.clone();
        let name = key.to_string();
        tokio::spawn(async move {
            let end = Instant::now() + Duration::from_millis(2500);
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let mut obj = api.get(&name).await.map_err(ks)?;
                if let Some(spec) = obj.spec.as_mut() {
                    spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
                }
                api.replace(&name, &PostParams::default(), &obj)
                    .await
                    .map_err(ks)?;
            }
            Ok::<_, String>(())
        })
    };
    let a = OwnerId::with_label("rust");
    let mut refusals = 0;
    while !renewer.is_finished() {
        match ctx
            .store()
            .acquire(&ctx.request(&key, &a, ctx.long_ttl()))
            .await?
        {
            AcquireOutcome::Held(h) => {
                assert_eq!(h.owner.as_str(), "go-controller-0");
                assert_eq!(h.ttl, Duration::from_secs(1));
                refusals += 1;
            }
            AcquireOutcome::Acquired(l) => {
                return Err(format!("took over a renewing Go holder (token {})", l.token()).into());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    renewer.await.map_err(|e| e.to_string())??;
    assert!(refusals > 5, "only {refusals} attempts");

    let lease = ctx
        .acquire_within(
            &**ctx.store(),
            &key,
            &a,
            ctx.long_ttl(),
            Duration::from_secs(8),
        )
        .await?;
    let obj = api.get(key.as_str()).await.map_err(ks)?;
    let spec = obj.spec.ok_or("no spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some(a.as_str()));
    assert_eq!(
        spec.lease_transitions,
        Some(4),
        "a new holder increments leaseTransitions"
    );
    assert_eq!(spec.lease_duration_seconds, Some(30));
    assert!(
        spec.acquire_time.ok_or("no acquireTime")?.0 > start,
        "acquireTime not set by the new holder"
    );
    let ann = obj.metadata.annotations.unwrap_or_default();
    assert_eq!(ann.get(TOKEN_ANNOTATION), Some(&lease.token().to_string()));
    assert_eq!(
        ann.get(TOKEN_HOLDER_ANNOTATION).map(String::as_str),
        Some(a.as_str())
    );
    Ok(())
}

/// The timestamps in the record are another host's wall clock and are never compared with ours:
/// a record "renewed" in the year 2000 still blocks for its full duration after we first see it,
/// and one "renewed" in 2100 expires after its duration all the same.
pub(crate) async fn expiry_ignores_the_timestamps_in_the_record(ctx: Ctx) -> CaseResult {
    let api = env::leases().await?;
    let (past, future) = (ctx.key("clock-behind"), ctx.key("clock-ahead"));
    let t_past: jiff::Timestamp = "2000-01-01T00:00:00Z".parse().map_err(|e| format!("{e}"))?;
    let t_future: jiff::Timestamp = "2100-01-01T00:00:00Z".parse().map_err(|e| format!("{e}"))?;
    api.create(
        &PostParams::default(),
        &go_record(past.as_str(), "ghost", 2, t_past, 0),
    )
    .await
    .map_err(ks)?;
    api.create(
        &PostParams::default(),
        &go_record(future.as_str(), "ghost", 1, t_future, 0),
    )
    .await
    .map_err(ks)?;
    let a = OwnerId::with_label("a");
    match ctx
        .store()
        .acquire(&ctx.request(&past, &a, ctx.long_ttl()))
        .await?
    {
        AcquireOutcome::Held(h) => assert!(
            h.remaining > Duration::from_secs(1),
            "remaining {:?}",
            h.remaining
        ),
        AcquireOutcome::Acquired(_) => {
            return Err("took over at once because of an old renewTime".into());
        }
    }
    let t0 = Instant::now();
    ctx.acquire_within(
        &**ctx.store(),
        &future,
        &a,
        ctx.long_ttl(),
        Duration::from_secs(8),
    )
    .await?;
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "took over before observing the duration"
    );
    Ok(())
}

/// Release writes what client-go's ReleaseOnCancel writes (empty holder, 1 s duration, transitions
/// kept) and keeps our token annotation; a Go controller then takes over at once (it keeps our
/// annotations, but it is not their holder), and after it releases, our next token is greater.
pub(crate) async fn released_record_reads_as_client_go_release(ctx: Ctx) -> CaseResult {
    let key = ctx.key("go-release");
    let api = env::leases().await?;
    let a = OwnerId::with_label("a");
    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    assert_eq!(ctx.store().release(&lease).await?, ReleaseOutcome::Released);
    let mut obj = api.get(key.as_str()).await.map_err(ks)?;
    let spec = obj.spec.clone().ok_or("no spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some(""));
    assert_eq!(spec.lease_duration_seconds, Some(1));
    assert_eq!(spec.lease_transitions, Some(0));
    let ann: BTreeMap<String, String> = obj.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get(TOKEN_ANNOTATION),
        Some(&lease.token().to_string()),
        "release must keep the generation"
    );

    // A Go controller takes the released Lease (client-go: empty holder = free) and keeps the
    // annotations it read.
    let mut go_spec = spec;
    go_spec.holder_identity = Some("go-controller-1".into());
    go_spec.lease_duration_seconds = Some(15);
    go_spec.lease_transitions = Some(1);
    obj.spec = Some(go_spec.clone());
    let obj = api
        .replace(key.as_str(), &PostParams::default(), &obj)
        .await
        .map_err(ks)?;
    let state = ctx.store().inspect(&key).await?;
    let h = state.holder.ok_or("the Go holder is not seen")?;
    assert_eq!(h.owner.as_str(), "go-controller-1");
    assert_ne!(
        h.token,
        lease.token(),
        "a foreign holder was given our token"
    );
    assert_eq!(state.last_token, Some(lease.token()));
    let b = OwnerId::with_label("b");
    assert!(matches!(
        ctx.store()
            .acquire(&ctx.request(&key, &b, ctx.long_ttl()))
            .await?,
        AcquireOutcome::Held(_)
    ));

    // The Go controller releases; we acquire at once with a greater token.
    let mut obj = obj;
    go_spec.holder_identity = Some(String::new());
    go_spec.lease_duration_seconds = Some(1);
    obj.spec = Some(go_spec);
    api.replace(key.as_str(), &PostParams::default(), &obj)
        .await
        .map_err(ks)?;
    let next = ctx.must_acquire(&key, &b, ctx.long_ttl()).await?;
    assert!(next.token() > lease.token());
    let spec = api
        .get(key.as_str())
        .await
        .map_err(ks)?
        .spec
        .ok_or("no spec")?;
    assert_eq!(spec.lease_transitions, Some(2));
    Ok(())
}

/// `kubectl get lease -o yaml` shows what we wrote (when kubectl is available; under
/// CI/LEASE_TEST_REQUIRE it must be).
pub(crate) async fn kubectl_reads_the_lease(ctx: Ctx) -> CaseResult {
    let kubectl = std::env::var("LEASE_K8S_KUBECTL").unwrap_or_default();
    if kubectl.is_empty() || !std::path::Path::new(&kubectl).exists() {
        if require_services() {
            return Err("LEASE_K8S_KUBECTL does not name a kubectl binary".into());
        }
        eprintln!("kubectl_reads_the_lease: no kubectl (LEASE_K8S_KUBECTL), not checked");
        return Ok(());
    }
    let key = ctx.key("kubectl");
    let a = OwnerId::with_label("kubectl-check");
    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let out = tokio::process::Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(env::kubeconfig())
        .args([
            "-n",
            &env::namespace(),
            "get",
            "lease",
            key.as_str(),
            "-o",
            "yaml",
        ])
        .output()
        .await
        .map_err(|e| format!("running kubectl: {e}"))?;
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "kind: Lease".to_string(),
        format!("holderIdentity: {a}"),
        "leaseDurationSeconds: 30".to_string(),
        "leaseTransitions: 0".to_string(),
        format!("{TOKEN_ANNOTATION}: \"{}\"", lease.token()),
        "acquireTime: ".to_string(),
        "renewTime: ".to_string(),
    ] {
        assert!(
            yaml.contains(&expected),
            "kubectl output lacks {expected:?}:\n{yaml}"
        );
    }
    Ok(())
}

/// A Go controller leads (its term, as any process reports it, is its record's resourceVersion),
/// stops renewing, and a Rust candidate takes over after observed expiry: an observer must see two
/// different terms, the Rust one greater, for the two leaders.
pub(crate) async fn terms_are_unique_across_a_go_to_rust_handover(ctx: Ctx) -> CaseResult {
    let key = ctx.key("go-handover");
    let api = env::leases().await?;
    api.create(
        &PostParams::default(),
        &go_record(
            key.as_str(),
            "go-controller-2",
            1,
            jiff::Timestamp::now(),
            0,
        ),
    )
    .await
    .map_err(ks)?;
    let observer = env::store().await?;
    let go = observer
        .inspect(&key)
        .await?
        .holder
        .ok_or("the Go holder is not seen")?;
    assert_eq!(go.owner.as_str(), "go-controller-2");

    let a = OwnerId::with_label("rust");
    let lease = ctx
        .acquire_within(
            &**ctx.store(),
            &key,
            &a,
            ctx.long_ttl(),
            Duration::from_secs(8),
        )
        .await?;
    let rust = observer
        .inspect(&key)
        .await?
        .holder
        .ok_or("the Rust holder is not seen")?;
    assert_eq!((&rust.owner, rust.token), (&a, lease.token()));
    assert!(
        rust.token > go.token,
        "one term for two leaders: the Go holder reported {} and the Rust grant after it {}",
        go.token,
        rust.token
    );
    Ok(())
}
