//! RFC 9457 problem details (`application/problem+json`) for the server layer's refusals.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use leasehold_core::{FencingToken, LeaseKey};
use serde_json::{Map, Value, json};

/// The media type of every refusal body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Why the server layer refused a request before the handler ran.
///
/// Each variant maps to one status and one problem `type` URI; [`Problem::response`] renders the
/// RFC 9457 body (`type`, `title`, `status`, `detail`, plus the extension members listed per
/// variant).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// `409 Conflict`, type `urn:lease:problem:stale-fencing-token`: a greater token was already
    /// accepted for the key. Members `key`, `presented_token`, `highest_accepted_token` (numbers).
    Stale {
        /// The resource key.
        key: LeaseKey,
        /// The token the request carried.
        presented: FencingToken,
        /// The highest token the resource has accepted for the key.
        high_water: FencingToken,
    },
    /// `428 Precondition Required`, type `urn:lease:problem:fencing-token-required`: the route
    /// requires a token (or a key) and the request carried none. Member `missing` (header name).
    Missing {
        /// What is missing (a header name, or a description of the key source).
        missing: String,
    },
    /// `400 Bad Request`, type `urn:lease:problem:malformed-fencing-header`: the token is not an
    /// integer in `1..=i64::MAX`, or the key is not a legal [`LeaseKey`]. Member `header`.
    Malformed {
        /// The offending header (or key source).
        header: String,
        /// Why it was rejected.
        reason: String,
    },
    /// `409 Conflict`, type `urn:lease:problem:unissued-fencing-token`: the token is above every
    /// token the lease store has issued for the key (forged, or issued by another store), so it
    /// was not recorded: a token nobody holds must not fence out the real holder. Members `key`,
    /// `presented_token`, `last_issued_token` (a number, or `null` when the store reports none,
    /// for example a key nobody holds on a store that keeps the last token only while held).
    Unissued {
        /// The resource key.
        key: LeaseKey,
        /// The token the request carried.
        presented: FencingToken,
        /// The last token the store reported issuing for the key.
        last_issued: Option<FencingToken>,
    },
    /// `400 Bad Request`, type `urn:lease:problem:fencing-key-mismatch`: the layer takes the key
    /// from the route (or a fixed key), and the request's `Fencing-Key` header names another.
    /// Members `expected_key`, `presented_key`, `key_source`.
    KeyMismatch {
        /// The key the layer derived for this request.
        expected: LeaseKey,
        /// The key the `Fencing-Key` header named.
        presented: String,
        /// Where the layer takes the key from.
        source: String,
    },
    /// `503 Service Unavailable`, type `urn:lease:problem:fencing-unavailable`: the fenced
    /// resource failed or did not answer in time; nothing reached the handler. Member
    /// `retryable` (from [`leasehold_core::Error::is_retryable`], `true` for timeouts). The header
    /// `Retry-After: 1` is set when retryable.
    Unavailable {
        /// The error, rendered.
        message: String,
        /// Whether retrying may succeed.
        retryable: bool,
    },
    /// `503 Service Unavailable`, type `urn:lease:problem:not-leader`: the route serves only
    /// while this process leads ([`LeaderGateLayer`](crate::LeaderGateLayer)), and it does not.
    /// Members `leader` (the current leader's identity, or `null` when nobody leads, as far as
    /// this process has seen) and `term` (its term, or `null`). `Retry-After: 1` is set.
    NotLeader {
        /// The current leader's identity, if any.
        leader: Option<String>,
        /// Its term.
        term: Option<FencingToken>,
    },
}

impl Problem {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Problem::Stale { .. } | Problem::Unissued { .. } => StatusCode::CONFLICT,
            Problem::KeyMismatch { .. } => StatusCode::BAD_REQUEST,
            Problem::Missing { .. } => StatusCode::PRECONDITION_REQUIRED,
            Problem::Malformed { .. } => StatusCode::BAD_REQUEST,
            Problem::Unavailable { .. } | Problem::NotLeader { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// The problem `type` URI.
    pub fn type_uri(&self) -> &'static str {
        match self {
            Problem::Stale { .. } => "urn:lease:problem:stale-fencing-token",
            Problem::Unissued { .. } => "urn:lease:problem:unissued-fencing-token",
            Problem::KeyMismatch { .. } => "urn:lease:problem:fencing-key-mismatch",
            Problem::Missing { .. } => "urn:lease:problem:fencing-token-required",
            Problem::Malformed { .. } => "urn:lease:problem:malformed-fencing-header",
            Problem::Unavailable { .. } => "urn:lease:problem:fencing-unavailable",
            Problem::NotLeader { .. } => "urn:lease:problem:not-leader",
        }
    }

    /// The body as a JSON object.
    pub fn to_json(&self) -> Value {
        let status = self.status();
        let mut body = Map::new();
        body.insert("type".into(), json!(self.type_uri()));
        let (title, detail) = match self {
            Problem::Stale {
                key,
                presented,
                high_water,
            } => {
                body.insert("key".into(), json!(key.as_str()));
                body.insert("presented_token".into(), json!(presented.get()));
                body.insert("highest_accepted_token".into(), json!(high_water.get()));
                (
                    "Stale fencing token",
                    format!(
                        "fencing token {presented} for key {key:?} is stale: the highest accepted token is {high_water}",
                        key = key.as_str()
                    ),
                )
            }
            Problem::Unissued {
                key,
                presented,
                last_issued,
            } => {
                body.insert("key".into(), json!(key.as_str()));
                body.insert("presented_token".into(), json!(presented.get()));
                body.insert(
                    "last_issued_token".into(),
                    json!(last_issued.map(FencingToken::get)),
                );
                let last = last_issued.map_or_else(|| "none".to_owned(), |t| t.to_string());
                (
                    "Unissued fencing token",
                    format!(
                        "fencing token {presented} for key {key:?} was never issued by the lease store (its last token for the key: {last}); it was not recorded",
                        key = key.as_str()
                    ),
                )
            }
            Problem::KeyMismatch {
                expected,
                presented,
                source,
            } => {
                body.insert("expected_key".into(), json!(expected.as_str()));
                body.insert("presented_key".into(), json!(presented));
                body.insert("key_source".into(), json!(source));
                (
                    "Fencing key mismatch",
                    format!(
                        "this route is fenced by key {expected:?} ({source}), but the Fencing-Key header names {presented:?}",
                        expected = expected.as_str()
                    ),
                )
            }
            Problem::Missing { missing } => {
                body.insert("missing".into(), json!(missing));
                (
                    "Fencing token required",
                    format!("this route requires a fencing token; missing: {missing}"),
                )
            }
            Problem::Malformed { header, reason } => {
                body.insert("header".into(), json!(header));
                (
                    "Malformed fencing header",
                    format!("{header} is malformed: {reason}"),
                )
            }
            Problem::Unavailable { message, retryable } => {
                body.insert("retryable".into(), json!(retryable));
                (
                    "Fencing check unavailable",
                    format!("the fenced resource could not check the token: {message}"),
                )
            }
            Problem::NotLeader { leader, term } => {
                body.insert("leader".into(), json!(leader));
                body.insert("term".into(), json!(term.map(FencingToken::get)));
                let who = match (leader, term) {
                    (Some(l), Some(t)) => format!("{l} leads (term {t})"),
                    (Some(l), None) => format!("{l} leads"),
                    _ => "no leader is known".to_owned(),
                };
                (
                    "Not the leader",
                    format!("this process does not lead, so it does not serve this route; {who}"),
                )
            }
        };
        body.insert("title".into(), json!(title));
        body.insert("status".into(), json!(status.as_u16()));
        body.insert("detail".into(), json!(detail));
        Value::Object(body)
    }

    /// The full response: status, `Content-Type: application/problem+json`, the JSON body (and
    /// `Retry-After` for a retryable [`Problem::Unavailable`]).
    pub fn response<B: From<Bytes>>(&self) -> Response<B> {
        let body = Bytes::from(self.to_json().to_string());
        let mut res = Response::new(B::from(body));
        *res.status_mut() = self.status();
        res.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Problem::Unavailable {
            retryable: true, ..
        }
        | Problem::NotLeader { .. } = self
        {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        res
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.to_json();
        write!(
            f,
            "{} {}",
            self.status().as_u16(),
            v["detail"].as_str().unwrap_or_default()
        )
    }
}

impl std::error::Error for Problem {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_body_names_the_highest_token() -> leasehold_core::Result<()> {
        let p = Problem::Stale {
            key: LeaseKey::new("k")?,
            presented: FencingToken::new(3)?,
            high_water: FencingToken::new(5)?,
        };
        let res: Response<Bytes> = p.response();
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(res.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        let v: Value = serde_json::from_slice(res.body())
            .map_err(|e| leasehold_core::Error::InvalidInput(e.to_string()))?;
        assert_eq!(v["status"], 409);
        assert_eq!(v["highest_accepted_token"], 5);
        assert_eq!(v["presented_token"], 3);
        assert_eq!(v["type"], "urn:lease:problem:stale-fencing-token");
        assert!(v["title"].is_string() && v["detail"].is_string());
        Ok(())
    }
}
