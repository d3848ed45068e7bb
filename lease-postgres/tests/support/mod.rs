//! Shared helpers and the postgres-specific cases.

pub(crate) mod advisory;
pub(crate) mod clock;
pub(crate) mod deadline;
pub(crate) mod failure;
pub(crate) mod fenced;
pub(crate) mod row_fence;
pub(crate) mod schema;
pub(crate) mod seed;
pub(crate) mod watch;

use std::time::Duration;

use lease_postgres::{PostgresLeaseStore, PostgresOptions, TableName};

/// The test schema.
pub(crate) const SCHEMA: &str = "lease_pg_test";

/// `LEASE_POSTGRES_URL`, or the local default.
pub(crate) fn url() -> String {
    std::env::var("LEASE_POSTGRES_URL")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// The test lease table.
pub(crate) fn table() -> TableName {
    TableName::parse(&format!("{SCHEMA}.leases")).expect("legal table name")
}

/// Small pools: many clients exist at once and the server is shared.
pub(crate) fn options() -> PostgresOptions {
    PostgresOptions::new(table())
        .with_max_connections(2)
        .with_acquire_timeout(Duration::from_secs(5))
}

/// A new client (its own pool) of the test table.
pub(crate) async fn store() -> lease_core::Result<PostgresLeaseStore> {
    PostgresLeaseStore::connect(&url(), options()).await
}

/// Installs the schema once before the suite. A server that cannot be reached is left to the
/// testkit, which reports it (and fails under CI / LEASE_TEST_REQUIRE).
pub(crate) fn migrate_once() {
    let rt = lease_testkit::env::runtime();
    let result = rt.block_on(async {
        let store = PostgresLeaseStore::connect_lazy(
            &url(),
            options().with_acquire_timeout(Duration::from_secs(3)),
        )?;
        store.migrate().await
    });
    if let Err(e) = result {
        eprintln!("lease-postgres: migrate before the suite failed: {e}");
    }
}

/// Polls `f` every 20 ms until it returns true or `within` passes.
pub(crate) async fn eventually<F, Fut>(
    within: Duration,
    what: &str,
    mut f: F,
) -> Result<(), lease_testkit::Failed>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if f().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{what} did not happen within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
