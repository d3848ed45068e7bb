//! A master of the Redis Cluster fails over under a holder (`CLUSTER FAILOVER` on its replica,
//! the coordinated manual failover: the replica first catches up with the master's replication
//! stream, then takes over its slots). Needs the cluster of `scripts/services/redis-cluster.sh`
//! (`LEASE_TEST_REDIS_CLUSTER_URL`); an unreachable cluster fails the test.
//!
//! The documented outcome: the lease, its token counter and the fenced resource's high-water mark
//! were replicated before the switch, so the holder keeps its lease across the failover: its
//! renewal (after the cluster client follows the slot to the new master) is granted, a contender
//! is refused, and the next owner's token is greater. A failover *without* catching up (a master
//! that dies with unreplicated writes) may lose the grant; that is outside the guarantee and is
//! made harmless only by fencing in a resource outside the cluster (see the crate docs).

mod cluster_common;

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, LeaseKey, LeaseStore, OwnerId, RenewOutcome,
    WriteOp, WriteOutcome,
};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
struct Node {
    id: String,
    addr: String,
    master: bool,
    master_id: String,
    healthy: bool,
    slots: Vec<(u16, u16)>,
}

async fn node_con(addr: &str) -> redis::RedisResult<MultiplexedConnection> {
    redis::Client::open(format!("redis://{addr}"))?
        .get_multiplexed_async_connection()
        .await
}

async fn nodes() -> Result<Vec<Node>, Box<dyn std::error::Error>> {
    let mut last = None;
    for url in cluster_common::node_urls() {
        let con = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await;
        let mut con = match con {
            Ok(c) => c,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut con)
            .await?;
        return Ok(text
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 8 {
                    return None;
                }
                let flags = f[2];
                let slots = f[8..]
                    .iter()
                    .filter(|s| !s.starts_with('['))
                    .filter_map(|s| {
                        let (a, b) = s.split_once('-').unwrap_or((s, s));
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                Some(Node {
                    id: f[0].to_string(),
                    addr: f[1].split('@').next().unwrap_or("").to_string(),
                    master: flags.contains("master"),
                    master_id: f[3].to_string(),
                    healthy: !flags.contains("fail") && f[7] == "connected",
                    slots,
                })
            })
            .collect());
    }
    Err(format!("no cluster node answered: {last:?}").into())
}

/// The master serving `slot` and a healthy replica of it.
async fn master_and_replica(slot: u16) -> Result<(Node, Node), Box<dyn std::error::Error>> {
    let mut all = nodes().await?;
    let m = all
        .iter()
        .position(|n| n.master && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
        .ok_or_else(|| format!("no master serves slot {slot}"))?;
    let master = all.remove(m);
    let replica = all
        .into_iter()
        .find(|n| !n.master && n.master_id == master.id && n.healthy)
        .ok_or_else(|| format!("master {} has no healthy replica", master.addr))?;
    Ok((master, replica))
}

async fn acquire(
    store: &dyn LeaseStore,
    key: &LeaseKey,
    owner: &OwnerId,
) -> leasehold_core::Result<AcquireOutcome> {
    store
        .acquire(&AcquireRequest::new(
            key.clone(),
            owner.clone(),
            Duration::from_secs(30),
        ))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_fails_over_under_a_holder_and_the_holder_keeps_its_lease() -> TestResult {
    let store = cluster_common::store().await.map_err(|e| {
        format!(
            "the Redis Cluster at {} is unreachable ({e}); start it with \
             `bash scripts/services/redis-cluster.sh start`",
            cluster_common::url()
        )
    })?;
    let resource = store.fenced_resource();
    let key = LeaseKey::new(format!("failover-{}", fastrand::u64(..)))?;
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));

    let AcquireOutcome::Acquired(la) = acquire(&store, &key, &a).await? else {
        return Err("a fresh key was held".into());
    };
    assert!(
        resource
            .write(&key, la.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );

    // Promote the replica of the master that serves the key's slot.
    let mut any = node_con(&cluster_common::node_urls()[0].replace("redis://", "")).await?;
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(store.layout().lease(&key))
        .query_async(&mut any)
        .await?;
    let (master, replica) = master_and_replica(slot).await?;
    eprintln!(
        "slot {slot}: failing over master {} to replica {}",
        master.addr, replica.addr
    );
    let mut rcon = node_con(&replica.addr).await?;
    let _: String = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query_async(&mut rcon)
        .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((now_master, _)) = master_and_replica(slot).await
            && now_master.id == replica.id
        {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("replica {} was not promoted within 30 s", replica.addr).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("replica {} now serves slot {slot}", replica.addr);

    // The holder renews through the new master (retrying while the client re-learns the slot).
    let deadline = Instant::now() + Duration::from_secs(20);
    let renewed = loop {
        match store.renew(&la).await {
            Ok(r) => break r,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                eprintln!("renew during failover: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let RenewOutcome::Renewed(la) = renewed else {
        return Err("the holder lost its lease in a coordinated failover".into());
    };
    eprintln!("holder renewed after the failover, token {}", la.token());
    match acquire(&store, &key, &b).await? {
        AcquireOutcome::Held(h) => {
            assert_eq!((h.owner, h.token), (a.clone(), la.token()));
        }
        AcquireOutcome::Acquired(l) => {
            return Err(format!("a contender was granted {} during A's lease", l.token()).into());
        }
    }
    // The fence's high-water mark survived too: the holder's token is still accepted.
    assert!(
        resource
            .write(&key, la.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert_eq!(
        store.release(&la).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    let AcquireOutcome::Acquired(lb) = acquire(&store, &key, &b).await? else {
        return Err("released key was held".into());
    };
    assert!(lb.token() > la.token());
    assert!(
        resource
            .write(&key, lb.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert_eq!(
        resource.write(&key, la.token(), WriteOp::Add(1)).await?,
        WriteOutcome::Rejected {
            presented: la.token(),
            high_water: lb.token()
        }
    );
    let _ = store.release(&lb).await?;
    cluster_common::delete_matching(&store.layout().scan_pattern(key.as_str())).await;
    Ok(())
}
