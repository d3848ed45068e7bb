// This file stays whole past 600 lines (574 of code, the rest its tests): the options, the URL
// parameters that set them (`with_url`), the fenced transactions' timeouts and the table name's
// validation are one contract, so that an option and its parameter are read side by side.
//! Configuration: the validated table name and the timeouts.

use std::fmt;
use std::time::Duration;

use leasehold_core::backend::UrlParams;
use leasehold_core::{Error, Result};
use sha2::{Digest, Sha256};

use crate::error::BACKEND;

/// The longest legal table name part. The crate derives `<table>_token_seq`, `<table>_fence` and
/// `<table>_token_floor` from it, which must stay within PostgreSQL's 63-byte identifier limit.
pub const MAX_TABLE_LEN: usize = 40;

/// The longest legal schema name (PostgreSQL's identifier limit).
pub const MAX_SCHEMA_LEN: usize = 63;

/// PostgreSQL's identifier limit, which channel names obey.
const MAX_CHANNEL_LEN: usize = 63;

/// A schema-qualified table name, validated before any SQL is built from it.
///
/// Both parts must be lowercase SQL identifiers: an ASCII letter or `_` followed by ASCII
/// lowercase letters, digits or `_` (the schema at most 63 bytes, the table at most
/// [`MAX_TABLE_LEN`]). Nothing else can reach the SQL text, so configuration cannot inject SQL;
/// the names are additionally quoted wherever they are used. Without a schema, `public` is used.
///
/// ```
/// use leasehold_postgres::TableName;
/// let t = TableName::parse("locking.leases")?;
/// assert_eq!(t.schema(), "locking");
/// assert_eq!(t.table(), "leases");
/// assert_eq!(t.to_string(), "\"locking\".\"leases\"");
/// assert_eq!(TableName::parse("leases")?.schema(), "public");
/// assert!(TableName::parse("leases; drop table x").is_err());
/// assert!(TableName::parse("Leases").is_err());
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: String,
    table: String,
}

impl TableName {
    /// Parses `table` or `schema.table`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the rejected name and the rule it breaks.
    pub fn parse(name: &str) -> Result<Self> {
        let (schema, table) = match name.split_once('.') {
            Some((s, t)) => (s, t),
            None => ("public", name),
        };
        check_ident(schema, MAX_SCHEMA_LEN, name)?;
        check_ident(table, MAX_TABLE_LEN, name)?;
        Ok(TableName {
            schema: schema.to_string(),
            table: table.to_string(),
        })
    }

    /// The schema part.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The table part.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The `LISTEN`/`NOTIFY` channel of this table's release notifications:
    /// `lease:<schema>.<table>` when that fits PostgreSQL's 63-byte identifier limit; otherwise
    /// its first 40 bytes, `:` and 16 hex digits of the SHA-256 of the full name (deterministic,
    /// so every client of the table agrees on it). The payload of each notification is the
    /// released key.
    ///
    /// ```
    /// use leasehold_postgres::TableName;
    /// assert_eq!(TableName::default().notify_channel(), "lease:public.leases");
    /// let long = TableName::parse(&format!("{}.leases", "s".repeat(60)))?;
    /// assert_eq!(long.notify_channel().len(), 63);
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn notify_channel(&self) -> String {
        let full = format!("lease:{}.{}", self.schema, self.table);
        if full.len() <= MAX_CHANNEL_LEN {
            return full;
        }
        let name = format!("{}.{}", self.schema, self.table);
        let digest = Sha256::digest(full.as_bytes());
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        // Identifiers are ASCII, so any byte index is a char boundary. "lease:" + 40 + ":" + 16 = 63.
        format!("lease:{}:{hex}", &name[..40])
    }

    /// A quoted, schema-qualified name of a sibling object: `"schema"."<table><suffix>"`.
    pub(crate) fn sibling(&self, suffix: &str) -> String {
        format!("\"{}\".\"{}{suffix}\"", self.schema, self.table)
    }
}

impl Default for TableName {
    /// `public.leases`.
    fn default() -> Self {
        TableName {
            schema: "public".to_string(),
            table: "leases".to_string(),
        }
    }
}

impl fmt::Display for TableName {
    /// The quoted, schema-qualified name, ready for SQL.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\".\"{}\"", self.schema, self.table)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({}.{})", self.schema, self.table)
    }
}

impl std::str::FromStr for TableName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        TableName::parse(s)
    }
}

fn check_ident(part: &str, max: usize, whole: &str) -> Result<()> {
    let reason = if part.is_empty() {
        Some("a name part is empty".to_string())
    } else if part.len() > max {
        Some(format!("{part:?} is longer than {max} bytes"))
    } else if !part
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
    {
        Some(format!(
            "{part:?} must start with a lowercase letter or '_'"
        ))
    } else if !part
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        Some(format!(
            "{part:?} may contain only lowercase ASCII letters, digits and '_'"
        ))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::config(
            BACKEND,
            format!(
                "illegal table name {:?}: {reason}",
                whole.chars().take(80).collect::<String>()
            ),
            None,
        )),
        None => Ok(()),
    }
}

/// Bounds for a transaction that holds a row lock or an advisory lock
/// ([`fenced_transaction`](crate::PostgresLeaseStore::fenced_transaction), [`LeaseRowFence`](crate::LeaseRowFence),
/// [`AdvisoryLocks`](crate::AdvisoryLocks)).
///
/// The first three are **server-side**, applied with `SET LOCAL` inside the transaction only, so
/// that a stuck transaction cannot delay a takeover indefinitely. They cannot help when the
/// client stops hearing from the server (a black-holed connection: the server's answer, even its
/// cancellation error, never arrives), so [`deadline`](Self::deadline) bounds the whole call on
/// the **client**: past it the call returns a retryable
/// [`Error::Timeout`](leasehold_core::Error::Timeout) and the connection is closed, never returned to
/// the pool.
///
/// ```
/// use std::time::Duration;
/// use leasehold_postgres::TxTimeouts;
/// let t = TxTimeouts::default()
///     .with_lock_timeout(Duration::from_millis(200))
///     .with_deadline(Duration::from_secs(3));
/// assert_eq!(t.lock_timeout, Duration::from_millis(200));
/// assert_eq!(t.deadline, Duration::from_secs(3));
/// assert_eq!(TxTimeouts::default().deadline, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TxTimeouts {
    /// `lock_timeout`: the longest wait for the lease row or the advisory lock. Default 2 s.
    pub lock_timeout: Duration,
    /// `statement_timeout`: the longest any one statement of the transaction may run. Default 5 s.
    pub statement_timeout: Duration,
    /// `idle_in_transaction_session_timeout`: the longest the client may leave the open
    /// transaction idle between statements before the server ends the session (and with it the
    /// transaction and its locks). Default 5 s.
    pub idle_timeout: Duration,
    /// The client-side deadline of the whole call: taking a pooled connection, `BEGIN`, the
    /// lock, the caller's statements and `COMMIT`. Default 10 s (room for a lock wait and a slow
    /// statement within the server-side bounds above; keep it below the lease TTL when the
    /// transaction runs under a lease). Past it the call returns a retryable
    /// [`Error::Timeout`](leasehold_core::Error::Timeout); if `COMMIT` had been sent, its outcome is
    /// unknown.
    pub deadline: Duration,
}

impl Default for TxTimeouts {
    fn default() -> Self {
        TxTimeouts {
            lock_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            deadline: Duration::from_secs(10),
        }
    }
}

impl TxTimeouts {
    /// Sets [`TxTimeouts::lock_timeout`].
    pub fn with_lock_timeout(mut self, d: Duration) -> Self {
        self.lock_timeout = d;
        self
    }

    /// Sets [`TxTimeouts::statement_timeout`].
    pub fn with_statement_timeout(mut self, d: Duration) -> Self {
        self.statement_timeout = d;
        self
    }

    /// Sets [`TxTimeouts::idle_timeout`].
    pub fn with_idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }

    /// Sets [`TxTimeouts::deadline`], the client-side bound of the whole call. Any duration is
    /// accepted (`Duration::MAX` means no client-side bound); zero makes every call time out.
    pub fn with_deadline(mut self, d: Duration) -> Self {
        self.deadline = d;
        self
    }

    /// The settings as `(name, milliseconds)` pairs, for `set_config(name, value, true)`.
    pub(crate) fn settings(&self) -> [(&'static str, String); 3] {
        [
            ("lock_timeout", millis_setting(self.lock_timeout)),
            ("statement_timeout", millis_setting(self.statement_timeout)),
            (
                "idle_in_transaction_session_timeout",
                millis_setting(self.idle_timeout),
            ),
        ]
    }
}

/// A duration as a PostgreSQL millisecond setting, at least 1 ms (0 would mean "no limit") and
/// at most the largest value the server accepts (`i32::MAX` ms, about 24.8 days).
pub(crate) fn millis_setting(d: Duration) -> String {
    let max = u128::from(i32::MAX.unsigned_abs());
    format!("{}ms", d.as_millis().clamp(1, max))
}

/// Everything a [`PostgresLeaseStore`](crate::PostgresLeaseStore) is configured with.
///
/// ```
/// use std::time::Duration;
/// use leasehold_postgres::{PostgresOptions, TableName};
/// let opts = PostgresOptions::new(TableName::parse("locking.leases")?)
///     .with_op_timeout(Duration::from_secs(2))
///     .with_max_connections(8);
/// assert_eq!(opts.table().table(), "leases");
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    table: TableName,
    op_timeout: Duration,
    max_connections: u32,
    acquire_timeout: Duration,
    tx: TxTimeouts,
    notify: bool,
    layout: TableLayout,
    migrate: bool,
}

/// The query parameters of a store URL that set [`PostgresOptions`] (see the crate docs' table).
pub const URL_OPTIONS: &[&str] = &[
    "table",
    "layout",
    "migrate",
    "notify",
    "op_timeout",
    "max_connections",
    "acquire_timeout",
    "tx_lock_timeout",
    "tx_statement_timeout",
    "tx_idle_timeout",
    "tx_deadline",
];

/// The driver's own (libpq's) query parameters, handed to it unchanged.
pub const DRIVER_URL_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

impl PostgresOptions {
    /// Applies the [`URL_OPTIONS`] in `url`'s query on top of `self`, and gives back the URL for
    /// the driver: its base with only the [`DRIVER_URL_PARAMETERS`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_postgres::{PostgresOptions, TableLayout};
    /// let (url, opts) = PostgresOptions::default().with_url(
    ///     "postgres://u@db/app?table=public.coordination_lease&layout=coordination_lease&op_timeout=2s&sslmode=require",
    /// )?;
    /// assert_eq!(url, "postgres://u@db/app?sslmode=require");
    /// assert_eq!(opts.table().table(), "coordination_lease");
    /// assert_eq!(opts.layout(), TableLayout::CoordinationLease);
    /// assert_eq!(opts.op_timeout(), Duration::from_secs(2));
    /// assert!(PostgresOptions::default().with_url("postgres://db/app?sslrootcrt=/ca.pem").is_err());
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`](leasehold_core::Error::Config) for a parameter that is neither, or a value
    /// that does not parse.
    pub fn with_url(self, url: &str) -> Result<(String, PostgresOptions)> {
        let mut p = UrlParams::parse(BACKEND, url)?;
        let mut o = self;
        if let Some(t) = p.take("table") {
            o.table = TableName::parse(&t)?;
        }
        if let Some(layout) = p.take_with("layout", |v| match v {
            "library" => Ok(TableLayout::Library),
            // `seed`: this layout's name before 0.2, still accepted.
            "coordination_lease" | "seed" => Ok(TableLayout::CoordinationLease),
            _ => Err("expected library or coordination_lease".into()),
        })? {
            o.layout = layout;
        }
        if let Some(on) = p.take_bool("migrate")? {
            o.migrate = on;
        }
        if let Some(on) = p.take_bool("notify")? {
            o.notify = on;
        }
        if let Some(d) = p.take_duration("op_timeout")? {
            o.op_timeout = d;
        }
        if let Some(n) = p.take_count("max_connections")? {
            o = o.with_max_connections(n);
        }
        if let Some(d) = p.take_duration("acquire_timeout")? {
            o.acquire_timeout = d;
        }
        if let Some(d) = p.take_duration("tx_lock_timeout")? {
            o.tx.lock_timeout = d;
        }
        if let Some(d) = p.take_duration("tx_statement_timeout")? {
            o.tx.statement_timeout = d;
        }
        if let Some(d) = p.take_duration("tx_idle_timeout")? {
            o.tx.idle_timeout = d;
        }
        if let Some(d) = p.take_duration("tx_deadline")? {
            o.tx.deadline = d;
        }
        let url = p.finish_for_driver(URL_OPTIONS, DRIVER_URL_PARAMETERS)?;
        Ok((url, o))
    }
}

/// The columns of the lease table.
///
/// - [`TableLayout::Library`] (the default): the table [`migrate`](crate::PostgresLeaseStore::migrate)
///   creates, `(resource_key text, owner text, lease_until timestamptz, fencing_token bigint,
///   ttl_ms bigint)`; any [`OwnerId`](leasehold_core::OwnerId) works.
/// - [`TableLayout::CoordinationLease`]: an existing `coordination_lease` table as services of the
///   seed design already run it (UUID owners, no TTL column),
///   `(resource_key text, owner_id uuid, lease_until timestamptz default '-infinity',
///   fencing_token bigint default 0)`, used **in place**: `migrate` keeps those columns and adds
///   the token floor (sequence and triggers) and the high-water-mark table, so the seed's own
///   statements keep working next to the library and no token goes back. Owners are stored in
///   the `uuid` column, so every owner must be a UUID in canonical form
///   ([`OwnerId::random`](leasehold_core::OwnerId::random) is one); any other owner is an
///   [`Error::InvalidOwner`] and nothing is sent. Holders are reported with their UUID; the TTL
///   of a holder is its remaining time (the table has no TTL column).
///
/// ```
/// use leasehold_postgres::{PostgresOptions, TableLayout, TableName};
/// let opts = PostgresOptions::new(TableName::parse("public.coordination_lease")?)
///     .with_layout(TableLayout::CoordinationLease);
/// assert_eq!(opts.layout(), TableLayout::CoordinationLease);
/// assert_eq!(PostgresOptions::default().layout(), TableLayout::Library);
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TableLayout {
    /// This crate's own table (see [`migrate`](crate::PostgresLeaseStore::migrate)).
    #[default]
    Library,
    /// The columns of an existing `coordination_lease` table (`owner_id uuid`, no TTL column).
    CoordinationLease,
}

impl TableLayout {
    /// The old name of [`TableLayout::CoordinationLease`] (the layout of the seed design's
    /// table), kept for one release.
    #[deprecated(note = "renamed TableLayout::CoordinationLease")]
    #[allow(non_upper_case_globals)]
    pub const Seed: TableLayout = TableLayout::CoordinationLease;
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions::new(TableName::default())
    }
}

impl PostgresOptions {
    /// Defaults for `table`: 5 s per operation, a pool of 10 connections with a 2 s acquire
    /// timeout (for pools the store builds itself), [`TxTimeouts::default`], and release
    /// notifications on (see [`with_notify`](Self::with_notify)).
    pub fn new(table: TableName) -> Self {
        PostgresOptions {
            table,
            op_timeout: Duration::from_secs(5),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(2),
            tx: TxTimeouts::default(),
            notify: true,
            layout: TableLayout::Library,
            migrate: true,
        }
    }

    /// Sets the columns of the lease table ([`TableLayout`]; default [`TableLayout::Library`]).
    pub fn with_layout(mut self, layout: TableLayout) -> Self {
        self.layout = layout;
        self
    }

    /// The columns of the lease table.
    pub fn layout(&self) -> TableLayout {
        self.layout
    }

    /// Whether [`connect_with`](crate::PostgresLeaseStore::connect_with) runs
    /// [`migrate`](crate::PostgresLeaseStore::migrate) (on, the default: idempotent, under an
    /// advisory lock; a role without DDL rights still connects when the schema is complete) or
    /// only [`verify_schema`](crate::PostgresLeaseStore::verify_schema) (off).
    ///
    /// ```
    /// use leasehold_postgres::PostgresOptions;
    /// assert!(PostgresOptions::default().migrate());
    /// assert!(!PostgresOptions::default().with_migrate(false).migrate());
    /// ```
    pub fn with_migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// Whether connecting migrates the schema.
    pub fn migrate(&self) -> bool {
        self.migrate
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Sets the client-side bound on one lease operation (acquire, renew, release, inspect);
    /// beyond it the call returns [`Error::Timeout`] and its outcome is unknown. Pools built by
    /// [`PostgresLeaseStore::connect_with`](crate::PostgresLeaseStore::connect_with) also get it as the
    /// server's `statement_timeout`.
    pub fn with_op_timeout(mut self, d: Duration) -> Self {
        self.op_timeout = d;
        self
    }

    /// The bound on one lease operation.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// Sets the pool size used by [`PostgresLeaseStore::connect_with`](crate::PostgresLeaseStore::connect_with):
    /// at least 1; above 10,000 the connect fails with [`Error::Config`](leasehold_core::Error::Config).
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// The pool size for pools the store builds.
    pub fn max_connections(&self) -> u32 {
        self.max_connections
    }

    /// Sets how long an operation waits for a free pooled connection before failing with a
    /// retryable [`Error::Unavailable`] (pools the store builds). Any duration is accepted;
    /// anything above a year waits a year (`Duration::MAX` included).
    pub fn with_acquire_timeout(mut self, d: Duration) -> Self {
        self.acquire_timeout = d;
        self
    }

    /// The pool acquire timeout.
    pub fn acquire_timeout(&self) -> Duration {
        self.acquire_timeout
    }

    /// Sets the bounds of fenced transactions.
    pub fn with_tx_timeouts(mut self, tx: TxTimeouts) -> Self {
        self.tx = tx;
        self
    }

    /// The bounds of fenced transactions.
    pub fn tx_timeouts(&self) -> TxTimeouts {
        self.tx
    }

    /// Turns release notifications and [`watch`](leasehold_core::LeaseStore::watch) on (the default)
    /// or off.
    ///
    /// On, a successful release also runs `pg_notify(<channel>, <key>)` in the same statement
    /// (see [`TableName::notify_channel`]), and `watch` LISTENs on that channel, so a waiting
    /// [`Supervisor`](leasehold_core::supervisor::Supervisor) retries as soon as the holder releases.
    /// Off, release is the plain `UPDATE`, `watch` returns `Ok(None)` and
    /// [`Capabilities::watch`](leasehold_core::Capabilities::watch) is `false`; waiters poll. Turn it
    /// off when many releases and no waiters make the notification queue's commit-time lock
    /// worth avoiding.
    ///
    /// ```
    /// use leasehold_postgres::PostgresOptions;
    /// assert!(PostgresOptions::default().notify());
    /// assert!(!PostgresOptions::default().with_notify(false).notify());
    /// ```
    pub fn with_notify(mut self, on: bool) -> Self {
        self.notify = on;
        self
    }

    /// Whether releases notify and `watch` is offered.
    pub fn notify(&self) -> bool {
        self.notify
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `layout=coordination_lease` and its old name `seed` both select the layout (as does the
    /// deprecated `TableLayout::Seed`); anything else is a typed error naming the values.
    #[test]
    #[allow(deprecated)]
    fn the_layout_parameter_takes_the_new_name_and_the_old_one() {
        for v in ["coordination_lease", "seed"] {
            let (_, o) = PostgresOptions::default()
                .with_url(&format!("postgres://db/app?layout={v}"))
                .unwrap();
            assert_eq!(o.layout(), TableLayout::CoordinationLease, "{v}");
        }
        assert_eq!(TableLayout::Seed, TableLayout::CoordinationLease);
        let err = PostgresOptions::default()
            .with_url("postgres://db/app?layout=seeds")
            .unwrap_err();
        assert!(
            matches!(err, leasehold_core::Error::Config { .. })
                && err.to_string().contains("coordination_lease"),
            "{err}"
        );
    }

    #[test]
    fn channels_fit_the_identifier_limit_and_stay_distinct() {
        assert_eq!(TableName::default().notify_channel(), "lease:public.leases");
        let long_schema = "s".repeat(63);
        let a = TableName::parse(&format!("{long_schema}.{}", "a".repeat(40))).unwrap();
        let b = TableName::parse(&format!("{long_schema}.{}", "b".repeat(40))).unwrap();
        let (ca, cb) = (a.notify_channel(), b.notify_channel());
        assert_eq!(ca.len(), MAX_CHANNEL_LEN);
        assert_ne!(ca, cb, "same prefix, different tables");
        assert_eq!(ca, a.notify_channel(), "deterministic");
        assert!(
            ca.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'\'' && b != b'"')
        );
    }

    #[test]
    fn server_settings_stay_in_the_servers_range() {
        assert_eq!(millis_setting(Duration::ZERO), "1ms");
        assert_eq!(millis_setting(Duration::from_millis(1500)), "1500ms");
        assert_eq!(millis_setting(Duration::MAX), "2147483647ms");
        let t = TxTimeouts::default()
            .with_lock_timeout(Duration::MAX)
            .with_deadline(Duration::MAX);
        assert!(t.settings().iter().all(|(_, v)| v.len() < 16));
    }
}
