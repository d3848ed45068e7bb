//! Named advisory locks: MySQL's `GET_LOCK`, held for the length of a closure.
//!
//! `GET_LOCK` locks belong to the **session** (the connection), not to a transaction, and are
//! not fenced: a connection that dies (or a server that restarts or fails over) drops the lock
//! while the closure may still be running on another path. Use them to avoid duplicate work
//! (compaction, a cron job), never to protect data; for that, hold a lease and write through a
//! fenced transaction or the fenced resource.
//!
//! The lock is taken on a pooled connection held for the closure, which runs on that same
//! connection, and released before the connection returns to the pool. If the call is dropped
//! mid-way the connection is **closed** instead, so the server drops the lock: a lock never
//! leaks into the pool.

use std::time::Duration;

use futures::future::BoxFuture;
use leasehold_core::{LeaseKey, Result};
use sha2::{Digest, Sha256};
use sqlx::AssertSqlSafe;
use sqlx::mysql::{MySqlConnection, MySqlPool};

use crate::client::Guarded;
use crate::error::{self, ErrCtx};
use crate::protocol::{ADVISORY_PREFIX, GET_LOCK, RELEASE_LOCK};

/// The lock name of `key`: [`ADVISORY_PREFIX`] and the first 48 hex digits of the SHA-256 of
/// the key (58 characters, within MySQL's 64-character limit on lock names; MariaDB's is the
/// same). Stable across versions and processes, so every client agrees on it.
///
/// ```
/// use leasehold_core::LeaseKey;
/// let name = leasehold_mysql::advisory_lock_name(&LeaseKey::new("compaction")?);
/// assert!(name.starts_with("leasehold/") && name.len() == 58);
/// # Ok::<(), leasehold_core::Error>(())
/// ```
pub fn advisory_lock_name(key: &LeaseKey) -> String {
    let digest = Sha256::digest(key.as_str().as_bytes());
    let hex: String = digest.iter().take(24).map(|b| format!("{b:02x}")).collect();
    format!("{ADVISORY_PREFIX}{hex}")
}

/// `GET_LOCK` locks over a pool (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct AdvisoryLocks {
    pool: MySqlPool,
}

impl AdvisoryLocks {
    /// Locks over `pool` (a store's [`pool`](crate::MysqlLeaseStore::pool), or your own).
    pub fn new(pool: MySqlPool) -> Self {
        AdvisoryLocks { pool }
    }

    /// Runs `f` if the lock of `key` is free right now (`GET_LOCK(name, 0)`), on the
    /// connection that holds it; `Ok(None)` if another session holds it.
    ///
    /// # Errors
    /// Driver errors, mapped; `f`'s own error (the lock is released first).
    ///
    /// # Cancellation safety
    /// Cancel safe for the lock: dropped, the connection is closed and the server drops the
    /// lock. Whatever `f` had done is not undone.
    pub async fn try_with_lock<T, F>(&self, key: &LeaseKey, f: F) -> Result<Option<T>>
    where
        T: Send,
        F: for<'c> FnOnce(
                &'c mut MySqlConnection,
            ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
            + Send,
    {
        self.run(key, Duration::ZERO, f).await
    }

    /// Runs `f` once the lock of `key` is granted, waiting at most `wait` (whole seconds,
    /// rounded up; MySQL's granularity); `Ok(None)` if the wait ran out.
    ///
    /// # Errors
    /// As [`try_with_lock`](Self::try_with_lock).
    ///
    /// # Cancellation safety
    /// As [`try_with_lock`](Self::try_with_lock).
    pub async fn with_lock<T, F>(&self, key: &LeaseKey, wait: Duration, f: F) -> Result<Option<T>>
    where
        T: Send,
        F: for<'c> FnOnce(
                &'c mut MySqlConnection,
            ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
            + Send,
    {
        self.run(key, wait, f).await
    }

    async fn run<T, F>(&self, key: &LeaseKey, wait: Duration, f: F) -> Result<Option<T>>
    where
        T: Send,
        F: for<'c> FnOnce(
                &'c mut MySqlConnection,
            ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
            + Send,
    {
        let operation = "advisory lock";
        let cx = ErrCtx {
            table: &"GET_LOCK",
            timeout: wait,
        };
        let name = advisory_lock_name(key);
        let secs = if wait.is_zero() {
            0
        } else {
            crate::config::lock_wait_secs(wait)
        };
        let mut conn = Guarded::acquire(&self.pool)
            .await
            .map_err(|e| e.into_error(operation, cx))?;
        let got: Option<i64> = sqlx::query_scalar(GET_LOCK)
            .bind(&name)
            .bind(secs)
            .fetch_one(conn.get())
            .await
            .map_err(|e| error::map(operation, e, cx))?;
        if got != Some(1) {
            conn.finish();
            return Ok(None);
        }
        let out = f(conn.get()).await;
        sqlx::query(AssertSqlSafe(RELEASE_LOCK))
            .bind(&name)
            .execute(conn.get())
            .await
            .map_err(|e| error::map(operation, e, cx))?;
        conn.finish();
        out.map(Some).map_err(|e| error::map(operation, e, cx))
    }
}
