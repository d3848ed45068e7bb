// This file stays whole past 600 lines (about 490 of code, the rest tests): the options, the URL
// parameters that set them and the endpoint list an `etcd://` URL names are one contract,
// checked against each other by the tests here.
//! [`EtcdOptions`]: every knob of the etcd backend, and what an `etcd://` URL names.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::{Error, LeaseKey, Result};

use crate::error::BACKEND;
use crate::protocol::{self, DEFAULT_FENCE_PREFIX, DEFAULT_PREFIX};

/// The query parameters of an `etcd://` URL that set [`EtcdOptions`]
/// ([`EtcdOptions::with_url`]); see the crate docs, "Options in the URL".
pub const URL_OPTIONS: &[&str] = &[
    "prefix",
    "fence_prefix",
    "connect_timeout",
    "request_timeout",
    "lease_sharing",
    "tls_ca",
    "tls_cert",
    "tls_key",
];

/// How grants map to etcd leases.
///
/// The default, [`LeaseSharing::ReservedPerTtl`], gives every key a caller names an etcd lease
/// of its own (as [`PerGrant`](LeaseSharing::PerGrant): a single lease or an election is
/// `etcdctl lock`'s lock with an etcd lease of its own, its expiry decided by etcd alone) and
/// puts the keys the library derives for its many-key structures (the
/// [reserved](leasehold_core::LeaseKey::reserved) namespace: a shard set's shards, membership
/// slots and mailboxes, a semaphore's permits, an election's presence and handover keys) on one
/// shared etcd lease per TTL (as [`PerTtl`](LeaseSharing::PerTtl)). So a shard worker over one
/// default store renews its thousands of shards with a few keepalives, with nothing to
/// configure.
///
/// ```
/// use leasehold_core::LeaseKey;
/// use leasehold_etcd::{EtcdOptions, LeaseSharing};
/// let sharing = EtcdOptions::default().lease_sharing();
/// assert_eq!(sharing, LeaseSharing::ReservedPerTtl);
/// let named = LeaseKey::new("orders")?;
/// let shard = named.reserved("s.p0")?; // a shard set's key for shard p0 of set "orders"
/// assert!(!sharing.shares_etcd_lease(&named));
/// assert!(sharing.shares_etcd_lease(&shard));
/// assert!(LeaseSharing::PerTtl.shares_etcd_lease(&named));
/// assert!(!LeaseSharing::PerGrant.shares_etcd_lease(&shard));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LeaseSharing {
    /// Every grant gets its own etcd lease. Expiry of each key is decided by etcd alone; a
    /// renewal is one keepalive; a process holding N keys sends N keepalives per renewal
    /// interval. (The default until keys in the reserved namespace moved to shared etcd leases:
    /// [`ReservedPerTtl`](LeaseSharing::ReservedPerTtl) is this for every key a caller names.)
    PerGrant,
    /// All keys one store grants with the same TTL (in whole seconds) share one etcd lease.
    /// Renewals of those keys within a tenth of the TTL share one keepalive, so a process holding
    /// thousands of keys sends a few keepalives per interval. Per-key expiry is enforced by the
    /// store itself: a background task deletes a key (by transaction on its create revision and
    /// etcd lease) once its holder stopped renewing it for its TTL (checked every 100 ms), and
    /// deletes the key of an acquire whose outcome its caller never learned (an error, or a
    /// dropped future): at the next check if the put has committed by then; a put that commits
    /// later (its request was still on its way to etcd, or queued there) is found by reading the
    /// keys of its etcd lease, 0.1 s after that check and then at doubling intervals up to once
    /// per TTL for as long as the etcd lease lives, and deleted then: within about one TTL of its
    /// commit, sooner when it commits soon. If the process dies, the shared etcd lease expires and etcd deletes every
    /// key. A lease renewed through another store (another process) has its key moved onto that
    /// store's etcd lease first (one extra write), so only one store ever sweeps it. The cost: a
    /// key whose holder hangs while the process lives is freed by the sweeper rather than by etcd.
    /// See `docs/adr/0030-etcd-lease-sharing.md`.
    PerTtl,
    /// The default: keys in the library's [reserved](leasehold_core::LeaseKey::reserved)
    /// namespace (those [`LeaseKey::is_reserved`](leasehold_core::LeaseKey::is_reserved) names:
    /// no caller can name one with [`LeaseKey::new`](leasehold_core::LeaseKey::new)) as with
    /// [`PerTtl`](LeaseSharing::PerTtl), every other key as with
    /// [`PerGrant`](LeaseSharing::PerGrant). The keys of a shard set, a semaphore or an
    /// election's presence are held many per process and renewed together; a key a caller names
    /// keeps an etcd lease of its own. The store's sweeper starts with the first shared etcd
    /// lease it grants: a store that never grants a reserved key runs none.
    #[default]
    ReservedPerTtl,
}

impl LeaseSharing {
    /// Whether a grant of `key` goes on a shared etcd lease (one per store and TTL) in this
    /// mode; otherwise it gets an etcd lease of its own. See [`LeaseSharing`] for an example.
    pub fn shares_etcd_lease(self, key: &LeaseKey) -> bool {
        match self {
            LeaseSharing::PerGrant => false,
            LeaseSharing::PerTtl => true,
            LeaseSharing::ReservedPerTtl => key.is_reserved(),
        }
    }

    /// Whether any key shares an etcd lease in this mode (the store then keeps shared state).
    pub(crate) fn shares_any(self) -> bool {
        self != LeaseSharing::PerGrant
    }
}

/// Options of an [`EtcdLeaseStore`](crate::EtcdLeaseStore) and its
/// [`EtcdFencedResource`](crate::EtcdFencedResource), for
/// [`EtcdLeaseStore::connect_with`](crate::EtcdLeaseStore::connect_with). The endpoints come
/// from the URL.
///
/// ```
/// use std::time::Duration;
/// use leasehold_etcd::EtcdOptions;
/// let options = EtcdOptions::default()
///     .with_prefix("jobs/")
///     .with_connect_timeout(Duration::from_millis(500));
/// assert_eq!(options.lock_name(&"nightly".parse()?), "jobs/nightly");
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    prefix: String,
    fence_prefix: String,
    connect_timeout: Duration,
    request_timeout: Duration,
    lease_sharing: LeaseSharing,
    tls_ca: Option<PathBuf>,
    tls_client_cert: Option<(PathBuf, PathBuf)>,
    user: Option<(String, Password)>,
}

/// A password, kept out of `Debug` output.
#[derive(Clone, PartialEq, Eq)]
struct Password(String);

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

impl Default for EtcdOptions {
    /// The default prefixes ([`DEFAULT_PREFIX`], [`DEFAULT_FENCE_PREFIX`]), a 2 s connect
    /// timeout, a 5 s request timeout and [`LeaseSharing::ReservedPerTtl`].
    fn default() -> Self {
        EtcdOptions {
            prefix: DEFAULT_PREFIX.to_string(),
            fence_prefix: DEFAULT_FENCE_PREFIX.to_string(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            lease_sharing: LeaseSharing::ReservedPerTtl,
            tls_ca: None,
            tls_client_cert: None,
            user: None,
        }
    }
}

impl EtcdOptions {
    /// Sets the prefix of lock names (default [`DEFAULT_PREFIX`]). A lease on key `k` is the etcd
    /// lock named `<prefix>k`, held as a key under `<prefix>k/` (see
    /// [`protocol`](crate::protocol)), the lock `etcdctl lock <prefix>k` and Go's
    /// `concurrency.NewMutex(session, "<prefix>k")` contend for.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the prefix of the fenced resource's keys (default [`DEFAULT_FENCE_PREFIX`]).
    pub fn with_fence_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.fence_prefix = prefix.into();
        self
    }

    /// Sets how long establishing a connection may take before the call fails with
    /// [`Error::Unavailable`] (default 2 s). Zero is refused by
    /// [`connect_with`](crate::EtcdLeaseStore::connect_with) ([`Error::Config`]); any other value
    /// works, up to `Duration::MAX` (then only the request timeout bounds a connect).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how long one request may take before it fails with [`Error::Timeout`] (default 5 s).
    /// Zero is refused by [`connect_with`](crate::EtcdLeaseStore::connect_with)
    /// ([`Error::Config`]); any other value works, up to `Duration::MAX` (no limit). It also bounds
    /// how long an HTTP/2 ping may go unanswered before the connection is dropped (at most an
    /// hour).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets how grants map to etcd leases (default [`LeaseSharing::ReservedPerTtl`]).
    pub fn with_lease_sharing(mut self, sharing: LeaseSharing) -> Self {
        self.lease_sharing = sharing;
        self
    }

    /// Sets the PEM file of the CA certificate(s) that sign the etcd servers' certificates, for
    /// `etcds://` URLs (the URL's `tls_ca` parameter does the same). Without it the system's
    /// trust store is used. The file is read by
    /// [`connect_with`](crate::EtcdLeaseStore::connect_with): a missing file or one without a
    /// certificate is [`Error::Config`] naming it.
    ///
    /// ```
    /// let options = leasehold_etcd::EtcdOptions::default().with_tls_ca("/etc/etcd/ca.crt");
    /// assert_eq!(options.tls_ca(), Some(std::path::Path::new("/etc/etcd/ca.crt")));
    /// ```
    pub fn with_tls_ca(mut self, ca: impl Into<PathBuf>) -> Self {
        self.tls_ca = Some(ca.into());
        self
    }

    /// Sets the client certificate and its private key (PEM files) this store presents to etcd
    /// servers that require one (`--client-cert-auth`), for `etcds://` URLs (the URL's `tls_cert`
    /// and `tls_key` parameters do the same). With etcd authentication enabled and no user set,
    /// etcd takes the certificate's common name as the user.
    ///
    /// ```
    /// let options = leasehold_etcd::EtcdOptions::default()
    ///     .with_tls_client_cert("/etc/etcd/client.crt", "/etc/etcd/client.key");
    /// assert!(options.tls_client_cert().is_some());
    /// ```
    pub fn with_tls_client_cert(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.tls_client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Sets the etcd user and password this store authenticates as (etcd's `auth enable`); the
    /// URL form `etcd://user:password@host:port` does the same. The store fetches a token on
    /// connect and a new one when it expires. A wrong user or password is [`Error::Config`] from
    /// [`connect_with`](crate::EtcdLeaseStore::connect_with). The password never appears in
    /// `Debug` output.
    ///
    /// ```
    /// let options = leasehold_etcd::EtcdOptions::default().with_user("app", "s3cret");
    /// assert_eq!(options.user(), Some("app"));
    /// assert!(!format!("{options:?}").contains("s3cret"));
    /// ```
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), Password(password.into())));
        self
    }

    /// The CA certificate file, if set.
    pub fn tls_ca(&self) -> Option<&std::path::Path> {
        self.tls_ca.as_deref()
    }

    /// The client certificate and key files, if set.
    pub fn tls_client_cert(&self) -> Option<(&std::path::Path, &std::path::Path)> {
        self.tls_client_cert
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()))
    }

    /// The etcd user, if set.
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|(u, _)| u.as_str())
    }

    /// The user and password, if set.
    pub(crate) fn credentials(&self) -> Option<(&str, &str)> {
        self.user.as_ref().map(|(u, p)| (u.as_str(), p.0.as_str()))
    }

    /// How grants map to etcd leases.
    pub fn lease_sharing(&self) -> LeaseSharing {
        self.lease_sharing
    }

    /// The prefix of lock names.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The prefix of the fenced resource's keys.
    pub fn fence_prefix(&self) -> &str {
        &self.fence_prefix
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The request timeout.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// How long an HTTP/2 ping may go unanswered before the connection is dropped: the request
    /// timeout, at most an hour (the driver adds it to the current instant, which a larger
    /// value would overflow).
    pub(crate) fn keep_alive_timeout(&self) -> Duration {
        self.request_timeout.min(Duration::from_secs(3600))
    }

    /// The etcd lock name of `key`: what `etcdctl lock` must be given to contend for it.
    pub fn lock_name(&self, key: &LeaseKey) -> String {
        protocol::lock_name(&self.prefix, key)
    }

    /// Applies the [`URL_OPTIONS`] in `url`'s query on top of `self` (a setting in the URL
    /// replaces the one in `self`), and gives back the URL without its query. The user
    /// information (`user:password@`) and the endpoints are read by
    /// [`connect_with`](crate::EtcdLeaseStore::connect_with), as are the values checked
    /// (non-zero timeouts, readable TLS files).
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_etcd::{EtcdOptions, LeaseSharing};
    /// let (url, opts) = EtcdOptions::default()
    ///     .with_url("etcd://a:2379,b:2379?prefix=jobs/&request_timeout=2s&lease_sharing=per_ttl")?;
    /// assert_eq!(url, "etcd://a:2379,b:2379");
    /// assert_eq!(opts, EtcdOptions::default()
    ///     .with_prefix("jobs/")
    ///     .with_request_timeout(Duration::from_secs(2))
    ///     .with_lease_sharing(LeaseSharing::PerTtl));
    /// let err = EtcdOptions::default().with_url("etcd://a:2379?prefx=jobs/").unwrap_err();
    /// assert!(err.to_string().contains("prefx"));
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] naming the parameter for an unknown, repeated or malformed one (a
    /// duration without its unit, a sharing mode other than `per_grant`, `per_ttl` or
    /// `reserved_per_ttl`, an empty
    /// TLS file), or `tls_cert` without `tls_key` (or the reverse).
    pub fn with_url(self, url: &str) -> Result<(String, EtcdOptions)> {
        let mut p = leasehold_core::backend::UrlParams::parse(BACKEND, url.trim())?;
        let mut o = self;
        if let Some(prefix) = p.take("prefix") {
            o.prefix = prefix;
        }
        if let Some(prefix) = p.take("fence_prefix") {
            o.fence_prefix = prefix;
        }
        if let Some(d) = p.take_duration("connect_timeout")? {
            o.connect_timeout = d;
        }
        if let Some(d) = p.take_duration("request_timeout")? {
            o.request_timeout = d;
        }
        if let Some(sharing) = p.take_with("lease_sharing", |v| match v {
            "per_grant" => Ok(LeaseSharing::PerGrant),
            "per_ttl" => Ok(LeaseSharing::PerTtl),
            "reserved_per_ttl" => Ok(LeaseSharing::ReservedPerTtl),
            _ => Err("expected per_grant, per_ttl or reserved_per_ttl".into()),
        })? {
            o.lease_sharing = sharing;
        }
        let mut file = |name: &str| {
            p.take_with(name, |v| {
                if v.is_empty() {
                    Err("needs a value (a percent-encoded path)".into())
                } else {
                    Ok(PathBuf::from(v))
                }
            })
        };
        let (ca, cert, key) = (file("tls_ca")?, file("tls_cert")?, file("tls_key")?);
        if let Some(ca) = ca {
            o.tls_ca = Some(ca);
        }
        match (cert, key) {
            (Some(cert), Some(key)) => o.tls_client_cert = Some((cert, key)),
            (None, None) => {}
            _ => {
                return Err(Error::config(
                    BACKEND,
                    "URL parameters tls_cert and tls_key go together",
                    None,
                ));
            }
        }
        let base = p.base().to_string();
        p.finish(URL_OPTIONS)?;
        Ok((base, o))
    }

    /// Checks what can be checked without a server: timeouts non-zero, a user name not empty.
    pub(crate) fn validate(&self) -> Result<()> {
        for (name, value) in [
            ("connect timeout", self.connect_timeout),
            ("request timeout", self.request_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::config(
                    BACKEND,
                    format!("the {name} must be non-zero"),
                    None,
                ));
            }
        }
        if self.user().is_some_and(str::is_empty) {
            return Err(Error::config(BACKEND, "the etcd user name is empty", None));
        }
        Ok(())
    }
}

/// What an etcd URL names: the endpoints, whether they speak TLS, and the options with what its
/// user information and query parameters set.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) endpoints: Vec<String>,
    pub(crate) tls: bool,
    pub(crate) options: EtcdOptions,
}

/// Parses `url` (its endpoints as `endpoints_of` reads them) with its user information
/// (`etcd://user:password@host:port`, percent-encoded) and query parameters
/// ([`EtcdOptions::with_url`]), which override those of `options`. Refuses unknown or repeated parameters, TLS files on a plain
/// `etcd://` URL, a user without a password, and empty values.
pub(crate) fn target_of(url: &str, options: EtcdOptions) -> Result<Target> {
    let bad = |why: String| Error::config(BACKEND, format!("{}: {why}", redacted(url)), None);
    let (rest, mut options) = options.with_url(url)?;
    let (scheme, hosts) = rest.split_once("://").unwrap_or((rest.as_str(), ""));
    let (user, hosts) = match hosts.rsplit_once('@') {
        Some((user, hosts)) => (Some(user), hosts),
        None => (None, hosts),
    };
    let endpoints = endpoints(&format!("{scheme}://{hosts}")).map_err(bad)?;
    let tls = scheme.eq_ignore_ascii_case("etcds");
    if let Some(user) = user {
        let (name, password) = user
            .split_once(':')
            .ok_or_else(|| bad("a user without a password (expected user:password@)".into()))?;
        let name = percent_decode(name)
            .ok_or_else(|| bad("the user is not percent-encoded UTF-8".into()))?;
        let password = percent_decode(password)
            .ok_or_else(|| bad("the password is not percent-encoded UTF-8".into()))?;
        if name.is_empty() {
            return Err(bad("the user name is empty".into()));
        }
        options = options.with_user(name, password);
    }
    if !tls && (options.tls_ca.is_some() || options.tls_client_cert.is_some()) {
        return Err(bad(
            "TLS files are set but the URL is plain etcd:// (use etcds:// for TLS)".into(),
        ));
    }
    Ok(Target {
        endpoints,
        tls,
        options,
    })
}

/// `url` with the password of its user information replaced, for error messages.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let cut = rest.find(['?', '/']).unwrap_or(rest.len());
    match rest[..cut].rsplit_once('@') {
        Some((user, hosts)) => {
            let name = user.split_once(':').map_or(user, |(n, _)| n);
            format!("{scheme}://{name}:***@{hosts}{}", &rest[cut..])
        }
        None => url.to_string(),
    }
}

/// Decodes the `%XX` escapes of user information (no `+` for space: passwords keep their `+`);
/// `None` for a broken escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The endpoints of an etcd URL: `etcd://host:port,host:port` (plain HTTP/2) or
/// `etcds://host:port,...` (TLS), the form the `lease` facade accepts; a trailing `/` is
/// allowed. Each endpoint becomes `http://host:port` (or `https://`).
#[cfg(test)]
pub(crate) fn endpoints_of(url: &str) -> Result<Vec<String>> {
    endpoints(url).map_err(|why| Error::config(BACKEND, format!("{url:?}: {why}"), None))
}

/// As [`endpoints_of`], with only the reason as the error.
fn endpoints(url: &str) -> std::result::Result<Vec<String>, String> {
    let bad = |why: String| why;
    let url = url.trim();
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("not an etcd URL (expected etcd://host:port,host:port)".into()))?;
    let http = match scheme.to_ascii_lowercase().as_str() {
        "etcd" => "http",
        "etcds" => "https",
        other => {
            return Err(bad(format!(
                "scheme {other:?} is not etcd or etcds (expected etcd://host:port,host:port)"
            )));
        }
    };
    let list = rest.strip_suffix('/').unwrap_or(rest);
    if list.is_empty() {
        return Err(bad("names no host".into()));
    }
    list.split(',')
        .map(str::trim)
        .map(|ep| {
            let (host, port) = ep.rsplit_once(':').unwrap_or((ep, "0"));
            let bad_host = host.is_empty()
                || host
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || "/?#@,".contains(c))
                || (host.contains(':') && !(host.starts_with('[') && host.ends_with(']')));
            if bad_host || port.parse::<u16>().is_err() {
                return Err(bad(format!(
                    "{ep:?} is not an endpoint (expected etcd://host:port,host:port)"
                )));
            }
            Ok(format!("{http}://{ep}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_carry_tls_files_and_credentials() {
        let t = target_of(
            "etcds://app:p%40ss+w@a:1,b:2?tls_ca=/ca%20dir/ca.crt&tls_cert=/c.crt&tls_key=/c.key",
            EtcdOptions::default(),
        )
        .unwrap();
        assert!(t.tls);
        assert_eq!(t.endpoints, ["https://a:1", "https://b:2"]);
        assert_eq!(t.options.credentials(), Some(("app", "p@ss+w")));
        let path = std::path::Path::new;
        assert_eq!(t.options.tls_ca(), Some(path("/ca dir/ca.crt")));
        assert_eq!(
            t.options.tls_client_cert(),
            Some((path("/c.crt"), path("/c.key")))
        );
        // The URL's values win over the options'.
        let t = target_of(
            "etcds://h:1?tls_ca=/url.crt",
            EtcdOptions::default().with_tls_ca("/opt.crt"),
        )
        .unwrap();
        assert_eq!(t.options.tls_ca(), Some(path("/url.crt")));
        let t = target_of("etcd://u:pw@h:1/", EtcdOptions::default()).unwrap();
        assert!(!t.tls);
        assert_eq!(t.options.credentials(), Some(("u", "pw")));
        for (bad, why) in [
            ("etcds://h:1?tls_ca=/a&tls_ca=/b", "twice"),
            (
                "etcds://h:1?tls_cafile=/a",
                "unknown URL parameter tls_cafile",
            ),
            (
                "etcds://h:1?sslmode=require",
                "unknown URL parameter sslmode",
            ),
            ("etcds://h:1?tls_ca=", "needs a value"),
            ("etcds://h:1?tls_ca", "has no value"),
            ("etcds://h:1?tls_ca=%zz", "bad % escape"),
            ("etcds://h:1?tls_cert=/c", "go together"),
            ("etcd://h:1?tls_ca=/ca", "plain etcd://"),
            ("etcd://user@h:1", "without a password"),
            ("etcd://:pw@h:1", "user name is empty"),
            ("etcd://u:secret@", "names no host"),
        ] {
            match target_of(bad, EtcdOptions::default()) {
                Err(Error::Config { message, .. }) => {
                    assert!(message.contains(why), "{bad}: {message}");
                    assert!(!message.contains("secret"), "{bad}: {message}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(matches!(
            target_of(
                "etcd://h:1",
                EtcdOptions::default().with_tls_client_cert("/c", "/k")
            ),
            Err(Error::Config { .. })
        ));
        assert_eq!(
            redacted("etcd://u:secret@h:1?tls_ca=/x"),
            "etcd://u:***@h:1?tls_ca=/x"
        );
    }

    #[test]
    fn every_option_is_read_off_the_url() {
        let (url, o) = EtcdOptions::default()
            .with_prefix("code/")
            .with_url(
                "etcds://u:pw@a:1,b:2?prefix=p/&fence_prefix=f/&connect_timeout=250ms\
                 &request_timeout=1m&lease_sharing=per_ttl&tls_ca=/ca&tls_cert=/c&tls_key=/k",
            )
            .unwrap();
        assert_eq!(url, "etcds://u:pw@a:1,b:2");
        assert_eq!(
            o,
            EtcdOptions::default()
                .with_prefix("p/")
                .with_fence_prefix("f/")
                .with_connect_timeout(Duration::from_millis(250))
                .with_request_timeout(Duration::from_secs(60))
                .with_lease_sharing(LeaseSharing::PerTtl)
                .with_tls_ca("/ca")
                .with_tls_client_cert("/c", "/k")
        );
        let (_, o) = EtcdOptions::default()
            .with_lease_sharing(LeaseSharing::PerTtl)
            .with_url("etcd://h:1?lease_sharing=per_grant")
            .unwrap();
        assert_eq!(o.lease_sharing(), LeaseSharing::PerGrant);
        let (_, o) = EtcdOptions::default()
            .with_lease_sharing(LeaseSharing::PerGrant)
            .with_url("etcd://h:1?lease_sharing=reserved_per_ttl")
            .unwrap();
        assert_eq!(o.lease_sharing(), LeaseSharing::ReservedPerTtl);
        for (query, name) in [
            ("prefx=a/", "prefx"),
            ("connect_timeout=5", "connect_timeout"),
            ("request_timeout=1d", "request_timeout"),
            ("lease_sharing=PerTtl", "lease_sharing"),
            ("fence_prefix=a&fence_prefix=b", "fence_prefix"),
            ("tls_key=/k", "tls_key"),
        ] {
            match EtcdOptions::default().with_url(&format!("etcds://h:1?{query}")) {
                Err(Error::Config { message, .. }) => {
                    assert!(message.contains(name), "{query}: {message}");
                }
                other => panic!("{query}: {other:?}"),
            }
        }
    }

    #[test]
    fn by_default_only_reserved_keys_share_an_etcd_lease() {
        let sharing = EtcdOptions::default().lease_sharing();
        assert_eq!(sharing, LeaseSharing::default());
        let set = LeaseKey::new("orders").unwrap();
        for role in ["s.p0", "m.0", "x.worker-a", "permit.3", "handover"] {
            let key = set.reserved(role).unwrap();
            assert!(sharing.shares_etcd_lease(&key), "{key}");
            assert!(LeaseSharing::PerTtl.shares_etcd_lease(&key), "{key}");
            assert!(!LeaseSharing::PerGrant.shares_etcd_lease(&key), "{key}");
        }
        for named in ["orders", "nightly-report", "a.b-c.d"] {
            let key = LeaseKey::new(named).unwrap();
            assert!(!sharing.shares_etcd_lease(&key), "{key}");
            assert!(LeaseSharing::PerTtl.shares_etcd_lease(&key), "{key}");
        }
        assert!(!LeaseSharing::PerGrant.shares_any());
        assert!(LeaseSharing::PerTtl.shares_any() && sharing.shares_any());
    }

    #[test]
    fn the_keep_alive_timeout_never_overflows_the_clock() {
        for t in [
            Duration::from_nanos(1),
            Duration::from_secs(5),
            Duration::MAX,
        ] {
            let timeout = EtcdOptions::default()
                .with_request_timeout(t)
                .keep_alive_timeout();
            assert!(timeout <= t);
            assert!(std::time::Instant::now().checked_add(timeout).is_some());
        }
    }

    #[test]
    fn urls_name_endpoints() {
        assert_eq!(
            endpoints_of("etcd://a:2379, b:2379/").unwrap(),
            ["http://a:2379", "http://b:2379"]
        );
        assert_eq!(
            endpoints_of("etcds://[::1]:2379").unwrap(),
            ["https://[::1]:2379"]
        );
        assert_eq!(endpoints_of("etcd://h").unwrap(), ["http://h"]);
        for bad in [
            "",
            "etcd://",
            "etcd:/a:1",
            "http://a:2379",
            "etcd://a:1,,b:2",
            "etcd://a:1/path",
            "etcd://bad host:1",
            "etcd://h:port",
            "etcd://[::1:2379",
            "etcd://::::",
        ]
        .into_iter()
        .map(|bad| (bad, endpoints_of(bad)))
        {
            assert!(matches!(bad.1, Err(Error::Config { .. })), "{bad:?}");
        }
    }
}
