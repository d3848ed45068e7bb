//! `lease shards`: join a shard set as one worker and print assignment events.

use std::process::ExitCode;
use std::sync::Arc;

use leasehold::{LeaseKey, OwnerId};
use leasehold_shard::{ShardEvent, ShardSet, ShardSetConfig};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

use crate::{ShardsArgs, exit, print_line, store};

pub(crate) async fn main(args: ShardsArgs) -> ExitCode {
    if let Err(e) = LeaseKey::new(&args.name) {
        return exit::from_error("bad --name", &e);
    }
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("lease: cannot install signal handlers: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let (url, store) = match store::open(args.store.store.as_deref()).await {
        Ok(s) => s,
        Err(e) => return exit::from_error("cannot open the store", &e),
    };
    store::warn_redis_failover(
        &url,
        &LeaseKey::new(&args.name).expect("checked"),
        args.failover.accept_redis_failover,
    );
    if let Err(e) = leasehold::backend::validate_ttl(args.ttl, store.capabilities().min_ttl) {
        return exit::from_error("bad --ttl", &e);
    }
    let shards: Vec<String> = (0..args.shards).map(|i| format!("s{i}")).collect();
    let set = match ShardSet::new(
        Arc::clone(&store),
        &args.name,
        &shards,
        ShardSetConfig::new(args.ttl),
    ) {
        Ok(s) => s,
        Err(e) => return exit::from_error("bad shard set", &e),
    };
    let id = args.worker.clone().unwrap_or_else(default_worker_id);
    let mut worker = match set.join(&id) {
        Ok(w) => w,
        Err(e) => return exit::from_error("bad --worker", &e),
    };
    let out = Printer {
        json: args.json,
        name: args.name.clone(),
        worker: id,
    };
    out.line("joined", None, None, None);
    loop {
        tokio::select! {
            ev = worker.next_event() => match ev {
                Some(ShardEvent::Assigned { shard, token, .. }) => {
                    out.line("assigned", Some(&shard), Some(token.get()), None);
                }
                Some(ShardEvent::Revoked { shard, token, reason }) => {
                    out.line("revoked", Some(&shard), Some(token.get()), Some(&reason.to_string()));
                }
                Some(_) => {}
                None => {
                    eprintln!("lease: the worker ended unexpectedly");
                    return ExitCode::from(exit::SOFTWARE);
                }
            },
            _ = int.recv() => break,
            _ = term.recv() => break,
        }
    }
    let owned = worker.assignment().len();
    worker.leave().await;
    out.line(
        "left",
        None,
        None,
        Some(&format!("released {owned} shard(s)")),
    );
    ExitCode::SUCCESS
}

/// The worker id used when `--worker` is not given: `w-HOST-PID-RANDOM`, unique across hosts
/// and containers (where every `lease` may be PID 1) and a legal key label: the host name is
/// lowercased, every other character becomes `-` (never two in a row), and it is shortened.
pub(crate) fn default_worker_id() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    let label = label_of(&host);
    // Eight hex digits of a random UUID.
    let random: String = OwnerId::random()
        .as_str()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(8)
        .collect();
    let pid = std::process::id();
    if label.is_empty() {
        format!("w-{pid}-{random}")
    } else {
        format!("w-{label}-{pid}-{random}")
    }
}

/// `host` as a key label: lowercase letters and digits, every other run of characters one `-`,
/// at most 32 characters, no `-` at either end.
fn label_of(host: &str) -> String {
    let mut label = String::new();
    for c in host.chars().map(|c| c.to_ascii_lowercase()) {
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if c == '-' && (label.is_empty() || label.ends_with('-')) {
            continue;
        }
        label.push(c);
        if label.len() >= 32 {
            break;
        }
    }
    while label.ends_with('-') {
        label.pop();
    }
    label
}

struct Printer {
    json: bool,
    name: String,
    worker: String,
}

impl Printer {
    fn line(&self, event: &str, shard: Option<&str>, token: Option<u64>, reason: Option<&str>) {
        if self.json {
            let mut v = json!({ "event": event, "name": self.name, "worker": self.worker });
            if let Some(s) = shard {
                v["shard"] = json!(s);
            }
            if let Some(t) = token {
                v["token"] = json!(t);
            }
            if let Some(r) = reason {
                v["reason"] = json!(r);
            }
            let _ = print_line(v);
            return;
        }
        let shard = shard.map(|s| format!(" {s}")).unwrap_or_default();
        let token = token.map(|t| format!(" token {t}")).unwrap_or_default();
        let reason = reason.map(|r| format!(" ({r})")).unwrap_or_default();
        print_out!(
            "{}: {} {event}{shard}{token}{reason}",
            self.name,
            self.worker
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn host_names_become_legal_labels() {
        assert_eq!(label_of("Web_01..Example.COM"), "web-01-example-com");
        assert_eq!(label_of("--x--"), "x");
        assert_eq!(label_of("ÿ"), "");
        assert_eq!(label_of(&"a".repeat(80)).len(), 32);
    }

    /// Two workers started with the default id (as two containers whose `lease` both run as
    /// PID 1 would) must be two different workers, and the id must be accepted by `join`.
    #[tokio::test]
    async fn default_worker_ids_differ_and_are_legal() {
        let a = default_worker_id();
        let b = default_worker_id();
        assert_ne!(a, b);
        let store: Arc<dyn leasehold::LeaseStore> = Arc::new(leasehold::MemoryLeaseStore::new());
        let set = ShardSet::new(
            store,
            "ids",
            &["s0".to_string()],
            ShardSetConfig::new(Duration::from_secs(5)),
        )
        .expect("shard set");
        for id in [a, b] {
            assert!(!id.contains("--"), "{id}");
            let worker = set
                .join(&id)
                .unwrap_or_else(|e| panic!("{id} refused: {e}"));
            worker.leave().await;
        }
    }
}
