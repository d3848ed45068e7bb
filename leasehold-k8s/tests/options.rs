//! Every duration knob of the store, at its extremes, gives a typed error or a store that works;
//! none panics. The store talks to a closed loopback port, so each operation ends quickly in a
//! typed error and the property runs without an apiserver.

use std::time::Duration;

use leasehold_core::{AcquireRequest, Error, FencedResource, LeaseKey, LeaseStore, OwnerId};
use leasehold_k8s::{K8sLeaseStore, K8sOptions};
use proptest::prelude::*;

fn durations() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(Duration::from_nanos(1)),
        Just(Duration::from_secs(u64::from(u32::MAX))),
        Just(Duration::from_secs(u64::MAX)),
        (0..=u64::MAX, 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
        (0..5_000u64).prop_map(Duration::from_millis),
    ]
}

/// A client of a port nobody listens on (a listener bound and dropped).
fn closed_client() -> Result<kube::Client, Box<dyn std::error::Error>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse()?);
    Ok(kube::Client::try_from(config)?)
}

fn typed(e: &Error) -> bool {
    matches!(
        e,
        Error::Unavailable { .. }
            | Error::Timeout { .. }
            | Error::InvalidTtl { .. }
            | Error::InvalidInput(_)
            | Error::Config { .. }
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn request_timeout_and_ttl_never_panic(timeout in durations(), ttl in durations()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            let client = closed_client().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let options = K8sOptions::default().with_namespace("default").with_request_timeout(timeout);
            let store = match K8sLeaseStore::from_client(client, options) {
                Ok(store) => store,
                Err(e) => {
                    prop_assert!(timeout.is_zero(), "refused timeout {timeout:?}: {e}");
                    prop_assert!(matches!(e, Error::Config { .. }), "{e:?}");
                    return Ok(());
                }
            };
            prop_assert!(!timeout.is_zero(), "a zero request timeout was accepted");
            let key = LeaseKey::new("prop").map_err(|e| TestCaseError::fail(e.to_string()))?;
            let owner = OwnerId::new("p").map_err(|e| TestCaseError::fail(e.to_string()))?;
            // Bounded by the test, not by the store's timeout (which may be Duration::MAX).
            let bound = Duration::from_secs(30);
            let acquire = tokio::time::timeout(bound, store.acquire(&AcquireRequest::new(key.clone(), owner, ttl)))
                .await
                .map_err(|_| TestCaseError::fail("acquire hung"))?;
            prop_assert!(acquire.as_ref().is_err_and(typed), "{acquire:?}");
            let inspect = tokio::time::timeout(bound, store.inspect(&key))
                .await
                .map_err(|_| TestCaseError::fail("inspect hung"))?;
            prop_assert!(inspect.as_ref().is_err_and(typed), "{inspect:?}");
            let read = tokio::time::timeout(bound, store.fenced_resource().read(&key))
                .await
                .map_err(|_| TestCaseError::fail("read hung"))?;
            prop_assert!(read.as_ref().is_err_and(typed), "{read:?}");
            Ok(())
        })?;
    }
}
