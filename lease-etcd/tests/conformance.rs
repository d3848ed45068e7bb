//! The lease-testkit suite, plus etcd's own failure cases, against a real etcd.
//!
//! `LEASE_ETCD_ENDPOINTS` (comma-separated, default `http://127.0.0.1:23790`) names the shared
//! member. The failure cases start their own members with `/usr/bin/etcd` (or `LEASE_ETCD_BIN`)
//! on free loopback ports.

mod etcd;

use std::sync::Arc;

use lease_core::{FencedResource, LeaseStore};
use lease_etcd::{EtcdFencedResource, EtcdLeaseStore};
use lease_testkit::{Backend, BoxFuture};

/// The shared etcd member.
#[derive(Debug)]
struct Etcd;

impl Backend for Etcd {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn connect(&self) -> BoxFuture<'_, lease_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async {
            Ok(Arc::new(EtcdLeaseStore::connect(etcd::config()).await?) as Arc<dyn LeaseStore>)
        })
    }

    fn resource(&self) -> BoxFuture<'_, lease_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(EtcdFencedResource::connect(etcd::config()).await?)
                as Arc<dyn FencedResource>)
        })
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let config = etcd::config();
            if let Ok(store) = EtcdLeaseStore::connect(config.clone()).await {
                let mut client = store.client();
                for prefix in [config.prefix(), config.fence_prefix()] {
                    let opts = etcd_client::DeleteOptions::new().with_prefix();
                    let _ = client
                        .delete(format!("{prefix}{namespace}"), Some(opts))
                        .await;
                }
            }
        })
    }
}

fn main() {
    lease_testkit::run_with(Etcd, etcd::cases());
}
