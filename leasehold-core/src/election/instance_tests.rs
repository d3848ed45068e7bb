use super::*;
use crate::MemoryLeaseStore;

const TTL: Duration = Duration::from_secs(3);

fn election(store: &MemoryLeaseStore) -> Election {
    Election::new(
        store.clone(),
        LeaseKey::new("instances").unwrap(),
        SupervisorConfig::new(TTL).with_acquire_wait(TTL),
    )
}

/// Two processes joined with one stable id are two owners to the store: the second never
/// believes it leads while the first does, and users still see the id they chose.
#[tokio::test(start_paused = true)]
async fn two_candidates_with_one_id_never_both_lead() {
    let store = MemoryLeaseStore::new();
    let e = election(&store);
    let id = OwnerId::new("node-1").unwrap();
    let a = e.join(id.clone());
    let mut role_a = a.subscribe();
    role_a
        .wait_for(|r| matches!(r, Role::Leader { .. }))
        .await
        .unwrap();
    let mut observer = e.observe();
    let b = e.join(id.clone());
    let mut role_b = b.subscribe();
    // Sample both beliefs over several TTLs of campaigning and renewals.
    let until = tokio::time::Instant::now() + TTL * 4;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => break,
            _ = role_a.changed() => {}
            _ = role_b.changed() => {}
        }
        assert!(
            !(a.is_leader() && b.is_leader()),
            "two instances of one id both lead: {:?} {:?}",
            a.role(),
            b.role()
        );
    }
    assert!(
        a.is_leader() && !b.is_leader(),
        "{:?} {:?}",
        a.role(),
        b.role()
    );
    assert_eq!(a.id(), &id);
    assert_eq!(b.id(), &id);
    let seen = observer.current();
    let seen = if seen.leader.is_some() {
        seen
    } else {
        observer.changed().await.unwrap()
    };
    assert_eq!(seen.leader, Some(id.clone()));
    // The store sees two owners: the holder is an instance of the id, not the id itself.
    let holder = store.inspect(e.key()).await.unwrap().holder.unwrap();
    assert_ne!(holder.owner, id);
    assert_eq!(holder.owner.identity(), id.as_str());
    // Once the leader leaves, the other instance takes over.
    a.resign().await;
    role_b
        .wait_for(|r| matches!(r, Role::Leader { .. }))
        .await
        .unwrap();
}

/// A handover names an identity: of its two live instances exactly one takes the lead, and
/// no other candidate does.
#[tokio::test(start_paused = true)]
async fn a_handover_to_an_id_with_two_instances_elects_one_of_them() {
    let store = MemoryLeaseStore::new();
    let e = election(&store);
    let a = e.join(OwnerId::new("a").unwrap());
    a.subscribe()
        .wait_for(|r| matches!(r, Role::Leader { .. }))
        .await
        .unwrap();
    let c = OwnerId::new("c").unwrap();
    let (c1, c2) = (e.join(c.clone()), e.join(c.clone()));
    let b = e.join(OwnerId::new("b").unwrap());
    tokio::time::sleep(TTL).await;
    assert!(a.handover(&c, TTL).await);
    let mut r1 = c1.subscribe();
    let mut r2 = c2.subscribe();
    tokio::time::timeout(TTL, async {
        tokio::select! {
            r = r1.wait_for(|r| matches!(r, Role::Leader { .. })) => { r.unwrap(); }
            r = r2.wait_for(|r| matches!(r, Role::Leader { .. })) => { r.unwrap(); }
        }
    })
    .await
    .expect("an instance of c leads");
    tokio::time::sleep(TTL * 3).await;
    assert!(
        c1.is_leader() != c2.is_leader(),
        "{:?} {:?}",
        c1.role(),
        c2.role()
    );
    assert!(!a.is_leader() && !b.is_leader());
    assert_eq!(e.observe().changed().await.unwrap().leader, Some(c));
}

#[tokio::test]
async fn an_id_without_room_for_the_instance_is_refused() {
    let e = election(&MemoryLeaseStore::new());
    let long = OwnerId::new("x".repeat(112)).unwrap();
    assert!(matches!(
        e.try_join(long.clone()),
        Err(crate::Error::InvalidOwner { .. })
    ));
    let mut c = e.join(long);
    assert!(c.next_event().await.is_none());
    assert!(!c.is_leader());
    assert!(e.try_join(OwnerId::new("x".repeat(111)).unwrap()).is_ok());
}
