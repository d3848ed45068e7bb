//! [`RedisOptions`]: every knob of a [`RedisLeaseStore`](crate::RedisLeaseStore).

use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::backend::UrlParams;
use leasehold_core::{Error, Result};

use crate::error::BACKEND;
use crate::protocol::{DEFAULT_PREFIX, KeyLayout};
use crate::tls::TlsFiles;

/// The query parameters of a store URL that set [`RedisOptions`]
/// ([`RedisOptions::with_url`]); see the crate docs, "Options in the URL".
pub const URL_OPTIONS: &[&str] = &[
    "prefix",
    "response_timeout",
    "connect_timeout",
    "connect_retries",
    "wait_for_replicas",
    "wait_timeout",
    "watch_poll_interval",
    "allow_eviction",
    "tls_ca",
    "tls_cert",
    "tls_key",
];

/// The query parameters the `redis` driver reads itself, passed on to it unchanged: `protocol`
/// (`resp2`/`resp3`), and `db`, `user`, `pass` of a `redis+unix://` URL.
pub const DRIVER_URL_PARAMETERS: &[&str] = &["protocol", "db", "user", "pass"];

/// Wait for replicas after each grant (`WAIT numreplicas timeout`); see
/// [`RedisOptions::with_wait_for_replicas`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    /// How many replicas must acknowledge the grant.
    pub replicas: u32,
    /// How long to wait for them.
    pub timeout: Duration,
}

/// The options of a [`RedisLeaseStore`](crate::RedisLeaseStore), for
/// [`connect_with`](crate::RedisLeaseStore::connect_with). `Default` is what
/// [`connect`](crate::RedisLeaseStore::connect) uses.
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_redis::{RedisLeaseStore, RedisOptions};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let options = RedisOptions::default()
///     .with_prefix("jobs")
///     .with_response_timeout(Duration::from_secs(2))
///     .with_wait_for_replicas(1, Duration::from_millis(200));
/// let store = RedisLeaseStore::connect_with("redis://127.0.0.1:6379", options).await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) connect_retries: usize,
    pub(crate) replica_wait: Option<ReplicaWait>,
    pub(crate) poll_interval: Duration,
    pub(crate) allow_eviction: bool,
    pub(crate) tls: TlsFiles,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: DEFAULT_PREFIX.to_string(),
            response_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            connect_retries: 2,
            replica_wait: None,
            poll_interval: Duration::from_millis(250),
            allow_eviction: false,
            tls: TlsFiles::default(),
        }
    }
}

impl RedisOptions {
    /// The key prefix (default `lease`); see [`KeyLayout`] for the names built from it.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a command may take before it fails with [`Error::Timeout`] (default 5 s). Must
    /// not be zero.
    ///
    /// Together with the connect timeout it also sets the **operation deadline**, the longest any
    /// operation of the store waits, reconnecting included: connect timeout + 2 × response
    /// timeout (one reconnection attempt, then at most two round trips: a script's `EVALSHA` and,
    /// on a server that lost its script cache, `EVAL`). See
    /// [`RedisLeaseStore::op_deadline`](crate::RedisLeaseStore::op_deadline).
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take (default 5 s). Must not be zero.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How often a failed (re)connection is retried before an operation fails with
    /// [`Error::Unavailable`] (default 2). Retries happen within the
    /// [operation deadline](crate::RedisLeaseStore::op_deadline): an operation waiting for a
    /// reconnection fails with [`Error::Timeout`] when the deadline passes, however many retries
    /// are left (the reconnection goes on in the background).
    pub fn with_connect_retries(mut self, retries: usize) -> Self {
        self.connect_retries = retries;
        self
    }

    /// After each grant, run `WAIT replicas timeout` (pipelined right after the acquire script on
    /// the same connection, since `WAIT` counts only that connection's writes) and fail the
    /// acquire with [`Error::Unavailable`] (after releasing the grant, best effort) unless at
    /// least `replicas` replicas acknowledged it.
    ///
    /// **What it promises:** a successful acquire was received by that many replicas, which
    /// narrows the window in which a failover to a replica loses the grant. **What it does not:**
    /// `WAIT` is not consensus. A replica that acknowledged may still not be the one promoted, the
    /// grant is already visible on the primary while waiting, renewals and releases are not waited
    /// for, and `WAIT` blocks this store's multiplexed connection for up to `timeout`. Safety
    /// still comes from the fencing token (see the crate docs). `timeout` must be shorter than the
    /// response timeout.
    ///
    /// [`acquire_many`](leasehold_core::LeaseStore::acquire_many) waits the same way: one `WAIT`
    /// after each group's scripts (on a single server, after the whole batch). When too few
    /// replicas acknowledge, every key the group granted gets its own retryable
    /// [`Error::Unavailable`] in its slot; the call itself returns `Ok`, and keys held by others
    /// stay `Held`. Those grants are released again, best effort: assume such a key may still be
    /// held in this owner's name on the primary until its TTL runs out, that it is not on enough
    /// replicas to survive a failover, and that its token is spent (the key's next grant gets a
    /// greater one). Retrying is safe; only an `Acquired` outcome is a lease.
    pub fn with_wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_wait = Some(ReplicaWait { replicas, timeout });
        self
    }

    /// How often a [`watch`](leasehold_core::LeaseStore::watch) signals "look again" when the server
    /// does not publish keyspace notifications for expiry (default 250 ms; on Redis Cluster
    /// always). Releases wake a watcher at once regardless, through the release channel.
    pub fn with_watch_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Whether to connect to a server whose `maxmemory-policy` is not `noeviction` (default
    /// `false`: such a server is refused with [`Error::Config`]).
    ///
    /// A lease record carries a TTL, so under every other policy (`volatile-*` evicts keys with
    /// a TTL, `allkeys-*` any key) a server that reaches `maxmemory` may **delete a held lease**
    /// and grant the key to the next owner while the holder still believes it holds it, as a
    /// failover does. With `true` the store connects anyway and logs a warning (`tracing`); only
    /// the fencing token then keeps the protected resource safe, and only if its high-water mark
    /// lives outside this Redis. The policy is read once, at connect; see the crate docs
    /// ("Eviction") for what happens when `CONFIG GET` is not permitted.
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// Trust the CA certificate(s) in the PEM file at `path` for a `rediss://` or
    /// `rediss+cluster://` URL, instead of the built-in web roots (Mozilla's, from
    /// `webpki-roots`). The same as the URL parameter `tls_ca=<path>`; giving both is an
    /// [`Error::Config`]. The file is read at connect; an unreadable file is an
    /// [`Error::Config`] naming it.
    pub fn with_tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls.ca = Some(path.into());
        self
    }

    /// Present the client certificate (chain) in the PEM file `cert`, with its private key in
    /// the PEM file `key`, to a server that asks for one (mutual TLS: `tls-auth-clients yes` or
    /// `optional`). The same as the URL parameters `tls_cert=<path>&tls_key=<path>`; giving
    /// either both ways is an [`Error::Config`]. Read at connect.
    pub fn with_tls_client_cert(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.tls.cert = Some(cert.into());
        self.tls.key = Some(key.into());
        self
    }

    /// Applies the [`URL_OPTIONS`] in `url`'s query on top of `self`, and gives back the URL for
    /// the driver: without them, with the driver's own [`DRIVER_URL_PARAMETERS`] (and a
    /// `#insecure` fragment) kept. A setting in the URL replaces the one in `self`, except the
    /// TLS files: naming one both ways is an error, so that two different CAs never meet
    /// silently. `wait_for_replicas=N` needs `wait_timeout=<duration>` (or a wait already set in
    /// `self`, whose timeout it keeps); `wait_timeout` alone changes the timeout of a wait set in
    /// `self`. The values are checked when the store connects, as those set in code are.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_redis::RedisOptions;
    /// let (url, opts) = RedisOptions::default()
    ///     .with_url("redis://cache:6379/2?prefix=jobs&response_timeout=2s&protocol=resp3")?;
    /// assert_eq!(url, "redis://cache:6379/2?protocol=resp3");
    /// assert_eq!(opts, RedisOptions::default()
    ///     .with_prefix("jobs")
    ///     .with_response_timeout(Duration::from_secs(2)));
    /// let err = RedisOptions::default().with_url("redis://cache?prefx=jobs").unwrap_err();
    /// assert!(err.to_string().contains("prefx"));
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] naming the parameter for an unknown, repeated or malformed one (a
    /// duration without its unit, a count that is not one, a boolean that is not
    /// `true`/`false`), a TLS file given both in the URL and in `self`, or a
    /// `wait_for_replicas` without a timeout (or the reverse).
    pub fn with_url(self, url: &str) -> Result<(String, RedisOptions)> {
        let mut p = UrlParams::parse(BACKEND, url)?;
        let mut o = self;
        if let Some(prefix) = p.take("prefix") {
            o.prefix = prefix;
        }
        if let Some(d) = p.take_duration("response_timeout")? {
            o.response_timeout = d;
        }
        if let Some(d) = p.take_duration("connect_timeout")? {
            o.connect_timeout = d;
        }
        if let Some(n) = p.take_count("connect_retries")? {
            o.connect_retries = n;
        }
        let replicas = p.take_count::<u32>("wait_for_replicas")?;
        let wait_timeout = p.take_duration("wait_timeout")?;
        let known = o.replica_wait;
        o.replica_wait = match (replicas, wait_timeout, known) {
            (None, None, _) => known,
            (Some(replicas), Some(timeout), _) => Some(ReplicaWait { replicas, timeout }),
            (Some(replicas), None, Some(w)) => Some(ReplicaWait { replicas, ..w }),
            (None, Some(timeout), Some(w)) => Some(ReplicaWait { timeout, ..w }),
            (Some(_), None, None) => {
                return Err(Error::config(
                    BACKEND,
                    "URL parameter wait_for_replicas needs wait_timeout=<duration> (how long \
                     WAIT waits, below the response timeout)",
                    None,
                ));
            }
            (None, Some(_), None) => {
                return Err(Error::config(
                    BACKEND,
                    "URL parameter wait_timeout needs wait_for_replicas=<count>",
                    None,
                ));
            }
        };
        if let Some(d) = p.take_duration("watch_poll_interval")? {
            o.poll_interval = d;
        }
        if let Some(on) = p.take_bool("allow_eviction")? {
            o.allow_eviction = on;
        }
        for (name, slot) in [
            ("tls_ca", &mut o.tls.ca),
            ("tls_cert", &mut o.tls.cert),
            ("tls_key", &mut o.tls.key),
        ] {
            if let Some(path) = p.take(name) {
                if slot.is_some() {
                    return Err(Error::config(
                        BACKEND,
                        format!("{name} is given both in the URL and in the options"),
                        None,
                    ));
                }
                *slot = Some(PathBuf::from(path));
            }
        }
        let url = p.finish_for_driver(URL_OPTIONS, DRIVER_URL_PARAMETERS)?;
        Ok((url, o))
    }

    /// The operation deadline these options give: connect timeout + 2 × response timeout.
    pub(crate) fn op_deadline(&self) -> Duration {
        self.connect_timeout
            .saturating_add(self.response_timeout.saturating_mul(2))
    }

    /// Checks the options and builds the key layout.
    ///
    /// # Errors
    /// [`Error::Config`] for an illegal prefix, a zero response or connect timeout, or a `WAIT`
    /// timeout not below the response timeout.
    pub(crate) fn validate(&self) -> Result<KeyLayout> {
        let layout = KeyLayout::new(self.prefix.clone())?;
        for (name, value) in [
            ("response timeout", self.response_timeout),
            ("connect timeout", self.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::config(
                    BACKEND,
                    format!("the {name} must not be zero"),
                    None,
                ));
            }
        }
        if let Some(w) = self.replica_wait
            && w.timeout >= self.response_timeout
        {
            return Err(Error::config(
                BACKEND,
                format!(
                    "WAIT timeout {:?} must be below the response timeout {:?}",
                    w.timeout, self.response_timeout
                ),
                None,
            ));
        }
        Ok(layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_is_read_off_the_url_of_every_scheme() {
        let query = "prefix=jobs&response_timeout=2s&connect_timeout=500ms&connect_retries=7\
                     &wait_for_replicas=1&wait_timeout=100ms&watch_poll_interval=1m\
                     &allow_eviction=yes&protocol=resp3";
        let expected = RedisOptions::default()
            .with_prefix("jobs")
            .with_response_timeout(Duration::from_secs(2))
            .with_connect_timeout(Duration::from_millis(500))
            .with_connect_retries(7)
            .with_wait_for_replicas(1, Duration::from_millis(100))
            .with_watch_poll_interval(Duration::from_secs(60))
            .allow_eviction(true);
        for base in [
            "redis://u:p@h:1/2",
            "rediss://h:1",
            "redis+cluster://a:1,b:2",
            "rediss+cluster://a:1,b:2",
            "redis+sentinel://s:1,t:2/mymaster/3",
        ] {
            let (url, o) = RedisOptions::default()
                .with_url(&format!("{base}?{query}"))
                .unwrap();
            assert_eq!(url, format!("{base}?protocol=resp3"));
            assert_eq!(o, expected, "{base}");
        }
        let (url, o) = RedisOptions::default()
            .with_url("rediss://h:1?tls_ca=/ca&tls_cert=/c&tls_key=/k#insecure")
            .unwrap();
        assert_eq!(url, "rediss://h:1#insecure");
        assert_eq!(
            o,
            RedisOptions::default()
                .with_tls_ca_file("/ca")
                .with_tls_client_cert("/c", "/k")
        );
    }

    #[test]
    fn the_url_overrides_code_and_completes_a_wait() {
        let code = RedisOptions::default()
            .with_prefix("code")
            .with_wait_for_replicas(2, Duration::from_millis(50));
        let (_, o) = code
            .clone()
            .with_url("redis://h?prefix=url&wait_for_replicas=3")
            .unwrap();
        assert_eq!(o.prefix, "url");
        assert_eq!(
            o.replica_wait,
            Some(ReplicaWait {
                replicas: 3,
                timeout: Duration::from_millis(50)
            })
        );
        let (_, o) = code.clone().with_url("redis://h?wait_timeout=1s").unwrap();
        assert_eq!(
            o.replica_wait.map(|w| (w.replicas, w.timeout)),
            Some((2, Duration::from_secs(1)))
        );
        let (url, same) = code.clone().with_url("redis://h").unwrap();
        assert_eq!((url.as_str(), same), ("redis://h", code));
    }

    #[test]
    fn bad_parameters_are_config_errors_naming_them() {
        for (query, name) in [
            ("prefx=jobs", "prefx"),
            ("response_timeout=5", "response_timeout"),
            ("connect_timeout=-1s", "connect_timeout"),
            ("connect_retries=x", "connect_retries"),
            ("wait_for_replicas=-1&wait_timeout=1s", "wait_for_replicas"),
            ("wait_for_replicas=1", "wait_for_replicas"),
            ("wait_timeout=1s", "wait_timeout"),
            ("watch_poll_interval=", "watch_poll_interval"),
            ("allow_eviction=maybe", "allow_eviction"),
            ("prefix=a&prefix=b", "prefix"),
            ("sslmode=require", "sslmode"),
        ] {
            match RedisOptions::default().with_url(&format!("redis://h:1?{query}")) {
                Err(Error::Config { message, .. }) => {
                    assert!(message.contains(name), "{query}: {message}");
                }
                other => panic!("{query}: expected Config, got {other:?}"),
            }
        }
    }
}
