//! Private error classification: kube errors by kind, mapped into [`leasehold_core::Error`].

use std::time::Duration;

use leasehold_core::Error;

pub(crate) const BACKEND: &str = "k8s";

/// What a failed API call means to the store logic.
#[derive(Debug)]
pub(crate) enum K8sError {
    /// 409 with reason `Conflict`: a replace whose resourceVersion was stale (lost race).
    Conflict,
    /// 409 with reason `AlreadyExists`: a create of an existing name (lost race).
    AlreadyExists,
    /// 404: the object (or, on create, its namespace) does not exist.
    NotFound(String),
    /// Anything else, already mapped.
    Other(Error),
}

impl K8sError {
    /// The error for callers that do not expect a conflict or a missing object.
    pub(crate) fn into_error(self, operation: &'static str) -> Error {
        match self {
            K8sError::Conflict | K8sError::AlreadyExists => {
                Error::store_fault(BACKEND, format!("{operation}: unexpected conflict"), None)
            }
            K8sError::NotFound(message) => {
                Error::store_fault(BACKEND, format!("{operation}: {message}"), None)
            }
            K8sError::Other(e) => e,
        }
    }
}

/// Maps a kube error by kind (HTTP status and kube's error variants), never by its text. The
/// signature is the other backends' `map(operation, err, context)` without the context: the
/// apiserver's answer carries all this mapping needs (a timeout is told by [`timed`], not here).
pub(crate) fn map(operation: &'static str, err: kube::Error) -> K8sError {
    match err {
        kube::Error::Api(status) => {
            if status.is_already_exists() {
                return K8sError::AlreadyExists;
            }
            if status.is_conflict() {
                return K8sError::Conflict;
            }
            if status.is_not_found() {
                return K8sError::NotFound(status.message.clone());
            }
            let code = status.code;
            let message = format!(
                "{operation}: {} {} ({})",
                status.code, status.reason, status.message
            );
            let source: Option<leasehold_core::BoxError> = Some(status);
            K8sError::Other(match code {
                // Throttling (API priority and fairness refuses before it starts the request):
                // certainly not applied.
                429 => Error::refused(BACKEND, message, source),
                // Server-side failures (etcd down, apiserver overloaded) pass; the request may
                // have been applied before the failure.
                500..=599 => Error::unavailable(BACKEND, message, source),
                // 401/403 (credentials, RBAC), 400/422 (invalid object), 410 and the rest.
                _ => Error::store_fault(BACKEND, message, source),
            })
        }
        kube::Error::HyperError(e) => K8sError::Other(match certificate_failure(&e) {
            Some(tls) => tls_config_error(operation, &tls, Box::new(e)),
            None => Error::unavailable(
                BACKEND,
                format!("{operation}: {e}"),
                Some(Box::new(e).into()),
            ),
        }),
        kube::Error::Service(e) => K8sError::Other(match certificate_failure(&*e) {
            Some(tls) => tls_config_error(operation, &tls, e),
            None => Error::unavailable(BACKEND, format!("{operation}: {e}"), Some(e)),
        }),
        kube::Error::ReadEvents(e) => K8sError::Other(Error::unavailable(
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
        | kube::Error::ProxyProtocolDisabled { .. }) => K8sError::Other(Error::config(
            BACKEND,
            format!("{operation}: {e}"),
            Some(Box::new(e).into()),
        )),
        e => K8sError::Other(Error::store_fault(
            BACKEND,
            format!("{operation}: {e}"),
            Some(Box::new(e).into()),
        )),
    }
}

/// The TLS error, if `err` failed because a certificate was refused (by us: the apiserver's
/// certificate is not signed by the kubeconfig's CA, or names another host; or by the apiserver:
/// our client certificate). Found by type in the source chain, never by text. Retrying cannot
/// help, so such a failure is a configuration error, not an unavailable server.
fn certificate_failure(err: &(dyn std::error::Error + 'static)) -> Option<rustls::Error> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return refuses_a_certificate(tls).then(|| tls.clone());
        }
        // `io::Error::source` skips the error it wraps (the TLS stack wraps rustls errors in
        // `io::Error`s, sometimes twice), so step into it explicitly.
        current = match e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

fn refuses_a_certificate(tls: &rustls::Error) -> bool {
    use rustls::AlertDescription as A;
    match tls {
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => true,
        rustls::Error::AlertReceived(alert) => matches!(
            alert,
            A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::CertificateRequired
        ),
        _ => false,
    }
}

fn tls_config_error(
    operation: &'static str,
    tls: &rustls::Error,
    source: leasehold_core::BoxError,
) -> Error {
    Error::config(
        BACKEND,
        format!(
            "{operation}: TLS with the apiserver failed: {}",
            tls_cause(tls)
        ),
        Some(source),
    )
}

/// The cause of a refused certificate in words, with what to check, and rustls's own text.
fn tls_cause(tls: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    let cause = match tls {
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "the apiserver's certificate has expired (renew it on the server)"
        }
        rustls::Error::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
            "the apiserver's certificate is not valid yet (check the clocks)"
        }
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => {
            "the apiserver's certificate is not signed by the kubeconfig's certificate-authority"
        }
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => "the apiserver's certificate does not name the server the kubeconfig gives",
        rustls::Error::AlertReceived(_) | rustls::Error::NoCertificatesPresented => {
            "a certificate was refused (check the kubeconfig's client certificate)"
        }
        _ => {
            "a certificate was refused (check the kubeconfig's certificate-authority and client \
              certificate)"
        }
    };
    format!("{cause}; {tls}")
}

/// Runs one API call under the store's request timeout.
pub(crate) async fn timed<T>(
    operation: &'static str,
    after: Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, K8sError> {
    match tokio::time::timeout(after, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(map(operation, e)),
        Err(_) => Err(K8sError::Other(Error::Timeout {
            backend: BACKEND,
            operation,
            after,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::CertificateError as C;

    #[test]
    fn a_refused_certificate_is_named_by_its_cause() {
        for (tls, says) in [
            (
                rustls::Error::InvalidCertificate(C::Expired),
                "certificate has expired",
            ),
            (
                rustls::Error::InvalidCertificate(C::NotValidYet),
                "not valid yet",
            ),
            (
                rustls::Error::InvalidCertificate(C::UnknownIssuer),
                "not signed by the kubeconfig's certificate-authority",
            ),
            (
                rustls::Error::InvalidCertificate(C::NotValidForName),
                "does not name the server",
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
                "client certificate",
            ),
        ] {
            assert!(refuses_a_certificate(&tls), "{tls}");
            let e = tls_config_error("get", &tls, Box::new(tls.clone()));
            assert!(matches!(e, Error::Config { .. }), "{e:?}");
            assert!(e.to_string().contains(says), "{tls}: {e}");
        }
    }
}
