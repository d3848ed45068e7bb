//! `AcceptedToken` as an axum extractor (feature `axum`).

use std::convert::Infallible;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::Response;
use http::request::Parts;

use crate::problem::Problem;
use crate::server::AcceptedToken;

/// Extracts the token the [`FenceLayer`](crate::FenceLayer) accepted. Without one (the layer is
/// missing, or the route is [`Optional`](crate::Requirement::Optional) and the request carried no
/// token) it rejects with `428` problem+json; use `Option<AcceptedToken>` on optional routes.
impl<S: Send + Sync> FromRequestParts<S> for AcceptedToken {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        parts
            .extensions
            .get::<AcceptedToken>()
            .cloned()
            .ok_or_else(|| {
                Problem::Missing {
                    missing: "an accepted fencing token".into(),
                }
                .response()
            })
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for AcceptedToken {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Infallible> {
        Ok(parts.extensions.get::<AcceptedToken>().cloned())
    }
}

impl crate::HealthCheck {
    /// An axum router that answers every request to `path` with this check (`200` or `503`, JSON body; see
    /// [`HealthReport::response`](crate::HealthReport::response)). Merge it into the app:
    /// `app.merge(check.router("/healthz"))`. The handler reads local state only (cancel safe).
    pub fn router<S: Clone + Send + Sync + 'static>(&self, path: &str) -> axum::Router<S> {
        axum::Router::new().route_service(path, self.service::<axum::body::Body>())
    }
}
