//! etcd-specific cases and the helpers they share.

mod abandoned;
mod batch;
pub(crate) mod cluster;
mod failover;
mod input;
mod interop;
mod renewal;
mod sharing;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lease_core::{AcquireOutcome, AcquireRequest, FencedResource, Lease, LeaseStore};
use lease_etcd::{EtcdConfig, EtcdFencedResource, EtcdLeaseStore, LeaseSharing};
use lease_testkit::cases::Case;
use lease_testkit::{Backend, BoxFuture, Failed, case};
use tokio::time::Instant;

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

    fn connect(&self) -> BoxFuture<'_, lease_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async {
            Ok(Arc::new(EtcdLeaseStore::connect(config()).await?) as Arc<dyn LeaseStore>)
        })
    }

    fn resource(&self) -> BoxFuture<'_, lease_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(EtcdFencedResource::connect(config()).await?) as Arc<dyn FencedResource>)
        })
    }

    /// Two seconds: etcd's TTLs are whole seconds, and one second leaves little room for a
    /// renewal on a loaded two-core machine.
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let config = config();
            if let Ok(store) = EtcdLeaseStore::connect(config.clone()).await {
                let mut client = store.client();
                for prefix in [config.prefix(), config.fence_prefix()] {
                    let opts = etcd_client::DeleteOptions::new().with_prefix();
                    let _ = client
                        .delete(format!("{prefix}{namespace}"), Some(opts))
                        .await;
                }
            }
        })
    }
}

/// The shared member's endpoints: `LEASE_ETCD_ENDPOINTS`, default `http://127.0.0.1:23790`.
pub(crate) fn endpoints() -> String {
    std::env::var("LEASE_ETCD_ENDPOINTS").unwrap_or_else(|_| "http://127.0.0.1:23790".to_string())
}

/// A configuration for the shared member, in this binary's sharing mode.
pub(crate) fn config() -> EtcdConfig {
    EtcdConfig::from_list(&endpoints())
        .with_lease_sharing(SHARING.get().copied().unwrap_or_default())
}

/// The etcd-specific cases for `sharing`: everything with one etcd lease per grant; with shared
/// etcd leases the cases about renewal, batches, waiting, interop and sharing itself (the
/// failover cases do not depend on the mode).
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    if sharing == LeaseSharing::PerTtl {
        return vec![
            case!("etcd", interop::etcdctl_holds_and_the_store_is_refused),
            case!("etcd", interop::etcdctl_holders_cannot_be_impersonated),
            case!("etcd", abandoned::a_dropped_acquire_leaves_no_key_alive),
            case!("etcd", abandoned::a_failed_acquire_leaves_no_key_alive),
            case!(
                "etcd",
                sharing::a_renewal_through_another_store_holds_to_its_deadline
            ),
            case!(
                "etcd",
                sharing::a_store_without_sharing_refuses_a_shared_key
            ),
            case!("etcd", interop::store_holds_and_etcdctl_waits),
            case!(
                "etcd",
                renewal::keepalive_of_a_lease_whose_key_was_deleted_is_not_a_renewal
            ),
            case!(
                "etcd",
                renewal::watch_wakes_a_waiter_on_release_and_on_expiry
            ),
            case!(
                "etcd",
                sharing::many_keys_share_one_etcd_lease_and_one_keepalive
            ),
            case!(
                "etcd",
                sharing::an_unrenewed_key_expires_although_its_etcd_lease_lives
            ),
            case!(
                "etcd",
                batch::renew_many_reads_keys_back_in_few_range_requests
            ),
            case!(
                "etcd",
                batch::renew_many_reports_exactly_the_leases_that_were_lost
            ),
        ];
    }
    vec![
        case!("etcd", interop::etcdctl_holds_and_the_store_is_refused),
        case!("etcd", interop::etcdctl_holders_cannot_be_impersonated),
        case!("etcd", interop::store_holds_and_etcdctl_waits),
        case!(
            "etcd",
            renewal::keepalive_of_a_lease_whose_key_was_deleted_is_not_a_renewal
        ),
        case!(
            "etcd",
            renewal::watch_wakes_a_waiter_on_release_and_on_expiry
        ),
        case!(
            "etcd",
            batch::renew_many_reports_exactly_the_leases_that_were_lost
        ),
        case!("etcd", input::unreachable_endpoints_fail_fast_and_retryable),
        case!("etcd", input::malformed_endpoints_are_config_errors),
        case!(
            "etcd",
            input::ttl_below_the_server_minimum_is_invalid_and_others_round_up
        ),
        case!("etcd", failover::member_restart_while_a_lease_is_held),
        case!("etcd", failover::leader_killed_in_a_three_member_cluster),
    ]
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

/// Acquires a free key on `store`, failing the case if it is held.
pub(crate) async fn must_acquire(
    store: &dyn LeaseStore,
    key: &lease_core::LeaseKey,
    owner: &lease_core::OwnerId,
    ttl: Duration,
) -> Result<Lease, Failed> {
    match store
        .acquire(&AcquireRequest::new(key.clone(), owner.clone(), ttl))
        .await?
    {
        AcquireOutcome::Acquired(lease) => Ok(lease),
        AcquireOutcome::Held(h) => {
            Err(format!("{key} is held by {} with token {}", h.owner, h.token).into())
        }
    }
}
