//! [`EtcdOptions`]: every knob of the etcd backend, and the endpoints of an `etcd://` URL.

use std::time::Duration;

use lease_core::{Error, LeaseKey, Result};

use crate::error::BACKEND;
use crate::protocol::{self, DEFAULT_FENCE_PREFIX, DEFAULT_PREFIX};

/// How grants map to etcd leases.
///
/// ```
/// use lease_etcd::{EtcdOptions, LeaseSharing};
/// let options = EtcdOptions::default().with_lease_sharing(LeaseSharing::PerTtl);
/// assert_eq!(options.lease_sharing(), LeaseSharing::PerTtl);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LeaseSharing {
    /// Every grant gets its own etcd lease (the default). Expiry of each key is decided by etcd
    /// alone; a renewal is one keepalive; a process holding N keys sends N keepalives per
    /// renewal interval.
    #[default]
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
}

/// Options of an [`EtcdLeaseStore`](crate::EtcdLeaseStore) and its
/// [`EtcdFencedResource`](crate::EtcdFencedResource), for
/// [`EtcdLeaseStore::connect_with`](crate::EtcdLeaseStore::connect_with). The endpoints come
/// from the URL.
///
/// ```
/// use std::time::Duration;
/// use lease_etcd::EtcdOptions;
/// let options = EtcdOptions::default()
///     .with_prefix("jobs/")
///     .with_connect_timeout(Duration::from_millis(500));
/// assert_eq!(options.lock_name(&"nightly".parse()?), "jobs/nightly");
/// # Ok::<(), lease_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    prefix: String,
    fence_prefix: String,
    connect_timeout: Duration,
    request_timeout: Duration,
    lease_sharing: LeaseSharing,
}

impl Default for EtcdOptions {
    /// The default prefixes ([`DEFAULT_PREFIX`], [`DEFAULT_FENCE_PREFIX`]), a 2 s connect
    /// timeout, a 5 s request timeout and [`LeaseSharing::PerGrant`].
    fn default() -> Self {
        EtcdOptions {
            prefix: DEFAULT_PREFIX.to_string(),
            fence_prefix: DEFAULT_FENCE_PREFIX.to_string(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            lease_sharing: LeaseSharing::PerGrant,
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

    /// Sets how grants map to etcd leases (default [`LeaseSharing::PerGrant`]).
    pub fn with_lease_sharing(mut self, sharing: LeaseSharing) -> Self {
        self.lease_sharing = sharing;
        self
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

    /// Checks what can be checked without a server: timeouts non-zero.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(Error::config(BACKEND, "timeouts must be non-zero", None));
        }
        Ok(())
    }
}

/// The endpoints of an etcd URL: `etcd://host:port,host:port` (plain HTTP/2) or
/// `etcds://host:port,...` (TLS), the form the `lease` facade accepts; a trailing `/` is
/// allowed. Each endpoint becomes `http://host:port` (or `https://`).
pub(crate) fn endpoints_of(url: &str) -> Result<Vec<String>> {
    let bad = |why: String| Error::config(BACKEND, format!("{url:?}: {why}"), None);
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
