//! Kubernetes-specific failure cases, run by `conformance.rs` next to the shared suite.

mod adoption;
pub(crate) mod env;
mod failure;
mod interop;
mod tokens;

use lease_testkit::case;
use lease_testkit::cases::Case;

/// The backend handle the testkit drives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kube;

/// The backend-specific cases.
pub(crate) fn all() -> Vec<Case> {
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
        case!("k8s", failure::bad_configuration_is_a_typed_error),
        case!("k8s", failure::unreachable_server_is_unavailable),
        case!("k8s", failure::missing_namespace_is_a_config_error),
        case!("k8s", failure::ttl_is_rounded_up_to_whole_seconds),
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
        case!("k8s", adoption::renewal_dropped_after_sending_is_adopted),
        case!("k8s", adoption::renewal_timed_out_after_sending_is_adopted),
        case!(
            "k8s",
            adoption::supervised_renewal_dropped_by_its_bound_stays_held
        ),
    ]
}
