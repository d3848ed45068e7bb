//! A shard set over stores with the default options ([`LeaseSharing::ReservedPerTtl`]): its
//! shards share one etcd lease per worker, while a key a caller names keeps an etcd lease of its
//! own. Read off etcd itself (each lock key's `lease` field).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::GetOptions;
use leasehold_core::{LeaseStore, OwnerId};
use leasehold_etcd::{EtcdLeaseStore, LeaseSharing, protocol};
use leasehold_shard::{ShardSet, ShardSetConfig, Worker};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, Failed};

/// This file's cases: they build their own default stores, so they run once, in the target
/// whose binary mode is `PerGrant` (`etcd`).
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    match sharing {
        LeaseSharing::PerGrant => vec![
            case!("etcd", a_default_shard_set_uses_one_etcd_lease_per_worker),
            case!(
                "etcd",
                a_named_key_keeps_an_etcd_lease_of_its_own_by_default
            ),
        ],
        _ => Vec::new(),
    }
}

/// Waits until every worker owns exactly `share` shards (woken by their assignment changes),
/// at most `within`.
async fn settled(workers: &[Worker], share: usize, within: Duration) -> Result<(), Failed> {
    let mut subs: Vec<_> = workers.iter().map(Worker::subscribe).collect();
    let wait = async {
        loop {
            if subs.iter().all(|s| s.borrow().len() == share) {
                return;
            }
            let changes = subs.iter_mut().map(|s| Box::pin(s.changed()));
            let _ = futures::future::select_all(changes).await;
        }
    };
    tokio::time::timeout(within, wait).await.map_err(|_| {
        let owned: Vec<usize> = workers.iter().map(|w| w.assignment().len()).collect();
        Failed::from(format!(
            "the set did not settle at {share} shards each within {within:?}: {owned:?}"
        ))
    })
}

/// Three workers, each joined through a store of its own connected with the default options
/// (three processes), split 12 shards: the 12 shard lock keys sit on exactly three etcd leases,
/// one per worker, each carrying that worker's four shards.
pub(crate) async fn a_default_shard_set_uses_one_etcd_lease_per_worker(ctx: Ctx) -> CaseResult {
    let (workers_n, shards_n) = (3, 12);
    let name = ctx.key("orders");
    let shards: Vec<String> = (0..shards_n).map(|i| format!("p{i}")).collect();
    let config = ShardSetConfig::new(Duration::from_secs(3));
    let mut stores = Vec::new();
    let mut workers = Vec::new();
    for i in 0..workers_n {
        let store = EtcdLeaseStore::connect(&super::url()).await?;
        assert_eq!(
            store.options().lease_sharing(),
            LeaseSharing::ReservedPerTtl
        );
        let set = ShardSet::new(
            Arc::new(store.clone()) as Arc<dyn LeaseStore>,
            name.as_str(),
            &shards,
            config.clone(),
        )?;
        workers.push(set.join(&format!("w{i}"))?);
        stores.push(store);
    }
    settled(&workers, shards_n / workers_n, Duration::from_secs(60)).await?;

    // Every shard's lock key, read off etcd: `<prefix><set>.lease--s.<shard>/<name>`.
    let shard_prefix = format!(
        "{}{}.lease--s.",
        stores[0].options().prefix(),
        name.as_str()
    );
    let mut client = stores[0].client();
    let resp = client
        .get(shard_prefix.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| format!("reading {shard_prefix}: {e}"))?;
    let mut by_lease: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    for kv in resp.kvs() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let shard = key[shard_prefix.len()..]
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        by_lease.entry(kv.lease()).or_default().insert(shard);
    }
    let keys: usize = by_lease.values().map(BTreeSet::len).sum();
    assert_eq!(
        keys, shards_n,
        "shard lock keys by etcd lease: {by_lease:?}"
    );
    assert_eq!(
        by_lease.len(),
        workers_n,
        "distinct etcd leases among the shard keys (want one per worker): {by_lease:?}"
    );
    // Each etcd lease carries exactly one worker's shards.
    let mut assignments: Vec<BTreeSet<String>> = workers
        .iter()
        .map(|w| w.assignment().into_keys().collect())
        .collect();
    assignments.sort();
    let mut on_leases: Vec<BTreeSet<String>> = by_lease.into_values().collect();
    on_leases.sort();
    assert_eq!(on_leases, assignments, "etcd leases vs the workers' shares");
    println!("{shards_n} shards over {workers_n} default stores: {workers_n} etcd leases");
    for w in workers {
        w.leave().await;
    }
    Ok(())
}

/// A key a caller names, acquired through a default store, sits alone on an etcd lease granted
/// for it (the per-grant layout `etcdctl lock` knows), as before the default shared reserved keys.
pub(crate) async fn a_named_key_keeps_an_etcd_lease_of_its_own_by_default(ctx: Ctx) -> CaseResult {
    let store = EtcdLeaseStore::connect(&super::url()).await?;
    let ttl = Duration::from_secs(4);
    let key = ctx.key("named");
    let lease = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("a"), ttl)
        .await?;
    let prefix = protocol::mutex_prefix(store.options().prefix(), &key);
    let mut client = store.client();
    let resp = client
        .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| format!("reading {prefix}: {e}"))?;
    let [kv] = resp.kvs() else {
        return Err(format!("expected one lock key under {prefix}, got {:?}", resp.kvs()).into());
    };
    assert!(
        protocol::alone_on_its_lease(kv.key(), kv.lease()),
        "{}: not alone on its etcd lease {}",
        String::from_utf8_lossy(kv.key()),
        kv.lease()
    );
    assert!(protocol::slot_of(kv.key()).is_some(), "{kv:?}");
    let _ = store.release(&lease).await?;
    Ok(())
}
