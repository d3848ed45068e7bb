//! Waking waiters: one registry of watchers per database file in this process, fed by this
//! process's releases (at once) and by a `PRAGMA data_version` poller (commits made by any other
//! connection, including other processes).
//!
//! - **In process.** Every store on one file shares one [`Hub`] (keyed like the write gate, by
//!   the file's resolved path). A successful release wakes the key's watchers right after its
//!   commit; with nobody watching the file that costs one atomic load.
//! - **Other connections.** While the file has watchers, one task polls `PRAGMA data_version`
//!   on a dedicated connection. The value changes when *another* connection commits (this
//!   process's own pool connections included). On a change the task asks which watched keys are
//!   free now ([`protocol::FREE_KEYS`], one read) and wakes their watchers: renewals and grants by
//!   others wake nobody. The task stops when the last watch is dropped, and being a plain task
//!   on the runtime, never holds a runtime's shutdown up.
//! - **Expiry** is not a commit and wakes nobody: a waiter times its next attempt to the
//!   holder's expiry itself (the supervisor does).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use leasehold_core::{KeyWatch, LeaseKey, Result};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection, Row};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{self, BACKEND};
use crate::protocol;

/// The watchers of one database file in this process.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    /// Registered watches; read without the lock on every release.
    watchers: AtomicUsize,
    state: Mutex<State>,
    /// Poller tasks alive (0 or 1; briefly more while an aborted one is being dropped).
    pollers: Arc<AtomicUsize>,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<String, Slot>,
    poller: Option<JoinHandle<()>>,
}

/// The watchers of one key: a counter bumped on every hint.
#[derive(Debug)]
struct Slot {
    tx: watch::Sender<u64>,
    watchers: usize,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hints the watchers of `key`, if any. O(1); no lock when the file has no watchers.
    pub(crate) fn wake(&self, key: &str) {
        if self.watchers.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(slot) = self.lock().keys.get(key) {
            slot.tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn wake_all(&self) {
        for slot in self.lock().keys.values() {
            slot.tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn watched_keys(&self) -> Vec<String> {
        self.lock().keys.keys().cloned().collect()
    }

    /// Poller tasks alive for this file.
    #[cfg(test)]
    pub(crate) fn pollers(&self) -> usize {
        self.pollers.load(Ordering::SeqCst)
    }

    /// Registers a watch of `key`, starting the file's poller if none runs. When a poller has to
    /// be started, its connection is opened and its first `data_version` read before this
    /// returns, so no commit after the return is missed.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        key: &LeaseKey,
        connect: &SqliteConnectOptions,
        interval: Duration,
        busy: Duration,
    ) -> Result<KeyWatch> {
        let mut baseline = None;
        loop {
            {
                let mut state = self.lock();
                let running = state.poller.as_ref().is_some_and(|p| !p.is_finished());
                if running || baseline.is_some() {
                    if !running && let Some((conn, version)) = baseline.take() {
                        let hub = Arc::downgrade(self);
                        let alive = Alive::new(self.pollers.clone());
                        let opts = connect.clone();
                        state.poller = Some(tokio::spawn(poll(
                            hub, conn, version, opts, interval, alive,
                        )));
                    }
                    let slot = state
                        .keys
                        .entry(key.as_str().to_string())
                        .or_insert_with(|| Slot {
                            tx: watch::channel(0).0,
                            watchers: 0,
                        });
                    slot.watchers += 1;
                    let rx = slot.tx.subscribe();
                    self.watchers.fetch_add(1, Ordering::SeqCst);
                    let registration = Registration {
                        hub: self.clone(),
                        key: key.as_str().to_string(),
                    };
                    return Ok(stream(rx, registration));
                }
            }
            // A racing subscriber may start a poller meanwhile; ours is then dropped unused.
            baseline = Some(
                open(connect)
                    .await
                    .map_err(|e| error::map("watch", e, busy))?,
            );
        }
    }
}

/// The hub of `path`, shared by every store in this process that opened the same file.
pub(crate) fn for_file(path: &Path) -> Arc<Hub> {
    static HUBS: OnceLock<Mutex<HashMap<PathBuf, Weak<Hub>>>> = OnceLock::new();
    let id = crate::gate::identity(path);
    let mut hubs = HUBS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    hubs.retain(|_, h| h.strong_count() > 0);
    if let Some(hub) = hubs.get(&id).and_then(Weak::upgrade) {
        return hub;
    }
    let hub = Arc::new(Hub::default());
    hubs.insert(id, Arc::downgrade(&hub));
    hub
}

/// One live watch; dropping it unregisters, and the last one stops the poller.
#[derive(Debug)]
struct Registration {
    hub: Arc<Hub>,
    key: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.hub.lock();
        if let Some(slot) = state.keys.get_mut(&self.key) {
            slot.watchers = slot.watchers.saturating_sub(1);
            if slot.watchers == 0 {
                state.keys.remove(&self.key);
            }
        }
        if self.hub.watchers.fetch_sub(1, Ordering::SeqCst) == 1
            && let Some(poller) = state.poller.take()
        {
            poller.abort();
        }
    }
}

fn stream(rx: watch::Receiver<u64>, registration: Registration) -> KeyWatch {
    let hints = futures::stream::unfold((rx, registration), |(mut rx, reg)| async move {
        match rx.changed().await {
            Ok(()) => Some((Ok(()), (rx, reg))),
            Err(_) => None,
        }
    });
    KeyWatch::new(Box::pin(hints))
}

/// Counts a live poller task; dropped with the task however it ends (return, abort, runtime
/// shutdown).
#[derive(Debug)]
struct Alive(Arc<AtomicUsize>);

impl Alive {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Alive(count)
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Opens the poller's connection and reads its first `data_version`.
async fn open(connect: &SqliteConnectOptions) -> sqlx::Result<(SqliteConnection, i64)> {
    let mut conn = SqliteConnection::connect_with(connect).await?;
    let version = data_version(&mut conn).await?;
    Ok((conn, version))
}

async fn data_version(conn: &mut SqliteConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar(protocol::DATA_VERSION)
        .fetch_one(&mut *conn)
        .await
}

/// Which of `keys` have no unexpired holder now.
async fn free_keys(conn: &mut SqliteConnection, keys: &[String]) -> sqlx::Result<Vec<String>> {
    let rows = sqlx::query(protocol::FREE_KEYS)
        .bind(json_array(keys.iter().map(String::as_str)))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(|r| r.try_get(0)).collect()
}

/// A JSON array of strings. Keys are DNS-1123 names; quotes and backslashes are escaped all the
/// same.
pub(crate) fn json_array<'a>(keys: impl ExactSizeIterator<Item = &'a str>) -> String {
    let mut out = String::with_capacity(2 + keys.len() * 24);
    out.push('[');
    for (i, k) in keys.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        for c in k.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
    out.push(']');
    out
}

/// The poller: every `interval`, `PRAGMA data_version`; on a change, wake the watchers of the
/// watched keys that are free. On a failure, wake every watcher (they look again and see the
/// failure themselves) and reconnect at the next tick, waking everyone again once reconnected
/// (commits in between were not seen). Ends when the hub is gone or has no watchers.
async fn poll(
    hub: Weak<Hub>,
    conn: SqliteConnection,
    mut last: i64,
    connect: SqliteConnectOptions,
    interval: Duration,
    _alive: Alive,
) {
    let mut conn = Some(conn);
    loop {
        tokio::time::sleep(interval).await;
        let Some(hub) = hub.upgrade() else { return };
        if hub.watchers.load(Ordering::SeqCst) == 0 {
            return;
        }
        let Some(c) = conn.as_mut() else {
            if let Ok((c, version)) = open(&connect).await {
                conn = Some(c);
                last = version;
                hub.wake_all();
            }
            continue;
        };
        let changed = match data_version(c).await {
            Ok(v) if v == last => continue,
            Ok(v) => {
                last = v;
                // The keys are read after the version, so a watch registered later started its
                // own look after this commit.
                let keys = hub.watched_keys();
                free_keys(c, &keys).await
            }
            Err(e) => Err(e),
        };
        match changed {
            Ok(free) => {
                for key in &free {
                    hub.wake(key);
                }
            }
            Err(e) => {
                tracing::warn!(backend = BACKEND, error = %e, "data_version poll failed; waking every watcher and reconnecting");
                conn = None;
                hub.wake_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SqliteLeaseStore;
    use leasehold_core::LeaseStore;
    use tokio::time::Instant;

    /// A test directory, removed when dropped.
    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A fresh database file under the system's temporary directory (removed with the guard).
    fn fresh_file(name: &str) -> (TempDir, PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-sqlite-watch-unit-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test directory");
        let file = dir.join("leases.db");
        (TempDir(dir), file)
    }

    /// Waits (bounded) until the file has `n` poller tasks alive.
    async fn pollers_become(hub: &Hub, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while hub.pollers() != n {
            assert!(
                Instant::now() < deadline,
                "{} pollers alive, expected {n}",
                hub.pollers()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// One poller per file however many watches and stores; it stops when the last watch is
    /// dropped, and a later watch starts a new one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_poller_per_file_while_watched() -> Result<()> {
        let (_dir, path) = fresh_file("lifecycle");
        let a = SqliteLeaseStore::open(&path).await?;
        let b = SqliteLeaseStore::open(&path).await?;
        let hub = a.hub().clone();
        assert!(Arc::ptr_eq(&hub, b.hub()), "two hubs for one file");
        assert_eq!(hub.pollers(), 0, "a poller without watchers");
        let (k1, k2) = (LeaseKey::new("one")?, LeaseKey::new("two")?);
        let w1 = a.watch(&k1).await?.expect("watch is on");
        let w2 = b.watch(&k2).await?.expect("watch is on");
        let w3 = b.watch(&k1).await?.expect("watch is on");
        assert_eq!(hub.pollers(), 1);
        drop(w1);
        drop(w3);
        assert_eq!(hub.pollers(), 1, "the poller stopped while a watch remains");
        drop(w2);
        pollers_become(&hub, 0).await;
        assert!(hub.lock().keys.is_empty(), "key slots left behind");
        let w4 = a.watch(&k2).await?.expect("watch is on");
        assert_eq!(hub.pollers(), 1, "no poller for a new watch");
        drop(w4);
        pollers_become(&hub, 0).await;
        Ok(())
    }

    /// A live watch (and its poller) does not hold up the runtime's shutdown, and the poller
    /// dies with the runtime; a watch on a new runtime starts a new one.
    #[test]
    fn a_watch_does_not_hold_up_runtime_shutdown() -> Result<()> {
        let (_dir, path) = fresh_file("shutdown");
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let kept = rt.block_on(async {
                let store = SqliteLeaseStore::open(&p).await?;
                let w = store.watch(&LeaseKey::new("k")?).await?;
                Ok::<_, leasehold_core::Error>((store, w))
            });
            drop(rt);
            let _ = tx.send(kept);
        });
        let (store, watch) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the runtime did not shut down within 10 s")?;
        assert!(watch.is_some());
        assert_eq!(store.hub().pollers(), 0, "the poller outlived its runtime");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let _w = store.watch(&LeaseKey::new("k")?).await?;
            assert_eq!(store.hub().pollers(), 1, "no poller on the new runtime");
            Ok::<_, leasehold_core::Error>(())
        })?;
        Ok(())
    }

    #[test]
    fn json_arrays_escape() {
        assert_eq!(json_array(std::iter::empty()), "[]");
        assert_eq!(json_array(["a", "b\"\\"].into_iter()), r#"["a","b\"\\"]"#);
    }
}
