//! [`KeySource`]: where the server layer finds the resource key of a request. The route is the
//! safe default for an API whose paths name the resource; the `Fencing-Key` header is for
//! services that fence one path on behalf of many keys.

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;
use leasehold_core::{Error, LeaseKey, Result};

use crate::FENCING_KEY;
use crate::problem::Problem;

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Where the layer finds the resource key of a request.
///
/// Prefer a key the **server** derives from what the request touches: [`KeySource::path`] (the
/// `{id}` of `/accounts/{id}/...`), [`KeySource::route_param`] (feature `axum`), [`KeySource::fixed`]
/// or [`KeySource::from_fn`]. Then a handler that writes `/accounts/a-1` is fenced by the key
/// `a-1`, whatever the client thinks it holds. With any of these, a request that also carries a
/// `Fencing-Key` header naming another key is refused (`400`, [`Problem::KeyMismatch`], naming
/// both keys) rather than silently checked against a key the client did not mean. The header
/// itself ([`KeySource::header`], the default of [`FenceLayer::new`](crate::FenceLayer::new)) lets
/// the **client** choose the key, which fences only as well as every client chooses right.
#[derive(Clone)]
pub struct KeySource(Kind);

#[derive(Clone)]
enum Kind {
    Header(HeaderName),
    Fixed(LeaseKey),
    Fn(Arc<KeyFn>, &'static str),
    Path(Arc<PathTemplate>),
    #[cfg(feature = "axum")]
    RouteParam(Arc<str>),
}

impl KeySource {
    /// The key is the value of a request header (the layer's default: [`FENCING_KEY`]): the
    /// client chooses which key fences the request.
    pub fn header(name: HeaderName) -> Self {
        KeySource(Kind::Header(name))
    }

    /// Every request is checked against one key (a layer per resource).
    pub fn fixed(key: LeaseKey) -> Self {
        KeySource(Kind::Fixed(key))
    }

    /// The key is one parameter of a path template: `{name}` matches one non-empty segment,
    /// a trailing `{*rest}` any remainder (also none), every other segment itself. A path the
    /// template does not match has no key (`428`); a parameter that is not a legal
    /// [`LeaseKey`] is `400`. The path is matched as sent (no percent-decoding: a legal key
    /// never needs it). Works in any tower stack, before or after a router.
    ///
    /// ```
    /// use leasehold_http::KeySource;
    /// let accounts = KeySource::path("/accounts/{id}/{*rest}", "id")?;
    /// # let _ = accounts;
    /// // A template without the parameter is refused when built, not at the first request.
    /// assert!(KeySource::path("/accounts/{id}", "account").is_err());
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] if `template` does not start with `/`, has an empty or repeated
    /// parameter name, a `{*rest}` that is not last, or no parameter `param`.
    pub fn path(template: &str, param: &str) -> Result<Self> {
        PathTemplate::parse(template, param).map(|t| KeySource(Kind::Path(Arc::new(t))))
    }

    /// The key is the route parameter `name` that axum's router matched (as its `Path`
    /// extractor sees it, percent-decoded). The layer must then run **inside** the router, where
    /// the parameters exist: add it with `Router::route_layer` or `Router::layer`. Wrapped around
    /// a router from outside (a `tower::ServiceBuilder` over the whole app) it runs before
    /// routing, finds no parameter, and refuses every request with `428` naming this source.
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn route_param(name: &str) -> Self {
        KeySource(Kind::RouteParam(Arc::from(name)))
    }

    /// The key is computed from the request head: a tenant header, a parameter parsed from
    /// `parts.uri`, ... `None` means "no key" (`428`). `describe` names the source in `428`/`400`
    /// bodies (for example `"path /accounts/{id}"`).
    pub fn from_fn<F>(describe: &'static str, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        KeySource(Kind::Fn(Arc::new(f), describe))
    }

    pub(crate) fn describe(&self) -> String {
        match &self.0 {
            Kind::Header(h) => h.as_str().to_owned(),
            Kind::Fixed(k) => format!("fixed key {}", k.as_str()),
            Kind::Fn(_, d) => (*d).to_owned(),
            Kind::Path(t) => format!("parameter {{{}}} of path {}", t.param, t.template),
            #[cfg(feature = "axum")]
            Kind::RouteParam(name) => format!(
                "route parameter {{{name}}} (add the FenceLayer inside the router: Router::route_layer)"
            ),
        }
    }

    /// The request's key, `Ok(None)` if it has none. A source other than the `Fencing-Key`
    /// header refuses a request whose `Fencing-Key` names another key.
    pub(crate) async fn extract(&self, parts: &Parts) -> Result<Option<LeaseKey>, Problem> {
        let raw = match &self.0 {
            Kind::Header(h) => match single_header(parts, h)? {
                Some(v) => v.to_owned(),
                None => return Ok(None),
            },
            Kind::Fixed(k) => k.as_str().to_owned(),
            Kind::Fn(f, _) => match f(parts) {
                Some(v) => v,
                None => return Ok(None),
            },
            Kind::Path(t) => match t.matches(parts.uri.path()) {
                Some(v) => v.to_owned(),
                None => return Ok(None),
            },
            #[cfg(feature = "axum")]
            Kind::RouteParam(name) => match route_param(parts, name).await {
                Some(v) => v,
                None => return Ok(None),
            },
        };
        let key = LeaseKey::new(&raw).map_err(|e| Problem::Malformed {
            header: self.describe(),
            reason: e.to_string(),
        })?;
        let from_header = matches!(&self.0, Kind::Header(h) if *h == FENCING_KEY);
        if !from_header
            && let Some(presented) = single_header(parts, &FENCING_KEY)?
            && presented != key.as_str()
        {
            return Err(Problem::KeyMismatch {
                expected: key,
                presented: presented.to_owned(),
                source: self.describe(),
            });
        }
        Ok(Some(key))
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeySource({})", self.describe())
    }
}

#[cfg(feature = "axum")]
async fn route_param(parts: &Parts, name: &str) -> Option<String> {
    use axum::extract::{FromRequestParts, RawPathParams};
    // The extractor wants `&mut Parts`; it reads only the extensions the router inserted.
    let mut head = http::Request::new(()).into_parts().0;
    head.extensions = parts.extensions.clone();
    let params = RawPathParams::from_request_parts(&mut head, &())
        .await
        .ok()?;
    params
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

pub(crate) fn single_header<'a>(
    parts: &'a Parts,
    name: &HeaderName,
) -> Result<Option<&'a str>, Problem> {
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

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param(String),
    Rest,
}

#[derive(Debug)]
struct PathTemplate {
    template: String,
    param: String,
    segments: Vec<Segment>,
}

impl PathTemplate {
    fn parse(template: &str, param: &str) -> Result<Self> {
        let bad = |why: &str| Error::InvalidInput(format!("path template {template:?}: {why}"));
        let rest = template
            .strip_prefix('/')
            .ok_or_else(|| bad("must start with '/'"))?;
        let raw: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        let mut segments = Vec::with_capacity(raw.len());
        let mut names = Vec::new();
        for (i, s) in raw.iter().enumerate() {
            let seg = match s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(inner) => {
                    let (is_rest, name) = match inner.strip_prefix('*') {
                        Some(n) => (true, n),
                        None => (false, inner),
                    };
                    if name.is_empty() || name.contains(['{', '}', '*']) {
                        return Err(bad(&format!("bad parameter {s:?}")));
                    }
                    if names.contains(&name) {
                        return Err(bad(&format!("parameter {name:?} repeated")));
                    }
                    names.push(name);
                    if is_rest {
                        if i + 1 != raw.len() {
                            return Err(bad("{*rest} must be the last segment"));
                        }
                        Segment::Rest
                    } else {
                        Segment::Param(name.to_owned())
                    }
                }
                None if s.contains(['{', '}']) => {
                    return Err(bad(&format!("segment {s:?} mixes text and a parameter")));
                }
                None => Segment::Literal((*s).to_owned()),
            };
            segments.push(seg);
        }
        if !segments.contains(&Segment::Param(param.to_owned())) {
            return Err(bad(&format!(
                "no one-segment parameter {{{param}}} to take the key from"
            )));
        }
        Ok(PathTemplate {
            template: template.to_owned(),
            param: param.to_owned(),
            segments,
        })
    }

    /// The key parameter's segment of `path`, if the template matches it.
    fn matches<'p>(&self, path: &'p str) -> Option<&'p str> {
        let mut parts = path.strip_prefix('/')?.split('/');
        let mut found = None;
        for seg in &self.segments {
            match seg {
                Segment::Rest => return found,
                Segment::Literal(l) => {
                    if parts.next()? != l {
                        return None;
                    }
                }
                Segment::Param(name) => {
                    let v = parts.next().filter(|v| !v.is_empty())?;
                    if *name == self.param {
                        found = Some(v);
                    }
                }
            }
        }
        // Without a trailing `{*rest}` the whole path must be consumed (a trailing '/' is not).
        match parts.next() {
            None => found,
            Some(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_whole_paths_and_take_one_segment() -> Result<()> {
        let t = PathTemplate::parse("/accounts/{id}/{*rest}", "id")?;
        assert_eq!(t.matches("/accounts/a-1/deposit"), Some("a-1"));
        assert_eq!(t.matches("/accounts/a-1"), Some("a-1"));
        assert_eq!(t.matches("/accounts/a-1/x/y"), Some("a-1"));
        assert_eq!(t.matches("/accounts//deposit"), None);
        assert_eq!(t.matches("/ledger/a-1"), None);
        assert_eq!(t.matches("accounts/a-1"), None);
        let exact = PathTemplate::parse("/t/{tenant}/accounts/{id}", "id")?;
        assert_eq!(exact.matches("/t/x/accounts/a-2"), Some("a-2"));
        assert_eq!(exact.matches("/t/x/accounts/a-2/more"), None);
        assert_eq!(exact.matches("/t/x/accounts/a-2/"), None);
        assert_eq!(exact.matches("/t/x/accounts"), None);
        for (bad, param) in [
            ("accounts/{id}", "id"),
            ("/accounts/{id}", "account"),
            ("/accounts/{}", ""),
            ("/accounts/{*id}", "id"),
            ("/{*rest}/{id}", "id"),
            ("/{id}/{id}", "id"),
            ("/a{id}", "id"),
            ("/", "id"),
        ] {
            assert!(
                matches!(PathTemplate::parse(bad, param), Err(Error::InvalidInput(_))),
                "{bad:?}"
            );
        }
        Ok(())
    }
}
