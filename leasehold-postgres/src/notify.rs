//! Release notifications: `LISTEN`/`NOTIFY` on one channel per lease table, fanned out to
//! per-key [`KeyWatch`]es.
//!
//! - A successful release runs `pg_notify(<channel>, <key>)` in its own statement (see
//!   `Statements::release_notify`) when an acquire of the key was refused since the last
//!   notification, so the notification is sent exactly when the transaction that freed the key
//!   commits, and only if someone waits.
//! - Each store (all its clones) has at most one listener: a [`PgListener`] on its own
//!   connection (`application_name = leasehold-postgres-listener`), started by the first
//!   [`watch`](leasehold_core::LeaseStore::watch) and `LISTEN`ing before that call returns. A task
//!   reads it and wakes the watchers of the notified key only (a map from key to senders).
//! - A release notifies only a marked row (library layout, ADR 0017). A refused acquire marks
//!   it; so does a watch that is about to wait: the first time a [`KeyWatch`] is polled with no
//!   hint pending, and again after each hint it delivered, it runs `Statements::arm_watch`
//!   (`UPDATE .. SET wake = 1`, one round trip). If that finds the key free (released before
//!   the mark, so no notification will come for it), the watch yields a hint at once, unless it
//!   already reported that same free state. A watch that is never polled (an acquire granted at
//!   the first attempt) sends nothing.
//! - **A lost connection is never papered over**: the listener does not reconnect by itself.
//!   When its connection breaks, the task closes the hub and every open watch ends (its stream
//!   returns `None`), so waiters fall back to polling; the next `watch` starts a new listener.
//! - The task stops when the connection breaks, when no watch has been open for
//!   [`LINGER`], or when the last store clone and the last watch are gone (it holds only a
//!   `Weak`), so it never keeps a runtime alive.

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use futures::future::BoxFuture;
use leasehold_core::{KeyWatch, LeaseKey};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::client::Client;
use crate::config::TableName;
use crate::error::{BACKEND, PgError};
use crate::inspect::column;

/// The `application_name` of listener connections.
pub(crate) const LISTENER_APP: &str = "leasehold-postgres-listener";

/// How long a listener with no open watch stays connected before it stops.
pub(crate) const LINGER: Duration = Duration::from_secs(30);

/// The watch machinery of one store, shared by its clones.
pub(crate) struct Notifier {
    channel: String,
    /// The current hub; replaced when it has closed.
    current: Mutex<Option<Arc<Hub>>>,
    /// Held while a listener starts, so that concurrent first watches start one.
    starting: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Notifier {
    pub(crate) fn new(table: &TableName) -> Self {
        Notifier {
            channel: table.notify_channel(),
            current: Mutex::new(None),
            starting: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Subscribes to `key`, starting the listener if none is running. When this returns, the
    /// listener is `LISTEN`ing, so every notification committed from now on reaches the watch
    /// (or the watch ends); the watch marks the row itself before it waits (module docs).
    /// Cancel safe: a half-started listener is dropped.
    pub(crate) async fn watch(
        &self,
        client: &Arc<Client>,
        key: &LeaseKey,
    ) -> Result<KeyWatch, PgError> {
        let arm = client.sql.arm_watch.is_some().then(|| Arm {
            client: Arc::clone(client),
            needed: true,
            last_free: None,
            running: None,
        });
        if let Some(sub) = self.subscribe(key) {
            return Ok(KeyWatch::new(Box::pin(sub.with_arm(arm))));
        }
        let _starting = self.starting.lock().await;
        if let Some(sub) = self.subscribe(key) {
            // another watch() started one meanwhile
            return Ok(KeyWatch::new(Box::pin(sub.with_arm(arm))));
        }
        let hub = self
            .start(&client.pool, client.options.op_timeout())
            .await?;
        let sub = Hub::subscribe(&hub, key).ok_or_else(|| {
            PgError::Sql(sqlx::Error::Protocol(
                "the new listener closed at once".into(),
            ))
        })?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(hub);
        Ok(KeyWatch::new(Box::pin(sub.with_arm(arm))))
    }

    /// A subscription on the current hub, if it is open.
    fn subscribe(&self, key: &LeaseKey) -> Option<Subscription> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.as_ref().and_then(|hub| Hub::subscribe(hub, key))
    }

    /// The number of open watches.
    pub(crate) fn open_watches(&self) -> usize {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.as_ref().map_or(0, |h| h.lock().count)
    }

    async fn start(&self, pool: &PgPool, within: Duration) -> Result<Arc<Hub>, PgError> {
        let options = (*pool.connect_options())
            .clone()
            .application_name(LISTENER_APP);
        let listener = async {
            // A pool of one connection, only because PgListener needs one. No reaper task, no
            // reconnects: a broken connection ends the listener (see the module docs).
            let own = PgPoolOptions::new()
                .max_connections(1)
                .min_connections(0)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(within)
                .connect_lazy_with(options);
            let mut listener = PgListener::connect_with(&own).await?;
            listener.eager_reconnect(false);
            listener.ignore_pool_close_event(true);
            listener.listen(&self.channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let listener = match tokio::time::timeout(within, listener).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Err(PgError::Sql(e)),
            Err(_) => return Err(PgError::TimedOut("watch", within)),
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let hub = Arc::new(Hub {
            subs: Mutex::new(Subs {
                closed: false,
                next_id: 0,
                count: 0,
                idle_since: Instant::now(),
                by_key: HashMap::new(),
            }),
            _stop: stop_tx,
        });
        tokio::spawn(run(listener, Arc::downgrade(&hub), stop_rx));
        tracing::debug!(backend = BACKEND, channel = %self.channel, "listener started");
        Ok(hub)
    }
}

/// The subscribers of one listener connection.
struct Hub {
    subs: Mutex<Subs>,
    /// Dropped with the hub: tells the task to stop.
    _stop: oneshot::Sender<()>,
}

struct Subs {
    /// The listener has stopped: no new subscribers; existing ones were ended.
    closed: bool,
    next_id: u64,
    count: usize,
    /// When `count` last became zero.
    idle_since: Instant,
    by_key: HashMap<String, Vec<(u64, mpsc::Sender<()>)>>,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, Subs> {
        self.subs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A subscription to `key`, or `None` if the hub has closed.
    fn subscribe(hub: &Arc<Hub>, key: &LeaseKey) -> Option<Subscription> {
        let mut subs = hub.lock();
        if subs.closed {
            return None;
        }
        let id = subs.next_id;
        subs.next_id += 1;
        subs.count += 1;
        // Capacity one: hints coalesce, a pending hint is as good as many.
        let (tx, rx) = mpsc::channel(1);
        subs.by_key
            .entry(key.as_str().to_string())
            .or_default()
            .push((id, tx));
        Some(Subscription {
            rx,
            hub: Arc::clone(hub),
            key: key.as_str().to_string(),
            id,
            arm: None,
        })
    }

    /// Wakes the watchers of `key` (O(watchers of that key)).
    fn hint(&self, key: &str) {
        let subs = self.lock();
        if let Some(list) = subs.by_key.get(key) {
            for (_, tx) in list {
                let _ = tx.try_send(());
            }
        }
    }

    fn unsubscribe(&self, key: &str, id: u64) {
        let mut subs = self.lock();
        if subs.closed {
            return;
        }
        if let Some(list) = subs.by_key.get_mut(key) {
            let before = list.len();
            list.retain(|(i, _)| *i != id);
            let removed = before - list.len();
            if list.is_empty() {
                subs.by_key.remove(key);
            }
            subs.count -= removed;
            if subs.count == 0 {
                subs.idle_since = Instant::now();
            }
        }
    }

    /// Ends every watch (their senders are dropped) and refuses new ones.
    fn close(&self) {
        let mut subs = self.lock();
        subs.closed = true;
        subs.count = 0;
        subs.by_key.clear();
    }

    /// Closes the hub if no watch has been open for `linger`.
    fn close_if_idle(&self, linger: Duration) -> bool {
        let mut subs = self.lock();
        if subs.count == 0 && subs.idle_since.elapsed() >= linger {
            subs.closed = true;
            true
        } else {
            false
        }
    }
}

/// Reads the listener until its connection breaks, the hub is gone or idle.
async fn run(mut listener: PgListener, hub: Weak<Hub>, mut stop: oneshot::Receiver<()>) {
    let idle = {
        let hub = hub.clone();
        async move {
            loop {
                tokio::time::sleep(LINGER / 4).await;
                match hub.upgrade() {
                    Some(h) if !h.close_if_idle(LINGER) => {}
                    _ => return,
                }
            }
        }
    };
    tokio::pin!(idle);
    // Only the `try_recv` branch continues the loop; the others end the listener, so a
    // cancelled `try_recv` is never resumed.
    let why = loop {
        tokio::select! {
            _ = &mut stop => break "no store and no watch left",
            () = &mut idle => break "idle",
            r = listener.try_recv() => match r {
                Ok(Some(n)) => match hub.upgrade() {
                    Some(h) => h.hint(n.payload()),
                    None => break "no store and no watch left",
                },
                Ok(None) => break "connection lost",
                Err(e) => {
                    tracing::warn!(backend = BACKEND, error = %e, "listener failed; open watches end");
                    break "connection failed";
                }
            },
        }
    };
    if let Some(h) = hub.upgrade() {
        h.close();
    }
    tracing::debug!(backend = BACKEND, reason = why, "listener stopped");
}

/// One watch: the receiving end of a key's hints. Unsubscribes when dropped.
struct Subscription {
    rx: mpsc::Receiver<()>,
    hub: Arc<Hub>,
    key: String,
    id: u64,
    /// Marks the row before waiting (library layout); `None` where every release notifies.
    arm: Option<Arm>,
}

/// What the row looked like when a watch marked it.
enum Seen {
    /// Held: the mark is on the row, the release will notify.
    Held,
    /// Free (released or expired), with its last token; `None`: no row (nothing to mark).
    Free(Option<i64>),
}

/// The marking state of one watch.
struct Arm {
    client: Arc<Client>,
    /// The row must be marked before the next wait: at the start, and after each hint.
    needed: bool,
    /// The free state last reported by a hint of the mark itself (so that a key that stays
    /// free does not wake its watcher again and again).
    last_free: Option<Option<i64>>,
    /// The mark in flight: a task of its own, so that it finishes (and returns its pooled
    /// connection) even when the watch is not polled again soon; aborted if the watch is dropped.
    running: Option<tokio::task::JoinHandle<leasehold_core::Result<Seen>>>,
}

impl Drop for Arm {
    fn drop(&mut self) {
        if let Some(task) = self.running.take() {
            task.abort();
        }
    }
}

impl Arm {
    fn mark(client: Arc<Client>, key: String) -> BoxFuture<'static, leasehold_core::Result<Seen>> {
        Box::pin(async move {
            let Some(sql) = client.sql.arm_watch.as_deref() else {
                return Ok(Seen::Held);
            };
            let row = client
                .query("watch", async |conn| {
                    sqlx::query(AssertSqlSafe(sql))
                        .bind(key.as_str())
                        .fetch_optional(&mut *conn)
                        .await
                })
                .await?;
            let Some(row) = row else {
                return Ok(Seen::Free(None));
            };
            let operation = "watch";
            let cx = client.cx();
            let token: i64 = column(&row, "fencing_token", operation, cx)?;
            let held: bool = column(&row, "held", operation, cx)?;
            Ok(if held {
                Seen::Held
            } else {
                Seen::Free(Some(token))
            })
        })
    }
}

impl Subscription {
    fn with_arm(mut self, arm: Option<Arm>) -> Self {
        self.arm = arm;
        self
    }
}

impl Stream for Subscription {
    type Item = leasehold_core::Result<()>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(())) => {
                if let Some(arm) = this.arm.as_mut() {
                    // The release consumed the mark: mark again before the next wait. A mark
                    // still in flight is left to finish (its answer is not needed).
                    arm.needed = true;
                    arm.running = None;
                }
                return Poll::Ready(Some(Ok(())));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        let Some(arm) = this.arm.as_mut() else {
            return Poll::Pending;
        };
        if !arm.needed {
            return Poll::Pending;
        }
        let running = arm.running.get_or_insert_with(|| {
            tokio::spawn(Arm::mark(Arc::clone(&arm.client), this.key.clone()))
        });
        let seen = match Pin::new(running).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(r)) => r,
            Poll::Ready(Err(e)) => Err(leasehold_core::Error::unavailable(
                BACKEND,
                format!("watch: marking the row failed: {e}"),
                None,
            )),
        };
        arm.running = None;
        arm.needed = false;
        match seen {
            Err(e) => Poll::Ready(Some(Err(e))),
            Ok(Seen::Held) => Poll::Pending, // `rx` holds the waker
            Ok(Seen::Free(token)) => {
                if arm.last_free == Some(token) {
                    Poll::Pending
                } else {
                    // Freed before the mark: no notification will say so.
                    arm.last_free = Some(token);
                    Poll::Ready(Some(Ok(())))
                }
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.unsubscribe(&self.key, self.id);
    }
}
