//! Store URLs: which backend a URL names, parsed without connecting.

use std::fmt;
use std::str::FromStr;

use leasehold_core::{Error, Result};

/// The backend name used in errors about URLs that name no backend.
const FACADE: &str = "lease";

/// The URL schemes [`connect`](crate::connect) understands, for error messages.
pub const SCHEMES: &str = "memory:, postgres://, postgresql://, mysql://, mariadb://, redis://, rediss://, \
                           redis+cluster://host:port,..., rediss+cluster://, \
                           redis+sentinel://host:port,.../MASTER, \
                           etcd://host:port,..., etcds://, k8s://NAMESPACE, sqlite://PATH";

/// A store URL, parsed: which backend and where. Parsing never connects and does not depend on
/// which backend features are enabled, so a URL can be checked anywhere.
///
/// Every form keeps the URL as written, user information and query included, and
/// [`connect`](crate::connect) hands exactly that to the backend, which reads its options from
/// the query and refuses parameters it does not know (each backend's crate docs list them:
/// "Options in the URL"). So a URL alone configures the store:
/// `k8s://payments?name_prefix=lease-&request_timeout=5s`,
/// `etcds://h:2379?tls_ca=/pki/ca.crt`, `postgres://db/app?table=locks.leases`.
///
/// | URL | backend | feature |
/// |-----|---------|---------|
/// | `memory:` | [`MemoryLeaseStore`](leasehold_core::MemoryLeaseStore), one per call | none |
/// | `postgres://user@host:5432/db`, `postgresql://...` | PostgreSQL | `postgres` |
/// | `mysql://user@host:3306/db`, `mariadb://...` | MySQL / MariaDB | `mysql` |
/// | `redis://host:6379/0`, `rediss://...` (TLS) | Redis | `redis` |
/// | `redis+cluster://host:7000,host:7001`, `rediss+cluster://...` (TLS) | Redis Cluster | `redis` |
/// | `redis+sentinel://host:26379,host:26379/MASTER` | Redis behind Sentinel | `redis` |
/// | `etcd://host:2379,host:2379`, `etcds://...` (TLS) | etcd v3 | `etcd` |
/// | `k8s://NAMESPACE`, `k8s://` (the kubeconfig's namespace), `kubernetes://NAMESPACE` | Kubernetes Leases | `k8s` |
/// | `sqlite://PATH`, `sqlite:///ABSOLUTE/PATH` | SQLite file | `sqlite` |
///
/// `sqlite::memory:` parses, but the SQLite backend refuses it (other processes could not share
/// it): use `memory:` for an in-process store.
/// ```
/// use leasehold::StoreUrl;
/// let url: StoreUrl = "etcd://10.0.0.1:2379,10.0.0.2:2379".parse()?;
/// let StoreUrl::Etcd { endpoints, .. } = &url else { panic!("{url}") };
/// assert_eq!(endpoints, &["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
/// assert_eq!(url.feature(), Some("etcd"));
/// // The query stays, for the backend; a password is never shown.
/// let url: StoreUrl = "etcds://root:secret@10.0.0.1:2379?tls_ca=/pki/ca.crt".parse()?;
/// assert_eq!(url.to_string(), "etcds://root:***@10.0.0.1:2379?tls_ca=/pki/ca.crt");
/// assert!("ftp://example.org".parse::<StoreUrl>().is_err());
/// # Ok::<(), leasehold::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `memory:`: an in-process store (every call makes a new, empty one).
    Memory,
    /// A PostgreSQL connection URL, passed to the driver as written.
    Postgres(String),
    /// A MySQL or MariaDB connection URL (`mysql://` or `mariadb://`), passed to the backend as
    /// written.
    Mysql(String),
    /// A Redis URL, passed to the driver as written.
    Redis(String),
    /// etcd endpoints (`http://host:port` or `https://host:port`).
    Etcd {
        /// The endpoints, with their `http://` or `https://` scheme (without user information).
        endpoints: Vec<String>,
        /// The URL as written, user information and query included: what the backend is given.
        url: String,
    },
    /// The Kubernetes cluster of the ambient kubeconfig (or in-cluster configuration, or the
    /// `kubeconfig` the query names).
    Kubernetes {
        /// The namespace the URL's path names; `None` uses the query's `namespace`, else the
        /// configuration's default namespace.
        namespace: Option<String>,
        /// The URL as written, query included: what the backend is given.
        url: String,
    },
    /// A SQLite URL (`sqlite://PATH`), passed to the backend as written.
    Sqlite(String),
}

impl StoreUrl {
    /// Parses `url`.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty URL, an unknown scheme, or a URL that names nothing (no
    /// host, no endpoint, no file, an illegal namespace).
    pub fn parse(url: &str) -> Result<Self> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once(':') else {
            if url == "memory" {
                return Ok(StoreUrl::Memory);
            }
            return Err(Error::config(
                FACADE,
                format!("{url:?} is not a store URL (expected one of {SCHEMES})"),
                None,
            ));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "memory" if rest.is_empty() || rest == "//" => Ok(StoreUrl::Memory),
            "memory" => Err(Error::config(
                "memory",
                format!("{url:?}: the memory store takes no address (write `memory:`)"),
                None,
            )),
            "postgres" | "postgresql" => {
                authority(url, rest, "postgres")?;
                Ok(StoreUrl::Postgres(url.to_string()))
            }
            "mysql" | "mariadb" => {
                authority(url, rest, "mysql")?;
                Ok(StoreUrl::Mysql(url.to_string()))
            }
            "redis" | "rediss" | "redis+unix" | "unix" | "redis+cluster" | "rediss+cluster"
            | "redis+sentinel" | "rediss+sentinel" => {
                if scheme.eq_ignore_ascii_case("redis") || scheme.eq_ignore_ascii_case("rediss") {
                    authority(url, rest, "redis")?;
                }
                Ok(StoreUrl::Redis(url.to_string()))
            }
            "etcd" | "etcds" => {
                let http = if scheme.eq_ignore_ascii_case("etcds") {
                    "https"
                } else {
                    "http"
                };
                let list = authority(url, rest, "etcd")?;
                let list = list.split_once('?').map_or(list, |(hosts, _query)| hosts);
                let list = list.rsplit_once('@').map_or(list, |(_user, hosts)| hosts);
                let list = list.strip_suffix('/').unwrap_or(list);
                let mut endpoints = Vec::new();
                for ep in list.split(',').map(str::trim) {
                    if ep.is_empty() || ep.contains(['/', '#']) {
                        return Err(Error::config(
                            "etcd",
                            format!(
                                "{url:?}: {ep:?} is not an endpoint (expected etcd://host:port,host:port)"
                            ),
                            None,
                        ));
                    }
                    endpoints.push(format!("{http}://{ep}"));
                }
                Ok(StoreUrl::Etcd {
                    endpoints,
                    url: url.to_string(),
                })
            }
            "k8s" | "kubernetes" => {
                let path = rest.split_once('?').map_or(rest, |(path, _query)| path);
                let ns = path.strip_prefix("//").unwrap_or(path);
                let ns = ns.strip_suffix('/').unwrap_or(ns);
                if ns.is_empty() {
                    return Ok(StoreUrl::Kubernetes {
                        namespace: None,
                        url: url.to_string(),
                    });
                }
                if !is_dns_label(ns) {
                    return Err(Error::config(
                        "k8s",
                        format!(
                            "{url:?}: {ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
                        ),
                        None,
                    ));
                }
                Ok(StoreUrl::Kubernetes {
                    namespace: Some(ns.to_string()),
                    url: url.to_string(),
                })
            }
            "sqlite" => {
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if path.split('?').next().unwrap_or_default().is_empty() {
                    return Err(Error::config(
                        "sqlite",
                        format!("{url:?} names no database file (expected sqlite://PATH)"),
                        None,
                    ));
                }
                Ok(StoreUrl::Sqlite(url.to_string()))
            }
            _ => Err(Error::config(
                FACADE,
                format!(
                    "unknown store URL scheme {scheme:?} in {url:?} (expected one of {SCHEMES})"
                ),
                None,
            )),
        }
    }

    /// The backend's name (`"memory"`, `"postgres"`, `"mysql"`, `"redis"`, `"etcd"`, `"k8s"`, `"sqlite"`).
    pub fn backend(&self) -> &'static str {
        match self {
            StoreUrl::Memory => "memory",
            StoreUrl::Postgres(_) => "postgres",
            StoreUrl::Mysql(_) => "mysql",
            StoreUrl::Redis(_) => "redis",
            StoreUrl::Etcd { .. } => "etcd",
            StoreUrl::Kubernetes { .. } => "k8s",
            StoreUrl::Sqlite(_) => "sqlite",
        }
    }

    /// The cargo feature of the `lease` crate that this backend needs (`None` for memory).
    pub fn feature(&self) -> Option<&'static str> {
        match self {
            StoreUrl::Memory => None,
            other => Some(other.backend()),
        }
    }

    /// Whether this build of the `lease` crate includes the backend.
    ///
    /// ```
    /// assert!(leasehold::StoreUrl::Memory.is_enabled());
    /// ```
    pub fn is_enabled(&self) -> bool {
        match self {
            StoreUrl::Memory => true,
            StoreUrl::Postgres(_) => cfg!(feature = "postgres"),
            StoreUrl::Mysql(_) => cfg!(feature = "mysql"),
            StoreUrl::Redis(_) => cfg!(feature = "redis"),
            StoreUrl::Etcd { .. } => cfg!(feature = "etcd"),
            StoreUrl::Kubernetes { .. } => cfg!(feature = "k8s"),
            StoreUrl::Sqlite(_) => cfg!(feature = "sqlite"),
        }
    }

    /// Whether the fenced resource that [`connect_with_resource`](crate::connect_with_resource)
    /// pairs with this store lives in the same *asynchronously replicated* service as the
    /// leases, and so shares the store's failover. True for Redis only.
    ///
    /// On Redis, a failover to a replica that had not received the latest writes (or a split
    /// brain, where clients still reach the old primary) can lose the resource's high-water mark
    /// together with the lease: the resource may then **accept a lower token after a higher
    /// one**. Tokens themselves never go back (they are floored by the server clock), but the
    /// fence that should reject the stale holder forgets what it saw. See
    /// `docs/adr/0021-redis-failover-wait-and-fencing.md`. Keep the fence in a resource that does
    /// not fail over with that Redis (or run Redis without failover), and choose explicitly
    /// with [`connect_with_resource_policy`](crate::connect_with_resource_policy).
    ///
    /// ```
    /// use leasehold::StoreUrl;
    /// assert!(StoreUrl::parse("redis://127.0.0.1:6379")?.resource_shares_failover());
    /// assert!(!StoreUrl::parse("etcd://127.0.0.1:2379")?.resource_shares_failover());
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn resource_shares_failover(&self) -> bool {
        matches!(self, StoreUrl::Redis(_))
    }

    /// The [`Error::Config`] returned for a URL whose backend feature is off.
    pub(crate) fn feature_off(&self) -> Error {
        let backend = self.backend();
        Error::config(
            backend,
            format!(
                "{self} needs the `{backend}` feature of the `lease` crate, which this build does not \
                 enable (Cargo.toml: lease = {{ version = \"0.1\", features = [\"{backend}\"] }})"
            ),
            None,
        )
    }
}

/// The part after `scheme://`, which must name a host (or endpoints).
fn authority<'a>(url: &str, rest: &'a str, backend: &'static str) -> Result<&'a str> {
    let Some(after) = rest.strip_prefix("//") else {
        return Err(Error::config(
            backend,
            format!("{url:?} is not a URL (expected {backend}://HOST...)"),
            None,
        ));
    };
    let host = after.split(['/', '?']).next().unwrap_or_default();
    let host = host.rsplit('@').next().unwrap_or_default();
    if host.is_empty() {
        return Err(Error::config(
            backend,
            format!("{url:?} names no host"),
            None,
        ));
    }
    Ok(after)
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

impl FromStr for StoreUrl {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        StoreUrl::parse(s)
    }
}

/// Shows the URL as written, with the password of its user information and the value of every
/// query parameter whose name holds `pass`, `secret` or `token` (`password=`, `sslpassword=`)
/// replaced by `***`.
impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Postgres(u)
            | StoreUrl::Mysql(u)
            | StoreUrl::Redis(u)
            | StoreUrl::Sqlite(u)
            | StoreUrl::Etcd { url: u, .. }
            | StoreUrl::Kubernetes { url: u, .. } => f.write_str(&redact(u)),
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

/// Replaces the password of `scheme://user:password@host`, and the value of every query
/// parameter that [`is_secret`], by `***`.
pub(crate) fn redact(url: &str) -> String {
    let (url, fragment) = match url.split_once('#') {
        Some((u, f)) => (u, Some(f)),
        None => (url, None),
    };
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let mut out = redact_user_info(head);
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if is_secret(name) => format!("{name}=***"),
                _ => pair.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// Whether a query parameter named `name` carries a secret: its name holds `pass` (`password`,
/// `pass`, `sslpassword`, `passfile` is a path but is hidden too), `secret` or `token`, in any
/// case.
fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "secret", "token"].iter().any(|s| name.contains(s))
}

/// Replaces the password of `scheme://user:password@host...` (a URL without its query).
fn redact_user_info(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let auth_end = rest.find('/').unwrap_or(rest.len());
    let (auth, tail) = rest.split_at(auth_end);
    match auth.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{scheme}://{name}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(url: &str) -> StoreUrl {
        StoreUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn config_err(url: &str) -> String {
        match StoreUrl::parse(url) {
            Err(Error::Config { message, .. }) => message,
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn schemes() {
        assert_eq!(ok("memory:"), StoreUrl::Memory);
        assert_eq!(ok("memory://"), StoreUrl::Memory);
        assert_eq!(
            ok("postgres://postgres@127.0.0.1:5432/test"),
            StoreUrl::Postgres("postgres://postgres@127.0.0.1:5432/test".into())
        );
        assert_eq!(ok("postgresql://h/db").backend(), "postgres");
        assert_eq!(ok("mysql://root@h:3306/test").backend(), "mysql");
        assert_eq!(ok("mariadb://h/db").feature(), Some("mysql"));
        assert_eq!(
            ok("mysql://app:s3cret@db/x").to_string(),
            "mysql://app:***@db/x"
        );
        assert_eq!(ok("redis://127.0.0.1:6379/0").backend(), "redis");
        assert_eq!(ok("rediss://h:6380").backend(), "redis");
        assert_eq!(ok("redis+cluster://a:7000,b:7001").backend(), "redis");
        assert_eq!(
            ok("redis+sentinel://a:26379,b:26379/mymaster").backend(),
            "redis"
        );
        assert_eq!(
            ok("etcd://a:2379, b:2379/"),
            StoreUrl::Etcd {
                endpoints: vec!["http://a:2379".into(), "http://b:2379".into()],
                url: "etcd://a:2379, b:2379/".into(),
            }
        );
        assert_eq!(
            ok("etcds://root:pw@a:2379?tls_ca=/ca.crt"),
            StoreUrl::Etcd {
                endpoints: vec!["https://a:2379".into()],
                url: "etcds://root:pw@a:2379?tls_ca=/ca.crt".into(),
            }
        );
        assert_eq!(
            ok("k8s://"),
            StoreUrl::Kubernetes {
                namespace: None,
                url: "k8s://".into()
            }
        );
        assert_eq!(
            ok("k8s:?namespace=x"),
            StoreUrl::Kubernetes {
                namespace: None,
                url: "k8s:?namespace=x".into()
            }
        );
        assert_eq!(
            ok("kubernetes://team-a?name_prefix=p-"),
            StoreUrl::Kubernetes {
                namespace: Some("team-a".into()),
                url: "kubernetes://team-a?name_prefix=p-".into()
            }
        );
        assert_eq!(
            ok("sqlite:///var/lib/x.db"),
            StoreUrl::Sqlite("sqlite:///var/lib/x.db".into())
        );
        assert_eq!(ok("sqlite:rel.db").backend(), "sqlite");
    }

    #[test]
    fn bad_urls_are_config_errors() {
        assert!(config_err("").contains("not a store URL"));
        assert!(config_err("localhost:6379").contains("unknown store URL scheme"));
        assert!(config_err("ftp://x").contains("unknown store URL scheme"));
        assert!(config_err("memory:foo").contains("takes no address"));
        assert!(config_err("postgres://").contains("names no host"));
        assert!(config_err("redis:6379").contains("is not a URL"));
        assert!(config_err("etcd://").contains("names no host"));
        assert!(config_err("etcd://a:1,,b:2").contains("is not an endpoint"));
        assert!(config_err("etcd://a:1/path").contains("is not an endpoint"));
        assert!(config_err("k8s://Team_A").contains("not a namespace"));
        assert!(config_err("sqlite://").contains("names no database"));
    }

    #[test]
    fn display_redacts_passwords() {
        assert_eq!(
            ok("postgres://app:s3cret@db:5432/x?sslmode=require").to_string(),
            "postgres://app:***@db:5432/x?sslmode=require"
        );
        assert_eq!(ok("redis://h:6379").to_string(), "redis://h:6379");
        assert_eq!(ok("etcd://a:1,b:2").to_string(), "etcd://a:1,b:2");
        assert_eq!(ok("k8s://ns").to_string(), "k8s://ns");
    }

    #[test]
    fn queries_are_kept_for_every_backend() {
        for url in [
            "postgres://h/db?sslmode=require",
            "redis://h:6379/0?protocol=resp3",
            "etcds://a:2379,b:2379?tls_ca=/pki/ca.crt&tls_cert=/pki/c.crt&tls_key=/pki/c.key",
            "etcd://a:2379/?tls_ca=x",
            "k8s://team-a?name_prefix=lease-&request_timeout=5s",
            "k8s:?namespace=team-a",
            "kubernetes://team-a/?kubeconfig=/etc/kube%20config",
            "sqlite:///var/x.db?busy_timeout=2s",
        ] {
            let parsed = ok(url);
            assert_eq!(parsed.to_string(), url, "{url}");
        }
        assert_eq!(
            ok("etcds://a:2379,b:2379?tls_ca=/ca.crt").to_string(),
            "etcds://a:2379,b:2379?tls_ca=/ca.crt"
        );
        assert!(config_err("etcd://a:1/path?x=1").contains("is not an endpoint"));
        assert!(config_err("etcd://?x=1").contains("names no host"));
        assert!(config_err("k8s://Team_A?x=1").contains("not a namespace"));
    }

    #[test]
    fn display_redacts_passwords_in_user_info_and_query() {
        for (url, secret) in [
            ("etcd://root:pw-etcd@a:2379,b:2379", "pw-etcd"),
            ("etcds://root:pw-etcd@a:2379?tls_ca=/ca.crt", "pw-etcd"),
            (
                "postgres://h/db?user=app&password=pw-pg&sslmode=require",
                "pw-pg",
            ),
            ("postgres://h/db?sslpassword=pw-key", "pw-key"),
            ("redis://h:6379?pass=pw-redis", "pw-redis"),
            ("k8s://ns?name_prefix=x&password=pw-k8s", "pw-k8s"),
            ("sqlite:///x.db?PASSWORD=pw-sq#frag", "pw-sq"),
        ] {
            let shown = ok(url).to_string();
            assert!(!shown.contains(secret), "{url} shown as {shown}");
            assert!(shown.contains("***"), "{url} shown as {shown}");
            let debug = format!("{:?}", ok(url));
            assert!(!debug.contains(secret), "{url} debug {debug}");
        }
        assert_eq!(
            ok("postgres://h/db?user=app&password=pw&sslmode=require").to_string(),
            "postgres://h/db?user=app&password=***&sslmode=require"
        );
        assert_eq!(
            ok("etcd://root:pw@a:2379?x=1").to_string(),
            "etcd://root:***@a:2379?x=1"
        );
    }

    #[test]
    fn features() {
        assert_eq!(StoreUrl::Memory.feature(), None);
        assert_eq!(ok("k8s://").feature(), Some("k8s"));
        let err = ok("redis://h").feature_off().to_string();
        assert!(err.contains("`redis` feature"), "{err}");
    }
}
