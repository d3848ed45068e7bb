//! A first-come, first-served queue for writers to one database file within this process.
//!
//! SQLite lets one writer in at a time and makes the others poll with growing sleeps (up to
//! 100 ms) in its busy handler, which is not fair: under a stream of writers a renewal can lose
//! the race for the lock again and again until its lease expires. Every store in this process that
//! writes to the same file therefore first waits in one FIFO queue (a fair
//! [`tokio::sync::Mutex`]) and holds it only for its one statement or transaction; the busy
//! handler is then only needed against *other* processes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The write queue of one database file.
pub(crate) type Gate = Arc<tokio::sync::Mutex<()>>;

/// The queue for `path`, shared by every store in this process that opened the same file.
pub(crate) fn for_file(path: &Path) -> Gate {
    static GATES: OnceLock<Mutex<HashMap<PathBuf, Weak<tokio::sync::Mutex<()>>>>> = OnceLock::new();
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
fn identity(path: &Path) -> PathBuf {
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
