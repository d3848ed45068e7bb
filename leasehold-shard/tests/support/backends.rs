//! The stores both shard and election conformance run against: memory and the five real
//! backends (addresses from the environment), with each one's TTL and an availability probe.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LeaseKey, LeaseStore, MemoryLeaseStore};

pub(crate) type Connect = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = leasehold_core::Result<Arc<dyn LeaseStore>>> + Send>>
        + Send
        + Sync,
>;

#[derive(Clone)]
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) ttl: Duration,
    pub(crate) connect: Option<Connect>,
    pub(crate) missing: Option<String>,
}

pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

pub(crate) fn backends(sqlite_dir: &std::path::Path, sqlite_file: &str) -> Vec<Backend> {
    let mut out = Vec::new();
    let memory = MemoryLeaseStore::new();
    out.push(Backend {
        name: "memory",
        ttl: Duration::from_millis(900),
        connect: Some(Arc::new(move || {
            let m = memory.clone();
            Box::pin(async move { Ok(Arc::new(m) as Arc<dyn LeaseStore>) })
        })),
        missing: None,
    });
    let url_backend = |name: &'static str, ttl: Duration, url: Option<String>, var: &str| match url
    {
        Some(url) => Backend {
            name,
            ttl,
            connect: Some(Arc::new(move || {
                let url = url.clone();
                Box::pin(async move { leasehold::connect(&url).await })
            })),
            missing: None,
        },
        None => Backend {
            name,
            ttl,
            connect: None,
            missing: Some(format!("{var} is not set")),
        },
    };
    out.push(url_backend(
        "postgres",
        Duration::from_secs(1),
        env("LEASE_POSTGRES_URL"),
        "LEASE_POSTGRES_URL",
    ));
    out.push(url_backend(
        "redis",
        Duration::from_secs(1),
        env("LEASE_REDIS_URL"),
        "LEASE_REDIS_URL",
    ));
    out.push(url_backend(
        "etcd",
        Duration::from_secs(2),
        env("LEASE_ETCD_ENDPOINTS").map(|e| {
            let hosts: Vec<String> = e
                .split(',')
                .map(|h| {
                    h.trim()
                        .trim_start_matches("http://")
                        .trim_start_matches("https://")
                        .to_string()
                })
                .collect();
            format!("etcd://{}", hosts.join(","))
        }),
        "LEASE_ETCD_ENDPOINTS",
    ));
    let kubeconfig = env("KUBECONFIG").unwrap_or_else(|| {
        let state = env("LEASE_STATE_DIR").unwrap_or_else(|| "/tmp/lease-test".into());
        format!("{state}/k8s/kubeconfig")
    });
    let ns = env("LEASE_K8S_NAMESPACE").unwrap_or_else(|| "default".into());
    out.push(Backend {
        name: "k8s",
        ttl: Duration::from_secs(2),
        connect: Some(Arc::new(move || {
            let (kubeconfig, ns) = (kubeconfig.clone(), ns.clone());
            Box::pin(async move {
                let client = leasehold::k8s::client_from_kubeconfig(kubeconfig).await?;
                Ok(Arc::new(leasehold::k8s::K8sLeaseStore::from_client(
                    client,
                    leasehold::k8s::K8sOptions::default().with_namespace(ns),
                )?) as Arc<dyn LeaseStore>)
            })
        })),
        missing: None,
    });
    let db = sqlite_dir.join(sqlite_file);
    let url = format!("sqlite://{}", db.display());
    out.push(url_backend("sqlite", Duration::from_secs(1), Some(url), ""));
    out
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Connects and reads once, within 20 s.
pub(crate) fn available(b: &Backend) -> Result<(), String> {
    if let Some(m) = &b.missing {
        return Err(m.clone());
    }
    let connect = b.connect.clone().expect("connect");
    runtime().block_on(async move {
        match tokio::time::timeout(Duration::from_secs(20), async {
            let s = connect().await?;
            s.inspect(&LeaseKey::new("ls-availability-probe")?).await?;
            Ok::<_, leasehold_core::Error>(())
        })
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 20 s".into()),
        }
    })
}
