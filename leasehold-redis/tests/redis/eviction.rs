//! Eviction: a lease record has a TTL, so any `maxmemory-policy` but `noeviction` lets Redis delete
//! it while it is held. Each case starts its own `redis-server --maxmemory 2mb` on a free port.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, Error, FencedResource, LeaseStore, OwnerId, WriteOp};
use leasehold_redis::{RedisLeaseStore, RedisOptions};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, Failed};

use crate::cases::acquire_on;
use crate::server::RedisServer;

/// A server with 2 MB of memory that evicts the keys with the nearest expiry first.
async fn evicting_server() -> Result<RedisServer, Failed> {
    RedisServer::start(&["--maxmemory", "2mb", "--maxmemory-policy", "volatile-ttl"]).await
}

/// Fills the server with keys that expire in an hour (later than the lease) until `record` is
/// gone, 50 keys of 16 KiB per round trip; fails if it survives 64 MiB of them.
async fn fill_until_evicted(server: &RedisServer, record: &str) -> Result<usize, Failed> {
    let mut con = server.admin().await?;
    let value = vec![b'x'; 16 * 1024];
    for round in 0..80 {
        let mut pipe = redis::pipe();
        for i in 0..50 {
            pipe.cmd("SET")
                .arg(format!("filler:{round}:{i}"))
                .arg(&value)
                .arg("EX")
                .arg(3600)
                .ignore();
        }
        pipe.cmd("EXISTS").arg(record);
        let (exists,): (i64,) = pipe
            .query_async(&mut con)
            .await
            .map_err(|e| format!("filling: {e}"))?;
        if exists == 0 {
            return Ok((round + 1) * 50);
        }
    }
    Err(format!("{record} survived 4,000 keys of 16 KiB on a 2 MB server").into())
}

/// The store refuses a server whose `maxmemory-policy` may evict a held lease, with a
/// [`Error::Config`] that names the policy and the fix.
async fn an_evicting_server_is_refused_at_connect(_ctx: Ctx) -> CaseResult {
    let server = evicting_server().await?;
    match RedisLeaseStore::connect(&server.url()).await {
        Err(Error::Config {
            backend: "redis",
            message,
            ..
        }) => {
            for word in ["volatile-ttl", "noeviction", "allow_eviction"] {
                assert!(message.contains(word), "{word:?} missing from {message:?}");
            }
            Ok(())
        }
        other => Err(format!(
            "connect to a volatile-ttl server: expected Error::Config, got {other:?}"
        )
        .into()),
    }
}

/// With eviction explicitly allowed the store connects, and the hole is real: filling the
/// server's memory evicts the held lease's record, and a second owner is granted the key while
/// the first still holds it. The counter (no TTL, so not evicted under a `volatile-*` policy)
/// still gives the second owner a greater token, so a fenced resource outside this Redis rejects
/// the first owner's late write.
async fn with_eviction_allowed_a_held_lease_can_be_evicted_and_granted_again(
    ctx: Ctx,
) -> CaseResult {
    let server = evicting_server().await?;
    let store = RedisLeaseStore::connect_with(
        &server.url(),
        RedisOptions::default()
            .with_prefix("evict")
            .allow_eviction(true),
    )
    .await?;
    let key = ctx.key("evicted");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let held = acquire_on(&store, &key, &a, Duration::from_secs(600)).await?;
    let fence = leasehold_core::MemoryFencedResource::new();
    assert!(
        fence
            .write(&key, held.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );

    let keys = fill_until_evicted(&server, &store.layout().lease(&key)).await?;
    let stolen = match store
        .acquire(&leasehold_core::AcquireRequest::new(
            key.clone(),
            b.clone(),
            Duration::from_secs(600),
        ))
        .await?
    {
        AcquireOutcome::Acquired(l) => l,
        AcquireOutcome::Held(h) => {
            return Err(format!(
                "after {keys} filler keys the record was evicted, yet the key is held by {}",
                h.owner
            )
            .into());
        }
    };
    assert!(
        stolen.token() > held.token(),
        "{} !> {}",
        stolen.token(),
        held.token()
    );
    assert!(
        fence
            .write(&key, stolen.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    assert!(
        !fence
            .write(&key, held.token(), WriteOp::Add(1))
            .await?
            .is_accepted()
    );
    Ok(())
}

/// A server that does not let the client read its policy (`CONFIG` renamed away, as managed
/// services rename or deny it) is accepted: the store cannot tell, logs a warning and works. Here
/// the server does evict, which is exactly the risk the crate docs state for such services.
async fn a_server_that_hides_its_policy_is_accepted(ctx: Ctx) -> CaseResult {
    let server = RedisServer::start(&[
        "--maxmemory",
        "2mb",
        "--maxmemory-policy",
        "volatile-ttl",
        "--rename-command",
        "CONFIG",
        "",
    ])
    .await?;
    let store =
        RedisLeaseStore::connect_with(&server.url(), RedisOptions::default().with_prefix("hidden"))
            .await?;
    let key = ctx.key("hidden");
    acquire_on(
        &store,
        &key,
        &OwnerId::with_label("a"),
        Duration::from_secs(5),
    )
    .await?;
    Ok(())
}

/// This file's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("redis", an_evicting_server_is_refused_at_connect),
        case!(
            "redis",
            with_eviction_allowed_a_held_lease_can_be_evicted_and_granted_again
        ),
        case!("redis", a_server_that_hides_its_policy_is_accepted),
    ]
}
