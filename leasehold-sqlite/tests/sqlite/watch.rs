//! The watch: in-process wake-ups on release, `PRAGMA data_version` for other connections, the
//! option that turns it off, and a supervisor handoff that only the watch can make prompt.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use leasehold_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, KeyState, KeyWatch, Lease, LeaseKey, LeaseStore,
    OwnerId, ReleaseOutcome, RenewOutcome,
};
use leasehold_sqlite::{SqliteLeaseStore, SqliteOptions};
use leasehold_testkit::{CaseResult, Ctx};
use tokio::time::{Instant, timeout};

use super::{fresh_file, must_acquire, raw};

/// A poll interval so long that only the in-process path can wake a watcher during a case.
fn in_process_only() -> SqliteOptions {
    SqliteOptions::new().with_watch_poll_interval(Duration::from_secs(3600))
}

async fn open_watching(
    path: &Path,
    opts: SqliteOptions,
) -> leasehold_core::Result<SqliteLeaseStore> {
    let store = SqliteLeaseStore::open_with(path, opts).await?;
    assert!(store.capabilities().watch, "watch is on by default");
    Ok(store)
}

async fn watch(
    store: &SqliteLeaseStore,
    key: &LeaseKey,
) -> Result<KeyWatch, leasehold_testkit::Failed> {
    store
        .watch(key)
        .await?
        .ok_or_else(|| "watch() returned None with watch on".into())
}

/// Whether a hint is ready right now. In-process hints are sent before `release` returns, so no
/// waiting is needed to see one, or to see that none was sent.
fn hinted_now(w: &mut KeyWatch) -> Result<bool, leasehold_testkit::Failed> {
    match w.changed().now_or_never() {
        None => Ok(false),
        Some(Some(Ok(()))) => Ok(true),
        Some(other) => Err(format!("the watch ended: {other:?}").into()),
    }
}

/// A release wakes the watchers of its key at once, and not those of another key.
pub(super) async fn release_wakes_only_its_own_key(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "watch-keys");
    let store = open_watching(&path, in_process_only()).await?;
    let (ka, kb) = (LeaseKey::new("a")?, LeaseKey::new("b")?);
    let owner = OwnerId::with_label("holder");
    let la = must_acquire(&store, &ka, &owner).await?;
    let lb = must_acquire(&store, &kb, &owner).await?;
    let mut wa = watch(&store, &ka).await?;
    assert!(!hinted_now(&mut wa)?, "a hint before anything changed");
    assert_eq!(store.release(&lb).await?, ReleaseOutcome::Released);
    assert!(
        !hinted_now(&mut wa)?,
        "the release of b woke the watcher of a"
    );
    // A refused release changes nothing and wakes nobody.
    assert_eq!(store.release(&lb).await?, ReleaseOutcome::NotHeld);
    assert!(!hinted_now(&mut wa)?, "a refused release woke the watcher");
    assert_eq!(store.release(&la).await?, ReleaseOutcome::Released);
    assert!(
        hinted_now(&mut wa)?,
        "the release of a did not wake its watcher"
    );
    Ok(())
}

/// Two stores (two pools) on one file in one process wake each other's watchers, in both
/// directions, through the shared registry.
pub(super) async fn two_stores_on_one_file_wake_each_other(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "watch-two");
    let one = open_watching(&path, in_process_only()).await?;
    let two = open_watching(&path, in_process_only()).await?;
    let (k1, k2) = (LeaseKey::new("one")?, LeaseKey::new("two")?);
    let l1 = must_acquire(&one, &k1, &OwnerId::with_label("one")).await?;
    let l2 = must_acquire(&two, &k2, &OwnerId::with_label("two")).await?;
    let mut w1 = watch(&two, &k1).await?;
    let mut w2 = watch(&one, &k2).await?;
    assert_eq!(one.release(&l1).await?, ReleaseOutcome::Released);
    assert!(
        hinted_now(&mut w1)?,
        "a release by one did not wake two's watcher"
    );
    assert!(
        !hinted_now(&mut w2)?,
        "a release of k1 woke the watcher of k2"
    );
    assert_eq!(two.release(&l2).await?, ReleaseOutcome::Released);
    assert!(
        hinted_now(&mut w2)?,
        "a release by two did not wake one's watcher"
    );
    Ok(())
}

/// A release committed by a connection that bypasses the store (standing in for another
/// process) wakes the watcher through `PRAGMA data_version`.
pub(super) async fn release_by_another_connection_wakes_through_data_version(
    ctx: Ctx,
) -> CaseResult {
    let path = fresh_file(&ctx, "watch-raw");
    let opts = SqliteOptions::new().with_watch_poll_interval(Duration::from_millis(10));
    let store = open_watching(&path, opts).await?;
    let key = LeaseKey::new("raw")?;
    let lease = must_acquire(&store, &key, &OwnerId::with_label("elsewhere")).await?;
    let mut w = watch(&store, &key).await?;
    let mut conn = raw(&path).await.map_err(|e| e.to_string())?;
    // The store's own release statement, sent on a connection of its own.
    let done = sqlx::query(leasehold_sqlite::protocol::RELEASE)
        .bind(key.as_str())
        .bind(lease.owner().as_str())
        .bind(lease.token().to_i64())
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(done.rows_affected(), 1, "the raw release freed nothing");
    match timeout(Duration::from_secs(10), w.changed()).await {
        Ok(Some(Ok(()))) => {}
        Ok(other) => return Err(format!("the watch ended: {other:?}").into()),
        Err(_) => return Err("no hint within 10 s of another connection's release".into()),
    }
    must_acquire(&store, &key, &OwnerId::with_label("waiter")).await?;
    Ok(())
}

/// With the watch off the store claims no watch and `watch()` returns `None`.
pub(super) async fn watch_off_offers_no_watch(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "watch-off");
    let store = SqliteLeaseStore::open_with(&path, SqliteOptions::new().with_watch(false)).await?;
    assert!(!store.capabilities().watch, "watch claimed while off");
    assert!(
        store.watch(&LeaseKey::new("k")?).await?.is_none(),
        "watch() returned a watch while off"
    );
    Ok(())
}

/// A waiting supervisor is granted soon after the holder releases. Its backoff (60 s) and the
/// holder's TTL (60 s) both lie beyond its acquire wait (20 s), so without a wake-up from the
/// watch its next attempt would come only at the end of that wait: a grant *before* the wait is
/// over can only come from the watch. (Nothing about speed is asserted beyond that deadline.)
pub(super) async fn waiting_supervisor_is_granted_on_release(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "watch-supervisor");
    let holder = SqliteLeaseStore::open(&path).await?;
    let key = LeaseKey::new("handoff")?;
    let req = AcquireRequest::new(
        key.clone(),
        OwnerId::with_label("holder"),
        Duration::from_secs(60),
    );
    let lease = match holder.acquire(&req).await? {
        AcquireOutcome::Acquired(l) => l,
        AcquireOutcome::Held(h) => return Err(format!("held by {}", h.owner).into()),
    };
    let (held_tx, mut held_rx) = tokio::sync::watch::channel(0u32);
    let waiter = Reporting {
        inner: SqliteLeaseStore::open(&path).await?,
        held: Arc::new(held_tx),
    };
    let wait = Duration::from_secs(20);
    let config = SupervisorConfig::new(Duration::from_secs(30))
        .with_acquire_wait(wait)
        .with_backoff(Duration::from_secs(60), Duration::from_secs(60));
    let supervisor = Supervisor::new(waiter, config);
    let k = key.clone();
    let started = Instant::now();
    let waiting = tokio::spawn(async move { supervisor.acquire(&k).await });
    // Release only once the supervisor has seen the key held and gone to wait.
    timeout(Duration::from_secs(10), held_rx.wait_for(|n| *n >= 1))
        .await
        .map_err(|_| "the supervisor made no attempt within 10 s")?
        .map_err(|e| e.to_string())?;
    assert_eq!(holder.release(&lease).await?, ReleaseOutcome::Released);
    let got = waiting.await.map_err(|e| e.to_string())??;
    let waited = started.elapsed();
    match got {
        Acquisition::Acquired(guard) if waited < wait => {
            assert!(guard.token() > lease.token());
            assert_eq!(guard.release().await?, ReleaseOutcome::Released);
        }
        other => {
            return Err(format!(
                "the watch did not wake the waiting supervisor: {other:?} after {waited:?} \
                 (a grant only at the end of the {wait:?} wait is the final attempt, not a wake-up)"
            )
            .into());
        }
    }
    Ok(())
}

/// The waiter's store, forwarding everything and counting `Held` answers so the test knows the
/// supervisor is waiting.
#[derive(Debug)]
struct Reporting {
    inner: SqliteLeaseStore,
    held: Arc<tokio::sync::watch::Sender<u32>>,
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl LeaseStore for Reporting {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, req: &AcquireRequest) -> leasehold_core::Result<AcquireOutcome> {
        let out = self.inner.acquire(req).await?;
        if matches!(out, AcquireOutcome::Held(_)) {
            self.held.send_modify(|n| *n += 1);
        }
        Ok(out)
    }

    async fn renew(&self, lease: &Lease) -> leasehold_core::Result<RenewOutcome> {
        self.inner.renew(lease).await
    }

    async fn release(&self, lease: &Lease) -> leasehold_core::Result<ReleaseOutcome> {
        self.inner.release(lease).await
    }

    async fn inspect(&self, key: &LeaseKey) -> leasehold_core::Result<KeyState> {
        self.inner.inspect(key).await
    }

    async fn inspect_many(&self, keys: &[LeaseKey]) -> leasehold_core::Result<Vec<KeyState>> {
        self.inner.inspect_many(keys).await
    }
    async fn acquire_many(
        &self,
        reqs: &[leasehold_core::AcquireRequest],
    ) -> leasehold_core::Result<Vec<leasehold_core::Result<leasehold_core::AcquireOutcome>>> {
        self.inner.acquire_many(reqs).await
    }

    async fn holders_many(
        &self,
        keys: &[LeaseKey],
    ) -> leasehold_core::Result<Vec<Option<leasehold_core::HeldBy>>> {
        self.inner.holders_many(keys).await
    }

    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> leasehold_core::Result<Vec<leasehold_core::Result<RenewOutcome>>> {
        self.inner.renew_many(leases).await
    }

    async fn watch(&self, key: &LeaseKey) -> leasehold_core::Result<Option<KeyWatch>> {
        self.inner.watch(key).await
    }
}
