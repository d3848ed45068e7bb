//! The one error type of the library.
//!
//! Errors are for *failures*: bad input, a store that cannot be reached or did not answer in time,
//! and a store that answered something the protocol does not allow. "Someone else holds the key",
//! "the lease is lost" and "the token is stale" are **outcomes**, returned as enum variants the
//! caller must match ([`AcquireOutcome`](crate::AcquireOutcome),
//! [`RenewOutcome`](crate::RenewOutcome), [`WriteOutcome`](crate::WriteOutcome)), never errors.

use std::time::Duration;

/// A boxed source error from a driver.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Every failure the library reports.
///
/// Use [`Error::is_retryable`] to tell a network blip (try again) from a problem that will not go
/// away by retrying (fix the input or the deployment).
///
/// ```
/// use leasehold_core::{Error, LeaseKey};
/// let err = LeaseKey::new("").unwrap_err();
/// assert!(matches!(err, Error::InvalidKey { .. }));
/// assert!(!err.is_retryable());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key is not a legal lease key (see [`LeaseKey`](crate::LeaseKey)).
    #[error("invalid lease key {key:?}: {reason}")]
    InvalidKey {
        /// The rejected key, possibly truncated for display.
        key: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The owner id is not legal (see [`OwnerId`](crate::OwnerId)).
    #[error("invalid owner id {owner:?}: {reason}")]
    InvalidOwner {
        /// The rejected owner id, possibly truncated for display.
        owner: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The TTL is zero, below what the backend supports, or absurdly large.
    #[error("invalid ttl {ttl:?}: {reason}")]
    InvalidTtl {
        /// The rejected TTL.
        ttl: Duration,
        /// Why it was rejected (names the allowed range).
        reason: String,
    },
    /// A fencing token that does not fit where it must go (for example a negative `BIGINT`).
    #[error("invalid fencing token: {reason}")]
    InvalidToken {
        /// Why it was rejected.
        reason: String,
    },
    /// Any other invalid argument (a lease presented to a store that did not issue it, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The store configuration is unusable: an unparsable URL, an illegal table name, a key prefix
    /// that breaks cluster slotting, a missing table or namespace.
    #[error("invalid {backend} configuration: {message}")]
    Config {
        /// The backend name (`"postgres"`, `"redis"`, ...).
        backend: &'static str,
        /// What is wrong, naming the offending value.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The store could not be reached or dropped the connection. Retryable. Build it with
    /// [`Error::unavailable`] (the request may have been applied) or [`Error::refused`] (it
    /// certainly was not).
    #[error("{backend} unavailable: {message}")]
    Unavailable {
        /// The backend name.
        backend: &'static str,
        /// What happened.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
        /// Whether the request may have reached the store and been applied (see
        /// [`Error::outcome_unknown`]).
        maybe_applied: bool,
    },
    /// The store did not answer within the allowed time. The outcome of the operation is
    /// **unknown**: it may or may not have been applied. Retryable.
    #[error("{backend} did not answer {operation} within {after:?}")]
    Timeout {
        /// The backend name.
        backend: &'static str,
        /// The operation that timed out.
        operation: &'static str,
        /// How long we waited.
        after: Duration,
    },
    /// The store answered, but with something the protocol does not allow (a corrupt row, a
    /// script error, a permission problem, an unexpected status). Not retryable.
    #[error("{backend} backend error: {message}")]
    Backend {
        /// The backend name.
        backend: &'static str,
        /// What happened.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

/// The coarse class of an [`Error`], for metrics labels, exit codes and retry policies.
///
/// Each kind has a stable snake_case label ([`ErrorKind::as_str`]); new kinds may be added.
///
/// ```
/// use leasehold_core::{Error, ErrorKind, LeaseKey};
/// let err = LeaseKey::new("").unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidInput);
/// assert_eq!(err.kind().as_str(), "invalid_input");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input, rejected before anything was sent ([`Error::InvalidKey`],
    /// [`Error::InvalidOwner`], [`Error::InvalidTtl`], [`Error::InvalidToken`],
    /// [`Error::InvalidInput`]). Label `invalid_input`.
    InvalidInput,
    /// An unusable configuration ([`Error::Config`]). Label `config`.
    Config,
    /// The store could not be reached or dropped the connection ([`Error::Unavailable`]).
    /// Label `unavailable`.
    Unavailable,
    /// The store did not answer in time ([`Error::Timeout`]). Label `timeout`.
    Timeout,
    /// The store answered with something the protocol does not allow ([`Error::Backend`]).
    /// Label `backend`.
    Backend,
}

impl ErrorKind {
    /// The stable snake_case label: `invalid_input`, `config`, `unavailable`, `timeout`,
    /// `backend`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Config => "config",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Backend => "backend",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Error {
    /// The class of this error (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidKey { .. }
            | Error::InvalidOwner { .. }
            | Error::InvalidTtl { .. }
            | Error::InvalidToken { .. }
            | Error::InvalidInput(_) => ErrorKind::InvalidInput,
            Error::Config { .. } => ErrorKind::Config,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Backend { .. } => ErrorKind::Backend,
        }
    }

    /// Whether retrying the same call later may succeed (`Unavailable`, `Timeout`).
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Unavailable | ErrorKind::Timeout)
    }

    /// Whether the store **may** have applied the failed operation, so that its outcome is
    /// unknown and a caller must find out (inspect, renew, or adopt) before assuming either way.
    ///
    /// True for [`Error::Timeout`] and for [`Error::Unavailable`] built with
    /// [`Error::unavailable`] (the connection may have dropped after the request was sent).
    /// False for every other error: input and configuration errors are raised before anything
    /// is sent, an [`Error::Backend`] is an answer that refused the operation, and an
    /// [`Error::Unavailable`] built with [`Error::refused`] states that nothing was sent or
    /// applied. So `false` means *certainly not applied*; `true` means *perhaps applied*.
    ///
    /// ```
    /// use leasehold_core::Error;
    /// assert!(Error::unavailable("redis", "connection reset", None).outcome_unknown());
    /// assert!(!Error::refused("redis", "connection refused", None).outcome_unknown());
    /// assert!(!Error::store_fault("redis", "NOSCRIPT", None).outcome_unknown());
    /// ```
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Unavailable { maybe_applied, .. } => *maybe_applied,
            _ => false,
        }
    }

    /// Whether this is an input-validation error (nothing was sent to the store).
    pub fn is_invalid_input(&self) -> bool {
        self.kind() == ErrorKind::InvalidInput
    }

    /// An [`Error::Unavailable`] whose request **may** have reached the store: the connection
    /// dropped or reset mid-call, the server answered "try again later" to a request it may
    /// have started. [`Error::outcome_unknown`] is true. When nothing can have been applied,
    /// use [`Error::refused`].
    pub fn unavailable(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<Option<BoxError>>,
    ) -> Self {
        Error::Unavailable {
            backend,
            message: message.into(),
            source: source.into(),
            maybe_applied: true,
        }
    }

    /// An [`Error::Unavailable`] for a request that was **certainly not applied**: the connection
    /// was refused, no pooled connection was free, the store answered "busy" before starting.
    /// Retryable, and [`Error::outcome_unknown`] is false.
    pub fn refused(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<Option<BoxError>>,
    ) -> Self {
        Error::Unavailable {
            backend,
            message: message.into(),
            source: source.into(),
            maybe_applied: false,
        }
    }

    /// An [`Error::Backend`]: the store answered with something the protocol does not allow (a
    /// corrupt record, a script error, a permission problem, an unexpected status). Retrying
    /// will not help. For a record that does not decode, prefer
    /// [`backend::corrupt`](crate::backend::corrupt), which names the key.
    pub fn store_fault(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<Option<BoxError>>,
    ) -> Self {
        Error::Backend {
            backend,
            message: message.into(),
            source: source.into(),
        }
    }

    /// Shorthand for [`Error::Config`].
    pub fn config(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<Option<BoxError>>,
    ) -> Self {
        Error::Config {
            backend,
            message: message.into(),
            source: source.into(),
        }
    }
}

/// `Result` with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn one_of_each() -> Vec<(Error, ErrorKind)> {
        vec![
            (
                Error::InvalidKey {
                    key: String::new(),
                    reason: "r",
                },
                ErrorKind::InvalidInput,
            ),
            (
                Error::InvalidOwner {
                    owner: String::new(),
                    reason: "r",
                },
                ErrorKind::InvalidInput,
            ),
            (
                Error::InvalidTtl {
                    ttl: Duration::ZERO,
                    reason: "r".into(),
                },
                ErrorKind::InvalidInput,
            ),
            (
                Error::InvalidToken { reason: "r".into() },
                ErrorKind::InvalidInput,
            ),
            (Error::InvalidInput("x".into()), ErrorKind::InvalidInput),
            (Error::config("b", "m", None), ErrorKind::Config),
            (Error::unavailable("b", "m", None), ErrorKind::Unavailable),
            (Error::refused("b", "m", None), ErrorKind::Unavailable),
            (
                Error::Timeout {
                    backend: "b",
                    operation: "acquire",
                    after: Duration::from_secs(1),
                },
                ErrorKind::Timeout,
            ),
            (Error::store_fault("b", "m", None), ErrorKind::Backend),
        ]
    }

    #[test]
    fn every_error_has_its_kind_and_stable_label() {
        for (e, kind) in one_of_each() {
            assert_eq!(e.kind(), kind, "{e}");
            assert_eq!(e.is_invalid_input(), kind == ErrorKind::InvalidInput, "{e}");
        }
        let labels: Vec<&str> = [
            ErrorKind::InvalidInput,
            ErrorKind::Config,
            ErrorKind::Unavailable,
            ErrorKind::Timeout,
            ErrorKind::Backend,
        ]
        .iter()
        .map(|k| k.as_str())
        .collect();
        assert_eq!(
            labels,
            [
                "invalid_input",
                "config",
                "unavailable",
                "timeout",
                "backend"
            ]
        );
        assert_eq!(ErrorKind::Timeout.to_string(), "timeout");
    }

    #[test]
    fn outcome_unknown_only_where_the_store_may_have_applied_it() {
        let unknown: Vec<String> = one_of_each()
            .into_iter()
            .filter(|(e, _)| e.outcome_unknown())
            .map(|(e, _)| e.to_string())
            .collect();
        assert_eq!(
            unknown,
            ["b unavailable: m", "b did not answer acquire within 1s"]
        );
        assert!(Error::refused("b", "m", None).is_retryable());
        assert!(!Error::store_fault("b", "m", None).is_retryable());
    }
}
