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
/// use lease_core::{Error, LeaseKey};
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
    /// The store could not be reached or dropped the connection. Retryable.
    #[error("{backend} unavailable: {message}")]
    Unavailable {
        /// The backend name.
        backend: &'static str,
        /// What happened.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
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

impl Error {
    /// Whether retrying the same call later may succeed (`Unavailable`, `Timeout`).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Timeout { .. })
    }

    /// Whether the outcome of the failed call is unknown: it may have been applied by the store.
    /// True for timeouts and dropped connections.
    pub fn outcome_unknown(&self) -> bool {
        self.is_retryable()
    }

    /// Whether this is an input-validation error (nothing was sent to the store).
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidKey { .. }
                | Error::InvalidOwner { .. }
                | Error::InvalidTtl { .. }
                | Error::InvalidToken { .. }
                | Error::InvalidInput(_)
        )
    }

    /// Shorthand for [`Error::Unavailable`].
    pub fn unavailable(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<Option<BoxError>>,
    ) -> Self {
        Error::Unavailable {
            backend,
            message: message.into(),
            source: source.into(),
        }
    }

    /// Shorthand for [`Error::Backend`].
    pub fn backend(
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
