//! The schema and the statements, in one place.
//!
//! Three tables, all `STRICT`:
//! - `lease_generation(key, last_token)`: the highest token ever issued per key. Rows are only
//!   inserted or increased, never deleted by this crate, so tokens never go back, even if
//!   someone deletes lease rows by hand.
//! - `lease_holder(key, owner, token, ttl_ms, expires_ms)`: the current (or last, possibly
//!   expired) holder. Release deletes the row; an expired row is overwritten by the next grant.
//! - `lease_fenced(key, high_water, value, counter, accepted)`: the fenced resource.
//!
//! Times are integer milliseconds since the Unix epoch **by SQLite's clock** (`NOW_MS`), which
//! is the host's wall clock; see the crate docs for what that assumes.

use lease_core::{Error, Result};
use sqlx::SqlitePool;

use crate::error::{self, BACKEND};

/// The schema version this crate writes and understands.
pub(crate) const SCHEMA_VERSION: i64 = 1;

/// SQLite's current time in whole milliseconds. SQLite fixes `'now'` for the duration of one
/// statement, so every use within a statement agrees.
macro_rules! now_ms {
    () => {
        "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)"
    };
}

/// Acquire's one read, inside its immediate transaction: SQLite's `now`, the key's generation,
/// and its holder row (expired or not), as one row.
pub(crate) const ACQUIRE_READ: &str = concat!(
    "SELECT ",
    now_ms!(),
    ", (SELECT last_token FROM lease_generation WHERE key = ?1), ",
    "h.owner, h.token, h.ttl_ms, h.expires_ms FROM (SELECT 1) LEFT JOIN lease_holder h ON h.key = ?1"
);

pub(crate) const UPSERT_GENERATION: &str = "INSERT INTO lease_generation (key, last_token) VALUES (?1, ?2) \
     ON CONFLICT (key) DO UPDATE SET last_token = excluded.last_token";

pub(crate) const UPSERT_HOLDER: &str = "INSERT INTO lease_holder (key, owner, token, ttl_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = excluded.token, \
     ttl_ms = excluded.ttl_ms, expires_ms = excluded.expires_ms";

/// Renew: one atomic statement; matches only the same owner and token while unexpired.
pub(crate) const RENEW: &str = concat!(
    "UPDATE lease_holder SET ttl_ms = ?4, expires_ms = ",
    now_ms!(),
    " + ?4 WHERE key = ?1 AND owner = ?2 AND token = ?3 AND expires_ms > ",
    now_ms!()
);

/// Release: one atomic statement; deletes only the same owner and token while unexpired.
pub(crate) const RELEASE: &str = concat!(
    "DELETE FROM lease_holder WHERE key = ?1 AND owner = ?2 AND token = ?3 AND expires_ms > ",
    now_ms!()
);

/// Inspect: one statement, so the holder and the generation are read from one snapshot.
pub(crate) const INSPECT: &str = concat!(
    "SELECT (SELECT last_token FROM lease_generation WHERE key = ?1), h.owner, h.token, h.ttl_ms, ",
    "h.expires_ms - ",
    now_ms!(),
    " FROM (SELECT 1) LEFT JOIN lease_holder h ON h.key = ?1 AND h.expires_ms > ",
    now_ms!()
);

/// The watch poller's probe: changes whenever *another* connection commits to the file.
pub(crate) const DATA_VERSION: &str = "PRAGMA data_version";

/// The watch poller's filter after a change: which of the watched keys (`?1`, a JSON array of
/// keys) have no unexpired holder now. One read; only those keys' watchers are woken.
pub(crate) const FREE_KEYS: &str = concat!(
    "SELECT j.value FROM json_each(?1) AS j WHERE NOT EXISTS ",
    "(SELECT 1 FROM lease_holder h WHERE h.key = j.value AND h.expires_ms > ",
    now_ms!(),
    ")"
);

pub(crate) const SELECT_FENCED: &str =
    "SELECT high_water, value, counter, accepted FROM lease_fenced WHERE key = ?1";

pub(crate) const UPSERT_FENCED: &str = "INSERT INTO lease_fenced (key, high_water, value, counter, accepted) VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (key) DO UPDATE SET high_water = excluded.high_water, value = excluded.value, \
     counter = excluded.counter, accepted = excluded.accepted";

const CREATE_META: &str = "CREATE TABLE IF NOT EXISTS lease_meta (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) STRICT";

const CREATE_TABLES: [&str; 3] = [
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

/// Creates the tables if they are missing, in one immediate transaction (safe when several
/// processes open a fresh file at once). Idempotent. Refuses a file written by a newer schema.
pub(crate) async fn migrate(pool: &SqlitePool, busy: std::time::Duration) -> Result<()> {
    let map = |e| error::map("migrate", busy, e);
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(map)?;
    sqlx::query(CREATE_META)
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    let found: Option<i64> =
        sqlx::query_scalar("SELECT value FROM lease_meta WHERE name = 'schema_version'")
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?;
    if let Some(v) = found
        && v > SCHEMA_VERSION
    {
        return Err(Error::config(
            BACKEND,
            format!(
                "the database has lease schema version {v}; this build understands up to {SCHEMA_VERSION}"
            ),
            None,
        ));
    }
    for ddl in CREATE_TABLES {
        sqlx::query(ddl).execute(&mut *tx).await.map_err(map)?;
    }
    sqlx::query("INSERT INTO lease_meta (name, value) VALUES ('schema_version', ?1) ON CONFLICT (name) DO NOTHING")
        .bind(SCHEMA_VERSION)
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    tx.commit().await.map_err(map)?;
    Ok(())
}
