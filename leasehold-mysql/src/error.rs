//! The private failure type of this backend and its mapping into the core [`Error`], by the
//! server's error number, never by message text.

use std::fmt;
use std::time::Duration;

use leasehold_core::Error;
use sqlx::mysql::MySqlDatabaseError;

/// The backend name used in errors, logs and metrics.
pub(crate) const BACKEND: &str = "mysql";

/// A failed call, before it is mapped into the core [`Error`].
#[derive(Debug)]
pub(crate) enum MyError {
    /// Taking a connection failed (pool timeout, connect refused): nothing was sent.
    Unsent(sqlx::Error),
    /// A driver error once the connection was taken: the statement may have run.
    Sql(sqlx::Error),
    /// The client-side bound of the operation passed; its outcome is unknown.
    TimedOut(&'static str, Duration),
}

impl From<sqlx::Error> for MyError {
    fn from(e: sqlx::Error) -> Self {
        MyError::Sql(e)
    }
}

impl MyError {
    /// The core error of `operation` (a timeout names the operation it was raised for).
    pub(crate) fn into_error(self, operation: &'static str, cx: ErrCtx<'_>) -> Error {
        match self {
            MyError::Unsent(e) => map_unsent(operation, e, cx),
            MyError::Sql(e) => map(operation, e, cx),
            MyError::TimedOut(op, after) => timeout(op, after),
        }
    }

    /// Whether the server rolled the transaction back for a conflict that a retry resolves:
    /// a deadlock (1213), a lock wait timeout (1205), or a duplicate key from a row inserted
    /// concurrently (1062, the insert of a key that had no row).
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, MyError::Sql(e) if matches!(number(e), Some(1213 | 1205 | 1062)))
    }
}

/// What the mapping needs besides the operation and the error: the settings the message names.
#[derive(Clone, Copy)]
pub(crate) struct ErrCtx<'a> {
    /// The lease table, named when it is missing.
    pub(crate) table: &'a (dyn fmt::Display + Sync),
    /// The bound reported when the server gives up waiting for a lock.
    pub(crate) timeout: Duration,
}

/// The error classes this crate tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// 1146 (no such table), 1054 (unknown column), 1360 (no such trigger): not migrated.
    MissingSchema,
    /// 1049 (unknown database), 1044/1045 (access denied), 1142/1143 (table or column access
    /// denied), 1227 (privilege needed), 1251 (auth plugin): the deployment is wrong.
    BadDeployment,
    /// 1205 (lock wait timeout), 1969 (MariaDB max_statement_time), 3024 (MySQL
    /// max_execution_time), 1317 (query interrupted): the server gave up waiting.
    Cancelled,
    /// 1213 (deadlock), 1040 (too many connections), 1053 (server shutdown), 1927 (MariaDB
    /// connection killed), 2006/2013 (server gone), 1290/1836 (read-only: a demoted primary
    /// during a failover), 1152/1158..1161 (network errors), 1047 (unknown command: a node
    /// that is not ready), 1180/1181 (commit/rollback failed): retrying may succeed.
    Transient,
    /// Everything else.
    Other,
}

fn classify(n: u16) -> Class {
    match n {
        1146 | 1054 | 1360 => Class::MissingSchema,
        1049 | 1044 | 1045 | 1142 | 1143 | 1227 | 1251 | 1698 => Class::BadDeployment,
        1205 | 1969 | 3024 | 1317 => Class::Cancelled,
        1213
        | 1040
        | 1053
        | 1927
        | 2006
        | 2013
        | 1290
        | 1836
        | 1152
        | 1158..=1161
        | 1047
        | 1180
        | 1181 => Class::Transient,
        _ => Class::Other,
    }
}

/// The server's error number of `e`, if it is a database error.
pub(crate) fn number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// Maps a driver error of `op`, a call that may have reached the server, into the core error.
pub(crate) fn map(op: &'static str, e: sqlx::Error, cx: ErrCtx<'_>) -> Error {
    if let sqlx::Error::Database(db) = &e {
        let n = number(&e).unwrap_or(0);
        let said = db.message().to_string();
        return match classify(n) {
            Class::MissingSchema => Error::config(
                BACKEND,
                format!(
                    "{op}: the lease schema for {} is missing or incomplete (error {n}: {said}); \
                     run MysqlLeaseStore::migrate() or sql/0001_leases.sql",
                    cx.table
                ),
                Some(Box::new(e) as _),
            ),
            Class::BadDeployment => Error::config(
                BACKEND,
                format!("{op}: the server refused the connection settings: {said} (error {n})"),
                Some(Box::new(e) as _),
            ),
            Class::Cancelled => Error::Timeout {
                backend: BACKEND,
                operation: op,
                after: cx.timeout,
            },
            Class::Transient => Error::unavailable(
                BACKEND,
                format!("{op}: connection lost, conflict or server busy: {said} (error {n})"),
                Some(Box::new(e) as _),
            ),
            Class::Other => Error::store_fault(
                BACKEND,
                format!("{op}: the server reported an error: {said} (error {n})"),
                Some(Box::new(e) as _),
            ),
        };
    }
    match &e {
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => Error::config(
            BACKEND,
            format!("{op}: invalid connection settings: {e}"),
            Some(Box::new(e) as _),
        ),
        // A certificate that does not verify, or a TLS setting the server refuses: retrying
        // cannot fix it. rustls reports a refused certificate as InvalidData.
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
        sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed | sqlx::Error::Protocol(_) => {
            Error::unavailable(
                BACKEND,
                format!("{op}: cannot reach the server: {e}"),
                Some(Box::new(e) as _),
            )
        }
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
    fn error_numbers_are_classified() {
        assert_eq!(classify(1146), Class::MissingSchema);
        assert_eq!(classify(1045), Class::BadDeployment);
        assert_eq!(classify(1049), Class::BadDeployment);
        assert_eq!(classify(1205), Class::Cancelled);
        assert_eq!(classify(1213), Class::Transient);
        assert_eq!(classify(1290), Class::Transient);
        assert_eq!(classify(2013), Class::Transient);
        assert_eq!(classify(1062), Class::Other);
    }

    #[test]
    fn pool_timeout_is_retryable_and_unapplied_and_configuration_is_not() {
        let op = "acquire";
        let cx = ErrCtx {
            table: &"`leases`",
            timeout: Duration::from_secs(1),
        };
        let pool = map(op, sqlx::Error::PoolTimedOut, cx);
        assert!(pool.is_retryable() && !pool.outcome_unknown(), "{pool:?}");
        let io = || sqlx::Error::Io(std::io::Error::other("reset"));
        assert!(map(op, io(), cx).outcome_unknown());
        assert!(!map_unsent(op, io(), cx).outcome_unknown());
        let cfg = map(op, sqlx::Error::Configuration("bad".into()), cx);
        assert!(matches!(cfg, Error::Config { .. }) && !cfg.is_retryable());
    }
}
