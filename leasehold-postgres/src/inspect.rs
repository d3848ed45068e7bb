//! Reading keys: [`PostgresLeaseStore`]'s `inspect`, `inspect_many` (one statement for all keys)
//! and the decoding of a holder from a row.

use std::time::Duration;

use leasehold_core::backend::{decode_owner, decode_token};
use leasehold_core::{Error, FencingToken, Holder, KeyState, LeaseKey, Result};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};

use crate::PostgresLeaseStore;
use crate::error::{self, BACKEND, ErrCtx};

impl PostgresLeaseStore {
    pub(crate) async fn holder(
        &self,
        key: &LeaseKey,
    ) -> Result<(Option<Holder>, Option<FencingToken>)> {
        let c = &self.client;
        let row = c
            .query("inspect", async |conn| {
                sqlx::query(AssertSqlSafe(c.sql.inspect.as_str()))
                    .bind(key.as_str())
                    .fetch_optional(&mut *conn)
                    .await
            })
            .await?;
        match row {
            Some(row) => state_from_row(key, &row, "inspect", c.cx()),
            None => Ok((None, None)),
        }
    }

    /// [`LeaseStore::inspect_many`](leasehold_core::LeaseStore::inspect_many) (see its docs on
    /// [`PostgresLeaseStore`]).
    pub(crate) async fn inspect_batch(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<&str> = keys.iter().map(LeaseKey::as_str).collect();
        let c = &self.client;
        let rows = c
            .query("inspect", async |conn| {
                sqlx::query(AssertSqlSafe(c.sql.inspect_many.as_str()))
                    .bind(&names)
                    .fetch_all(&mut *conn)
                    .await
            })
            .await?;
        if rows.len() != keys.len() {
            return Err(Error::store_fault(
                BACKEND,
                format!("inspect_many: {} rows for {} keys", rows.len(), keys.len()),
                None,
            ));
        }
        keys.iter()
            .zip(&rows)
            .map(|(key, row)| {
                let (holder, last_token) = state_from_row(key, row, "inspect", c.cx())?;
                Ok(KeyState {
                    key: key.clone(),
                    holder,
                    last_token,
                })
            })
            .collect()
    }
}

/// The holder (if unexpired) and last token of `key` from a row of `inspect` or `inspect_many`
/// (a NULL token: no row).
fn state_from_row(
    key: &LeaseKey,
    row: &sqlx::postgres::PgRow,
    operation: &'static str,
    cx: ErrCtx<'_>,
) -> Result<(Option<Holder>, Option<FencingToken>)> {
    let token: Option<i64> = column(row, "fencing_token", operation, cx)?;
    let Some(token) = token else {
        return Ok((None, None));
    };
    let owner: Option<String> = column(row, "owner", operation, cx)?;
    let ttl_ms: Option<i64> = column(row, "ttl_ms", operation, cx)?;
    let remaining_us: Option<i64> = column(row, "remaining_us", operation, cx)?;
    let token = decode_token(BACKEND, key.as_str(), token)?;
    let holder = match remaining_us {
        Some(_) => Some(holder_from(key, owner, token, ttl_ms, remaining_us)?),
        None => None,
    };
    Ok((holder, Some(token)))
}

/// A holder from a row: the remaining time (at most the TTL) and the TTL (the row's, or the
/// remaining time for rows written by other tools).
pub(crate) fn holder_from(
    key: &LeaseKey,
    owner: Option<String>,
    token: FencingToken,
    ttl_ms: Option<i64>,
    remaining_us: Option<i64>,
) -> Result<Holder> {
    let remaining = Duration::from_micros(
        remaining_us
            .and_then(|us| u64::try_from(us).ok())
            .unwrap_or(0)
            .max(1),
    );
    let (remaining, ttl) = match ttl_ms.map(u64::try_from) {
        Some(Ok(ms)) => {
            let ttl = Duration::from_millis(ms);
            (remaining.min(ttl), ttl)
        }
        _ => (remaining, remaining),
    };
    let owner = decode_owner(BACKEND, key.as_str(), owner.as_deref().unwrap_or_default())?;
    Ok(Holder {
        owner,
        token,
        remaining,
        ttl,
    })
}

/// Column `index` of `row`; a failure to decode it is mapped as `operation`'s.
pub(crate) fn column<'r, T, I>(
    row: &'r PgRow,
    index: I,
    operation: &'static str,
    cx: ErrCtx<'_>,
) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    I: sqlx::ColumnIndex<PgRow>,
{
    row.try_get(index).map_err(|e| error::map(operation, e, cx))
}
