//! The schema: migration and verification.

use lease_core::{Error, Result};
use sqlx::{AssertSqlSafe, Row};

use crate::BACKEND;
use crate::config::TableName;
use crate::sql;
use crate::store::PostgresLeaseStore;

impl PostgresLeaseStore {
    /// The DDL [`migrate`](Self::migrate) runs for `table`: `sql/leases.sql.template` with its
    /// `{{schema}}` and `{{table}}` placeholders replaced in one pass (for the default table this
    /// is `sql/0001_leases.sql`). Idempotent.
    ///
    /// ```
    /// use lease_postgres::{PostgresLeaseStore, TableName};
    /// let ddl = PostgresLeaseStore::migration_sql(&TableName::parse("locking.leases")?);
    /// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS \"locking\".\"leases\""));
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    pub fn migration_sql(table: &TableName) -> String {
        sql::migration(table)
    }

    /// Creates the schema (if needed), the lease table, its token sequence and trigger, and the
    /// high-water-mark table. Idempotent, and safe to run from several processes at once (the
    /// DDL runs in one transaction under an advisory lock).
    ///
    /// # Errors
    /// [`Error::Unavailable`] / [`Error::Timeout`] if the server cannot be reached in time;
    /// [`Error::Config`] or [`Error::Backend`] if the DDL is refused (for example permissions).
    ///
    /// # Cancellation safety
    /// Cancel safe: the DDL is one transaction, rolled back if dropped.
    pub async fn migrate(&self) -> Result<()> {
        let cx = self.cx("migrate");
        let t = self.table();
        let ddl = sql::migration(t);
        let schema = format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", t.schema());
        self.bounded("migrate", async {
            let mut tx = self.pool().begin().await?;
            sqlx::query(
                "SELECT pg_advisory_xact_lock(1818583411, hashtext('lease-postgres migrate'))",
            )
            .execute(&mut *tx)
            .await?;
            sqlx::raw_sql(AssertSqlSafe(schema))
                .execute(&mut *tx)
                .await?;
            sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *tx).await?;
            tx.commit().await
        })
        .await
        .map_err(|e| e.into_error(cx))?;
        tracing::info!(backend = BACKEND, table = %t, "lease schema migrated");
        Ok(())
    }

    /// Checks that the lease table, its sequence, its token triggers (the current version, see
    /// `docs/adr/0010-postgres-token-floor.md`) and the high-water-mark table exist.
    ///
    /// # Errors
    /// [`Error::Config`] naming what is missing or outdated (run [`migrate`](Self::migrate),
    /// which upgrades an existing schema in place).
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    pub async fn verify_schema(&self) -> Result<()> {
        let t = self.table();
        let names = [t.to_string(), t.sibling("_token_seq"), t.sibling("_fence")];
        let trigger = format!("{}_token_floor", t.table());
        let keep = format!("{}_token_keep", t.table());
        let row = self
            .bounded("verify schema", async {
                sqlx::query(
                    "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, \
                            to_regclass($3) IS NOT NULL, \
                            EXISTS (SELECT 1 FROM pg_trigger \
                                    WHERE tgrelid = to_regclass($1) AND tgname = $4 AND tgenabled <> 'D' \
                                      AND obj_description(tgfoid, 'pg_proc') = $6), \
                            EXISTS (SELECT 1 FROM pg_trigger \
                                    WHERE tgrelid = to_regclass($1) AND tgname = $5 AND tgenabled <> 'D')",
                )
                .bind(&names[0])
                .bind(&names[1])
                .bind(&names[2])
                .bind(&trigger)
                .bind(&keep)
                .bind(sql::FLOOR_VERSION)
                .fetch_one(self.pool())
                .await
            })
            .await
            .map_err(|e| e.into_error(self.cx("verify schema")))?;
        let trigger = format!("{trigger} ({})", sql::FLOOR_VERSION);
        let present: [bool; 5] = [row.get(0), row.get(1), row.get(2), row.get(3), row.get(4)];
        let what = [
            names[0].as_str(),
            names[1].as_str(),
            names[2].as_str(),
            trigger.as_str(),
            keep.as_str(),
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
                     PostgresLeaseStore::migrate() (it upgrades in place) or sql/0001_leases.sql",
                    missing.join(", ")
                ),
                None,
            ))
        }
    }
}
