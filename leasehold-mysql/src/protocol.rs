//! For baselines and tooling: the exact text this backend sends. Every SQL statement and the
//! migration live here and nowhere else; the store, the fenced resource and the advisory locks
//! only bind parameters to them.
//!
//! ```
//! use leasehold_mysql::TableName;
//! use leasehold_mysql::protocol::Statements;
//! let sql = Statements::new(&TableName::default());
//! assert!(sql.acquire_free.starts_with("UPDATE `leases` SET"));
//! assert!(sql.acquire_free.contains("LAST_INSERT_ID(GREATEST(fencing_token + 1, "));
//! ```

use leasehold_core::mutation;

use crate::config::TableName;

/// The server clock in microseconds since the Unix epoch, at the start of the statement
/// (`UTC_TIMESTAMP(6)`: independent of the session's time zone).
pub const CLOCK_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// The `lease_until` a release writes: long past, so the key is free.
pub const RELEASED: &str = "'1970-01-01 00:00:00'";

/// The comment on the lease table that `migrate()` writes and `verify_schema()` requires, so a
/// schema from an earlier version is refused until migrated.
pub const SCHEMA_VERSION: &str = "leasehold-mysql lease table v1";

/// The advisory lock (`GET_LOCK`) that serialises concurrent migrations.
pub const MIGRATE_LOCK: &str = "leasehold-mysql/migrate";

/// The prefix of advisory lock names ([`advisory_lock_name`](crate::advisory_lock_name)).
pub const ADVISORY_PREFIX: &str = "leasehold/";

/// The session's last `LAST_INSERT_ID(expr)` value: a granted token, read back on the
/// connection that granted it when the statement's OK packet does not carry it.
pub const LAST_INSERT_ID: &str = "SELECT LAST_INSERT_ID()";

/// Takes the named session lock `?`, waiting at most `?` seconds: 1 granted, 0 timed out.
pub const GET_LOCK: &str = "SELECT GET_LOCK(?, ?)";

/// Releases the named session lock `?`.
pub const RELEASE_LOCK: &str = "SELECT RELEASE_LOCK(?)";

/// The migration for `t`, one statement per entry (MySQL runs DDL statement by statement, each
/// committing on its own); every statement is idempotent.
///
/// - the lease table: `(resource_key, owner, lease_until DATETIME(6) in UTC, fencing_token,
///   ttl_ms)`, InnoDB, binary (byte-exact) keys and owners;
/// - `<table>_floor`: a per-key floor row, written by the delete trigger with the token of every
///   deleted lease row, so a key that comes back starts above it;
/// - `<table>_fence`: the high-water-mark table of [`MysqlFencedResource`](crate::MysqlFencedResource);
/// - the triggers `<table>_token_floor` (an inserted row's token is above the key's floor row),
///   `<table>_token_rise` (an update that changes a token can only raise it) and
///   `<table>_token_keep` (a deleted row's token goes to the floor row).
pub fn migration(t: &TableName) -> Vec<String> {
    let floor = t.sibling("_floor");
    let fence = t.sibling("_fence");
    let trig = |s: &str| t.sibling(s);
    let statements = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
               resource_key  VARBINARY(255) NOT NULL PRIMARY KEY, \
               owner         VARBINARY(255) NOT NULL, \
               lease_until   DATETIME(6)    NOT NULL, \
               fencing_token BIGINT         NOT NULL, \
               ttl_ms        BIGINT         NULL, \
               CONSTRAINT {tn}_token_positive CHECK (fencing_token > 0)\
             ) ENGINE=InnoDB COMMENT='{SCHEMA_VERSION}'",
            tn = t.table()
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {floor} (\
               resource_key VARBINARY(255) NOT NULL PRIMARY KEY, \
               floor_token  BIGINT         NOT NULL\
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {fence} (\
               resource_key       VARBINARY(255) NOT NULL PRIMARY KEY, \
               last_fencing_token BIGINT         NOT NULL, \
               value              LONGBLOB       NULL, \
               counter            BIGINT         NOT NULL DEFAULT 0, \
               accepted           BIGINT         NOT NULL DEFAULT 0\
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {} BEFORE INSERT ON {t} FOR EACH ROW \
             SET NEW.fencing_token = GREATEST(NEW.fencing_token, \
               COALESCE((SELECT f.floor_token + 1 FROM {floor} f \
                         WHERE f.resource_key = NEW.resource_key), 1))",
            trig("_token_floor")
        ),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {} BEFORE UPDATE ON {t} FOR EACH ROW \
             SET NEW.fencing_token = IF(NEW.fencing_token = OLD.fencing_token, \
               OLD.fencing_token, GREATEST(NEW.fencing_token, OLD.fencing_token + 1))",
            trig("_token_rise")
        ),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {} AFTER DELETE ON {t} FOR EACH ROW \
             INSERT INTO {floor} (resource_key, floor_token) \
             VALUES (OLD.resource_key, OLD.fencing_token) \
             ON DUPLICATE KEY UPDATE floor_token = GREATEST(floor_token, OLD.fencing_token)",
            trig("_token_keep")
        ),
    ];
    // A mutation test may rewrite the DDL (the triggers); without leasehold-core's `mutants`
    // feature this is the identity.
    statements
        .into_iter()
        .map(|stmt| mutation::string("mysql.migration", stmt))
        .collect()
}

/// Checks the schema: `?` the database (NULL for the connection's), `?` the lease table, `?`
/// the floor table, `?` the fence table, `?`/`?`/`?` the three triggers, `?` [`SCHEMA_VERSION`].
/// One row: how many of the three tables exist, how many of the triggers, and whether the lease
/// table carries the version comment.
pub const VERIFY_SCHEMA: &str = "SELECT \
      (SELECT COUNT(*) FROM information_schema.TABLES \
        WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME IN (?, ?, ?)) AS tables, \
      (SELECT COUNT(*) FROM information_schema.TRIGGERS \
        WHERE TRIGGER_SCHEMA = COALESCE(?, DATABASE()) AND TRIGGER_NAME IN (?, ?, ?)) AS triggers, \
      (SELECT COUNT(*) FROM information_schema.TABLES \
        WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
          AND TABLE_COMMENT = ?) AS versioned";

/// Every statement the store runs, for one table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Statements {
    /// The grant of a key that has a row: one guarded `UPDATE` that takes the row when it is
    /// free (`lease_until <= UTC_TIMESTAMP(6)`) or already held by the same owner. Parameters:
    /// owner, TTL in µs, TTL in ms, key, owner. The new token is
    /// `GREATEST(old + 1, server clock in µs)`, handed back through `LAST_INSERT_ID(expr)`
    /// (the OK packet's insert id), so the grant is one round trip. A matched row is a grant.
    pub acquire_free: String,
    /// The grant of a key without a row: an `INSERT .. SELECT` whose token is
    /// `GREATEST(floor + 1, server clock in µs)` (the key's floor row, or 1), also handed back
    /// through `LAST_INSERT_ID(expr)`. Parameters: key, owner, TTL in µs, key, TTL in ms. A
    /// duplicate key (1062) means the row was inserted concurrently: the store starts over.
    pub acquire_insert: String,
    /// The current row of a key, for a refused grant: owner, token, TTL, remaining µs, and
    /// whether it is held now. Parameter: key.
    pub holder: String,
    /// Conditional extension by owner and token while unexpired. Parameters: TTL in µs, TTL in
    /// ms, key, owner, token.
    pub renew: String,
    /// Conditional release by owner and token while unexpired; keeps the row and its token.
    /// Parameters: key, owner, token.
    pub release: String,
    /// Locks and validates the lease row for a fenced transaction. Parameters: key, owner,
    /// token.
    pub lock_row: String,
    /// Whether the (locked) lease row is still unexpired. Parameters: key, owner, token.
    pub still_valid: String,
    /// The high-water-mark table's conditional upsert. Parameters: key, token, value, add,
    /// count, then whether the value is replaced.
    pub fence_write: String,
    /// The high-water mark of a key (in the write's transaction, after the upsert).
    pub fence_mark: String,
    /// The high-water mark and state of a key.
    pub fence_read: String,
    /// Removes every lease row and high-water-mark row whose key starts with a prefix (tests
    /// and tooling); the delete trigger keeps the lease rows' tokens in the floor table.
    pub delete_prefix: [String; 2],
    /// The grant of a batch's keys that have a row, for requests of one owner and one TTL:
    /// [`acquire_free`](Self::acquire_free) as its mutation switch point gave it (so a mutant of
    /// the single grant is a mutant of the batch's), with `resource_key IN` [`KEYS`] for
    /// `resource_key = ?`; `None` if that text is not in it. Parameters: owner, TTL in µs, TTL
    /// in ms, the keys, owner. Each row's guard and token are the single grant's; the rows it
    /// changed are the grants.
    pub acquire_free_many: Option<String>,
    /// The insert of a batch's keys that have no row, for requests of one owner and one TTL:
    /// [`acquire_insert`](Self::acquire_insert) as its switch point gave it, selecting from
    /// the derived table [`ROWS`] (column `k`, one row per key) the keys that have no row, each
    /// with its own floor; `None` if the single insert's text is not in the expected form.
    /// Parameters: owner, TTL in µs, TTL in ms, the keys. A duplicate key (1062) means a row
    /// was inserted concurrently: the batch's transaction starts over.
    pub acquire_insert_many: Option<String>,
    /// The rows of a batch's keys ([`KEYS`]), as [`holder`](Self::holder) with the key first:
    /// read in the batch's transaction after its grant, to learn each granted key's token and
    /// each refused key's holder. Parameters: the keys.
    pub holder_many: String,
    /// The renewal of a batch's leases of one owner and one TTL: [`renew`](Self::renew) as its
    /// mutation switch point gave it (so a mutant of the single renewal is a mutant of the
    /// batch's), with `resource_key IN` [`KEYS`] `AND (resource_key, fencing_token) IN`
    /// [`PAIRS`] for the single key and token; `None` if that text is not in it. Parameters: TTL
    /// in µs, TTL in ms, the keys, each key and its token, owner. The rows it changed are the
    /// renewals. A mutation switch point of its own (`mysql.renew_many`) follows the
    /// derivation.
    pub renew_many: Option<String>,
    /// Which of a batch's leases of one owner are held now: key and token of every unexpired
    /// row of `owner` among the keys ([`KEYS`]). Read after a batch renewal that changed fewer
    /// rows than it was sent, to tell the renewed leases from the lost ones. Parameters: the
    /// keys, owner.
    pub renewed_many: String,
}

/// The list of a batch's keys in [`Statements::acquire_free_many`] and
/// [`Statements::holder_many`]: [`Statements::with_keys`] makes it `(?, ?, ..)`.
pub const KEYS: &str = "(?*)";

/// The list of a batch's keys and tokens in [`Statements::renew_many`]:
/// [`Statements::with_keys`] makes it `((?, ?), (?, ?), ..)`.
pub const PAIRS: &str = "((?, ?)*)";

/// The derived table of a batch's keys in [`Statements::acquire_insert_many`]:
/// [`Statements::with_keys`] makes it `(SELECT ? AS k UNION ALL SELECT ? ..)`.
pub const ROWS: &str = "(SELECT ?* AS k)";

impl Statements {
    /// The statements for `t`.
    pub fn new(t: &TableName) -> Self {
        let floor = t.sibling("_floor");
        let fence = t.sibling("_fence");
        let now = "UTC_TIMESTAMP(6)";
        let acquire_free = format!(
            "UPDATE {t} SET owner = ?, \
               lease_until = {now} + INTERVAL ? MICROSECOND, \
               fencing_token = LAST_INSERT_ID(GREATEST(fencing_token + 1, {CLOCK_US})), \
               ttl_ms = ? \
             WHERE resource_key = ? AND (lease_until <= {now} OR owner = ?)"
        );
        let acquire_insert = format!(
            "INSERT INTO {t} (resource_key, owner, lease_until, fencing_token, ttl_ms) \
             SELECT ?, ?, {now} + INTERVAL ? MICROSECOND, \
               LAST_INSERT_ID(GREATEST(COALESCE((SELECT f.floor_token FROM {floor} f \
                 WHERE f.resource_key = ?), 0) + 1, {CLOCK_US})), ?"
        );
        let holder = format!(
            "SELECT owner, fencing_token, ttl_ms, \
               TIMESTAMPDIFF(MICROSECOND, {now}, lease_until) AS remaining_us, \
               lease_until > {now} AS held \
             FROM {t} WHERE resource_key = ?"
        );
        let renew = format!(
            "UPDATE {t} SET lease_until = {now} + INTERVAL ? MICROSECOND, ttl_ms = ? \
             WHERE resource_key = ? AND owner = ? AND fencing_token = ? AND lease_until > {now}"
        );
        let release = format!(
            "UPDATE {t} SET lease_until = {RELEASED} \
             WHERE resource_key = ? AND owner = ? AND fencing_token = ? AND lease_until > {now}"
        );
        let lock_row = format!(
            "SELECT 1 FROM {t} \
             WHERE resource_key = ? AND owner = ? AND fencing_token = ? AND lease_until > {now} \
             FOR UPDATE"
        );
        let still_valid = format!(
            "SELECT lease_until > {now} FROM {t} \
             WHERE resource_key = ? AND owner = ? AND fencing_token = ?"
        );
        // Assignments run left to right and see the columns already assigned: the mark is
        // assigned last, so every guard compares against the old mark.
        let ok = "last_fencing_token <= VALUES(last_fencing_token)";
        let fence_write = format!(
            "INSERT INTO {fence} (resource_key, last_fencing_token, value, counter, accepted) \
             VALUES (?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE \
               value = IF({ok} AND ?, VALUES(value), value), \
               counter = IF({ok}, counter + VALUES(counter), counter), \
               accepted = IF({ok}, accepted + VALUES(accepted), accepted), \
               last_fencing_token = GREATEST(last_fencing_token, VALUES(last_fencing_token))"
        );
        let fence_mark = format!("SELECT last_fencing_token FROM {fence} WHERE resource_key = ?");
        let fence_read = format!(
            "SELECT last_fencing_token, value, counter, accepted FROM {fence} WHERE resource_key = ?"
        );
        let prefix = "LEFT(resource_key, LENGTH(?)) = ?";
        let delete_prefix = [
            format!("DELETE FROM {t} WHERE {prefix}"),
            format!("DELETE FROM {fence} WHERE {prefix}"),
        ];
        // Every statement that decides safety passes a mutation switch point (the identity
        // unless leasehold-core's `mutants` feature is on and a mutant is active).
        let m = mutation::string;
        Statements {
            acquire_free: m("mysql.acquire_free", acquire_free),
            acquire_insert: m("mysql.acquire_insert", acquire_insert),
            holder,
            renew: m("mysql.renew", renew),
            release: m("mysql.release", release),
            lock_row: m("mysql.lock_row", lock_row),
            still_valid: m("mysql.still_valid", still_valid),
            fence_write: m("mysql.fence_write", fence_write),
            fence_mark,
            fence_read,
            delete_prefix,
            holder_many: format!(
                "SELECT resource_key, owner, fencing_token, ttl_ms, \
                   TIMESTAMPDIFF(MICROSECOND, {now}, lease_until) AS remaining_us, \
                   lease_until > {now} AS held \
                 FROM {t} WHERE resource_key IN {KEYS}"
            ),
            renewed_many: m(
                "mysql.renewed_many",
                format!(
                    "SELECT resource_key, fencing_token FROM {t} \
                     WHERE resource_key IN {KEYS} AND owner = ? AND lease_until > {now}"
                ),
            ),
            acquire_free_many: None,
            acquire_insert_many: None,
            renew_many: None,
        }
        .with_batches(t)
    }

    /// The batch statements, derived from the (switched) single ones.
    fn with_batches(mut self, t: &TableName) -> Self {
        let one_key = "WHERE resource_key = ? ";
        self.acquire_free_many = (self.acquire_free.matches(one_key).count() == 1).then(|| {
            self.acquire_free
                .replacen(one_key, &format!("WHERE resource_key IN {KEYS} "), 1)
        });
        let one_lease = "WHERE resource_key = ? AND owner = ? AND fencing_token = ? ";
        self.renew_many = (self.renew.matches(one_lease).count() == 1).then(|| {
            mutation::string(
                "mysql.renew_many",
                self.renew.replacen(
                    one_lease,
                    &format!(
                        "WHERE resource_key IN {KEYS} AND (resource_key, fencing_token) IN {PAIRS} \
                         AND owner = ? "
                    ),
                    1,
                ),
            )
        });
        let (select, floor) = ("SELECT ?, ?, ", "f.resource_key = ?");
        self.acquire_insert_many = (self.acquire_insert.matches(select).count() == 1
            && self.acquire_insert.matches(floor).count() == 1)
            .then(|| {
                format!(
                    "{} FROM {ROWS} r \
                     WHERE NOT EXISTS (SELECT 1 FROM {t} l WHERE l.resource_key = r.k)",
                    self.acquire_insert
                        .replacen(select, "SELECT r.k, ?, ", 1)
                        .replacen(floor, "f.resource_key = r.k", 1)
                )
            });
        self
    }

    /// `batch` (one of the batch statements) for `n` keys: [`PAIRS`], [`KEYS`] and [`ROWS`]
    /// written out with `n` keys' parameters (at least one).
    ///
    /// ```
    /// use leasehold_mysql::protocol::{KEYS, PAIRS, ROWS, Statements};
    /// assert_eq!(Statements::with_keys(&format!("IN {KEYS}"), 3), "IN (?, ?, ?)");
    /// assert_eq!(
    ///     Statements::with_keys(&format!("FROM {ROWS} r"), 2),
    ///     "FROM (SELECT ? AS k UNION ALL SELECT ? AS k) r"
    /// );
    /// assert_eq!(
    ///     Statements::with_keys(&format!("IN {PAIRS}"), 2),
    ///     "IN ((?, ?), (?, ?))"
    /// );
    /// ```
    pub fn with_keys(batch: &str, n: usize) -> String {
        let n = n.max(1);
        batch
            .replace(PAIRS, &format!("({})", vec!["(?, ?)"; n].join(", ")))
            .replace(KEYS, &format!("({})", vec!["?"; n].join(", ")))
            .replace(
                ROWS,
                &format!("({})", vec!["SELECT ? AS k"; n].join(" UNION ALL ")),
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_names_every_object_after_the_table() {
        let t = TableName::parse("locking.jobs").unwrap();
        let sql = migration(&t).join("\n");
        for name in [
            "`locking`.`jobs` (",
            "`locking`.`jobs_floor`",
            "`locking`.`jobs_fence`",
            "`locking`.`jobs_token_floor`",
            "`locking`.`jobs_token_rise`",
            "`locking`.`jobs_token_keep`",
        ] {
            assert!(sql.contains(name), "{name} missing");
        }
        assert!(!sql.contains("`leases"));
    }

    #[test]
    fn the_shipped_file_is_the_migration_of_the_default_table() {
        let rendered = migration(&TableName::default()).join(";\n\n") + ";\n";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/0001_leases.sql");
        if std::env::var_os("LEASE_MYSQL_BLESS").is_some() {
            std::fs::write(path, &rendered).expect("write sql/0001_leases.sql");
            return;
        }
        let shipped = std::fs::read_to_string(path).expect("sql/0001_leases.sql");
        assert_eq!(
            shipped, rendered,
            "stale: regenerate with LEASE_MYSQL_BLESS=1 cargo test -p leasehold-mysql --lib"
        );
    }

    #[test]
    fn grants_take_the_token_from_the_row_or_the_floor_and_the_clock() {
        let s = Statements::new(&TableName::default());
        assert!(s.acquire_free.contains(&format!(
            "LAST_INSERT_ID(GREATEST(fencing_token + 1, {CLOCK_US}))"
        )));
        assert!(s.acquire_insert.contains("`leases_floor`"));
        assert!(s.acquire_insert.contains(CLOCK_US));
        // The batch grant is the single grant over a list of keys; the batch insert takes each
        // key's own floor.
        let free_many = s.acquire_free_many.as_deref().expect("derived");
        assert_eq!(
            free_many.replace(&format!("resource_key IN {KEYS} "), "resource_key = ? "),
            s.acquire_free
        );
        let insert_many = s.acquire_insert_many.as_deref().expect("derived");
        assert!(insert_many.contains("WHERE f.resource_key = r.k), 0) + 1"));
        assert!(insert_many.contains(&format!("FROM {ROWS} r WHERE NOT EXISTS")));
        // The batch renewal is the single renewal over a list of keys and tokens.
        let renew_many = s.renew_many.as_deref().expect("derived");
        assert_eq!(
            renew_many.replace(
                &format!(
                    "resource_key IN {KEYS} AND (resource_key, fencing_token) IN {PAIRS} \
                     AND owner = ? "
                ),
                "resource_key = ? AND owner = ? AND fencing_token = ? "
            ),
            s.renew
        );
        // The mark is assigned last, so the guards see the old mark.
        assert!(s.fence_write.trim_end().ends_with(
            "last_fencing_token = GREATEST(last_fencing_token, VALUES(last_fencing_token))"
        ));
    }
}
