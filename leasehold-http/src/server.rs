//! The server side: a tower layer that checks (and records) a request's fencing token against a
//! [`FencedResource`] before the handler runs.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, Request, Response};
use leasehold_core::{FencedResource, FencingToken, LeaseKey, LeaseStore, WriteOutcome};
use tower_layer::Layer;
use tower_service::Service;

use crate::key::{KeySource, single_header};
use crate::problem::Problem;
use crate::{FENCING_KEY, FENCING_TOKEN};

/// The default bound on one check against the fenced resource (5 s); see
/// [`FenceLayer::check_timeout`].
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The token a request presented and the layer accepted (and recorded), with its key.
///
/// The layer inserts it into the request's extensions before calling the handler. Read it with
/// `req.extensions().get::<AcceptedToken>()`, with axum's `Extension<AcceptedToken>`, or (feature
/// `axum`) directly as an extractor: `AcceptedToken` (rejects with `428` problem+json when absent)
/// or `Option<AcceptedToken>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedToken {
    key: LeaseKey,
    token: FencingToken,
}

impl AcceptedToken {
    /// The resource key the token was checked against.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }
    /// The accepted token. It was at least the key's high-water mark when checked, and the mark
    /// now is at least this token.
    pub fn token(&self) -> FencingToken {
        self.token
    }
}

/// Whether a route requires a fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Requirement {
    /// A request without the token header gets `428 Precondition Required` (the default).
    #[default]
    Required,
    /// A request without the token header reaches the handler unchecked, with no
    /// [`AcceptedToken`]. A request *with* a token is checked exactly as under `Required`.
    Optional,
}

/// A tower [`Layer`] that fences every request against a [`FencedResource`], with tokens
/// confirmed by the [`LeaseStore`] that issues them.
///
/// For each request the layer reads the token header ([`FENCING_TOKEN`] by default) and the key
/// (see [`KeySource`]: the route, a fixed key, or the [`FENCING_KEY`] header by default), then,
/// **before** the inner service runs, confirms that the store issued the token (below) and calls
/// [`FencedResource::install`]`(key, token)`:
///
/// | request | response (handler not called) |
/// |---|---|
/// | token `>=` the key's high-water mark, issued by the store | handler runs, with an [`AcceptedToken`] in the extensions |
/// | token `<` the mark | `409 Conflict` ([`Problem::Stale`]), naming `highest_accepted_token` |
/// | token above every token the store issued for the key | `409 Conflict` ([`Problem::Unissued`]); the mark does not move |
/// | no token header, route [`Requirement::Required`] | `428 Precondition Required` |
/// | a token but no key | `428 Precondition Required` |
/// | a route/fixed key and a `Fencing-Key` header naming another key | `400 Bad Request` ([`Problem::KeyMismatch`]) |
/// | token not in `1..=i64::MAX`, repeated header, illegal key | `400 Bad Request` |
/// | the store or resource fails or exceeds [`check_timeout`](Self::check_timeout) | `503 Service Unavailable`, `retryable` member |
///
/// # The guarantee, and its limit
/// `install` is the resource's atomic check-and-record: an accepted token moves the high-water
/// mark to itself (equal tokens are allowed, so one holder may send many requests). So once a
/// request with token `n` has been accepted, **every later check with a token below `n` gets
/// `409`**, across all replicas of the service that share the resource, and whatever the resource
/// is (PostgreSQL high-water table, Redis, etcd, Kubernetes, SQLite, memory).
///
/// The check and the handler's own side effect are **not** one atomic step: a request with token
/// 5 may pass the check, then a request with token 6 passes, and then the handler of the first
/// request writes. If that ordering matters, let the handler write *through the same resource*
/// with [`AcceptedToken::token`] (`resource.write(key, token, op)`), which re-checks atomically
/// with the write, or carry the token into the handler's own store as a conditional write. The
/// layer's check then serves as the early, cheap rejection and as the point where a new holder's
/// first request fences out every older holder.
///
/// # Only issued tokens move the mark
/// Recording any token a client sends would let one request with a huge token (or a token of
/// another store) raise the mark for good, after which every real holder gets `409`. So a token
/// above the highest this layer has seen confirmed for the key is first confirmed with the
/// issuer: one [`LeaseStore::inspect`], whose `last_token` must be at least the token. The
/// confirmed maximum is remembered per key (in this layer and its clones), so a holder's
/// requests after the first cost no extra round trip; a new holder's first request costs one.
/// A token the store did not issue is refused with [`Problem::Unissued`] and records nothing.
///
/// This assumes that `inspect` sees every grant that completed before it was called (true of
/// every backend of this library, which read from the primary or by quorum) and that the store
/// given here is the one that issues the tokens. A store that reports `last_token` only while
/// the key is held (etcd) confirms a token above the mark only while its lease is held.
///
/// # Cancellation
/// If the response future is dropped while the check is in flight, the mark may or may not have
/// moved, and the handler has not run. A mark moved by a request that never reached the handler is
/// harmless: it only fences out older tokens, which a newer holder's requests do anyway.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use leasehold_core::{AcquireRequest, FencedResource, LeaseKey, LeaseStore, MemoryFencedResource};
/// use leasehold_core::{MemoryLeaseStore, OwnerId};
/// use leasehold_http::{FenceLayer, KeySource, Problem};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Arc::new(MemoryLeaseStore::new());
/// let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
/// // The key is the `{id}` of `/accounts/{id}/...`: a write to account a-1 is fenced by a-1.
/// let layer = FenceLayer::new(resource, store.clone())
///     .key_source(KeySource::path("/accounts/{id}/{*rest}", "id")?);
/// let head = |token: u64| {
///     let req = http::Request::post("/accounts/a-1/deposit")
///         .header("Fencing-Token", token)
///         .body(())?;
///     Ok::<_, http::Error>(req.into_parts().0)
/// };
/// let req = AcquireRequest::new(LeaseKey::new("a-1")?, OwnerId::new("worker-1")?, Duration::from_secs(30));
/// let lease = store.acquire(&req).await?.lease().ok_or("held")?;
/// let accepted = layer.check(&head(lease.token().get())?).await?.ok_or("no token")?;
/// assert_eq!((accepted.key().as_str(), accepted.token()), ("a-1", lease.token()));
/// // A token the store never issued is refused and does not move the mark.
/// let forged = lease.token().get() + 1000;
/// assert!(matches!(layer.check(&head(forged)?).await, Err(Problem::Unissued { .. })));
/// assert!(layer.check(&head(lease.token().get())?).await.is_ok());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FenceLayer {
    config: Arc<Config>,
}

/// At most this many keys' confirmed maxima are remembered; past it the memory starts over
/// (which costs one `inspect` per key again, never safety).
const MAX_CONFIRMED_KEYS: usize = 65_536;

#[derive(Clone)]
struct Config {
    resource: Arc<dyn FencedResource>,
    issuer: Arc<dyn LeaseStore>,
    confirmed: Arc<Mutex<HashMap<LeaseKey, FencingToken>>>,
    key: KeySource,
    requirement: Requirement,
    token_header: HeaderName,
    timeout: Duration,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FenceLayer")
            .field("resource", &self.resource)
            .field("issuer", &self.issuer.backend())
            .field("key", &self.key)
            .field("requirement", &self.requirement)
            .field("token_header", &self.token_header)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl FenceLayer {
    /// A layer over `resource`, confirming tokens with `issuer` (the lease store whose tokens
    /// the clients present): token from [`FENCING_TOKEN`], key from the [`FENCING_KEY`] header
    /// (prefer a route key, see [`key_source`](Self::key_source)), token required, checks
    /// bounded by [`DEFAULT_CHECK_TIMEOUT`].
    pub fn new(resource: Arc<dyn FencedResource>, issuer: Arc<dyn LeaseStore>) -> Self {
        FenceLayer {
            config: Arc::new(Config {
                resource,
                issuer,
                confirmed: Arc::default(),
                key: KeySource::header(FENCING_KEY),
                requirement: Requirement::Required,
                token_header: FENCING_TOKEN,
                timeout: DEFAULT_CHECK_TIMEOUT,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Where the key comes from: [`KeySource::path`] (or `route_param`, `fixed`, `from_fn`) so
    /// that what the request touches decides the key, or the `Fencing-Key` header (default).
    pub fn key_source(self, key: KeySource) -> Self {
        self.with(|c| c.key = key)
    }

    /// Whether a token is required (default) or optional.
    pub fn requirement(self, requirement: Requirement) -> Self {
        self.with(|c| c.requirement = requirement)
    }

    /// The token header (default [`FENCING_TOKEN`]).
    pub fn token_header(self, name: HeaderName) -> Self {
        self.with(|c| c.token_header = name)
    }

    /// Bounds each check (the store's confirmation and the resource's install together); a
    /// check that takes longer answers `503` (retryable) and the handler does not run. Any
    /// `Duration` is accepted: zero refuses every request that needs a round trip, and
    /// `Duration::MAX` means "as long as the store and resource take".
    pub fn check_timeout(self, timeout: Duration) -> Self {
        self.with(|c| c.timeout = timeout)
    }

    /// Runs the layer's check on a request head, without a service: `Ok(Some(_))` accepted (and
    /// recorded), `Ok(None)` no token on an optional route, `Err(problem)` refused (render it with
    /// [`Problem::response`]). For hyper services written by hand.
    ///
    /// # Cancellation safety
    /// As for the layer: if cancelled in flight, the high-water mark may or may not have moved.
    pub async fn check(&self, parts: &Parts) -> Result<Option<AcceptedToken>, Problem> {
        self.config.check(parts).await
    }
}

impl Config {
    async fn check(&self, parts: &Parts) -> Result<Option<AcceptedToken>, Problem> {
        let token = match single_header(parts, &self.token_header)? {
            Some(raw) => raw
                .parse::<FencingToken>()
                .map_err(|e| Problem::Malformed {
                    header: self.token_header.as_str().to_owned(),
                    reason: e.to_string(),
                })?,
            None => {
                return match self.requirement {
                    Requirement::Required => Err(Problem::Missing {
                        missing: self.token_header.as_str().to_owned(),
                    }),
                    Requirement::Optional => Ok(None),
                };
            }
        };
        let Some(key) = self.key.extract(parts).await? else {
            return Err(Problem::Missing {
                missing: self.key.describe(),
            });
        };
        match tokio::time::timeout(self.timeout, self.confirm_and_install(&key, token)).await {
            Ok(Ok(())) => Ok(Some(AcceptedToken { key, token })),
            Ok(Err(problem)) => Err(problem),
            Err(_) => Err(Problem::Unavailable {
                message: format!("no answer within {:?}", self.timeout),
                retryable: true,
            }),
        }
    }

    fn confirmed(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseKey, FencingToken>> {
        // The map only caches maxima; a panic elsewhere cannot leave it inconsistent.
        self.confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Refuses a token the issuer never issued (asking it once per new maximum), then installs.
    async fn confirm_and_install(
        &self,
        key: &LeaseKey,
        token: FencingToken,
    ) -> Result<(), Problem> {
        let known = self.confirmed().get(key).copied();
        if known.is_none_or(|k| token > k) {
            let state = self.issuer.inspect(key).await.map_err(|e| {
                tracing::warn!(key = %key, error = %e, "fencing token confirmation failed");
                Problem::Unavailable {
                    message: e.to_string(),
                    retryable: e.is_retryable(),
                }
            })?;
            if let Some(last) = state.last_token {
                let mut confirmed = self.confirmed();
                if confirmed.len() >= MAX_CONFIRMED_KEYS && !confirmed.contains_key(key) {
                    confirmed.clear();
                }
                let entry = confirmed.entry(key.clone()).or_insert(last);
                *entry = (*entry).max(last);
            }
            if state.last_token.is_none_or(|last| token > last) {
                tracing::warn!(key = %key, token = %token, last_issued = ?state.last_token, "unissued fencing token refused");
                return Err(Problem::Unissued {
                    key: key.clone(),
                    presented: token,
                    last_issued: state.last_token,
                });
            }
        }
        match self.resource.install(key, token).await {
            Ok(WriteOutcome::Accepted { .. }) => Ok(()),
            Ok(WriteOutcome::Rejected {
                presented,
                high_water,
            }) => {
                tracing::debug!(key = %key, token = %presented, high_water = %high_water, "stale fencing token refused");
                Err(Problem::Stale {
                    key: key.clone(),
                    presented,
                    high_water,
                })
            }
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "fencing check failed");
                Err(Problem::Unavailable {
                    message: e.to_string(),
                    retryable: e.is_retryable(),
                })
            }
        }
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = FenceService<S>;
    fn layer(&self, inner: S) -> FenceService<S> {
        FenceService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`FenceLayer`] produces.
#[derive(Clone, Debug)]
pub struct FenceService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for FenceService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
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
        // The clone that was driven to readiness handles this request; the fresh clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            match config.check(&parts).await {
                Ok(Some(accepted)) => {
                    parts.extensions.insert(accepted);
                }
                Ok(None) => {}
                Err(problem) => return Ok(problem.response()),
            }
            inner.call(Request::from_parts(parts, body)).await
        })
    }
}
