//! The server side: a tower layer that checks (and records) a request's fencing token against a
//! [`FencedResource`] before the handler runs.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, Request, Response};
use lease_core::{FencedResource, FencingToken, LeaseKey, WriteOutcome};
use tower_layer::Layer;
use tower_service::Service;

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

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Where the layer finds the resource key of a request.
#[derive(Clone)]
pub struct KeySource(KeyKind);

#[derive(Clone)]
enum KeyKind {
    Header(HeaderName),
    Fixed(LeaseKey),
    Fn(Arc<KeyFn>, &'static str),
}

impl KeySource {
    /// The key is the value of a request header (default: [`FENCING_KEY`]).
    pub fn header(name: HeaderName) -> Self {
        KeySource(KeyKind::Header(name))
    }
    /// Every request is checked against one key (a layer per resource).
    pub fn fixed(key: LeaseKey) -> Self {
        KeySource(KeyKind::Fixed(key))
    }
    /// The key is computed from the request head: a route parameter parsed from
    /// `parts.uri.path()`, a tenant header, ... `None` means "no key" (treated like a missing
    /// header). `describe` names the source in `428`/`400` bodies (for example `"path /accounts/{id}"`).
    pub fn from_fn<F>(describe: &'static str, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        KeySource(KeyKind::Fn(Arc::new(f), describe))
    }

    fn describe(&self) -> String {
        match &self.0 {
            KeyKind::Header(h) => h.as_str().to_owned(),
            KeyKind::Fixed(k) => format!("fixed key {}", k.as_str()),
            KeyKind::Fn(_, d) => (*d).to_owned(),
        }
    }

    fn extract(&self, parts: &Parts) -> Result<Option<LeaseKey>, Problem> {
        let raw = match &self.0 {
            KeyKind::Fixed(k) => return Ok(Some(k.clone())),
            KeyKind::Header(h) => match single_header(parts, h)? {
                Some(v) => v.to_owned(),
                None => return Ok(None),
            },
            KeyKind::Fn(f, _) => match f(parts) {
                Some(v) => v,
                None => return Ok(None),
            },
        };
        LeaseKey::new(&raw)
            .map(Some)
            .map_err(|e| Problem::Malformed {
                header: self.describe(),
                reason: e.to_string(),
            })
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeySource({})", self.describe())
    }
}

fn single_header<'a>(parts: &'a Parts, name: &HeaderName) -> Result<Option<&'a str>, Problem> {
    let mut values = parts.headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Problem::Malformed {
            header: name.as_str().to_owned(),
            reason: "more than one value".into(),
        });
    }
    first.to_str().map(Some).map_err(|_| Problem::Malformed {
        header: name.as_str().to_owned(),
        reason: "not visible ASCII".into(),
    })
}

/// A tower [`Layer`] that fences every request against a [`FencedResource`].
///
/// For each request the layer reads the token header ([`FENCING_TOKEN`] by default) and the key
/// (see [`KeySource`]; [`FENCING_KEY`] by default), then calls
/// [`FencedResource::install`]`(key, token)` **before** the inner service runs:
///
/// | request | response (handler not called) |
/// |---|---|
/// | token `>=` the key's high-water mark | handler runs, with an [`AcceptedToken`] in the extensions |
/// | token `<` the mark | `409 Conflict`, problem+json naming `highest_accepted_token` |
/// | no token header, route [`Requirement::Required`] | `428 Precondition Required` |
/// | a token but no key | `428 Precondition Required` |
/// | token not in `1..=i64::MAX`, repeated header, illegal key | `400 Bad Request` |
/// | the resource fails or exceeds [`check_timeout`](Self::check_timeout) | `503 Service Unavailable`, `retryable` member |
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
/// # Cancellation
/// If the response future is dropped while the check is in flight, the mark may or may not have
/// moved, and the handler has not run. A mark moved by a request that never reached the handler is
/// harmless: it only fences out older tokens, which a newer holder's requests do anyway.
///
/// ```
/// use std::sync::Arc;
/// use lease_core::{FencedResource, FencingToken, MemoryFencedResource};
/// use lease_http::{FenceLayer, KeySource, Problem, Requirement};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let resource: Arc<dyn FencedResource> = Arc::new(MemoryFencedResource::new());
/// // The key is the `{id}` of `/accounts/{id}/...`.
/// let layer = FenceLayer::new(resource)
///     .key_source(KeySource::from_fn("path /accounts/{id}", |parts| {
///         let rest = parts.uri.path().strip_prefix("/accounts/")?;
///         Some(rest.split('/').next()?.to_owned())
///     }))
///     .requirement(Requirement::Required);
/// let head = |token: u64| {
///     let req = http::Request::post("/accounts/a-1/deposit")
///         .header("Fencing-Token", token)
///         .body(())?;
///     Ok::<_, http::Error>(req.into_parts().0)
/// };
/// let accepted = layer.check(&head(5)?).await?.ok_or("no token")?;
/// assert_eq!((accepted.key().as_str(), accepted.token().get()), ("a-1", 5));
/// match layer.check(&head(4)?).await {
///     Err(Problem::Stale { high_water, .. }) => assert_eq!(high_water, FencingToken::new(5)?),
///     other => return Err(format!("expected 409, got {other:?}").into()),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FenceLayer {
    config: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    resource: Arc<dyn FencedResource>,
    key: KeySource,
    requirement: Requirement,
    token_header: HeaderName,
    timeout: Duration,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FenceLayer")
            .field("resource", &self.resource)
            .field("key", &self.key)
            .field("requirement", &self.requirement)
            .field("token_header", &self.token_header)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl FenceLayer {
    /// A layer over `resource`: token from [`FENCING_TOKEN`], key from [`FENCING_KEY`], token
    /// required, checks bounded by [`DEFAULT_CHECK_TIMEOUT`].
    pub fn new(resource: Arc<dyn FencedResource>) -> Self {
        FenceLayer {
            config: Arc::new(Config {
                resource,
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

    /// Where the key comes from.
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

    /// Bounds each check; a check that takes longer answers `503` (retryable) and the handler does
    /// not run. Any `Duration` is accepted (`Duration::MAX` means "as long as the resource takes").
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
        let Some(key) = self.key.extract(parts)? else {
            return Err(Problem::Missing {
                missing: self.key.describe(),
            });
        };
        let outcome = tokio::time::timeout(self.timeout, self.resource.install(&key, token)).await;
        match outcome {
            Ok(Ok(WriteOutcome::Accepted { .. })) => Ok(Some(AcceptedToken { key, token })),
            Ok(Ok(WriteOutcome::Rejected {
                presented,
                high_water,
            })) => {
                tracing::debug!(key = %key, token = %presented, high_water = %high_water, "stale fencing token refused");
                Err(Problem::Stale {
                    key,
                    presented,
                    high_water,
                })
            }
            Ok(Err(e)) => {
                tracing::warn!(key = %key, error = %e, "fencing check failed");
                Err(Problem::Unavailable {
                    message: e.to_string(),
                    retryable: e.is_retryable(),
                })
            }
            Err(_) => Err(Problem::Unavailable {
                message: format!("no answer within {:?}", self.timeout),
                retryable: true,
            }),
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
