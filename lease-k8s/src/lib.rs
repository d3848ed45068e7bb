//! The Kubernetes backend (docs to come).

mod error;
mod fenced;
mod record;
mod store;
mod watch;

pub use fenced::{HIGH_WATER_ANNOTATION, KubeFencedResource, fence_object_name};
pub use record::{TOKEN_ANNOTATION, TOKEN_HOLDER_ANNOTATION};
pub use store::{
    DEFAULT_REQUEST_TIMEOUT, KubeLeaseStore, KubeLeaseStoreBuilder, MAX_PREFIX_LEN, client_from_kubeconfig, infer_client,
};
