//! [`SqliteLeaseStore`]: the [`LeaseStore`] on one SQLite file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_core::{
    AcquireOutcome, AcquireRequest, Capabilities, ExpiryClock, FencingToken, Holder, KeyState,
    KeyWatch, Lease, LeaseKey, LeaseStore, ReleaseOutcome, RenewOutcome, Result, TokenDurability,
};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tokio::time::Instant;

use crate::config::{self, SqliteOptions};
use lease_core::backend::{decode_owner, decode_token, granted_lease, ttl_millis, validate_ttl};

use crate::error::{self, BACKEND, SqliteError};
use crate::fenced::SqliteFencedResource;
use crate::gate::{self, Gate};
use crate::protocol;
use crate::watch::{self, Hub};

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
/// # Watch
/// [`watch`](LeaseStore::watch) is offered unless turned off with
/// [`SqliteOptions::watch`]`(false)`, so a waiting
/// [`Supervisor`](lease_core::supervisor::Supervisor) retries as soon as the key may be free
/// instead of at its backoff. A watch of a key is woken by:
/// - a successful release of that key through any store on the same file **in this process**,
///   right after its commit (all stores of a process on one file share one registry);
/// - a commit by any **other** connection (another process, or a connection that bypasses this
///   crate) after which the key has no unexpired holder. While the file has watchers in this
///   process, one dedicated connection reads `PRAGMA data_version` every
///   [`SqliteOptions::watch_poll_interval`] (25 ms by default) and, when it changed, checks the
///   watched keys with one read. Such a release is therefore noticed within about one interval.
///
/// Limits: an expiry is not a commit and wakes nobody (waiters time their next attempt to the
/// holder's expiry); a key released and granted again within one interval by other processes
/// wakes nobody (the waiter lost that race anyway); hints may be spurious (each is only "look
/// again"). The poller runs only while watches exist and stops when the last one is dropped; it
/// is a task on the runtime of the `watch()` call that started it.
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
    /// This process's watchers of the file (see `watch.rs`).
    pub(crate) hub: Arc<Hub>,
    /// How the watch poller connects: the pool's own options.
    pub(crate) connect: SqliteConnectOptions,
    /// Whether watch is offered, and the poller's interval.
    pub(crate) watch: Option<Duration>,
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
    /// and creates the schema if it is missing. What it adds to [`connect`](Self::connect): any
    /// file system path, including ones a URL cannot spell (not UTF-8, or containing `?`).
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
    /// [`Error::Unavailable`](lease_core::Error::Unavailable) (refused, nothing applied) if other
    /// processes held the write lock for
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
        let hub = watch::for_file(&path);
        let store = SqliteLeaseStore {
            inner: Arc::new(Inner {
                pool,
                path,
                busy_timeout: busy,
                gate,
                hub,
                connect: opts,
                watch: options
                    .get_watch()
                    .then(|| options.get_watch_poll_interval()),
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
    /// [`Error::Unavailable`](lease_core::Error::Unavailable) (refused, nothing applied) if the
    /// write lock was busy throughout.
    ///
    /// # Cancellation safety
    /// Cancel safe: one transaction that commits or rolls back.
    pub async fn migrate(&self) -> Result<()> {
        let _turn = self.inner.gate.ordinary().await;
        migrate(&self.inner.pool, self.inner.busy_timeout).await
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

    /// This process's watch registry of the file.
    #[cfg(test)]
    pub(crate) fn hub(&self) -> &Arc<Hub> {
        &self.inner.hub
    }

    fn tx_map(&self, operation: &'static str) -> impl Fn(sqlx::Error) -> lease_core::Error + '_ {
        self.inner.map(operation)
    }
}

/// Creates the tables if they are missing, in one immediate transaction (safe when several
/// processes open a fresh file at once). Idempotent. Refuses a file written by a newer schema.
async fn migrate(pool: &SqlitePool, busy: Duration) -> Result<()> {
    let map = |e| error::map("migrate", busy, e);
    let mut tx = pool.begin_with(protocol::BEGIN).await.map_err(map)?;
    sqlx::query(protocol::CREATE_META)
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    let found: Option<i64> = sqlx::query_scalar(protocol::SELECT_SCHEMA_VERSION)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map)?;
    if let Some(v) = found
        && v > protocol::SCHEMA_VERSION
    {
        return Err(SqliteError::NewerSchema { found: v }.into());
    }
    for ddl in protocol::CREATE_TABLES {
        sqlx::query(ddl).execute(&mut *tx).await.map_err(map)?;
    }
    sqlx::query(protocol::INSERT_SCHEMA_VERSION)
        .bind(protocol::SCHEMA_VERSION)
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    tx.commit().await.map_err(map)?;
    Ok(())
}

fn duration_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[async_trait]
impl LeaseStore for SqliteLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TokenDurability::Durable, ExpiryClock::Server)
            .with_watch(self.inner.watch.is_some())
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        validate_ttl(req.ttl, self.capabilities().min_ttl)?;
        let ttl = ttl_millis(req.ttl)?;
        let (ttl_ms, granted) = (ttl.as_i64(), ttl.granted());
        let key = req.key.as_str();
        let map = self.tx_map("acquire");
        let sent = Instant::now();
        // One immediate transaction: the write lock is taken at BEGIN, so the read, the decision
        // and the writes see no other writer, and `now` is read after the lock was obtained.
        let _turn = self.inner.gate.ordinary().await;
        let mut tx = self
            .inner
            .pool
            .begin_with(protocol::BEGIN)
            .await
            .map_err(&map)?;
        type Row = (
            i64,
            Option<i64>,
            Option<String>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
        );
        let (now, generation, owner, token, held_ttl, expires): Row =
            sqlx::query_as(protocol::ACQUIRE_READ)
                .bind(key)
                .fetch_one(&mut *tx)
                .await
                .map_err(&map)?;
        let holder = match (owner, token, held_ttl, expires) {
            (Some(owner), Some(token), Some(ttl), Some(expires)) => {
                Some((owner, token, ttl, expires))
            }
            _ => None,
        };
        if let Some((owner, token, held_ttl, expires)) = &holder
            && *expires > now
            && owner.as_str() != req.owner.as_str()
        {
            let holder = Holder {
                owner: decode_owner(BACKEND, key, owner)?,
                token: decode_token(BACKEND, key, *token)?,
                remaining: duration_ms(expires - now),
                ttl: duration_ms(*held_ttl),
            };
            tx.rollback().await.map_err(&map)?;
            tracing::trace!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %holder.token, holder = %holder.owner, "lease held by another owner");
            return Ok(AcquireOutcome::Held(holder));
        }
        // The next token is above the generation and above any holder row (should someone have
        // deleted generation rows by hand).
        let last = generation.max(holder.as_ref().map(|h| h.1));
        let token = match last {
            Some(v) => decode_token(BACKEND, key, v)?.next()?,
            None => FencingToken::MIN,
        };
        sqlx::query(protocol::UPSERT_GENERATION)
            .bind(key)
            .bind(token.to_i64())
            .execute(&mut *tx)
            .await
            .map_err(&map)?;
        sqlx::query(protocol::UPSERT_HOLDER)
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
        Ok(AcquireOutcome::Acquired(granted_lease(
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
        let ttl = ttl_millis(lease.ttl())?;
        let (ttl_ms, granted) = (ttl.as_i64(), ttl.granted());
        let sent = Instant::now();
        let _turn = self.inner.gate.urgent().await;
        let done = sqlx::query(protocol::RENEW)
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

    /// One `BEGIN IMMEDIATE` transaction with one conditional `UPDATE` per lease: a single turn
    /// of the write lock for the whole batch. Leases with an invalid TTL get their error in their
    /// slot and are not sent.
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let min = self.capabilities().min_ttl;
        let map = self.tx_map("renew_many");
        let sent = Instant::now();
        let _turn = self.inner.gate.urgent().await;
        let mut tx = self
            .inner
            .pool
            .begin_with(protocol::BEGIN)
            .await
            .map_err(&map)?;
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            let (ttl_ms, granted) =
                match validate_ttl(lease.ttl(), min).and_then(|()| ttl_millis(lease.ttl())) {
                    Ok(t) => (t.as_i64(), t.granted()),
                    Err(e) => {
                        out.push(Err(e));
                        continue;
                    }
                };
            let done = sqlx::query(protocol::RENEW)
                .bind(lease.key().as_str())
                .bind(lease.owner().as_str())
                .bind(lease.token().to_i64())
                .bind(ttl_ms)
                .execute(&mut *tx)
                .await
                .map_err(&map)?;
            out.push(Ok(if done.rows_affected() == 1 {
                tracing::trace!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease renewed (batch)");
                RenewOutcome::Renewed(lease.renewed(granted, sent))
            } else {
                tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "renew refused: lease lost (batch)");
                RenewOutcome::Lost
            }));
        }
        tx.commit().await.map_err(&map)?;
        Ok(out)
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let _turn = self.inner.gate.urgent().await;
        let done = sqlx::query(protocol::RELEASE)
            .bind(lease.key().as_str())
            .bind(lease.owner().as_str())
            .bind(lease.token().to_i64())
            .execute(&self.inner.pool)
            .await
            .map_err(self.tx_map("release"))?;
        if done.rows_affected() == 1 {
            self.inner.hub.wake(lease.key().as_str());
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
        let (last, owner, token, ttl, remaining): Row = sqlx::query_as(protocol::INSPECT)
            .bind(key.as_str())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(self.tx_map("inspect"))?;
        let holder = match (owner, token, ttl, remaining) {
            (Some(owner), Some(token), Some(ttl), Some(remaining)) => Some(Holder {
                owner: decode_owner(BACKEND, key.as_str(), &owner)?,
                token: decode_token(BACKEND, key.as_str(), token)?,
                remaining: duration_ms(remaining),
                ttl: duration_ms(ttl),
            }),
            _ => None,
        };
        let last_token = match (last, &holder) {
            (Some(v), h) => Some(
                decode_token(BACKEND, key.as_str(), v)?
                    .max(h.as_ref().map_or(FencingToken::MIN, |h| h.token)),
            ),
            (None, Some(h)) => Some(h.token),
            (None, None) => None,
        };
        Ok(KeyState {
            key: key.clone(),
            holder,
            last_token,
        })
    }

    /// See [the type's docs](SqliteLeaseStore#watch). Starting the first watch of a file in this
    /// process opens the poller's connection (and fails with the errors of
    /// [`open`](SqliteLeaseStore::open) if it cannot); later ones only register.
    ///
    /// # Cancellation safety
    /// Cancel safe: the watch is registered only in the step that returns it; a call dropped
    /// while opening the poller's connection closes that connection and registers nothing.
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        let Some(interval) = self.inner.watch else {
            return Ok(None);
        };
        let watch = self
            .inner
            .hub
            .subscribe(key, &self.inner.connect, interval, self.inner.busy_timeout)
            .await?;
        Ok(Some(watch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_times_clamp_to_zero() {
        assert_eq!(duration_ms(-5), Duration::ZERO);
        assert_eq!(duration_ms(1500), Duration::from_millis(1500));
    }
}
