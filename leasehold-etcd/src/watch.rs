//! Waking waiters: an etcd watch on a key's lock prefix, whose events (a holder's key deleted
//! or put) are hints to look again.

use leasehold_core::{Error, KeyWatch, LeaseKey, Result};

use crate::error::{BACKEND, map, protocol};
use crate::protocol;
use crate::store::EtcdLeaseStore;

impl EtcdLeaseStore {
    /// [`LeaseStore::watch`](leasehold_core::LeaseStore::watch): a watch on the key's lock
    /// prefix, returned once etcd confirms it (so no delete after the call is missed); each
    /// event batch is a hint. Cancel safe: dropping the future drops the unconfirmed watch.
    pub(crate) async fn watch_key(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        let opts = protocol::waiter_watch();
        let prefix = self.mutex_prefix(key);
        let mut stream = self
            .call("watch", || {
                let (mut wc, prefix, opts) =
                    (self.client.watch_client(), prefix.clone(), opts.clone());
                async move { wc.watch(prefix, Some(opts)).await }
            })
            .await?;
        // Wait until the server confirms the watch, so that no delete after this call is missed.
        let after = self.options.request_timeout();
        let confirmed = match tokio::time::timeout(after, stream.message()).await {
            Ok(Ok(first)) => first,
            Ok(Err(e)) => return Err(map("watch", e, after)),
            Err(_) => {
                return Err(Error::Timeout {
                    backend: BACKEND,
                    operation: "watch",
                    after,
                });
            }
        };
        match confirmed {
            Some(resp) if resp.created() => {}
            _ => return Err(protocol("etcd did not confirm the watch")),
        }
        let hints = futures::stream::unfold(Some(stream), move |state| async move {
            let mut stream = state?;
            loop {
                match stream.message().await {
                    Ok(Some(resp)) if resp.canceled() => {
                        let msg = format!("etcd cancelled the watch: {}", resp.cancel_reason());
                        return Some((Err(protocol(msg)), None));
                    }
                    Ok(Some(resp)) if !resp.events().is_empty() => {
                        return Some((Ok(()), Some(stream)));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => return None,
                    Err(e) => return Some((Err(map("watch", e, after)), None)),
                }
            }
        });
        Ok(Some(KeyWatch::new(Box::pin(hints))))
    }
}
