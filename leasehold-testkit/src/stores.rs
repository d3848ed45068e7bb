//! The test stores: one table of the services the tests run against, the environment variables
//! that name them, what the tests use when a variable is unset, and the service script that
//! starts each one and writes its variables (`scripts/services/NAME.sh`, which writes
//! `$LEASE_STATE_DIR/NAME.env`).
//!
//! Every test that reads a store's address from the environment reads it through this table
//! ([`StoreVar::value`], [`TestStore::url`], [`TestStore::store_url`]), so a default is written
//! once. A default is the address the service script picks when its port is free; the scripts
//! are the truth, and `defaults_match_the_service_scripts` (below) checks the table against them.
//!
//! Adding a backend: add a `TestStore` constant here and to [`ALL`], with the variables its
//! service script writes, then regenerate the table in `CONTRIBUTING.md` (the unit test
//! `contributing_lists_the_table` prints the expected text when they differ).

use std::fmt::Write as _;

/// One environment variable a test store is found by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreVar {
    /// The variable's name.
    pub name: &'static str,
    /// What the tests use when the variable is unset or blank, or `None` when there is no
    /// default (a test that needs it then reports it missing). `{state}` stands for
    /// `LEASE_STATE_DIR` (default `/tmp/lease-test`) and `{pki}` for `LEASE_TLS_DIR` (default
    /// `{state}/pki`).
    pub default: Option<&'static str>,
    /// What the variable names, for the docs.
    pub what: &'static str,
}

impl StoreVar {
    /// The variable's value when it is set and not blank, else its default with `{state}` and
    /// `{pki}` expanded, else `None`.
    pub fn value(&self) -> Option<String> {
        set(self.name).or_else(|| self.default.map(expand))
    }

    /// As [`value`](Self::value), or an empty string when the variable is unset and has no
    /// default (connecting to that then fails with the backend's typed error).
    pub fn get(&self) -> String {
        self.value().unwrap_or_default()
    }

    /// As [`value`](Self::value), or an error naming the variable when it is unset and has no
    /// default.
    pub fn require(&self) -> Result<String, String> {
        self.value().ok_or_else(|| {
            format!(
                "{} is not set and has no default (source the env file its service script \
                 writes under {})",
                self.name,
                state_dir()
            )
        })
    }
}

/// One test store: a backend (or one deployment of it) and the variables that find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestStore {
    /// The name reports and runners use (`postgres`, `redis-cluster`, ...). For the main store
    /// of a backend it is the backend's name.
    pub name: &'static str,
    /// The service script under `scripts/services/` (without `.sh`) that starts the store and
    /// writes its variables, or `None` (SQLite: a temporary file per test).
    pub service: Option<&'static str>,
    /// Its variables; the first one is the store's address ([`url`](Self::url)).
    pub vars: &'static [StoreVar],
}

impl TestStore {
    /// The store's address as its variable gives it (or the default): the first variable's
    /// [`value`](StoreVar::value). `None` for a store without variables or without a default
    /// when unset.
    pub fn url(&self) -> Option<String> {
        self.vars.first().and_then(StoreVar::value)
    }

    /// The store's URL in the form `leasehold::connect` takes: [`url`](Self::url), except etcd,
    /// whose variable lists endpoints (`http://h:p,...`, given as `etcd://h:p,...`), and
    /// Kubernetes, whose URL is `k8s://NAMESPACE` (the kubeconfig comes from `KUBECONFIG`).
    pub fn store_url(&self) -> Option<String> {
        match self.name {
            "etcd" => self.url().map(|e| etcd_url(&e)),
            "k8s" => Some(format!("k8s://{}", K8S_NAMESPACE.value()?)),
            _ => self.url(),
        }
    }

    /// [`store_url`](Self::store_url), but only when the store's first variable is set (not its
    /// default): for tests that run a store only where it was configured.
    pub fn configured_url(&self) -> Option<String> {
        set(self.vars.first()?.name)?;
        self.store_url()
    }

    /// The variable named `name` of this store, if it has one.
    pub fn var(&self, name: &str) -> Option<&'static StoreVar> {
        self.vars.iter().find(|v| v.name == name)
    }
}

/// `LEASE_STATE_DIR`, default `/tmp/lease-test`: where the service scripts keep their state and
/// env files.
pub fn state_dir() -> String {
    set("LEASE_STATE_DIR").unwrap_or_else(|| "/tmp/lease-test".to_string())
}

/// `LEASE_TLS_DIR`, default `{state}/pki`: the test PKI of `scripts/services/certs.sh`.
pub fn pki_dir() -> String {
    set("LEASE_TLS_DIR").unwrap_or_else(|| format!("{}/pki", state_dir()))
}

/// The `etcd://` URL of a comma-separated list of endpoints (`http://host:port` or
/// `host:port`).
pub fn etcd_url(endpoints: &str) -> String {
    let hosts: Vec<&str> = endpoints
        .split(',')
        .map(|e| {
            let e = e.trim();
            e.strip_prefix("http://").unwrap_or(e).trim_end_matches('/')
        })
        .filter(|e| !e.is_empty())
        .collect();
    format!("etcd://{}", hosts.join(","))
}

fn set(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn expand(default: &str) -> String {
    default
        .replace("{pki}", &pki_dir())
        .replace("{state}", &state_dir())
}

const fn var(name: &'static str, default: Option<&'static str>, what: &'static str) -> StoreVar {
    StoreVar {
        name,
        default,
        what,
    }
}

/// `LEASE_POSTGRES_URL`.
pub const POSTGRES_URL: StoreVar = var(
    "LEASE_POSTGRES_URL",
    Some("postgres://postgres@127.0.0.1:5432/test"),
    "the shared PostgreSQL",
);
/// `LEASE_REDIS_URL`.
pub const REDIS_URL: StoreVar = var(
    "LEASE_REDIS_URL",
    Some("redis://127.0.0.1:6379"),
    "the shared Redis",
);
/// `LEASE_TEST_REDIS_CLUSTER_URL`.
pub const REDIS_CLUSTER_URL: StoreVar = var(
    "LEASE_TEST_REDIS_CLUSTER_URL",
    Some(
        "redis+cluster://127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103,127.0.0.1:7104,\
         127.0.0.1:7105,127.0.0.1:7106",
    ),
    "a Redis Cluster, three masters and three replicas",
);
/// `LEASE_REDIS_TLS_URL`.
pub const REDIS_TLS_URL: StoreVar = var(
    "LEASE_REDIS_TLS_URL",
    Some("rediss://lease:lease-pass@127.0.0.1:6390/?tls_ca={pki}/ca.crt"),
    "a Redis that speaks only TLS, with a password user",
);
/// `LEASE_REDIS_TLS_CLUSTER_URL`.
pub const REDIS_TLS_CLUSTER_URL: StoreVar = var(
    "LEASE_REDIS_TLS_CLUSTER_URL",
    Some(
        "rediss+cluster://127.0.0.1:7201,127.0.0.1:7202,127.0.0.1:7203,127.0.0.1:7204,\
         127.0.0.1:7205,127.0.0.1:7206?tls_ca={pki}/ca.crt",
    ),
    "a Redis Cluster over TLS",
);
/// `LEASE_REDIS_SENTINEL_URL`.
pub const REDIS_SENTINEL_URL: StoreVar = var(
    "LEASE_REDIS_SENTINEL_URL",
    Some("redis+sentinel://127.0.0.1:26480,127.0.0.1:26481,127.0.0.1:26482/lease-master"),
    "three sentinels over a master and a replica",
);
/// `LEASE_ETCD_ENDPOINTS`.
pub const ETCD_ENDPOINTS: StoreVar = var(
    "LEASE_ETCD_ENDPOINTS",
    Some("http://127.0.0.1:23790"),
    "the shared etcd member (comma-separated endpoints)",
);
/// `KUBECONFIG`.
pub const KUBECONFIG: StoreVar = var(
    "KUBECONFIG",
    Some("{state}/k8s/kubeconfig"),
    "the kube-apiserver's kubeconfig",
);
/// `LEASE_K8S_NAMESPACE`.
pub const K8S_NAMESPACE: StoreVar = var(
    "LEASE_K8S_NAMESPACE",
    Some("default"),
    "the namespace of the tests' Leases",
);
/// `LEASE_MYSQL_URL`.
pub const MYSQL_URL: StoreVar = var(
    "LEASE_MYSQL_URL",
    Some("mysql://root@127.0.0.1:3306/test"),
    "the shared MariaDB",
);

/// PostgreSQL.
pub const POSTGRES: TestStore = TestStore {
    name: "postgres",
    service: Some("postgres"),
    vars: &[POSTGRES_URL],
};

/// PostgreSQL over TLS: a server with the test PKI and one whose certificate has expired.
pub const POSTGRES_TLS: TestStore = TestStore {
    name: "postgres-tls",
    service: Some("postgres-tls"),
    vars: &[
        var(
            "LEASE_POSTGRES_TLS_URL",
            None,
            "TLS with a password user (verify-full)",
        ),
        var(
            "LEASE_POSTGRES_TLS_CERT_URL",
            None,
            "TLS with a client certificate",
        ),
        var(
            "LEASE_POSTGRES_TLS_EXPIRED_URL",
            None,
            "a server whose certificate has expired",
        ),
    ],
};

/// Redis, one server.
pub const REDIS: TestStore = TestStore {
    name: "redis",
    service: Some("redis"),
    vars: &[REDIS_URL],
};

/// Redis Cluster.
pub const REDIS_CLUSTER: TestStore = TestStore {
    name: "redis-cluster",
    service: Some("redis-cluster"),
    vars: &[REDIS_CLUSTER_URL],
};

/// Redis over TLS.
pub const REDIS_TLS: TestStore = TestStore {
    name: "redis-tls",
    service: Some("redis-tls"),
    vars: &[REDIS_TLS_URL],
};

/// Redis Cluster over TLS.
pub const REDIS_TLS_CLUSTER: TestStore = TestStore {
    name: "redis-tls-cluster",
    service: Some("redis-tls-cluster"),
    vars: &[REDIS_TLS_CLUSTER_URL],
};

/// Redis Sentinel.
pub const REDIS_SENTINEL: TestStore = TestStore {
    name: "redis-sentinel",
    service: Some("redis-sentinel"),
    vars: &[REDIS_SENTINEL_URL],
};

/// etcd, one member.
pub const ETCD: TestStore = TestStore {
    name: "etcd",
    service: Some("etcd"),
    vars: &[ETCD_ENDPOINTS],
};

/// etcd over TLS: a member with the test PKI and one whose certificate has expired.
pub const ETCD_TLS: TestStore = TestStore {
    name: "etcd-tls",
    service: Some("etcd-tls"),
    vars: &[
        var(
            "LEASE_ETCD_TLS_ENDPOINTS",
            None,
            "host:port of the TLS member",
        ),
        var(
            "LEASE_ETCD_TLS_EXPIRED_ENDPOINTS",
            None,
            "host:port of a member whose certificate has expired",
        ),
        var("LEASE_ETCD_TLS_USER", None, "the password user"),
        var("LEASE_ETCD_TLS_PASSWORD", None, "its password"),
        var("LEASE_ETCD_TLS_DIR", Some("{pki}"), "the test PKI"),
    ],
};

/// Kubernetes: a kube-apiserver over its own etcd.
pub const K8S: TestStore = TestStore {
    name: "k8s",
    service: Some("k8s"),
    vars: &[KUBECONFIG, K8S_NAMESPACE],
};

/// MySQL (MariaDB), plain and TLS on one port.
pub const MYSQL: TestStore = TestStore {
    name: "mysql",
    service: Some("mariadb"),
    vars: &[
        MYSQL_URL,
        var("LEASE_MYSQL_TLS_URL", None, "TLS required, a password user"),
        var(
            "LEASE_MYSQL_TLS_CERT_URL",
            None,
            "TLS with a client certificate",
        ),
    ],
};

/// SQLite: no service, a temporary file per test.
pub const SQLITE: TestStore = TestStore {
    name: "sqlite",
    service: None,
    vars: &[],
};

/// Every test store, in the order the docs list them.
pub const ALL: &[&TestStore] = &[
    &POSTGRES,
    &POSTGRES_TLS,
    &REDIS,
    &REDIS_CLUSTER,
    &REDIS_TLS,
    &REDIS_TLS_CLUSTER,
    &REDIS_SENTINEL,
    &ETCD,
    &ETCD_TLS,
    &K8S,
    &MYSQL,
    &SQLITE,
];

/// The test store named `name` (see [`TestStore::name`]), if the table has one.
pub fn by_name(name: &str) -> Option<&'static TestStore> {
    ALL.iter().copied().find(|s| s.name == name)
}

/// The table as Markdown, as `CONTRIBUTING.md` shows it: one row per variable.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| store | variable | default when unset | service script |\n|---|---|---|---|\n",
    );
    for store in ALL {
        let script = store
            .service
            .map_or("none (a temporary file)".to_string(), |s| {
                format!("`scripts/services/{s}.sh`")
            });
        if store.vars.is_empty() {
            let _ = writeln!(out, "| {} | none | | {script} |", store.name);
        }
        for v in store.vars {
            let default = v
                .default
                .map_or("none: the test reports it missing".to_string(), |d| {
                    format!("`{d}`")
                });
            let _ = writeln!(
                out,
                "| {} | `{}`: {} | {default} | {script} |",
                store.name, v.name, v.what
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace_file(path: &str) -> String {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The first port of a default address (`...://[user@]host:PORT...`).
    fn first_port(url: &str) -> Option<&str> {
        let rest = url.split_once("://")?.1;
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        let port = rest.split_once(':')?.1;
        let end = port
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(port.len());
        Some(&port[..end])
    }

    /// Each default's port is the one its service script starts from (`${LEASE_X_PORT:-N}` or
    /// `free_port N`), so that a test run without the env file still finds the service the
    /// script started on a free machine. The sentinels' ports are derived in the script (the
    /// master's base + 20000), so their script default is checked as that sum.
    #[test]
    fn defaults_match_the_service_scripts() {
        let mut checked = 0;
        for store in ALL {
            let Some(service) = store.service else {
                continue;
            };
            let Some(port) = store.vars[0].default.and_then(first_port) else {
                continue;
            };
            let script = workspace_file(&format!("scripts/services/{service}.sh"));
            let port: u32 = port.parse().expect("a port");
            let port = if store.name == "redis-sentinel" {
                port - 20000
            } else {
                port
            };
            assert!(
                script.contains(&format!(":-{port}}}")),
                "{}: default port {port} is not the default of scripts/services/{service}.sh",
                store.name
            );
            checked += 1;
        }
        assert_eq!(
            checked, 8,
            "every store with a service and a default was checked"
        );
    }

    #[test]
    fn contributing_lists_the_table() {
        let doc = workspace_file("CONTRIBUTING.md");
        let table = markdown_table();
        assert!(
            doc.contains(&table),
            "CONTRIBUTING.md does not contain the test store table; paste this:\n{table}"
        );
    }

    #[test]
    fn names_are_unique_and_found() {
        for store in ALL {
            assert_eq!(by_name(store.name), Some(*store));
        }
        assert_eq!(by_name("nope"), None);
    }

    #[test]
    fn etcd_urls_drop_the_scheme() {
        assert_eq!(
            etcd_url("http://127.0.0.1:23790, 127.0.0.1:23791/"),
            "etcd://127.0.0.1:23790,127.0.0.1:23791"
        );
    }
}
