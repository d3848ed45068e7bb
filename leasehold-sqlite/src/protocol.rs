//! **For baselines and tooling: the exact text this backend sends.** Every SQL statement of
//! the crate, the schema included, is here and nowhere else, so a benchmark baseline or a tool
//! that reads the file can use the same text instead of a copy.
//!
//! Four tables, all `STRICT`, and one trigger:
//! - `lease_meta(name, value)`: the schema version ([`SCHEMA_VERSION`]) under
//!   `name = 'schema_version'`.
//! - `lease_holder(key, owner, token, ttl_ms, expires_ms)`: per key, the current or last holder
//!   and **its token, the highest issued for the key** (a grant writes
//!   `max(token of the row, generation) + 1`). Rows are never deleted by this crate: release
//!   sets `expires_ms` to 0, and the next grant overwrites the row.
//! - `lease_generation(key, last_token)`: the token floor of keys whose holder row was deleted
//!   (by hand, or a cleanup job). Written only by the trigger [`CREATE_TRIGGERS`]`[0]` (`BEFORE
//!   DELETE ON lease_holder`), which raises it to the deleted row's token, and never lowered;
//!   files written by schema version 1 also have a row per key ever granted.
//! - `lease_fenced(key, high_water, value, counter, accepted)`: the fenced resource.
//!
//! The highest token of a key is therefore `max(lease_holder.token, lease_generation.last_token)`
//! whoever deletes what row of `lease_holder`; [`CREATE_TRIGGERS`]`[1]` refuses an `UPDATE` that
//! would lower a holder row's token.
//!
//! Times are integer milliseconds since the Unix epoch **by SQLite's clock** ([`NOW_MS`]),
//! which is the host's wall clock; see the crate docs for what that assumes. Parameters are
//! positional (`?1`, `?2`, ...); each statement's docs list them.
//!
//! Every lease operation is one statement in its own (autocommit) transaction: acquire,
//! renew, release, inspect, and [`INSPECT_MANY`] for a batch; SQLite takes the write lock of a
//! writing statement before it runs it (waiting in the busy handler), so a statement sees no
//! other writer. Batched renewals and fenced writes run inside [`BEGIN`]. Connections use WAL
//! journaling, `synchronous = NORMAL` (or `FULL`, see [`CommitSync`](crate::CommitSync)) and the
//! [busy timeout](crate::SqliteOptions::with_busy_timeout).
//!
//! ```
//! use leasehold_sqlite::protocol;
//! assert!(protocol::ACQUIRE.starts_with("INSERT INTO lease_holder"));
//! assert!(protocol::RELEASE.starts_with("UPDATE lease_holder SET expires_ms = 0"));
//! assert!(protocol::ACQUIRE.contains(protocol::NOW_MS));
//! ```

/// The schema version this crate writes and understands. Version 2 (this one) keeps the token
/// in the holder row and writes `lease_generation` only from a trigger; version 1 wrote it on
/// every grant. Opening a version 1 file adds the triggers and records version 2; its tokens
/// continue above the old ones.
pub const SCHEMA_VERSION: i64 = 2;

/// The text of [`NOW_MS`], for `concat!`.
macro_rules! now_ms {
    () => {
        "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)"
    };
}

/// SQLite's current time in whole milliseconds, as an SQL expression. SQLite fixes `'now'` for
/// the duration of one statement, so every use within a statement agrees.
pub const NOW_MS: &str = now_ms!();

/// How batched renewals and fenced writes begin their transaction: the write lock is taken at
/// once, so the reads, the decision and the writes see no other writer.
pub const BEGIN: &str = "BEGIN IMMEDIATE";

/// Acquire: one upsert of the holder row, granted if the key has no row, its holder has expired
/// (or released: `expires_ms = 0`), or the holder is the same owner. Returns one row
/// `(token)` when granted, none when another owner holds the key (then [`HOLDER`] says who).
/// The token is one above both the row's own token and the key's generation, so it is above
/// every token ever issued for the key, whoever deleted what. The write lock is taken before
/// the statement runs, and `now` is read once inside it, after the lock.
/// `?1` = key, `?2` = owner, `?3` = TTL in ms.
pub const ACQUIRE: &str = concat!(
    "INSERT INTO lease_holder (key, owner, token, ttl_ms, expires_ms) VALUES (?1, ?2, ",
    "coalesce((SELECT last_token FROM lease_generation WHERE key = ?1), 0) + 1, ?3, ",
    now_ms!(),
    " + ?3) ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, ",
    "token = max(lease_holder.token + 1, excluded.token), ttl_ms = excluded.ttl_ms, ",
    "expires_ms = excluded.expires_ms WHERE lease_holder.expires_ms <= ",
    now_ms!(),
    " OR lease_holder.owner = excluded.owner RETURNING token"
);

/// After an [`ACQUIRE`] that granted nothing: the key's holder row, if any, as
/// `(owner, token, ttl_ms, remaining_ms)` (`remaining_ms <= 0`: expired or released since).
/// `?1` = key.
pub const HOLDER: &str = concat!(
    "SELECT owner, token, ttl_ms, expires_ms - ",
    now_ms!(),
    " FROM lease_holder WHERE key = ?1"
);

/// Renew: one atomic statement; matches only the same owner and token while unexpired (one row
/// affected: renewed; none: lost). `?1` = key, `?2` = owner, `?3` = token, `?4` = TTL in ms.
pub const RENEW: &str = concat!(
    "UPDATE lease_holder SET ttl_ms = ?4, expires_ms = ",
    now_ms!(),
    " + ?4 WHERE key = ?1 AND owner = ?2 AND token = ?3 AND expires_ms > ",
    now_ms!()
);

/// Release: one atomic statement; ends the lease of the same owner and token while unexpired
/// (one row affected: released; none: not held) by setting its expiry to 0. The row, and with it
/// the key's token, stays. `?1` = key, `?2` = owner, `?3` = token.
pub const RELEASE: &str = concat!(
    "UPDATE lease_holder SET expires_ms = 0 WHERE key = ?1 AND owner = ?2 AND token = ?3 ",
    "AND expires_ms > ",
    now_ms!()
);

/// Inspect: one statement, so the holder and the generation are read from one snapshot; one row
/// `(last_token, owner?, token?, ttl_ms?, remaining_ms?)`: `last_token` is
/// `max(generation, holder row's token)` (0: never granted); the holder columns are those of the
/// row, expired or not (`remaining_ms <= 0`: no holder). `?1` = key.
pub const INSPECT: &str = concat!(
    "SELECT max(coalesce((SELECT last_token FROM lease_generation WHERE key = ?1), 0), ",
    "coalesce(h.token, 0)), h.owner, h.token, h.ttl_ms, h.expires_ms - ",
    now_ms!(),
    " FROM (SELECT 1) LEFT JOIN lease_holder h ON h.key = ?1"
);

/// Inspect of many keys: one statement (one snapshot, one `now`) over a JSON array of keys, one
/// row per element **in the array's order**, duplicates included:
/// `(index, last_token, owner?, token?, ttl_ms?, remaining_ms?)`, as [`INSPECT`]'s row after
/// the element's index. `?1` = the keys as a JSON array of strings.
pub const INSPECT_MANY: &str = concat!(
    "SELECT j.key, max(coalesce(g.last_token, 0), coalesce(h.token, 0)), h.owner, h.token, ",
    "h.ttl_ms, h.expires_ms - ",
    now_ms!(),
    " FROM json_each(?1) AS j LEFT JOIN lease_holder h ON h.key = j.value ",
    "LEFT JOIN lease_generation g ON g.key = j.value ORDER BY j.key"
);

/// The watch poller's probe: changes whenever *another* connection commits to the file.
pub const DATA_VERSION: &str = "PRAGMA data_version";

/// The watch poller's filter after a change: which of the watched keys (`?1`, a JSON array of
/// keys) have no unexpired holder now. One read; only those keys' watchers are woken.
pub const FREE_KEYS: &str = concat!(
    "SELECT j.value FROM json_each(?1) AS j WHERE NOT EXISTS ",
    "(SELECT 1 FROM lease_holder h WHERE h.key = j.value AND h.expires_ms > ",
    now_ms!(),
    ")"
);

/// The fenced resource's row of a key, `(high_water, value, counter, accepted)`, if any.
/// `?1` = key.
pub const SELECT_FENCED: &str =
    "SELECT high_water, value, counter, accepted FROM lease_fenced WHERE key = ?1";

/// A fenced write or install, inside [`BEGIN`] after [`SELECT_FENCED`]. `?1` = key,
/// `?2` = high-water token, `?3` = value, `?4` = counter, `?5` = accepted writes.
pub const UPSERT_FENCED: &str = "INSERT INTO lease_fenced (key, high_water, value, counter, accepted) VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (key) DO UPDATE SET high_water = excluded.high_water, value = excluded.value, \
     counter = excluded.counter, accepted = excluded.accepted";

/// Creates the schema-version table (first step of the migration).
pub const CREATE_META: &str = "CREATE TABLE IF NOT EXISTS lease_meta (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) STRICT";

/// Creates the lease tables, if missing (after [`CREATE_META`] and the version check).
pub const CREATE_TABLES: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS lease_generation (
        key TEXT PRIMARY KEY NOT NULL,
        last_token INTEGER NOT NULL CHECK (last_token > 0)
    ) STRICT",
    "CREATE TABLE IF NOT EXISTS lease_holder (
        key TEXT PRIMARY KEY NOT NULL,
        owner TEXT NOT NULL,
        token INTEGER NOT NULL CHECK (token > 0),
        ttl_ms INTEGER NOT NULL CHECK (ttl_ms > 0),
        expires_ms INTEGER NOT NULL
    ) STRICT",
    "CREATE TABLE IF NOT EXISTS lease_fenced (
        key TEXT PRIMARY KEY NOT NULL,
        high_water INTEGER NOT NULL CHECK (high_water > 0),
        value BLOB,
        counter INTEGER NOT NULL DEFAULT 0,
        accepted INTEGER NOT NULL DEFAULT 0 CHECK (accepted >= 0)
    ) STRICT",
];

/// The triggers that keep a key's token from going back, if missing (after [`CREATE_TABLES`]):
/// - `lease_holder_keeps_token`: **before a holder row is deleted**, by anyone (a cleanup job, an
///   operator, `DELETE FROM lease_holder`), its token is moved into `lease_generation` (raised,
///   never lowered), so the next grant of the key is above it. A trigger also turns off SQLite's
///   truncate optimisation, so an unconditional `DELETE` fires it row by row.
/// - `lease_holder_token_only_grows`: an `UPDATE` that would lower a holder row's token is
///   refused (`RAISE(ABORT)`); the crate's own statements only raise it.
pub const CREATE_TRIGGERS: [&str; 2] = [
    "CREATE TRIGGER IF NOT EXISTS lease_holder_keeps_token BEFORE DELETE ON lease_holder
     BEGIN
        INSERT INTO lease_generation (key, last_token) VALUES (old.key, old.token)
        ON CONFLICT (key) DO UPDATE SET last_token = max(last_token, excluded.last_token);
     END",
    "CREATE TRIGGER IF NOT EXISTS lease_holder_token_only_grows
     BEFORE UPDATE OF token ON lease_holder WHEN new.token < old.token
     BEGIN
        SELECT RAISE(ABORT, 'lease_holder: a token may not go back');
     END",
];

/// The schema version of the file, if it has one.
pub const SELECT_SCHEMA_VERSION: &str =
    "SELECT value FROM lease_meta WHERE name = 'schema_version'";

/// Records the schema version: sets it on a new file, raises it on an older one (never lowers
/// it). `?1` = [`SCHEMA_VERSION`].
pub const UPSERT_SCHEMA_VERSION: &str = "INSERT INTO lease_meta (name, value) VALUES ('schema_version', ?1) \
     ON CONFLICT (name) DO UPDATE SET value = excluded.value WHERE value < excluded.value";
