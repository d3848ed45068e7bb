//! A `k8s://` URL alone configures the store; a misspelt or malformed parameter is refused.

use std::time::Duration;

use leasehold_core::{Error, LeaseStore, OwnerId};
use leasehold_k8s::K8sLeaseStore;
use leasehold_testkit::{CaseResult, Ctx};

use super::env;

/// A URL with every option in its query (namespace, name prefix, request timeout, kubeconfig)
/// gives a store that writes the Lease under the prefixed name; a kubeconfig named in the URL is
/// the one read; each bad parameter is an [`Error::Config`] naming it, before anything is sent.
pub(crate) async fn url_options_configure_the_store_and_unknown_ones_are_refused(
    ctx: Ctx,
) -> CaseResult {
    let ns = env::namespace();
    let kubeconfig = env::kubeconfig();
    let kubeconfig = kubeconfig
        .to_str()
        .ok_or("the kubeconfig path is not UTF-8")?;
    let prefix = format!("{}-url.", ctx.namespace());
    let url = format!("k8s://{ns}?name_prefix={prefix}&request_timeout=5s&kubeconfig={kubeconfig}");
    let store = K8sLeaseStore::connect(&url).await?;
    assert_eq!(store.namespace(), ns);
    assert_eq!(store.request_timeout(), Duration::from_secs(5));
    let key = ctx.key("k");
    assert_eq!(store.object_name(&key), format!("{prefix}{key}"));
    let lease = ctx
        .must_acquire_with(&store, &key, &OwnerId::random(), ctx.long_ttl())
        .await?;
    let object = env::leases().await?.get(&format!("{prefix}{key}")).await?;
    let holder = object.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some(lease.owner().as_str()));
    let _released = store.release(&lease).await?;

    // The namespace may be named in the query instead of the path.
    let by_query =
        K8sLeaseStore::connect(&format!("k8s:?namespace={ns}&kubeconfig={kubeconfig}")).await?;
    assert_eq!(by_query.namespace(), ns);

    // The kubeconfig the URL names is the one read, not the ambient one.
    let missing = std::env::temp_dir().join(format!("no-such-kubeconfig-{}", std::process::id()));
    let missing = missing.to_str().ok_or("temp dir is not UTF-8")?;
    match K8sLeaseStore::connect(&format!("k8s://{ns}?kubeconfig={missing}")).await {
        Err(e @ Error::Config { .. }) if e.to_string().contains(missing) => {}
        other => {
            return Err(
                format!("kubeconfig={missing}: expected Config naming it, got {other:?}").into(),
            );
        }
    }

    for bad in [
        "name_prefx=a-",
        "request_timout=5s",
        "request_timeout=5",
        "request_timeout=0s",
        "name_prefix=Bad_",
        "kubeconfig=",
        "namespace=Team_A",
        "name_prefix=a-&name_prefix=b-",
    ] {
        let url = format!("k8s://{ns}?kubeconfig={kubeconfig}&{bad}");
        match K8sLeaseStore::connect(&url).await {
            Err(e @ Error::Config { .. }) => {
                let name = bad.split('=').next().unwrap_or(bad);
                if !e.to_string().contains(name) {
                    return Err(format!("{bad}: the error does not name {name}: {e}").into());
                }
                assert!(!e.is_retryable(), "{bad}: {e}");
            }
            other => return Err(format!("{bad}: expected Error::Config, got {other:?}").into()),
        }
    }
    let conflicting = format!("k8s://{ns}?kubeconfig={kubeconfig}&namespace=other-{ns}");
    match K8sLeaseStore::connect(&conflicting).await {
        Err(e @ Error::Config { .. }) if e.to_string().contains("namespace") => {}
        other => return Err(format!("{conflicting}: expected Config, got {other:?}").into()),
    }
    Ok(())
}
