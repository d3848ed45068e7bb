//! The whole leasehold-testkit suite, plus the Kubernetes-specific failure cases, against a real
//! kube-apiserver.
//!
//! Reads `KUBECONFIG` (default `/tmp/lease-test/k8s/kubeconfig`, what `scripts/services/k8s.sh`
//! writes) and `LEASE_K8S_NAMESPACE` (default `default`). Without a reachable apiserver every case
//! is ignored, unless `CI=true` or `LEASE_TEST_REQUIRE=1`, where the run fails.

mod adoption;
mod auth;
mod env;
mod failure;
mod fence;
mod interop;
mod tokens;
mod url;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{FencedResource, LeaseStore};
use leasehold_testkit::{Backend, BoxFuture};

use leasehold_testkit::case;
use leasehold_testkit::cases::Case;

/// The backend handle the testkit drives.
#[derive(Debug, Clone, Copy)]
struct Kube;

/// The backend-specific cases.
fn all() -> Vec<Case> {
    vec![
        case!(
            "k8s",
            failure::lease_deleted_under_holder_is_lost_and_tokens_keep_increasing
        ),
        case!(
            "k8s",
            failure::foreign_write_makes_renew_conflict_and_lose_at_once
        ),
        case!("k8s", failure::watch_wakes_on_deletion),
        case!("k8s", fence::prefixes_keep_separate_fence_marks),
        case!("k8s", auth::bearer_token_kubeconfig_grants_and_fences),
        case!("k8s", auth::client_certificate_kubeconfig_grants_and_fences),
        case!(
            "k8s",
            auth::wrong_ca_kubeconfig_is_a_config_error_not_a_hang
        ),
        case!(
            "k8s",
            auth::expired_server_certificate_is_a_config_error_not_a_hang
        ),
        case!("k8s", auth::wrong_bearer_token_is_a_typed_error),
        case!("k8s", auth::untrusted_client_certificate_is_a_typed_error),
        case!("k8s", failure::bad_configuration_is_a_typed_error),
        case!("k8s", failure::unreachable_server_is_unavailable),
        case!("k8s", failure::missing_namespace_is_a_config_error),
        case!("k8s", failure::ttl_is_rounded_up_to_whole_seconds),
        case!("k8s", failure::connect_url_uses_the_ambient_configuration),
        case!(
            "k8s",
            url::url_options_configure_the_store_and_unknown_ones_are_refused
        ),
        case!(
            "k8s",
            interop::client_go_holder_is_respected_until_observed_expired
        ),
        case!("k8s", interop::expiry_ignores_the_timestamps_in_the_record),
        case!("k8s", interop::released_record_reads_as_client_go_release),
        case!("k8s", interop::kubectl_reads_the_lease),
        case!(
            "k8s",
            interop::terms_are_unique_across_a_go_to_rust_handover
        ),
        case!(
            "k8s",
            tokens::stalled_create_after_deletion_gets_a_greater_token
        ),
        case!(
            "k8s",
            tokens::takeover_token_is_above_the_recorded_token_not_only_the_version
        ),
        case!("k8s", adoption::renewal_dropped_after_sending_is_adopted),
        case!("k8s", adoption::renewal_timed_out_after_sending_is_adopted),
        case!(
            "k8s",
            adoption::supervised_renewal_dropped_by_its_bound_stays_held
        ),
    ]
}

impl Backend for Kube {
    fn name(&self) -> &'static str {
        "k8s"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(env::store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async { Ok(Arc::new(env::resource().await?) as Arc<dyn FencedResource>) })
    }

    /// 2 s: the apiserver's minimum is 1 s, but on a loaded 2-core machine a 1 s lease leaves the
    /// supervisor too little slack between renewals (one slow etcd fsync puts it at risk).
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(env::cleanup(namespace))
    }
}

fn main() {
    leasehold_testkit::run_with(Kube, all());
}
