//! Reading keys: [`SqliteLeaseStore`]'s `inspect_many` (one statement for all keys) and the
//! decoding of a key's state from a row.

use leasehold_core::backend::{corrupt, decode_owner, decode_token};
use leasehold_core::{Holder, KeyState, LeaseKey, Result};

use crate::error::BACKEND;
use crate::protocol;
use crate::store::{SqliteLeaseStore, duration_ms};
use crate::watch;

impl SqliteLeaseStore {
    /// [`LeaseStore::inspect_many`](leasehold_core::LeaseStore::inspect_many) (see its docs on [`SqliteLeaseStore`]).
    pub(crate) async fn inspect_batch(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        type Row = (
            i64,
            i64,
            Option<String>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
        );
        let rows: Vec<Row> = sqlx::query_as(protocol::INSPECT_MANY)
            .bind(watch::json_array(keys.iter().map(LeaseKey::as_str)))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(self.tx_map("inspect_many"))?;
        if rows.len() != keys.len() {
            return Err(corrupt(
                BACKEND,
                keys[0].as_str(),
                format_args!("inspect_many: {} rows for {} keys", rows.len(), keys.len()),
            ));
        }
        let mut out = Vec::with_capacity(keys.len());
        for (i, (key, (index, last, owner, token, ttl, remaining))) in
            keys.iter().zip(rows).enumerate()
        {
            if usize::try_from(index).ok() != Some(i) {
                return Err(corrupt(
                    BACKEND,
                    key.as_str(),
                    format_args!("inspect_many: row {i} is for element {index}"),
                ));
            }
            out.push(key_state(key, last, owner, token, ttl, remaining)?);
        }
        Ok(out)
    }
}

/// The state of `key` from a row of [`protocol::INSPECT`] or [`protocol::INSPECT_MANY`]: the
/// highest token (0: none), and the holder row's columns (a holder only while `remaining > 0`).
pub(crate) fn key_state(
    key: &LeaseKey,
    last: i64,
    owner: Option<String>,
    token: Option<i64>,
    ttl: Option<i64>,
    remaining: Option<i64>,
) -> Result<KeyState> {
    let holder = match (owner, token, ttl, remaining) {
        (Some(owner), Some(token), Some(ttl), Some(remaining)) if remaining > 0 => Some(Holder {
            owner: decode_owner(BACKEND, key.as_str(), &owner)?,
            token: decode_token(BACKEND, key.as_str(), token)?,
            remaining: duration_ms(remaining),
            ttl: duration_ms(ttl),
        }),
        _ => None,
    };
    let last_token = if last == 0 {
        None
    } else {
        Some(decode_token(BACKEND, key.as_str(), last)?)
    };
    Ok(KeyState {
        key: key.clone(),
        holder,
        last_token,
    })
}
