// This file stays whole past 600 lines (about 460 of statements, the rest their tests): the
// text that decides safety is in one place by design, so that a reviewer reads every statement
// side by side and the mutation program finds its text here.
//! For baselines and tooling: the exact text this backend sends. Every SQL statement, the
//! migrations, the notification channel and the advisory-lock id layout live here and nowhere
//! else; the store, the fenced resources and the advisory locks only bind parameters to them.
//!
//! ```
//! use leasehold_postgres::{TableLayout, TableName};
//! use leasehold_postgres::protocol::Statements;
//! let sql = Statements::new(&TableName::default(), TableLayout::Library);
//! assert!(sql.acquire.starts_with("WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)"));
//! assert!(sql.release.contains("lease_until = '-infinity'"));
//! ```

use leasehold_core::mutation;

use crate::config::{TableLayout, TableName};

/// The shipped migration (`sql/0001_leases.sql`): [`TEMPLATE`] rendered for the default table
/// `"public"."leases"`.
pub const MIGRATION: &str = include_str!("../sql/0001_leases.sql");

/// The comment `migrate()` puts on the token trigger's function; `verify_schema()` requires it,
/// so a schema installed by an earlier version (no clock floor) is refused until migrated.
pub const FLOOR_VERSION: &str = "leasehold-postgres token floor v3";

/// The migration template (`sql/leases.sql.template`): `{{schema}}` and `{{table}}` stand for
/// the validated names.
pub const TEMPLATE: &str = include_str!("../sql/leases.sql.template");

/// The lease table of [`TableLayout::Library`] in [`TEMPLATE`].
const LIBRARY_TABLE: &str = "CREATE TABLE IF NOT EXISTS \"{{schema}}\".\"{{table}}\" (
    resource_key  text        PRIMARY KEY,
    owner         text        NOT NULL,
    lease_until   timestamptz NOT NULL,
    fencing_token bigint      NOT NULL CHECK (fencing_token > 0),
    -- The TTL of the current grant in milliseconds (NULL for rows written by other tools).
    ttl_ms        bigint      CHECK (ttl_ms > 0),
    -- Whether a release must notify (ADR 0017): 1 once an acquire was refused, 2 after the
    -- release that notified for it, 0 after a release that had no one to notify.
    wake          smallint    NOT NULL DEFAULT 0 CHECK (wake IN (0, 1, 2))
);
-- Version 2 tables gain the wake column (no rewrite: a constant default).
ALTER TABLE \"{{schema}}\".\"{{table}}\"
    ADD COLUMN IF NOT EXISTS wake smallint NOT NULL DEFAULT 0 CHECK (wake IN (0, 1, 2));";

/// The seed's `coordination_lease` columns ([`TableLayout::CoordinationLease`]): created only if the table is
/// missing; an existing table is kept as it is.
pub const SEED_TABLE: &str = "CREATE TABLE IF NOT EXISTS \"{{schema}}\".\"{{table}}\" (
    resource_key  text        PRIMARY KEY,
    owner_id      uuid,
    lease_until   timestamptz NOT NULL DEFAULT '-infinity',
    fencing_token bigint      NOT NULL DEFAULT 0
);";

/// The migration `migrate()` runs for `table` in `layout`, idempotent. For
/// [`TableLayout::Library`], [`TEMPLATE`] with its placeholders replaced in one pass (a name
/// that contains text looking like another name or placeholder is never rewritten). For
/// [`TableLayout::CoordinationLease`], the same with the seed's columns ([`SEED_TABLE`]) instead of the
/// library's table: the existing table keeps its columns and gains the token floor (sequence
/// and triggers) and the high-water-mark table.
pub fn migration(table: &TableName, layout: TableLayout) -> String {
    let template = match layout {
        TableLayout::CoordinationLease => TEMPLATE.replacen(LIBRARY_TABLE, SEED_TABLE, 1),
        _ => TEMPLATE.to_string(),
    };
    // A mutation test may rewrite the DDL (the triggers); without the feature this is the identity.
    mutation::string(
        "postgres.migration",
        render(&template, table.schema(), table.table()),
    )
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

/// Serialises concurrent migrations (`migrate()` takes it first, in the DDL's transaction).
pub const MIGRATE_LOCK: &str =
    "SELECT pg_advisory_xact_lock(1818583411, hashtext('leasehold-postgres migrate'))";

/// Checks the schema: `$1` table, `$2` sequence, `$3` high-water-mark table, `$4` floor trigger
/// (and `$4_update`, both enabled and on the current function),
/// `$5` keep trigger, `$6` [`FLOOR_VERSION`], `$7` the owner column of the layout.
pub const VERIFY_SCHEMA: &str = "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, \
        to_regclass($3) IS NOT NULL, \
        (SELECT count(*) FROM pg_trigger \
                WHERE tgrelid = to_regclass($1) AND tgname IN ($4, $4 || '_update') \
                  AND tgenabled <> 'D' AND obj_description(tgfoid, 'pg_proc') = $6) = 2, \
        EXISTS (SELECT 1 FROM pg_trigger \
                WHERE tgrelid = to_regclass($1) AND tgname = $5 AND tgenabled <> 'D'), \
        EXISTS (SELECT 1 FROM pg_attribute \
                WHERE attrelid = to_regclass($1) AND attname = $7 AND NOT attisdropped)";

/// Sets `lock_timeout`, `statement_timeout` and `idle_in_transaction_session_timeout` for the
/// open transaction only (`$1`/`$3`/`$5` names, `$2`/`$4`/`$6` values).
pub const SET_LOCAL_TIMEOUTS: &str =
    "SELECT set_config($1, $2, true), set_config($3, $4, true), set_config($5, $6, true)";

/// Waits for the transaction-scoped advisory lock `$1`.
pub const ADVISORY_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

/// Tries the transaction-scoped advisory lock `$1`.
pub const ADVISORY_TRY_LOCK: &str = "SELECT pg_try_advisory_xact_lock($1)";

/// The prefix hashed with the key into an advisory lock id
/// ([`advisory_lock_id`](crate::advisory_lock_id)).
pub const ADVISORY_ID_PREFIX: &[u8] = b"leasehold-postgres/advisory/v1:";

/// Every statement the store runs, for one table. Parameters: `$1` key, `$2` owner, `$3` token
/// (or the TTL in milliseconds for `acquire`), `$4` TTL in milliseconds (renew).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Statements {
    /// The seed's upsert, plus same-owner re-acquire: grants iff the key is free, expired, or
    /// already held by the same owner; otherwise returns the holder. The token comes from the
    /// floor trigger.
    pub acquire: String,
    /// The grant alone, the usual case: one guarded `UPDATE` that takes the key's row when it
    /// is free or already held by `$2`, with the same token, expiry and TTL as
    /// [`acquire`](Self::acquire)'s grant, and returns `owner` and `fencing_token`. No row
    /// returned means the key is held by another owner or has no row; the store then runs
    /// [`acquire`](Self::acquire), which decides again on its own (a grant, or a refusal that
    /// marks the row and reports the holder, or an insert). Without the `CASE`s, the clock
    /// CTE's join, the `INSERT` branch and the holder's columns, the grant costs the server
    /// less (ADR 0016); a refusal takes two statements.
    pub acquire_free: String,
    /// [`acquire`](Self::acquire) for many keys in one statement: `$1` the keys (`text[]`, no
    /// key twice), `$2` their owners (`text[]`), `$3` their TTLs in milliseconds (`bigint[]`).
    /// The existing rows of the batch are locked first, in key order, so that two batches over
    /// overlapping keys wait for each other instead of deadlocking; each row is then granted or
    /// refused by the same guarded `UPDATE` as [`acquire`](Self::acquire)'s (a refusal marks
    /// the row for a wake-up), and keys without a row are inserted, in key order, with the same
    /// `ON CONFLICT` branch. One row per key, with its `resource_key` and the columns
    /// [`acquire`](Self::acquire) returns.
    pub acquire_many: String,
    /// The current holder of a key (if unexpired), its remaining time and last token.
    pub inspect: String,
    /// [`inspect`](Self::inspect) for many keys in one statement: `$1` the keys (`text[]`);
    /// one row per key, in input order (`ord`, from 1), duplicates kept; a key without a row
    /// has NULL token and owner.
    pub inspect_many: String,
    /// Conditional extension by owner and token while unexpired.
    pub renew: String,
    /// One statement renewing many leases: `$1` keys, `$2` owners, `$3` tokens, `$4` TTLs in
    /// ms. Returns each renewed row's key and token and the owner as it was sent, so that a
    /// lease is renewed only when its key, owner *and* token come back.
    pub renew_many: String,
    /// Conditional release by owner and token while unexpired; keeps the row and its token.
    pub release: String,
    /// `release`, plus `pg_notify(<channel>, key)` in its `RETURNING` for the released row when
    /// an acquire of the key was refused since the last notification (library layout; always
    /// with the seed's table): one round trip, one transaction. The command tag's count
    /// (`UPDATE 1` / `UPDATE 0`) is the plain `UPDATE`'s.
    pub release_notify: String,
    /// Marks the row of `$1` for a wake-up (`wake = 1`), for a watch about to wait; returns the
    /// row's token and whether it is held now, or no row. `None` on the seed's table (no mark:
    /// every release notifies there).
    pub arm_watch: Option<String>,
    /// Locks and validates the lease row for a fenced transaction.
    pub lock_row: String,
    /// Locks the lease row and reads its generation (the lease-row fenced resource).
    pub lock_generation: String,
    /// Whether the (locked) lease row is still unexpired.
    pub still_valid: String,
    /// The high-water-mark table's conditional write.
    pub fence_write: String,
    /// The high-water mark of a key.
    pub fence_mark: String,
    /// The high-water mark and state of a key.
    pub fence_read: String,
    /// Removes every row whose key starts with a prefix (tests and tooling).
    pub delete_prefix: [String; 2],
}

impl Statements {
    /// The statements for `t` in `layout`.
    pub fn new(t: &TableName, layout: TableLayout) -> Self {
        let table = t.to_string();
        let seed = layout == TableLayout::CoordinationLease;
        // The layout's owner column, how an owner parameter is cast to it and how it is read
        // back as text; the seed's table has no TTL column.
        let (owner, cast, owner_out) = if seed {
            ("owner_id", "::uuid", "l.owner_id::text AS owner")
        } else {
            ("owner", "", "l.owner")
        };
        let fence = t.sibling("_fence");
        // `clock_timestamp()` (not `now()`): the server's clock at the moment the row is looked
        // at, even inside a longer transaction. Expiry is decided by it alone.
        // One statement decides and reports: a refused attempt rewrites the row (marking it for
        // a wake-up, library layout) so that RETURNING names the holder of exactly the row
        // version the decision was made on, and so that a release committed after the refusal
        // sees the mark (ADR 0017).
        // `c.now` is read once, at statement start (before any row-lock wait): a grant is never
        // early, and the granted row's lease_until is never later than the client believes.
        //
        // An existing row (the usual case) is taken by the UPDATE `u`, which computes the token
        // itself: greatest(old + 1, server clock in µs), the floor of ADR 0012 without the
        // sequence (only a deleted row needs it, and a deleted row means an INSERT). A rise of
        // more than one is skipped by the update trigger's WHEN clause, and a refusal does not
        // change the token: no trigger function runs. Only a new row goes through the INSERT
        // `i` (and its trigger, which draws from the sequence); its ON CONFLICT branch covers a
        // row inserted concurrently after the statement's snapshot.
        //
        // The store sends `acquire_free` first and `acquire` only when it returned no row:
        // a guarded UPDATE that grants a free (or own) row and nothing else. Its
        // clock is `statement_timestamp()`, the time the server received the statement: no
        // later than `c.now`, so a grant is never early and the row's lease_until is never
        // later than `acquire`'s would be. The INSERT branch's executor set-up, the CASEs, the
        // clock CTE's join and the holder's columns cost even on a grant. Each statement
        // decides on its own; `acquire` after an empty `acquire_free` is the statement it
        // always was (a row freed in between is granted by it).
        let clock_us = "floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";
        let g_u = format!("(l.lease_until <= c.now OR l.{owner} = $2{cast})");
        let g_i = format!("(l.lease_until <= (SELECT now FROM c) OR l.{owner} = excluded.{owner})");
        let (ttl_col, ttl_val, ttl_u, ttl_i, ttl_out) = if seed {
            (
                String::new(),
                "",
                String::new(),
                String::new(),
                "NULL::bigint AS ttl_ms",
            )
        } else {
            (
                ", ttl_ms".to_string(),
                ", $3::bigint",
                format!(
                    ", ttl_ms = CASE WHEN {g_u} THEN $3::bigint ELSE l.ttl_ms END, \
                     wake = CASE WHEN {g_u} THEN l.wake ELSE 1 END"
                ),
                format!(
                    ", ttl_ms = CASE WHEN {g_i} THEN excluded.ttl_ms ELSE l.ttl_ms END, \
                     wake = CASE WHEN {g_i} THEN l.wake ELSE 1 END"
                ),
                "l.ttl_ms",
            )
        };
        let c_now = "c AS MATERIALIZED (SELECT clock_timestamp() AS now)";
        let update = format!(
            "UPDATE {table} AS l \
               SET {owner} = CASE WHEN {g_u} THEN $2{cast} ELSE l.{owner} END, \
                   lease_until = CASE WHEN {g_u} \
                     THEN c.now + $3::bigint * interval '1 millisecond' ELSE l.lease_until END, \
                   fencing_token = CASE WHEN {g_u} \
                     THEN greatest(l.fencing_token + 1, {clock_us}) ELSE l.fencing_token END\
                   {ttl_u} \
               FROM c WHERE l.resource_key = $1 \
               RETURNING {owner_out}, l.fencing_token, {ttl_out}, \
                 ceil(extract(epoch FROM l.lease_until - c.now) * 1000000)::bigint AS remaining_us"
        );
        let free_ttl = if seed { "" } else { ", ttl_ms = $3::bigint" };
        let acquire_free = format!(
            "UPDATE {table} AS l \
               SET {owner} = $2{cast}, \
                   lease_until = statement_timestamp() + $3::bigint * interval '1 millisecond', \
                   fencing_token = greatest(l.fencing_token + 1, {clock_us}){free_ttl} \
               WHERE l.resource_key = $1 \
                 AND (l.lease_until <= statement_timestamp() OR l.{owner} = $2{cast}) \
               RETURNING {owner_out}, l.fencing_token"
        );
        let acquire = format!(
            "WITH {c_now}, u AS ({update}), \
             i AS (INSERT INTO {table} AS l (resource_key, {owner}, lease_until, fencing_token{ttl_col}) \
               SELECT $1, $2{cast}, c.now + $3::bigint * interval '1 millisecond', 1{ttl_val} \
               FROM c WHERE NOT EXISTS (SELECT 1 FROM u) \
               ON CONFLICT (resource_key) DO UPDATE \
                 SET {owner} = CASE WHEN {g_i} THEN excluded.{owner} ELSE l.{owner} END, \
                     lease_until = CASE WHEN {g_i} THEN excluded.lease_until ELSE l.lease_until END, \
                     fencing_token = CASE WHEN {g_i} \
                       THEN greatest(l.fencing_token + 1, {clock_us}) ELSE l.fencing_token END\
                     {ttl_i} \
               RETURNING {owner_out}, l.fencing_token, {ttl_out}, \
                 ceil(extract(epoch FROM l.lease_until - (SELECT now FROM c)) * 1000000)::bigint AS remaining_us) \
             SELECT * FROM u UNION ALL SELECT * FROM i"
        );
        // The batch: the single statement's guard, TTL and wake columns with each key's own
        // owner and TTL (`b.o`, `b.ttl_ms`). `lk` locks the batch's existing rows in key order
        // (LockRows above the Sort), before `u` updates them: two batches over overlapping keys
        // lock in one order. `i` inserts the keys `u` did not find, in key order.
        let g_b = format!("(l.lease_until <= c.now OR l.{owner} = b.o{cast})");
        let (ttl_b_u, ttl_b_val) = if seed {
            (String::new(), "")
        } else {
            (
                format!(
                    ", ttl_ms = CASE WHEN {g_b} THEN b.ttl_ms ELSE l.ttl_ms END, \
                     wake = CASE WHEN {g_b} THEN l.wake ELSE 1 END"
                ),
                ", b.ttl_ms",
            )
        };
        let acquire_many = format!(
            "WITH {c_now}, \
             b AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS b(k, o, ttl_ms)), \
             lk AS MATERIALIZED (SELECT l.resource_key FROM {table} AS l \
               WHERE l.resource_key = ANY($1::text[]) ORDER BY l.resource_key FOR UPDATE), \
             u AS (UPDATE {table} AS l \
               SET {owner} = CASE WHEN {g_b} THEN b.o{cast} ELSE l.{owner} END, \
                   lease_until = CASE WHEN {g_b} \
                     THEN c.now + b.ttl_ms * interval '1 millisecond' ELSE l.lease_until END, \
                   fencing_token = CASE WHEN {g_b} \
                     THEN greatest(l.fencing_token + 1, {clock_us}) ELSE l.fencing_token END\
                   {ttl_b_u} \
               FROM c, b, lk WHERE l.resource_key = b.k AND lk.resource_key = b.k \
               RETURNING l.resource_key, {owner_out}, l.fencing_token, {ttl_out}, \
                 ceil(extract(epoch FROM l.lease_until - c.now) * 1000000)::bigint AS remaining_us), \
             i AS (INSERT INTO {table} AS l (resource_key, {owner}, lease_until, fencing_token{ttl_col}) \
               SELECT b.k, b.o{cast}, c.now + b.ttl_ms * interval '1 millisecond', 1{ttl_b_val} \
               FROM b, c WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.resource_key = b.k) \
               ORDER BY b.k \
               ON CONFLICT (resource_key) DO UPDATE \
                 SET {owner} = CASE WHEN {g_i} THEN excluded.{owner} ELSE l.{owner} END, \
                     lease_until = CASE WHEN {g_i} THEN excluded.lease_until ELSE l.lease_until END, \
                     fencing_token = CASE WHEN {g_i} \
                       THEN greatest(l.fencing_token + 1, {clock_us}) ELSE l.fencing_token END\
                     {ttl_i} \
               RETURNING l.resource_key, {owner_out}, l.fencing_token, {ttl_out}, \
                 ceil(extract(epoch FROM l.lease_until - (SELECT now FROM c)) * 1000000)::bigint AS remaining_us) \
             SELECT * FROM u UNION ALL SELECT * FROM i"
        );
        let inspect = format!(
            "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now) \
             SELECT {owner_out}, l.fencing_token, {ttl_out}, \
                    CASE WHEN l.lease_until > c.now \
                         THEN ceil(extract(epoch FROM l.lease_until - c.now) * 1000000)::bigint \
                    END AS remaining_us \
             FROM {table} l, c WHERE l.resource_key = $1"
        );
        let inspect_many = format!(
            "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now) \
             SELECT k.ord, {owner_out}, l.fencing_token, {ttl_out}, \
                    CASE WHEN l.lease_until > c.now \
                         THEN ceil(extract(epoch FROM l.lease_until - c.now) * 1000000)::bigint \
                    END AS remaining_us \
             FROM unnest($1::text[]) WITH ORDINALITY AS k(key, ord) CROSS JOIN c \
             LEFT JOIN {table} l ON l.resource_key = k.key \
             ORDER BY k.ord"
        );
        let renew_ttl = if seed { "" } else { ", ttl_ms = $4" };
        let renew = format!(
            "UPDATE {table} \
             SET lease_until = clock_timestamp() + $4::bigint * interval '1 millisecond'{renew_ttl} \
             WHERE resource_key = $1 AND {owner} = $2{cast} AND fencing_token = $3 \
               AND lease_until > clock_timestamp()"
        );
        let many_ttl = if seed { "" } else { ", ttl_ms = b.ttl_ms" };
        let renew_many = format!(
            "UPDATE {table} AS l \
             SET lease_until = clock_timestamp() + b.ttl_ms * interval '1 millisecond'{many_ttl} \
             FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS b(k, o, tok, ttl_ms) \
             WHERE l.resource_key = b.k AND l.{owner} = b.o{cast} AND l.fencing_token = b.tok \
               AND l.lease_until > clock_timestamp() \
             RETURNING l.resource_key, l.fencing_token, b.o"
        );
        // '-infinity' marks a released row: expired for every clock, even one stepped back.
        let release = format!(
            "UPDATE {table} SET lease_until = '-infinity' \
             WHERE resource_key = $1 AND {owner} = $2{cast} AND fencing_token = $3 \
               AND lease_until > clock_timestamp()"
        );
        // The channel is built from the validated table name ([a-z0-9_.:] and hex digits only),
        // so it can be a literal. NOTIFY is sent at commit, and only for a row the UPDATE freed.
        // Library layout: only if an acquire was refused since the last notification (wake = 1,
        // set under the row lock by the refusal; ADR 0017), and the mark is consumed (2: this
        // release notified; 0: no one to notify). The seed's table has no mark: always.
        let channel = t.notify_channel();
        let release_notify = if seed {
            format!(
                "UPDATE {table} SET lease_until = '-infinity' \
                 WHERE resource_key = $1 AND {owner} = $2{cast} AND fencing_token = $3 \
                   AND lease_until > clock_timestamp() \
                 RETURNING pg_notify('{channel}', resource_key)::text"
            )
        } else {
            format!(
                "UPDATE {table} SET lease_until = '-infinity', \
                   wake = CASE WHEN wake = 1 THEN 2 ELSE 0 END \
                 WHERE resource_key = $1 AND {owner} = $2{cast} AND fencing_token = $3 \
                   AND lease_until > clock_timestamp() \
                 RETURNING CASE WHEN wake = 2 THEN pg_notify('{channel}', resource_key)::text END"
            )
        };
        let arm_watch = (!seed).then(|| {
            format!(
                "UPDATE {table} SET wake = 1 WHERE resource_key = $1 \
                 RETURNING fencing_token, lease_until > clock_timestamp() AS held"
            )
        });
        let lock_row = format!(
            "SELECT 1 FROM {table} \
             WHERE resource_key = $1 AND {owner} = $2{cast} AND fencing_token = $3 \
               AND lease_until > clock_timestamp() \
             FOR UPDATE"
        );
        let lock_generation =
            format!("SELECT fencing_token FROM {table} WHERE resource_key = $1 FOR UPDATE");
        let still_valid = format!(
            "SELECT lease_until > clock_timestamp() FROM {table} \
             WHERE resource_key = $1 AND {owner} = $2{cast} AND fencing_token = $3"
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
        // Every statement that decides safety passes a mutation switch point (the identity
        // unless leasehold-core's `mutants` feature is on and a mutant is active).
        let m = mutation::string;
        Statements {
            acquire: m("postgres.acquire", acquire),
            acquire_free: m("postgres.acquire_free", acquire_free),
            acquire_many,
            inspect,
            inspect_many,
            renew: m("postgres.renew", renew),
            renew_many: m("postgres.renew_many", renew_many),
            release: m("postgres.release", release),
            release_notify: m("postgres.release_notify", release_notify),
            arm_watch,
            lock_row: m("postgres.lock_row", lock_row),
            lock_generation,
            still_valid: m("postgres.still_valid", still_valid),
            fence_write: m("postgres.fence_write", fence_write),
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
        let sql = migration(&t, TableLayout::Library);
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
        assert_eq!(
            migration(&TableName::default(), TableLayout::Library),
            MIGRATION
        );
    }

    /// `sql/0001_leases.sql` is the template rendered for the default table. After editing the
    /// template, regenerate it with `LEASE_PG_BLESS=1 cargo test -p leasehold-postgres --lib`.
    #[test]
    fn shipped_file_is_the_rendered_template() {
        let rendered = migration(&TableName::default(), TableLayout::Library);
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

    /// Names are substituted in one pass, so a schema that starts with
    /// `leases` (or contains the other name) stays as given.
    #[test]
    fn names_that_look_like_other_names_are_kept() {
        for (schema, table) in [
            ("leases_app", "jobs"),
            ("public_x", "leases"),
            ("leases", "leases_public"),
        ] {
            let t = TableName::parse(&format!("{schema}.{table}")).unwrap();
            let sql = migration(&t, TableLayout::Library);
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
    fn release_notifies_on_the_tables_channel_only_for_a_marked_row() {
        let s = Statements::new(&TableName::default(), TableLayout::Library);
        assert_eq!(
            s.release_notify,
            "UPDATE \"public\".\"leases\" SET lease_until = '-infinity', \
             wake = CASE WHEN wake = 1 THEN 2 ELSE 0 END \
             WHERE resource_key = $1 AND owner = $2 AND fencing_token = $3 \
             AND lease_until > clock_timestamp() \
             RETURNING CASE WHEN wake = 2 THEN pg_notify('lease:public.leases', resource_key)::text END"
        );
        assert!(!s.release.contains("pg_notify"));
        // A refusal marks the row; a grant keeps the mark for the waiters still waiting.
        assert!(s.acquire.contains(
            "wake = CASE WHEN (l.lease_until <= c.now OR l.owner = $2) THEN l.wake ELSE 1 END"
        ));
        let seed = Statements::new(&TableName::default(), TableLayout::CoordinationLease);
        assert!(
            seed.release_notify
                .ends_with("RETURNING pg_notify('lease:public.leases', resource_key)::text")
        );
        assert!(!seed.acquire.contains("wake"));
    }

    /// The store's first statement is the `UPDATE` of `acquire`, word for word, so
    /// `acquire_free` grants exactly what `acquire`'s UPDATE grants (the same owner, token and
    /// TTL, and the same guard with the statement's receipt time for `c.now`), and does
    /// nothing else: no CASE, no clock CTE, no INSERT, no wake mark.
    #[test]
    fn acquire_free_is_the_grant_of_acquire() {
        for layout in [TableLayout::Library, TableLayout::CoordinationLease] {
            let s = Statements::new(&TableName::default(), layout);
            let (owner, cast) = match layout {
                TableLayout::Library => ("owner", ""),
                TableLayout::CoordinationLease => ("owner_id", "::uuid"),
            };
            let token = "greatest(l.fencing_token + 1, \
                         floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint)";
            assert!(s.acquire.contains(&format!("THEN {token} ELSE")));
            assert!(s.acquire_free.contains(&format!("fencing_token = {token}")));
            let guard = format!("(l.lease_until <= c.now OR l.{owner} = $2{cast})");
            assert!(
                s.acquire
                    .contains(&format!("CASE WHEN {guard} THEN $2{cast} ELSE"))
            );
            assert!(s.acquire_free.contains(&format!("{owner} = $2{cast},")));
            assert!(s.acquire_free.contains(&format!(
                "AND {}",
                guard.replace("c.now", "statement_timestamp()")
            )));
            if layout == TableLayout::Library {
                assert!(s.acquire.contains("THEN $3::bigint ELSE l.ttl_ms END"));
                assert!(s.acquire_free.contains("ttl_ms = $3::bigint"));
            }
            for absent in ["CASE", "WITH", "INSERT", "wake", "c.now"] {
                assert!(
                    !s.acquire_free.contains(absent),
                    "{absent}: {}",
                    s.acquire_free
                );
            }
        }
    }

    #[test]
    fn seed_layout_keeps_the_seed_columns_and_adds_the_floor() {
        let t = TableName::parse("public.coordination_lease").unwrap();
        let sql = migration(&t, TableLayout::CoordinationLease);
        assert!(
            TEMPLATE.matches(LIBRARY_TABLE).count() == 1,
            "the library table is in the template once"
        );
        assert!(sql.contains("owner_id      uuid,"));
        assert!(sql.contains("lease_until   timestamptz NOT NULL DEFAULT '-infinity'"));
        assert!(!sql.contains("ttl_ms        bigint"));
        assert!(sql.contains("\"coordination_lease_token_floor\""));
        assert!(sql.contains("\"public\".\"coordination_lease_fence\""));
        let s = Statements::new(&t, TableLayout::CoordinationLease);
        for stmt in [
            &s.acquire,
            &s.acquire_free,
            &s.inspect,
            &s.renew,
            &s.renew_many,
            &s.release,
            &s.lock_row,
        ] {
            assert!(stmt.contains("owner_id"), "{stmt}");
            assert!(
                !stmt.contains("ttl_ms =") && !stmt.contains(" owner "),
                "{stmt}"
            );
        }
        assert!(s.acquire.contains("$2::uuid") && s.renew_many.contains("b.o::uuid"));
    }
}
