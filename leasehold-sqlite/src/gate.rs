//! First-come, first-served queues for writers to one database file within this process.
//!
//! SQLite lets one writer in at a time and makes the others poll with growing sleeps (up to
//! 100 ms) in its busy handler, which is not fair: under a stream of writers a renewal can lose
//! the race for the lock again and again until its lease expires. Every store in this process that
//! writes to the same file therefore first waits its turn in fair [`tokio::sync::Mutex`]es and
//! holds the turn only for its one statement or transaction; the busy handler is then only
//! needed against *other* processes. With the turn held, a store writes on its one write
//! connection (its lock is then never contended), so a write costs no pool checkout.
//!
//! Cost when nobody waits: two uncontended `tokio::sync::Mutex` locks for an acquire, one for a
//! renewal or release (an atomic operation each, no hand-off to another thread); measured on
//! the busy 2-core machine, a SQLite round trip to a connection's worker thread takes 30 to
//! 55 µs at the median, and the queue's locks made no difference above that noise.
//!
//! Keeping a lease (renew, release) goes before trying to get one (acquire, fenced writes): those
//! first queue among themselves and only the head of that queue waits for the turn, so a renewal
//! waits for at most the running operation, one queued acquire, and earlier renewals, however
//! many acquirers contend.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The write queues of one database file.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    /// The write turn itself.
    turn: tokio::sync::Mutex<()>,
    /// Where ordinary writers wait before they may queue for the turn.
    ordinary: tokio::sync::Mutex<()>,
}

/// A shared handle on the queues of one file.
pub(crate) type Gate = Arc<Queues>;

/// Holding the write turn (and, for an ordinary writer, the head of the ordinary queue).
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    _turn: tokio::sync::MutexGuard<'a, ()>,
    _ordinary: Option<tokio::sync::MutexGuard<'a, ()>>,
}

impl Queues {
    /// The turn for an operation that keeps a lease (renew, release): queued only behind the
    /// running operation, the head ordinary writer and earlier urgent ones.
    pub(crate) async fn urgent(&self) -> Turn<'_> {
        Turn {
            _turn: self.turn.lock().await,
            _ordinary: None,
        }
    }

    /// The turn for any other write (acquire, fenced writes, migrate).
    pub(crate) async fn ordinary(&self) -> Turn<'_> {
        let ordinary = self.ordinary.lock().await;
        Turn {
            _turn: self.turn.lock().await,
            _ordinary: Some(ordinary),
        }
    }
}

/// The queues for `path`, shared by every store in this process that opened the same file.
pub(crate) fn for_file(path: &Path) -> Gate {
    static GATES: OnceLock<Mutex<HashMap<PathBuf, Weak<Queues>>>> = OnceLock::new();
    let id = identity(path);
    let mut gates = GATES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    gates.retain(|_, g| g.strong_count() > 0);
    if let Some(gate) = gates.get(&id).and_then(Weak::upgrade) {
        return gate;
    }
    let gate = Gate::default();
    gates.insert(id, Arc::downgrade(&gate));
    gate
}

/// The file's absolute path with its directory resolved (symlinks, `.`), so different spellings
/// of one file share one queue. The directory exists (checked at open); the file may not yet.
pub(crate) fn identity(path: &Path) -> PathBuf {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match (std::fs::canonicalize(dir), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal queued behind many acquirers waits for at most the running operation and the
    /// head acquirer.
    #[tokio::test(flavor = "current_thread")]
    async fn urgent_writers_overtake_queued_ordinary_ones() {
        let gate = Gate::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        let running = gate.ordinary().await;
        let mut tasks = Vec::new();
        for i in 0..4 {
            let (gate, order) = (gate.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _t = gate.ordinary().await;
                order.lock().unwrap().push(format!("acquire{i}"));
            }));
            tokio::task::yield_now().await;
        }
        let (g, o) = (gate.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let _t = g.urgent().await;
            o.lock().unwrap().push("renew".to_string());
        }));
        tokio::task::yield_now().await;
        drop(running);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let pos = order.iter().position(|s| s == "renew").unwrap();
        assert!(
            pos <= 1,
            "the renewal waited behind {pos} acquirers: {order:?}"
        );
    }

    #[test]
    fn one_gate_per_file() {
        let dir = std::env::temp_dir();
        let a = for_file(&dir.join("gate-test-a.db"));
        let a2 = for_file(&dir.join(".").join("gate-test-a.db"));
        let b = for_file(&dir.join("gate-test-b.db"));
        assert!(Arc::ptr_eq(&a, &a2));
        assert!(!Arc::ptr_eq(&a, &b));
    }
}
