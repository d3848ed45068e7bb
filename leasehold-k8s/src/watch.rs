//! Watch-driven waiting: a field-selected watch on one object (a Lease, or a grouped store's
//! group ConfigMap), reconnected from the last seen
//! resourceVersion, with bounded fallback polling while it is broken.

use std::pin::pin;
use std::time::Duration;

use futures::StreamExt;
use std::fmt;

use k8s_openapi::serde::de::DeserializeOwned;
use kube::Resource;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use leasehold_core::{KeyWatch, Result};
use tokio::sync::mpsc;

use crate::error::BACKEND;
use crate::error::timed;
use crate::protocol::{name_selector, parse_resource_version};
use crate::store::K8sLeaseStore;

/// How long the server keeps one watch request open before we reopen it (no hint).
const WATCH_SECS: u32 = 60;
/// Fallback polling while the watch is broken: first interval, doubled up to the cap.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Lists the one object (to learn the revision to watch from), then spawns the watch task.
pub(crate) async fn start(store: &K8sLeaseStore, name: &str) -> Result<KeyWatch> {
    start_on(store.api().clone(), name, store.request_timeout()).await
}

/// As [`start`], on the object `name` of any kind.
pub(crate) async fn start_on<K>(api: Api<K>, name: &str, timeout: Duration) -> Result<KeyWatch>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + 'static,
{
    let rv = list_rv(&api, name, timeout).await?;
    let (tx, mut rx) = mpsc::channel::<Result<()>>(1);
    tokio::spawn(run(api, name.to_string(), rv, timeout, tx));
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    Ok(KeyWatch::new(Box::pin(stream)))
}

async fn list_rv<K>(api: &Api<K>, name: &str, timeout: Duration) -> Result<String>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug,
{
    let list = timed(
        "list",
        timeout,
        api.list(&ListParams::default().fields(&name_selector(name))),
    )
    .await
    .map_err(|e| e.into_error("list"))?;
    let rv = list.metadata.resource_version.unwrap_or_default();
    parse_resource_version(name, Some(&rv))?;
    Ok(rv)
}

/// A hint that coalesces with one already pending. `false` once the watcher is gone.
fn hint(tx: &mpsc::Sender<Result<()>>) -> bool {
    !matches!(
        tx.try_send(Ok(())),
        Err(mpsc::error::TrySendError::Closed(_))
    )
}

async fn run<K>(
    api: Api<K>,
    name: String,
    mut rv: String,
    timeout: Duration,
    tx: mpsc::Sender<Result<()>>,
) where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + 'static,
{
    let params = WatchParams::default()
        .fields(&name_selector(&name))
        .timeout(WATCH_SECS);
    let mut backoff = MIN_BACKOFF;
    loop {
        let opened = tokio::select! {
            _ = tx.closed() => return,
            r = api.watch(&params, &rv) => r,
        };
        let mut broken = true;
        if let Ok(stream) = opened {
            let mut stream = pin!(stream);
            loop {
                let event = tokio::select! {
                    _ = tx.closed() => return,
                    e = stream.next() => e,
                };
                match event {
                    Some(Ok(
                        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o),
                    )) => {
                        if let Some(v) = o.meta().resource_version.clone() {
                            rv = v;
                        }
                        backoff = MIN_BACKOFF;
                        if !hint(&tx) {
                            return;
                        }
                    }
                    Some(Ok(WatchEvent::Bookmark(b))) => rv = b.metadata.resource_version,
                    Some(Ok(WatchEvent::Error(status))) => {
                        tracing::debug!(backend = BACKEND, lease = %name, code = status.code, "watch error event");
                        break;
                    }
                    Some(Err(e)) => {
                        tracing::debug!(backend = BACKEND, lease = %name, error = %e, "watch stream failed");
                        break;
                    }
                    // The server ended the request (its timeout): reopen from the last revision.
                    None => {
                        broken = false;
                        break;
                    }
                }
            }
        }
        if !broken {
            continue;
        }
        // Broken (410 Gone, disconnect, apiserver down): something may have changed unseen, so
        // hint, wait a bounded interval, and relist for a fresh revision. While the apiserver stays
        // unreachable this repeats, so a waiter is woken at least every MAX_BACKOFF (polling).
        if !hint(&tx) {
            return;
        }
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
        if let Ok(fresh) = list_rv(&api, &name, timeout).await {
            rv = fresh;
        }
    }
}
