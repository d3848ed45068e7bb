//! The client side: attach the holder's token to every request, and refuse to send once the
//! holder may no longer act.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderValue, Request};
use leasehold_core::supervisor::{Health, LeaseGuardView};
use leasehold_core::{FencingToken, LeaseKey};
use tower_layer::Layer;
use tower_service::Service;

use crate::{FENCING_KEY, FENCING_TOKEN};

/// The request was not sent: the guard's holder may no longer act (the lease is lost, released,
/// at risk, or past its local validity deadline; see [`LeaseGuardView::may_act`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotHolder {
    /// The guard's key.
    pub key: LeaseKey,
    /// The guard's token.
    pub token: FencingToken,
    /// The guard's health when the request was refused.
    pub health: Health,
}

impl fmt::Display for NotHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease {} (token {}) may no longer act ({:?}): request not sent",
            self.key.as_str(),
            self.token,
            self.health
        )
    }
}

impl std::error::Error for NotHolder {}

/// Checks the guard and, if it may act, returns the headers to attach.
///
/// # Errors
/// [`NotHolder`] when `guard.may_act()` is false.
pub fn fencing_headers(
    guard: &LeaseGuardView,
) -> Result<[(http::HeaderName, HeaderValue); 2], NotHolder> {
    if !guard.may_act() {
        return Err(NotHolder {
            key: guard.key().clone(),
            token: guard.token(),
            health: guard.health(),
        });
    }
    // A token is a decimal number and a key a DNS-1123 name: both are always legal header values.
    let token = HeaderValue::from(guard.token().get());
    let key = HeaderValue::from_str(guard.key().as_str())
        .unwrap_or_else(|_| HeaderValue::from_static("invalid-key"));
    Ok([(FENCING_TOKEN, token), (FENCING_KEY, key)])
}

fn attach(headers: &mut HeaderMap, guard: &LeaseGuardView) -> Result<(), NotHolder> {
    for (name, value) in fencing_headers(guard)? {
        headers.insert(name, value);
    }
    Ok(())
}

/// The error of a [`FencingClient`]: the request was refused locally, or the inner service failed.
#[derive(Debug)]
pub enum ClientError<E> {
    /// Refused before sending: no request left the process.
    NotHolder(NotHolder),
    /// The inner service's error.
    Inner(E),
}

impl<E: fmt::Display> fmt::Display for ClientError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NotHolder(e) => fmt::Display::fmt(e, f),
            ClientError::Inner(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for ClientError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::NotHolder(e) => Some(e),
            ClientError::Inner(e) => Some(e),
        }
    }
}

/// A tower [`Layer`] for HTTP clients: sets `Fencing-Token` and `Fencing-Key` from a lease guard
/// on every request, and refuses to send (error [`ClientError::NotHolder`], the inner service is
/// not called) once [`LeaseGuardView::may_act`] is false.
///
/// `may_act` is checked when the request is handed to the service (in `call`), so a request
/// already in flight when the lease is lost still arrives; the server side ([`FenceLayer`]) is
/// what rejects it once a newer holder has been accepted. The client check only stops a holder
/// that knows it is no longer the holder from sending anything new.
///
/// Works over any `Service<http::Request<B>>`: hyper-util's client, a `tower::ServiceBuilder`
/// stack, an axum `Router` in tests.
///
/// [`FenceLayer`]: crate::FenceLayer
///
/// ```
/// use leasehold_http::FencingClientLayer;
/// # fn wrap<S>(guard: leasehold_core::supervisor::LeaseGuardView, client: S) {
/// let client = tower_layer::Layer::layer(&FencingClientLayer::new(guard), client);
/// # let _ = client; }
/// ```
#[derive(Debug, Clone)]
pub struct FencingClientLayer {
    guard: LeaseGuardView,
}

impl FencingClientLayer {
    /// A layer for the holder of `guard` (get one with `LeaseGuard::view`).
    pub fn new(guard: LeaseGuardView) -> Self {
        FencingClientLayer { guard }
    }
}

impl<S> Layer<S> for FencingClientLayer {
    type Service = FencingClient<S>;
    fn layer(&self, inner: S) -> FencingClient<S> {
        FencingClient {
            inner,
            guard: self.guard.clone(),
        }
    }
}

/// The service [`FencingClientLayer`] produces.
#[derive(Debug, Clone)]
pub struct FencingClient<S> {
    inner: S,
    guard: LeaseGuardView,
}

impl<S, B> Service<Request<B>> for FencingClient<S>
where
    S: Service<Request<B>>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = ClientError<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, ClientError<S::Error>>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(ClientError::Inner)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Err(refused) = attach(req.headers_mut(), &self.guard) {
            tracing::debug!(error = %refused, "fenced request refused before sending");
            return Box::pin(std::future::ready(Err(ClientError::NotHolder(refused))));
        }
        let fut = self.inner.call(req);
        Box::pin(async move { fut.await.map_err(ClientError::Inner) })
    }
}

/// `reqwest` support (feature `reqwest`).
#[cfg(feature = "reqwest")]
mod reqwest_ext {
    use super::*;

    /// The error of [`FencedRequest::send`].
    #[derive(Debug)]
    pub enum SendError {
        /// Refused before sending: no request left the process.
        NotHolder(NotHolder),
        /// reqwest's error.
        Http(reqwest::Error),
    }

    impl fmt::Display for SendError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                SendError::NotHolder(e) => fmt::Display::fmt(e, f),
                SendError::Http(e) => fmt::Display::fmt(e, f),
            }
        }
    }

    impl std::error::Error for SendError {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            match self {
                SendError::NotHolder(e) => Some(e),
                SendError::Http(e) => Some(e),
            }
        }
    }

    /// A `reqwest` request that carries a lease guard; built by [`FencedRequestExt::fenced`].
    #[derive(Debug)]
    pub struct FencedRequest {
        builder: reqwest::RequestBuilder,
        guard: LeaseGuardView,
    }

    impl FencedRequest {
        /// Checks `may_act()` **now**, attaches `Fencing-Token` and `Fencing-Key`, and sends.
        ///
        /// # Errors
        /// [`SendError::NotHolder`] (nothing sent) when the guard may no longer act;
        /// [`SendError::Http`] from reqwest.
        ///
        /// # Cancellation safety
        /// As `reqwest::RequestBuilder::send`: if dropped, the request may or may not have been
        /// sent and processed.
        pub async fn send(self) -> Result<reqwest::Response, SendError> {
            let headers = fencing_headers(&self.guard).map_err(SendError::NotHolder)?;
            let mut builder = self.builder;
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            builder.send().await.map_err(SendError::Http)
        }

        /// The wrapped builder, to add anything else (body, headers) before sending.
        pub fn map(
            self,
            f: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
        ) -> Self {
            FencedRequest {
                builder: f(self.builder),
                guard: self.guard,
            }
        }
    }

    /// Adds [`fenced`](FencedRequestExt::fenced) to `reqwest::RequestBuilder`.
    ///
    /// ```no_run
    /// use leasehold_http::FencedRequestExt;
    /// # async fn f(guard: leasehold_core::supervisor::LeaseGuardView) -> Result<(), leasehold_http::SendError> {
    /// let res = reqwest::Client::new()
    ///     .post("http://127.0.0.1:8080/ledger")
    ///     .body("+1")
    ///     .fenced(&guard)
    ///     .send() // refuses (SendError::NotHolder) once guard.may_act() is false
    ///     .await?;
    /// # let _ = res; Ok(()) }
    /// ```
    pub trait FencedRequestExt {
        /// Wraps the builder so that `send` checks the guard and attaches its token and key.
        fn fenced(self, guard: &LeaseGuardView) -> FencedRequest;
    }

    impl FencedRequestExt for reqwest::RequestBuilder {
        fn fenced(self, guard: &LeaseGuardView) -> FencedRequest {
            FencedRequest {
                builder: self,
                guard: guard.clone(),
            }
        }
    }
}

#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use reqwest_ext::{FencedRequest, FencedRequestExt, SendError};
