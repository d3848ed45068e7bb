//! Fencing tokens under interleavings the shared suite cannot arrange: a candidate held between
//! deciding to create the Lease and creating it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{DeleteParams, PostParams};
use leasehold_core::{AcquireOutcome, LeaseStore, OwnerId};
use leasehold_k8s::protocol::TOKEN_ANNOTATION;
use leasehold_k8s::{K8sLeaseStore, K8sOptions, TestHook, TestPoint};
use leasehold_testkit::{CaseResult, Ctx};
use tokio::sync::oneshot;

use super::env;

/// A hook that holds the first operation reaching `at`: it reports that through the returned
/// receiver, then waits until the returned sender fires (or is dropped).
fn hold_once(at: TestPoint) -> (TestHook, oneshot::Receiver<()>, oneshot::Sender<()>) {
    let (reached_tx, reached_rx) = oneshot::channel();
    let (go_tx, go_rx) = oneshot::channel::<()>();
    let armed = Arc::new(Mutex::new(Some((reached_tx, go_rx))));
    let hook: TestHook = Arc::new(move |point, _name| {
        let taken = if point == at {
            armed.lock().unwrap_or_else(|p| p.into_inner()).take()
        } else {
            None
        };
        Box::pin(async move {
            if let Some((reached, go)) = taken {
                let _ = reached.send(());
                let _ = go.await;
            }
        })
    });
    (hook, reached_rx, go_tx)
}

/// Candidate C2 finds no Lease and is held just before its create. Meanwhile C1 creates the
/// Lease and is granted, and the Lease is deleted. Then C2 creates it: its token must be above
/// C1's (ADR 0040: the token comes from the grant's own write, not from a revision read before).
pub(crate) async fn stalled_create_after_deletion_gets_a_greater_token(ctx: Ctx) -> CaseResult {
    let key = ctx.key("stalled-create");
    let (a, b) = (OwnerId::with_label("c1"), OwnerId::with_label("c2"));
    let (hook, reached, go) = hold_once(TestPoint::BeforeCreate);
    let c2 = K8sLeaseStore::from_client(
        env::client().await?,
        K8sOptions::default()
            .with_namespace(env::namespace())
            .with_test_hook(hook),
    )?;
    let req = ctx.request(&key, &b, ctx.long_ttl());
    let stalled = tokio::spawn(async move { c2.acquire(&req).await });
    tokio::time::timeout(Duration::from_secs(30), reached)
        .await
        .map_err(|_| "C2 never reached its create")?
        .map_err(|_| "C2 ended before its create")?;

    let c1 = env::store().await?;
    let first = ctx.must_acquire_with(&c1, &key, &a, ctx.long_ttl()).await?;
    env::leases()
        .await?
        .delete(key.as_str(), &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let _ = go.send(());

    let second = match tokio::time::timeout(Duration::from_secs(30), stalled)
        .await
        .map_err(|_| "C2 did not finish")?
        .map_err(|e| e.to_string())??
    {
        AcquireOutcome::Acquired(lease) => lease,
        AcquireOutcome::Held(h) => {
            return Err(format!("C2 found the deleted Lease held by {}", h.owner).into());
        }
    };
    assert!(
        second.token() > first.token(),
        "C2's grant after the deletion has token {} <= C1's earlier grant {}",
        second.token(),
        first.token()
    );
    // What other processes see is the token C2 was given.
    let obj = env::leases()
        .await?
        .get(key.as_str())
        .await
        .map_err(|e| e.to_string())?;
    let ann = obj.metadata.annotations.unwrap_or_default();
    assert_eq!(ann.get(TOKEN_ANNOTATION), Some(&second.token().to_string()));
    let seen = env::store()
        .await?
        .inspect(&key)
        .await?
        .holder
        .ok_or("C2's Lease is not seen as held")?;
    assert_eq!((seen.owner, seen.token), (b, second.token()));
    Ok(())
}

/// The token recorded in a Lease is a floor for the next grant, even where the apiserver's
/// resourceVersion is below it: after etcd is restored from a backup, or for a Lease whose
/// tokens were written elsewhere, `resourceVersion + 1` alone could give a token that was already
/// handed out. A's grant is edited to carry a token far above every resourceVersion; once it has
/// expired, B's takeover must be given a token above that.
pub(crate) async fn takeover_token_is_above_the_recorded_token_not_only_the_version(
    ctx: Ctx,
) -> CaseResult {
    let key = ctx.key("recorded-floor");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.short_ttl();
    let first = ctx.must_acquire(&key, &a, ttl).await?;
    let leases = env::leases().await?;
    let mut obj = leases.get(key.as_str()).await.map_err(|e| e.to_string())?;
    let high = first.token().get() + 1_000_000_000_000;
    obj.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(TOKEN_ANNOTATION.to_string(), high.to_string());
    leases
        .replace(key.as_str(), &PostParams::default(), &obj)
        .await
        .map_err(|e| e.to_string())?;
    // A fresh client: nothing of A's grant is remembered in its process.
    let other = env::store().await?;
    let second = ctx
        .acquire_within(&other, &key, &b, ctx.long_ttl(), ctx.expiry_deadline(ttl))
        .await?;
    assert!(
        second.token().get() > high,
        "B's takeover got token {} <= the recorded token {high}",
        second.token()
    );
    Ok(())
}
