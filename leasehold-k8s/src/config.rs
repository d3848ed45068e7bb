//! [`K8sOptions`]: every knob of a [`K8sLeaseStore`](crate::K8sLeaseStore), the `k8s://` URL,
//! and kube clients from a kubeconfig or the ambient configuration.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::config::{KubeConfigOptions, Kubeconfig};
use leasehold_core::backend::UrlParams;
use leasehold_core::{Error, LeaseKey, Result};

use crate::error::BACKEND;

/// The default timeout of one API request.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest name prefix: keys are at most 200 bytes, object names at most 253.
pub const MAX_PREFIX_LEN: usize = 53;
/// The query parameters of a `k8s://` URL, one per [`K8sOptions`] setting
/// ([`K8sOptions::with_url`]).
pub const URL_OPTIONS: &[&str] = &[
    "namespace",
    "name_prefix",
    "request_timeout",
    "kubeconfig",
    "group_set",
    "groups",
];

/// A point inside the store's protocol where a test can hold an operation (hidden: for this
/// crate's own interleaving tests, not part of the supported API).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TestPoint {
    /// `acquire` found no Lease object and is about to create it.
    BeforeCreate,
}

/// A test hook: awaited at each [`TestPoint`] with the Lease object's name (hidden).
#[doc(hidden)]
pub type TestHook = Arc<dyn Fn(TestPoint, &str) -> BoxFuture<'static, ()> + Send + Sync>;

/// Configures a [`K8sLeaseStore`](crate::K8sLeaseStore): namespace, object name prefix, request
/// timeout, and the kubeconfig to use. [`Default`] is the ambient configuration, the URL's (or
/// the configuration's) namespace, no prefix and [`DEFAULT_REQUEST_TIMEOUT`].
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_k8s::{K8sLeaseStore, K8sOptions};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let options = K8sOptions::default()
///     .with_kubeconfig("/etc/lease/kubeconfig")
///     .with_name_prefix("lease-")
///     .with_request_timeout(Duration::from_secs(5));
/// let store = K8sLeaseStore::connect_with("k8s://payments", options).await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Clone)]
pub struct K8sOptions {
    pub(crate) namespace: Option<String>,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) kubeconfig: Option<PathBuf>,
    pub(crate) grouped: Option<(String, u16)>,
    pub(crate) hook: Option<TestHook>,
}

impl Default for K8sOptions {
    fn default() -> Self {
        K8sOptions {
            namespace: None,
            prefix: String::new(),
            timeout: DEFAULT_REQUEST_TIMEOUT,
            kubeconfig: None,
            grouped: None,
            hook: None,
        }
    }
}

impl fmt::Debug for K8sOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("K8sOptions")
            .field("namespace", &self.namespace)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("kubeconfig", &self.kubeconfig)
            .field("grouped", &self.grouped)
            .finish_non_exhaustive()
    }
}

impl K8sOptions {
    /// The namespace of the Lease objects. Default: the namespace the URL names, else the
    /// client's (the kubeconfig context's) default namespace. A URL's `namespace` query parameter
    /// replaces this one, as every query parameter replaces its option; a URL whose path
    /// (`k8s://NAMESPACE`) names another namespace than the options (or the query) is an
    /// [`Error::Config`].
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// A prefix for object names: key `k` is stored in Lease `<prefix>k`. At most
    /// [`MAX_PREFIX_LEN`] bytes, and `<prefix>a` must be a DNS-1123 subdomain. Default: none.
    pub fn with_name_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The timeout of each API request (default [`DEFAULT_REQUEST_TIMEOUT`]); an expired one is
    /// [`Error::Timeout`].
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The kubeconfig file (its current context) that
    /// [`connect_with`](crate::K8sLeaseStore::connect_with) uses instead of the ambient
    /// configuration. Ignored by [`from_client`](crate::K8sLeaseStore::from_client).
    pub fn with_kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig = Some(path.into());
        self
    }

    /// Selects the grouped mode: the store is a [`K8sGroupedStore`](crate::K8sGroupedStore) of
    /// set `set` over `groups` group objects, what
    /// [`K8sGroupedStore::connect_with`](crate::K8sGroupedStore::connect_with) (and
    /// `leasehold::connect`) build from these options; see
    /// [`K8sLeaseStore::grouped`](crate::K8sLeaseStore::grouped) for the mode. The set is a
    /// DNS-1123 label of at most [`MAX_SET_LEN`](crate::MAX_SET_LEN) bytes, `groups` is within
    /// `1..=`[`MAX_GROUPS`](crate::MAX_GROUPS). Default: off (one Lease per key).
    ///
    /// ```
    /// use leasehold_k8s::K8sOptions;
    /// let options = K8sOptions::default().with_grouped("shards", 16);
    /// assert_eq!(options.grouped(), Some(("shards", 16)));
    /// ```
    pub fn with_grouped(mut self, set: impl Into<String>, groups: u16) -> Self {
        self.grouped = Some((set.into(), groups));
        self
    }

    /// Applies the options in `url`'s query on top of these and returns the URL without its
    /// query (what [`connect_with`](crate::K8sLeaseStore::connect_with) does with its URL), so
    /// that a URL alone configures the store:
    ///
    /// | parameter | sets | example |
    /// |---|---|---|
    /// | `namespace` | [`with_namespace`](Self::with_namespace) (or name it in the path) | `namespace=payments` |
    /// | `name_prefix` | [`with_name_prefix`](Self::with_name_prefix) | `name_prefix=lease-` |
    /// | `request_timeout` | [`with_request_timeout`](Self::with_request_timeout) | `request_timeout=5s` |
    /// | `kubeconfig` | [`with_kubeconfig`](Self::with_kubeconfig), a percent-encoded path | `kubeconfig=/etc/lease/kubeconfig` |
    /// | `group_set` | [`with_grouped`](Self::with_grouped): the grouped mode's set | `group_set=shards` |
    /// | `groups` | [`with_grouped`](Self::with_grouped): its group count (default [`DEFAULT_GROUPS`](crate::DEFAULT_GROUPS)); only with `group_set` | `groups=32` |
    ///
    /// Durations take a unit: `250ms`, `2s`, `5m`, `1h`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_k8s::K8sOptions;
    /// let (url, options) = K8sOptions::default()
    ///     .with_url("k8s://payments?name_prefix=lease-&request_timeout=5s")?;
    /// assert_eq!(url, "k8s://payments");
    /// assert_eq!(options.name_prefix(), "lease-");
    /// assert_eq!(options.request_timeout(), Duration::from_secs(5));
    /// let err = K8sOptions::default().with_url("k8s://payments?name_prefx=lease-").unwrap_err();
    /// assert!(err.to_string().contains("name_prefx"));
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] naming the parameter for an unknown, repeated or empty one, a value that
    /// does not parse, a namespace that is not a DNS-1123 label, a prefix that cannot start an
    /// object name, a zero request timeout, a set name that is not a DNS-1123 label, or a group
    /// count outside `1..=`[`MAX_GROUPS`](crate::MAX_GROUPS) or without `group_set`.
    pub fn with_url(self, url: &str) -> Result<(String, K8sOptions)> {
        let mut p = UrlParams::parse(BACKEND, url)?;
        let mut o = self;
        if let Some(ns) = p.take_with("namespace", |v| {
            validate_namespace(v).map_err(|_| "expected a DNS-1123 label".to_string())?;
            Ok(v.to_string())
        })? {
            o.namespace = Some(ns);
        }
        if let Some(prefix) = p.take_with("name_prefix", |v| {
            validate_prefix(v).map_err(|_| {
                format!("expected at most {MAX_PREFIX_LEN} bytes that start a DNS-1123 object name")
            })?;
            Ok(v.to_string())
        })? {
            o.prefix = prefix;
        }
        if let Some(d) = p.take_duration("request_timeout")? {
            if d.is_zero() {
                return Err(Error::config(
                    BACKEND,
                    "URL parameter request_timeout=\"0s\": the request timeout must not be zero",
                    None,
                ));
            }
            o.timeout = d;
        }
        if let Some(path) = p.take_with("kubeconfig", |v| {
            if v.is_empty() {
                Err("expected the path of a kubeconfig file".to_string())
            } else {
                Ok(PathBuf::from(v))
            }
        })? {
            o.kubeconfig = Some(path);
        }
        let set = p.take_with("group_set", |v| {
            crate::grouped::check_set(v).map_err(|_| {
                format!(
                    "expected a DNS-1123 label of 1 to {} bytes, not \"fence\"",
                    crate::MAX_SET_LEN
                )
            })?;
            Ok(v.to_string())
        })?;
        let groups = p.take_with("groups", |v| {
            v.parse::<u16>()
                .ok()
                .filter(|n| (1..=crate::MAX_GROUPS).contains(n))
                .ok_or_else(|| format!("expected a group count from 1 to {}", crate::MAX_GROUPS))
        })?;
        match (set, groups) {
            (Some(set), groups) => {
                let keep = o.grouped.as_ref().map(|(_, n)| *n);
                o.grouped = Some((set, groups.or(keep).unwrap_or(crate::DEFAULT_GROUPS)));
            }
            (None, Some(groups)) => match &mut o.grouped {
                Some((_, n)) => *n = groups,
                None => {
                    return Err(Error::config(
                        BACKEND,
                        "URL parameter groups: a group count needs group_set (the grouped mode's set)",
                        None,
                    ));
                }
            },
            (None, None) => {}
        }
        let base = p.base().to_string();
        p.finish(URL_OPTIONS)?;
        Ok((base, o))
    }

    /// The namespace set with [`with_namespace`](Self::with_namespace) or the URL, if any.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The object name prefix ([`with_name_prefix`](Self::with_name_prefix)).
    pub fn name_prefix(&self) -> &str {
        &self.prefix
    }

    /// The timeout of each API request ([`with_request_timeout`](Self::with_request_timeout)).
    pub fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// The kubeconfig file ([`with_kubeconfig`](Self::with_kubeconfig)), if any.
    pub fn kubeconfig(&self) -> Option<&Path> {
        self.kubeconfig.as_deref()
    }

    /// The grouped mode's set and group count ([`with_grouped`](Self::with_grouped)), if
    /// selected.
    pub fn grouped(&self) -> Option<(&str, u16)> {
        self.grouped.as_ref().map(|(s, n)| (s.as_str(), *n))
    }

    /// Installs a test hook, awaited at every [`TestPoint`] (hidden: for this crate's
    /// interleaving tests only).
    #[doc(hidden)]
    pub fn with_test_hook(mut self, hook: TestHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// The client `connect_with` uses: from the kubeconfig file if one is set, else ambient.
    pub(crate) async fn client(&self) -> Result<kube::Client> {
        match &self.kubeconfig {
            Some(path) => client_from_kubeconfig(path).await,
            None => infer_client().await,
        }
    }

    /// Checks the knobs that do not depend on the client.
    pub(crate) fn validate(&self, namespace: &str) -> Result<()> {
        if let Some((set, _)) = &self.grouped {
            return Err(Error::config(
                BACKEND,
                format!(
                    "the options select the grouped mode (set {set:?}): connect with \
                     K8sGroupedStore::connect_with (or leasehold::connect), not K8sLeaseStore"
                ),
                None,
            ));
        }
        validate_namespace(namespace)?;
        validate_prefix(&self.prefix)?;
        if self.timeout.is_zero() {
            return Err(Error::config(
                BACKEND,
                "the request timeout must not be zero",
                None,
            ));
        }
        Ok(())
    }
}

/// The namespace named by a `k8s://NAMESPACE` URL (the forms the `lease` facade accepts:
/// `k8s://NAMESPACE`, `k8s://`, `k8s:`, `kubernetes://NAMESPACE`, with an optional trailing
/// `/`), or `None` for the configuration's default namespace.
pub(crate) fn parse_url(url: &str) -> Result<Option<String>> {
    let bad = |what: &str| {
        Error::config(
            BACKEND,
            format!("{url:?}: {what} (expected k8s://NAMESPACE or k8s://)"),
            None,
        )
    };
    let (scheme, rest) = url.split_once(':').ok_or_else(|| bad("not a URL"))?;
    if !matches!(scheme.to_ascii_lowercase().as_str(), "k8s" | "kubernetes") {
        return Err(bad("not a Kubernetes URL"));
    }
    let ns = rest.strip_prefix("//").unwrap_or(rest);
    let ns = ns.strip_suffix('/').unwrap_or(ns);
    if ns.is_empty() {
        return Ok(None);
    }
    if !is_dns_label(ns) {
        return Err(bad(&format!(
            "{ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        )));
    }
    Ok(Some(ns.to_string()))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn validate_namespace(ns: &str) -> Result<()> {
    if is_dns_label(ns) {
        Ok(())
    } else {
        Err(Error::config(
            BACKEND,
            format!("namespace {ns:?} is not a DNS-1123 label"),
            None,
        ))
    }
}

fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        return Ok(());
    }
    if prefix.len() > MAX_PREFIX_LEN || LeaseKey::new(format!("{prefix}a")).is_err() {
        return Err(Error::config(
            BACKEND,
            format!(
                "name prefix {prefix:?} cannot start a DNS-1123 object name of at most 253 bytes"
            ),
            None,
        ));
    }
    Ok(())
}

/// A client from a kubeconfig file (its current context).
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let client = leasehold_k8s::client_from_kubeconfig("/etc/lease/kubeconfig").await?;
/// let store = leasehold_k8s::K8sLeaseStore::from_client(client, Default::default())?;
/// # let _ = store; Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Config`] if the file is missing or unusable.
///
/// # Cancellation safety
/// Cancel safe: nothing is sent to the cluster.
pub async fn client_from_kubeconfig(path: impl AsRef<Path>) -> Result<kube::Client> {
    let path = path.as_ref();
    let kc = Kubeconfig::read_from(path).map_err(|e| {
        Error::config(
            BACKEND,
            format!("kubeconfig {}: {e}", path.display()),
            Some(Box::new(e).into()),
        )
    })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| {
            Error::config(
                BACKEND,
                format!("kubeconfig {}: {e}", path.display()),
                Some(Box::new(e).into()),
            )
        })?;
    client_from_config(config)
}

/// A client from the ambient configuration: `$KUBECONFIG`, `~/.kube/config`, or the in-cluster
/// service account.
///
/// # Errors
/// [`Error::Config`] if none is usable.
///
/// # Cancellation safety
/// Cancel safe: nothing is sent to the cluster.
pub async fn infer_client() -> Result<kube::Client> {
    let config = kube::Config::infer().await.map_err(|e| {
        Error::config(
            BACKEND,
            format!("no usable Kubernetes configuration: {e}"),
            Some(Box::new(e).into()),
        )
    })?;
    client_from_config(config)
}

fn client_from_config(config: kube::Config) -> Result<kube::Client> {
    kube::Client::try_from(config)
        .map_err(|e| Error::config(BACKEND, format!("client: {e}"), Some(Box::new(e).into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parameters_select_the_grouped_mode_and_refuse_bad_sets_and_counts() {
        let parse = |url: &str| K8sOptions::default().with_url(url).map(|(_, o)| o);
        let o = parse("k8s://ns?group_set=shards").unwrap();
        assert_eq!(o.grouped(), Some(("shards", crate::DEFAULT_GROUPS)));
        let o = parse("k8s://ns?group_set=shards&groups=32").unwrap();
        assert_eq!(o.grouped(), Some(("shards", 32)));
        // The URL's count replaces the options' and keeps their set, and the reverse.
        let (_, o) = K8sOptions::default()
            .with_grouped("a", 4)
            .with_url("k8s://ns?groups=8")
            .unwrap();
        assert_eq!(o.grouped(), Some(("a", 8)));
        let (_, o) = K8sOptions::default()
            .with_grouped("a", 4)
            .with_url("k8s://ns?group_set=b")
            .unwrap();
        assert_eq!(o.grouped(), Some(("b", 4)));
        assert_eq!(parse("k8s://ns").unwrap().grouped(), None);
        for (bad, names) in [
            ("k8s://ns?groups=4", "group_set"),
            ("k8s://ns?group_set=Bad_Set", "group_set"),
            ("k8s://ns?group_set=fence", "group_set"),
            ("k8s://ns?group_set=", "group_set"),
            ("k8s://ns?group_set=a&groups=0", "groups"),
            ("k8s://ns?group_set=a&groups=257", "groups"),
            ("k8s://ns?group_set=a&groups=99999999999999999999", "groups"),
            ("k8s://ns?group_set=a&groups=x", "groups"),
        ] {
            match parse(bad) {
                Err(e @ Error::Config { .. }) => {
                    assert!(e.to_string().contains(names), "{bad}: {e}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        // Options that select the grouped mode do not make a one-Lease-per-key store.
        let err = K8sOptions::default()
            .with_grouped("a", 1)
            .validate("ns")
            .unwrap_err();
        assert!(err.to_string().contains("grouped mode"), "{err}");
    }

    #[test]
    fn urls_name_a_namespace_or_none() {
        for (url, ns) in [
            ("k8s:", None),
            ("k8s://", None),
            ("k8s:///", None),
            ("k8s://team-a", Some("team-a")),
            ("k8s://team-a/", Some("team-a")),
            ("kubernetes://team-a", Some("team-a")),
            ("K8S://team-a", Some("team-a")),
        ] {
            assert_eq!(parse_url(url).unwrap().as_deref(), ns, "{url}");
        }
        for bad in [
            "",
            "k8s",
            "redis://x",
            "k8s://Team_A",
            "k8s://a/b",
            "k8s://-a",
        ] {
            assert!(
                matches!(parse_url(bad), Err(Error::Config { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn url_options_apply_on_top_of_those_in_code() {
        let code = K8sOptions::default()
            .with_name_prefix("code-")
            .with_request_timeout(Duration::from_secs(3))
            .with_kubeconfig("/code/kubeconfig");
        let (url, o) = code.clone().with_url("k8s://ns").unwrap();
        assert_eq!(url, "k8s://ns");
        assert_eq!(o.name_prefix(), "code-");
        assert_eq!(o.request_timeout(), Duration::from_secs(3));
        assert_eq!(o.kubeconfig(), Some(Path::new("/code/kubeconfig")));
        let (url, o) = code
            .with_url("k8s:?request_timeout=250ms&kubeconfig=/url/kube%20config&namespace=n1")
            .unwrap();
        assert_eq!(url, "k8s:");
        assert_eq!(o.name_prefix(), "code-");
        assert_eq!(o.request_timeout(), Duration::from_millis(250));
        assert_eq!(o.kubeconfig(), Some(Path::new("/url/kube config")));
        assert_eq!(o.namespace(), Some("n1"));
        let (_, o) = K8sOptions::default()
            .with_url("k8s://ns?name_prefix=")
            .unwrap();
        assert_eq!(o.name_prefix(), "");
        for (bad, name) in [
            ("k8s://ns?prefix=a-", "prefix"),
            ("k8s://ns?name_prefix=A", "name_prefix"),
            ("k8s://ns?request_timeout=0s", "request_timeout"),
            ("k8s://ns?request_timeout=1d", "request_timeout"),
            ("k8s://ns?kubeconfig=", "kubeconfig"),
            ("k8s://ns?namespace=", "namespace"),
            ("k8s://ns?namespace=a&namespace=b", "namespace"),
            ("k8s://ns?timeout", "timeout"),
        ] {
            match K8sOptions::default().with_url(bad) {
                Err(e @ Error::Config { .. }) => {
                    assert!(e.to_string().contains(name), "{bad}: {e}");
                }
                other => panic!("{bad}: expected Config, got {other:?}"),
            }
        }
    }

    #[test]
    fn options_are_validated() {
        let ok = K8sOptions::default();
        assert!(ok.validate("default").is_ok());
        for ns in ["", "Upper", "under_score", "-lead", &"n".repeat(64)] {
            assert!(ok.validate(ns).is_err(), "{ns:?}");
        }
        for prefix in ["Upper-", "-lead", "a..", "a/b", &"p".repeat(54)] {
            let o = K8sOptions::default().with_name_prefix(prefix);
            assert!(o.validate("default").is_err(), "{prefix:?}");
        }
        let zero = K8sOptions::default().with_request_timeout(Duration::ZERO);
        assert!(zero.validate("default").is_err());
    }
}
