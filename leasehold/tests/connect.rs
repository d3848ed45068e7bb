//! `connect` without services: memory, bad URLs, and backends whose feature is off.
//!
//! Run with the default features (none) to check every "feature off" message:
//! `cargo test -p lease`.

use std::time::Duration;

use leasehold::{AcquireRequest, Error, LeaseKey, OwnerId, StoreUrl, WriteOp};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn memory_store_and_resource_work() {
    rt().block_on(async {
        let (store, resource) = leasehold::connect_with_resource("memory:")
            .await
            .expect("memory");
        let key = LeaseKey::new("k").expect("key");
        let req = AcquireRequest::new(key.clone(), OwnerId::random(), Duration::from_secs(5));
        let lease = store
            .acquire(&req)
            .await
            .expect("acquire")
            .lease()
            .expect("free");
        assert!(
            resource
                .write(&key, lease.token(), WriteOp::Add(1))
                .await
                .expect("write")
                .is_accepted()
        );
        // Every `memory:` connection is a new store.
        let other = leasehold::connect("memory:").await.expect("memory");
        assert!(other.inspect(&key).await.expect("inspect").holder.is_none());
    });
}

#[test]
fn unparsable_urls_are_config_errors() {
    rt().block_on(async {
        for url in [
            "",
            "nonsense",
            "ftp://host",
            "postgres://",
            "etcd://a:1,,b",
            "k8s://Bad_NS",
        ] {
            match leasehold::connect(url).await {
                Err(Error::Config { .. }) => {}
                other => panic!("{url:?}: expected Error::Config, got {other:?}"),
            }
            assert!(leasehold::connect_resource(url).await.is_err());
        }
    });
}

#[test]
fn disabled_backends_name_their_feature() {
    let urls = [
        "postgres://postgres@127.0.0.1:5432/test",
        "redis://127.0.0.1:6379",
        "etcd://127.0.0.1:2379",
        "k8s://default",
        "sqlite:///tmp/never-created-by-this-test.db",
    ];
    let mut checked = 0;
    rt().block_on(async {
        for url in urls {
            let parsed = StoreUrl::parse(url).expect("parses");
            if parsed.is_enabled() {
                continue;
            }
            let feature = parsed.feature().expect("a backend feature");
            for result in [
                leasehold::connect(url).await.map(|_| ()),
                leasehold::connect_resource(url).await.map(|_| ()),
            ] {
                match result {
                    Err(Error::Config { message, .. }) => assert!(
                        message.contains(&format!("`{feature}` feature")),
                        "{url}: {message}"
                    ),
                    other => panic!("{url}: expected Error::Config, got {other:?}"),
                }
            }
            checked += 1;
        }
    });
    if cfg!(not(any(
        feature = "postgres",
        feature = "redis",
        feature = "etcd",
        feature = "k8s",
        feature = "sqlite"
    ))) {
        assert_eq!(checked, urls.len());
    }
}
