//! The schema: migration and verification (documented on
//! [`PostgresLeaseStore::migrate`](crate::PostgresLeaseStore::migrate) and
//! [`verify_schema`](crate::PostgresLeaseStore::verify_schema)).

use leasehold_core::{Error, Result};
use sqlx::{AssertSqlSafe, Row};

use crate::client::Client;
use crate::config::TableLayout;
use crate::error::BACKEND;
use crate::protocol;

/// Runs the layout's migration in one transaction under an advisory lock.
pub(crate) async fn migrate(client: &Client) -> Result<()> {
    let operation = "migrate";
    let cx = client.cx();
    let t = client.options.table();
    let layout = client.options.layout();
    let ddl = protocol::migration(t, layout);
    let schema = format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", t.schema());
    client
        .bounded("migrate", async {
            let mut tx = client.pool.begin().await?;
            sqlx::query(protocol::MIGRATE_LOCK)
                .execute(&mut *tx)
                .await?;
            sqlx::raw_sql(AssertSqlSafe(schema))
                .execute(&mut *tx)
                .await?;
            sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *tx).await?;
            Ok(tx.commit().await?)
        })
        .await
        .map_err(|e| e.into_error(operation, cx))?;
    tracing::info!(backend = BACKEND, table = %t, ?layout, "lease schema migrated");
    Ok(())
}

/// Checks every object of the schema, and the layout's owner column.
pub(crate) async fn verify(client: &Client) -> Result<()> {
    let t = client.options.table();
    let layout = client.options.layout();
    let names = [t.to_string(), t.sibling("_token_seq"), t.sibling("_fence")];
    let trigger = format!("{}_token_floor", t.table());
    let keep = format!("{}_token_keep", t.table());
    let owner = match layout {
        TableLayout::CoordinationLease => "owner_id",
        _ => "owner",
    };
    let row = client
        .bounded("verify schema", async {
            Ok(sqlx::query(protocol::VERIFY_SCHEMA)
                .bind(&names[0])
                .bind(&names[1])
                .bind(&names[2])
                .bind(&trigger)
                .bind(&keep)
                .bind(protocol::FLOOR_VERSION)
                .bind(owner)
                .fetch_one(&client.pool)
                .await?)
        })
        .await
        .map_err(|e| e.into_error("verify schema", client.cx()))?;
    let trigger = format!(
        "{trigger} and {trigger}_update ({})",
        protocol::FLOOR_VERSION
    );
    let column = format!("column {owner} of {} ({layout:?} layout)", names[0]);
    let present: [bool; 6] = [
        row.get(0),
        row.get(1),
        row.get(2),
        row.get(3),
        row.get(4),
        row.get(5) || !row.get::<bool, _>(0),
    ];
    let what = [
        names[0].as_str(),
        names[1].as_str(),
        names[2].as_str(),
        trigger.as_str(),
        keep.as_str(),
        column.as_str(),
    ];
    let missing: Vec<&str> = what
        .iter()
        .zip(present)
        .filter(|(_, ok)| !ok)
        .map(|(w, _)| *w)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::config(
            BACKEND,
            format!(
                "the lease schema is not installed or is outdated: missing {}; run \
                 PostgresLeaseStore::migrate() (it upgrades in place) or the migration from \
                 leasehold_postgres::protocol::migration()",
                missing.join(", ")
            ),
            None,
        ))
    }
}
