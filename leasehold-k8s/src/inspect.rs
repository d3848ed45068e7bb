//! Reading many keys: [`K8sLeaseStore`]'s `inspect_many`, GETs for a few keys and a paged LIST
//! of the namespace for many, every object read counted as an observation.

use std::collections::{HashMap, HashSet};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use kube::api::ListParams;
use leasehold_core::{KeyState, LeaseKey, LeaseStore, Result};

use crate::protocol::Record;
use crate::store::{K8sLeaseStore, LIST_PAGE, LIST_THRESHOLD, RENEW_MANY_IN_FLIGHT};

impl K8sLeaseStore {
    /// [`LeaseStore::inspect_many`](leasehold_core::LeaseStore::inspect_many) (see its docs on [`K8sLeaseStore`]).
    pub(crate) async fn inspect_batch(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        if keys.len() <= LIST_THRESHOLD {
            let reads: Vec<_> = keys.iter().map(|k| self.inspect(k)).collect();
            return stream::iter(reads)
                .buffered(RENEW_MANY_IN_FLIGHT)
                .try_collect()
                .await;
        }
        let wanted: HashSet<String> = keys.iter().map(|k| self.object_name(k)).collect();
        let mut found: HashMap<String, KubeLease> = HashMap::new();
        let mut next: Option<String> = None;
        loop {
            let mut lp = ListParams::default().limit(LIST_PAGE);
            if let Some(token) = &next {
                lp = lp.continue_token(token);
            }
            let page = self
                .timed("list", self.api.list(&lp))
                .await
                .map_err(|e| e.into_error("list"))?;
            for obj in page.items {
                if let Some(name) = obj.metadata.name.clone()
                    && wanted.contains(&name)
                {
                    found.insert(name, obj);
                }
            }
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => next = Some(token),
                _ => break,
            }
        }
        keys.iter()
            .map(|key| {
                let name = self.object_name(key);
                let read = match found.get(&name) {
                    Some(obj) => {
                        let rec = Record::parse(obj)?;
                        let first_seen = self.observe(&name, obj, &rec);
                        Some((obj.clone(), rec, first_seen))
                    }
                    None => {
                        self.lock().observed.remove(&name);
                        None
                    }
                };
                self.state_of(key, &name, read)
            })
            .collect()
    }
}
