//! Transaction-scoped advisory locks around a caller's closure.
//!
//! ## Why only transaction-scoped locks
//! A session-level advisory lock (`pg_advisory_lock`) belongs to the *connection*, not to the
//! task that took it. On a pool that goes wrong both ways: returned to the pool, the connection
//! keeps the lock (it leaks until that physical connection closes, and whichever task gets the
//! connection next silently "holds" it too, since advisory locks are re-entrant per session); and
//! if the connection drops, the lock is gone while the task still believes it holds it, with no
//! fencing token to stop its writes. `pg_advisory_xact_lock` ends with the transaction, on commit,
//! rollback or a dropped connection, so the lock's life is exactly the closure's transaction.
//! Advisory locks give mutual exclusion between transactions on one server; they carry no token.
//! For work that outlives a transaction use a lease ([`PostgresLeaseStore`](crate::PostgresLeaseStore)).

use futures::future::BoxFuture;
use leasehold_core::{LeaseKey, Result};
use sha2::{Digest, Sha256};
use sqlx::Connection;
use sqlx::postgres::{PgConnection, PgPool};

use crate::client::{set_local_timeouts, tx_ctx, within};
use crate::config::{PostgresOptions, TxTimeouts};
use crate::error::{BACKEND, ErrCtx, map};
use crate::protocol;

/// The advisory lock id of `key`: the first 8 bytes (big-endian, as a signed `i64`) of
/// `SHA-256("leasehold-postgres/advisory/v1:" + key)`.
///
/// The mapping is stable across versions, processes and languages (any SHA-256 gives the same id),
/// so other services can take the same lock. Two keys may share an id (probability about
/// n²/2⁶⁵ for n keys); that only makes them wait for each other, never lets two holders in.
///
/// ```
/// use leasehold_core::LeaseKey;
/// use leasehold_postgres::advisory_lock_id;
/// let id = advisory_lock_id(&LeaseKey::new("nightly-report")?);
/// assert_eq!(id, advisory_lock_id(&LeaseKey::new("nightly-report")?));
/// assert_ne!(id, advisory_lock_id(&LeaseKey::new("nightly-report-2")?));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
pub fn advisory_lock_id(key: &LeaseKey) -> i64 {
    let mut h = Sha256::new();
    h.update(protocol::ADVISORY_ID_PREFIX);
    h.update(key.as_str().as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// Transaction-scoped advisory locks (`pg_advisory_xact_lock`, `pg_try_advisory_xact_lock`)
/// around a closure.
///
/// ```no_run
/// use leasehold_core::LeaseKey;
/// use leasehold_postgres::{AdvisoryLocks, PostgresLeaseStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = PostgresLeaseStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// let locks = AdvisoryLocks::new(store.pool().clone());
/// let key = LeaseKey::new("rebuild-index")?;
/// let n: i64 = locks
///     .with_lock(&key, |conn| {
///         Box::pin(async move { sqlx::query_scalar("SELECT 1::bigint").fetch_one(&mut *conn).await })
///     })
///     .await?;
/// assert_eq!(n, 1);
/// match locks.try_with_lock(&key, |_conn| Box::pin(async { Ok(()) })).await? {
///     Some(()) => println!("ran under the lock"),
///     None => println!("someone else holds it"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AdvisoryLocks {
    pool: PgPool,
    options: PostgresOptions,
}

impl AdvisoryLocks {
    /// Locks on `pool`, bounded by [`TxTimeouts::default`].
    pub fn new(pool: PgPool) -> Self {
        AdvisoryLocks {
            pool,
            options: PostgresOptions::default(),
        }
    }

    /// Sets the bounds: `lock_timeout` bounds the wait of [`with_lock`](Self::with_lock) on the
    /// server; [`TxTimeouts::deadline`] bounds each whole call on the client.
    pub fn with_timeouts(mut self, timeouts: TxTimeouts) -> Self {
        self.options = self.options.with_tx_timeouts(timeouts);
        self
    }

    /// Waits (at most `lock_timeout`) for the key's lock, runs `f` in the same transaction, and
    /// commits; the lock is released with the transaction. The whole call is bounded on the
    /// client by [`TxTimeouts::deadline`] (default 10 s): a connection that stops answering gives
    /// a retryable timeout and is closed (the server then ends the transaction and its lock when
    /// it notices, at the latest after `idle_timeout`).
    ///
    /// # Errors
    /// [`Error::Timeout`](leasehold_core::Error::Timeout) if the lock was not granted in time or the
    /// call ran past the deadline (if `COMMIT` had been sent, its outcome is unknown); driver
    /// errors (including `f`'s), mapped; on any error the transaction is rolled back.
    ///
    /// # Cancellation safety
    /// Not cancel safe: dropped before `COMMIT`, the transaction rolls back and the lock is
    /// released; dropped during `COMMIT`, the outcome is unknown.
    pub async fn with_lock<T, F>(&self, key: &LeaseKey, f: F) -> Result<T>
    where
        T: Send,
        F: for<'c> FnOnce(
                &'c mut PgConnection,
            ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
            + Send,
    {
        self.run(key, false, f).await?.ok_or_else(|| {
            leasehold_core::Error::store_fault(BACKEND, "advisory lock not granted", None)
        })
    }

    /// Like [`with_lock`](Self::with_lock) but does not wait: `Ok(None)` (and `f` is not run)
    /// when another transaction holds the lock.
    ///
    /// # Errors
    /// As [`with_lock`](Self::with_lock).
    ///
    /// # Cancellation safety
    /// As [`with_lock`](Self::with_lock).
    pub async fn try_with_lock<T, F>(&self, key: &LeaseKey, f: F) -> Result<Option<T>>
    where
        T: Send,
        F: for<'c> FnOnce(
                &'c mut PgConnection,
            ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
            + Send,
    {
        self.run(key, true, f).await
    }

    async fn run<T, F>(&self, key: &LeaseKey, try_only: bool, f: F) -> Result<Option<T>>
    where
        T: Send,
        F: for<'c> FnOnce(
                &'c mut PgConnection,
            ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
            + Send,
    {
        let operation = "advisory lock";
        let cx = tx_ctx(&self.options);
        within(self.options.tx_timeouts().deadline, operation, async {
            let mut conn = crate::conn::Guarded::acquire(&self.pool)
                .await
                .map_err(|e| e.into_error(operation, cx))?;
            let out = self
                .run_on(conn.get(), operation, cx, key, try_only, f)
                .await;
            conn.finish();
            out
        })
        .await
    }

    async fn run_on<T, F>(
        &self,
        conn: &mut PgConnection,
        operation: &'static str,
        cx: ErrCtx<'_>,
        key: &LeaseKey,
        try_only: bool,
        f: F,
    ) -> Result<Option<T>>
    where
        T: Send,
        F: for<'c> FnOnce(
                &'c mut PgConnection,
            ) -> BoxFuture<'c, std::result::Result<T, sqlx::Error>>
            + Send,
    {
        let map = |e| map(operation, e, cx);
        let id = advisory_lock_id(key);
        let mut tx = conn.begin().await.map_err(map)?;
        set_local_timeouts(&mut tx, self.options.tx_timeouts())
            .await
            .map_err(map)?;
        let granted: bool = if try_only {
            sqlx::query_scalar(protocol::ADVISORY_TRY_LOCK)
                .bind(id)
                .fetch_one(&mut *tx)
                .await
                .map_err(map)?
        } else {
            sqlx::query(protocol::ADVISORY_LOCK)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            true
        };
        if !granted {
            let _ = tx.rollback().await;
            return Ok(None);
        }
        tracing::trace!(backend = BACKEND, key = %key, lock_id = id, "advisory lock taken");
        let value = match f(&mut tx).await {
            Ok(v) => v,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(map(e));
            }
        };
        tx.commit().await.map_err(map)?;
        Ok(Some(value))
    }
}
