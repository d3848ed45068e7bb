//! How to reach etcd and where the keys go.

use std::time::Duration;

use lease_core::{Error, LeaseKey, Result};

use crate::BACKEND;

/// The default key prefix of lock names: a lease on key `k` is the etcd lock named `lease/k`.
pub const DEFAULT_PREFIX: &str = "lease/";

/// The default key prefix of the fenced resource's state keys.
pub const DEFAULT_FENCE_PREFIX: &str = "lease-fence/";

/// How grants map to etcd leases.
///
/// ```
/// use lease_etcd::{EtcdConfig, LeaseSharing};
/// let config = EtcdConfig::from_list("http://127.0.0.1:2379").with_lease_sharing(LeaseSharing::PerTtl);
/// assert_eq!(config.lease_sharing(), LeaseSharing::PerTtl);
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
    /// etcd lease) once its holder stopped renewing it for its TTL, and deletes the key of an
    /// acquire whose outcome its caller never learned (an error, or a dropped future) within
    /// about 100 ms. If the process dies, the shared etcd lease expires and etcd deletes every
    /// key. A lease renewed through another store (another process) has its key moved onto that
    /// store's etcd lease first (one extra write), so only one store ever sweeps it. The cost: a
    /// key whose holder hangs while the process lives is freed by the sweeper rather than by etcd.
    /// See `docs/adr/0030-etcd-lease-sharing.md`.
    PerTtl,
}

/// Configuration of an [`EtcdLeaseStore`](crate::EtcdLeaseStore) and
/// [`EtcdFencedResource`](crate::EtcdFencedResource).
///
/// ```
/// use std::time::Duration;
/// use lease_etcd::EtcdConfig;
/// let config = EtcdConfig::from_list("http://10.0.0.1:2379, http://10.0.0.2:2379")
///     .with_prefix("jobs/")
///     .with_connect_timeout(Duration::from_millis(500));
/// assert_eq!(config.endpoints().len(), 2);
/// assert_eq!(config.lock_name(&"nightly".parse()?), "jobs/nightly");
/// # Ok::<(), lease_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    prefix: String,
    fence_prefix: String,
    connect_timeout: Duration,
    request_timeout: Duration,
    lease_sharing: LeaseSharing,
}

impl EtcdConfig {
    /// A configuration for the given endpoints (`http://host:port`), with the default prefixes,
    /// a 2 s connect timeout and a 5 s request timeout.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: DEFAULT_PREFIX.to_string(),
            fence_prefix: DEFAULT_FENCE_PREFIX.to_string(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            lease_sharing: LeaseSharing::PerGrant,
        }
    }

    /// A configuration from a comma-separated endpoint list (the format of `etcdctl --endpoints`
    /// and of the `LEASE_ETCD_ENDPOINTS` variable the tests read). Blank entries are dropped.
    pub fn from_list(list: &str) -> Self {
        Self::new(list.split(',').map(str::trim).filter(|s| !s.is_empty()))
    }

    /// Sets the prefix of lock names (default [`DEFAULT_PREFIX`]). A lease on key `k` is the etcd
    /// lock named `<prefix>k`, held as the key `<prefix>k/<lease id in hex>`, exactly like
    /// `etcdctl lock <prefix>k` and Go's `concurrency.NewMutex(session, "<prefix>k")`.
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
    /// [`Error::Unavailable`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how long one request may take before it fails with [`Error::Timeout`].
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

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
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

    /// The etcd lock name of `key`: what `etcdctl lock` must be given to contend for it.
    pub fn lock_name(&self, key: &LeaseKey) -> String {
        format!("{}{}", self.prefix, key)
    }

    /// Checks what can be checked without a server: at least one endpoint, each an `http://` or
    /// `https://` URL (or a bare `host:port`) with a host and no spaces; timeouts non-zero.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::config(BACKEND, "no etcd endpoints given", None));
        }
        for e in &self.endpoints {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"))
                .unwrap_or(e);
            let host_port = rest.split('/').next().unwrap_or("");
            let bad = host_port.is_empty()
                || e.chars().any(|c| c.is_whitespace() || c.is_control())
                || (rest.len() != e.len() && e.contains("://") && rest.contains("://"))
                || (rest.len() == e.len() && e.contains("://"));
            if bad {
                return Err(Error::config(
                    BACKEND,
                    format!("malformed etcd endpoint {e:?}"),
                    None,
                ));
            }
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(Error::config(BACKEND, "timeouts must be non-zero", None));
        }
        Ok(())
    }
}
