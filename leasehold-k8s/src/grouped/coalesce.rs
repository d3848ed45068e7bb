//! What the grouped store's coalesced writes share (grants in `acquire.rs`, releases in
//! `release.rs`): a queue per group of requests waiting for the group's next write, and the
//! answer of every request a write carried.

use leasehold_core::{Error, Result};
use tokio::sync::oneshot;

use crate::error::BACKEND;

/// One group's requests waiting for its next write.
pub(super) struct Queue<T> {
    pending: std::sync::Mutex<Vec<T>>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            pending: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl<T> Queue<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<T>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn push(&self, item: T) {
        self.lock().push(item);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Every request queued now, leaving the queue empty.
    pub(super) fn take(&self) -> Vec<T> {
        std::mem::take(&mut *self.lock())
    }
}

/// Sends each request its outcome of one write (`result`'s outcomes in the requests' order), or
/// the write's error to all of them (the first gets the error itself, the others a store fault
/// with its message).
pub(super) fn answer<T>(done: Vec<oneshot::Sender<Result<T>>>, result: Result<Vec<T>>) {
    match result {
        Ok(outcomes) => {
            for (tx, o) in done.into_iter().zip(outcomes) {
                let _ = tx.send(Ok(o));
            }
        }
        Err(e) => {
            let message = e.to_string();
            let mut first = Some(e);
            for tx in done {
                let e = first
                    .take()
                    .unwrap_or_else(|| Error::store_fault(BACKEND, message.clone(), None));
                let _ = tx.send(Err(e));
            }
        }
    }
}

/// The answer a request waited for, or a store fault if its write's task ended without one.
pub(super) async fn answered<T>(answer: oneshot::Receiver<Result<T>>, what: &str) -> Result<T> {
    answer.await.unwrap_or_else(|_| {
        Err(Error::store_fault(
            BACKEND,
            format!("the {what} task ended without an answer"),
            None,
        ))
    })
}
