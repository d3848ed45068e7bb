//! The batch of [`MysqlLeaseStore`]: `acquire_many`, chunks of requests each decided in one
//! transaction by acquire's own statements, a few chunks at once.

use leasehold_core::backend::RoundedTtl;
use leasehold_core::{AcquireOutcome, AcquireRequest, Result};
use sqlx::mysql::MySqlConnection;
use tokio::time::Instant;

use crate::MysqlLeaseStore;
use crate::client::Client;
use crate::protocol::Statements;
use crate::store::{Acquired, acquire_on, grantable_ttl, outcome};

/// How many requests of an [`acquire_many`](leasehold_core::LeaseStore::acquire_many) one
/// transaction decides: its row locks are held until its commit, and the whole transaction must
/// fit in the operation timeout.
const ACQUIRE_MANY_CHUNK: usize = 250;

/// How many transactions of one [`acquire_many`](leasehold_core::LeaseStore::acquire_many) run
/// at once.
const ACQUIRE_MANY_TXNS: usize = 8;

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
        let mut chunks = batch.chunks(ACQUIRE_MANY_CHUNK);
        let mut in_flight = futures::stream::FuturesOrdered::new();
        loop {
            while in_flight.len() < ACQUIRE_MANY_TXNS {
                match chunks.next() {
                    Some(chunk) => in_flight.push_back(decide_chunk(c, reqs, chunk)),
                    None => break,
                }
            }
            let Some(done) = futures::StreamExt::next(&mut in_flight).await else {
                break;
            };
            let (chunk, sent, found) = done?;
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

/// The requests `chunk` (indexes into `reqs`, in key order, with their rounded TTLs) decided
/// by [`acquire_on`] in one transaction on `conn`.
async fn acquire_chunk(
    conn: &mut MySqlConnection,
    sql: &Statements,
    reqs: &[AcquireRequest],
    chunk: &[(usize, RoundedTtl)],
) -> std::result::Result<Vec<Acquired>, sqlx::Error> {
    use sqlx::Connection;
    let mut tx = conn.begin().await?;
    let mut found = Vec::with_capacity(chunk.len());
    for &(i, ttl) in chunk {
        found.push(acquire_on(&mut tx, sql, &reqs[i], ttl).await?);
    }
    tx.commit().await?;
    Ok(found)
}
