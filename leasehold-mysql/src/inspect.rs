//! Reading keys: [`MysqlLeaseStore`]'s `inspect` and `inspect_many` (one statement per
//! thousand keys), and the decoding of a holder from a row of
//! [`Statements::holder`](crate::protocol::Statements::holder).

use std::collections::HashMap;
use std::time::Duration;

use leasehold_core::backend::{decode_owner, decode_token};
use leasehold_core::{Holder, KeyState, LeaseKey, Result};
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Row};

use crate::MysqlLeaseStore;
use crate::error::{self, BACKEND, ErrCtx};
use crate::protocol::Statements;

/// The most keys one [`Statements::holder_many`] statement reads in `inspect_many`.
const INSPECT_MANY_CHUNK: usize = 1000;

impl MysqlLeaseStore {
    /// [`LeaseStore::inspect`](leasehold_core::LeaseStore::inspect): the key's row, if any.
    pub(crate) async fn key_state(&self, key: &LeaseKey) -> Result<KeyState> {
        let operation = "inspect";
        let c = &self.client;
        let row = c
            .query(operation, async |conn| {
                sqlx::query(AssertSqlSafe(c.sql.holder.as_str()))
                    .bind(key.as_str())
                    .fetch_optional(&mut *conn)
                    .await
            })
            .await?;
        state_from(key, row.as_ref(), operation, c.cx())
    }

    /// [`LeaseStore::inspect_many`](leasehold_core::LeaseStore::inspect_many): the keys' rows
    /// with one [`Statements::holder_many`] statement per [`INSPECT_MANY_CHUNK`] keys, the
    /// chunks one after the other, each bounded by the operation timeout. Input order; a key
    /// given twice is answered twice.
    pub(crate) async fn key_states(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        let operation = "inspect_many";
        let c = &self.client;
        let cx = c.cx();
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(INSPECT_MANY_CHUNK) {
            let text = Statements::with_keys(&c.sql.holder_many, chunk.len());
            let rows = c
                .query(operation, async |conn| {
                    let mut q = sqlx::query(AssertSqlSafe(text.as_str()));
                    for key in chunk {
                        q = q.bind(key.as_str());
                    }
                    q.fetch_all(&mut *conn).await
                })
                .await?;
            let mut by_key: HashMap<Vec<u8>, MySqlRow> = HashMap::with_capacity(rows.len());
            for row in rows {
                let key: Vec<u8> = row
                    .try_get("resource_key")
                    .map_err(|e| error::map(operation, e, cx))?;
                by_key.insert(key, row);
            }
            for key in chunk {
                out.push(state_from(
                    key,
                    by_key.get(key.as_str().as_bytes()),
                    operation,
                    cx,
                )?);
            }
        }
        Ok(out)
    }
}

/// The state of `key` from its row of [`Statements::holder`] or [`Statements::holder_many`]
/// (`None`: the key has no row).
fn state_from(
    key: &LeaseKey,
    row: Option<&MySqlRow>,
    operation: &'static str,
    cx: ErrCtx<'_>,
) -> Result<KeyState> {
    let Some(row) = row else {
        return Ok(KeyState {
            key: key.clone(),
            holder: None,
            last_token: None,
        });
    };
    let map = |e| error::map(operation, e, cx);
    let token: i64 = row.try_get("fencing_token").map_err(map)?;
    let held: bool = row.try_get("held").map_err(map)?;
    let holder = if held {
        Some(holder_from(key, row, operation, cx)?)
    } else {
        None
    };
    Ok(KeyState {
        key: key.clone(),
        holder,
        last_token: Some(decode_token(BACKEND, key.as_str(), token)?),
    })
}

/// Text from a binary column.
fn text(row: &MySqlRow, col: &str) -> std::result::Result<String, sqlx::Error> {
    let bytes: Vec<u8> = row.try_get(col)?;
    String::from_utf8(bytes).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// A holder from a row of [`Statements::holder`](crate::protocol::Statements::holder): the
/// remaining time (at most the TTL) and the TTL (the row's, or the remaining time for rows
/// written by other tools). A column that does not decode is `operation`'s error.
pub(crate) fn holder_from(
    key: &LeaseKey,
    row: &MySqlRow,
    operation: &'static str,
    cx: ErrCtx<'_>,
) -> Result<Holder> {
    let map = |e| error::map(operation, e, cx);
    let owner = text(row, "owner").map_err(map)?;
    let token: i64 = row.try_get("fencing_token").map_err(map)?;
    let ttl_ms: Option<i64> = row.try_get("ttl_ms").map_err(map)?;
    let remaining_us: Option<i64> = row.try_get("remaining_us").map_err(map)?;
    let token = decode_token(BACKEND, key.as_str(), token)?;
    let remaining = Duration::from_micros(
        remaining_us
            .and_then(|us| u64::try_from(us).ok())
            .unwrap_or(0)
            .max(1),
    );
    let (remaining, ttl) = match ttl_ms.map(u64::try_from) {
        Some(Ok(ms)) if ms > 0 => {
            let ttl = Duration::from_millis(ms);
            (remaining.min(ttl), ttl)
        }
        _ => (remaining, remaining),
    };
    Ok(Holder {
        owner: decode_owner(BACKEND, key.as_str(), &owner)?,
        token,
        remaining,
        ttl,
    })
}
