//! The failover race, for real: a primary grants a lease, replication is cut before the grant
//! reaches the replica, the replica is promoted and grants the same key to a second owner. Both
//! believe they hold it; the fenced resource keeps the data safe. And `WAIT` after a grant.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, LeaseStore, OwnerId, ReleaseOutcome,
    RenewOutcome, WriteOp, WriteOutcome,
};
use leasehold_redis::{RedisLeaseStore, RedisOptions};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, Failed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::cases::{acquire_on, is_unavailable, store_at};
use crate::server::RedisServer;

const TTL: Duration = Duration::from_millis(2500);

/// A primary and a replica that has completed its initial sync.
async fn pair() -> Result<(RedisServer, RedisServer), Failed> {
    // No 5 s diskless-sync delay before the replica's initial sync.
    let primary = RedisServer::start(&["--repl-diskless-sync-delay", "0"]).await?;
    let port = primary.port().to_string();
    let replica = RedisServer::start(&["--replicaof", "127.0.0.1", &port]).await?;
    replica
        .wait_replication("master_link_status", "up", Duration::from_secs(15))
        .await?;
    Ok((primary, replica))
}

/// `WAIT 1 5000` on the store's own connection: waits for the replica to acknowledge the writes
/// made through it (`WAIT` counts only the calling connection's writes).
async fn wait_one_replica(store: &RedisLeaseStore) -> Result<i64, Failed> {
    let mut con = store.connection();
    Ok(redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut con)
        .await
        .map_err(|e| e.to_string())?)
}

/// Reads exactly `expected` from `stream`, or fails after 5 s.
async fn expect_reply(stream: &mut TcpStream, expected: &[u8]) -> Result<(), Failed> {
    let mut buf = vec![0u8; expected.len()];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buf))
        .await
        .map_err(|_| "no reply within 5 s")?
        .map_err(|e| format!("read: {e}"))?;
    if buf == expected {
        Ok(())
    } else {
        Err(format!(
            "expected {:?}, got {:?}",
            String::from_utf8_lossy(expected),
            String::from_utf8_lossy(&buf)
        )
        .into())
    }
}

/// Freezes the replica (SIGSTOP) and drops its link on the primary's side, so nothing written to
/// the primary from now on reaches it. Returns an admin connection to the replica, opened before
/// the freeze, for [`promote_frozen`].
async fn cut_replication(
    primary: &RedisServer,
    replica: &RedisServer,
) -> Result<TcpStream, Failed> {
    let mut promote = TcpStream::connect(("127.0.0.1", replica.port()))
        .await
        .map_err(|e| e.to_string())?;
    promote
        .write_all(b"PING\r\n")
        .await
        .map_err(|e| e.to_string())?;
    expect_reply(&mut promote, b"+PONG\r\n").await?;
    replica.signal("STOP")?;
    let mut admin = primary.admin().await?;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut admin)
        .await
        .map_err(|e| e.to_string())?;
    if killed < 1 {
        return Err("no replica link to cut".into());
    }
    Ok(promote)
}

/// Promotes the frozen replica (`REPLICAOF NO ONE`) and resumes it. The command is already in its
/// socket when it resumes, so it runs before the replication cron could reconnect to the primary.
async fn promote_frozen(replica: &RedisServer, mut promote: TcpStream) -> CaseResult {
    promote
        .write_all(b"*3\r\n$9\r\nREPLICAOF\r\n$2\r\nNO\r\n$3\r\nONE\r\n")
        .await
        .map_err(|e| e.to_string())?;
    replica.signal("CONT")?;
    expect_reply(&mut promote, b"+OK\r\n").await?;
    replica
        .wait_replication("role", "master", Duration::from_secs(5))
        .await
}

/// Split brain through a failover to a replica that missed the grant; fencing keeps it safe.
pub(crate) async fn failover_to_a_lagging_replica_is_fenced(ctx: Ctx) -> CaseResult {
    let (primary, replica) = pair().await?;
    let on_primary = store_at(&primary.url(), "failover").await?;
    let on_replica = store_at(&replica.url(), "failover").await?;
    let key = ctx.key("failover");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let res = ctx.resource();

    // An earlier generation that did reach the replica.
    let earlier = acquire_on(&on_primary, &key, &a, TTL).await?;
    assert_eq!(
        on_primary.release(&earlier).await?,
        ReleaseOutcome::Released
    );
    assert_eq!(
        wait_one_replica(&on_primary).await?,
        1,
        "the replica did not acknowledge"
    );
    assert_eq!(
        on_replica.inspect(&key).await?.last_token,
        Some(earlier.token())
    );

    // A replica is read-only: acquiring there is a retryable `Unavailable`, not a grant.
    match on_replica
        .acquire(&AcquireRequest::new(key.clone(), b.clone(), TTL))
        .await
    {
        Err(e) if is_unavailable(&e) => {}
        other => {
            return Err(format!(
                "acquire on a read-only replica: expected Unavailable, got {other:?}"
            )
            .into());
        }
    }

    let promote = cut_replication(&primary, &replica).await?;

    // A is granted the key on the primary; the grant never reaches the replica.
    let la = acquire_on(&on_primary, &key, &a, TTL).await?;
    assert!(
        res.write(&key, la.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );

    promote_frozen(&replica, promote).await?;

    // The promoted replica lost A's grant and A's counter increment.
    let seen = on_replica.inspect(&key).await?;
    assert!(seen.holder.is_none(), "the replica saw A's grant: {seen:?}");
    assert_eq!(
        seen.last_token,
        Some(earlier.token()),
        "the counter on the replica should lag"
    );
    assert!(seen.last_token < Some(la.token()));

    // B is granted the same key there: both believe they hold it.
    let lb = acquire_on(&on_replica, &key, &b, TTL).await?;
    assert!(
        la.is_valid() && lb.is_valid(),
        "both owners should believe they hold the lease"
    );
    assert!(
        matches!(on_primary.renew(&la).await?, RenewOutcome::Renewed(_)),
        "the old primary still serves A"
    );
    // The clock floor keeps B's token above A's although the counter went back.
    assert!(
        lb.token() > la.token(),
        "token went back on failover: {} !> {}",
        lb.token(),
        la.token()
    );

    // The fenced resource accepts the new owner and rejects the old one from then on.
    assert!(
        res.write(&key, lb.token(), WriteOp::Add(10))
            .await?
            .is_accepted()
    );
    let late = res.write(&key, la.token(), WriteOp::Add(100)).await?;
    assert_eq!(
        late,
        WriteOutcome::Rejected {
            presented: la.token(),
            high_water: lb.token()
        }
    );
    let late_put = res
        .write(&key, la.token(), WriteOp::Put(b"old".to_vec()))
        .await?;
    assert!(!late_put.is_accepted());
    let state = res.read(&key).await?;
    assert_eq!(
        (state.counter, state.value, state.high_water),
        (11, None, Some(lb.token()))
    );
    Ok(())
}

/// `WAIT 1` after each grant: with the replica connected the grant is on the replica when
/// acquire returns; with the replica frozen the acquire fails as `Unavailable` and the grant is
/// released (the counter keeps its generation).
pub(crate) async fn wait_for_replicas_fails_and_releases_without_acks(ctx: Ctx) -> CaseResult {
    let (primary, replica) = pair().await?;
    let store = RedisLeaseStore::connect_with(
        &primary.url(),
        RedisOptions::default()
            .with_prefix("wait")
            .with_response_timeout(Duration::from_secs(5))
            .with_wait_for_replicas(1, Duration::from_secs(2)),
    )
    .await?;
    let on_replica = store_at(&replica.url(), "wait").await?;
    let a = OwnerId::with_label("a");

    let k1 = ctx.key("wait-ok");
    let l1 = acquire_on(&store, &k1, &a, TTL).await?;
    let seen = on_replica
        .inspect(&k1)
        .await?
        .holder
        .ok_or("the acknowledged grant is not on the replica")?;
    assert_eq!((seen.owner, seen.token), (a.clone(), l1.token()));

    replica.signal("STOP")?;
    let k2 = ctx.key("wait-cut");
    match store
        .acquire(&AcquireRequest::new(k2.clone(), a.clone(), TTL))
        .await
    {
        Err(e) if is_unavailable(&e) && e.is_retryable() => {}
        other => {
            return Err(format!("expected Unavailable without replica acks, got {other:?}").into());
        }
    }
    let state = store.inspect(&k2).await?;
    assert!(
        state.holder.is_none(),
        "the unacknowledged grant was not released: {state:?}"
    );
    assert!(state.last_token.is_some(), "the generation must be kept");
    replica.signal("CONT")?;
    Ok(())
}

/// `acquire_many` with `WAIT 1` (one script and one `WAIT` for the batch on a single server):
/// with the replica connected every grant of the batch is on the replica when the call returns;
/// with the replica frozen each granted slot carries the single acquire's `Unavailable` and its
/// grant is released (the generation kept), while a key held by another owner stays `Held`.
pub(crate) async fn wait_for_replicas_in_acquire_many(ctx: Ctx) -> CaseResult {
    let (primary, replica) = pair().await?;
    let store = RedisLeaseStore::connect_with(
        &primary.url(),
        RedisOptions::default()
            .with_prefix("wait-many")
            .with_response_timeout(Duration::from_secs(5))
            .with_wait_for_replicas(1, Duration::from_secs(2)),
    )
    .await?;
    let on_replica = store_at(&replica.url(), "wait-many").await?;
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let held = ctx.key("many-held");
    let lb = acquire_on(&store, &held, &b, TTL).await?;
    let batch = |tag: &str| -> Vec<AcquireRequest> {
        (0..3)
            .map(|i| ctx.key(&format!("{tag}-{i}")))
            .chain([held.clone()])
            .map(|k| AcquireRequest::new(k, a.clone(), TTL))
            .collect()
    };

    let reqs = batch("many-ok");
    let out = store.acquire_many(&reqs).await?;
    assert_eq!(out.len(), reqs.len(), "one outcome per request");
    for (req, outcome) in reqs.iter().zip(&out).take(3) {
        let lease = match outcome {
            Ok(AcquireOutcome::Acquired(l)) => l,
            other => return Err(format!("{}: expected Acquired, got {other:?}", req.key).into()),
        };
        let seen = on_replica.inspect(&req.key).await?.holder.ok_or_else(|| {
            format!(
                "the acknowledged grant of {} is not on the replica",
                req.key
            )
        })?;
        assert_eq!((seen.owner, seen.token), (a.clone(), lease.token()));
    }
    assert!(
        matches!(&out[3], Ok(AcquireOutcome::Held(h)) if h.owner == b && h.token == lb.token()),
        "the key held by b: {:?}",
        out[3]
    );

    replica.signal("STOP")?;
    let reqs = batch("many-cut");
    let out = store.acquire_many(&reqs).await?;
    assert_eq!(out.len(), reqs.len(), "one outcome per request");
    for (req, outcome) in reqs.iter().zip(&out).take(3) {
        match outcome {
            Err(e) if is_unavailable(e) && e.is_retryable() => {
                assert!(
                    e.to_string()
                        .contains("only 0 of 1 replicas acknowledged the grant"),
                    "{}: not the single acquire's error: {e}",
                    req.key
                );
            }
            other => {
                return Err(format!(
                    "{}: expected Unavailable without replica acks, got {other:?}",
                    req.key
                )
                .into());
            }
        }
        let state = store.inspect(&req.key).await?;
        assert!(
            state.holder.is_none(),
            "the unacknowledged grant was not released: {state:?}"
        );
        assert!(state.last_token.is_some(), "the generation must be kept");
    }
    assert!(
        matches!(&out[3], Ok(AcquireOutcome::Held(h)) if h.owner == b && h.token == lb.token()),
        "the key held by b, with the replica frozen: {:?}",
        out[3]
    );
    replica.signal("CONT")?;
    Ok(())
}

/// `acquire_many` with `WAIT` over more keys than one script carries (three scripts of at most
/// 1,000 keys on one connection), the replica frozen: every slot carries the single acquire's
/// `Unavailable` and no grant is left held. `WAIT` blocks the connection, so one `WAIT` per
/// script would make the third script's reply wait for the first two `WAIT`s (6 s, past the
/// 5 s response timeout): its key came back as a timeout and stayed held.
pub(crate) async fn wait_for_replicas_in_acquire_many_over_several_scripts(ctx: Ctx) -> CaseResult {
    let (primary, replica) = pair().await?;
    let store = RedisLeaseStore::connect_with(
        &primary.url(),
        RedisOptions::default()
            .with_prefix("wait-scripts")
            .with_response_timeout(Duration::from_secs(5))
            .with_wait_for_replicas(1, Duration::from_secs(2)),
    )
    .await?;
    let a = OwnerId::with_label("a");
    let reqs: Vec<AcquireRequest> = (0..2001)
        .map(|i| AcquireRequest::new(ctx.key(&format!("scripts-{i}")), a.clone(), TTL))
        .collect();
    replica.signal("STOP")?;
    let out = store.acquire_many(&reqs).await?;
    assert_eq!(out.len(), reqs.len(), "one outcome per request");
    for (req, outcome) in reqs.iter().zip(&out) {
        match outcome {
            Err(e)
                if is_unavailable(e)
                    && e.to_string()
                        .contains("only 0 of 1 replicas acknowledged the grant") => {}
            other => {
                return Err(format!(
                    "{}: expected Unavailable without replica acks, got {other:?}",
                    req.key
                )
                .into());
            }
        }
    }
    let keys: Vec<_> = reqs.iter().map(|r| r.key.clone()).collect();
    let states = store.inspect_many(&keys).await?;
    let held: Vec<_> = states.iter().filter(|s| s.holder.is_some()).collect();
    assert!(held.is_empty(), "unacknowledged grants left held: {held:?}");
    assert!(
        states.iter().all(|s| s.last_token.is_some()),
        "the generations must be kept"
    );
    replica.signal("CONT")?;
    Ok(())
}

/// The documented miss of a fenced resource kept in the *same* Redis as the lease store: it fails
/// over with the store, so a write that never reached the replica is lost, and with it the
/// high-water mark. A (token T1) writes and the write replicates; replication is cut; A's lease
/// expires, B is granted T2 > T1 and writes T2, which the primary's resource accepts (and A's late
/// T1 is rejected there). The replica that missed T2 is promoted, and A's late T1 write is then
/// **accepted** by the resource in the promoted Redis: a lower token after a higher one. The same
/// writes to a resource outside the failing-over Redis (the shared server) are fenced correctly.
pub(crate) async fn split_brain_lets_the_same_redis_accept_a_lower_token(ctx: Ctx) -> CaseResult {
    let (primary, replica) = pair().await?;
    let on_primary = store_at(&primary.url(), "split").await?;
    let on_replica = store_at(&replica.url(), "split").await?;
    let elsewhere = ctx.resource();
    let key = ctx.key("split");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));

    // A holds T1; its first write reaches the primary, the replica and the outside resource.
    let ttl = Duration::from_millis(300);
    let la = acquire_on(&on_primary, &key, &a, ttl).await?;
    for res in [
        &on_primary.fenced_resource() as &dyn FencedResource,
        elsewhere.as_ref(),
    ] {
        assert!(
            res.write(&key, la.token(), WriteOp::Add(1))
                .await?
                .is_accepted()
        );
    }
    assert_eq!(
        wait_one_replica(&on_primary).await?,
        1,
        "the replica did not acknowledge"
    );

    let promote = cut_replication(&primary, &replica).await?;

    // A pauses past its TTL; B is granted T2 on the primary and writes it there and outside.
    let deadline = Instant::now() + Duration::from_secs(10);
    let lb = loop {
        let req = AcquireRequest::new(key.clone(), b.clone(), TTL);
        match on_primary.acquire(&req).await? {
            AcquireOutcome::Acquired(l) => break l,
            AcquireOutcome::Held(h) if Instant::now() < deadline => {
                tokio::time::sleep(h.remaining + Duration::from_millis(1)).await;
            }
            AcquireOutcome::Held(h) => return Err(format!("A's lease never expired: {h:?}").into()),
        }
    };
    assert!(lb.token() > la.token());
    for res in [
        &on_primary.fenced_resource() as &dyn FencedResource,
        elsewhere.as_ref(),
    ] {
        assert!(
            res.write(&key, lb.token(), WriteOp::Add(10))
                .await?
                .is_accepted()
        );
    }
    // On the primary, before the failover, fencing works: A's late write is rejected.
    assert_eq!(
        on_primary
            .fenced_resource()
            .write(&key, la.token(), WriteOp::Add(100))
            .await?,
        WriteOutcome::Rejected {
            presented: la.token(),
            high_water: lb.token()
        }
    );

    promote_frozen(&replica, promote).await?;

    // The promoted replica never saw T2: its high-water mark is still T1.
    let seen = on_replica.fenced_resource().read(&key).await?;
    assert_eq!((seen.high_water, seen.counter), (Some(la.token()), 1));

    // The documented miss: A's late write with T1 < T2 is accepted after T2 was.
    let late = on_replica
        .fenced_resource()
        .write(&key, la.token(), WriteOp::Add(100))
        .await?;
    assert_eq!(
        late,
        WriteOutcome::Accepted {
            high_water: la.token()
        },
        "expected the documented miss: the resource in the promoted Redis accepts the lower token"
    );
    assert!(la.token() < lb.token());

    // A resource outside the failing-over Redis rejects it.
    assert_eq!(
        elsewhere.write(&key, la.token(), WriteOp::Add(100)).await?,
        WriteOutcome::Rejected {
            presented: la.token(),
            high_water: lb.token()
        }
    );
    let outside = elsewhere.read(&key).await?;
    assert_eq!(
        (outside.counter, outside.high_water),
        (11, Some(lb.token()))
    );
    Ok(())
}

/// This file's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("redis", failover_to_a_lagging_replica_is_fenced),
        case!(
            "redis",
            split_brain_lets_the_same_redis_accept_a_lower_token
        ),
        case!("redis", wait_for_replicas_fails_and_releases_without_acks),
        case!("redis", wait_for_replicas_in_acquire_many),
        case!(
            "redis",
            wait_for_replicas_in_acquire_many_over_several_scripts
        ),
    ]
}
