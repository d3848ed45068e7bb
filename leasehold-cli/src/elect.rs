//! `lease elect`: join an election and print leadership changes.

use std::process::ExitCode;
use std::time::Duration;

use leasehold::election::{Election, ElectionEvent};
use leasehold::supervisor::SupervisorConfig;
use leasehold::{LeaseKey, OwnerId};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

use crate::{ElectArgs, exit, owner_label, print_line, store};

pub(crate) async fn main(args: ElectArgs) -> ExitCode {
    let key = match LeaseKey::new(&args.name) {
        Ok(k) => k,
        Err(e) => return exit::from_error("bad --name", &e),
    };
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
    store::warn_redis_failover(&url, &key, args.failover.accept_redis_failover);
    if let Err(e) = leasehold::backend::validate_ttl(args.ttl, store.capabilities().min_ttl) {
        return exit::from_error("bad --ttl", &e);
    }
    let id = OwnerId::with_label(&owner_label(args.label.as_deref()));
    let election = Election::from_arc(store, key.clone(), SupervisorConfig::new(args.ttl));
    let mut observer = election.observe();
    let mut me = election.join(id.clone());
    let out = Printer {
        json: args.json,
        name: key.to_string(),
        id: id.to_string(),
    };
    out.line("joined", None, None, None);
    loop {
        tokio::select! {
            event = me.next_event() => match event {
                Some(ElectionEvent::Elected { term, .. }) => {
                    out.line("elected", Some(term.get()), None, None);
                }
                Some(ElectionEvent::SteppedDown { term, reason }) => {
                    out.line("stepped_down", Some(term.get()), Some(&reason.to_string()), None);
                }
                Some(_) => {}
                None => {
                    eprintln!("lease: the election ended unexpectedly");
                    return ExitCode::from(exit::SOFTWARE);
                }
            },
            seen = observer.changed() => {
                if let Some(l) = seen {
                    out.line("leader", l.term.map(|t| t.get()), None, Some(l.leader.as_ref().map(OwnerId::as_str)));
                }
            }
            _ = int.recv() => break,
            _ = term.recv() => break,
        }
    }
    // Print what already happened before leaving (an election may have just been won).
    while let Ok(Some(event)) = tokio::time::timeout(Duration::ZERO, me.next_event()).await {
        match event {
            ElectionEvent::Elected { term, .. } => {
                out.line("elected", Some(term.get()), None, None)
            }
            ElectionEvent::SteppedDown { term, reason } => {
                out.line(
                    "stepped_down",
                    Some(term.get()),
                    Some(&reason.to_string()),
                    None,
                );
            }
            _ => {}
        }
    }
    let was_leader = me.is_leader();
    me.resign().await;
    out.line(
        "resigned",
        None,
        was_leader.then_some("released the lease"),
        None,
    );
    ExitCode::SUCCESS
}

struct Printer {
    json: bool,
    name: String,
    id: String,
}

impl Printer {
    /// One line per event. `leader` is `Some(None)` for "nobody leads".
    fn line(
        &self,
        event: &str,
        term: Option<u64>,
        reason: Option<&str>,
        leader: Option<Option<&str>>,
    ) {
        if self.json {
            let mut v = json!({ "event": event, "name": self.name, "id": self.id });
            if let Some(t) = term {
                v["term"] = json!(t);
            }
            if let Some(r) = reason {
                v["reason"] = json!(r);
            }
            if let Some(l) = leader {
                v["leader"] = json!(l);
            }
            let _ = print_line(v);
            return;
        }
        let term = term.map(|t| format!(" term {t}")).unwrap_or_default();
        match event {
            "leader" => match leader.flatten() {
                Some(l) => print_out!("{}: leader is {l}{term}", self.name),
                None => print_out!("{}: no leader", self.name),
            },
            _ => {
                let reason = reason.map(|r| format!(" ({r})")).unwrap_or_default();
                print_out!("{}: {} {event}{term}{reason}", self.name, self.id);
            }
        }
    }
}
