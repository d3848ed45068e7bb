//! `connect` hands every backend its URL as written, query and user information included: the
//! backend reads its options from the query and refuses what it does not know.
//!
//! The cases that connect run when their backend's feature is on (as in the workspace test run,
//! or `cargo test -p leasehold --features etcd,__docs_rs_k8s_version`). They use the services of
//! `scripts/services/etcd-tls.sh` (`LEASE_ETCD_TLS_ENDPOINTS`, `LEASE_ETCD_TLS_DIR`,
//! `LEASE_ETCD_TLS_USER`, `LEASE_ETCD_TLS_PASSWORD`) and `scripts/services/k8s.sh` (`KUBECONFIG`,
//! `LEASE_K8S_NAMESPACE`), and the Sentinel group of `scripts/services/redis-sentinel.sh`
//! (`LEASE_REDIS_SENTINEL_URL`), read through leasehold-testkit's table of test stores. A case
//! runs only where its service's first variable is set: unset, it skips with a message, and fails
//! under `CI=true` or `LEASE_TEST_REQUIRE=1`.

#![cfg(any(feature = "etcd", feature = "k8s", feature = "redis"))]

use std::time::Duration;

use leasehold::{AcquireRequest, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome};
use leasehold_testkit::stores::{self, TestStore};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The variables `names` of the test store `store` (leasehold-testkit's table), in order, when
/// its first variable is set; `None` (after saying so) when it is unset and the run does not
/// require every backend, a panic when it does (or when a named variable has no value).
fn service_env<const N: usize>(store: &TestStore, names: [&str; N]) -> Option<[String; N]> {
    let first = store.vars.first().map_or("", |v| v.name);
    let service = format!(
        "scripts/services/{}.sh",
        store.service.unwrap_or(store.name)
    );
    if store.configured_url().is_none() {
        let required = std::env::var("LEASE_TEST_REQUIRE").is_ok_and(|v| v == "1")
            || std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(
            !required,
            "{first} is not set: start {service} and source its env file"
        );
        eprintln!("SKIPPED: {first} is not set (start {service})");
        return None;
    }
    Some(names.map(|name| {
        let var = store
            .var(name)
            .unwrap_or_else(|| panic!("{name} is not a variable of {}", store.name));
        var.require().unwrap_or_else(|e| panic!("{e}"))
    }))
}

fn key(name: &str) -> LeaseKey {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    LeaseKey::new(format!("url-query-{name}-{}-{nanos}", std::process::id())).expect("legal key")
}

/// Acquires `key` on `store` and releases it: the store works.
async fn acquire_and_release(store: &dyn LeaseStore, key: &LeaseKey) -> OwnerId {
    let owner = OwnerId::random();
    let req = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(30));
    let lease = store
        .acquire(&req)
        .await
        .expect("acquire")
        .lease()
        .expect("a fresh key is free");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    owner
}

#[cfg(any(feature = "etcd", feature = "k8s"))]
fn config_error_naming(result: leasehold::Result<impl Sized>, url: &str, needles: &[&str]) {
    match result {
        Err(e @ leasehold::Error::Config { .. }) => {
            let text = e.to_string();
            for needle in needles {
                assert!(text.contains(needle), "{url}: {needle:?} not in {text}");
            }
        }
        Err(other) => panic!("{url}: expected Error::Config, got {other:?}"),
        Ok(_) => panic!("{url}: expected Error::Config, got a store"),
    }
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_reads_tls_files_and_user_from_the_url_given_to_connect() {
    let Some([endpoint, dir, user, password]) = service_env(
        &stores::ETCD_TLS,
        [
            "LEASE_ETCD_TLS_ENDPOINTS",
            "LEASE_ETCD_TLS_DIR",
            "LEASE_ETCD_TLS_USER",
            "LEASE_ETCD_TLS_PASSWORD",
        ],
    ) else {
        return;
    };
    let files = format!("tls_ca={dir}/ca.crt&tls_cert={dir}/client.crt&tls_key={dir}/client.key");
    rt().block_on(async {
        // Authenticated by the client certificate the query names.
        let url = format!("etcds://{endpoint}?{files}");
        let store = leasehold::connect(&url).await.expect("connect with the query");
        acquire_and_release(store.as_ref(), &key("etcd-cert")).await;

        // Authenticated by the user information, with the query's TLS files.
        let url = format!("etcds://{user}:{password}@{endpoint}?{files}");
        let (store, _resource) = leasehold::connect_with_resource(&url)
            .await
            .expect("connect with user and query");
        acquire_and_release(store.as_ref(), &key("etcd-user")).await;
        let shown = leasehold::StoreUrl::parse(&url).expect("parses").to_string();
        assert!(!shown.contains(&password), "{shown}");

        // Without the query's CA the server's certificate is not trusted: the query mattered.
        let url = format!("etcds://{endpoint}?tls_ca={dir}/other-ca.crt&tls_cert={dir}/client.crt&tls_key={dir}/client.key");
        config_error_naming(leasehold::connect(&url).await, &url, &[]);
    });
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_refuses_an_unknown_parameter_given_to_connect() {
    rt().block_on(async {
        // leasehold-etcd's own refusal, which lists the parameters it knows (nothing is contacted).
        for url in [
            "etcd://127.0.0.1:1?tls_caa=/ca.crt",
            "etcds://127.0.0.1:1,127.0.0.1:2?tls_caa=/ca.crt",
        ] {
            let refusal = ["unknown URL parameter tls_caa", "(known: ", " tls_ca,"];
            config_error_naming(leasehold::connect(url).await, url, &refusal);
            config_error_naming(leasehold::connect_resource(url).await, url, &refusal);
        }
    });
}

#[cfg(feature = "k8s")]
#[test]
fn k8s_reads_every_option_from_the_url_given_to_connect() {
    let Some([kubeconfig, ns]) = service_env(&stores::K8S, ["KUBECONFIG", "LEASE_K8S_NAMESPACE"])
    else {
        return;
    };
    rt().block_on(async {
        let prefix = "url-query-";
        let url =
            format!("k8s://{ns}?name_prefix={prefix}&request_timeout=5s&kubeconfig={kubeconfig}");
        let store = leasehold::connect(&url)
            .await
            .expect("connect with the query");
        let key = key("k8s");
        let req = AcquireRequest::new(key.clone(), OwnerId::random(), Duration::from_secs(30));
        let lease = store
            .acquire(&req)
            .await
            .expect("acquire")
            .lease()
            .expect("free");
        // The Lease object carries the URL's prefix: a store with that prefix sees the holder,
        // one without it does not.
        let options = leasehold::k8s::K8sOptions::default().with_kubeconfig(&kubeconfig);
        let prefixed = leasehold::k8s::K8sLeaseStore::connect_with(
            &format!("k8s://{ns}"),
            options.clone().with_name_prefix(prefix),
        )
        .await
        .expect("prefixed store");
        let plain = leasehold::k8s::K8sLeaseStore::connect_with(&format!("k8s://{ns}"), options)
            .await
            .expect("plain store");
        let seen = prefixed.inspect(&key).await.expect("inspect").holder;
        assert_eq!(seen.map(|h| h.owner), Some(lease.owner().clone()));
        assert!(plain.inspect(&key).await.expect("inspect").holder.is_none());
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );

        for (bad, name) in [
            ("name_prefx=a-", "name_prefx"),
            ("request_timeout=5", "request_timeout"),
            (
                "kubeconfig=/nonexistent/kubeconfig",
                "/nonexistent/kubeconfig",
            ),
        ] {
            let url = format!("k8s://{ns}?{bad}");
            config_error_naming(leasehold::connect(&url).await, &url, &[name]);
        }
    });
}

/// `group_set` in a `k8s://` URL selects the grouped mode: the key's holder is in the set's
/// group objects, seen by a grouped store of that set and not by a one-Lease-per-key store;
/// `K8sLeaseStore` refuses such a URL rather than ignore it.
#[cfg(feature = "k8s")]
#[test]
fn k8s_group_set_in_the_url_given_to_connect_selects_the_grouped_mode() {
    let Some([kubeconfig, ns]) = service_env(&stores::K8S, ["KUBECONFIG", "LEASE_K8S_NAMESPACE"])
    else {
        return;
    };
    rt().block_on(async {
        let url = format!("k8s://{ns}?group_set=url-query&groups=4&kubeconfig={kubeconfig}");
        let store = leasehold::connect(&url)
            .await
            .expect("connect with group_set");
        let key = key("k8s-grouped");
        let req = AcquireRequest::new(key.clone(), OwnerId::random(), Duration::from_secs(30));
        let lease = store
            .acquire(&req)
            .await
            .expect("acquire")
            .lease()
            .expect("free");
        let grouped = leasehold::k8s::K8sGroupedStore::connect(&url)
            .await
            .expect("grouped store");
        assert_eq!((grouped.set(), grouped.groups()), ("url-query", 4));
        let plain_url = format!("k8s://{ns}?kubeconfig={kubeconfig}");
        let plain = leasehold::k8s::K8sLeaseStore::connect(&plain_url)
            .await
            .expect("plain store");
        let seen = grouped.inspect(&key).await.expect("inspect").holder;
        assert_eq!(seen.map(|h| h.owner), Some(lease.owner().clone()));
        assert!(plain.inspect(&key).await.expect("inspect").holder.is_none());
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
        config_error_naming(
            leasehold::k8s::K8sLeaseStore::connect(&url).await,
            &url,
            &["grouped mode"],
        );
        let no_set = format!("k8s://{ns}?groups=4&kubeconfig={kubeconfig}");
        config_error_naming(leasehold::connect(&no_set).await, &no_set, &["group_set"]);
        config_error_naming(
            leasehold::k8s::K8sGroupedStore::connect(&plain_url).await,
            &plain_url,
            &["group_set"],
        );
    });
}

/// A `redis+sentinel://` URL reaches the Redis backend, which finds the master through the
/// sentinels.
#[cfg(feature = "redis")]
#[test]
fn redis_sentinel_url_given_to_connect_finds_the_master() {
    let Some([url]) = service_env(&stores::REDIS_SENTINEL, ["LEASE_REDIS_SENTINEL_URL"]) else {
        return;
    };
    rt().block_on(async {
        let store = leasehold::connect(&url)
            .await
            .expect("connect through the sentinels");
        acquire_and_release(&*store, &key("sentinel")).await;
    });
}
