//! [`SqliteLeaseStore`]: the [`LeaseStore`] on one SQLite file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_core::{
    AcquireOutcome, AcquireRequest, Capabilities, ExpiryClock, FencingToken, Holder, KeyState,
    Lease, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result, TokenDurability,
    validate_ttl,
};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tokio::time::Instant;

use crate::config::{self, SqliteOptions};
use crate::error::{self, BACKEND, corrupt};
use crate::fenced::SqliteFencedResource;
use crate::gate::{self, Gate};
use crate::sql;

/// A [`LeaseStore`] on one SQLite database file, shared by any number of processes **on one
/// host**.
///
/// - Every operation is one atomic statement (renew, release, inspect) or one
///   `BEGIN IMMEDIATE` transaction (acquire), so processes never interleave inside one.
/// - The file is in WAL mode with a busy timeout, so concurrent processes wait for each other
///   instead of failing with `SQLITE_BUSY`.
/// - Tokens live in their own table that only grows: they are [durable](TokenDurability::Durable)
///   across restarts, releases, expiry and deleted lease rows.
/// - Expiry is judged by SQLite's clock (the host's wall clock) inside each statement.
///
/// A store is a cheap, cloneable handle over a small connection pool. Open one per process (or
/// more, they are independent clients).
///
/// ```no_run
/// use std::time::Duration;
/// use lease_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
/// use lease_sqlite::SqliteLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// let store = SqliteLeaseStore::connect("sqlite:///var/lib/myapp/leases.db").await?;
/// let req = AcquireRequest::new(LeaseKey::new("nightly-report")?, OwnerId::random(), Duration::from_secs(30));
/// match store.acquire(&req).await? {
///     AcquireOutcome::Acquired(lease) => println!("ours, token {}", lease.token()),
///     AcquireOutcome::Held(h) => println!("held by {} for {:?}", h.owner, h.remaining),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteLeaseStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: SqlitePool,
    pub(crate) path: PathBuf,
    pub(crate) busy_timeout: Duration,
    /// This process's FIFO queue of writers to the file (see `gate.rs`).
    pub(crate) gate: Gate,
}

impl Inner {
    pub(crate) fn map(
        &self,
        operation: &'static str,
    ) -> impl Fn(sqlx::Error) -> lease_core::Error + '_ {
        move |e| error::map(operation, self.busy_timeout, e)
    }
}

impl SqliteLeaseStore {
    /// Opens (creating if needed) the database file at `path` with default [`SqliteOptions`],
    /// and creates the schema if it is missing.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
    /// let store = lease_sqlite::SqliteLeaseStore::open("/tmp/leases.db").await?;
    /// assert!(store.path().ends_with("leases.db"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`](lease_core::Error::Config) if the directory does not exist, the path is
    /// a directory, or the file is not a database (or has a newer schema);
    /// [`Error::Timeout`](lease_core::Error::Timeout) if other processes held the write lock for
    /// the whole busy timeout while the schema was created.
    ///
    /// # Cancellation safety
    /// Cancel safe: dropping the future closes whatever was opened; the schema is created in one
    /// transaction that either commits or rolls back.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Like [`open`](Self::open), with explicit options.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    ///
    /// # Cancellation safety
    /// As [`open`](Self::open).
    pub async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref();
        Self::establish(SqliteConnectOptions::new().filename(path), options).await
    }

    /// Opens the database named by a `sqlite://PATH` (or `sqlite:PATH`) URL: `sqlite:///abs/x.db`
    /// is absolute, `sqlite://rel/x.db` relative to the working directory. sqlx's query
    /// parameters (`?mode=rw`, ...) are honoured; in-memory databases are refused (other processes
    /// could not share them).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
    /// let store = lease_sqlite::SqliteLeaseStore::connect("sqlite://leases.db").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`](lease_core::Error::Config) for a URL that is not `sqlite:` or names no
    /// file, and everything [`open`](Self::open) reports.
    ///
    /// # Cancellation safety
    /// As [`open`](Self::open).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, SqliteOptions::default()).await
    }

    /// Like [`connect`](Self::connect), with explicit options.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    ///
    /// # Cancellation safety
    /// As [`open`](Self::open).
    pub async fn connect_with(url: &str, options: SqliteOptions) -> Result<Self> {
        Self::establish(config::parse_url(url)?, options).await
    }

    async fn establish(opts: SqliteConnectOptions, options: SqliteOptions) -> Result<Self> {
        let path = opts.get_filename().to_path_buf();
        config::check_path(&path)?;
        let opts = config::apply(opts, &options);
        let busy = options.get_busy_timeout();
        let pool_opts = SqlitePoolOptions::new()
            .max_connections(options.get_max_connections())
            .acquire_timeout(busy + Duration::from_secs(5));
        // Switching a fresh file to WAL needs an exclusive lock that SQLite's busy handler does
        // not wait for; when several processes open a new file at once, retry until the busy
        // timeout has passed.
        let deadline = Instant::now() + busy;
        let pool = loop {
            match pool_opts.clone().connect_with(opts.clone()).await {
                Ok(pool) => break pool,
                Err(e) if error::is_busy(&e) && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(5..25))).await;
                }
                Err(e) => return Err(error::map("open", busy, e)),
            }
        };
        let gate = gate::for_file(&path);
        let store = SqliteLeaseStore {
            inner: Arc::new(Inner {
                pool,
                path,
                busy_timeout: busy,
                gate,
            }),
        };
        store.migrate().await?;
        tracing::debug!(backend = BACKEND, path = %store.inner.path.display(), "sqlite lease store opened");
        Ok(store)
    }

    /// Creates the tables if they are missing. Idempotent, and run by every `open`/`connect`;
    /// call it again only if someone dropped the tables underneath a running store.
    ///
    /// # Errors
    /// [`Error::Config`](lease_core::Error::Config) if the file has a newer schema version;
    /// [`Error::Timeout`](lease_core::Error::Timeout) if the write lock was busy throughout.
    ///
    /// # Cancellation safety
    /// Cancel safe: one transaction that commits or rolls back.
    pub async fn migrate(&self) -> Result<()> {
        let _turn = self.inner.gate.lock().await;
        sql::migrate(&self.inner.pool, self.inner.busy_timeout).await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// A [`FencedResource`](lease_core::FencedResource) stored in the same file (table
    /// `lease_fenced`), sharing this store's connections.
    pub fn fenced_resource(&self) -> SqliteFencedResource {
        SqliteFencedResource::new(self.inner.clone())
    }

    /// Closes every connection of this store (and of its clones). Later calls fail with
    /// [`Error::Unavailable`](lease_core::Error::Unavailable).
    ///
    /// # Cancellation safety
    /// Cancel safe: the pool is marked closed at once; dropping the future only stops waiting
    /// for busy connections to come back.
    pub async fn close(&self) {
        self.inner.pool.close().await;
    }

    fn tx_map(&self, operation: &'static str) -> impl Fn(sqlx::Error) -> lease_core::Error + '_ {
        self.inner.map(operation)
    }
}

/// The TTL as whole milliseconds, rounded up (so the granted TTL is never below the request).
fn ttl_ms(ttl: Duration) -> Result<(i64, Duration)> {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    let ms = i64::try_from(ms).map_err(|_| lease_core::Error::InvalidTtl {
        ttl,
        reason: "does not fit in milliseconds".to_string(),
    })?;
    Ok((ms, Duration::from_millis(ms.unsigned_abs())))
}

fn duration_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn token_of(v: i64) -> Result<FencingToken> {
    FencingToken::try_from(v).map_err(|e| corrupt("token", e))
}

fn owner_of(v: &str) -> Result<OwnerId> {
    OwnerId::new(v).map_err(|e| corrupt("owner", e))
}

#[async_trait]
impl LeaseStore for SqliteLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TokenDurability::Durable, ExpiryClock::Server)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        validate_ttl(req.ttl, self.capabilities().min_ttl)?;
        let (ttl_ms, granted) = ttl_ms(req.ttl)?;
        let key = req.key.as_str();
        let map = self.tx_map("acquire");
        let sent = Instant::now();
        // One immediate transaction: the write lock is taken at BEGIN, so the read, the decision
        // and the writes see no other writer, and `now` is read after the lock was obtained.
        let _turn = self.inner.gate.lock().await;
        let mut tx = self
            .inner
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(&map)?;
        let now: i64 = sqlx::query_scalar(sql::SELECT_NOW)
            .fetch_one(&mut *tx)
            .await
            .map_err(&map)?;
        let holder: Option<(String, i64, i64, i64)> = sqlx::query_as(sql::SELECT_HOLDER)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(&map)?;
        if let Some((owner, token, held_ttl, expires)) = &holder
            && *expires > now
            && owner.as_str() != req.owner.as_str()
        {
            let holder = Holder {
                owner: owner_of(owner)?,
                token: token_of(*token)?,
                remaining: duration_ms(expires - now),
                ttl: duration_ms(*held_ttl),
            };
            tx.rollback().await.map_err(&map)?;
            tracing::trace!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %holder.token, holder = %holder.owner, "lease held by another owner");
            return Ok(AcquireOutcome::Held(holder));
        }
        let generation: Option<i64> = sqlx::query_scalar(sql::SELECT_GENERATION)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(&map)?;
        // The next token is above the generation and above any holder row (should someone have
        // deleted generation rows by hand).
        let last = generation.max(holder.as_ref().map(|h| h.1));
        let token = match last {
            Some(v) => token_of(v)?.next()?,
            None => FencingToken::MIN,
        };
        sqlx::query(sql::UPSERT_GENERATION)
            .bind(key)
            .bind(token.to_i64())
            .execute(&mut *tx)
            .await
            .map_err(&map)?;
        sqlx::query(sql::UPSERT_HOLDER)
            .bind(key)
            .bind(req.owner.as_str())
            .bind(token.to_i64())
            .bind(ttl_ms)
            .bind(now.saturating_add(ttl_ms))
            .execute(&mut *tx)
            .await
            .map_err(&map)?;
        tx.commit().await.map_err(&map)?;
        tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, "lease acquired");
        Ok(AcquireOutcome::Acquired(Lease::granted(
            req.key.clone(),
            req.owner.clone(),
            token,
            granted,
            req.drift_margin(),
            sent,
        )))
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        validate_ttl(lease.ttl(), self.capabilities().min_ttl)?;
        let (ttl_ms, granted) = ttl_ms(lease.ttl())?;
        let sent = Instant::now();
        let _turn = self.inner.gate.lock().await;
        let done = sqlx::query(sql::RENEW)
            .bind(lease.key().as_str())
            .bind(lease.owner().as_str())
            .bind(lease.token().to_i64())
            .bind(ttl_ms)
            .execute(&self.inner.pool)
            .await
            .map_err(self.tx_map("renew"))?;
        if done.rows_affected() == 1 {
            tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed");
            Ok(RenewOutcome::Renewed(lease.renewed(granted, sent)))
        } else {
            tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "renew refused: lease lost");
            Ok(RenewOutcome::Lost)
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let _turn = self.inner.gate.lock().await;
        let done = sqlx::query(sql::RELEASE)
            .bind(lease.key().as_str())
            .bind(lease.owner().as_str())
            .bind(lease.token().to_i64())
            .execute(&self.inner.pool)
            .await
            .map_err(self.tx_map("release"))?;
        if done.rows_affected() == 1 {
            tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease released");
            Ok(ReleaseOutcome::Released)
        } else {
            tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "release refused: not held");
            Ok(ReleaseOutcome::NotHeld)
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        type Row = (
            Option<i64>,
            Option<String>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
        );
        let (last, owner, token, ttl, remaining): Row = sqlx::query_as(sql::INSPECT)
            .bind(key.as_str())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(self.tx_map("inspect"))?;
        let holder = match (owner, token, ttl, remaining) {
            (Some(owner), Some(token), Some(ttl), Some(remaining)) => Some(Holder {
                owner: owner_of(&owner)?,
                token: token_of(token)?,
                remaining: duration_ms(remaining),
                ttl: duration_ms(ttl),
            }),
            _ => None,
        };
        let last_token = match (last, &holder) {
            (Some(v), h) => {
                Some(token_of(v)?.max(h.as_ref().map_or(FencingToken::MIN, |h| h.token)))
            }
            (None, Some(h)) => Some(h.token),
            (None, None) => None,
        };
        Ok(KeyState {
            key: key.clone(),
            holder,
            last_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_milliseconds() -> Result<()> {
        assert_eq!(
            ttl_ms(Duration::from_millis(600))?,
            (600, Duration::from_millis(600))
        );
        assert_eq!(
            ttl_ms(Duration::from_micros(600_001))?,
            (601, Duration::from_millis(601))
        );
        assert_eq!(
            ttl_ms(Duration::from_nanos(1))?,
            (1, Duration::from_millis(1))
        );
        Ok(())
    }

    #[test]
    fn negative_times_clamp_to_zero() {
        assert_eq!(duration_ms(-5), Duration::ZERO);
        assert_eq!(duration_ms(1500), Duration::from_millis(1500));
    }
}
