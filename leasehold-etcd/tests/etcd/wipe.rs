//! Wiping what a case left in etcd: its namespace under the store's key prefix and fence
//! prefix, with leasehold-testkit's `delete_namespace` over a range delete.

use leasehold_etcd::EtcdLeaseStore;
use leasehold_testkit::BoxFuture;
use leasehold_testkit::wipe::{PrefixDelete, delete_namespace};

/// An etcd client as leasehold-testkit's wipe takes it.
struct Kv(etcd_client::Client);

impl PrefixDelete for Kv {
    fn delete_prefix<'a>(&'a mut self, prefix: &'a str) -> BoxFuture<'a, Result<u64, String>> {
        Box::pin(async move {
            let opts = etcd_client::DeleteOptions::new().with_prefix();
            let r = self
                .0
                .delete(prefix, Some(opts))
                .await
                .map_err(|e| e.to_string())?;
            Ok(u64::try_from(r.deleted()).unwrap_or(0))
        })
    }
}

/// Deletes every key of `namespace` under `store`'s key prefix and fence prefix (best effort).
pub(crate) async fn delete_case_namespace(store: &EtcdLeaseStore, namespace: &str) {
    let options = store.options();
    delete_namespace(
        &mut Kv(store.client()),
        &[options.prefix(), options.fence_prefix()],
        namespace,
    )
    .await;
}
