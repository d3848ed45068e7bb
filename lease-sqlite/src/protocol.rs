//! **For baselines and tooling: the exact text this backend sends.** Every SQL statement of
//! the crate, the schema included, is here and nowhere else, so a benchmark baseline or a tool
//! that reads the file can use the same text instead of a copy.
//!
//! Four tables, all `STRICT`:
//! - `lease_meta(name, value)`: the schema version ([`SCHEMA_VERSION`]) under
//!   `name = 'schema_version'`.
//! - `lease_generation(key, last_token)`: the highest token ever issued per key. Rows are only
//!   inserted or increased, never deleted by this crate, so tokens never go back, even if
//!   someone deletes lease rows by hand.
//! - `lease_holder(key, owner, token, ttl_ms, expires_ms)`: the current (or last, possibly
//!   expired) holder. Release deletes the row; an expired row is overwritten by the next grant.
//! - `lease_fenced(key, high_water, value, counter, accepted)`: the fenced resource.
//!
//! Times are integer milliseconds since the Unix epoch **by SQLite's clock** ([`NOW_MS`]),
//! which is the host's wall clock; see the crate docs for what that assumes. Parameters are
//! positional (`?1`, `?2`, ...); each statement's docs list them.
//!
//! Acquire and fenced writes run inside [`BEGIN`]; renew, release and inspect are single
//! statements. Connections use WAL journaling, `synchronous = NORMAL` (or `FULL`, see
//! [`CommitSync`](crate::CommitSync)) and the [busy timeout](crate::SqliteOptions::busy_timeout).
//!
//! ```
//! use lease_sqlite::protocol;
//! assert!(protocol::RELEASE.starts_with("DELETE FROM lease_holder"));
//! assert!(protocol::ACQUIRE_READ.contains(protocol::NOW_MS));
//! ```

/// The schema version this crate writes and understands.
pub const SCHEMA_VERSION: i64 = 1;

/// The text of [`NOW_MS`], for `concat!`.
macro_rules! now_ms {
    () => {
        "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)"
    };
}

/// SQLite's current time in whole milliseconds, as an SQL expression. SQLite fixes `'now'` for
/// the duration of one statement, so every use within a statement agrees.
pub const NOW_MS: &str = now_ms!();

/// How acquire and fenced writes begin their transaction: the write lock is taken at once, so
/// the read, the decision and the writes see no other writer.
pub const BEGIN: &str = "BEGIN IMMEDIATE";

/// Acquire's one read, inside its [`BEGIN`] transaction: SQLite's `now`, the key's generation,
/// and its holder row (expired or not), as one row
/// `(now_ms, last_token?, owner?, token?, ttl_ms?, expires_ms?)`. `?1` = key.
pub const ACQUIRE_READ: &str = concat!(
    "SELECT ",
    now_ms!(),
    ", (SELECT last_token FROM lease_generation WHERE key = ?1), ",
    "h.owner, h.token, h.ttl_ms, h.expires_ms FROM (SELECT 1) LEFT JOIN lease_holder h ON h.key = ?1"
);

/// Acquire's first write: the key's new generation. `?1` = key, `?2` = the new token (above
/// the generation and any holder row read by [`ACQUIRE_READ`]).
pub const UPSERT_GENERATION: &str = "INSERT INTO lease_generation (key, last_token) VALUES (?1, ?2) \
     ON CONFLICT (key) DO UPDATE SET last_token = excluded.last_token";

/// Acquire's second write: the new holder. `?1` = key, `?2` = owner, `?3` = token,
/// `?4` = TTL in ms, `?5` = expiry in ms (`now_ms` of [`ACQUIRE_READ`] + TTL).
pub const UPSERT_HOLDER: &str = "INSERT INTO lease_holder (key, owner, token, ttl_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = excluded.token, \
     ttl_ms = excluded.ttl_ms, expires_ms = excluded.expires_ms";

/// Renew: one atomic statement; matches only the same owner and token while unexpired (one row
/// affected: renewed; none: lost). `?1` = key, `?2` = owner, `?3` = token, `?4` = TTL in ms.
pub const RENEW: &str = concat!(
    "UPDATE lease_holder SET ttl_ms = ?4, expires_ms = ",
    now_ms!(),
    " + ?4 WHERE key = ?1 AND owner = ?2 AND token = ?3 AND expires_ms > ",
    now_ms!()
);

/// Release: one atomic statement; deletes only the same owner and token while unexpired (one
/// row affected: released; none: not held). `?1` = key, `?2` = owner, `?3` = token.
pub const RELEASE: &str = concat!(
    "DELETE FROM lease_holder WHERE key = ?1 AND owner = ?2 AND token = ?3 AND expires_ms > ",
    now_ms!()
);

/// Inspect: one statement, so the holder and the generation are read from one snapshot; one row
/// `(last_token?, owner?, token?, ttl_ms?, remaining_ms?)`, the holder columns `NULL` unless
/// unexpired. `?1` = key.
pub const INSPECT: &str = concat!(
    "SELECT (SELECT last_token FROM lease_generation WHERE key = ?1), h.owner, h.token, h.ttl_ms, ",
    "h.expires_ms - ",
    now_ms!(),
    " FROM (SELECT 1) LEFT JOIN lease_holder h ON h.key = ?1 AND h.expires_ms > ",
    now_ms!()
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

/// The schema version of the file, if it has one.
pub const SELECT_SCHEMA_VERSION: &str =
    "SELECT value FROM lease_meta WHERE name = 'schema_version'";

/// Records the schema version of a new file. `?1` = [`SCHEMA_VERSION`].
pub const INSERT_SCHEMA_VERSION: &str = "INSERT INTO lease_meta (name, value) VALUES ('schema_version', ?1) ON CONFLICT (name) DO NOTHING";
