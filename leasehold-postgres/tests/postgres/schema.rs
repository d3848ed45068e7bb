//! The migration: schema names that look like the table name, and upgrading a schema installed
//! by an earlier version.

use std::time::Duration;

use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome};
use leasehold_postgres::{PostgresLeaseStore, PostgresOptions, TableName};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case};
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

/// A schema whose name starts with `leases` (`leases_app_N.jobs`) must get
/// exactly the objects it names. Text replacement of `"leases` in the shipped file used to
/// rewrite the schema name too (`"leases_app_N"` became `"jobs_app_N"`).
pub(crate) async fn migrate_handles_a_schema_named_like_the_table(_ctx: Ctx) -> CaseResult {
    let schema = format!("leases_app_{}", fastrand::u32(..));
    let table = TableName::parse(&format!("{schema}.jobs"))?;
    let ddl =
        leasehold_postgres::protocol::migration(&table, leasehold_postgres::TableLayout::Library);
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

/// The schema version 1 installed (no clock floor, no keep triggers), as `sql/0001_leases.sql`
/// shipped it before the clock floor and the keep triggers.
const V1: &str = include_str!("schema_v1.sql");

/// The schema version 2 installed (the floor trigger on every insert and token update, no wake
/// column), as `sql/0001_leases.sql` shipped it before the floor moved off the grant path.
const V2: &str = include_str!("schema_v2.sql");

/// A grant on a schema that `migrate()` has not upgraded yet, with that schema's own trigger:
/// the library's statements need the current columns.
async fn grant_on_old_schema(
    store: &PostgresLeaseStore,
    table: &TableName,
    key: &str,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "INSERT INTO {table} (resource_key, owner, lease_until, fencing_token) \
         VALUES ($1, 'old', '-infinity', 1) RETURNING fencing_token"
    )))
    .bind(key)
    .fetch_one(store.pool())
    .await
}

/// The server's clock in microseconds since 1970 (the trigger's clock floor).
async fn server_micros(store: &PostgresLeaseStore) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
        .fetch_one(store.pool())
        .await
}

/// Writes a row with `token` bypassing every trigger (as a tool or a restore would), in the
/// caller's session only (`session_replication_role` is set for this transaction).
async fn write_bypassing_triggers(
    store: &PostgresLeaseStore,
    table: &TableName,
    key: &str,
    token: i64,
) -> CaseResult {
    let mut tx = store.pool().begin().await?;
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (resource_key, owner, lease_until, fencing_token) \
         VALUES ($1, 'tool', '-infinity', $2)"
    )))
    .bind(key)
    .bind(token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn grant(store: &PostgresLeaseStore, key: &str) -> Result<i64, leasehold_testkit::Failed> {
    let lease = store
        .acquire(&AcquireRequest::new(
            LeaseKey::new(key)?,
            OwnerId::random(),
            Duration::from_secs(5),
        ))
        .await?
        .lease()
        .ok_or("the key is held")?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    Ok(lease.token().to_i64())
}

/// `migrate()` on a schema installed by version 1 upgrades the token trigger
/// in place (clock floor, keep triggers); `verify_schema()` refuses the old schema until then.
/// The keep triggers lift the sequence over a deleted or truncated row's token, so a token that
/// is above the clock (written by a tool that bypassed the trigger) is still never undercut.
pub(crate) async fn migrate_upgrades_a_version_1_schema(_ctx: Ctx) -> CaseResult {
    upgrade("v1", V1).await
}

/// `migrate()` on a schema installed by version 2 adds the wake column and the split
/// floor triggers; `verify_schema()` refuses the version 2 schema until then; tokens still go up
/// across the upgrade and never go back after a deletion or truncation.
pub(crate) async fn migrate_upgrades_a_version_2_schema(_ctx: Ctx) -> CaseResult {
    upgrade("v2", V2).await
}

async fn upgrade(version: &str, ddl: &str) -> CaseResult {
    let schema = format!("lease_pg_{version}_{}", fastrand::u32(..));
    let table = TableName::parse(&format!("{schema}.leases"))?;
    let store = PostgresLeaseStore::connect_lazy(
        &url(),
        PostgresOptions::new(table.clone()).with_max_connections(1),
    )?;
    let result = async {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE SCHEMA \"{schema}\"; {}",
            ddl.replace("\"public\".", &format!("\"{schema}\"."))
        )))
        .execute(store.pool())
        .await?;
        let old = grant_on_old_schema(&store, &table, "k").await?;
        let refused = store.verify_schema().await;
        if !matches!(refused, Err(leasehold_core::Error::Config { .. })) {
            return Err(format!("verify_schema accepted a {version} schema: {refused:?}").into());
        }

        store.migrate().await?;
        store.verify_schema().await?;
        let clock = server_micros(&store).await?;
        let new = grant(&store, "k").await?;
        assert!(new > old, "{new} <= {old}");
        assert!(
            new >= clock,
            "the upgraded trigger does not floor by the clock: token {new}, clock {clock}"
        );

        // A row above the clock, deleted: the next token is still above it.
        let high = clock + 3_600_000_000;
        write_bypassing_triggers(&store, &table, "d", high).await?;
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE resource_key = 'd'"
        )))
        .execute(store.pool())
        .await?;
        let after_delete = grant(&store, "d").await?;
        assert!(after_delete > high, "{after_delete} <= {high} after DELETE");

        // The same through TRUNCATE.
        let higher = after_delete + 3_600_000_000;
        write_bypassing_triggers(&store, &table, "t", higher).await?;
        sqlx::query(AssertSqlSafe(format!("TRUNCATE {table}")))
            .execute(store.pool())
            .await?;
        let after_truncate = grant(&store, "t").await?;
        assert!(
            after_truncate > higher,
            "{after_truncate} <= {higher} after TRUNCATE"
        );
        CaseResult::Ok(())
    }
    .await;
    drop_schema(&store, &schema).await?;
    result
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("postgres", migrate_handles_a_schema_named_like_the_table),
        case!("postgres", migrate_upgrades_a_version_1_schema),
        case!("postgres", migrate_upgrades_a_version_2_schema),
    ]
}
