//! Health and leadership gating: a probe for a lease holder or an election candidate
//! ([`HealthCheck`], served by [`HealthService`]), and a layer that serves only while this
//! process leads ([`LeaderGateLayer`](crate::LeaderGateLayer), in `gate.rs`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::{Ready, ready};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use leasehold_core::election::{Candidate, Election, Role};
use leasehold_core::hook::{Hook, RenewalResult};
use leasehold_core::supervisor::{Health, LeaseGuardView};
use leasehold_core::{FencingToken, Lease, LeaseKey, OwnerId, ReleaseOutcome};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tower_service::Service;

/// The response header of [`LeaderGateLayer`](crate::LeaderGateLayer)'s `503`: the identity of the current leader
/// (absent when nobody leads).
pub const LEASE_LEADER: http::HeaderName = http::HeaderName::from_static("lease-leader");

/// Remembers, for every lease an [`Election`]'s candidates hold in this process, its latest
/// deadline and health, so that a [`HealthCheck`] of a candidate can tell a leader that renews
/// from one whose renewal has stalled.
///
/// Install it as the election's hook (`election.with_hook(tracker.hook())`); to keep another
/// hook (metrics, audit), wrap it: [`LeaderTracker::wrapping`]. A lease's record is dropped when
/// the lease ends, so the tracker holds one record per lease held now.
#[derive(Debug, Clone, Default)]
pub struct LeaderTracker {
    inner: Arc<Tracker>,
}

#[derive(Debug, Default)]
struct Tracker {
    records: Mutex<HashMap<(LeaseKey, OwnerId), Record>>,
    next: Option<Arc<dyn Hook>>,
}

#[derive(Debug, Clone)]
struct Record {
    token: FencingToken,
    deadline: Instant,
    health: Health,
}

impl LeaderTracker {
    /// A tracker that reports to no other hook.
    pub fn new() -> Self {
        Self::default()
    }

    /// A tracker that passes every call on to `next` as well (after recording).
    pub fn wrapping(next: Arc<dyn Hook>) -> Self {
        LeaderTracker {
            inner: Arc::new(Tracker {
                records: Mutex::default(),
                next: Some(next),
            }),
        }
    }

    /// The tracker as a hook for [`Election::with_hook`] (or
    /// [`Supervisor::with_hook`](leasehold_core::supervisor::Supervisor::with_hook)).
    pub fn hook(&self) -> Arc<dyn Hook> {
        self.inner.clone()
    }

    /// A health check of `candidate` in `election` (whose hook is this tracker): healthy while
    /// it follows, and while it leads and its lease's local deadline (plus the check's
    /// tolerance) has not passed without a confirmed renewal.
    pub fn check(&self, election: &Election, candidate: &Candidate) -> HealthCheck {
        HealthCheck::new(Source::Candidate {
            key: election.key().clone(),
            owner: candidate.owner().clone(),
            id: candidate.id().clone(),
            role: candidate.subscribe(),
            tracker: self.clone(),
        })
    }

    fn record(&self, key: &LeaseKey, owner: &OwnerId) -> Option<Record> {
        self.inner
            .records()
            .get(&(key.clone(), owner.clone()))
            .cloned()
    }
}

impl Tracker {
    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<(LeaseKey, OwnerId), Record>> {
        // Each update replaces one whole record: a panic elsewhere cannot leave one torn.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn put(&self, lease: &Lease, health: Option<Health>) {
        let mut records = self.records();
        let entry = records
            .entry((lease.key().clone(), lease.owner().clone()))
            .or_insert(Record {
                token: lease.token(),
                deadline: lease.deadline(),
                health: Health::Held,
            });
        if entry.token != lease.token() {
            *entry = Record {
                token: lease.token(),
                deadline: lease.deadline(),
                health: Health::Held,
            };
        }
        entry.deadline = entry.deadline.max(lease.deadline());
        if let Some(h) = health {
            entry.health = h;
        }
    }
}

impl Hook for Tracker {
    fn acquired(&self, lease: &Lease, waited: Duration) {
        self.put(lease, Some(Health::Held));
        if let Some(n) = &self.next {
            n.acquired(lease, waited);
        }
    }
    fn not_acquired(&self, key: &LeaseKey, waited: Duration) {
        if let Some(n) = &self.next {
            n.not_acquired(key, waited);
        }
    }
    fn renewal(&self, lease: &Lease, result: RenewalResult, latency: Duration) {
        if matches!(result, RenewalResult::Confirmed { .. }) {
            self.put(lease, None);
        }
        if let Some(n) = &self.next {
            n.renewal(lease, result, latency);
        }
    }
    fn health_changed(&self, lease: &Lease, from: Health, to: Health) {
        self.put(lease, Some(to));
        if let Some(n) = &self.next {
            n.health_changed(lease, from, to);
        }
    }
    fn ended(&self, lease: &Lease, held_for: Duration, released: Option<ReleaseOutcome>) {
        let mut records = self.records();
        let k = (lease.key().clone(), lease.owner().clone());
        if records.get(&k).is_some_and(|r| r.token == lease.token()) {
            records.remove(&k);
        }
        drop(records);
        if let Some(n) = &self.next {
            n.ended(lease, held_for, released);
        }
    }
    fn leadership(&self, key: &LeaseKey, candidate: &OwnerId, term: Option<FencingToken>) {
        if let Some(n) = &self.next {
            n.leadership(key, candidate, term);
        }
    }
}

/// What a [`HealthCheck`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// Whether the probe passes.
    pub healthy: bool,
    /// The state in one word: `held`, `at_risk`, `stalled`, `lost`, `released` (holder);
    /// `follower`, `leader`, `at_risk`, `stalled` (candidate); `not_leading` when the check
    /// requires leading and this process does not lead.
    pub state: &'static str,
    /// The key of the lease or election.
    pub key: LeaseKey,
    /// The fencing token (the term of a leader), when a lease is held.
    pub token: Option<FencingToken>,
    /// What the state means, in words.
    pub detail: String,
}

impl HealthReport {
    /// The report as a JSON object (`healthy`, `state`, `key`, `token`, `detail`).
    pub fn to_json(&self) -> Value {
        json!({
            "healthy": self.healthy,
            "state": self.state,
            "key": self.key.as_str(),
            "token": self.token.map(|t| t.get()),
            "detail": self.detail,
        })
    }

    /// `200 OK` when healthy, else `503 Service Unavailable`, with [`to_json`](Self::to_json)
    /// as an `application/json` body and `Cache-Control: no-store`.
    pub fn response<B: From<Bytes>>(&self) -> Response<B> {
        let status = if self.healthy {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        let body = Bytes::from(self.to_json().to_string());
        let mut res = Response::new(B::from(body));
        *res.status_mut() = status;
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        res.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        res
    }
}

enum Source {
    Holder(LeaseGuardView),
    Candidate {
        key: LeaseKey,
        owner: OwnerId,
        id: OwnerId,
        role: watch::Receiver<Role>,
        tracker: LeaderTracker,
    },
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Holder(g) => f.debug_tuple("Holder").field(g.key()).finish(),
            Source::Candidate { key, id, .. } => f
                .debug_struct("Candidate")
                .field("key", key)
                .field("id", id)
                .finish(),
        }
    }
}

/// A health check of a lease holder or an election candidate, for liveness and readiness
/// probes (as client-go's `HealthzAdaptor`): it fails when the lease's renewal has stalled, that
/// is when its local deadline has passed (by more than the [tolerance](Self::with_tolerance))
/// while the process still believes it holds or leads. A follower is healthy.
///
/// - [`HealthCheck::holder`]: `held` and `at_risk` (a renewal not yet confirmed, deadline not
///   passed) are healthy; `stalled` (deadline passed, the renewal task has not said so), `lost`
///   and `released` are not. A holder check suits a process whose purpose is that one lease.
/// - [`LeaderTracker::check`]: `follower`, `leader` and `at_risk` are healthy, `stalled` is not.
/// - [`HealthCheck::require_leading`] (for a readiness probe that routes traffic to the leader
///   only): also unhealthy (`not_leading`) unless the lease may act now (held, renewal confirmed,
///   loss deadline not passed).
///
/// Serve it with [`HealthCheck::service`] (any tower stack) or, with feature `axum`,
/// [`HealthCheck::router`]. Checking reads local state only: no store round trip.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::election::{Election, ElectionEvent};
/// use leasehold_core::supervisor::SupervisorConfig;
/// use leasehold_core::{LeaseKey, MemoryLeaseStore, OwnerId};
/// use leasehold_http::LeaderTracker;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let tracker = LeaderTracker::new();
/// let ttl = Duration::from_secs(5);
/// let election = Election::new(MemoryLeaseStore::new(), LeaseKey::new("controller")?,
///     SupervisorConfig::new(ttl).with_acquire_wait(ttl)).with_hook(tracker.hook());
/// let mut me = election.join(OwnerId::with_label("pod-a"));
/// let check = tracker.check(&election, &me);
/// assert!(check.report().healthy); // a follower is healthy
/// if let Some(ElectionEvent::Elected { .. }) = me.next_event().await {
///     let report = check.report();
///     assert!(report.healthy);
///     assert_eq!(report.state, "leader");
/// }
/// me.resign().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct HealthCheck {
    source: Arc<Source>,
    tolerance: Duration,
    require_leading: bool,
}

impl HealthCheck {
    fn new(source: Source) -> Self {
        HealthCheck {
            source: Arc::new(source),
            tolerance: Duration::ZERO,
            require_leading: false,
        }
    }

    /// A check of a held lease (see [`LeaseGuard::view`](leasehold_core::supervisor::LeaseGuard::view)).
    pub fn holder(guard: LeaseGuardView) -> Self {
        Self::new(Source::Holder(guard))
    }

    /// How long past the lease's local deadline a stalled renewal is still reported healthy
    /// (default zero; client-go's adaptor takes the same slack as its `timeout`). Any duration
    /// is accepted; one that overflows the clock means "never stalled".
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Also fail (state `not_leading`) unless this process holds the lease (or leads) and may
    /// act now: for a readiness probe that sends traffic to the leader only.
    pub fn require_leading(mut self) -> Self {
        self.require_leading = true;
        self
    }

    /// Whether `deadline` has passed by more than the tolerance.
    fn stalled(&self, deadline: Instant) -> bool {
        deadline
            .checked_add(self.tolerance)
            .is_some_and(|d| Instant::now() > d)
    }

    /// Checks now.
    pub fn report(&self) -> HealthReport {
        let mut report = match &*self.source {
            Source::Holder(guard) => self.holder_report(guard),
            Source::Candidate {
                key,
                owner,
                role,
                tracker,
                ..
            } => self.candidate_report(key, owner, role, tracker),
        };
        if self.require_leading && report.healthy && !self.may_act() {
            report.healthy = false;
            report.detail = format!("not leading ({}): {}", report.state, report.detail);
            report.state = "not_leading";
        }
        report
    }

    fn may_act(&self) -> bool {
        match &*self.source {
            Source::Holder(guard) => guard.may_act(),
            Source::Candidate {
                key,
                owner,
                role,
                tracker,
                ..
            } => match *role.borrow() {
                Role::Leader { term } => tracker.record(key, owner).is_some_and(|r| {
                    r.token == term && r.health == Health::Held && Instant::now() < r.deadline
                }),
                Role::Follower => false,
            },
        }
    }

    fn holder_report(&self, guard: &LeaseGuardView) -> HealthReport {
        let lease = guard.lease();
        let (healthy, state, detail) = match guard.health() {
            Health::Lost(reason) => (false, "lost", format!("the lease was lost: {reason}")),
            Health::Released => (false, "released", "the lease was released".to_string()),
            _ if self.stalled(lease.deadline()) => (
                false,
                "stalled",
                "the lease's local deadline passed without a confirmed renewal".to_string(),
            ),
            Health::AtRisk => (
                true,
                "at_risk",
                format!(
                    "a renewal is not confirmed; {:?} left before the local deadline",
                    lease.remaining()
                ),
            ),
            _ => (
                true,
                "held",
                format!("{:?} left before the local deadline", lease.remaining()),
            ),
        };
        HealthReport {
            healthy,
            state,
            key: guard.key().clone(),
            token: Some(guard.token()),
            detail,
        }
    }

    fn candidate_report(
        &self,
        key: &LeaseKey,
        owner: &OwnerId,
        role: &watch::Receiver<Role>,
        tracker: &LeaderTracker,
    ) -> HealthReport {
        let term = match *role.borrow() {
            Role::Follower => {
                return HealthReport {
                    healthy: true,
                    state: "follower",
                    key: key.clone(),
                    token: None,
                    detail: "not leading".to_string(),
                };
            }
            Role::Leader { term } => term,
        };
        let (healthy, state, detail) = match tracker.record(key, owner) {
            Some(r) if r.token == term && self.stalled(r.deadline) => (
                false,
                "stalled",
                format!(
                    "leading with term {term}, but the lease's local deadline passed without a \
                     confirmed renewal ({:?})",
                    r.health
                ),
            ),
            Some(r) if r.token == term && r.health == Health::AtRisk => (
                true,
                "at_risk",
                format!(
                    "leading with term {term}; a renewal is not confirmed, {:?} left",
                    r.deadline.saturating_duration_since(Instant::now())
                ),
            ),
            Some(r) if r.token == term => (
                true,
                "leader",
                format!(
                    "leading with term {term}; {:?} left before the local deadline",
                    r.deadline.saturating_duration_since(Instant::now())
                ),
            ),
            // The tracker is not the election's hook (or the record of this term is gone while
            // the role still says leader, which lasts only until the campaign sees the loss).
            _ => (
                true,
                "leader",
                format!(
                    "leading with term {term}; no renewal record (is the tracker the election's hook?)"
                ),
            ),
        };
        HealthReport {
            healthy,
            state,
            key: key.clone(),
            token: Some(term),
            detail,
        }
    }

    /// The check as a tower service: every request gets [`HealthReport::response`] (`200` or
    /// `503`, JSON body). `B` is the response body type (anything `From<Bytes>`, such as
    /// `axum::body::Body` or `http_body_util::Full<Bytes>`).
    pub fn service<B>(&self) -> HealthService<B> {
        HealthService {
            check: self.clone(),
            body: PhantomData,
        }
    }
}

/// The tower service of a [`HealthCheck`] (see [`HealthCheck::service`]). Its future is ready at
/// once: it only reads local state.
pub struct HealthService<B> {
    check: HealthCheck,
    body: PhantomData<fn() -> B>,
}

impl<B> Clone for HealthService<B> {
    fn clone(&self) -> Self {
        HealthService {
            check: self.check.clone(),
            body: PhantomData,
        }
    }
}

impl<B> fmt::Debug for HealthService<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthService")
            .field("check", &self.check)
            .finish()
    }
}

impl<ReqB, B: From<Bytes>> Service<Request<ReqB>> for HealthService<B> {
    type Response = Response<B>;
    type Error = Infallible;
    type Future = Ready<Result<Response<B>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<ReqB>) -> Self::Future {
        ready(Ok(self.check.report().response()))
    }
}
#[cfg(test)]
#[path = "leader_tests.rs"]
mod tests;
