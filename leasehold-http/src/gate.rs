//! The leadership gate: a tower layer that serves only while this process leads an election.

use std::future::ready;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use leasehold_core::election::{Candidate, Observer, Role};
use tokio::sync::watch;
use tower_layer::Layer;
use tower_service::Service;

use crate::leader::LEASE_LEADER;
use crate::problem::Problem;

/// A tower [`Layer`] that lets requests through only while this process leads an election;
/// otherwise it answers `503 Service Unavailable` ([`Problem::NotLeader`], problem+json, with
/// `Retry-After: 1`) naming the current leader in the body and in the [`LEASE_LEADER`] header,
/// so that a client or proxy can go there instead. The inner service is not called then.
///
/// "Leads" is the candidate's [role](Candidate::role): it turns to follower when the term ends
/// (lost, resigned, handed over). A role is a belief, not authority: writes the inner service
/// makes must still carry the term (fencing token), see [`FenceLayer`](crate::FenceLayer).
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use leasehold_core::election::{Election, ElectionEvent};
/// use leasehold_core::supervisor::SupervisorConfig;
/// use leasehold_core::{LeaseKey, MemoryLeaseStore, OwnerId};
/// use leasehold_http::LeaderGateLayer;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ttl = Duration::from_secs(5);
/// let election = Election::new(MemoryLeaseStore::new(), LeaseKey::new("api")?,
///     SupervisorConfig::new(ttl).with_acquire_wait(ttl));
/// let mut me = election.join(OwnerId::with_label("a"));
/// let svc = ServiceBuilder::new()
///     .layer(LeaderGateLayer::new(&me, election.observe()))
///     .service(service_fn(|_req: Request<()>| async {
///         Ok::<_, std::convert::Infallible>(Response::new(Bytes::from("leader work")))
///     }));
/// assert!(matches!(me.next_event().await, Some(ElectionEvent::Elected { .. })));
/// let res = svc.clone().oneshot(Request::new(())).await?;
/// assert_eq!(res.status(), 200);
/// me.resign().await;
/// let res = svc.oneshot(Request::new(())).await?;
/// assert_eq!(res.status(), 503);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LeaderGateLayer {
    gate: Arc<Gate>,
}

#[derive(Debug)]
struct Gate {
    role: watch::Receiver<Role>,
    observer: Observer,
}

impl LeaderGateLayer {
    /// A gate open while `candidate` leads; `observer` (from [`Election::observe`](leasehold_core::election::Election::observe) of the same
    /// election) names the leader in refusals.
    pub fn new(candidate: &Candidate, observer: Observer) -> Self {
        LeaderGateLayer {
            gate: Arc::new(Gate {
                role: candidate.subscribe(),
                observer,
            }),
        }
    }

    /// Whether the gate is open now (this candidate leads).
    pub fn is_open(&self) -> bool {
        self.gate.problem().is_none()
    }
}

impl Gate {
    /// `None` while leading, else the refusal.
    fn problem(&self) -> Option<Problem> {
        if matches!(*self.role.borrow(), Role::Leader { .. }) {
            return None;
        }
        let seen = self.observer.current();
        Some(Problem::NotLeader {
            leader: seen.leader.map(|l| l.as_str().to_owned()),
            term: seen.term,
        })
    }
}

impl<S> Layer<S> for LeaderGateLayer {
    type Service = LeaderGate<S>;
    fn layer(&self, inner: S) -> LeaderGate<S> {
        LeaderGate {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The service [`LeaderGateLayer`] produces.
#[derive(Debug, Clone)]
pub struct LeaderGate<S> {
    inner: S,
    gate: Arc<Gate>,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for LeaderGate<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: From<Bytes> + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        if let Some(problem) = self.gate.problem() {
            let mut res: Response<ResB> = problem.response();
            if let Problem::NotLeader {
                leader: Some(l), ..
            } = &problem
                && let Ok(v) = HeaderValue::from_str(l)
            {
                res.headers_mut().insert(LEASE_LEADER, v);
            }
            return Box::pin(ready(Ok(res)));
        }
        // The clone that was driven to readiness handles this request; the fresh clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(inner.call(req))
    }
}
