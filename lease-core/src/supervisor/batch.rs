//! Renewal coalescing: many guards of one supervisor share one batched renewal per window, so a
//! process holding thousands of leases sends a handful of round trips per renewal interval.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};

use crate::error::{Error, Result};
use crate::lease::{Lease, RenewOutcome};
use crate::store::LeaseStore;

/// The largest batch sent in one call.
pub(crate) const MAX_BATCH: usize = 5_000;

type Request = (Lease, oneshot::Sender<Result<RenewOutcome>>);

/// How guards renew: directly, or through a shared batcher.
#[derive(Debug, Clone)]
pub(crate) enum Renewer {
    Direct(Arc<dyn LeaseStore>),
    Batched(mpsc::UnboundedSender<Request>, &'static str),
}

impl Renewer {
    pub(crate) fn new(store: Arc<dyn LeaseStore>, window: Option<Duration>) -> Self {
        match window {
            None => Renewer::Direct(store),
            Some(window) => {
                let (tx, rx) = mpsc::unbounded_channel();
                let backend = store.backend();
                tokio::spawn(run(store, window, rx));
                Renewer::Batched(tx, backend)
            }
        }
    }

    pub(crate) async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        match self {
            Renewer::Direct(store) => store.renew(lease).await,
            Renewer::Batched(tx, backend) => {
                let (reply, rx) = oneshot::channel();
                tx.send((lease.clone(), reply)).map_err(|_| {
                    Error::unavailable(backend, "the renewal batcher stopped", None)
                })?;
                rx.await.map_err(|_| {
                    Error::unavailable(backend, "the renewal batch was dropped", None)
                })?
            }
        }
    }
}

async fn run(
    store: Arc<dyn LeaseStore>,
    window: Duration,
    mut rx: mpsc::UnboundedReceiver<Request>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let close = Instant::now() + window;
        while batch.len() < MAX_BATCH {
            tokio::select! {
                r = rx.recv() => match r {
                    Some(req) => batch.push(req),
                    None => break,
                },
                _ = sleep_until(close) => break,
            }
        }
        let leases: Vec<Lease> = batch.iter().map(|(l, _)| l.clone()).collect();
        // Each batch runs on its own task so a slow store does not delay the next window.
        let store = store.clone();
        tokio::spawn(async move {
            match store.renew_many(&leases).await {
                Ok(outcomes) => {
                    let mut outcomes = outcomes.into_iter();
                    for (_, reply) in batch {
                        let r = outcomes.next().unwrap_or_else(|| {
                            Err(Error::backend(
                                store.backend(),
                                "renew_many returned too few outcomes",
                                None,
                            ))
                        });
                        let _ = reply.send(r);
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    let retryable = e.is_retryable();
                    for (_, reply) in batch {
                        let err = if retryable {
                            Error::unavailable(store.backend(), msg.clone(), None)
                        } else {
                            Error::backend(store.backend(), msg.clone(), None)
                        };
                        let _ = reply.send(Err(err));
                    }
                }
            }
        });
    }
}
