//! The batches of [`MysqlLeaseStore`]:
//! - `acquire_many`: chunks of requests each decided in one transaction, a few chunks at once:
//!   a chunk whose requests share one owner and one TTL by the batch statements (one guarded
//!   `UPDATE`, one `INSERT` of the keys without a row, one read of the rows), any other chunk
//!   request by request with acquire's own statements;
//! - `renew_many`: chunks of leases of one owner and one TTL, each renewed by one guarded
//!   `UPDATE` (and one read when it changed fewer rows than it was sent), a few chunks at once.

use std::collections::{HashMap, HashSet};

use futures::StreamExt;
use leasehold_core::backend::RoundedTtl;
use leasehold_core::{AcquireOutcome, AcquireRequest, Lease, OwnerId, RenewOutcome, Result};
use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::time::Instant;

use crate::MysqlLeaseStore;
use crate::client::Client;
use crate::error::BACKEND;
use crate::protocol::Statements;
use crate::store::{Acquired, acquire_on, grantable_ttl, outcome};

/// How many requests of an [`acquire_many`](leasehold_core::LeaseStore::acquire_many) one
/// transaction decides: its row locks are held until its commit, and the whole transaction must
/// fit in the operation timeout.
const ACQUIRE_MANY_CHUNK: usize = 250;

/// How many chunks (transactions or statements) of one
/// [`acquire_many`](leasehold_core::LeaseStore::acquire_many) or
/// [`renew_many`](leasehold_core::LeaseStore::renew_many) run at once.
const CHUNKS_IN_FLIGHT: usize = 8;

impl MysqlLeaseStore {
    /// [`LeaseStore::acquire_many`](leasehold_core::LeaseStore::acquire_many) (see its docs on
    /// [`MysqlLeaseStore`]).
    pub(crate) async fn acquire_batch(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<Vec<Result<AcquireOutcome>>> {
        leasehold_core::store::validate_acquire_many(reqs)?;
        let mut slots: Vec<Option<Result<AcquireOutcome>>> = Vec::with_capacity(reqs.len());
        let mut batch = Vec::with_capacity(reqs.len());
        for (i, req) in reqs.iter().enumerate() {
            match grantable_ttl(req.ttl) {
                Ok(ttl) => {
                    batch.push((i, ttl));
                    slots.push(None);
                }
                Err(e) => slots.push(Some(Err(e))),
            }
        }
        batch.sort_unstable_by(|a, b| reqs[a.0].key.cmp(&reqs[b.0].key));
        let c = &self.client;
        // Chunks are disjoint and each locks its keys in ascending order, so the transactions
        // in flight at once cannot deadlock each other.
        let chunks: Vec<_> = batch
            .chunks(ACQUIRE_MANY_CHUNK)
            .map(|chunk| decide_chunk(c, reqs, chunk))
            .collect();
        let mut done = futures::stream::iter(chunks).buffered(CHUNKS_IN_FLIGHT);
        while let Some(answer) = done.next().await {
            let (chunk, sent, found) = answer?;
            for (&(i, ttl), found) in chunk.iter().zip(found) {
                slots[i] = Some(outcome(
                    &reqs[i],
                    found,
                    ttl,
                    sent,
                    "lease acquired (batch)",
                    c.cx(),
                ));
            }
        }
        Ok(slots.into_iter().flatten().collect())
    }
}

/// How many leases of a [`renew_many`](leasehold_core::LeaseStore::renew_many) one statement
/// renews (each key is three parameters of at most 65,535).
const RENEW_MANY_CHUNK: usize = 250;

impl MysqlLeaseStore {
    /// [`LeaseStore::renew_many`](leasehold_core::LeaseStore::renew_many) (see its docs on
    /// [`MysqlLeaseStore`]).
    pub(crate) async fn renew_batch(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        let c = &self.client;
        let Some(renew_many) = &c.sql.renew_many else {
            // A mutated single renewal that the batch text cannot be derived from: lease by
            // lease, with that renewal.
            return leasehold_core::backend::renew_one_by_one(self, leases).await;
        };
        let mut slots: Vec<Option<Result<RenewOutcome>>> = Vec::with_capacity(leases.len());
        let mut batch = Vec::with_capacity(leases.len());
        for (i, lease) in leases.iter().enumerate() {
            match grantable_ttl(lease.ttl()) {
                Ok(ttl) => {
                    batch.push((i, ttl));
                    slots.push(None);
                }
                Err(e) => slots.push(Some(Err(e))),
            }
        }
        // One statement renews leases of one owner and one TTL: group them, keys in order
        // within a group (two batches over the same rows lock them in one order).
        batch.sort_unstable_by(|a, b| {
            let (la, lb) = (&leases[a.0], &leases[b.0]);
            (la.owner(), a.1.get(), la.key()).cmp(&(lb.owner(), b.1.get(), lb.key()))
        });
        let mut chunks = Vec::new();
        for group in batch.chunk_by(|a, b| leases[a.0].owner() == leases[b.0].owner() && a.1 == b.1)
        {
            chunks.extend(group.chunks(RENEW_MANY_CHUNK));
        }
        // The chunks' futures made up front (lazy: none runs before the stream polls it), then
        // at most CHUNKS_IN_FLIGHT at once, answered in order.
        let chunks: Vec<_> = chunks
            .into_iter()
            .map(|chunk| renew_chunk(c, renew_many, leases, chunk))
            .collect();
        let mut done = futures::stream::iter(chunks).buffered(CHUNKS_IN_FLIGHT);
        while let Some(answer) = done.next().await {
            let (chunk, sent, renewed) = answer?;
            for (&(i, ttl), renewed) in chunk.iter().zip(renewed) {
                let lease = &leases[i];
                slots[i] = Some(Ok(if renewed {
                    tracing::trace!(backend = BACKEND, key = %lease.key(), token = %lease.token(), "lease renewed (batch)");
                    RenewOutcome::Renewed(lease.renewed(ttl.granted(), sent))
                } else {
                    tracing::debug!(backend = BACKEND, key = %lease.key(), token = %lease.token(), "renew refused: lease lost");
                    RenewOutcome::Lost
                }));
            }
        }
        Ok(slots.into_iter().flatten().collect())
    }
}

/// One chunk of a [`renew_many`](leasehold_core::LeaseStore::renew_many) (leases of one owner
/// and one TTL, in key order) renewed by the statement `renew_many` on a pooled connection,
/// within the operation timeout, run again after a conflict: the chunk, the instant its
/// statement was first sent, and whether each lease was renewed.
///
/// When the statement changed as many rows as it was sent leases, each lease's row was one of
/// them (a row matches one key and one token). Otherwise a read of the owner's unexpired rows
/// among the keys tells which: a row the statement did not change is either not the owner's
/// with that token or expired, and neither becomes unexpired with the same owner and token
/// (a renewal needs it unexpired, a grant writes a greater token). A lease renewed and then
/// released, re-granted or expired before the read reads as lost: never the other way round.
async fn renew_chunk<'a>(
    c: &Client,
    renew_many: &str,
    leases: &[Lease],
    chunk: &'a [(usize, RoundedTtl)],
) -> Result<(&'a [(usize, RoundedTtl)], Instant, Vec<bool>)> {
    let sent = Instant::now();
    let Some(&(first, ttl)) = chunk.first() else {
        return Ok((chunk, sent, Vec::new()));
    };
    let owner = leases[first].owner().as_str();
    let n = chunk.len();
    let keys = || chunk.iter().map(|&(i, _)| leases[i].key().as_str());
    let renewed = c
        .query_retrying("renew", async |conn| {
            let text = Statements::with_keys(renew_many, n);
            let mut q = sqlx::query(AssertSqlSafe(text.as_str()))
                .bind(ttl.as_i64().saturating_mul(1000))
                .bind(ttl.as_i64());
            for k in keys() {
                q = q.bind(k);
            }
            for &(i, _) in chunk {
                q = q
                    .bind(leases[i].key().as_str())
                    .bind(leases[i].token().to_i64());
            }
            let changed = q.bind(owner).execute(&mut *conn).await?.rows_affected();
            if changed == n as u64 {
                return Ok(vec![true; n]);
            }
            let text = Statements::with_keys(&c.sql.renewed_many, n);
            let mut q = sqlx::query(AssertSqlSafe(text.as_str()));
            for k in keys() {
                q = q.bind(k);
            }
            let mut held = HashSet::with_capacity(n);
            for row in q.bind(owner).fetch_all(&mut *conn).await? {
                let key: Vec<u8> = row.try_get("resource_key")?;
                let token: i64 = row.try_get("fencing_token")?;
                held.insert((key, token));
            }
            Ok(chunk
                .iter()
                .map(|&(i, _)| {
                    let lease = &leases[i];
                    held.contains(&(
                        lease.key().as_str().as_bytes().to_vec(),
                        lease.token().to_i64(),
                    ))
                })
                .collect())
        })
        .await?;
    Ok((chunk, sent, renewed))
}

/// One chunk of an [`acquire_many`](leasehold_core::LeaseStore::acquire_many) decided in one
/// transaction on a pooled connection, within the operation timeout, run again after a conflict:
/// the chunk, the instant its transaction was first sent, and what each request found.
async fn decide_chunk<'a>(
    c: &Client,
    reqs: &[AcquireRequest],
    chunk: &'a [(usize, RoundedTtl)],
) -> Result<(&'a [(usize, RoundedTtl)], Instant, Vec<Acquired>)> {
    let sent = Instant::now();
    let found = c
        .query_retrying("acquire", async |conn| {
            acquire_chunk(conn, &c.sql, reqs, chunk).await
        })
        .await?;
    Ok((chunk, sent, found))
}

/// The requests `chunk` (indexes into `reqs`, in key order, with their rounded TTLs) decided in
/// one transaction on `conn`: together ([`grant_together`]) when they share one owner and one
/// TTL and the batch statements exist, else (or when `grant_together` saw a concurrent grant it
/// cannot tell from its own) one by one with [`acquire_on`].
async fn acquire_chunk(
    conn: &mut MySqlConnection,
    sql: &Statements,
    reqs: &[AcquireRequest],
    chunk: &[(usize, RoundedTtl)],
) -> std::result::Result<Vec<Acquired>, sqlx::Error> {
    if let Some(&(first, ttl)) = chunk.first() {
        let owner = &reqs[first].owner;
        if chunk
            .iter()
            .all(|&(i, t)| t == ttl && reqs[i].owner == *owner)
        {
            let mut tx = conn.begin().await?;
            if let Some(found) = grant_together(&mut tx, sql, reqs, chunk, owner, ttl).await? {
                tx.commit().await?;
                return Ok(found);
            }
            tx.rollback().await?;
        }
    }
    let mut tx = conn.begin().await?;
    let mut found = Vec::with_capacity(chunk.len());
    for &(i, ttl) in chunk {
        found.push(acquire_on(&mut tx, sql, &reqs[i], ttl).await?);
    }
    tx.commit().await?;
    Ok(found)
}

/// The requests `chunk`, all of `owner` with `ttl`, decided by the batch statements in the open
/// transaction on `tx`:
///
/// 1. [`acquire_free_many`](Statements::acquire_free_many) grants every key whose row is free
///    or already `owner`'s (the single grant's guard and token, row by row); the rows it
///    changed stay locked until the commit.
/// 2. [`acquire_insert_many`](Statements::acquire_insert_many) inserts the keys that have no
///    row (each above its own floor row and the clock); also locked (skipped when step 1
///    granted every key).
/// 3. [`holder_many`](Statements::holder_many) reads the rows: a row of `owner` is a grant
///    (its token), a row held by another owner a refusal (its holder).
///
/// The rows of `owner` are the rows steps 1 and 2 wrote, unless another transaction granted a
/// key to the same owner between steps 1 and 3 (a key that was held at step 1, then freed and
/// taken): then there are more rows of `owner` than rows written, and `None` says so (the
/// caller rolls back and decides the chunk one by one). A key found neither granted nor held (freed
/// or deleted since step 1) is decided alone by [`acquire_on`], as acquire does after its
/// holder read.
async fn grant_together(
    tx: &mut MySqlConnection,
    sql: &Statements,
    reqs: &[AcquireRequest],
    chunk: &[(usize, RoundedTtl)],
    owner: &OwnerId,
    ttl: RoundedTtl,
) -> std::result::Result<Option<Vec<Acquired>>, sqlx::Error> {
    let (Some(free_many), Some(insert_many)) = (&sql.acquire_free_many, &sql.acquire_insert_many)
    else {
        return Ok(None);
    };
    let n = chunk.len();
    let keys = || chunk.iter().map(|&(i, _)| reqs[i].key.as_str());
    let ttl_us = ttl.as_i64().saturating_mul(1000);
    let text = Statements::with_keys(free_many, n);
    let mut q = sqlx::query(AssertSqlSafe(text.as_str()))
        .bind(owner.as_str())
        .bind(ttl_us)
        .bind(ttl.as_i64());
    for k in keys() {
        q = q.bind(k);
    }
    let updated = q
        .bind(owner.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let mut inserted = 0;
    if updated < n as u64 {
        let text = Statements::with_keys(insert_many, n);
        let mut q = sqlx::query(AssertSqlSafe(text.as_str()))
            .bind(owner.as_str())
            .bind(ttl_us)
            .bind(ttl.as_i64());
        for k in keys() {
            q = q.bind(k);
        }
        inserted = q.execute(&mut *tx).await?.rows_affected();
    }
    let text = Statements::with_keys(&sql.holder_many, n);
    let mut q = sqlx::query(AssertSqlSafe(text.as_str()));
    for k in keys() {
        q = q.bind(k);
    }
    let mut rows: HashMap<Vec<u8>, (MySqlRow, bool)> = HashMap::with_capacity(n);
    let mut mine = 0u64;
    for row in q.fetch_all(&mut *tx).await? {
        let key: Vec<u8> = row.try_get("resource_key")?;
        let owned: Vec<u8> = row.try_get("owner")?;
        let is_mine = owned == owner.as_str().as_bytes();
        mine += u64::from(is_mine);
        rows.insert(key, (row, is_mine));
    }
    if mine != updated + inserted {
        return Ok(None);
    }
    let mut found = Vec::with_capacity(n);
    for &(i, ttl) in chunk {
        let req = &reqs[i];
        found.push(match rows.remove(req.key.as_str().as_bytes()) {
            Some((row, true)) => Acquired::Stored(row.try_get("fencing_token")?),
            Some((row, false)) if row.try_get::<bool, _>("held")? => Acquired::Held(row),
            _ => acquire_on(&mut *tx, sql, req, ttl).await?,
        });
    }
    Ok(Some(found))
}
