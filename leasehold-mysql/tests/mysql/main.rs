//! The test target of leasehold-mysql: the shared leasehold-testkit suite, unchanged, against a
//! real MariaDB/MySQL server, plus this backend's own cases (group `mysql`).
//!
//! Server: `LEASE_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`, written by
//! `scripts/services/mariadb.sh` to `/tmp/lease-test/mariadb.env`). Tables are
//! `lease_my_test*` in the URL's database; every case uses its own random key namespace and
//! deletes its rows.

mod own;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{FencedResource, LeaseStore};
use leasehold_mysql::{MysqlLeaseStore, MysqlOptions, TableName};
use leasehold_testkit::{Backend, BoxFuture};

/// The test table.
pub(crate) const TABLE: &str = "lease_my_test";

/// `LEASE_MYSQL_URL`, or its default in leasehold-testkit's test store table.
pub(crate) fn url() -> String {
    leasehold_testkit::stores::MYSQL_URL.get()
}

/// The test lease table.
pub(crate) fn table() -> TableName {
    TableName::parse(TABLE).expect("legal table name")
}

/// Small pools: many clients exist at once and the server is shared. Connecting only verifies
/// the schema ([`migrate_once`] installs it).
pub(crate) fn options() -> MysqlOptions {
    MysqlOptions::new(table())
        .with_migrate(false)
        .with_max_connections(2)
        .with_acquire_timeout(Duration::from_secs(5))
}

/// A new client (its own pool) of the test table.
pub(crate) async fn store() -> leasehold_core::Result<MysqlLeaseStore> {
    MysqlLeaseStore::connect_with(&url(), options()).await
}

/// Installs the schema once before the suite. A server that cannot be reached is left to the
/// testkit, which reports it (and fails under CI / LEASE_TEST_REQUIRE).
fn migrate_once() {
    let rt = leasehold_testkit::env::runtime();
    let result = rt.block_on(async {
        let store = MysqlLeaseStore::connect_lazy(
            &url(),
            options().with_acquire_timeout(Duration::from_secs(3)),
        )?;
        store.migrate().await
    });
    if let Err(e) = result {
        eprintln!("leasehold-mysql: migrate before the suite failed: {e}");
    }
}

#[derive(Debug)]
struct Mysql;

impl Backend for Mysql {
    fn name(&self) -> &'static str {
        "mysql"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(store().await?.fenced_resource()) as Arc<dyn FencedResource>)
        })
    }

    /// Longer than the default 600 ms: the shared 2-core test machine can stall a round trip
    /// past the supervisor's per-call timeout of TTL / 3.
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(2000)
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = store().await {
                let _ = store.delete_prefix(namespace).await;
            }
        })
    }
}

fn main() {
    migrate_once();
    leasehold_testkit::run_with(Mysql, own::cases());
}

/// Polls `f` every 20 ms until it returns true or `within` passes.
pub(crate) async fn eventually<F, Fut>(
    within: Duration,
    what: &str,
    mut f: F,
) -> Result<(), leasehold_testkit::Failed>
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
