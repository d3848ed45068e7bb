//! Pairing a store with its own fenced resource: Redis's resource shares the store's
//! asynchronous failover (ADR 0021). The choice is explicit: refused, warned
//! about (the default of `connect_with_resource`), or accepted.
//!
//! The Redis cases that connect use `LEASE_REDIS_URL` (default `redis://127.0.0.1:6379`, from
//! leasehold-testkit's table of test stores) and run only when the `redis` feature is on (for
//! example `cargo test -p leasehold --features redis`).

use std::io::Write;
use std::sync::{Arc, Mutex};

use leasehold::{Error, SharedFailover, StoreUrl};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn only_redis_shares_its_failover_with_the_resource() {
    let cases = [
        ("memory:", false),
        ("postgres://postgres@127.0.0.1:5432/test", false),
        ("redis://127.0.0.1:6379", true),
        ("rediss://127.0.0.1:6379/0", true),
        ("etcd://127.0.0.1:2379", false),
        ("k8s://default", false),
        ("sqlite:///tmp/x.db", false),
    ];
    for (url, shares) in cases {
        let parsed = StoreUrl::parse(url).expect("parses");
        assert_eq!(parsed.resource_shares_failover(), shares, "{url}");
    }
}

#[test]
fn refuse_fails_before_connecting() {
    rt().block_on(async {
        // Nothing listens on port 1: a refusal that tried to connect would be Unavailable.
        match leasehold::connect_with_resource_policy("redis://127.0.0.1:1", SharedFailover::Refuse)
            .await
        {
            Err(Error::Config { message, .. }) => {
                assert!(message.contains("lower token"), "{message}");
                assert!(message.contains("ADR 0021"), "{message}");
            }
            other => panic!("expected Error::Config, got {other:?}"),
        }
        // Other backends are unaffected by the policy.
        let (store, _) = leasehold::connect_with_resource_policy("memory:", SharedFailover::Refuse)
            .await
            .expect("memory");
        assert_eq!(store.backend(), "memory");
    });
}

/// A `tracing` writer that collects everything into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

/// Runs `f` on a current-thread runtime with a subscriber that captures warnings.
fn capture_warnings<F: std::future::Future>(f: F) -> (F::Output, String) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, || rt().block_on(f));
    (out, captured.text())
}

#[cfg(feature = "redis")]
fn redis_url() -> String {
    leasehold_testkit::stores::REDIS_URL.get()
}

#[cfg(feature = "redis")]
#[test]
fn redis_pair_warns_by_default_and_accept_is_silent() {
    let url = redis_url();
    let (pair, warned) = capture_warnings(leasehold::connect_with_resource(&url));
    if let Err(e) = pair {
        // The project's skip rule: fail under CI or LEASE_TEST_REQUIRE, else warn and pass.
        let required = ["CI", "LEASE_TEST_REQUIRE"]
            .iter()
            .any(|v| std::env::var(v).is_ok_and(|x| x == "1" || x == "true"));
        assert!(!required, "Redis at {url} is required but unavailable: {e}");
        eprintln!("WARNING: Redis at {url} unavailable, skipping: {e}");
        return;
    }
    assert!(
        warned.contains("lower token after a higher one"),
        "no warning: {warned:?}"
    );
    let (resource, warned) = capture_warnings(leasehold::connect_resource(&url));
    resource.expect("connect to Redis");
    assert!(warned.contains("lower token"), "no warning: {warned:?}");
    let (pair, warned) = capture_warnings(leasehold::connect_with_resource_policy(
        &url,
        SharedFailover::Accept,
    ));
    pair.expect("connect to Redis");
    assert!(warned.is_empty(), "Accept must not warn: {warned:?}");
}

#[test]
fn other_backends_do_not_warn() {
    let (pair, warned) = capture_warnings(leasehold::connect_with_resource("memory:"));
    pair.expect("memory");
    assert!(warned.is_empty(), "{warned:?}");
}
