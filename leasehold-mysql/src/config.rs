//! Configuration: the validated table name and the timeouts.

use std::fmt;
use std::time::Duration;

use leasehold_core::backend::UrlParams;
use leasehold_core::{Error, Result};

use crate::error::BACKEND;

/// The longest legal table name part. The crate derives `<table>_fence`, `<table>_floor` and
/// the trigger `<table>_token_keep` from it, which must stay within MySQL's 64-character
/// identifier limit.
pub const MAX_TABLE_LEN: usize = 48;

/// The longest legal database name (MySQL's identifier limit).
pub const MAX_DATABASE_LEN: usize = 64;

/// A table name, optionally qualified by its database, validated before any SQL is built from
/// it.
///
/// Both parts must be lowercase SQL identifiers: an ASCII letter or `_` followed by ASCII
/// lowercase letters, digits or `_` (the database at most 64 bytes, the table at most
/// [`MAX_TABLE_LEN`]). Nothing else can reach the SQL text, so configuration cannot inject SQL;
/// the names are additionally quoted with backticks wherever they are used. Without a database,
/// the connection's database (the URL's path) is used.
///
/// ```
/// use leasehold_mysql::TableName;
/// let t = TableName::parse("locking.leases")?;
/// assert_eq!(t.database(), Some("locking"));
/// assert_eq!(t.table(), "leases");
/// assert_eq!(t.to_string(), "`locking`.`leases`");
/// assert_eq!(TableName::parse("leases")?.to_string(), "`leases`");
/// assert!(TableName::parse("leases; drop table x").is_err());
/// assert!(TableName::parse("Leases").is_err());
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    database: Option<String>,
    table: String,
}

impl TableName {
    /// Parses `table` or `database.table`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the rejected name and the rule it breaks.
    pub fn parse(name: &str) -> Result<Self> {
        let (database, table) = match name.split_once('.') {
            Some((d, t)) => {
                check_ident(d, MAX_DATABASE_LEN, name)?;
                (Some(d.to_string()), t)
            }
            None => (None, name),
        };
        check_ident(table, MAX_TABLE_LEN, name)?;
        Ok(TableName {
            database,
            table: table.to_string(),
        })
    }

    /// The database part, if given.
    pub fn database(&self) -> Option<&str> {
        self.database.as_deref()
    }

    /// The table part.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// A table next to this one, named `<table><suffix>` in the same database, quoted.
    pub(crate) fn sibling(&self, suffix: &str) -> String {
        match &self.database {
            Some(d) => format!("`{d}`.`{}{suffix}`", self.table),
            None => format!("`{}{suffix}`", self.table),
        }
    }
}

impl Default for TableName {
    /// `leases` in the connection's database.
    fn default() -> Self {
        TableName {
            database: None,
            table: "leases".to_string(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.sibling(""))
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn check_ident(part: &str, max: usize, whole: &str) -> Result<()> {
    let mut bytes = part.bytes();
    let first_ok = matches!(bytes.next(), Some(b'a'..=b'z' | b'_'));
    let rest_ok = bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'));
    if !first_ok || !rest_ok || part.len() > max {
        return Err(Error::config(
            BACKEND,
            format!(
                "invalid table name {:?}: each part must be a lowercase identifier \
                 ([a-z_][a-z0-9_]*) of at most {max} bytes",
                whole.chars().take(80).collect::<String>()
            ),
            None,
        ));
    }
    Ok(())
}

/// The bounds of a [fenced transaction](crate::MysqlLeaseStore::fenced_transaction).
///
/// - `lock_timeout`: InnoDB's `innodb_lock_wait_timeout` for the transaction's session, in
///   whole seconds (rounded up, at least 1 s, MySQL's granularity): how long the lease row's
///   lock (and any lock the caller's statements wait for) may be waited for. Default 2 s.
/// - `deadline`: the client-side bound of the whole call, taking the connection included;
///   past it the connection is closed (the server rolls back) and the call fails with a
///   retryable [`Error::Timeout`]. Default 10 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TxTimeouts {
    /// See the type's docs.
    pub lock_timeout: Duration,
    /// See the type's docs.
    pub deadline: Duration,
}

impl Default for TxTimeouts {
    fn default() -> Self {
        TxTimeouts {
            lock_timeout: Duration::from_secs(2),
            deadline: Duration::from_secs(10),
        }
    }
}

impl TxTimeouts {
    /// Sets the lock wait bound.
    pub fn with_lock_timeout(mut self, d: Duration) -> Self {
        self.lock_timeout = d;
        self
    }

    /// Sets the client-side deadline of the whole call.
    pub fn with_deadline(mut self, d: Duration) -> Self {
        self.deadline = d;
        self
    }
}

/// Whole seconds for `innodb_lock_wait_timeout`: rounded up, between 1 s and InnoDB's largest
/// value (1,073,741,824 s).
pub(crate) fn lock_wait_secs(d: Duration) -> u64 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    secs.clamp(1, 1_073_741_824)
}

/// The options of a [`MysqlLeaseStore`](crate::MysqlLeaseStore).
#[derive(Debug, Clone)]
pub struct MysqlOptions {
    table: TableName,
    op_timeout: Duration,
    max_connections: u32,
    acquire_timeout: Duration,
    tx: TxTimeouts,
    migrate: bool,
}

/// The query parameters of a store URL that set [`MysqlOptions`] (see the crate docs' table).
pub const URL_OPTIONS: &[&str] = &[
    "table",
    "migrate",
    "op_timeout",
    "max_connections",
    "acquire_timeout",
    "tx_lock_timeout",
    "tx_deadline",
];

/// The driver's own query parameters, handed to it unchanged (TLS, character set, socket).
pub const DRIVER_URL_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslca",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "charset",
    "collation",
    "socket",
    "statement-cache-capacity",
];

/// The driver's name of a TLS mode given as `ssl-mode=` (or `sslmode=`): MySQL's names
/// (`DISABLED`, `PREFERRED`, `REQUIRED`, `VERIFY_CA`, `VERIFY_IDENTITY`) in any case, with `-`
/// or `_` (`verify-identity` as the other backends' URLs spell their modes).
fn ssl_mode(value: &str) -> Result<&'static str> {
    let mode = match value.to_ascii_lowercase().replace('-', "_").as_str() {
        "disabled" => "disabled",
        "preferred" => "preferred",
        "required" => "required",
        "verify_ca" => "verify_ca",
        "verify_identity" => "verify_identity",
        _ => {
            return Err(Error::config(
                BACKEND,
                format!(
                    "invalid ssl-mode {:?}: one of disabled, preferred, required, verify-ca, \
                     verify-identity",
                    value.chars().take(40).collect::<String>()
                ),
                None,
            ));
        }
    };
    Ok(mode)
}

impl Default for MysqlOptions {
    fn default() -> Self {
        MysqlOptions::new(TableName::default())
    }
}

impl MysqlOptions {
    /// Defaults for `table`: 5 s per operation, a pool of 10 connections with a 2 s acquire
    /// timeout (for pools the store builds itself), [`TxTimeouts::default`], and the tables
    /// created on connect.
    pub fn new(table: TableName) -> Self {
        MysqlOptions {
            table,
            op_timeout: Duration::from_secs(5),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(2),
            tx: TxTimeouts::default(),
            migrate: true,
        }
    }

    /// Applies the [`URL_OPTIONS`] in `url`'s query on top of `self`, and gives back the URL for
    /// the driver: its base with only the [`DRIVER_URL_PARAMETERS`]. A TLS mode
    /// (`ssl-mode=verify-identity`, `verify_identity`, `VERIFY_CA`, ...) is checked here and handed
    /// on in the driver's spelling.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_mysql::MysqlOptions;
    /// let (url, opts) = MysqlOptions::default().with_url(
    ///     "mysql://u@db/app?table=app.locks&op_timeout=2s&ssl-mode=required",
    /// )?;
    /// assert_eq!(url, "mysql://u@db/app?ssl-mode=required");
    /// assert_eq!(opts.table().table(), "locks");
    /// assert_eq!(opts.op_timeout(), Duration::from_secs(2));
    /// assert!(MysqlOptions::default().with_url("mysql://db/app?ssl-cq=/ca.pem").is_err());
    /// let (url, _) = MysqlOptions::default()
    ///     .with_url("mysql://u@db/app?ssl-mode=verify-identity&ssl-ca=/etc/ca.pem")?;
    /// assert_eq!(url, "mysql://u@db/app?ssl-mode=verify_identity&ssl-ca=/etc/ca.pem");
    /// assert!(MysqlOptions::default().with_url("mysql://db/app?ssl-mode=verify-full").is_err());
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] for a parameter that is neither, or a value that does not parse.
    pub fn with_url(self, url: &str) -> Result<(String, MysqlOptions)> {
        let mut p = UrlParams::parse(BACKEND, url)?;
        let mut o = self;
        if let Some(t) = p.take("table") {
            o.table = TableName::parse(&t)?;
        }
        if let Some(on) = p.take_bool("migrate")? {
            o.migrate = on;
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
        if let Some(d) = p.take_duration("tx_deadline")? {
            o.tx.deadline = d;
        }
        let mut driver = p.take_all(DRIVER_URL_PARAMETERS);
        for (name, value) in &mut driver {
            if name == "ssl-mode" || name == "sslmode" {
                *value = ssl_mode(value)?.to_string();
            }
        }
        let base = p.base().to_string();
        let known: Vec<&str> = URL_OPTIONS
            .iter()
            .chain(DRIVER_URL_PARAMETERS)
            .copied()
            .collect();
        p.finish(&known)?;
        Ok((UrlParams::join(&base, &driver), o))
    }

    /// Whether [`connect_with`](crate::MysqlLeaseStore::connect_with) creates the tables and
    /// trigger (on by default); off, it only checks them
    /// ([`verify_schema`](crate::MysqlLeaseStore::verify_schema)).
    pub fn with_migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// See [`with_migrate`](Self::with_migrate).
    pub fn migrate(&self) -> bool {
        self.migrate
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The client-side bound of each lease operation (taking a pooled connection included),
    /// also used as the lock wait bound of each operation's transaction. Past it the operation
    /// fails with a retryable [`Error::Timeout`] and its connection is closed.
    pub fn with_op_timeout(mut self, d: Duration) -> Self {
        self.op_timeout = d;
        self
    }

    /// See [`with_op_timeout`](Self::with_op_timeout).
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// The pool size (for pools the store builds itself).
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// See [`with_max_connections`](Self::with_max_connections).
    pub fn max_connections(&self) -> u32 {
        self.max_connections
    }

    /// How long taking a pooled connection may wait (for pools the store builds itself).
    pub fn with_acquire_timeout(mut self, d: Duration) -> Self {
        self.acquire_timeout = d;
        self
    }

    /// See [`with_acquire_timeout`](Self::with_acquire_timeout).
    pub fn acquire_timeout(&self) -> Duration {
        self.acquire_timeout
    }

    /// The bounds of fenced transactions.
    pub fn with_tx_timeouts(mut self, tx: TxTimeouts) -> Self {
        self.tx = tx;
        self
    }

    /// See [`with_tx_timeouts`](Self::with_tx_timeouts).
    pub fn tx_timeouts(&self) -> TxTimeouts {
        self.tx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(TableName::parse("a.b").is_ok());
        for bad in [
            "",
            ".",
            "a.",
            ".b",
            "a.b.c",
            "A",
            "1a",
            "a-b",
            "a`b",
            &"x".repeat(49),
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad}");
        }
        assert!(TableName::parse(&"x".repeat(48)).is_ok());
        assert_eq!(
            TableName::parse("d.t").unwrap().sibling("_fence"),
            "`d`.`t_fence`"
        );
    }

    #[test]
    fn lock_waits_round_up_to_whole_seconds() {
        assert_eq!(lock_wait_secs(Duration::ZERO), 1);
        assert_eq!(lock_wait_secs(Duration::from_millis(1500)), 2);
        assert_eq!(lock_wait_secs(Duration::from_secs(3)), 3);
        assert_eq!(lock_wait_secs(Duration::MAX), 1_073_741_824);
    }

    #[test]
    fn unknown_url_parameters_are_refused() {
        let err = MysqlOptions::default()
            .with_url("mysql://h/db?tabel=x")
            .unwrap_err();
        assert!(err.to_string().contains("tabel"), "{err}");
        let (url, o) = MysqlOptions::default()
            .with_url("mysql://h/db?max_connections=3&tx_lock_timeout=3s&migrate=false")
            .unwrap();
        assert_eq!(url, "mysql://h/db");
        assert_eq!(o.max_connections(), 3);
        assert!(!o.migrate());
        assert_eq!(o.tx_timeouts().lock_timeout, Duration::from_secs(3));
    }

    #[test]
    fn tls_modes_are_checked_and_given_in_the_drivers_spelling() {
        for (given, driver) in [
            ("verify-identity", "verify_identity"),
            ("VERIFY_IDENTITY", "verify_identity"),
            ("verify-ca", "verify_ca"),
            ("Verify_Ca", "verify_ca"),
            ("required", "required"),
            ("PREFERRED", "preferred"),
            ("disabled", "disabled"),
        ] {
            for name in ["ssl-mode", "sslmode"] {
                let (url, _) = MysqlOptions::default()
                    .with_url(&format!("mysql://h/db?{name}={given}&table=t"))
                    .unwrap();
                assert_eq!(url, format!("mysql://h/db?{name}={driver}"), "{given}");
            }
        }
        for bad in ["verify-full", "", "on", "verify identity"] {
            let err = MysqlOptions::default()
                .with_url(&format!("mysql://h/db?ssl-mode={bad}"))
                .unwrap_err();
            assert!(
                matches!(err, Error::Config { .. }) && err.to_string().contains("ssl-mode"),
                "{bad}: {err}"
            );
        }
    }
}
