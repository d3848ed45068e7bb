//! Where the database lives and how connections to it are set up.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use leasehold_core::backend::UrlParams;
use leasehold_core::{Error, Result};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};

use crate::error::BACKEND;

/// Tuning for [`SqliteLeaseStore`](crate::SqliteLeaseStore): how long to wait for another
/// process's write lock, how many connections one store keeps, when commits reach the disk, and
/// whether (and how often) the [watch](crate::SqliteLeaseStore#watch) looks for other
/// connections' commits.
///
/// ```
/// use std::time::Duration;
/// use leasehold_sqlite::SqliteOptions;
/// let opts = SqliteOptions::new()
///     .with_busy_timeout(Duration::from_secs(2))
///     .with_max_connections(2);
/// assert_eq!(opts.get_busy_timeout(), Duration::from_secs(2));
/// assert!(opts.get_watch());
/// let polling_only = SqliteOptions::new().with_watch(false);
/// assert!(!polling_only.get_watch());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    busy_timeout: Duration,
    max_connections: u32,
    commit_sync: CommitSync,
    watch: bool,
    watch_interval: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            busy_timeout: Duration::from_secs(5),
            max_connections: 4,
            commit_sync: CommitSync::default(),
            watch: true,
            watch_interval: Duration::from_millis(25),
        }
    }
}

/// When a commit (a grant, renewal, release or fenced write) is forced to disk. Both keep the
/// file consistent and tokens increasing across crashes and restarts of any process; they differ
/// only for a crash of the **host** (kernel panic, power loss).
///
/// See `docs/adr/0050-sqlite-one-host-one-clock.md`.
///
/// ```
/// use leasehold_sqlite::{CommitSync, SqliteOptions};
/// let opts = SqliteOptions::new().with_commit_sync(CommitSync::Full);
/// assert_eq!(opts.get_commit_sync(), CommitSync::Full);
/// assert_eq!(SqliteOptions::new().get_commit_sync(), CommitSync::Normal);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommitSync {
    /// WAL with `synchronous = NORMAL` (the default): a commit is in the file as soon as it
    /// returns and survives any process crash; the WAL is fsynced at checkpoints. A host crash may
    /// roll back the last commits, and with them the last grants; every holder of those grants
    /// died with the host (one host), so no live process holds a token that is issued again. A
    /// fenced resource in the same file rolls back with them; one *outside* the file may reject
    /// the first grants after the reboot until tokens pass its high-water mark (safe, briefly
    /// unavailable). Operations never wait for an fsync of their own.
    #[default]
    Normal,
    /// WAL with `synchronous = FULL`: every commit is fsynced before it returns, so grants survive
    /// power loss too. Every operation, renewals included, then waits for an fsync, and queues
    /// behind other processes' fsyncs; on a busy disk that was measured at 200 ms and more, up
    /// to seconds, so use TTLs of several seconds.
    Full,
}

impl SqliteOptions {
    /// The defaults: a 5 s busy timeout, up to 4 read connections, [`CommitSync::Normal`], watch on
    /// with a 25 ms `data_version` interval.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a statement waits for another connection's (or process's) write lock before it
    /// fails with [`Error::Unavailable`] (built by [`Error::refused`]: nothing was applied). SQLite's `busy_timeout`; at least 1 ms
    /// and at most SQLite's largest, `i32::MAX` ms (about 24.8 days; `Duration::MAX` waits that
    /// long).
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout.clamp(Duration::from_millis(1), LONGEST_BUSY_TIMEOUT);
        self
    }

    /// The largest number of connections the store keeps open for reads (inspect, fenced
    /// reads; at least 1; above 10,000 the open fails with [`Error::Config`]). Writes go through
    /// one more connection of the store's own, and a watch through one per file and process.
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// When commits are forced to disk (default [`CommitSync::Normal`]).
    pub fn with_commit_sync(mut self, sync: CommitSync) -> Self {
        self.commit_sync = sync;
        self
    }

    /// Whether [`watch`](leasehold_core::LeaseStore::watch) is offered (default: on). Off, the store
    /// claims no [`Capabilities::watch`](leasehold_core::Capabilities), `watch()` returns `Ok(None)`
    /// and waiters poll with backoff; releases still cost nothing extra.
    pub fn with_watch(mut self, on: bool) -> Self {
        self.watch = on;
        self
    }

    /// How often, while the file has watchers in this process, one dedicated connection reads
    /// `PRAGMA data_version` to notice commits by other connections and processes (default
    /// 25 ms, at least 1 ms). This bounds how late a waiter hears of a release made in *another*
    /// process; releases in this process wake their waiters at once. The interval of the store
    /// whose watch started the file's poller applies to all stores on that file in this process.
    pub fn with_watch_poll_interval(mut self, interval: Duration) -> Self {
        self.watch_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Deprecated spelling of [`with_busy_timeout`](Self::with_busy_timeout).
    #[deprecated(note = "use with_busy_timeout")]
    pub fn busy_timeout(self, timeout: Duration) -> Self {
        self.with_busy_timeout(timeout)
    }

    /// Deprecated spelling of [`with_max_connections`](Self::with_max_connections).
    #[deprecated(note = "use with_max_connections")]
    pub fn max_connections(self, n: u32) -> Self {
        self.with_max_connections(n)
    }

    /// Deprecated spelling of [`with_commit_sync`](Self::with_commit_sync).
    #[deprecated(note = "use with_commit_sync")]
    pub fn commit_sync(self, sync: CommitSync) -> Self {
        self.with_commit_sync(sync)
    }

    /// Deprecated spelling of [`with_watch`](Self::with_watch).
    #[deprecated(note = "use with_watch")]
    pub fn watch(self, on: bool) -> Self {
        self.with_watch(on)
    }

    /// Deprecated spelling of [`with_watch_poll_interval`](Self::with_watch_poll_interval).
    #[deprecated(note = "use with_watch_poll_interval")]
    pub fn watch_poll_interval(self, interval: Duration) -> Self {
        self.with_watch_poll_interval(interval)
    }

    /// Whether watch is offered.
    pub fn get_watch(&self) -> bool {
        self.watch
    }

    /// The configured `data_version` poll interval.
    pub fn get_watch_poll_interval(&self) -> Duration {
        self.watch_interval
    }

    /// The configured commit durability.
    pub fn get_commit_sync(&self) -> CommitSync {
        self.commit_sync
    }

    /// The configured busy timeout.
    pub fn get_busy_timeout(&self) -> Duration {
        self.busy_timeout
    }

    /// The configured connection limit.
    pub fn get_max_connections(&self) -> u32 {
        self.max_connections
    }
}

/// The query parameters of a store URL that set [`SqliteOptions`] (see the crate docs' table).
pub const URL_OPTIONS: &[&str] = &[
    "busy_timeout",
    "max_connections",
    "commit_sync",
    "watch",
    "watch_poll_interval",
];

/// The driver's own query parameters, handed to it unchanged.
pub const DRIVER_URL_PARAMETERS: &[&str] = &["mode", "cache", "immutable", "vfs"];

impl SqliteOptions {
    /// Applies the [`URL_OPTIONS`] in `url`'s query on top of `self`, and gives back the URL for
    /// the driver: its base with only the [`DRIVER_URL_PARAMETERS`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_sqlite::{CommitSync, SqliteOptions};
    /// let (url, opts) = SqliteOptions::new()
    ///     .with_url("sqlite:///var/lib/app/leases.db?busy_timeout=2s&commit_sync=full&mode=rwc")?;
    /// assert_eq!(url, "sqlite:///var/lib/app/leases.db?mode=rwc");
    /// assert_eq!(opts.get_busy_timeout(), Duration::from_secs(2));
    /// assert_eq!(opts.get_commit_sync(), CommitSync::Full);
    /// assert!(SqliteOptions::new().with_url("sqlite://x.db?busy_timout=2s").is_err());
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] for a parameter that is neither, or a value that does not parse.
    pub fn with_url(self, url: &str) -> Result<(String, SqliteOptions)> {
        let mut p = UrlParams::parse(BACKEND, url)?;
        let mut o = self;
        if let Some(d) = p.take_duration("busy_timeout")? {
            o = o.with_busy_timeout(d);
        }
        if let Some(n) = p.take_count("max_connections")? {
            o = o.with_max_connections(n);
        }
        if let Some(sync) = p.take_with("commit_sync", |v| match v {
            "normal" => Ok(CommitSync::Normal),
            "full" => Ok(CommitSync::Full),
            _ => Err("expected normal or full".into()),
        })? {
            o = o.with_commit_sync(sync);
        }
        if let Some(on) = p.take_bool("watch")? {
            o = o.with_watch(on);
        }
        if let Some(d) = p.take_duration("watch_poll_interval")? {
            o = o.with_watch_poll_interval(d);
        }
        let url = p.finish_for_driver(URL_OPTIONS, DRIVER_URL_PARAMETERS)?;
        Ok((url, o))
    }
}

/// Turns a `sqlite://path` (or `sqlite:path`) URL into a file path and sqlx's own query
/// parameters. Anything else, an empty path or an in-memory database is a configuration error.
pub(crate) fn parse_url(url: &str) -> Result<SqliteConnectOptions> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| {
            Error::config(
                BACKEND,
                format!("{url:?} is not a sqlite URL (expected sqlite://PATH)"),
                None,
            )
        })?;
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() {
        return Err(Error::config(
            BACKEND,
            format!("{url:?} names no database file"),
            None,
        ));
    }
    if path == ":memory:" || rest.contains("mode=memory") {
        return Err(Error::config(
            BACKEND,
            format!(
                "{url:?} is an in-memory database, which other processes cannot share; use the memory store instead"
            ),
            None,
        ));
    }
    let opts = SqliteConnectOptions::from_str(url).map_err(|e| {
        Error::config(
            BACKEND,
            format!("cannot parse {url:?}: {e}"),
            Some(e.into()),
        )
    })?;
    Ok(opts)
}

/// Checks that the database file can be created where it is asked for: its directory exists and
/// the path is not itself a directory.
/// SQLite's `busy_timeout` is a C `int` of milliseconds.
const LONGEST_BUSY_TIMEOUT: Duration = Duration::from_millis(i32::MAX.unsigned_abs() as u64);

/// The largest read pool an open accepts: the driver allocates its queue up front, so
/// `u32::MAX` would abort the process.
pub(crate) const MAX_POOL: u32 = 10_000;

/// Refuses options no store can be built with.
pub(crate) fn check_options(options: &SqliteOptions) -> Result<()> {
    if options.max_connections > MAX_POOL {
        return Err(Error::config(
            BACKEND,
            format!(
                "max_connections {} is above the largest read pool the store builds ({MAX_POOL})",
                options.max_connections
            ),
            None,
        ));
    }
    Ok(())
}

pub(crate) fn check_path(path: &Path) -> Result<()> {
    if path.as_os_str().is_empty() {
        return Err(Error::config(BACKEND, "the database path is empty", None));
    }
    if path.is_dir() {
        return Err(Error::config(
            BACKEND,
            format!("{} is a directory, not a database file", path.display()),
            None,
        ));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(Error::config(
            BACKEND,
            format!(
                "the directory {} of database {} does not exist",
                parent.display(),
                path.display()
            ),
            None,
        ));
    }
    Ok(())
}

/// Applies what every connection of a store needs: create the file if missing, WAL journal,
/// the commit durability, the busy timeout, and room for the rows of a large
/// [`inspect_many`](leasehold_core::LeaseStore::inspect_many).
pub(crate) fn apply(opts: SqliteConnectOptions, options: &SqliteOptions) -> SqliteConnectOptions {
    let sync = match options.commit_sync {
        CommitSync::Normal => SqliteSynchronous::Normal,
        CommitSync::Full => SqliteSynchronous::Full,
    };
    opts.create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(sync)
        .busy_timeout(options.busy_timeout)
        // sqlx hands rows from the connection's worker thread to the task through a channel of
        // 50 by default: 10,000 rows then cost 200 hand-offs between the two, measured at 27 to
        // 293 ms for one inspect_many of 10,000 keys on the busy 2-core machine, against 21 to
        // 39 ms with room for 1,024 (the statement itself: 7 to 11 ms).
        .row_buffer_size(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert!(parse_url("sqlite:///tmp/x.db").is_ok());
        assert!(parse_url("sqlite://relative/x.db").is_ok());
        assert!(parse_url("sqlite:x.db?mode=rwc").is_ok());
        for bad in [
            "",
            "x.db",
            "postgres://localhost/db",
            "sqlite://",
            "sqlite::memory:",
            "sqlite://?mode=memory",
        ] {
            assert!(
                matches!(parse_url(bad), Err(Error::Config { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse_url("sqlite://x.db?mode=bogus"),
            Err(Error::Config { .. })
        ));
    }

    #[test]
    fn paths_are_checked() {
        let tmp = std::env::temp_dir();
        assert!(check_path(&tmp.join("lease.db")).is_ok());
        assert!(matches!(check_path(&tmp), Err(Error::Config { .. })));
        assert!(matches!(
            check_path(&tmp.join("no-such-dir-7f3a/lease.db")),
            Err(Error::Config { .. })
        ));
        assert!(check_path(Path::new("lease.db")).is_ok());
    }
}
