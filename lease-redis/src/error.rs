//! Mapping Redis driver errors into [`lease_core::Error`], by kind.

use std::time::Duration;

use lease_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::BACKEND;

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
    pub(crate) fn into_backend(self) -> Error {
        Error::backend(
            BACKEND,
            self.to_string(),
            Some(Box::new(self) as lease_core::BoxError),
        )
    }
}

/// Maps a driver error by its kind: I/O and refused or dropped connections are `Unavailable`,
/// response timeouts `Timeout`, bad client configuration and authentication `Config`, a server
/// that cannot serve right now (loading, read-only replica, cluster down) `Unavailable`, anything
/// else `Backend`.
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
    if err.is_connection_refusal() || err.is_connection_dropped() || err.is_io_error() {
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
        _ => Error::backend(BACKEND, message, source),
    }
}
