//! `renew_many`: few requests for any batch (counted by etcd itself), and slot by slot exactly the
//! outcome a single renew would give.

use std::time::Duration;

use etcd_client::{PutOptions, Txn, TxnOp};
use futures::{StreamExt, TryStreamExt};
use leasehold_core::{AcquireOutcome, Lease, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome};
use leasehold_etcd::{EtcdLeaseStore, EtcdOptions, LeaseSharing};
use leasehold_testkit::{CaseResult, Ctx, Failed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::cluster::{Cluster, Timing};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;

/// This file's cases for `sharing`.
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    match sharing {
        LeaseSharing::PerTtl => vec![
            case!("etcd", renew_many_reads_keys_back_in_few_range_requests),
            case!("etcd", inspect_many_reads_holders_in_few_requests),
            case!("etcd", renew_many_reports_exactly_the_leases_that_were_lost),
        ],
        _ => vec![case!(
            "etcd",
            renew_many_reports_exactly_the_leases_that_were_lost
        )],
    }
}

/// Request messages etcd received (`grpc_server_msg_received_total` on `/metrics`): all of them,
/// and those of the range method.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Requests {
    pub(crate) all: u64,
    pub(crate) ranges: u64,
}

impl std::ops::Sub for Requests {
    type Output = Requests;
    fn sub(self, earlier: Requests) -> Requests {
        Requests {
            all: self.all - earlier.all,
            ranges: self.ranges - earlier.ranges,
        }
    }
}

pub(crate) async fn requests(endpoint: &str) -> Result<Requests, Failed> {
    let addr = endpoint.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    conn.read_to_string(&mut body).await?;
    let mut counted = Requests { all: 0, ranges: 0 };
    for line in body
        .lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
    {
        let value = line.rsplit(' ').next().unwrap_or("");
        let n = value.parse::<u64>().map_err(|e| format!("{line}: {e}"))?;
        counted.all += n;
        if line.contains("grpc_method=\"Range\"") {
            counted.ranges += n;
        }
    }
    Ok(counted)
}

/// Acquires `n` free keys `<name><i>` for one owner, 16 at a time.
async fn acquire_many(
    ctx: &Ctx,
    store: &EtcdLeaseStore,
    name: &str,
    n: usize,
    ttl: Duration,
) -> Result<Vec<Lease>, Failed> {
    let owner = OwnerId::with_label("batch");
    let reqs: Vec<_> = (0..n)
        .map(|i| ctx.request(&ctx.key(&format!("{name}{i:04}")), &owner, ttl))
        .collect();
    let outcomes: Vec<AcquireOutcome> = futures::stream::iter(reqs)
        .map(|r| {
            let store = store.clone();
            async move { store.acquire(&r).await }
        })
        .buffered(16)
        .try_collect()
        .await?;
    outcomes
        .into_iter()
        .map(|o| match o {
            AcquireOutcome::Acquired(l) => Ok(l),
            AcquireOutcome::Held(h) => Err(format!("held by {}", h.owner).into()),
        })
        .collect()
}

/// Renews `leases` in one batch, failing unless every one is renewed with its token.
async fn renew_all(store: &EtcdLeaseStore, leases: &[Lease]) -> Result<Vec<Lease>, Failed> {
    let out = store.renew_many(leases).await?;
    assert_eq!(out.len(), leases.len(), "one outcome per lease");
    out.into_iter()
        .zip(leases)
        .map(|(r, l)| match r? {
            RenewOutcome::Renewed(next) if next.token() == l.token() && next.key() == l.key() => {
                Ok(next)
            }
            other => Err(format!("{}: {other:?}", l.key()).into()),
        })
        .collect()
}

/// On our own member, counted by etcd: 2,000 keys acquired concurrently with one TTL share one
/// etcd lease; an empty batch sends nothing; the 2,000 keys renew in at most 10 requests (one keepalive, one range); with 6,000 foreign keys in
/// the middle of the batch's span, the read takes two pages and skips the rest of the foreign
/// keys; with one etcd lease per grant, 100 keys cost 100 keepalives but still one range.
pub(crate) async fn renew_many_reads_keys_back_in_few_range_requests(ctx: Ctx) -> CaseResult {
    let cluster = Cluster::start(1, Timing::FAST).await?;
    let endpoint = cluster.endpoints()[0].clone();
    let options = EtcdOptions::default().with_lease_sharing(LeaseSharing::PerTtl);
    let store = EtcdLeaseStore::connect_with(&cluster.url(), options).await?;
    let ttl = Duration::from_secs(30);
    let leases = acquire_many(&ctx, &store, "k", 2_000, ttl).await?;
    let etcd_leases: std::collections::HashSet<_> = leases
        .iter()
        .map(|l| l.handle().and_then(|h| h.split('/').next()))
        .collect();
    assert_eq!(
        etcd_leases.len(),
        1,
        "2,000 keys acquired 16 at a time: {etcd_leases:?}"
    );

    let before = requests(&endpoint).await?;
    assert!(store.renew_many(&[]).await?.is_empty());
    let empty = requests(&endpoint).await? - before;
    assert_eq!(empty.all, 0, "an empty batch sent {empty:?}");

    let before = requests(&endpoint).await?;
    let leases = renew_all(&store, &leases).await?;
    let sent = requests(&endpoint).await? - before;
    println!("renew_many of 2,000 leases on one shared etcd lease: {sent:?}");
    assert!(sent.all <= 10, "2,000 renewals sent {sent:?}");
    assert!(sent.ranges <= 1, "2,000 renewals sent {sent:?}");

    // 6,000 keys of somebody else sort between our k0998 and k0999.
    let mut client = store.client();
    let foreign = store.options().lock_name(&ctx.key("k0999-x"));
    for chunk in (0..6_000).collect::<Vec<u32>>().chunks(100) {
        let puts: Vec<TxnOp> = chunk
            .iter()
            .map(|i| TxnOp::put(format!("{foreign}/{i:05}"), "", None))
            .collect();
        client.txn(Txn::new().and_then(puts)).await?;
    }
    let before = requests(&endpoint).await?;
    let leases = renew_all(&store, &leases).await?;
    let sent = requests(&endpoint).await? - before;
    println!("renew_many of 2,000 leases with 6,000 foreign keys in their span: {sent:?}");
    assert!(sent.all <= 10, "2,000 renewals sent {sent:?}");
    assert_eq!(sent.ranges, 2, "2,000 renewals sent {sent:?}");
    for l in [&leases[0], &leases[999], &leases[1_000], &leases[1_999]] {
        assert_eq!(
            store.inspect(l.key()).await?.holder.map(|h| h.token),
            Some(l.token())
        );
    }

    let per_grant = EtcdLeaseStore::connect(&cluster.url()).await?;
    let own = acquire_many(&ctx, &per_grant, "g", 100, ttl).await?;
    let before = requests(&endpoint).await?;
    renew_all(&per_grant, &own).await?;
    let sent = requests(&endpoint).await? - before;
    println!("renew_many of 100 leases with one etcd lease each: {sent:?}");
    assert!(sent.ranges <= 1, "100 renewals sent {sent:?}");
    assert!(sent.all <= 100 + 3, "100 renewals sent {sent:?}");
    Ok(())
}

/// One batch with every way of losing a lease (key deleted, taken over, released, replaced by a
/// new incarnation, overwritten by another owner, moved to another etcd lease, etcd lease
/// revoked, resumed with a stale token), an invalid TTL, a duplicate, a resumed lease and two
/// TTLs: exactly the lost ones are `Lost`, the rest `Renewed` with their tokens, and nothing the
/// refused slots name is changed.
pub(crate) async fn renew_many_reports_exactly_the_leases_that_were_lost(ctx: Ctx) -> CaseResult {
    let store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let other = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let mut client = store.client();
    let (long, medium) = (ctx.long_ttl(), Duration::from_secs(20));
    let a = acquire_many(&ctx, &store, "a", 12, long).await?;
    let b = acquire_many(&ctx, &store, "b", 4, medium).await?;
    let owner = a[0].owner().clone();
    let etcd_lease = |l: &Lease| -> Result<i64, Failed> {
        let id = l
            .handle()
            .and_then(|h| h.split('/').next())
            .ok_or("no handle")?;
        Ok(i64::from_str_radix(id, 16)?)
    };
    let lock_key = |l: &Lease, client: &mut etcd_client::Client| {
        let prefix = format!("{}/", store.options().lock_name(l.key()));
        let mut client = client.clone();
        async move {
            let opts = etcd_client::GetOptions::new().with_prefix();
            let kv = client.get(prefix, Some(opts)).await?.take_kvs().pop();
            kv.ok_or_else(|| Failed::from("no lock key"))
        }
    };

    // a1: deleted.
    let kv = lock_key(&a[1], &mut client).await?;
    client.delete(kv.key(), None).await?;
    // a2: deleted and acquired by somebody else.
    let kv = lock_key(&a[2], &mut client).await?;
    client.delete(kv.key(), None).await?;
    let c = OwnerId::with_label("c");
    let taken = ctx.must_acquire_with(&other, a[2].key(), &c, long).await?;
    // a3: released.
    assert_eq!(store.release(&a[3]).await?, ReleaseOutcome::Released);
    // a4: a new incarnation of the same key, same etcd lease, same value.
    let kv = lock_key(&a[4], &mut client).await?;
    client.delete(kv.key(), None).await?;
    let on_lease = PutOptions::new().with_lease(kv.lease());
    client
        .put(kv.key(), kv.value(), Some(on_lease.clone()))
        .await?;
    // a5: the same incarnation, overwritten with another owner.
    let kv = lock_key(&a[5], &mut client).await?;
    client
        .put(kv.key(), "lease-rs/1 mallory", Some(on_lease))
        .await?;
    // a6: the same incarnation and value, detached from its etcd lease.
    let kv = lock_key(&a[6], &mut client).await?;
    client.put(kv.key(), kv.value(), None).await?;
    // b0: its etcd lease revoked (with shared etcd leases, that of every b).
    let revoked = etcd_lease(&b[0])?;
    client.lease_revoke(revoked).await?;

    let stale = Lease::resume(
        a[7].key().clone(),
        owner.clone(),
        a[7].token().next()?,
        long,
    );
    let resumed = Lease::resume(a[8].key().clone(), owner.clone(), a[8].token(), long);
    let invalid = Lease::resume(a[9].key().clone(), owner, a[9].token(), Duration::ZERO);
    let mut batch = vec![
        a[0].clone(),
        b[0].clone(),
        a[1].clone(),
        stale,
        a[2].clone(),
        b[1].clone(),
        a[3].clone(),
        resumed.clone(),
        a[4].clone(),
        invalid,
        a[5].clone(),
        b[2].clone(),
        a[6].clone(),
        a[10].clone(),
        a[7].clone(),
        a[10].clone(),
        a[11].clone(),
        b[3].clone(),
        a[8].clone(),
    ];
    let gone: Vec<_> = [&a[1], &a[2], &a[3], &a[4], &a[5], &a[6]]
        .iter()
        .map(|l| l.key().clone())
        .collect();
    let out = store.renew_many(&batch).await?;
    assert_eq!(out.len(), batch.len(), "one outcome per lease");
    let mut renewed_resumed = None;
    for (slot, (lease, outcome)) in batch.iter().zip(&out).enumerate() {
        let expect_lost = gone.contains(lease.key())
            || (lease.handle().is_some() && etcd_lease(lease)? == revoked)
            || (lease.handle().is_none() && lease.key() == a[7].key());
        match outcome {
            Err(leasehold_core::Error::InvalidTtl { .. }) if lease.ttl().is_zero() => {}
            Ok(RenewOutcome::Lost) if expect_lost => {}
            Ok(RenewOutcome::Renewed(next))
                if !expect_lost && next.token() == lease.token() && next.key() == lease.key() =>
            {
                if lease.handle().is_none() {
                    renewed_resumed = Some(next.clone());
                }
            }
            other => {
                return Err(format!(
                    "slot {slot} ({}, lost expected: {expect_lost}): {other:?}",
                    lease.key()
                )
                .into());
            }
        }
    }
    // The resumed lease, once renewed, renews again through the handle it got.
    let renewed_resumed = renewed_resumed.ok_or("the resumed lease was not renewed")?;
    assert!(renewed_resumed.handle().is_some(), "{renewed_resumed:?}");
    assert!(
        matches!(store.renew(&renewed_resumed).await?, RenewOutcome::Renewed(ref l) if l.token() == a[8].token()),
        "a renewed resumed lease did not renew again"
    );
    // Refused slots changed nothing: the taker still holds a2, a stale renew freed nothing.
    let holder = store.inspect(a[2].key()).await?.holder.ok_or("a2 freed")?;
    assert_eq!((holder.owner, holder.token), (c, taken.token()));
    assert_eq!(
        store.inspect(a[7].key()).await?.holder.map(|h| h.token),
        Some(a[7].token())
    );
    // The same batch again: the lost stay lost, the renewed stay renewed.
    batch.retain(|l| !l.ttl().is_zero());
    let again = store.renew_many(&batch).await?;
    let renewed = again
        .iter()
        .filter(|r| matches!(r, Ok(RenewOutcome::Renewed(_))))
        .count();
    let first = out
        .iter()
        .filter(|r| matches!(r, Ok(RenewOutcome::Renewed(_))))
        .count();
    assert_eq!(renewed, first, "{again:?}");
    for l in a.iter().chain(&b) {
        let _ = store.release(l).await;
    }
    let _ = other.release(&taken).await;
    Ok(())
}

/// On our own member, counted by etcd: `inspect_many` of 2,000 keys held on one shared etcd lease,
/// one key whose lock has 6,000 contenders (its holder, the oldest, sorts last, so it is found
/// on the second page) and 10 free keys costs two range requests and one TTL request, and
/// reports what `inspect` reports; with one etcd lease per grant, 100 held keys cost one range
/// and one TTL request per key.
pub(crate) async fn inspect_many_reads_holders_in_few_requests(ctx: Ctx) -> CaseResult {
    let cluster = Cluster::start(1, Timing::FAST).await?;
    let endpoint = cluster.endpoints()[0].clone();
    let options = EtcdOptions::default().with_lease_sharing(LeaseSharing::PerTtl);
    let store = EtcdLeaseStore::connect_with(&cluster.url(), options).await?;
    let ttl = Duration::from_secs(60);
    let leases = acquire_many(&ctx, &store, "i", 2_000, ttl).await?;
    let crowded = ctx.key("x");
    let name = store.options().lock_name(&crowded);
    let mut client = store.client();
    // The oldest contender (the holder) has the largest name.
    client.put(format!("{name}/05999"), "", None).await?;
    for chunk in (0..5_999).rev().collect::<Vec<u32>>().chunks(100) {
        let puts: Vec<TxnOp> = chunk
            .iter()
            .map(|i| TxnOp::put(format!("{name}/{i:05}"), "", None))
            .collect();
        client.txn(Txn::new().and_then(puts)).await?;
    }
    let mut keys: Vec<_> = leases.iter().map(|l| l.key().clone()).collect();
    keys.push(crowded.clone());
    keys.extend((0..10).map(|i| ctx.key(&format!("free{i}"))));
    let before = requests(&endpoint).await?;
    let states = store.inspect_many(&keys).await?;
    let sent = requests(&endpoint).await? - before;
    println!("inspect_many of 2,011 keys (8,000 lock keys in their span): {sent:?}");
    assert_eq!(sent.ranges, 2, "{sent:?}");
    assert_eq!(sent.all, 3, "{sent:?}");
    assert_eq!(states.len(), keys.len());
    for (l, s) in leases.iter().zip(&states) {
        let h = s.holder.as_ref().ok_or("a held key reported free")?;
        assert_eq!((&h.owner, h.token), (l.owner(), l.token()), "{}", l.key());
    }
    for i in [0, 999, 1_999, 2_000, 2_001, 2_010] {
        let one = store.inspect(&keys[i]).await?;
        let many = &states[i];
        assert_eq!(
            (
                many.holder.as_ref().map(|h| (h.owner.clone(), h.token)),
                many.last_token
            ),
            (
                one.holder.as_ref().map(|h| (h.owner.clone(), h.token)),
                one.last_token
            ),
            "{}",
            keys[i]
        );
    }
    let crowded_holder = states[2_000].holder.as_ref().ok_or("x reported free")?;
    assert!(
        crowded_holder.owner.as_str().ends_with("05999"),
        "{crowded_holder:?}"
    );

    let per_grant = EtcdLeaseStore::connect(&cluster.url()).await?;
    let own = acquire_many(&ctx, &per_grant, "g", 100, ttl).await?;
    let keys: Vec<_> = own.iter().map(|l| l.key().clone()).collect();
    let before = requests(&endpoint).await?;
    let states = per_grant.inspect_many(&keys).await?;
    let sent = requests(&endpoint).await? - before;
    println!("inspect_many of 100 keys with one etcd lease each: {sent:?}");
    assert_eq!(sent.ranges, 1, "{sent:?}");
    assert_eq!(sent.all, 101, "{sent:?}");
    for (l, s) in own.iter().zip(&states) {
        assert_eq!(s.holder.as_ref().map(|h| h.token), Some(l.token()));
    }
    Ok(())
}
