//! Where the tests find the apiserver, and raw access to it for the failure cases.

use std::path::PathBuf;

use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams};
use leasehold_k8s::{K8sFencedResource, K8sLeaseStore, K8sOptions};

/// `KUBECONFIG`, or the file `scripts/services/k8s.sh` writes by default (leasehold-testkit's
/// test store table).
pub(crate) fn kubeconfig() -> PathBuf {
    PathBuf::from(leasehold_testkit::stores::KUBECONFIG.get())
}

/// `LEASE_K8S_NAMESPACE`, default `default` (leasehold-testkit's test store table).
pub(crate) fn namespace() -> String {
    leasehold_testkit::stores::K8S_NAMESPACE.get()
}

pub(crate) async fn client() -> leasehold_core::Result<kube::Client> {
    leasehold_k8s::client_from_kubeconfig(kubeconfig()).await
}

pub(crate) async fn store() -> leasehold_core::Result<K8sLeaseStore> {
    K8sLeaseStore::from_client(
        client().await?,
        K8sOptions::default().with_namespace(namespace()),
    )
}

pub(crate) async fn resource() -> leasehold_core::Result<K8sFencedResource> {
    Ok(store().await?.fenced_resource())
}

/// Raw access to the Lease objects (as another controller, or a human with kubectl, would have).
pub(crate) async fn leases() -> leasehold_core::Result<Api<KubeLease>> {
    Ok(Api::namespaced(client().await?, &namespace()))
}

/// Deletes the Leases and ConfigMaps a case left behind (best effort).
pub(crate) async fn cleanup(prefix: &str) {
    let Ok(client) = client().await else { return };
    let leases: Api<KubeLease> = Api::namespaced(client.clone(), &namespace());
    let maps: Api<ConfigMap> = Api::namespaced(client, &namespace());
    if let Ok(list) = leases.list(&ListParams::default()).await {
        for l in list.items {
            if let Some(name) = l.metadata.name.filter(|n| n.starts_with(prefix)) {
                let _ = leases.delete(&name, &DeleteParams::default()).await;
            }
        }
    }
    let fence_prefix = format!("fence.{prefix}");
    if let Ok(list) = maps.list(&ListParams::default()).await {
        for m in list.items {
            if let Some(name) = m.metadata.name.filter(|n| n.starts_with(&fence_prefix)) {
                let _ = maps.delete(&name, &DeleteParams::default()).await;
            }
        }
    }
}
