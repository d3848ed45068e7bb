//! `lease status`: holder, token and time left of each key.

use std::process::ExitCode;

use leasehold::semaphore::Semaphore;
use leasehold::{KeyState, LeaseKey};
use serde_json::json;

use crate::duration::human;
use crate::{StatusArgs, exit, print_line, store};

pub(crate) async fn main(args: StatusArgs) -> ExitCode {
    let mut keys = Vec::with_capacity(args.keys.len());
    for k in &args.keys {
        let key = match LeaseKey::new(k) {
            Ok(k) => k,
            Err(e) => return exit::from_error("bad key", &e),
        };
        match args.limit {
            // The slots of the semaphore KEY (`lease run --limit N`), slot 0 first.
            Some(n) => {
                for slot in 0..n {
                    match Semaphore::slot_key(&key, slot) {
                        Ok(k) => keys.push(k),
                        Err(e) => return exit::from_error("bad key for --limit", &e),
                    }
                }
            }
            None => keys.push(key),
        }
    }
    let (_, store) = match store::open(args.store.store.as_deref()).await {
        Ok(s) => s,
        Err(e) => return exit::from_error("cannot open the store", &e),
    };
    for key in &keys {
        let state = match store.inspect(key).await {
            Ok(s) => s,
            Err(e) => return exit::from_error(&format!("cannot inspect {key}"), &e),
        };
        let printed = if args.json {
            print_line(to_json(&state))
        } else {
            print_line(to_text(&state))
        };
        match printed {
            Ok(()) => {}
            // The reader has gone (`lease status ... | head -1`): it wanted no more.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lease: cannot write to stdout: {e}");
                return ExitCode::from(exit::IOERR);
            }
        }
    }
    ExitCode::SUCCESS
}

fn to_json(state: &KeyState) -> serde_json::Value {
    let last = state.last_token.map(|t| t.get());
    match &state.holder {
        Some(h) => json!({
            "key": state.key.as_str(),
            "held": true,
            "owner": h.owner.as_str(),
            "token": h.token.get(),
            "remaining_ms": u64::try_from(h.remaining.as_millis()).unwrap_or(u64::MAX),
            "ttl_ms": u64::try_from(h.ttl.as_millis()).unwrap_or(u64::MAX),
            "last_token": last,
        }),
        None => json!({
            "key": state.key.as_str(),
            "held": false,
            "last_token": last,
        }),
    }
}

fn to_text(state: &KeyState) -> String {
    match &state.holder {
        Some(h) => format!(
            "{}\theld by {}\ttoken {}\t{} left of {}",
            state.key,
            h.owner,
            h.token,
            human(h.remaining),
            human(h.ttl)
        ),
        None => match state.last_token {
            Some(t) => format!("{}\tfree\tlast token {t}", state.key),
            None => format!("{}\tfree\tnever held", state.key),
        },
    }
}
