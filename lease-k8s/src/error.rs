//! Private error classification: kube errors by kind, mapped into [`lease_core::Error`].

use std::time::Duration;

use lease_core::Error;

pub(crate) const BACKEND: &str = "k8s";

/// What a failed API call means to the store logic.
#[derive(Debug)]
pub(crate) enum KubeError {
    /// 409 with reason `Conflict`: a replace whose resourceVersion was stale (lost race).
    Conflict,
    /// 409 with reason `AlreadyExists`: a create of an existing name (lost race).
    AlreadyExists,
    /// 404: the object (or, on create, its namespace) does not exist.
    NotFound(String),
    /// Anything else, already mapped.
    Other(Error),
}

impl KubeError {
    /// The error for callers that do not expect a conflict or a missing object.
    pub(crate) fn into_error(self, operation: &'static str) -> Error {
        match self {
            KubeError::Conflict | KubeError::AlreadyExists => {
                Error::backend(BACKEND, format!("{operation}: unexpected conflict"), None)
            }
            KubeError::NotFound(message) => {
                Error::backend(BACKEND, format!("{operation}: {message}"), None)
            }
            KubeError::Other(e) => e,
        }
    }
}

/// Classifies a kube error by kind (HTTP status and kube's error variants), never by its text.
pub(crate) fn classify(operation: &'static str, err: kube::Error) -> KubeError {
    match err {
        kube::Error::Api(status) => {
            if status.is_already_exists() {
                return KubeError::AlreadyExists;
            }
            if status.is_conflict() {
                return KubeError::Conflict;
            }
            if status.is_not_found() {
                return KubeError::NotFound(status.message.clone());
            }
            let code = status.code;
            let message = format!(
                "{operation}: {} {} ({})",
                status.code, status.reason, status.message
            );
            let source: Option<lease_core::BoxError> = Some(status);
            KubeError::Other(match code {
                // Throttling and server-side failures (etcd down, apiserver overloaded) pass.
                429 | 500..=599 => Error::unavailable(BACKEND, message, source),
                // 401/403 (credentials, RBAC), 400/422 (invalid object), 410 and the rest.
                _ => Error::backend(BACKEND, message, source),
            })
        }
        kube::Error::HyperError(e) => KubeError::Other(Error::unavailable(
            BACKEND,
            format!("{operation}: {e}"),
            Some(Box::new(e).into()),
        )),
        kube::Error::Service(e) => KubeError::Other(Error::unavailable(
            BACKEND,
            format!("{operation}: {e}"),
            Some(e),
        )),
        kube::Error::ReadEvents(e) => KubeError::Other(Error::unavailable(
            BACKEND,
            format!("{operation}: {e}"),
            Some(Box::new(e).into()),
        )),
        e @ (kube::Error::InferConfig(_)
        | kube::Error::InferKubeconfig(_)
        | kube::Error::Auth(_)
        | kube::Error::RustlsTls(_)
        | kube::Error::TlsRequired
        | kube::Error::ProxyProtocolUnsupported { .. }
        | kube::Error::ProxyProtocolDisabled { .. }) => KubeError::Other(Error::config(
            BACKEND,
            format!("{operation}: {e}"),
            Some(Box::new(e).into()),
        )),
        e => KubeError::Other(Error::backend(
            BACKEND,
            format!("{operation}: {e}"),
            Some(Box::new(e).into()),
        )),
    }
}

/// Runs one API call under the store's request timeout.
pub(crate) async fn timed<T>(
    operation: &'static str,
    after: Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeError> {
    match tokio::time::timeout(after, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(classify(operation, e)),
        Err(_) => Err(KubeError::Other(Error::Timeout {
            backend: BACKEND,
            operation,
            after,
        })),
    }
}

/// A malformed Lease (or resource) object.
pub(crate) fn corrupt(message: impl Into<String>) -> Error {
    Error::backend(BACKEND, message.into(), None)
}
