//! The SQL text, built once per table from a validated [`TableName`].

use crate::config::TableName;

/// The shipped migration, rendered for `"public"."leases"`.
pub(crate) const MIGRATION: &str = include_str!("../sql/0001_leases.sql");

/// The comment `migrate()` puts on the token trigger's function; `verify_schema()` requires it,
/// so a schema installed by an earlier version (no clock floor) is refused until migrated.
pub(crate) const FLOOR_VERSION: &str = "lease-postgres token floor v2";

/// The migration template: `{{schema}}` and `{{table}}` stand for the validated names.
pub(crate) const TEMPLATE: &str = include_str!("../sql/leases.sql.template");

/// The migration for `table`: the template with its placeholders replaced in one pass (a name
/// that contains text looking like another name or placeholder is never rewritten).
pub(crate) fn migration(table: &TableName) -> String {
    render(TEMPLATE, table.schema(), table.table())
}

fn render(template: &str, schema: &str, table: &str) -> String {
    let mut out = String::with_capacity(template.len() + 256);
    let mut rest = template;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        if let Some(tail) = after.strip_prefix("{{schema}}") {
            out.push_str(schema);
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("{{table}}") {
            out.push_str(table);
            rest = tail;
        } else {
            out.push_str("{{");
            rest = &after[2..];
        }
    }
    out.push_str(rest);
    out
}

/// Every statement the store runs, for one table.
#[derive(Debug)]
pub(crate) struct Statements {
    /// The seed's upsert, plus same-owner re-acquire: grants iff the key is free, expired, or
    /// already held by the same owner; otherwise returns the holder. The token comes from the
    /// floor trigger.
    pub(crate) acquire: String,
    /// The current holder of a key (if unexpired), its remaining time and last token.
    pub(crate) inspect: String,
    /// Conditional extension by owner and token while unexpired.
    pub(crate) renew: String,
    /// One statement renewing many leases.
    pub(crate) renew_many: String,
    /// Conditional release by owner and token while unexpired; keeps the row and its token.
    pub(crate) release: String,
    /// `release`, plus `pg_notify(<channel>, key)` for the released row, in the same statement
    /// (one round trip, one transaction). Returns one row iff it released; the command tag's
    /// count (`SELECT 1` / `SELECT 0`) is the same as the plain `UPDATE`'s.
    pub(crate) release_notify: String,
    /// Locks and validates the lease row for a fenced transaction.
    pub(crate) lock_row: String,
    /// Locks the lease row and reads its generation (the lease-row fenced resource).
    pub(crate) lock_generation: String,
    /// Whether the (locked) lease row is still unexpired.
    pub(crate) still_valid: String,
    /// The high-water-mark table's conditional write.
    pub(crate) fence_write: String,
    /// The high-water mark of a key.
    pub(crate) fence_mark: String,
    /// The high-water mark and state of a key.
    pub(crate) fence_read: String,
    /// Removes every row whose key starts with a prefix (tests and tooling).
    pub(crate) delete_prefix: [String; 2],
}

impl Statements {
    pub(crate) fn new(t: &TableName) -> Self {
        let table = t.to_string();
        let fence = t.sibling("_fence");
        // `clock_timestamp()` (not `now()`): the server's clock at the moment the row is looked
        // at, even inside a longer transaction. Expiry is decided by it alone.
        // One statement decides and reports: a refused attempt rewrites the row unchanged so
        // that RETURNING names the holder of exactly the row version the decision was made on.
        // `c.now` is read once, at statement start (before any row-lock wait): a grant is never
        // early, and the granted row's lease_until is never later than the client believes.
        let granted = "(l.lease_until <= (SELECT now FROM c) OR l.owner = excluded.owner)";
        let acquire = format!(
            "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now) \
             INSERT INTO {table} AS l (resource_key, owner, lease_until, fencing_token, ttl_ms) \
             SELECT $1, $2, c.now + $3::bigint * interval '1 millisecond', 1, $3 FROM c \
             ON CONFLICT (resource_key) DO UPDATE \
               SET owner = CASE WHEN {granted} THEN excluded.owner ELSE l.owner END, \
                   lease_until = CASE WHEN {granted} THEN excluded.lease_until ELSE l.lease_until END, \
                   fencing_token = CASE WHEN {granted} THEN l.fencing_token + 1 ELSE l.fencing_token END, \
                   ttl_ms = CASE WHEN {granted} THEN excluded.ttl_ms ELSE l.ttl_ms END \
             RETURNING l.owner, l.fencing_token, l.ttl_ms, \
               ceil(extract(epoch FROM l.lease_until - (SELECT now FROM c)) * 1000000)::bigint AS remaining_us"
        );
        let inspect = format!(
            "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now) \
             SELECT l.owner, l.fencing_token, l.ttl_ms, \
                    CASE WHEN l.lease_until > c.now \
                         THEN ceil(extract(epoch FROM l.lease_until - c.now) * 1000000)::bigint \
                    END AS remaining_us \
             FROM {table} l, c WHERE l.resource_key = $1"
        );
        let renew = format!(
            "UPDATE {table} \
             SET lease_until = clock_timestamp() + $4::bigint * interval '1 millisecond', ttl_ms = $4 \
             WHERE resource_key = $1 AND owner = $2 AND fencing_token = $3 \
               AND lease_until > clock_timestamp()"
        );
        let renew_many = format!(
            "UPDATE {table} AS l \
             SET lease_until = clock_timestamp() + b.ttl_ms * interval '1 millisecond', ttl_ms = b.ttl_ms \
             FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS b(k, o, tok, ttl_ms) \
             WHERE l.resource_key = b.k AND l.owner = b.o AND l.fencing_token = b.tok \
               AND l.lease_until > clock_timestamp() \
             RETURNING l.resource_key, l.fencing_token"
        );
        // '-infinity' marks a released row: expired for every clock, even one stepped back.
        let release = format!(
            "UPDATE {table} SET lease_until = '-infinity' \
             WHERE resource_key = $1 AND owner = $2 AND fencing_token = $3 \
               AND lease_until > clock_timestamp()"
        );
        // The channel is built from the validated table name ([a-z0-9_.:] and hex digits only),
        // so it can be a literal. NOTIFY is sent at commit, and only if the UPDATE matched.
        let channel = crate::notify::channel(t);
        let release_notify = format!(
            "WITH r AS (UPDATE {table} SET lease_until = '-infinity' \
             WHERE resource_key = $1 AND owner = $2 AND fencing_token = $3 \
               AND lease_until > clock_timestamp() \
             RETURNING resource_key) \
             SELECT pg_notify('{channel}', r.resource_key) FROM r"
        );
        let lock_row = format!(
            "SELECT 1 FROM {table} \
             WHERE resource_key = $1 AND owner = $2 AND fencing_token = $3 \
               AND lease_until > clock_timestamp() \
             FOR UPDATE"
        );
        let lock_generation =
            format!("SELECT fencing_token FROM {table} WHERE resource_key = $1 FOR UPDATE");
        let still_valid = format!(
            "SELECT lease_until > clock_timestamp() FROM {table} \
             WHERE resource_key = $1 AND owner = $2 AND fencing_token = $3"
        );
        let fence_write = format!(
            "INSERT INTO {fence} AS r (resource_key, last_fencing_token, value, counter, accepted) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (resource_key) DO UPDATE \
               SET last_fencing_token = excluded.last_fencing_token, \
                   value = CASE WHEN $6 THEN excluded.value ELSE r.value END, \
                   counter = r.counter + excluded.counter, \
                   accepted = r.accepted + excluded.accepted \
               WHERE r.last_fencing_token <= excluded.last_fencing_token \
             RETURNING r.last_fencing_token"
        );
        let fence_mark = format!("SELECT last_fencing_token FROM {fence} WHERE resource_key = $1");
        let fence_read = format!(
            "SELECT last_fencing_token, value, counter, accepted FROM {fence} WHERE resource_key = $1"
        );
        let delete_prefix = [
            format!("DELETE FROM {table} WHERE starts_with(resource_key, $1)"),
            format!("DELETE FROM {fence} WHERE starts_with(resource_key, $1)"),
        ];
        Statements {
            acquire,
            inspect,
            renew,
            renew_many,
            release,
            release_notify,
            lock_row,
            lock_generation,
            still_valid,
            fence_write,
            fence_mark,
            fence_read,
            delete_prefix,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_renames_every_object() {
        let t = TableName::parse("locking.jobs").unwrap();
        let sql = migration(&t);
        assert!(!sql.contains("\"public\""));
        assert!(!sql.contains("\"leases"));
        for name in [
            "\"locking\".\"jobs\"",
            "\"locking\".\"jobs_token_seq\"",
            "\"locking\".\"jobs_fence\"",
            "\"jobs_token_floor\"",
            "\"locking\".\"lease_token_floor\"()",
            "\"jobs_token_keep\"",
        ] {
            assert!(sql.contains(name), "{name} missing");
        }
        assert_eq!(migration(&TableName::default()), MIGRATION);
    }

    /// `sql/0001_leases.sql` is the template rendered for the default table. After editing the
    /// template, regenerate it with `LEASE_PG_BLESS=1 cargo test -p lease-postgres --lib`.
    #[test]
    fn shipped_file_is_the_rendered_template() {
        let rendered = migration(&TableName::default());
        if std::env::var_os("LEASE_PG_BLESS").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/0001_leases.sql");
            std::fs::write(path, &rendered).expect("write sql/0001_leases.sql");
            return;
        }
        assert_eq!(
            rendered, MIGRATION,
            "sql/0001_leases.sql is stale: see this test's docs"
        );
        assert!(!MIGRATION.contains("{{"));
        assert!(MIGRATION.contains(&format!("IS '{FLOOR_VERSION}'")));
    }

    /// Issue 18 item 14: names are substituted in one pass, so a schema that starts with
    /// `leases` (or contains the other name) stays as given.
    #[test]
    fn names_that_look_like_other_names_are_kept() {
        for (schema, table) in [
            ("leases_app", "jobs"),
            ("public_x", "leases"),
            ("leases", "leases_public"),
        ] {
            let t = TableName::parse(&format!("{schema}.{table}")).unwrap();
            let sql = migration(&t);
            assert!(
                sql.contains(&format!("\"{schema}\".\"{table}\" (")),
                "{schema}.{table}"
            );
            assert!(sql.contains(&format!("\"{schema}\".\"{table}_token_seq\"")));
            assert!(sql.contains(&format!("\"{schema}\".\"{table}_fence\"")));
            assert!(!sql.contains("{{"));
        }
        assert_eq!(
            render("{{x}} {{schema}}{{table}}", "a{{table}}", "b"),
            "{{x}} a{{table}}b"
        );
    }

    #[test]
    fn release_notifies_on_the_tables_channel() {
        let s = Statements::new(&TableName::default());
        assert_eq!(
            s.release_notify,
            "WITH r AS (UPDATE \"public\".\"leases\" SET lease_until = '-infinity' \
             WHERE resource_key = $1 AND owner = $2 AND fencing_token = $3 \
             AND lease_until > clock_timestamp() RETURNING resource_key) \
             SELECT pg_notify('lease:public.leases', r.resource_key) FROM r"
        );
        assert!(!s.release.contains("pg_notify"));
    }
}
