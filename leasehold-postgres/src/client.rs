//! The shared internals of a store (pool, options, statements) and the bounded-call helpers
//! that the store, the fenced resources and the advisory locks use.

use std::future::Future;
use std::time::Duration;

use leasehold_core::Result;
use sqlx::postgres::{PgConnection, PgPool};

use crate::config::{PostgresOptions, TxTimeouts};
use crate::error::{self, ErrCtx, PgError};
use crate::protocol::{self, Statements};

/// What every handle of one store shares.
#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) pool: PgPool,
    pub(crate) options: PostgresOptions,
    pub(crate) sql: Statements,
}

impl Client {
    pub(crate) fn new(pool: PgPool, options: PostgresOptions) -> Self {
        let sql = Statements::new(options.table(), options.layout());
        Client { pool, options, sql }
    }

    /// The error context of a lease operation.
    pub(crate) fn cx(&self) -> ErrCtx<'_> {
        ErrCtx {
            table: self.options.table(),
            timeout: self.options.op_timeout(),
            lock_timeout: self.options.tx_timeouts().lock_timeout,
        }
    }

    /// The error context of a transaction bounded by [`TxTimeouts`].
    pub(crate) fn tx_cx(&self) -> ErrCtx<'_> {
        tx_ctx(&self.options)
    }

    /// Runs `statement` on a pooled connection within the operation timeout and maps its failure
    /// as `operation`'s: the one shell of every single-round-trip lease call. The connection is
    /// held in a [`Guarded`](crate::conn::Guarded), so one abandoned by the timeout (or by a
    /// dropped future) is closed, not returned to the pool with an answer still on the wire.
    pub(crate) async fn query<T>(
        &self,
        operation: &'static str,
        statement: impl AsyncFnOnce(&mut PgConnection) -> std::result::Result<T, sqlx::Error>,
    ) -> Result<T> {
        self.bounded(operation, async {
            let mut conn = crate::conn::Guarded::acquire(&self.pool).await?;
            let r = statement(conn.get()).await;
            conn.finish();
            Ok(r?)
        })
        .await
        .map_err(|e| e.into_error(operation, self.cx()))
    }

    /// Runs `fut` within the operation timeout.
    pub(crate) async fn bounded<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = std::result::Result<T, PgError>>,
    ) -> std::result::Result<T, PgError> {
        let after = self.options.op_timeout();
        match tokio::time::timeout(after, fut).await {
            Ok(r) => r,
            Err(_) => Err(PgError::TimedOut(operation, after)),
        }
    }
}

/// The error context of a transaction bounded by `options`' [`TxTimeouts`].
pub(crate) fn tx_ctx(options: &PostgresOptions) -> ErrCtx<'_> {
    let t = options.tx_timeouts();
    ErrCtx {
        table: options.table(),
        timeout: t.statement_timeout,
        lock_timeout: t.lock_timeout,
    }
}

/// Applies `timeouts` with `SET LOCAL` semantics (`set_config(.., true)`) to the open transaction.
pub(crate) async fn set_local_timeouts(
    conn: &mut PgConnection,
    timeouts: TxTimeouts,
) -> std::result::Result<(), sqlx::Error> {
    let [(n1, v1), (n2, v2), (n3, v3)] = timeouts.settings();
    sqlx::query(protocol::SET_LOCAL_TIMEOUTS)
        .bind(n1)
        .bind(v1)
        .bind(n2)
        .bind(v2)
        .bind(n3)
        .bind(v3)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Runs `fut` within the client-side `deadline`: past it, a retryable
/// [`Error::Timeout`](leasehold_core::Error::Timeout). `fut` should hold its connection in a
/// [`Guarded`](crate::conn::Guarded), so that a connection abandoned by the deadline is **closed**,
/// not returned to the pool (its answer may still be on the wire, or never come: a black-holed
/// connection).
pub(crate) async fn within<T>(
    deadline: Duration,
    operation: &'static str,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(deadline, fut)
        .await
        .map_err(|_| error::timeout(operation, deadline))?
}
