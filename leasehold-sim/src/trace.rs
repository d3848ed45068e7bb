//! The event trace of one run: what the server did and what the clients believed, stamped with
//! simulated time. Two runs of one seed produce equal traces (see the `determinism` test).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// The store granted `token` on `key` to `owner`.
    Granted {
        /// The key.
        key: String,
        /// The owner.
        owner: String,
        /// The token.
        token: u64,
    },
    /// The store granted the key to the owner that held it (the contract's same-owner re-grant: a
    /// new, greater token); recorded just before that grant's [`EventKind::Granted`].
    SameOwnerRegrant {
        /// The key.
        key: String,
        /// The owner.
        owner: String,
        /// The token it held.
        old: u64,
        /// The new token.
        new: u64,
    },
    /// The store refused a renewal of a lease it still held (a nemesis: the lease keeps its old
    /// expiry).
    LiveRenewalRefused {
        /// The key.
        key: String,
        /// The token.
        token: u64,
    },
    /// The store answered a renewal.
    RenewAnswered {
        /// The key.
        key: String,
        /// The token.
        token: u64,
        /// Whether it renewed.
        renewed: bool,
    },
    /// The store released a lease.
    ReleasedAt {
        /// The key.
        key: String,
        /// The token.
        token: u64,
    },
    /// The fenced resource accepted a write (`write`) or an install.
    FenceAccepted {
        /// The key.
        key: String,
        /// The token.
        token: u64,
        /// A write (true) or an install (false).
        write: bool,
    },
    /// The fenced resource rejected a stale token.
    FenceRejected {
        /// The key.
        key: String,
        /// The token presented.
        token: u64,
        /// The mark it was below.
        high_water: u64,
    },
    /// The server applied a request and then lost the reply.
    ReplyDropped {
        /// The request id.
        id: u64,
    },
    /// A client believed it held `key` with `token` from `first` to `last` (sampled every tick:
    /// `may_act()` for supervised guards, an uncancelled term for election leaders).
    Belief {
        /// The key.
        key: String,
        /// The token.
        token: u64,
        /// First instant observed.
        first: Duration,
        /// Last instant observed.
        last: Duration,
    },
    /// The host's clock stepped forward by `by` (every timer due in between fired at once).
    ClockStepped {
        /// The size of the step.
        by: Duration,
    },
    /// A client-side outcome worth keeping (acquired, lost, elected, stepped down, ...).
    Client(String),
    /// A network fault was applied or healed.
    Fault(String),
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Simulated time since the start of the run.
    pub at: Duration,
    /// The host that recorded it.
    pub host: String,
    /// What happened.
    pub kind: EventKind,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>10.6}s {:<7} {:?}",
            self.at.as_secs_f64(),
            self.host,
            self.kind
        )
    }
}

/// A shared, append-only trace.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    events: Arc<Mutex<Vec<Event>>>,
}

impl Trace {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `kind` at the current simulated time (zero outside a simulation).
    pub fn record(&self, host: &str, kind: EventKind) {
        let at = turmoil::sim_elapsed().unwrap_or_default();
        self.record_at(at, host, kind);
    }

    /// Records `kind` at `at`.
    pub fn record_at(&self, at: Duration, host: &str, kind: EventKind) {
        self.lock().push(Event {
            at,
            host: host.to_string(),
            kind,
        });
    }

    /// A copy of every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Event>> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }
}
