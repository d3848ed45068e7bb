//! The backend's name, its own failures, and the mapping of Redis driver errors into
//! [`lease_core::Error`], by kind.

use std::time::Duration;

use lease_core::Error;
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
        let source = Some(Box::new(self) as lease_core::BoxError);
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
pub(crate) fn map_redis(operation: &'static str, after: Duration, err: RedisError) -> Error {
    if err.is_timeout() {
        return Error::Timeout {
            backend: BACKEND,
            operation,
            after,
        };
    }
    let message = format!("{operation}: {err}");
    let source = Some(Box::new(err.clone()) as lease_core::BoxError);
    if err.is_connection_refusal() {
        return Error::refused(BACKEND, message, source);
    }
    if err.is_connection_dropped() || err.is_io_error() {
        return Error::unavailable(BACKEND, message, source);
    }
    match err.kind() {
        ErrorKind::InvalidClientConfig
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
