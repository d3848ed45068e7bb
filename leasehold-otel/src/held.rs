//! The leases a supervisor currently holds, for `lease.held` and `lease.since_last_renewal`.

use std::collections::HashMap;
use std::sync::Mutex;

use leasehold_core::{FencingToken, Lease, LeaseKey, OwnerId};
use tokio::time::Instant;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HeldId {
    backend: &'static str,
    key: LeaseKey,
    owner: OwnerId,
    token: FencingToken,
}

impl HeldId {
    fn new(backend: &'static str, lease: &Lease) -> Self {
        HeldId {
            backend,
            key: lease.key().clone(),
            owner: lease.owner().clone(),
            token: lease.token(),
        }
    }
}

#[derive(Debug)]
struct Entry {
    /// When the grant or the last renewal was confirmed (tokio's clock of `clock`).
    last_confirmed: Instant,
    /// The lease's local validity deadline after that confirmation.
    deadline: Instant,
    /// The runtime whose clock `last_confirmed` comes from. The gauge callback runs on the
    /// metric reader's thread, outside any runtime; entering this handle reads the same clock
    /// (which matters when the runtime's time is paused, as in tests).
    clock: Option<tokio::runtime::Handle>,
}

impl Entry {
    fn now(lease: &Lease) -> Self {
        Entry {
            last_confirmed: Instant::now(),
            deadline: lease.deadline(),
            clock: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// Now, on the clock the entry was recorded with.
    fn clock_now(&self) -> Instant {
        match &self.clock {
            Some(handle) => {
                let _entered = handle.enter();
                Instant::now()
            }
            None => Instant::now(),
        }
    }
}

/// How long past its local deadline an entry that never ended is kept. The supervisor reports
/// every loss *before* the deadline, so an entry still here after it was orphaned: the
/// supervisor called `acquired` but never started the guard (a fence install that failed).
const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// One gauge observation: backend, key (if keys are attributes) and seconds.
pub(crate) type Observation = (&'static str, Option<LeaseKey>, f64);

/// The held leases of one [`LeaseMetrics`](crate::LeaseMetrics).
#[derive(Debug, Default)]
pub(crate) struct HeldLeases {
    map: Mutex<HashMap<HeldId, Entry>>,
}

impl HeldLeases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<HeldId, Entry>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a new grant; `true` if it was not known yet.
    pub(crate) fn insert(&self, backend: &'static str, lease: &Lease) -> bool {
        self.lock()
            .insert(HeldId::new(backend, lease), Entry::now(lease))
            .is_none()
    }

    /// Records a confirmed renewal of a known lease.
    pub(crate) fn confirmed(&self, backend: &'static str, lease: &Lease) {
        if let Some(e) = self.lock().get_mut(&HeldId::new(backend, lease)) {
            *e = Entry::now(lease);
        }
    }

    /// Forgets a lease; `true` if it was known.
    pub(crate) fn remove(&self, backend: &'static str, lease: &Lease) -> bool {
        self.lock().remove(&HeldId::new(backend, lease)).is_some()
    }

    /// The largest time since the last confirmation per backend (and key, if `by_key`).
    /// Orphaned entries (see [`ORPHAN_GRACE`]) are dropped and passed to `orphaned`.
    pub(crate) fn observe(
        &self,
        by_key: bool,
        mut orphaned: impl FnMut(&'static str, &LeaseKey),
    ) -> Vec<Observation> {
        let mut out: HashMap<(&'static str, Option<LeaseKey>), f64> = HashMap::new();
        let mut map = self.lock();
        map.retain(|id, entry| {
            let live = entry.clock_now() < entry.deadline + ORPHAN_GRACE;
            if !live {
                orphaned(id.backend, &id.key);
            }
            live
        });
        for (id, entry) in map.iter() {
            let key = by_key.then(|| id.key.clone());
            let secs = entry
                .clock_now()
                .saturating_duration_since(entry.last_confirmed)
                .as_secs_f64();
            let slot = out.entry((id.backend, key)).or_insert(secs);
            if secs > *slot {
                *slot = secs;
            }
        }
        out.into_iter().map(|((b, k), s)| (b, k, s)).collect()
    }
}
