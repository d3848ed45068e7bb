//! The backend's name, its own failures, and the mapping of Redis driver errors into
//! [`leasehold_core::Error`], by kind.

use std::time::Duration;

use leasehold_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// The backend name used in errors, logs and metrics.
pub(crate) const BACKEND: &str = "redis";

/// Failures of this backend that have no driver error behind them; carried as the `source` of
/// the core error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RedisStoreError {
    /// A script answered something it never returns.
    #[error("unexpected reply from the {script} script: {reply}")]
    UnexpectedReply { script: &'static str, reply: String },
    /// `WAIT` saw fewer replicas than configured.
    #[error("only {acked} of {wanted} replicas acknowledged the grant within {timeout:?}")]
    TooFewReplicas {
        acked: i64,
        wanted: u32,
        timeout: Duration,
    },
}

impl RedisStoreError {
    /// As a core error: an unexpected reply is a store fault, too few replicas is
    /// `Unavailable` (the grant was made, then released best effort).
    pub(crate) fn into_error(self) -> Error {
        let message = self.to_string();
        let unavailable = matches!(self, RedisStoreError::TooFewReplicas { .. });
        let source = Some(Box::new(self) as leasehold_core::BoxError);
        if unavailable {
            Error::unavailable(BACKEND, message, source)
        } else {
            Error::store_fault(BACKEND, message, source)
        }
    }
}

/// An unexpected reply of `script`.
pub(crate) fn unexpected(script: &'static str, reply: &impl std::fmt::Debug) -> Error {
    RedisStoreError::UnexpectedReply {
        script,
        reply: format!("{reply:?}"),
    }
    .into_error()
}

/// Maps a driver error by its kind: a refused connection is `Unavailable` and certainly not
/// applied ([`Error::refused`]); other I/O errors and dropped connections are `Unavailable` with
/// an unknown outcome; response timeouts `Timeout`; bad client configuration and authentication
/// `Config`; a server that cannot serve right now (loading, read-only replica, cluster down)
/// `Unavailable`; anything else `Backend`.
pub(crate) fn map(operation: &'static str, err: RedisError, after: Duration) -> Error {
    if err.is_timeout() {
        return Error::Timeout {
            backend: BACKEND,
            operation,
            after,
        };
    }
    if let Some(tls) = tls_cause(&err) {
        let message = format!("{operation}: TLS handshake failed: {}", tls_reason(tls));
        let source = Some(Box::new(err.clone()) as leasehold_core::BoxError);
        return match tls {
            // The server's certificate or ours was refused: no retry will change that.
            rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::AlertReceived(_)
            | rustls::Error::PeerIncompatible(_) => Error::config(BACKEND, message, source),
            _ => Error::unavailable(BACKEND, message, source),
        };
    }
    let message = format!("{operation}: {err}");
    let source = Some(Box::new(err.clone()) as leasehold_core::BoxError);
    if err.is_connection_refusal() {
        return Error::refused(BACKEND, message, source);
    }
    if err.is_connection_dropped() || err.is_io_error() {
        return Error::unavailable(BACKEND, message, source);
    }
    // `NOAUTH` (no credentials where the server wants them) and `WRONGPASS` have no kind of
    // their own in the driver: told by their error code.
    if matches!(err.code(), Some("NOAUTH" | "WRONGPASS")) {
        return Error::config(BACKEND, format!("{message} (authentication)"), source);
    }
    match err.kind() {
        ErrorKind::InvalidClientConfig
        | ErrorKind::MasterNameNotFoundBySentinel
        | ErrorKind::EmptySentinelList
        | ErrorKind::AuthenticationFailed
        | ErrorKind::Server(ServerErrorKind::NoPerm) => Error::config(BACKEND, message, source),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        )
        | ErrorKind::ClusterConnectionNotFound => Error::unavailable(BACKEND, message, source),
        _ => Error::store_fault(BACKEND, message, source),
    }
}

/// The rustls error behind `err` (a TLS handshake or record failure), if any: the driver wraps it
/// in an I/O error.
fn tls_cause(err: &RedisError) -> Option<&rustls::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = cause {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // The driver keeps its I/O error as an `Arc<dyn Error>`, whose own `source` skips the
        // rustls error inside the I/O error: look through both.
        let io = e.downcast_ref::<std::io::Error>().or_else(|| {
            e.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()
                .and_then(|arc| arc.downcast_ref::<std::io::Error>())
        });
        if let Some(tls) = io
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        cause = e.source();
    }
    None
}

/// What a TLS failure means for the operator.
fn tls_reason(tls: &rustls::Error) -> String {
    use rustls::{AlertDescription, CertificateError};
    match tls {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
            "the server's certificate is not signed by a trusted CA (give its CA with tls_ca or \
             RedisOptions::with_tls_ca_file): {tls}"
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => format!("the server's certificate has expired: {tls}"),
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!("the server's certificate is not valid for the host name in the URL: {tls}"),
        rustls::Error::InvalidCertificate(_) => {
            format!("the server's certificate was refused: {tls}")
        }
        rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown,
        ) => format!(
            "the server refused this client's certificate, or needs one (tls_cert and tls_key, \
             or RedisOptions::with_tls_client_cert): {tls}"
        ),
        _ => tls.to_string(),
    }
}
