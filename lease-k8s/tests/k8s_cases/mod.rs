//! Kubernetes-specific failure cases, run by `conformance.rs` next to the shared suite.

pub mod env;

use lease_testkit::cases::Case;
use lease_testkit::case;

/// The backend handle the testkit drives.
#[derive(Debug, Clone, Copy)]
pub struct Kube;

/// The backend-specific cases.
pub fn all() -> Vec<Case> {
    vec![]
}
