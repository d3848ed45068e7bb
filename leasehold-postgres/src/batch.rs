//! The batches of [`PostgresLeaseStore`]: `acquire_many` and `renew_many`, each one statement
//! over arrays of keys (one round trip, one transaction).

use std::time::Duration;

use leasehold_core::{AcquireOutcome, AcquireRequest, Error, Lease, RenewOutcome, Result};
use sqlx::AssertSqlSafe;
use tokio::time::Instant;

use crate::PostgresLeaseStore;
use crate::error::BACKEND;
use crate::inspect::column;
use crate::store::{acquired_from_row, grantable_ttl};

impl PostgresLeaseStore {
    /// [`LeaseStore::acquire_many`](leasehold_core::LeaseStore::acquire_many) (see its docs on
    /// [`PostgresLeaseStore`]).
    pub(crate) async fn acquire_batch(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<Vec<Result<AcquireOutcome>>> {
        leasehold_core::store::validate_acquire_many(reqs)?;
        let mut slots: Vec<Option<Result<AcquireOutcome>>> = Vec::with_capacity(reqs.len());
        let mut batch = Vec::with_capacity(reqs.len());
        for (i, req) in reqs.iter().enumerate() {
            match grantable_ttl(req.ttl).and_then(|ttl| self.check_owner(&req.owner).map(|()| ttl))
            {
                Ok(ttl) => {
                    batch.push((req.key.as_str(), i, ttl));
                    slots.push(None);
                }
                Err(e) => slots.push(Some(Err(e))),
            }
        }
        if batch.is_empty() {
            return Ok(slots.into_iter().flatten().collect());
        }
        batch.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let keys: Vec<&str> = batch.iter().map(|b| b.0).collect();
        let owners: Vec<&str> = batch.iter().map(|b| reqs[b.1].owner.as_str()).collect();
        let ttls: Vec<i64> = batch.iter().map(|b| b.2.as_i64()).collect();
        let sent = Instant::now();
        let c = &self.client;
        let rows = c
            .query("acquire", async |conn| {
                sqlx::query(AssertSqlSafe(c.sql.acquire_many.as_str()))
                    .bind(&keys)
                    .bind(&owners)
                    .bind(&ttls)
                    .fetch_all(&mut *conn)
                    .await
            })
            .await?;
        let operation = "acquire";
        let cx = c.cx();
        let index: std::collections::HashMap<&str, usize> =
            batch.iter().enumerate().map(|(j, b)| (b.0, j)).collect();
        let mut seen = vec![false; batch.len()];
        for row in &rows {
            let key: String = column(row, "resource_key", operation, cx)?;
            let Some(&j) = index.get(key.as_str()) else {
                return Err(Error::store_fault(
                    BACKEND,
                    format!("acquire_many: a row for {key:?}, which the batch did not ask for"),
                    None,
                ));
            };
            if std::mem::replace(&mut seen[j], true) {
                return Err(Error::store_fault(
                    BACKEND,
                    format!("acquire_many: two rows for {key:?}"),
                    None,
                ));
            }
            let (_, i, ttl) = batch[j];
            slots[i] = Some(acquired_from_row(
                &reqs[i],
                row,
                ttl.granted(),
                sent,
                operation,
                cx,
            ));
        }
        if let Some(j) = seen.iter().position(|s| !s) {
            return Err(Error::store_fault(
                BACKEND,
                format!("acquire_many: no row for {:?}", batch[j].0),
                None,
            ));
        }
        Ok(slots.into_iter().flatten().collect())
    }

    /// [`LeaseStore::renew_many`](leasehold_core::LeaseStore::renew_many) (see its docs on
    /// [`PostgresLeaseStore`]).
    pub(crate) async fn renew_batch(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        let mut slots: Vec<Option<Result<RenewOutcome>>> = Vec::with_capacity(leases.len());
        let (mut keys, mut owners, mut tokens, mut ttls) = (vec![], vec![], vec![], vec![]);
        let mut granted = Vec::with_capacity(leases.len());
        for lease in leases {
            match grantable_ttl(lease.ttl())
                .and_then(|ttl| self.check_owner(lease.owner()).map(|()| ttl))
            {
                Ok(ttl) => {
                    keys.push(lease.key().as_str().to_string());
                    owners.push(lease.owner().as_str().to_string());
                    tokens.push(lease.token().to_i64());
                    ttls.push(ttl.as_i64());
                    granted.push(ttl.granted());
                    slots.push(None);
                }
                Err(e) => {
                    granted.push(Duration::ZERO);
                    slots.push(Some(Err(e)));
                }
            }
        }
        if keys.is_empty() {
            return Ok(slots.into_iter().flatten().collect());
        }
        let sent = Instant::now();
        let c = &self.client;
        let rows = c
            .query("renew", async |conn| {
                sqlx::query(AssertSqlSafe(c.sql.renew_many.as_str()))
                    .bind(&keys)
                    .bind(&owners)
                    .bind(&tokens)
                    .bind(&ttls)
                    .fetch_all(&mut *conn)
                    .await
            })
            .await?;
        let mut renewed = std::collections::HashSet::with_capacity(rows.len());
        for row in rows {
            let operation = "renew";
            let cx = c.cx();
            let key: String = column(&row, 0, operation, cx)?;
            let token: i64 = column(&row, 1, operation, cx)?;
            let owner: String = column(&row, 2, operation, cx)?;
            renewed.insert((key, owner, token));
        }
        Ok(leases
            .iter()
            .zip(granted)
            .zip(slots)
            .map(|((lease, ttl), slot)| {
                slot.unwrap_or_else(|| {
                    // Key, owner and token: a lease of another owner with the same key and
                    // token in the same batch was not renewed by this row.
                    let id = (
                        lease.key().as_str().to_string(),
                        lease.owner().as_str().to_string(),
                        lease.token().to_i64(),
                    );
                    if renewed.contains(&id) {
                        tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
                        Ok(RenewOutcome::Renewed(lease.renewed(ttl, sent)))
                    } else {
                        tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "renew refused: lease lost");
                        Ok(RenewOutcome::Lost)
                    }
                })
            })
            .collect())
    }
}
