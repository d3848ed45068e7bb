use super::*;
use crate::MemoryLeaseStore;
use crate::lease::{AcquireOutcome, AcquireRequest};

const TTL: Duration = Duration::from_secs(3);

async fn leads_within(c: &Candidate, within: Duration) -> bool {
    let mut role = c.subscribe();
    tokio::time::timeout(within, role.wait_for(|r| matches!(r, Role::Leader { .. })))
        .await
        .is_ok_and(|r| r.is_ok())
}

/// Holds `key` for an unrelated user for a long time.
async fn user_holds(store: &MemoryLeaseStore, key: &str) {
    let req = AcquireRequest::new(
        LeaseKey::new(key).unwrap(),
        OwnerId::new("someone-else").unwrap(),
        TTL * 100,
    );
    assert!(matches!(
        store.acquire(&req).await.unwrap(),
        AcquireOutcome::Acquired(_)
    ));
}

/// A user's lease on `jobs.handover` is not a handover reservation of election `jobs`.
#[tokio::test(start_paused = true)]
async fn a_user_lease_beside_the_key_does_not_block_the_election() {
    let store = MemoryLeaseStore::new();
    user_holds(&store, "jobs.handover").await;
    let e = Election::new(
        store.clone(),
        LeaseKey::new("jobs").unwrap(),
        SupervisorConfig::new(TTL),
    );
    let a = e.join(OwnerId::new("a").unwrap());
    assert!(leads_within(&a, TTL).await, "{:?}", a.role());
}

/// A user's lease on `jobs.c.0` is not a preferred candidate's presence: the leader does not
/// yield to it.
#[tokio::test(start_paused = true)]
async fn a_user_lease_beside_the_key_is_not_a_preferred_candidate() {
    let store = MemoryLeaseStore::new();
    user_holds(&store, "jobs.c.0").await;
    let e = Election::new(
        store.clone(),
        LeaseKey::new("jobs").unwrap(),
        SupervisorConfig::new(TTL),
    )
    .with_preferred(vec![OwnerId::new("p").unwrap()]);
    let a = e.join(OwnerId::new("a").unwrap());
    assert!(leads_within(&a, TTL).await);
    tokio::time::sleep(TTL * 3).await;
    assert!(a.is_leader(), "yielded to a user's lease: {:?}", a.role());
}

/// The election's own keys lie in the reserved namespace, which no user key can name.
#[tokio::test(start_paused = true)]
async fn the_reservation_is_a_reserved_key() {
    let store = MemoryLeaseStore::new();
    let jobs = LeaseKey::new("jobs").unwrap();
    let e = Election::new(store.clone(), jobs.clone(), SupervisorConfig::new(TTL));
    let a = e.join(OwnerId::new("a").unwrap());
    assert!(leads_within(&a, TTL).await);
    let ghost = OwnerId::new("ghost").unwrap();
    assert!(a.handover(&ghost, TTL).await);
    let reservation = jobs.reserved("handover").unwrap();
    let held = store.inspect(&reservation).await.unwrap().holder.unwrap();
    assert_eq!(held.owner, ghost);
    assert!(LeaseKey::new(reservation.as_str()).is_err());
}
