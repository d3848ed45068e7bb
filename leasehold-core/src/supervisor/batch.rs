//! Renewal coalescing: many guards of one supervisor share one batched renewal per window, so a
//! process holding thousands of leases sends a handful of round trips per renewal interval.
//!
//! A window only merges renewals that fall due close together. Leases acquired over a longer
//! span (a process taking 10,000 leases over several seconds) would keep renewing in as many
//! waves as their acquisitions spanned windows, so the batcher also keeps a grid of half a
//! renewal interval, anchored when the supervisor was made: a held guard's next renewal is
//! moved *earlier* to the last grid point before it, as long as that keeps at least half of its
//! wait. After its first renewal every guard renews on a grid point, exactly one interval apart,
//! so all of a supervisor's guards share at most two waves per interval (plus one per
//! [`MAX_BATCH`] leases). Renewing early is always safe: it never moves a deadline later.

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
    Batched(mpsc::UnboundedSender<Request>, &'static str, Grid),
}

/// Renewal points shared by the guards of one batching supervisor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grid {
    anchor: Instant,
    period: Duration,
}

impl Grid {
    pub(crate) fn new(anchor: Instant, renew_interval: Duration) -> Self {
        Grid {
            anchor,
            period: (renew_interval / 2).max(Duration::from_millis(1)),
        }
    }

    /// `at` moved back to the last grid point at or before it, unless that would leave less
    /// than half of the wait from `now`.
    pub(crate) fn align(&self, at: Instant, now: Instant) -> Instant {
        let since = at.saturating_duration_since(self.anchor);
        let rem = since.as_nanos() % self.period.as_nanos();
        let rem = Duration::from_nanos(u64::try_from(rem).unwrap_or(0));
        let Some(snapped) = at.checked_sub(rem) else {
            return at;
        };
        let half_wait = at.saturating_duration_since(now) / 2;
        if snapped >= crate::clock::saturating_add(now, half_wait) {
            snapped
        } else {
            at
        }
    }
}

impl Renewer {
    pub(crate) fn new(
        store: Arc<dyn LeaseStore>,
        window: Option<Duration>,
        renew_interval: Duration,
        op_timeout: Duration,
    ) -> Self {
        match window {
            None => Renewer::Direct(store),
            Some(window) => {
                let (tx, rx) = mpsc::unbounded_channel();
                let backend = store.backend();
                tokio::spawn(run(store, window, op_timeout, rx));
                Renewer::Batched(tx, backend, Grid::new(Instant::now(), renew_interval))
            }
        }
    }

    /// When a held guard should renew: `at` itself when renewing directly, the shared grid point
    /// before it when batching (see the module docs).
    pub(crate) fn align(&self, at: Instant, now: Instant) -> Instant {
        match self {
            Renewer::Direct(_) => at,
            Renewer::Batched(_, _, grid) => grid.align(at, now),
        }
    }

    pub(crate) async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        match self {
            Renewer::Direct(store) => store.renew(lease).await,
            Renewer::Batched(tx, backend, _) => {
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
    op_timeout: Duration,
    mut rx: mpsc::UnboundedReceiver<Request>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let close = crate::clock::saturating_add(Instant::now(), window);
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
            // Bounded like every store call: a hung batch must not keep its task forever (the
            // guards have given up on it at their own bound already).
            let answer = tokio::time::timeout(op_timeout, store.renew_many(&leases))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Timeout {
                        backend: store.backend(),
                        operation: "renew_many",
                        after: op_timeout,
                    })
                });
            match answer {
                Ok(outcomes) => {
                    let mut outcomes = outcomes.into_iter();
                    for (_, reply) in batch {
                        let r = outcomes.next().unwrap_or_else(|| {
                            Err(Error::store_fault(
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
                            Error::store_fault(store.backend(), msg.clone(), None)
                        };
                        let _ = reply.send(Err(err));
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn align_moves_to_the_grid_point_before() {
        let t0 = Instant::now();
        let grid = Grid::new(t0, 1000 * MS); // period 500 ms
        // a full wait of one interval snaps to the grid point before it
        assert_eq!(grid.align(t0 + 1730 * MS, t0 + 730 * MS), t0 + 1500 * MS);
        // a point on the grid stays
        assert_eq!(grid.align(t0 + 2000 * MS, t0 + 1000 * MS), t0 + 2000 * MS);
        // never later than asked
        for ms in (0..5000).step_by(37) {
            let at = t0 + ms * MS + 1000 * MS;
            let got = grid.align(at, t0 + ms * MS);
            assert!(got <= at && got >= t0 + ms * MS + 500 * MS, "{ms}: {got:?}");
        }
    }

    #[test]
    fn align_keeps_short_waits() {
        let t0 = Instant::now();
        let grid = Grid::new(t0, 1000 * MS);
        // a wait of 100 ms may not lose more than half of it: the grid point at 500 ms would
        assert_eq!(grid.align(t0 + 560 * MS, t0 + 460 * MS), t0 + 560 * MS);
        // anything before the anchor is left alone
        assert_eq!(grid.align(t0, t0), t0);
    }
}
