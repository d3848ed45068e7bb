//! Mutual exclusion with the real `etcdctl lock` (etcd's own lock protocol).

use std::process::Stdio;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, Error, Lease, LeaseStore, OwnerId, ReleaseOutcome,
};
use leasehold_etcd::EtcdLeaseStore;
use leasehold_etcd::LeaseSharing;
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, Failed};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// This file's cases for `sharing`.
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    match sharing {
        LeaseSharing::PerTtl => vec![
            case!("etcd", etcdctl_holds_and_the_store_is_refused),
            case!("etcd", etcdctl_holders_cannot_be_impersonated),
            case!("etcd", store_holds_and_etcdctl_waits),
            case!("etcd", forged_handles_never_revoke_other_etcd_leases),
        ],
        _ => vec![
            case!("etcd", etcdctl_holds_and_the_store_is_refused),
            case!("etcd", etcdctl_holders_cannot_be_impersonated),
            case!("etcd", store_holds_and_etcdctl_waits),
            case!("etcd", forged_handles_never_revoke_other_etcd_leases),
        ],
    }
}

/// The etcdctl binary: `LEASE_ETCDCTL_BIN`, default `/usr/bin/etcdctl`.
fn etcdctl_bin() -> String {
    std::env::var("LEASE_ETCDCTL_BIN").unwrap_or_else(|_| "/usr/bin/etcdctl".to_string())
}

/// `etcdctl lock NAME`, holding the lock (with a 10 s session) until interrupted.
fn spawn_lock(name: &str) -> Result<(Child, Lines<BufReader<ChildStdout>>), Failed> {
    let mut child = Command::new(etcdctl_bin())
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &super::endpoints(),
            "lock",
            "--ttl",
            "10",
            name,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", etcdctl_bin()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    Ok((child, BufReader::new(stdout).lines()))
}

/// The lock key `etcdctl` prints once it holds the lock, or `None` if it does not within `within`.
async fn locked_key(
    lines: &mut Lines<BufReader<ChildStdout>>,
    within: Duration,
) -> Result<Option<String>, Failed> {
    match tokio::time::timeout(within, lines.next_line()).await {
        Ok(Ok(Some(line))) => Ok(Some(line)),
        Ok(Ok(None)) => Err("etcdctl exited without taking the lock".into()),
        Ok(Err(e)) => Err(format!("reading etcdctl output: {e}").into()),
        Err(_) => Ok(None),
    }
}

/// Interrupts etcdctl (SIGINT makes it unlock) and waits for it to exit.
async fn interrupt(mut child: Child) -> CaseResult {
    let pid = child.id().ok_or("etcdctl already exited")?;
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .await?;
    if !status.success() {
        return Err("kill -INT failed".into());
    }
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .map_err(|_| "etcdctl did not exit")??;
    Ok(())
}

/// `etcdctl lock` holds the name: the store is refused and names the etcdctl key as the holder;
/// once etcdctl unlocks, the store acquires with a greater token.
pub(crate) async fn etcdctl_holds_and_the_store_is_refused(ctx: Ctx) -> CaseResult {
    let store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let key = ctx.key("etcdctl-holds");
    let name = store.options().lock_name(&key);
    let (child, mut lines) = spawn_lock(&name)?;
    let held_key = locked_key(&mut lines, Duration::from_secs(10))
        .await?
        .ok_or("etcdctl did not lock a free name")?;
    assert!(
        held_key.starts_with(&format!("{name}/")),
        "etcdctl printed {held_key:?}"
    );

    let b = OwnerId::with_label("b");
    let holder = match store
        .acquire(&ctx.request(&key, &b, ctx.long_ttl()))
        .await?
    {
        AcquireOutcome::Held(h) => h,
        AcquireOutcome::Acquired(l) => {
            return Err(format!("granted token {} while etcdctl holds the lock", l.token()).into());
        }
    };
    assert!(
        holder.owner.as_str().starts_with("etcd-lock:"),
        "holder {:?}",
        holder.owner
    );
    assert!(holder.remaining > Duration::ZERO && holder.remaining <= Duration::from_secs(10));
    assert_eq!(
        store.inspect(&key).await?.holder.map(|h| h.token),
        Some(holder.token)
    );

    interrupt(child).await?;
    let lease = ctx
        .acquire_within(&store, &key, &b, ctx.long_ttl(), Duration::from_secs(10))
        .await?;
    assert!(
        lease.token() > holder.token,
        "{} !> etcdctl's {}",
        lease.token(),
        holder.token
    );
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    Ok(())
}

/// The store holds the name: `etcdctl lock` waits until the store releases, then holds it, and
/// the store is refused.
pub(crate) async fn store_holds_and_etcdctl_waits(ctx: Ctx) -> CaseResult {
    let store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let key = ctx.key("store-holds");
    let a = OwnerId::with_label("a");
    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let (child, mut lines) = spawn_lock(&store.options().lock_name(&key))?;
    if let Some(k) = locked_key(&mut lines, Duration::from_millis(1500)).await? {
        return Err(format!("etcdctl took the lock ({k}) while the store holds it").into());
    }
    // etcdctl's waiting key queues behind ours: we still hold and renew.
    let holder = ctx
        .store()
        .inspect(&key)
        .await?
        .holder
        .ok_or("the store lost the key")?;
    assert_eq!(
        (holder.owner.clone(), holder.token),
        (a.clone(), lease.token())
    );
    assert!(matches!(
        ctx.store().renew(&lease).await?,
        leasehold_core::RenewOutcome::Renewed(_)
    ));

    assert_eq!(ctx.store().release(&lease).await?, ReleaseOutcome::Released);
    let held_key = locked_key(&mut lines, Duration::from_secs(10))
        .await?
        .ok_or("etcdctl did not get the lock")?;
    let b = OwnerId::with_label("b");
    match store
        .acquire(&ctx.request(&key, &b, ctx.long_ttl()))
        .await?
    {
        AcquireOutcome::Held(h) => {
            assert!(
                h.owner.as_str().starts_with("etcd-lock:"),
                "holder {:?}, etcdctl has {held_key}",
                h.owner
            );
            assert!(h.token > lease.token());
        }
        AcquireOutcome::Acquired(l) => {
            return Err(format!("granted token {} while etcdctl holds the lock", l.token()).into());
        }
    }
    interrupt(child).await?;
    ctx.wait_free(&key, Duration::from_secs(10)).await
}

/// The key, create revision, modification revision and etcd lease of `lock_key`, if it exists.
async fn lock_key_state(
    store: &EtcdLeaseStore,
    lock_key: &str,
) -> Result<Option<(i64, i64, i64)>, Failed> {
    let resp = store.client().get(lock_key, None).await?;
    Ok(resp
        .kvs()
        .first()
        .map(|kv| (kv.create_revision(), kv.mod_revision(), kv.lease())))
}

/// An `etcdctl lock` holder is reported as `etcd-lock:<key>`, but nobody can act as that owner:
/// acquire, renew, renew_many and release with it (resumed, with and without a forged handle) are
/// `InvalidOwner` errors, and the holder's key is untouched.
pub(crate) async fn etcdctl_holders_cannot_be_impersonated(ctx: Ctx) -> CaseResult {
    let store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let key = ctx.key("impersonated");
    let name = store.options().lock_name(&key);
    let (child, mut lines) = spawn_lock(&name)?;
    let held_key = locked_key(&mut lines, Duration::from_secs(10))
        .await?
        .ok_or("etcdctl did not lock a free name")?;
    let before = lock_key_state(&store, &held_key)
        .await?
        .ok_or("etcdctl's key is missing")?;
    let holder = store.inspect(&key).await?.holder.ok_or("no holder")?;
    assert!(
        holder.owner.as_str().starts_with("etcd-lock:") && holder.owner.is_foreign(),
        "holder {:?}",
        holder.owner
    );
    // The reported holder cannot even be spelled as an owner ...
    if !matches!(
        leasehold_core::OwnerId::new(holder.owner.as_str()),
        Err(Error::InvalidOwner { .. })
    ) {
        return Err(format!("OwnerId::new({}) was accepted", holder.owner).into());
    }
    // ... and a copy of the reported id is refused by every operation of the store.
    let ttl = Duration::from_secs(10);
    let resumed = Lease::resume(key.clone(), holder.owner.clone(), holder.token, ttl);
    let forged = resumed.clone().with_handle(format!("{:x}/a", before.2));
    let invalid = |what: &str, r: std::result::Result<String, Error>| match r {
        Err(Error::InvalidOwner { .. }) => Ok(()),
        other => Err(Failed::from(format!(
            "{what} as {}: expected InvalidOwner, got {other:?}",
            holder.owner
        ))),
    };
    let req = AcquireRequest::new(key.clone(), holder.owner.clone(), ttl);
    invalid(
        "acquire",
        store.acquire(&req).await.map(|o| format!("{o:?}")),
    )?;
    for (what, lease) in [("resumed", &resumed), ("forged handle", &forged)] {
        invalid(what, store.renew(lease).await.map(|o| format!("{o:?}")))?;
        let batch = store.renew_many(std::slice::from_ref(lease)).await?;
        let one = batch.into_iter().next().ok_or("renew_many: no outcome")?;
        invalid(what, one.map(|o| format!("{o:?}")))?;
        invalid(what, store.release(lease).await.map(|o| format!("{o:?}")))?;
    }
    let after = lock_key_state(&store, &held_key).await?;
    assert_eq!(after, Some(before), "etcdctl's key was changed");
    interrupt(child).await?;
    ctx.wait_free(&key, Duration::from_secs(10)).await
}

/// A release through a lease whose handle was not written by this store for this very grant
/// never revokes an etcd lease it names: handles naming `etcdctl lock`'s session lease (bare,
/// with a made up tag, or with a tag copied from one of our own handles) and our own handle with
/// a wrong token go through the checked path, which finds nothing to delete (`NotHeld`);
/// `etcdctl`'s key stays. Our first lease's handle attached to our second grant never frees the
/// first: with one etcd lease per grant it releases the second grant (whose key, owner and token
/// it names), with shared etcd leases it names no key (`NotHeld`).
pub(crate) async fn forged_handles_never_revoke_other_etcd_leases(ctx: Ctx) -> CaseResult {
    let store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let a = OwnerId::with_label("a");
    let ttl = Duration::from_secs(20);
    let (k1, k2, k3) = (
        ctx.key("forged-1"),
        ctx.key("forged-2"),
        ctx.key("forged-3"),
    );
    let l1 = ctx.must_acquire_with(&store, &k1, &a, ttl).await?;
    let l2 = ctx.must_acquire_with(&store, &k2, &a, ttl).await?;
    let h1 = l1.handle().ok_or("no handle")?.to_string();
    let tag = h1.rsplit('/').next().unwrap_or_default().to_string();

    let name = store.options().lock_name(&k3);
    let (child, mut lines) = spawn_lock(&name)?;
    let held_key = locked_key(&mut lines, Duration::from_secs(10))
        .await?
        .ok_or("etcdctl did not lock a free name")?;
    let before = lock_key_state(&store, &held_key)
        .await?
        .ok_or("etcdctl's key is missing")?;
    let (token3, session) = (
        leasehold_core::FencingToken::new(u64::try_from(before.0)?)?,
        before.2,
    );

    let forged = [
        // etcdctl's session lease, for its key and token, as a legal owner.
        Lease::resume(k3.clone(), a.clone(), token3, ttl).with_handle(format!("{session:x}/14")),
        Lease::resume(k3.clone(), a.clone(), token3, ttl)
            .with_handle(format!("{session:x}/14/t{}", "0".repeat(32))),
        Lease::resume(k3.clone(), a.clone(), token3, ttl)
            .with_handle(format!("{session:x}/14/{tag}")),
        Lease::resume(k3.clone(), a.clone(), token3, ttl)
            .with_handle(format!("{session:x}/14/s0/{tag}")),
        // Our first lease's handle on the first key with a wrong token.
        Lease::resume(k1.clone(), a.clone(), l1.token().next()?, ttl).with_handle(h1.clone()),
    ];
    for lease in &forged {
        let out = store.release(lease).await?;
        assert_eq!(out, ReleaseOutcome::NotHeld, "{lease:?}");
    }
    assert_eq!(
        lock_key_state(&store, &held_key).await?,
        Some(before),
        "etcdctl's key was changed"
    );
    // Our first lease's handle on the second grant (its key, owner and token): that grant is
    // released, through the checked path, and the first lease's etcd lease is not revoked.
    // With shared etcd leases the handle names a key of the first lease's etcd lease and nonce,
    // which does not exist: `NotHeld`, and the second lease is released on its own.
    let mixed = Lease::resume(k2.clone(), a.clone(), l2.token(), ttl).with_handle(h1.clone());
    if super::options().lease_sharing() == LeaseSharing::PerGrant {
        assert_eq!(store.release(&mixed).await?, ReleaseOutcome::Released);
    } else {
        assert_eq!(store.release(&mixed).await?, ReleaseOutcome::NotHeld);
        assert_eq!(store.release(&l2).await?, ReleaseOutcome::Released);
    }
    assert!(store.inspect(&k2).await?.holder.is_none(), "k2 not freed");
    let holder = store
        .inspect(&k1)
        .await?
        .holder
        .ok_or("k1 freed by a forgery")?;
    assert_eq!(holder.token, l1.token());
    assert!(matches!(
        store.renew(&l1).await?,
        leasehold_core::RenewOutcome::Renewed(ref l) if l.token() == l1.token()
    ));
    assert_eq!(store.release(&l1).await?, ReleaseOutcome::Released);
    interrupt(child).await?;
    ctx.wait_free(&k3, Duration::from_secs(10)).await
}
