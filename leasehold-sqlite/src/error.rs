//! This backend's failures ([`SqliteError`]) and their mapping into [`leasehold_core::Error`], by
//! kind.
//!
//! SQLite reports failures as (extended) result codes; sqlx exposes them through
//! `DatabaseError::code()`. We classify by the *primary* code (the low byte):
//! - `SQLITE_BUSY` / `SQLITE_LOCKED`: another connection held the write lock for the whole busy
//!   timeout -> [`Error::refused`] (retryable; certainly not applied: SQLite refuses the
//!   statement, or leaves a busy `COMMIT`'s transaction open, and sqlx rolls that back);
//! - `SQLITE_CANTOPEN`, `SQLITE_READONLY`, `SQLITE_PERM`, `SQLITE_AUTH`, `SQLITE_NOTADB`, and a
//!   missing table -> [`Error::Config`] (fix the path, the permissions or the file);
//! - `SQLITE_IOERR`, `SQLITE_FULL`, `SQLITE_NOMEM`, sqlx's I/O and worker failures ->
//!   [`Error::unavailable`] (retryable; perhaps applied);
//! - sqlx's pool failures (no connection was free in time, the pool is closed) ->
//!   [`Error::refused`] (nothing was sent);
//! - everything else (a corrupt file, a constraint the schema does not expect) ->
//!   [`Error::Backend`]. Rows that do not decode are [`leasehold_core::backend::corrupt`].

use std::time::Duration;

use leasehold_core::Error;

/// The backend name used in errors, logs and [`LeaseStore::backend`](leasehold_core::LeaseStore::backend).
pub(crate) const BACKEND: &str = "sqlite";

const SQLITE_ERROR: i64 = 1;
const SQLITE_PERM: i64 = 3;
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;
const SQLITE_NOMEM: i64 = 7;
const SQLITE_READONLY: i64 = 8;
const SQLITE_IOERR: i64 = 10;
const SQLITE_CORRUPT: i64 = 11;
const SQLITE_FULL: i64 = 13;
const SQLITE_CANTOPEN: i64 = 14;
const SQLITE_AUTH: i64 = 23;
const SQLITE_NOTADB: i64 = 26;

/// The primary SQLite result code of a database error, if sqlx reported one.
pub(crate) fn primary_code(err: &sqlx::Error) -> Option<i64> {
    let sqlx::Error::Database(db) = err else {
        return None;
    };
    let code: i64 = db.code()?.parse().ok()?;
    Some(code & 0xff)
}

/// Whether the error is SQLite's "database is locked" (busy or locked).
pub(crate) fn is_busy(err: &sqlx::Error) -> bool {
    matches!(primary_code(err), Some(SQLITE_BUSY | SQLITE_LOCKED))
}

/// Whether the error means the connection itself is gone (its worker thread or its I/O), so
/// that it must be reopened rather than used again.
pub(crate) fn breaks_connection(err: &sqlx::Error) -> bool {
    matches!(
        err,
        sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed | sqlx::Error::Protocol(_)
    )
}

/// What can go wrong with the SQLite file, before it becomes a [`leasehold_core::Error`].
#[derive(Debug)]
pub(crate) enum SqliteError {
    /// sqlx (or SQLite) failed `operation`; `busy_timeout` is the store's, named when the write
    /// lock stayed busy.
    Driver {
        operation: &'static str,
        busy_timeout: Duration,
        source: sqlx::Error,
    },
    /// The file was written by a newer schema version than this build understands.
    NewerSchema { found: i64 },
}

impl From<SqliteError> for Error {
    fn from(e: SqliteError) -> Error {
        match e {
            SqliteError::Driver {
                operation,
                busy_timeout,
                source,
            } => driver(operation, source, busy_timeout),
            SqliteError::NewerSchema { found } => Error::config(
                BACKEND,
                format!(
                    "the database has lease schema version {found}; this build understands up to {}",
                    crate::protocol::SCHEMA_VERSION
                ),
                None,
            ),
        }
    }
}

/// Maps a sqlx error raised during `operation` into the core error (see
/// [`SqliteError::Driver`]).
pub(crate) fn map(operation: &'static str, err: sqlx::Error, busy_timeout: Duration) -> Error {
    SqliteError::Driver {
        operation,
        busy_timeout,
        source: err,
    }
    .into()
}

fn driver(operation: &'static str, err: sqlx::Error, busy_timeout: Duration) -> Error {
    let message = format!("{operation}: {err}");
    match &err {
        sqlx::Error::Database(db) => match primary_code(&err) {
            Some(SQLITE_BUSY | SQLITE_LOCKED) => Error::refused(
                BACKEND,
                format!(
                    "{message} (another connection held the write lock for the whole busy timeout of {busy_timeout:?}; nothing was applied)"
                ),
                Some(err.into()),
            ),
            Some(SQLITE_CANTOPEN | SQLITE_READONLY | SQLITE_PERM | SQLITE_AUTH | SQLITE_NOTADB) => {
                Error::config(BACKEND, message, Some(err.into()))
            }
            // SQLITE_ERROR is generic; the only way to tell a missing table is its message.
            Some(SQLITE_ERROR) if db.message().contains("no such table") => Error::config(
                BACKEND,
                format!("{message} (the schema is missing: run migrate())"),
                Some(err.into()),
            ),
            Some(SQLITE_IOERR | SQLITE_FULL | SQLITE_NOMEM) => {
                Error::unavailable(BACKEND, message, Some(err.into()))
            }
            Some(SQLITE_CORRUPT) | Some(_) | None => {
                Error::store_fault(BACKEND, message, Some(err.into()))
            }
        },
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => {
            Error::config(BACKEND, message, Some(err.into()))
        }
        // No connection was obtained, so nothing was sent.
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            Error::refused(BACKEND, message, Some(err.into()))
        }
        sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed => {
            Error::unavailable(BACKEND, message, Some(err.into()))
        }
        _ => Error::store_fault(BACKEND, message, Some(err.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_database_errors_map_by_kind() {
        let t = Duration::from_secs(1);
        for refused in [sqlx::Error::PoolTimedOut, sqlx::Error::PoolClosed] {
            let e = map("op", refused, t);
            assert!(
                matches!(e, Error::Unavailable { .. }) && !e.outcome_unknown(),
                "{e:?}"
            );
        }
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "gone");
        let e = map("op", sqlx::Error::Io(io), t);
        assert!(
            matches!(e, Error::Unavailable { .. }) && e.outcome_unknown(),
            "{e:?}"
        );
        assert!(matches!(
            map("op", sqlx::Error::RowNotFound, t),
            Error::Backend { .. }
        ));
        assert!(matches!(
            map("op", sqlx::Error::Configuration("bad".into()), t),
            Error::Config { .. }
        ));
        assert!(primary_code(&sqlx::Error::RowNotFound).is_none());
    }

    #[test]
    fn a_newer_schema_is_a_config_error_naming_both_versions() {
        let e = Error::from(SqliteError::NewerSchema { found: 99 });
        assert!(matches!(e, Error::Config { .. }), "{e:?}");
        assert!(e.to_string().contains("99"), "{e}");
    }
}
