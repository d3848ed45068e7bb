//! Creating and checking the schema.

use leasehold_core::{Error, Result};
use sqlx::{AssertSqlSafe, Row};

use crate::client::{Client, Guarded};
use crate::error::{self, BACKEND, MyError};
use crate::protocol::{self, GET_LOCK, MIGRATE_LOCK, RELEASE_LOCK, SCHEMA_VERSION};

/// Runs the migration under the `GET_LOCK` migration lock, within the operation timeout.
pub(crate) async fn migrate(c: &Client) -> Result<()> {
    let statements = protocol::migration(c.options.table());
    let wait = crate::config::lock_wait_secs(c.options.op_timeout());
    c.bounded("migrate", async {
        let mut conn = Guarded::acquire(&c.pool).await?;
        let got: Option<i64> = sqlx::query_scalar(GET_LOCK)
            .bind(MIGRATE_LOCK)
            .bind(wait)
            .fetch_one(conn.get())
            .await?;
        if got != Some(1) {
            // Dropped unfinished: the connection (and anything it holds) is closed.
            return Err(MyError::TimedOut("migrate", c.options.op_timeout()));
        }
        for stmt in &statements {
            sqlx::query(AssertSqlSafe(stmt.as_str()))
                .execute(conn.get())
                .await?;
        }
        sqlx::query(RELEASE_LOCK)
            .bind(MIGRATE_LOCK)
            .execute(conn.get())
            .await?;
        conn.finish();
        Ok(())
    })
    .await
    .map_err(|e| e.into_error("migrate", c.cx()))
}

/// Checks that the tables and triggers of this version exist.
pub(crate) async fn verify(c: &Client) -> Result<()> {
    let t = c.options.table();
    let db = t.database().map(str::to_string);
    let name = |s: &str| format!("{}{s}", t.table());
    let operation = "verify schema";
    let row = c
        .query(operation, async |conn| {
            sqlx::query(protocol::VERIFY_SCHEMA)
                .bind(&db)
                .bind(name(""))
                .bind(name("_floor"))
                .bind(name("_fence"))
                .bind(&db)
                .bind(name("_token_floor"))
                .bind(name("_token_rise"))
                .bind(name("_token_keep"))
                .bind(&db)
                .bind(name(""))
                .bind(SCHEMA_VERSION)
                .fetch_one(&mut *conn)
                .await
        })
        .await?;
    let map = |e| error::map(operation, e, c.cx());
    let tables: i64 = row.try_get(0).map_err(map)?;
    let triggers: i64 = row.try_get(1).map_err(map)?;
    let versioned: i64 = row.try_get(2).map_err(map)?;
    if tables == 3 && triggers == 3 && versioned == 1 {
        return Ok(());
    }
    Err(Error::config(
        BACKEND,
        format!(
            "the lease schema for {t} is missing or incomplete ({tables} of 3 tables, \
             {triggers} of 3 token triggers, version comment {}); run \
             MysqlLeaseStore::migrate() or sql/0001_leases.sql",
            if versioned == 1 { "present" } else { "missing" }
        ),
        None,
    ))
}
