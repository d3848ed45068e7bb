//! The private failure type of this backend and its mapping into the core [`Error`], by kind and
//! SQLSTATE, never by message text.

use std::fmt;
use std::time::Duration;

use leasehold_core::Error;

/// The backend name used in errors, logs and metrics.
pub(crate) const BACKEND: &str = "postgres";

/// A failed call, before it is mapped into the core [`Error`].
#[derive(Debug)]
pub(crate) enum PgError {
    /// Taking a connection failed (pool timeout, connect refused): nothing was sent.
    Unsent(sqlx::Error),
    /// A driver error once the connection was taken: the statement may have run.
    Sql(sqlx::Error),
    /// The client-side bound of the operation passed; its outcome is unknown.
    TimedOut(&'static str, Duration),
}

impl From<sqlx::Error> for PgError {
    fn from(e: sqlx::Error) -> Self {
        PgError::Sql(e)
    }
}

impl PgError {
    /// The core error of `operation` (a timeout names the operation it was raised for).
    pub(crate) fn into_error(self, operation: &'static str, cx: ErrCtx<'_>) -> Error {
        match self {
            PgError::Unsent(e) => map_unsent(operation, e, cx),
            PgError::Sql(e) => map(operation, e, cx),
            PgError::TimedOut(op, after) => timeout(op, after),
        }
    }
}

/// What the mapping needs besides the operation and the error: the settings the message names.
#[derive(Clone, Copy)]
pub(crate) struct ErrCtx<'a> {
    /// The lease table, named when it is missing.
    pub(crate) table: &'a (dyn fmt::Display + Sync),
    /// The statement timeout in force, reported when the server cancels a statement.
    pub(crate) timeout: Duration,
    /// The lock timeout in force, reported when a lock wait is cancelled.
    pub(crate) lock_timeout: Duration,
}

/// The SQLSTATE classes this crate tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SqlState {
    /// 42P01, 3F000, 42883, 42703: the schema was not migrated.
    MissingSchema,
    /// 3D000 (no such database), 28xxx (authentication), 42501 (permission).
    BadDeployment,
    /// 57014 (statement_timeout, cancel), 55P03 (lock_timeout), 25P03 (idle in transaction).
    Cancelled,
    /// 08xxx, 57P01..57P03, 53xxx, 40001, 40P01: connection lost, server shutting down, out of
    /// resources, or a transient conflict. Retrying may succeed.
    Transient,
    /// Everything else.
    Other,
}

fn classify(code: &str) -> SqlState {
    match code {
        "42P01" | "3F000" | "42883" | "42703" => SqlState::MissingSchema,
        "3D000" | "42501" => SqlState::BadDeployment,
        "57014" | "55P03" | "25P03" => SqlState::Cancelled,
        "57P01" | "57P02" | "57P03" | "40001" | "40P01" => SqlState::Transient,
        c if c.starts_with("28") => SqlState::BadDeployment,
        c if c.starts_with("08") || c.starts_with("53") => SqlState::Transient,
        _ => SqlState::Other,
    }
}

/// Maps a driver error of `op`, a call that may have reached the server, into the core error.
pub(crate) fn map(op: &'static str, e: sqlx::Error, cx: ErrCtx<'_>) -> Error {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let said = db.message().to_string();
            match classify(&code) {
                SqlState::MissingSchema => Error::config(
                    BACKEND,
                    format!(
                        "{op}: the lease schema for {} is missing or incomplete (SQLSTATE {code}); \
                         run PostgresLeaseStore::migrate() or sql/0001_leases.sql",
                        cx.table
                    ),
                    Some(Box::new(e) as _),
                ),
                SqlState::BadDeployment => Error::config(
                    BACKEND,
                    format!(
                        "{op}: the server refused the connection settings: {said} (SQLSTATE {code})"
                    ),
                    Some(Box::new(e) as _),
                ),
                SqlState::Cancelled => Error::Timeout {
                    backend: BACKEND,
                    operation: op,
                    after: if code == "55P03" {
                        cx.lock_timeout
                    } else {
                        cx.timeout
                    },
                },
                SqlState::Transient => Error::unavailable(
                    BACKEND,
                    format!("{op}: connection lost or server busy: {said} (SQLSTATE {code})"),
                    Some(Box::new(e) as _),
                ),
                SqlState::Other => Error::store_fault(
                    BACKEND,
                    format!("{op}: the server reported an error: {said} (SQLSTATE {code})"),
                    Some(Box::new(e) as _),
                ),
            }
        }
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => Error::config(
            BACKEND,
            format!("{op}: invalid connection settings"),
            Some(Box::new(e) as _),
        ),
        // A certificate that does not verify (unknown issuer, expired, wrong name) or a TLS
        // setting the server refuses: retrying cannot fix it, so it is a configuration error
        // that names the cause. rustls reports a refused certificate as InvalidData.
        sqlx::Error::Tls(_) => Error::config(
            BACKEND,
            format!("{op}: TLS handshake failed: {e}"),
            Some(Box::new(e) as _),
        ),
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => Error::config(
            BACKEND,
            format!("{op}: TLS handshake failed: {io}"),
            Some(Box::new(e) as _),
        ),
        sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed => Error::unavailable(
            BACKEND,
            format!("{op}: cannot reach the server"),
            Some(Box::new(e) as _),
        ),
        sqlx::Error::PoolTimedOut => Error::refused(
            BACKEND,
            format!(
                "{op}: no connection within the pool's acquire timeout \
                 (every pooled connection busy, or the server unreachable)"
            ),
            Some(Box::new(e) as _),
        ),
        _ => Error::store_fault(
            BACKEND,
            format!("{op}: unexpected driver error: {e}"),
            Some(Box::new(e) as _),
        ),
    }
}

/// Maps an error from taking a connection (nothing was sent): an unavailable server is
/// [`Error::refused`], so [`Error::outcome_unknown`] is false.
pub(crate) fn map_unsent(op: &'static str, e: sqlx::Error, cx: ErrCtx<'_>) -> Error {
    match map(op, e, cx) {
        Error::Unavailable {
            backend,
            message,
            source,
            ..
        } => Error::refused(backend, message, source),
        other => other,
    }
}

/// The error for a client-side timeout.
pub(crate) fn timeout(operation: &'static str, after: Duration) -> Error {
    Error::Timeout {
        backend: BACKEND,
        operation,
        after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_classified_by_code() {
        assert_eq!(classify("42P01"), SqlState::MissingSchema);
        assert_eq!(classify("28P01"), SqlState::BadDeployment);
        assert_eq!(classify("3D000"), SqlState::BadDeployment);
        assert_eq!(classify("57014"), SqlState::Cancelled);
        assert_eq!(classify("55P03"), SqlState::Cancelled);
        assert_eq!(classify("57P01"), SqlState::Transient);
        assert_eq!(classify("08006"), SqlState::Transient);
        assert_eq!(classify("53300"), SqlState::Transient);
        assert_eq!(classify("23505"), SqlState::Other);
    }

    #[test]
    fn pool_timeout_is_retryable_certainly_unapplied_and_configuration_is_not() {
        let op = "acquire";
        let cx = ErrCtx {
            table: &"\"public\".\"leases\"",
            timeout: Duration::from_secs(1),
            lock_timeout: Duration::from_secs(1),
        };
        let pool = map(op, sqlx::Error::PoolTimedOut, cx);
        assert!(pool.is_retryable() && !pool.outcome_unknown(), "{pool:?}");
        let io = || sqlx::Error::Io(std::io::Error::other("reset"));
        assert!(map(op, io(), cx).outcome_unknown());
        assert!(!map_unsent(op, io(), cx).outcome_unknown());
        assert!(map_unsent(op, io(), cx).is_retryable());
        let cfg = map(op, sqlx::Error::Configuration("bad".into()), cx);
        assert!(matches!(cfg, Error::Config { .. }));
        assert!(!cfg.is_retryable());
        // rustls's refusal of a certificate arrives as InvalidData: a configuration error that
        // names it, never "cannot reach the server" (retrying cannot fix a certificate).
        let cert = std::io::Error::new(std::io::ErrorKind::InvalidData, "invalid peer certificate");
        let tls = map(op, sqlx::Error::Io(cert), cx);
        assert!(
            matches!(tls, Error::Config { .. }) && !tls.is_retryable(),
            "{tls:?}"
        );
        assert!(
            tls.to_string().contains("invalid peer certificate"),
            "{tls}"
        );
    }
}
