//! The query parameters of a store URL, for backends: one parser for every backend's options.

use std::time::Duration;

use crate::error::{Error, Result};

/// The query of a store URL (`scheme://...?name=value&...`), split and percent-decoded, from
/// which a backend *takes* the parameters it knows into its options. Whatever is left when the
/// backend calls [`finish`](UrlParams::finish) is an error naming it and the known names, so a
/// misspelt parameter (`sslrootcrt=`) is never silently ignored.
///
/// Values are typed by the `take_*` method that reads them: durations are a whole number with a
/// unit (`250ms`, `2s`, `5m`, `1h`), booleans `true`/`false` (or `1`/`0`, `yes`/`no`, `on`/`off`),
/// counts decimal. A parameter named twice is an error.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::backend::UrlParams;
/// let mut p = UrlParams::parse("postgres", "postgres://db/app?table=locks.leases&op_timeout=2s&sslmode=verify-full")?;
/// assert_eq!(p.base(), "postgres://db/app");
/// assert_eq!(p.take("table").as_deref(), Some("locks.leases"));
/// assert_eq!(p.take_duration("op_timeout")?, Some(Duration::from_secs(2)));
/// let driver = p.take_all(&["sslmode", "sslrootcert"]);
/// assert_eq!(driver, vec![("sslmode".to_string(), "verify-full".to_string())]);
/// p.finish(&["table", "op_timeout", "sslmode", "sslrootcert"])?;
///
/// let mut typo = UrlParams::parse("postgres", "postgres://db/app?sslrootcrt=/ca.pem")?;
/// let err = typo.finish(&["sslrootcert"]).unwrap_err();
/// assert!(err.to_string().contains("sslrootcrt"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct UrlParams {
    backend: &'static str,
    base: String,
    params: Vec<(String, String)>,
}

impl UrlParams {
    /// Splits `url` at its first `?` and decodes the query. A `#fragment` is kept in
    /// [`base`](UrlParams::base).
    ///
    /// # Errors
    /// [`Error::Config`] for a parameter without `=`, an empty name, a bad `%` escape, or a name
    /// given twice.
    pub fn parse(backend: &'static str, url: &str) -> Result<Self> {
        let (base, query) = match url.split_once('?') {
            None => (url.to_string(), ""),
            Some((base, rest)) => match rest.split_once('#') {
                Some((query, fragment)) => (format!("{base}#{fragment}"), query),
                None => (base.to_string(), rest),
            },
        };
        let mut params: Vec<(String, String)> = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let Some((name, value)) = pair.split_once('=') else {
                return Err(config(
                    backend,
                    format!("URL parameter {pair:?} has no value (write name=value)"),
                ));
            };
            let name = decode(backend, name)?;
            let value = decode(backend, value)?;
            if name.is_empty() {
                return Err(config(backend, "a URL parameter has an empty name".into()));
            }
            if params.iter().any(|(n, _)| *n == name) {
                return Err(config(
                    backend,
                    format!("URL parameter {name:?} is given twice"),
                ));
            }
            params.push((name, value));
        }
        Ok(UrlParams {
            backend,
            base,
            params,
        })
    }

    /// The URL without its query.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether no parameter is left.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Removes and returns the value of `name`.
    pub fn take(&mut self, name: &str) -> Option<String> {
        let i = self.params.iter().position(|(n, _)| n == name)?;
        Some(self.params.remove(i).1)
    }

    /// Removes every parameter whose name is in `names` and returns them in their URL order, for
    /// a driver that reads its own parameters (`sslmode=` for PostgreSQL).
    pub fn take_all(&mut self, names: &[&str]) -> Vec<(String, String)> {
        let (taken, kept) = std::mem::take(&mut self.params)
            .into_iter()
            .partition(|(n, _)| names.contains(&n.as_str()));
        self.params = kept;
        taken
    }

    /// Removes `name` and parses it with `parse`, whose error text says what was expected.
    ///
    /// # Errors
    /// [`Error::Config`] naming the parameter, its value and what `parse` said.
    pub fn take_with<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> std::result::Result<T, String>,
    ) -> Result<Option<T>> {
        match self.take(name) {
            None => Ok(None),
            Some(value) => parse(&value).map(Some).map_err(|why| {
                config(
                    self.backend,
                    format!("URL parameter {name}={value:?}: {why}"),
                )
            }),
        }
    }

    /// Removes `name` and parses it as a duration: a whole number and a unit, `ms`, `s`, `m` or
    /// `h` (`0s` is zero).
    ///
    /// # Errors
    /// [`Error::Config`] for anything else, or a duration too large to hold.
    pub fn take_duration(&mut self, name: &str) -> Result<Option<Duration>> {
        self.take_with(name, parse_duration)
    }

    /// Removes `name` and parses it as a boolean (`true`/`false`, `1`/`0`, `yes`/`no`,
    /// `on`/`off`).
    ///
    /// # Errors
    /// [`Error::Config`] for anything else.
    pub fn take_bool(&mut self, name: &str) -> Result<Option<bool>> {
        self.take_with(name, |v| match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err("expected true or false".into()),
        })
    }

    /// Removes `name` and parses it as a decimal count.
    ///
    /// # Errors
    /// [`Error::Config`] for anything that is not a number of that type.
    pub fn take_count<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>> {
        self.take_with(name, |v| {
            v.parse::<T>()
                .map_err(|_| "expected a whole number in range".to_string())
        })
    }

    /// Checks that every parameter was taken.
    ///
    /// # Errors
    /// [`Error::Config`] naming each unknown parameter and the `known` names.
    pub fn finish(self, known: &[&str]) -> Result<()> {
        if self.params.is_empty() {
            return Ok(());
        }
        let unknown: Vec<&str> = self.params.iter().map(|(n, _)| n.as_str()).collect();
        Err(config(
            self.backend,
            format!(
                "unknown URL parameter{} {} (known: {})",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", "),
                known.join(", ")
            ),
        ))
    }

    /// Ends the parse for a backend whose driver reads parameters of its own: takes the
    /// `driver` parameters, checks that nothing else is left ([`finish`](UrlParams::finish), with
    /// `options` and `driver` as the known names), and gives the URL to hand to the driver: the
    /// base with only the driver's parameters.
    ///
    /// ```
    /// use leasehold_core::backend::UrlParams;
    /// let mut p = UrlParams::parse("postgres", "postgres://db/app?op_timeout=2s&sslmode=require")?;
    /// p.take("op_timeout");
    /// let url = p.finish_for_driver(&["op_timeout"], &["sslmode"])?;
    /// assert_eq!(url, "postgres://db/app?sslmode=require");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`finish`](UrlParams::finish).
    pub fn finish_for_driver(mut self, options: &[&str], driver: &[&str]) -> Result<String> {
        let passed = self.take_all(driver);
        let base = std::mem::take(&mut self.base);
        let known: Vec<&str> = options.iter().chain(driver).copied().collect();
        self.finish(&known)?;
        Ok(UrlParams::join(&base, &passed))
    }

    /// `base` with `params` as its query, percent-encoded: the URL to hand to a driver.
    pub fn join(base: &str, params: &[(String, String)]) -> String {
        if params.is_empty() {
            return base.to_string();
        }
        let (base, fragment) = match base.split_once('#') {
            Some((b, f)) => (b, Some(f)),
            None => (base, None),
        };
        let query: Vec<String> = params
            .iter()
            .map(|(n, v)| format!("{}={}", encode(n), encode(v)))
            .collect();
        match fragment {
            Some(f) => format!("{base}?{}#{f}", query.join("&")),
            None => format!("{base}?{}", query.join("&")),
        }
    }
}

fn config(backend: &'static str, message: String) -> Error {
    Error::Config {
        backend,
        message,
        source: None,
    }
}

fn parse_duration(v: &str) -> std::result::Result<Duration, String> {
    const EXPECTED: &str = "expected a whole number and a unit: ms, s, m or h (for example 500ms)";
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    let (n, unit) = v.split_at(digits);
    let n: u64 = n.parse().map_err(|_| EXPECTED.to_string())?;
    let secs_per = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(EXPECTED.into()),
    };
    n.checked_mul(secs_per)
        .map(Duration::from_secs)
        .ok_or_else(|| "too large".to_string())
}

fn decode(backend: &'static str, s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(b) => out.push(b),
                None => return Err(config(backend, format!("bad % escape in {s:?}"))),
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| config(backend, format!("{s:?} is not UTF-8 once decoded")))
}

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/:,".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit_and_fit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in [
            "",
            "5",
            "s",
            "1.5s",
            "-1s",
            "1 s",
            "1d",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(parse_duration(&format!("{}h", u64::MAX)).is_err());
    }

    #[test]
    fn parameters_decode_and_round_trip() {
        let mut p = UrlParams::parse("x", "s://h/db?a=1%2F2&b=%E2%9C%93&c=").unwrap();
        assert_eq!(p.take("a").as_deref(), Some("1/2"));
        assert_eq!(p.take("b").as_deref(), Some("\u{2713}"));
        assert_eq!(p.take("c").as_deref(), Some(""));
        assert!(p.is_empty());
        let url = UrlParams::join("s://h/db", &[("k".into(), "a b&c=d".into())]);
        assert_eq!(url, "s://h/db?k=a%20b%26c%3Dd");
        let mut back = UrlParams::parse("x", &url).unwrap();
        assert_eq!(back.take("k").as_deref(), Some("a b&c=d"));
    }

    #[test]
    fn malformed_queries_are_config_errors() {
        for bad in [
            "s://h?a",
            "s://h?=1",
            "s://h?a=1&a=2",
            "s://h?a=%zz",
            "s://h?a=%e2",
        ] {
            let err = UrlParams::parse("x", bad).unwrap_err();
            assert!(matches!(err, Error::Config { .. }), "{bad}: {err:?}");
        }
    }

    #[test]
    fn fragments_stay_with_the_base() {
        let p = UrlParams::parse("x", "s://h?a=1#frag").unwrap();
        assert_eq!(p.base(), "s://h#frag");
        assert_eq!(
            UrlParams::join(p.base(), &[("a".into(), "1".into())]),
            "s://h?a=1#frag"
        );
    }

    #[test]
    fn leftovers_are_named_with_the_known_ones() {
        let mut p = UrlParams::parse("x", "s://h?tabel=t&table=u").unwrap();
        assert_eq!(p.take("table").as_deref(), Some("u"));
        let err = p.finish(&["table"]).unwrap_err().to_string();
        assert!(
            err.contains("tabel") && err.contains("known: table"),
            "{err}"
        );
        let mut typed = UrlParams::parse("x", "s://h?n=x&b=maybe&d=5").unwrap();
        assert!(typed.take_count::<u32>("n").is_err());
        assert!(typed.take_bool("b").is_err());
        assert!(typed.take_duration("d").is_err());
    }
}
