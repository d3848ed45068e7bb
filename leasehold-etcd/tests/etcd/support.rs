//! The backend under test (the shared member, in one lease sharing mode) and the helpers the
//! etcd cases share.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use leasehold_core::{AcquireOutcome, AcquireRequest, FencedResource, Lease, LeaseStore};
use leasehold_etcd::{EtcdLeaseStore, EtcdOptions, LeaseSharing};
use leasehold_testkit::{Backend, BoxFuture, Failed};
use tokio::time::Instant;

#[path = "wipe.rs"]
mod wipe;

/// The lease sharing mode of this test binary (set once in `main`).
static SHARING: OnceLock<LeaseSharing> = OnceLock::new();

/// The shared etcd member, in one lease sharing mode.
#[derive(Debug)]
pub(crate) struct Etcd;

impl Etcd {
    /// The backend with stores in `sharing` mode.
    pub(crate) fn new(sharing: LeaseSharing) -> Self {
        let _ = SHARING.set(sharing);
        Etcd
    }
}

impl Backend for Etcd {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async {
            Ok(
                Arc::new(EtcdLeaseStore::connect_with(&url(), options()).await?)
                    as Arc<dyn LeaseStore>,
            )
        })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            let store = EtcdLeaseStore::connect_with(&url(), options()).await?;
            Ok(Arc::new(store.fenced_resource()) as Arc<dyn FencedResource>)
        })
    }

    /// Two seconds: etcd's TTLs are whole seconds, and one second leaves little room for a
    /// renewal on a loaded two-core machine.
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = EtcdLeaseStore::connect_with(&url(), options()).await {
                wipe::delete_case_namespace(&store, namespace).await;
            }
        })
    }
}

/// The shared member's endpoints: `LEASE_ETCD_ENDPOINTS`, or its default in leasehold-testkit's
/// test store table.
pub(crate) fn endpoints() -> String {
    leasehold_testkit::stores::ETCD_ENDPOINTS.get()
}

/// The `etcd://` URL of the shared member.
pub(crate) fn url() -> String {
    etcd_url(endpoints().split(','))
}

/// The `etcd://` URL of `endpoints` (`http://host:port` or bare `host:port`).
pub(crate) fn etcd_url<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> String {
    let hosts: Vec<String> = endpoints
        .into_iter()
        .map(|e| {
            let e = e.as_ref().trim();
            e.strip_prefix("http://")
                .unwrap_or(e)
                .trim_end_matches('/')
                .to_string()
        })
        .collect();
    format!("etcd://{}", hosts.join(","))
}

/// The options of this binary's stores: the defaults, in this binary's sharing mode.
pub(crate) fn options() -> EtcdOptions {
    EtcdOptions::default().with_lease_sharing(SHARING.get().copied().unwrap_or_default())
}

/// Runs the leasehold-testkit suite plus every etcd case file's cases for `sharing`, then exits.
pub(crate) fn run(sharing: LeaseSharing) -> ! {
    let cases = [
        crate::abandoned::cases,
        crate::batch::cases,
        crate::failover::cases,
        crate::guards::cases,
        crate::input::cases,
        crate::interop::cases,
        crate::options::cases,
        crate::release::cases,
        crate::renewal::cases,
        crate::sharing::cases,
        crate::shards::cases,
    ]
    .iter()
    .flat_map(|cases| cases(sharing))
    .collect();
    leasehold_testkit::run_with(Etcd::new(sharing), cases)
}

/// Acquires `req` as soon as the key is free: woken by the store's watch, re-watching when the
/// watch breaks (a killed member), and re-trying at least every `poll` as a fallback. Fails after
/// `within`.
pub(crate) async fn wait_and_acquire(
    store: &dyn LeaseStore,
    req: &AcquireRequest,
    poll: Duration,
    within: Duration,
) -> Result<Lease, Failed> {
    let deadline = Instant::now() + within;
    let mut watch = None;
    loop {
        if watch.is_none() {
            watch = store.watch(&req.key).await.ok().flatten();
        }
        match store.acquire(req).await {
            Ok(AcquireOutcome::Acquired(lease)) => return Ok(lease),
            Ok(AcquireOutcome::Held(_)) => {}
            Err(e) if e.is_retryable() => {}
            Err(e) => return Err(format!("acquire while waiting: {e}").into()),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(format!("{} not acquired within {within:?}", req.key).into());
        }
        let wait = poll.min(deadline - now);
        match watch.as_mut() {
            Some(w) => match tokio::time::timeout(wait, w.changed()).await {
                Ok(Some(Ok(()))) | Err(_) => {}
                Ok(_) => watch = None,
            },
            None => tokio::time::sleep(wait.min(Duration::from_millis(100))).await,
        }
    }
}
