//! `lease hold KEY`: acquire, print the fencing token, hold (renewing) until a signal, release.

use std::process::ExitCode;

use leasehold::LeaseKey;
use leasehold::supervisor::{Health, Supervisor, SupervisorConfig};
use serde_json::json;

use crate::run::{Signals, acquire, stops_waiting};
use crate::{HoldArgs, events, exit, owner_label, print_line, store};

pub(crate) async fn main(args: HoldArgs) -> ExitCode {
    let key = match LeaseKey::new(&args.key) {
        Ok(k) => k,
        Err(e) => return exit::from_error("bad KEY", &e),
    };
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lease: cannot install signal handlers: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let (url, store) = match store::open(args.store.store.as_deref()).await {
        Ok(s) => s,
        Err(e) => return exit::from_error("cannot open the store", &e),
    };
    store::warn_redis_failover(&url, &key, args.failover.accept_redis_failover);
    let wait = args.wait.wait();
    let owner = store::owner_for(&url, &owner_label(args.label.as_deref()));
    let config = SupervisorConfig::new(args.ttl).with_acquire_wait(wait);
    if let Err(e) = config.validate() {
        return exit::from_error("bad --ttl", &e);
    }
    let sup = Supervisor::from_arc(store.clone(), config).with_owner(owner);
    let guard = match acquire(
        &sup,
        &store,
        &key,
        wait,
        args.wait.conflict_exit_code,
        &mut signals,
    )
    .await
    {
        Ok(g) => g,
        Err(code) => return code,
    };
    let token = guard.token().get();
    let event = |name: &str, extra: Option<(&str, String)>| {
        let mut v = json!({
            "event": name,
            "ts": events::now(),
            "key": key.as_str(),
            "owner": guard.owner().as_str(),
            "token": token,
        });
        if let Some((k, val)) = extra {
            v[k] = json!(val);
        }
        v
    };
    // The token goes out only once the lease is held: a reader may start fenced writes with it.
    let printed = if args.json {
        print_line(event("acquired", None))
    } else {
        print_line(token)
    };
    if let Err(e) = printed {
        // Nobody can learn the token: holding on would only keep the key from others.
        let _ = guard.release().await;
        eprintln!("lease: cannot print the token: {e}");
        return ExitCode::from(exit::IOERR);
    }
    let mut health = guard.subscribe();
    loop {
        tokio::select! {
            sig = signals.recv() => {
                if stops_waiting(sig) {
                    break;
                }
            }
            changed = health.changed() => {
                let now = *health.borrow_and_update();
                match now {
                    Health::Lost(reason) => {
                        if args.json {
                            let _ = print_line(event("lost", Some(("reason", reason.to_string()))));
                        }
                        eprintln!("lease: lost the lease on {key} (token {token}): {reason}");
                        return ExitCode::from(exit::LOST);
                    }
                    Health::AtRisk => {
                        if args.json {
                            let _ = print_line(event("at_risk", None));
                        }
                        eprintln!("lease: warning: renewal of {key} not confirmed; the lease is at risk");
                    }
                    Health::Held if args.json => {
                        let _ = print_line(event("renewed", None));
                    }
                    _ => {}
                }
                if changed.is_err() {
                    eprintln!("lease: the renewal of {key} ended unexpectedly");
                    return ExitCode::from(exit::LOST);
                }
            }
        }
    }
    let lost = matches!(guard.health(), Health::Lost(_));
    let owner = guard.owner().as_str().to_string();
    let released = guard.release().await;
    match released {
        Ok(leasehold::ReleaseOutcome::Released) if !lost => {
            if args.json {
                let _ = print_line(json!({
                    "event": "released", "ts": events::now(), "key": key.as_str(),
                    "owner": owner, "token": token,
                }));
            }
            ExitCode::SUCCESS
        }
        Ok(_) => {
            eprintln!("lease: the lease on {key} (token {token}) was no longer held at release");
            ExitCode::from(exit::LOST)
        }
        Err(e) => exit::from_error(&format!("cannot release {key}"), &e),
    }
}
