//! The migration: schema names that look like the table name, and upgrading a schema installed
//! by an earlier version.

use std::time::Duration;

use lease_core::{AcquireRequest, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome};
use lease_postgres::{PostgresLeaseStore, PostgresOptions, TableName};
use lease_testkit::{CaseResult, Ctx};
use sqlx::AssertSqlSafe;

use super::url;

/// Drops a test schema and everything in it.
async fn drop_schema(store: &PostgresLeaseStore, schema: &str) -> CaseResult {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(store.pool())
    .await?;
    Ok(())
}

/// Issue 18, item 14: a schema whose name starts with `leases` (`leases_app_N.jobs`) must get
/// exactly the objects it names. Text replacement of `"leases` in the shipped file used to
/// rewrite the schema name too (`"leases_app_N"` became `"jobs_app_N"`).
pub(crate) async fn migrate_handles_a_schema_named_like_the_table(_ctx: Ctx) -> CaseResult {
    let schema = format!("leases_app_{}", fastrand::u32(..));
    let table = TableName::parse(&format!("{schema}.jobs"))?;
    let ddl = PostgresLeaseStore::migration_sql(&table);
    for name in [
        format!("\"{schema}\".\"jobs\""),
        format!("\"{schema}\".\"jobs_token_seq\""),
        format!("\"{schema}\".\"jobs_fence\""),
    ] {
        if !ddl.contains(&name) {
            return Err(format!("{name} missing from the DDL:\n{ddl}").into());
        }
    }
    let store = PostgresLeaseStore::connect_lazy(
        &url(),
        PostgresOptions::new(table.clone()).with_max_connections(1),
    )?;
    let result = async {
        store.migrate().await?;
        store.verify_schema().await?;
        let lease = store
            .acquire(&AcquireRequest::new(
                LeaseKey::new("probe")?,
                OwnerId::random(),
                Duration::from_secs(5),
            ))
            .await?
            .lease()
            .ok_or("fresh table refused")?;
        assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
        // Exactly the named objects exist, in the named schema, and no stray schema appeared.
        let stray: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1 AND nspname <> $2",
        )
        .bind(format!("{schema}%"))
        .bind(&schema)
        .fetch_one(store.pool())
        .await?;
        assert_eq!(stray, 0, "migrate created a schema it was not asked for");
        CaseResult::Ok(())
    }
    .await;
    drop_schema(&store, &schema).await?;
    result
}
