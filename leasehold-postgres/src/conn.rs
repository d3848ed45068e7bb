//! A pooled connection that is **closed, not returned to the pool**, if the operation using it is
//! cancelled mid-flight (a timeout, a dropped future).
//!
//! A statement whose future is dropped after it was sent leaves its response on the wire. Handing
//! that connection to the next borrower risks it reading the old response as its own: the fault
//! suite caught exactly that (an acquire whose answer belonged to an earlier, timed-out acquire
//! of the same owner, so the holder computed its deadline from the wrong send time). Closing the
//! connection on cancellation removes the whole class of problem at the cost of one reconnect.

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool, Postgres};

use crate::error::PgError;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Guarded {
    conn: PoolConnection<Postgres>,
    finished: bool,
}

impl Guarded {
    /// Takes a connection from the pool. A failure is [`PgError::Unsent`]: nothing was sent.
    pub(crate) async fn acquire(pool: &PgPool) -> Result<Self, PgError> {
        Ok(Guarded {
            conn: pool.acquire().await.map_err(PgError::Unsent)?,
            finished: false,
        })
    }

    /// The connection.
    pub(crate) fn get(&mut self) -> &mut PgConnection {
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
