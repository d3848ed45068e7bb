//! etcd-specific cases and the helpers they share.

use lease_etcd::EtcdConfig;
use lease_testkit::cases::Case;

/// The shared member's endpoints: `LEASE_ETCD_ENDPOINTS`, default `http://127.0.0.1:23790`.
pub(crate) fn endpoints() -> String {
    std::env::var("LEASE_ETCD_ENDPOINTS").unwrap_or_else(|_| "http://127.0.0.1:23790".to_string())
}

/// A configuration for the shared member.
pub(crate) fn config() -> EtcdConfig {
    EtcdConfig::from_list(&endpoints())
}

/// The etcd-specific cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![]
}
