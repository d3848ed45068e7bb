//! `lease shards`: join a shard set as one worker and print assignment events.

use std::process::ExitCode;
use std::sync::Arc;

use lease::LeaseKey;
use lease_shard::{ShardEvent, ShardSet, ShardSetConfig};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

use crate::{ShardsArgs, exit, store};

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
    if let Err(e) = lease::backend::validate_ttl(args.ttl, store.capabilities().min_ttl) {
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
    let id = args
        .worker
        .clone()
        .unwrap_or_else(|| format!("w{}", std::process::id()));
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
            println!("{v}");
            return;
        }
        let shard = shard.map(|s| format!(" {s}")).unwrap_or_default();
        let token = token.map(|t| format!(" token {t}")).unwrap_or_default();
        let reason = reason.map(|r| format!(" ({r})")).unwrap_or_default();
        println!(
            "{}: {} {event}{shard}{token}{reason}",
            self.name, self.worker
        );
    }
}
