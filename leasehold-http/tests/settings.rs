//! The layer's one duration knob, `check_timeout`, at its extremes: every value is accepted and
//! each check ends in an answer (accepted, or a retryable `503`), never a panic or a hang.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, LeaseKey, LeaseStore, MemoryFencedResource,
    MemoryLeaseStore, OwnerId,
};
use leasehold_http::{FenceLayer, Problem};
use proptest::prelude::*;

fn durations() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(Duration::from_nanos(1)),
        Just(Duration::from_secs(u64::from(u32::MAX))),
        Just(Duration::from_secs(u64::MAX)),
        (0..=u64::MAX, 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

async fn one_check(timeout: Duration) -> Result<(), TestCaseError> {
    let fail = |e: &dyn std::fmt::Display| TestCaseError::fail(e.to_string());
    let store = Arc::new(MemoryLeaseStore::new());
    let key = LeaseKey::new("acct").map_err(|e| fail(&e))?;
    let owner = OwnerId::new("w").map_err(|e| fail(&e))?;
    let req = AcquireRequest::new(key, owner, Duration::from_secs(30));
    let AcquireOutcome::Acquired(lease) = store.acquire(&req).await.map_err(|e| fail(&e))? else {
        return Err(TestCaseError::fail("not acquired"));
    };
    let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
    let layer = FenceLayer::new(resource, store).check_timeout(timeout);
    let parts = http::Request::post("/")
        .header("Fencing-Token", lease.token().get())
        .header("Fencing-Key", "acct")
        .body(())
        .map_err(|e| fail(&e))?
        .into_parts()
        .0;
    let answer = tokio::time::timeout(Duration::from_secs(10), layer.check(&parts))
        .await
        .map_err(|_| TestCaseError::fail("the check hung"))?;
    match answer {
        Ok(Some(t)) => prop_assert_eq!(t.token(), lease.token()),
        Err(Problem::Unavailable {
            retryable: true, ..
        }) => {}
        other => prop_assert!(false, "timeout {timeout:?}: {other:?}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_check_timeout_answers(timeout in durations()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(one_check(timeout))?;
    }
}
