// This file stays whole past 600 lines (675 with its tests): opening the file and the `LeaseStore`
// implementation in the contract's order, each operation with its statement, its place in the
// writer queue and its error mapping; the statements are in protocol.rs, batches in batch.rs and
// inspection in inspect.rs.
//! [`SqliteLeaseStore`]: the [`LeaseStore`] on one SQLite file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, ExpiryClock, Holder, KeyState, KeyWatch, Lease,
    LeaseKey, LeaseStore, ReleaseOutcome, RenewOutcome, Result, TokenDurability,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePoolOptions};
use sqlx::{Connection, SqlitePool};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};
use tokio::time::Instant;

use crate::config::{self, SqliteOptions};
use leasehold_core::backend::{
    RoundedTtl, corrupt, decode_owner, decode_token, granted_lease, ttl_millis, validate_ttl,
};

use crate::error::{self, BACKEND, SqliteError};
use crate::gate::{self, Gate};
use crate::inspect::key_state;
use crate::protocol;
use crate::watch::{self, Hub};
use leasehold_core::mutation;

/// A [`LeaseStore`] on one SQLite database file, shared by any number of processes **on one
/// host**.
///
/// - Every operation is one atomic statement (acquire, renew, release, inspect,
///   [`inspect_many`](LeaseStore::inspect_many)), so processes never interleave inside one;
///   [`renew_many`](LeaseStore::renew_many) is one `BEGIN IMMEDIATE` transaction.
/// - The file is in WAL mode with a busy timeout, so concurrent processes wait for each other
///   instead of failing with `SQLITE_BUSY`.
/// - A key's token lives in its lease row, which release and expiry keep, and moves into a
///   table that only grows when the row is deleted: tokens are
///   [durable](TokenDurability::Durable) across restarts, releases, expiry and deleted lease
///   rows.
/// - Expiry is judged by SQLite's clock (the host's wall clock) inside each statement.
///
/// A store is a cheap, cloneable handle over one connection for writes (taken in turn, see the
/// crate docs) and a small pool of connections for reads. Open one per process (or more, they
/// are independent clients).
///
/// # Watch
/// [`watch`](LeaseStore::watch) is offered unless turned off with
/// [`SqliteOptions::with_watch`]`(false)`, so a waiting
/// [`Supervisor`](leasehold_core::supervisor::Supervisor) retries as soon as the key may be free
/// instead of at its backoff. A watch of a key is woken by:
/// - a successful release of that key through any store on the same file **in this process**,
///   right after its commit (all stores of a process on one file share one registry);
/// - a commit by any **other** connection (another process, or a connection that bypasses this
///   crate) after which the key has no unexpired holder. While the file has watchers in this
///   process, one dedicated connection reads `PRAGMA data_version` every
///   [`SqliteOptions::with_watch_poll_interval`] (25 ms by default) and, when it changed, checks the
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
/// use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
/// use leasehold_sqlite::SqliteLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
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
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    /// Connections for reads (inspect, fenced reads).
    pub(crate) pool: SqlitePool,
    /// The connection for writes, used only with the write turn of `gate` held; opened at
    /// `open`, reopened after a failure that broke it (see [`Inner::writer`]).
    writer: Mutex<Option<SqliteConnection>>,
    /// Set when the write connection failed in a way that broke it: the next writer reopens it.
    writer_broken: std::sync::atomic::AtomicBool,
    pub(crate) path: PathBuf,
    pub(crate) busy_timeout: Duration,
    /// This process's FIFO queue of writers to the file (see `gate.rs`).
    pub(crate) gate: Gate,
    /// This process's watchers of the file (see `watch.rs`).
    pub(crate) hub: Arc<Hub>,
    /// How the write connection and the watch poller connect: the pool's own options.
    pub(crate) connect: SqliteConnectOptions,
    /// Whether watch is offered, and the poller's interval.
    pub(crate) watch: Option<Duration>,
}

impl Inner {
    pub(crate) fn map(
        &self,
        operation: &'static str,
    ) -> impl Fn(sqlx::Error) -> leasehold_core::Error + '_ {
        move |e| error::map(operation, e, self.busy_timeout)
    }

    /// The write connection. Call with the write turn held (the lock is then never contended
    /// but by [`close`](SqliteLeaseStore::close)). Opens it if it is missing or was broken;
    /// refuses once the store is closed.
    pub(crate) async fn writer(&self) -> sqlx::Result<MappedMutexGuard<'_, SqliteConnection>> {
        let mut slot = self.writer.lock().await;
        if self.pool.is_closed() {
            return Err(sqlx::Error::PoolClosed);
        }
        if self
            .writer_broken
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            slot.take();
        }
        if slot.is_none() {
            *slot = Some(SqliteConnection::connect_with(&self.connect).await?);
        }
        MutexGuard::try_map(slot, Option::as_mut).map_err(|_| sqlx::Error::PoolClosed)
    }

    /// Passes `result` through, and marks the write connection for reopening if its error broke
    /// it.
    pub(crate) fn check<T>(&self, result: sqlx::Result<T>) -> sqlx::Result<T> {
        if let Err(e) = &result
            && error::breaks_connection(e)
        {
            self.writer_broken
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        result
    }
}

impl SqliteLeaseStore {
    /// The TTL this store grants for a requested `ttl`: checked against the
    /// [capabilities](LeaseStore::capabilities)' `min_ttl` and
    /// [`MAX_TTL`](leasehold_core::MAX_TTL), in whole milliseconds rounded up. The one check of acquire,
    /// renew and their batches.
    pub(crate) fn grantable_ttl(&self, ttl: Duration) -> Result<RoundedTtl> {
        validate_ttl(ttl, self.capabilities().min_ttl).and_then(|()| ttl_millis(ttl))
    }

    /// Opens (creating if needed) the database file at `path` with default [`SqliteOptions`],
    /// and creates the schema if it is missing. What it adds to [`connect`](Self::connect): any
    /// file system path, including ones a URL cannot spell (not UTF-8, or containing `?`).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = leasehold_sqlite::SqliteLeaseStore::open("/tmp/leases.db").await?;
    /// assert!(store.path().ends_with("leases.db"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`](leasehold_core::Error::Config) if the directory does not exist, the path is
    /// a directory, or the file is not a database (or has a newer schema);
    /// [`Error::Unavailable`](leasehold_core::Error::Unavailable) (refused, nothing applied) if other
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
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = leasehold_sqlite::SqliteLeaseStore::connect("sqlite://leases.db").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`](leasehold_core::Error::Config) for a URL that is not `sqlite:` or names no
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
        let (url, options) = options.with_url(url)?;
        Self::establish(config::parse_url(&url)?, options).await
    }

    async fn establish(opts: SqliteConnectOptions, options: SqliteOptions) -> Result<Self> {
        let path = opts.get_filename().to_path_buf();
        config::check_path(&path)?;
        config::check_options(&options)?;
        let opts = config::apply(opts, &options);
        let busy = options.get_busy_timeout();
        // Reads only: a connection that fails is dropped on its return to the pool, so it needs
        // no test (a round trip to its worker thread) before every use.
        let pool_opts = SqlitePoolOptions::new()
            .max_connections(options.get_max_connections())
            .acquire_timeout(busy + Duration::from_secs(5))
            .test_before_acquire(false);
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
                Err(e) => return Err(error::map("open", e, busy)),
            }
        };
        let writer = loop {
            match SqliteConnection::connect_with(&opts).await {
                Ok(conn) => break conn,
                Err(e) if error::is_busy(&e) && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(5..25))).await;
                }
                Err(e) => {
                    pool.close().await;
                    return Err(error::map("open", e, busy));
                }
            }
        };
        let gate = gate::for_file(&path);
        let hub = watch::for_file(&path);
        let store = SqliteLeaseStore {
            inner: Arc::new(Inner {
                pool,
                writer: Mutex::new(Some(writer)),
                writer_broken: Default::default(),
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
    /// [`Error::Config`](leasehold_core::Error::Config) if the file has a newer schema version;
    /// [`Error::Unavailable`](leasehold_core::Error::Unavailable) (refused, nothing applied) if the
    /// write lock was busy throughout.
    ///
    /// # Cancellation safety
    /// Cancel safe: one transaction that commits or rolls back.
    pub async fn migrate(&self) -> Result<()> {
        let map = self.inner.map("migrate");
        let _turn = self.inner.gate.ordinary().await;
        let mut conn = self.inner.writer().await.map_err(&map)?;
        let done = migrate(&mut conn).await;
        match self.inner.check(done) {
            Ok(result) => result,
            Err(e) => Err(map(e)),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Closes every connection of this store (and of its clones). Later calls fail with
    /// [`Error::Unavailable`](leasehold_core::Error::Unavailable).
    ///
    /// # Cancellation safety
    /// Cancel safe: the store is marked closed at once; dropping the future only stops waiting
    /// for a running write and busy connections to come back.
    pub async fn close(&self) {
        let closing = self.inner.pool.close();
        let writer = self.inner.writer.lock().await.take();
        if let Some(conn) = writer {
            let _ = conn.close().await;
        }
        closing.await;
    }

    /// This process's watch registry of the file.
    #[cfg(test)]
    pub(crate) fn hub(&self) -> &Arc<Hub> {
        &self.inner.hub
    }

    /// Acquire's slow path: [`protocol::ACQUIRE`] and, if it granted nothing,
    /// [`protocol::HOLDER`], in one `BEGIN IMMEDIATE` transaction: the holder read is the row
    /// that refused the grant. The token, or the holder.
    async fn acquire_decided(
        &self,
        key: &str,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<std::result::Result<i64, Holder>> {
        let inner = &self.inner;
        let map = self.tx_map("acquire");
        let _turn = inner.gate.ordinary().await;
        let mut conn = inner.writer().await.map_err(&map)?;
        let done = async {
            let mut tx = conn.begin_with(protocol::BEGIN).await?;
            let token = upsert(key, owner, ttl_ms).fetch_optional(&mut *tx).await?;
            let row = match token {
                Some(_) => None,
                None => {
                    sqlx::query_as::<_, HolderRow>(protocol::HOLDER)
                        .bind(key)
                        .fetch_optional(&mut *tx)
                        .await?
                }
            };
            tx.commit().await?;
            Ok((token, row))
        }
        .await;
        match inner.check(done).map_err(&map)? {
            (Some(token), _) => Ok(Ok(token)),
            // Refused within the write lock: the row is another owner's, unexpired when the
            // upsert ran (it may have expired since: remaining 0).
            (None, Some(row)) if row.0 != owner => Ok(Err(holder(key, &row)?)),
            (None, row) => Err(corrupt(
                BACKEND,
                key,
                format_args!("acquire refused, yet the holder row is {row:?}"),
            )),
        }
    }

    pub(crate) fn tx_map(
        &self,
        operation: &'static str,
    ) -> impl Fn(sqlx::Error) -> leasehold_core::Error + '_ {
        self.inner.map(operation)
    }
}

/// Creates the tables and triggers if they are missing and records the schema version, in one
/// immediate transaction (safe when several processes open a fresh file at once). Idempotent.
/// Upgrades a version 1 file in place (its tokens stay: see [`protocol::SCHEMA_VERSION`]).
/// Refuses a file written by a newer schema (the inner `Result`).
async fn migrate(conn: &mut SqliteConnection) -> sqlx::Result<Result<()>> {
    let mut tx = conn.begin_with(protocol::BEGIN).await?;
    sqlx::query(protocol::CREATE_META).execute(&mut *tx).await?;
    let found: Option<i64> = sqlx::query_scalar(protocol::SELECT_SCHEMA_VERSION)
        .fetch_optional(&mut *tx)
        .await?;
    if let Some(v) = found
        && v > protocol::SCHEMA_VERSION
    {
        return Ok(Err(SqliteError::NewerSchema { found: v }.into()));
    }
    for ddl in protocol::CREATE_TABLES
        .iter()
        .chain(protocol::CREATE_TRIGGERS.iter())
    {
        sqlx::query(mutation::text("sqlite.ddl", ddl))
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(protocol::UPSERT_SCHEMA_VERSION)
        .bind(protocol::SCHEMA_VERSION)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Ok(()))
}

/// [`protocol::ACQUIRE`] with its parameters.
pub(crate) fn upsert<'q>(
    key: &'q str,
    owner: &'q str,
    ttl_ms: i64,
) -> sqlx::query::QueryScalar<'q, sqlx::Sqlite, i64, sqlx::sqlite::SqliteArguments> {
    sqlx::query_scalar(mutation::text("sqlite.acquire", protocol::ACQUIRE))
        .bind(key)
        .bind(owner)
        .bind(ttl_ms)
}

/// A row of [`protocol::HOLDER`]: `(owner, token, ttl_ms, remaining_ms)`.
pub(crate) type HolderRow = (String, i64, i64, i64);

pub(crate) fn holder(key: &str, (owner, token, ttl, remaining): &HolderRow) -> Result<Holder> {
    Ok(Holder {
        owner: decode_owner(BACKEND, key, owner)?,
        token: decode_token(BACKEND, key, *token)?,
        remaining: duration_ms(*remaining),
        ttl: duration_ms(*ttl),
    })
}

pub(crate) fn duration_ms(ms: i64) -> Duration {
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

    /// One statement when the key is free ([`protocol::ACQUIRE`], which returns the token); when
    /// it is not, one read ([`protocol::HOLDER`]) says who holds it. Should that read find the
    /// key free again (released or expired in between), the upsert and the read are repeated
    /// once inside one `BEGIN IMMEDIATE` transaction, whose answer is final.
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let ttl = self.grantable_ttl(req.ttl)?;
        let (ttl_ms, granted) = (ttl.as_i64(), ttl.granted());
        let key = req.key.as_str();
        let owner = req.owner.as_str();
        let map = self.tx_map("acquire");
        let inner = &self.inner;
        let sent = Instant::now();
        let token = {
            let _turn = inner.gate.ordinary().await;
            let mut conn = inner.writer().await.map_err(&map)?;
            let done = upsert(key, owner, ttl_ms).fetch_optional(&mut *conn).await;
            inner.check(done).map_err(&map)?
        };
        let outcome = match token {
            Some(token) => Ok(token),
            None => {
                let row: Option<HolderRow> = sqlx::query_as(protocol::HOLDER)
                    .bind(key)
                    .fetch_optional(&inner.pool)
                    .await
                    .map_err(&map)?;
                match row {
                    Some(row) if row.3 > 0 && row.0 != owner => Err(holder(key, &row)?),
                    // Free again (or granted to this owner meanwhile): decide in one transaction.
                    _ => self.acquire_decided(key, owner, ttl_ms).await?,
                }
            }
        };
        match outcome {
            Ok(token) => {
                let token = decode_token(BACKEND, key, token)?;
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
            Err(holder) => {
                tracing::trace!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %holder.token, holder = %holder.owner, "lease held by another owner");
                Ok(AcquireOutcome::Held(holder))
            }
        }
    }

    /// One `BEGIN IMMEDIATE` transaction for the whole batch, one turn of the write lock: per
    /// request the upsert of [`acquire`](LeaseStore::acquire) ([`protocol::ACQUIRE`]) and, if it
    /// granted nothing, the holder read ([`protocol::HOLDER`]) of the row that refused it, as
    /// acquire's decided path does. Requests with an invalid TTL get their error in their slot
    /// and are not sent.
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        self.acquire_batch(reqs).await
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        let ttl = self.grantable_ttl(lease.ttl())?;
        let (ttl_ms, granted) = (ttl.as_i64(), ttl.granted());
        let map = self.tx_map("renew");
        let sent = Instant::now();
        let done = {
            let _turn = self.inner.gate.urgent().await;
            let mut conn = self.inner.writer().await.map_err(&map)?;
            let done = sqlx::query(mutation::text("sqlite.renew", protocol::RENEW))
                .bind(lease.key().as_str())
                .bind(lease.owner().as_str())
                .bind(lease.token().to_i64())
                .bind(ttl_ms)
                .execute(&mut *conn)
                .await;
            self.inner.check(done).map_err(&map)?
        };
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
        self.renew_batch(leases).await
    }

    /// One conditional `UPDATE` ([`protocol::RELEASE`]) that ends the lease and keeps the row
    /// (and the token in it); then this process's watchers of the key are woken.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let map = self.tx_map("release");
        let done = {
            let _turn = self.inner.gate.urgent().await;
            let mut conn = self.inner.writer().await.map_err(&map)?;
            let done = sqlx::query(mutation::text("sqlite.release", protocol::RELEASE))
                .bind(lease.key().as_str())
                .bind(lease.owner().as_str())
                .bind(lease.token().to_i64())
                .execute(&mut *conn)
                .await;
            self.inner.check(done).map_err(&map)?
        };
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
        type Row = (i64, Option<String>, Option<i64>, Option<i64>, Option<i64>);
        let (last, owner, token, ttl, remaining): Row = sqlx::query_as(protocol::INSPECT)
            .bind(key.as_str())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(self.tx_map("inspect"))?;
        key_state(key, last, owner, token, ttl, remaining)
    }

    /// One statement ([`protocol::INSPECT_MANY`]) for all keys, whatever their number: one
    /// snapshot of the file and one `now`, so the states are consistent with each other. In
    /// the order of `keys`, duplicates included.
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        self.inspect_batch(keys).await
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
    use leasehold_core::{FencingToken, OwnerId};

    /// Acquire's slow path (taken when the fast path's read finds the key free again) decides
    /// on its own: grants a free, expired or released key with the next token, refuses a key
    /// held by another owner and names that holder.
    #[tokio::test(flavor = "current_thread")]
    async fn decided_acquire_grants_or_names_the_holder() -> Result<()> {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-sqlite-store-unit-{}-decided",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test directory");
        let store = SqliteLeaseStore::open(dir.join("leases.db")).await?;
        let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
        let (a_str, b_str) = (a.as_str(), b.as_str());
        assert_eq!(
            store.acquire_decided("k", a_str, 60_000).await?.ok(),
            Some(1)
        );
        match store.acquire_decided("k", b_str, 60_000).await? {
            Err(h) => assert_eq!((h.owner, h.token.get()), (a.clone(), 1)),
            Ok(t) => panic!("granted {t} over a held key"),
        }
        // The same owner gets a new token.
        assert_eq!(
            store.acquire_decided("k", a_str, 60_000).await?.ok(),
            Some(2)
        );
        let lease = Lease::resume(
            LeaseKey::new("k")?,
            a.clone(),
            FencingToken::new(2)?,
            Duration::from_secs(60),
        );
        assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
        assert_eq!(store.acquire_decided("k", b_str, 1).await?.ok(), Some(3));
        // Expired (1 ms TTL): granted.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match store.acquire_decided("k", a_str, 60_000).await? {
                Ok(t) => {
                    assert_eq!(t, 4);
                    break;
                }
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err(h) => panic!("a 1 ms lease still held after 10 s: {h:?}"),
            }
        }
        store.close().await;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn negative_times_clamp_to_zero() {
        assert_eq!(duration_ms(-5), Duration::ZERO);
        assert_eq!(duration_ms(1500), Duration::from_millis(1500));
    }
}
