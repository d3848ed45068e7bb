//! The backends under test, reachable directly or through a [`FaultProxy`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use crate::proxy::FaultProxy;
use async_trait::async_trait;
use leasehold_core::{Error, FencedResource, LeaseStore, Result};
use leasehold_testkit::faulty::FaultyStore;
use leasehold_testkit::stores;

use crate::link::{FaultyResource, Link, ProxyLink, StoreLink};
use crate::record::Record;
use crate::storm::{Contender, StormBackend};

/// How a backend is reached.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// A URL understood by `leasehold::connect`, with `{addr}` standing for `host:port`.
    Url {
        /// The template, e.g. `redis://{addr}`.
        template: String,
        /// The real server.
        upstream: SocketAddr,
    },
    /// A SQLite file on this host (no network: faults are injected in process).
    Sqlite {
        /// The database file.
        path: String,
    },
    /// A Kubernetes API server reached through a kubeconfig (rewritten to point at a proxy).
    Kube {
        /// The kubeconfig of the real server.
        kubeconfig: String,
        /// The namespace.
        namespace: String,
        /// The real server.
        upstream: SocketAddr,
    },
}

/// One backend under test.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its name (`postgres`, `redis`, ...).
    pub name: &'static str,
    /// How it is reached.
    pub endpoint: Endpoint,
    /// The TTL the scenarios use.
    pub ttl: Duration,
    /// Extra time a takeover may need beyond the TTL (Kubernetes candidates must observe an
    /// unchanged record for a whole TTL on their own clock).
    pub takeover_slack: Duration,
}

impl Target {
    /// The real server's address (none for SQLite).
    pub fn upstream(&self) -> Option<SocketAddr> {
        match &self.endpoint {
            Endpoint::Url { upstream, .. } | Endpoint::Kube { upstream, .. } => Some(*upstream),
            Endpoint::Sqlite { .. } => None,
        }
    }

    /// The store URL of the real server, as a child process uses it.
    pub fn direct_url(&self) -> String {
        match &self.endpoint {
            Endpoint::Url { template, upstream } => {
                template.replace("{addr}", &upstream.to_string())
            }
            Endpoint::Sqlite { path } => format!("sqlite://{path}"),
            Endpoint::Kube { namespace, .. } => format!("k8s://{namespace}"),
        }
    }

    /// A store URL for the real server, as a child process uses it (for Kubernetes the ambient
    /// kubeconfig names the server).
    ///
    /// # Errors
    /// Never today; kept for targets whose URL must be prepared.
    pub fn url(&self, addr: SocketAddr) -> Result<String> {
        match &self.endpoint {
            Endpoint::Url { template, .. } => Ok(template.replace("{addr}", &addr.to_string())),
            Endpoint::Sqlite { .. } | Endpoint::Kube { .. } => Ok(self.direct_url()),
        }
    }

    /// A new client of the store through `addr` (the real server or a proxy in front of it).
    ///
    /// # Errors
    /// As `leasehold::connect`, or if a rewritten kubeconfig cannot be written.
    pub async fn connect_via(&self, addr: SocketAddr) -> Result<Arc<dyn LeaseStore>> {
        match &self.endpoint {
            Endpoint::Url { .. } | Endpoint::Sqlite { .. } => {
                leasehold::connect(&self.url(addr)?).await
            }
            Endpoint::Kube { namespace, .. } => {
                let path = self.kubeconfig_via(addr)?;
                let options = leasehold::k8s::K8sOptions::default().with_kubeconfig(&path);
                let url = format!("k8s://{namespace}");
                let store = leasehold::k8s::K8sLeaseStore::connect_with(&url, options).await?;
                Ok(Arc::new(store))
            }
        }
    }

    /// A new client of the backend's fenced resource through `addr` (the real server or a proxy
    /// in front of it): the PostgreSQL and MySQL high-water tables, the Redis script resource, the
    /// etcd and Kubernetes resources, the SQLite `lease_fenced` table.
    ///
    /// # Errors
    /// As `leasehold::connect_resource`.
    pub async fn resource_via(&self, addr: SocketAddr) -> Result<Arc<dyn FencedResource>> {
        match &self.endpoint {
            Endpoint::Url { .. } | Endpoint::Sqlite { .. } => {
                leasehold::connect_resource(&self.url(addr)?).await
            }
            Endpoint::Kube { namespace, .. } => {
                let path = self.kubeconfig_via(addr)?;
                let options = leasehold::k8s::K8sOptions::default().with_kubeconfig(&path);
                let url = format!("k8s://{namespace}");
                let store = leasehold::k8s::K8sLeaseStore::connect_with(&url, options).await?;
                Ok(Arc::new(store.fenced_resource()))
            }
        }
    }

    /// The kubeconfig to use to reach the API server through `addr`.
    fn kubeconfig_via(&self, addr: SocketAddr) -> Result<String> {
        let Endpoint::Kube {
            kubeconfig,
            upstream,
            ..
        } = &self.endpoint
        else {
            return Err(Error::config(
                "k8s",
                "not a Kubernetes target".to_string(),
                None,
            ));
        };
        if addr == *upstream {
            return Ok(kubeconfig.clone());
        }
        let text = std::fs::read_to_string(kubeconfig)
            .map_err(|e| Error::config("k8s", format!("reading {kubeconfig}: {e}"), None))?;
        let rewritten = text.replace(&format!("127.0.0.1:{}", upstream.port()), &addr.to_string());
        let path = format!("{kubeconfig}.proxy-{}", addr.port());
        std::fs::write(&path, rewritten)
            .map_err(|e| Error::config("k8s", format!("writing {path}: {e}"), None))?;
        Ok(path)
    }

    /// A client of the store behind a fault link of its own: a loopback proxy for a network
    /// backend, an in-process wrapper for SQLite. The returned value keeps the proxy alive.
    ///
    /// # Errors
    /// As [`connect_via`](Self::connect_via), or if no proxy port can be bound.
    pub async fn faulty_client(&self) -> Result<(Arc<dyn LeaseStore>, Arc<dyn Link>)> {
        match self.upstream() {
            Some(up) => {
                let proxy = Arc::new(FaultProxy::start(up).await.map_err(|e| {
                    Error::unavailable("fault-proxy", format!("starting a proxy: {e}"), None)
                })?);
                let store = self.connect_via(proxy.addr()).await?;
                Ok((store, Arc::new(ProxyLink(proxy))))
            }
            None => {
                let store = FaultyStore::new(self.connect().await?);
                Ok((Arc::new(store.clone()), Arc::new(StoreLink(store))))
            }
        }
    }

    /// A client of the fenced resource behind a fault link of its own (see
    /// [`faulty_client`](Self::faulty_client)).
    ///
    /// # Errors
    /// As [`resource_via`](Self::resource_via), or if no proxy port can be bound.
    pub async fn faulty_resource(&self) -> Result<(Arc<dyn FencedResource>, Arc<dyn Link>)> {
        match self.upstream() {
            Some(up) => {
                let proxy = Arc::new(FaultProxy::start(up).await.map_err(|e| {
                    Error::unavailable("fault-proxy", format!("starting a proxy: {e}"), None)
                })?);
                let res = self.resource_via(proxy.addr()).await?;
                Ok((res, Arc::new(ProxyLink(proxy))))
            }
            None => {
                let res = FaultyResource::new(self.resource().await?, Duration::ZERO);
                Ok((Arc::new(res.clone()), Arc::new(res)))
            }
        }
    }

    /// A client of the real server's fenced resource.
    ///
    /// # Errors
    /// As [`resource_via`](Self::resource_via).
    pub async fn resource(&self) -> Result<Arc<dyn FencedResource>> {
        match &self.endpoint {
            Endpoint::Sqlite { .. } => leasehold::connect_resource(&self.direct_url()).await,
            _ => {
                self.resource_via(self.upstream().unwrap_or(([127, 0, 0, 1], 0).into()))
                    .await
            }
        }
    }

    /// A new client of the real server.
    ///
    /// # Errors
    /// As `leasehold::connect`.
    pub async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        match &self.endpoint {
            Endpoint::Sqlite { .. } => leasehold::connect(&self.direct_url()).await,
            _ => {
                self.connect_via(self.upstream().unwrap_or(([127, 0, 0, 1], 0).into()))
                    .await
            }
        }
    }
}

fn addr_of(host_port: &str) -> Option<SocketAddr> {
    host_port.to_socket_addrs().ok()?.find(|a| a.is_ipv4())
}

/// The host:port part of a URL like `scheme://user@host:port/path`.
fn host_port(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    Some(rest.split(['/', '?']).next().unwrap_or(rest))
}

/// The backends configured in the environment, each with the reason it is unavailable if it
/// cannot be set up. The addresses and their defaults come from the test store table
/// (`leasehold_testkit::stores`), as in the conformance suites; etcd uses the first of its
/// endpoints.
pub fn targets_from_env() -> Vec<std::result::Result<Target, (&'static str, String)>> {
    let mut out = Vec::new();
    out.push(url_target(
        "postgres",
        &stores::POSTGRES_URL.get(),
        Duration::from_millis(1000),
        Duration::from_millis(500),
    ));
    out.push(url_target(
        "redis",
        &stores::REDIS_URL.get(),
        Duration::from_millis(1000),
        Duration::from_millis(500),
    ));
    let endpoints = stores::ETCD_ENDPOINTS.get();
    let first = endpoints.split(',').next().unwrap_or_default();
    out.push(url_target(
        "etcd",
        &stores::etcd_url(first),
        Duration::from_secs(2),
        Duration::from_secs(2),
    ));
    out.push(kube_target());
    out.push(sqlite_target());
    out.push(url_target(
        "mysql",
        &stores::MYSQL_URL.get(),
        Duration::from_millis(1000),
        Duration::from_millis(500),
    ));
    out
}

/// SQLite: a file under the temporary directory, shared by every client of this process (each
/// client opens it on its own, as separate processes would).
fn sqlite_target() -> std::result::Result<Target, (&'static str, String)> {
    let dir = std::env::var("LEASE_SQLITE_DIR")
        .unwrap_or_else(|_| std::env::temp_dir().to_string_lossy().into_owned());
    std::fs::create_dir_all(&dir).map_err(|e| ("sqlite", format!("{dir}: {e}")))?;
    let path = format!("{dir}/leasehold-faults-{}.db", std::process::id());
    Ok(Target {
        name: "sqlite",
        endpoint: Endpoint::Sqlite { path },
        ttl: Duration::from_millis(1000),
        takeover_slack: Duration::from_millis(500),
    })
}

#[async_trait]
impl StormBackend for Target {
    fn ttl(&self) -> Duration {
        self.ttl
    }
    async fn contender(&self) -> std::result::Result<Contender, String> {
        let (store, store_link) = self.faulty_client().await.map_err(|e| e.to_string())?;
        let (resource, resource_link) = self.faulty_resource().await.map_err(|e| e.to_string())?;
        Ok(Contender {
            store,
            resource,
            store_link,
            resource_link,
        })
    }
    async fn observer(
        &self,
    ) -> std::result::Result<(Arc<dyn LeaseStore>, Arc<dyn FencedResource>), String> {
        let store = self.connect().await.map_err(|e| e.to_string())?;
        let res = self.resource().await.map_err(|e| e.to_string())?;
        Ok((store, res))
    }
}

/// A target whose storms check the resource's own record of the writes it accepted
/// ([`crate::record`]): its store and resource use the fault suite's own tables (PostgreSQL's
/// schema, MySQL's table), where the record's triggers sit.
#[derive(Debug, Clone)]
pub struct RecordedTarget {
    /// The target, its URL naming the recorded tables.
    pub target: Target,
    /// The installed record.
    pub record: Record,
}

impl Target {
    /// This target with the resource's own record installed: the tables created (by connecting a
    /// store and a resource) and the record's triggers put on them. `None` if the backend keeps
    /// no record here (none today: every backend of [`targets_from_env`] keeps one).
    ///
    /// # Errors
    /// If the store or resource cannot be reached, or the record cannot be installed.
    ///
    /// # Cancellation safety
    /// Cancel safe: connecting and installing are idempotent.
    pub async fn recorded(&self) -> std::result::Result<Option<RecordedTarget>, String> {
        let mut target = self.clone();
        let record = match &self.endpoint {
            Endpoint::Kube {
                kubeconfig,
                namespace,
                ..
            } => Record::Log(crate::tail::Source::Kube {
                kubeconfig: kubeconfig.clone(),
                namespace: namespace.clone(),
            }),
            _ => {
                let direct = self.direct_url();
                let Some((record, url)) = Record::for_url(&direct) else {
                    return Ok(None);
                };
                // The record may name its own tables in the URL's query: the proxied URLs of the
                // contenders must name them too.
                let Some(suffix) = url.strip_prefix(direct.as_str()) else {
                    return Err(format!(
                        "the recorded URL {url} does not extend the target's {direct}"
                    ));
                };
                if let Endpoint::Url { template, .. } = &mut target.endpoint {
                    template.push_str(suffix);
                }
                record
            }
        };
        target.connect().await.map_err(|e| e.to_string())?;
        target.resource().await.map_err(|e| e.to_string())?;
        record.install().await?;
        Ok(Some(RecordedTarget { target, record }))
    }
}

#[async_trait]
impl StormBackend for RecordedTarget {
    fn ttl(&self) -> Duration {
        self.target.ttl
    }
    async fn contender(&self) -> std::result::Result<Contender, String> {
        self.target.contender().await
    }
    async fn observer(
        &self,
    ) -> std::result::Result<(Arc<dyn LeaseStore>, Arc<dyn FencedResource>), String> {
        self.target.observer().await
    }
    fn record(&self) -> Option<&Record> {
        Some(&self.record)
    }
}

fn url_target(
    name: &'static str,
    url: &str,
    ttl: Duration,
    slack: Duration,
) -> std::result::Result<Target, (&'static str, String)> {
    let hp = host_port(url).ok_or((name, format!("cannot parse {url}")))?;
    let upstream = addr_of(hp).ok_or((name, format!("cannot resolve {hp}")))?;
    let template = url.replacen(hp, "{addr}", 1);
    Ok(Target {
        name,
        endpoint: Endpoint::Url { template, upstream },
        ttl,
        takeover_slack: slack,
    })
}

fn kube_target() -> std::result::Result<Target, (&'static str, String)> {
    let kubeconfig = stores::KUBECONFIG.get();
    let text =
        std::fs::read_to_string(&kubeconfig).map_err(|e| ("k8s", format!("{kubeconfig}: {e}")))?;
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .map(str::trim)
        .ok_or(("k8s", "no server in kubeconfig".to_string()))?;
    let upstream = host_port(server)
        .and_then(addr_of)
        .ok_or(("k8s", format!("cannot resolve {server}")))?;
    let namespace = stores::K8S_NAMESPACE.get();
    Ok(Target {
        name: "k8s",
        endpoint: Endpoint::Kube {
            kubeconfig,
            namespace,
            upstream,
        },
        ttl: Duration::from_secs(2),
        takeover_slack: Duration::from_secs(3),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_parsing() {
        assert_eq!(
            host_port("postgres://postgres@127.0.0.1:5432/test"),
            Some("127.0.0.1:5432")
        );
        assert_eq!(host_port("redis://127.0.0.1:6379"), Some("127.0.0.1:6379"));
        assert_eq!(
            host_port("https://127.0.0.1:36443"),
            Some("127.0.0.1:36443")
        );
        let t = url_target(
            "redis",
            "redis://127.0.0.1:6379",
            Duration::from_secs(1),
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(
            t.url("127.0.0.1:1234".parse().unwrap()).unwrap(),
            "redis://127.0.0.1:1234"
        );
    }
}
