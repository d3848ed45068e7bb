//! Mapping sqlx errors into the core [`Error`], by kind and SQLSTATE, never by message text.

use std::time::Duration;

use lease_core::Error;

use crate::BACKEND;
use crate::config::TableName;

/// What the failing call was doing, for the error message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ErrCtx<'a> {
    /// The operation (`"acquire"`, `"fenced transaction"`, ...).
    pub(crate) operation: &'static str,
    /// The lease table, named when it is missing.
    pub(crate) table: &'a TableName,
    /// The statement timeout in force, reported when the server cancels a statement.
    pub(crate) timeout: Duration,
    /// The lock timeout in force, reported when a lock wait is cancelled.
    pub(crate) lock_timeout: Duration,
}

/// The SQLSTATE classes this crate tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SqlState {
    /// 42P01, 3F000, 42883: the schema was not migrated.
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
        "42P01" | "3F000" | "42883" => SqlState::MissingSchema,
        "3D000" | "42501" => SqlState::BadDeployment,
        "57014" | "55P03" | "25P03" => SqlState::Cancelled,
        "57P01" | "57P02" | "57P03" | "40001" | "40P01" => SqlState::Transient,
        c if c.starts_with("28") => SqlState::BadDeployment,
        c if c.starts_with("08") || c.starts_with("53") => SqlState::Transient,
        _ => SqlState::Other,
    }
}

/// Maps a sqlx error into the core error.
pub(crate) fn map(e: sqlx::Error, cx: ErrCtx<'_>) -> Error {
    let op = cx.operation;
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
                SqlState::Other => Error::backend(
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
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::WorkerCrashed => {
            Error::unavailable(
                BACKEND,
                format!("{op}: cannot reach the server"),
                Some(Box::new(e) as _),
            )
        }
        sqlx::Error::PoolTimedOut => Error::unavailable(
            BACKEND,
            format!(
                "{op}: no connection within the pool's acquire timeout \
                 (every pooled connection busy, or the server unreachable)"
            ),
            Some(Box::new(e) as _),
        ),
        _ => Error::backend(
            BACKEND,
            format!("{op}: unexpected driver error: {e}"),
            Some(Box::new(e) as _),
        ),
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

/// A row that breaks the schema's invariants (a negative token, an absurd duration).
pub(crate) fn corrupt(what: String) -> Error {
    Error::backend(BACKEND, what, None)
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
    fn pool_timeout_is_retryable_and_configuration_is_not() {
        let table = TableName::default();
        let cx = ErrCtx {
            operation: "acquire",
            table: &table,
            timeout: Duration::from_secs(1),
            lock_timeout: Duration::from_secs(1),
        };
        assert!(map(sqlx::Error::PoolTimedOut, cx).is_retryable());
        let cfg = map(sqlx::Error::Configuration("bad".into()), cx);
        assert!(matches!(cfg, Error::Config { .. }));
        assert!(!cfg.is_retryable());
    }
}
