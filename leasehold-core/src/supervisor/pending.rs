//! What an acquisition holds before a guard exists, and must not leak if the acquire is dropped
//! half way: a store acquire call in flight ([`InFlight`]) and a granted lease no guard holds yet
//! ([`Ungiven`]). Each finishes or releases what it holds in a spawned task when dropped early,
//! so that a grant nobody will renew does not block its key for a whole TTL.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, timeout, timeout_at};

use crate::clock::saturating_add;
use crate::error::{Error, Result};
use crate::hook::Hook;
use crate::lease::{AcquireOutcome, AcquireRequest, Lease};
use crate::store::LeaseStore;

/// A store acquire call in flight, owning what it needs (`'static`), so that it can outlive the
/// acquire that started it.
///
/// The acquire polls it in its own task, exactly as it would poll the store's future: no task
/// hop while the caller keeps polling. If the acquire is dropped before the call answered (a
/// `tokio::time::timeout` or `select!` around it), [`Drop`] hands the call to a spawned task that
/// finishes it by the call's own deadline (its start plus the op timeout) and releases a grant it
/// yields, bounded by the op timeout again. Without this a grant that lands after the drop would
/// hold the key, for nobody, for a whole TTL.
pub(super) struct InFlight {
    call: Option<Pin<Box<dyn Future<Output = Result<AcquireOutcome>> + Send>>>,
    store: Arc<dyn LeaseStore>,
    deadline: Instant,
    op: Duration,
}

impl InFlight {
    pub(super) fn new(store: Arc<dyn LeaseStore>, req: AcquireRequest, op: Duration) -> Self {
        let call_store = store.clone();
        InFlight {
            call: Some(Box::pin(async move { call_store.acquire(&req).await })),
            store,
            deadline: saturating_add(Instant::now(), op),
            op,
        }
    }

    /// Gives the call up (its op timeout ran out): it is dropped here, as a timed-out store call
    /// always was, and nothing finishes it in the background.
    pub(super) fn abandon(&mut self) {
        self.call = None;
    }
}

impl Future for InFlight {
    type Output = Result<AcquireOutcome>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(call) = self.call.as_mut() else {
            return Poll::Ready(Err(Error::InvalidInput(
                "an acquire call was polled after it answered".to_string(),
            )));
        };
        let out = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(out)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        // Outside a runtime (the runtime itself shutting down) the call cannot run on: it is
        // dropped, and a grant it may have landed expires after its TTL.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, deadline, op) = (self.store.clone(), self.deadline, self.op);
        rt.spawn(async move {
            if let Ok(Ok(AcquireOutcome::Acquired(lease))) = timeout_at(deadline, call).await {
                tracing::debug!(backend = store.backend(), key = %lease.key(), token = %lease.token(), "acquire dropped before its grant arrived; releasing");
                let _ = timeout(op, store.release(&lease)).await;
            }
        });
    }
}

/// A granted lease no guard holds yet (waiting for its fence install, or for the release of a
/// cancelled acquire). Dropped while it still holds the lease (its acquire was dropped between
/// the grant and the guard), it releases in a spawned task bounded by the op timeout. Once the
/// hook was told the lease was acquired, a release here also tells it the lease ended.
pub(super) struct Ungiven {
    store: Arc<dyn LeaseStore>,
    lease: Option<Lease>,
    op: Duration,
    hook: Option<Arc<dyn Hook>>,
}

impl Ungiven {
    pub(super) fn new(store: Arc<dyn LeaseStore>, lease: Lease, op: Duration) -> Self {
        Ungiven {
            store,
            lease: Some(lease),
            op,
            hook: None,
        }
    }

    /// Tells `hook` the lease was acquired after `waited`; a release from here on tells it the
    /// lease ended.
    pub(super) fn report_acquired(&mut self, hook: Arc<dyn Hook>, waited: Duration) {
        hook.acquired(self.get(), waited);
        self.hook = Some(hook);
    }

    /// The lease. Held from `new` until `take` or `release` consume `self`.
    pub(super) fn get(&self) -> &Lease {
        self.lease.as_ref().expect("held until taken")
    }

    /// Hands the lease over (to a guard).
    pub(super) fn take(mut self) -> Lease {
        self.lease.take().expect("held until taken")
    }

    /// Releases the lease now, in the caller's task (bounded by the op timeout), and tells the
    /// hook it ended; gives the lease back. Dropped half way, `Drop` releases it again in the
    /// background (a release names the grant's token, so a second one cannot free a later
    /// grant).
    pub(super) async fn release(mut self) -> Lease {
        let lease = self.get().clone();
        let released = timeout(self.op, self.store.release(&lease))
            .await
            .ok()
            .and_then(|r| r.ok());
        self.lease = None;
        if let Some(hook) = self.hook.take() {
            hook.ended(&lease, Duration::ZERO, released);
        }
        lease
    }
}

impl Drop for Ungiven {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (store, op, hook) = (self.store.clone(), self.op, self.hook.take());
            rt.spawn(async move {
                tracing::debug!(backend = store.backend(), key = %lease.key(), token = %lease.token(), "acquire dropped before its guard was handed out; releasing");
                let released = timeout(op, store.release(&lease))
                    .await
                    .ok()
                    .and_then(|r| r.ok());
                if let Some(hook) = hook {
                    hook.ended(&lease, Duration::ZERO, released);
                }
            });
        }
    }
}
