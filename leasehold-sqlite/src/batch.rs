//! The batches of [`SqliteLeaseStore`]: `acquire_many` and `renew_many`, each one `BEGIN
//! IMMEDIATE` transaction on the store's write connection.

use std::time::Duration;

use leasehold_core::backend::{corrupt, decode_token, granted_lease};
use leasehold_core::mutation;
use leasehold_core::{AcquireOutcome, AcquireRequest, Lease, RenewOutcome, Result};
use sqlx::Connection;
use tokio::time::Instant;

use crate::error::BACKEND;
use crate::protocol;
use crate::store::{HolderRow, SqliteLeaseStore, holder, upsert};

impl SqliteLeaseStore {
    /// [`LeaseStore::acquire_many`](leasehold_core::LeaseStore::acquire_many) (see its docs on [`SqliteLeaseStore`]).
    pub(crate) async fn acquire_batch(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<Vec<Result<AcquireOutcome>>> {
        leasehold_core::store::validate_acquire_many(reqs)?;
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let map = self.tx_map("acquire_many");
        // Validation first, so the transaction only runs statements.
        let checked: Vec<Result<(i64, Duration)>> = reqs
            .iter()
            .map(|req| {
                self.grantable_ttl(req.ttl)
                    .map(|t| (t.as_i64(), t.granted()))
            })
            .collect();
        let sent = Instant::now();
        let inner = &self.inner;
        let _turn = inner.gate.ordinary().await;
        let mut conn = inner.writer().await.map_err(&map)?;
        let done = async {
            let mut tx = conn.begin_with(protocol::BEGIN).await?;
            let mut decided = Vec::with_capacity(reqs.len());
            for (req, checked) in reqs.iter().zip(&checked) {
                let Ok((ttl_ms, _)) = checked else {
                    decided.push((None, None));
                    continue;
                };
                let (key, owner) = (req.key.as_str(), req.owner.as_str());
                let token = upsert(key, owner, *ttl_ms).fetch_optional(&mut *tx).await?;
                let row = match token {
                    Some(_) => None,
                    None => {
                        sqlx::query_as::<_, HolderRow>(protocol::HOLDER)
                            .bind(key)
                            .fetch_optional(&mut *tx)
                            .await?
                    }
                };
                decided.push((token, row));
            }
            tx.commit().await?;
            Ok(decided)
        }
        .await;
        let decided = inner.check(done).map_err(&map)?;
        let mut out = Vec::with_capacity(reqs.len());
        for ((req, checked), decided) in reqs.iter().zip(checked).zip(decided) {
            let key = req.key.as_str();
            out.push(match (checked, decided) {
                (Err(e), _) => Err(e),
                (Ok((_, granted)), (Some(token), _)) => {
                    let token = decode_token(BACKEND, key, token)?;
                    tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, "lease acquired (batch)");
                    Ok(AcquireOutcome::Acquired(granted_lease(
                        req.key.clone(),
                        req.owner.clone(),
                        token,
                        granted,
                        req.drift_margin(),
                        sent,
                    )))
                }
                // Refused within the write lock: the row is another owner's, unexpired when the
                // upsert ran.
                (Ok(_), (None, Some(row))) if row.0 != req.owner.as_str() => {
                    Ok(AcquireOutcome::Held(holder(key, &row)?))
                }
                (Ok(_), (None, row)) => {
                    return Err(corrupt(
                        BACKEND,
                        key,
                        format_args!("acquire refused, yet the holder row is {row:?}"),
                    ));
                }
            });
        }
        Ok(out)
    }

    /// [`LeaseStore::renew_many`](leasehold_core::LeaseStore::renew_many) (see its docs on [`SqliteLeaseStore`]).
    pub(crate) async fn renew_batch(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let map = self.tx_map("renew_many");
        let sent = Instant::now();
        // Validation first, so the transaction only runs statements.
        let checked: Vec<Result<(i64, Duration)>> = leases
            .iter()
            .map(|lease| {
                self.grantable_ttl(lease.ttl())
                    .map(|t| (t.as_i64(), t.granted()))
            })
            .collect();
        let _turn = self.inner.gate.urgent().await;
        let mut conn = self.inner.writer().await.map_err(&map)?;
        let done = async {
            let mut tx = conn.begin_with(protocol::BEGIN).await?;
            let mut renewed = Vec::with_capacity(leases.len());
            for (lease, checked) in leases.iter().zip(&checked) {
                let Ok((ttl_ms, _)) = checked else {
                    renewed.push(false);
                    continue;
                };
                let done = sqlx::query(mutation::text("sqlite.renew", protocol::RENEW))
                    .bind(lease.key().as_str())
                    .bind(lease.owner().as_str())
                    .bind(lease.token().to_i64())
                    .bind(*ttl_ms)
                    .execute(&mut *tx)
                    .await?;
                renewed.push(done.rows_affected() == 1);
            }
            tx.commit().await?;
            Ok(renewed)
        }
        .await;
        let renewed = self.inner.check(done).map_err(&map)?;
        let mut out = Vec::with_capacity(leases.len());
        for ((lease, checked), renewed) in leases.iter().zip(checked).zip(renewed) {
            out.push(match checked {
                Err(e) => Err(e),
                Ok((_, granted)) if renewed => {
                    tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed (batch)");
                    Ok(RenewOutcome::Renewed(lease.renewed(granted, sent)))
                }
                Ok(_) => {
                    tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "renew refused: lease lost (batch)");
                    Ok(RenewOutcome::Lost)
                }
            });
        }
        Ok(out)
    }
}
