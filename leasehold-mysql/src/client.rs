//! The shared internals of a store (pool, options, statements), the bounded-call helpers
//! ([`Client::query`], [`Client::query_retrying`]) that the store and the schema checks use, and
//! the pooled connection that is closed rather than reused when its operation is cancelled.

use std::future::Future;
use std::time::Duration;

use leasehold_core::Result;
use sqlx::mysql::{MySql, MySqlConnection, MySqlPool};
use sqlx::pool::PoolConnection;

use crate::config::MysqlOptions;
use crate::error::{self, ErrCtx, MyError};
use crate::protocol::Statements;

/// What every handle of one store shares.
#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) pool: MySqlPool,
    pub(crate) options: MysqlOptions,
    pub(crate) sql: Statements,
}

impl Client {
    pub(crate) fn new(pool: MySqlPool, options: MysqlOptions) -> Self {
        let sql = Statements::new(options.table());
        Client { pool, options, sql }
    }

    /// The error context of a lease operation.
    pub(crate) fn cx(&self) -> ErrCtx<'_> {
        ErrCtx {
            table: self.options.table(),
            timeout: self.options.op_timeout(),
        }
    }

    /// Runs `statement` on a pooled connection within the operation timeout and maps its failure
    /// as `operation`'s: the shell of the calls that are not retried (inspection, schema checks,
    /// tooling). The connection is held in a [`Guarded`], so one abandoned by the timeout (or by
    /// a dropped future) is closed, not returned to the pool with an answer still on the wire.
    pub(crate) async fn query<T>(
        &self,
        operation: &'static str,
        statement: impl AsyncFnOnce(&mut MySqlConnection) -> std::result::Result<T, sqlx::Error>,
    ) -> Result<T> {
        self.bounded(operation, async {
            let mut conn = Guarded::acquire(&self.pool).await?;
            let r = statement(conn.get()).await;
            conn.finish();
            Ok(r?)
        })
        .await
        .map_err(|e| e.into_error(operation, self.cx()))
    }

    /// As [`query`](Self::query), and a conflict the server rolled back
    /// ([`MyError::is_conflict`]: deadlock, lock wait timeout, duplicate key) runs `statement`
    /// again on a fresh pooled connection after a [`Backoff`] pause, within the same operation
    /// timeout: the shell of every lease call (acquire, renew, release, a batch's chunk). Each
    /// attempt calls a clone of `statement` (a closure over references: an `AsyncFnMut` called
    /// in the loop would make the store's futures fail the `Send` bound `async_trait` needs).
    pub(crate) async fn query_retrying<T>(
        &self,
        operation: &'static str,
        statement: impl AsyncFnOnce(&mut MySqlConnection) -> std::result::Result<T, sqlx::Error> + Clone,
    ) -> Result<T> {
        self.bounded(operation, async {
            let mut backoff = Backoff::new();
            loop {
                let mut conn = Guarded::acquire(&self.pool).await?;
                let r = statement.clone()(conn.get()).await.map_err(MyError::from);
                conn.finish();
                if let Some(r) = backoff.retry(operation, r).await {
                    return r;
                }
            }
        })
        .await
        .map_err(|e| e.into_error(operation, self.cx()))
    }

    /// Runs `fut` within the operation timeout.
    pub(crate) async fn bounded<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = std::result::Result<T, MyError>>,
    ) -> std::result::Result<T, MyError> {
        let after = self.options.op_timeout();
        match tokio::time::timeout(after, fut).await {
            Ok(r) => r,
            Err(_) => Err(MyError::TimedOut(operation, after)),
        }
    }
}

/// The pause before retrying a transaction the server rolled back for a conflict
/// ([`MyError::is_conflict`]): 1 ms, doubling up to 50 ms. The retries stay within the
/// operation's own bound.
#[derive(Debug)]
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff(Duration::from_millis(1))
    }

    /// Waits before the next attempt if `r` is a conflict (and gives `None`); otherwise hands
    /// `r` back.
    pub(crate) async fn retry<T>(
        &mut self,
        operation: &'static str,
        r: std::result::Result<T, MyError>,
    ) -> Option<std::result::Result<T, MyError>> {
        match r {
            Err(e) if e.is_conflict() => {
                tracing::debug!(
                    backend = error::BACKEND,
                    operation,
                    "conflict, retrying: {e:?}"
                );
                tokio::time::sleep(self.0).await;
                self.0 = (self.0 * 2).min(Duration::from_millis(50));
                None
            }
            other => Some(other),
        }
    }
}

/// Runs `fut` within the client-side `deadline`: past it, a retryable
/// [`Error::Timeout`](leasehold_core::Error::Timeout).
pub(crate) async fn within<T>(
    deadline: Duration,
    operation: &'static str,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(deadline, fut)
        .await
        .map_err(|_| error::timeout(operation, deadline))?
}

/// A pooled connection that is **closed, not returned to the pool**, if the operation using it
/// is cancelled mid-flight (a timeout, a dropped future): a statement whose future is dropped
/// after it was sent leaves its response on the wire, and the next borrower would read it as its
/// own. Closing also ends the session's transaction and its `GET_LOCK` locks on the server.
#[derive(Debug)]
pub(crate) struct Guarded {
    conn: PoolConnection<MySql>,
    finished: bool,
}

impl Guarded {
    /// Takes a connection from the pool. A failure is [`MyError::Unsent`]: nothing was sent.
    pub(crate) async fn acquire(pool: &MySqlPool) -> std::result::Result<Self, MyError> {
        Ok(Guarded {
            conn: pool.acquire().await.map_err(MyError::Unsent)?,
            finished: false,
        })
    }

    /// The connection.
    pub(crate) fn get(&mut self) -> &mut MySqlConnection {
        &mut self.conn
    }

    /// The operation completed (with a result or an error): the connection may go back to the
    /// pool.
    pub(crate) fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if !self.finished {
            self.conn.close_on_drop();
        }
    }
}
