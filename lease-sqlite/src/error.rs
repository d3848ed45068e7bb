//! Mapping SQLite and sqlx failures into [`lease_core::Error`], by kind.
//!
//! SQLite reports failures as (extended) result codes; sqlx exposes them through
//! `DatabaseError::code()`. We classify by the *primary* code (the low byte):
//! - `SQLITE_BUSY` / `SQLITE_LOCKED`: another process held the write lock for the whole
//!   busy timeout -> [`Error::Timeout`] (retryable; nothing was applied);
//! - `SQLITE_CANTOPEN`, `SQLITE_READONLY`, `SQLITE_PERM`, `SQLITE_AUTH`, `SQLITE_NOTADB`, and a
//!   missing table -> [`Error::Config`] (fix the path, the permissions or the file);
//! - `SQLITE_IOERR`, `SQLITE_FULL`, `SQLITE_NOMEM`, and sqlx's I/O, pool and worker failures ->
//!   [`Error::Unavailable`] (retryable);
//! - everything else (a corrupt file, a constraint the schema does not expect, undecodable rows)
//!   -> [`Error::Backend`].

use std::time::Duration;

use lease_core::Error;

/// The backend name used in errors, logs and [`LeaseStore::backend`](lease_core::LeaseStore::backend).
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

/// Maps a sqlx error raised during `operation` into the core error.
pub(crate) fn map(operation: &'static str, busy_timeout: Duration, err: sqlx::Error) -> Error {
    let message = format!("{operation}: {err}");
    match &err {
        sqlx::Error::Database(db) => match primary_code(&err) {
            Some(SQLITE_BUSY | SQLITE_LOCKED) => Error::Timeout {
                backend: BACKEND,
                operation,
                after: busy_timeout,
            },
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
                Error::backend(BACKEND, message, Some(err.into()))
            }
        },
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => {
            Error::config(BACKEND, message, Some(err.into()))
        }
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::unavailable(BACKEND, message, Some(err.into())),
        _ => Error::backend(BACKEND, message, Some(err.into())),
    }
}

/// A row held a value the schema does not allow (a negative token, an illegal owner id).
pub(crate) fn corrupt(what: &str, err: impl std::fmt::Display) -> Error {
    Error::backend(BACKEND, format!("corrupt row: {what}: {err}"), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_database_errors_map_by_kind() {
        let t = Duration::from_secs(1);
        assert!(matches!(
            map("op", t, sqlx::Error::PoolTimedOut),
            Error::Unavailable { .. }
        ));
        assert!(matches!(
            map("op", t, sqlx::Error::PoolClosed),
            Error::Unavailable { .. }
        ));
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "gone");
        assert!(matches!(
            map("op", t, sqlx::Error::Io(io)),
            Error::Unavailable { .. }
        ));
        assert!(matches!(
            map("op", t, sqlx::Error::RowNotFound),
            Error::Backend { .. }
        ));
        assert!(matches!(
            map("op", t, sqlx::Error::Configuration("bad".into())),
            Error::Config { .. }
        ));
        assert!(primary_code(&sqlx::Error::RowNotFound).is_none());
    }
}
