//! `lease run --limit N`: run as one of at most N holders of a key (a fenced semaphore, as
//! `consul lock -n` does).
//!
//! The key names a [`Semaphore`] of N permits; the command holds one of its slots
//! (`KEY.lease--permit.0` to `KEY.lease--permit.{N-1}`), and everything after the acquisition
//! (renewal, loss, signals, release) is the plain `lease run` of that slot's lease.

use std::process::ExitCode;
use std::time::Duration;

use leasehold::LeaseKey;
use leasehold::semaphore::{Permit, PermitAcquisition, Semaphore};
use leasehold::supervisor::Supervisor;
use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;

use crate::duration::human;
use crate::exit;
use crate::run::{Signals, stops_waiting};

/// The environment a command run with `--limit` gets besides the slot's `LEASE_KEY` and
/// `LEASE_FENCING_TOKEN`: the semaphore's name, the slot and the limit.
pub(crate) fn env(key: &LeaseKey, permit: &Permit, limit: u32) -> Vec<(&'static str, String)> {
    vec![
        ("LEASE_SEMAPHORE", key.to_string()),
        ("LEASE_SLOT", permit.slot().to_string()),
        ("LEASE_LIMIT", limit.to_string()),
    ]
}

/// Acquires one of `limit` permits of `key` through `sup` (whose configuration carries the
/// wait); SIGINT, SIGTERM, SIGHUP or SIGQUIT cancels the wait. Not acquired in time: `conflict`.
pub(crate) async fn acquire(
    sup: Supervisor,
    key: &LeaseKey,
    limit: u32,
    wait: Duration,
    conflict: u8,
    signals: &mut Signals,
) -> Result<Permit, ExitCode> {
    let sem = match Semaphore::from_supervisor(sup, key, limit) {
        Ok(s) => s,
        Err(e) => return Err(exit::from_error("bad --key or --limit", &e)),
    };
    let cancel = CancellationToken::new();
    let attempt = sem.acquire_until_cancelled(&cancel);
    tokio::pin!(attempt);
    let mut interrupted = None;
    let result = loop {
        tokio::select! {
            r = &mut attempt => break r,
            sig = signals.recv(), if interrupted.is_none() => {
                if stops_waiting(sig) {
                    interrupted = Some(sig);
                    cancel.cancel();
                }
            }
        }
    };
    match result {
        Ok(PermitAcquisition::Acquired(permit)) => Ok(permit),
        Ok(PermitAcquisition::NotAcquired { held, waited }) => {
            let holders: Vec<String> = held
                .iter()
                .map(|h| format!("{} (token {})", h.owner, h.token))
                .collect();
            eprintln!(
                "lease: no permit of {key} (limit {limit}) free{}{}",
                if wait.is_zero() {
                    String::new()
                } else {
                    format!(" within {}", human(waited))
                },
                if holders.is_empty() {
                    String::new()
                } else {
                    format!(": held by {}", holders.join(", "))
                }
            );
            Err(ExitCode::from(conflict))
        }
        Ok(PermitAcquisition::Cancelled) => {
            let sig = interrupted.unwrap_or(Signal::SIGINT);
            eprintln!("lease: interrupted ({sig}) while waiting for a permit of {key}");
            Err(ExitCode::from(exit::signalled(sig as i32)))
        }
        Err(e) => Err(exit::from_error(
            &format!("cannot acquire a permit of {key}"),
            &e,
        )),
    }
}
