//! The stores both shard and election conformance run against: memory and the six real
//! backends, their addresses from leasehold-testkit's test store table
//! (`leasehold_testkit::stores`), each with the TTL its cases use. The suites run on them with
//! leasehold-testkit's multi-backend runner (`run_suite`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::LeaseStore;
use leasehold_testkit::SuiteBackend;
use leasehold_testkit::stores::{self, ETCD, MYSQL, POSTGRES, REDIS};

/// One backend as a case sees it: the runner's backend and the TTL its leases take.
#[derive(Clone, Debug)]
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) ttl: Duration,
    store: SuiteBackend,
}

impl Backend {
    /// The runner's backend with its TTL: a second, two on etcd (whole seconds, and a renewal
    /// needs room on a loaded two-core machine) and Kubernetes, three in Kubernetes's grouped
    /// mode, 900 ms in memory.
    pub(crate) fn of(store: SuiteBackend) -> Self {
        let ttl = match store.name() {
            "memory" => Duration::from_millis(900),
            "etcd" | "k8s" => Duration::from_secs(2),
            // A handover there is a release written by a task, a watch event on the group
            // object, then a membership renewal, a read and a write of the group: 100-200 ms
            // on the loaded test host, against a bound of half an interval.
            "k8s-grouped" => Duration::from_secs(3),
            _ => Duration::from_secs(1),
        };
        Backend {
            name: store.name(),
            ttl,
            store,
        }
    }

    /// A new client of the backend's store (each worker has its own connection).
    pub(crate) async fn connect(&self) -> leasehold_core::Result<Arc<dyn LeaseStore>> {
        self.store.connect().await
    }
}

/// Kubernetes in its grouped mode (`K8sLeaseStore::grouped`, set `set`, 16 groups: what a shard
/// set of thousands of shards uses there), named `k8s-grouped`; each client a grouped store of
/// its own over a client of its own.
#[allow(dead_code)] // used by the shard suite, not the election suite
pub(crate) fn k8s_grouped(set: &'static str) -> SuiteBackend {
    let kubeconfig = stores::KUBECONFIG.value().unwrap_or_default();
    let ns = stores::K8S_NAMESPACE.value().unwrap_or_default();
    SuiteBackend::new("k8s-grouped", move || {
        let (kubeconfig, ns) = (kubeconfig.clone(), ns.clone());
        async move {
            let client = leasehold::k8s::client_from_kubeconfig(kubeconfig).await?;
            let store = leasehold::k8s::K8sLeaseStore::from_client(
                client,
                leasehold::k8s::K8sOptions::default().with_namespace(ns),
            )?;
            Ok(
                Arc::new(store.grouped(set, leasehold::k8s::DEFAULT_GROUPS)?)
                    as Arc<dyn LeaseStore>,
            )
        }
    })
}

/// Memory, PostgreSQL, Redis, etcd, MySQL / MariaDB, Kubernetes and SQLite (the file
/// `sqlite_file` in `sqlite_dir`).
pub(crate) fn backends(sqlite_dir: &Path, sqlite_file: &str) -> Vec<SuiteBackend> {
    let by_url = |store| {
        SuiteBackend::from_table(store, |url| async move { leasehold::connect(&url).await })
    };
    let kubeconfig = stores::KUBECONFIG.value().unwrap_or_default();
    let ns = stores::K8S_NAMESPACE.value().unwrap_or_default();
    let k8s = SuiteBackend::new(stores::K8S.name, move || {
        let (kubeconfig, ns) = (kubeconfig.clone(), ns.clone());
        async move {
            let client = leasehold::k8s::client_from_kubeconfig(kubeconfig).await?;
            Ok(Arc::new(leasehold::k8s::K8sLeaseStore::from_client(
                client,
                leasehold::k8s::K8sOptions::default().with_namespace(ns),
            )?) as Arc<dyn LeaseStore>)
        }
    });
    let sqlite = format!("sqlite://{}", sqlite_dir.join(sqlite_file).display());
    vec![
        SuiteBackend::memory(),
        by_url(&POSTGRES),
        by_url(&REDIS),
        by_url(&ETCD),
        by_url(&MYSQL),
        k8s,
        SuiteBackend::new(stores::SQLITE.name, move || {
            let url = sqlite.clone();
            async move { leasehold::connect(&url).await }
        }),
    ]
}
