//! TLS: the certificate files from [`RedisOptions`] and the URL's query, and the `redis` clients
//! built with them (rustls with ring).

use std::path::{Path, PathBuf};

use leasehold_core::{Error, Result};
use redis::{ClientTlsConfig, TlsCertificates};

use crate::config::RedisOptions;
use crate::error::BACKEND;

/// The TLS files of a connection: a CA to trust instead of the built-in web roots, and a client
/// certificate with its key for mutual TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

impl TlsFiles {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The certificates these files hold, read now.
    ///
    /// # Errors
    /// [`Error::Config`] for a file that cannot be read, or a certificate without its key (or
    /// the reverse).
    fn certificates(&self) -> Result<TlsCertificates> {
        let client_tls = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read(cert, "client certificate")?,
                client_key: read(key, "client key")?,
            }),
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Err(config(
                    "a client certificate needs its key and a key its certificate \
                     (tls_cert and tls_key, or RedisOptions::with_tls_client_cert)"
                        .to_string(),
                ));
            }
        };
        let root_cert = self
            .ca
            .as_deref()
            .map(|ca| read(ca, "CA certificate"))
            .transpose()?;
        Ok(TlsCertificates {
            client_tls,
            root_cert,
        })
    }
}

fn config(message: String) -> Error {
    Error::config(BACKEND, message, None)
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::config(
            BACKEND,
            format!("cannot read the {what} file {}: {e}", path.display()),
            Some(Box::new(e) as leasehold_core::BoxError),
        )
    })
}

/// A connection URL for the driver, and the TLS files of the options.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// The URL with only the driver's query parameters (a fragment such as `#insecure` is kept).
    pub(crate) url: String,
    pub(crate) tls: TlsFiles,
    /// Whether the scheme asks for TLS (`rediss://`, `rediss+cluster://`).
    pub(crate) secure: bool,
}

/// Reads the store's options off `url`'s query ([`RedisOptions::with_url`]) and checks that TLS
/// files come with a TLS scheme.
///
/// # Errors
/// As [`RedisOptions::with_url`], and [`Error::Config`] for TLS files with a scheme that is not
/// TLS.
pub(crate) fn target(url: &str, options: RedisOptions) -> Result<(Target, RedisOptions)> {
    let (url, options) = options.with_url(url)?;
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    let secure = matches!(scheme.as_str(), "rediss" | "rediss+cluster" | "valkeys");
    let tls = options.tls.clone();
    if !tls.is_empty() && !secure {
        return Err(config(format!(
            "unusable Redis URL {}: TLS files are given, but the scheme is not rediss:// or \
             rediss+cluster://",
            redact(&url)
        )));
    }
    Ok((Target { url, tls, secure }, options))
}

/// `url` with the password replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// A client for one server: `url` is a `redis://`, `rediss://` or `redis+unix://` URL; with TLS
/// files, it must be `rediss://`.
///
/// # Errors
/// [`Error::Config`] for an unusable URL or unreadable TLS files.
pub(crate) fn client(url: &str, tls: &TlsFiles, secure: bool) -> Result<redis::Client> {
    if secure {
        ensure_crypto_provider();
    }
    let opened = if tls.is_empty() {
        redis::Client::open(url)
    } else {
        redis::Client::build_with_tls(url, tls.certificates()?)
    };
    opened.map_err(|e| {
        Error::config(
            BACKEND,
            format!("unusable Redis URL {}: {e}", redact(url)),
            Some(Box::new(e) as leasehold_core::BoxError),
        )
    })
}

/// The certificates for a cluster client, if any file is given.
pub(crate) fn cluster_certificates(
    tls: &TlsFiles,
    secure: bool,
) -> Result<Option<TlsCertificates>> {
    if secure {
        ensure_crypto_provider();
    }
    if tls.is_empty() {
        Ok(None)
    } else {
        tls.certificates().map(Some)
    }
}

/// The `redis` crate builds its rustls configuration with the process-wide default crypto
/// provider. If the application has not installed one, install ring's (the workspace's one TLS
/// stack), so that a build that links a second provider does not make rustls refuse to choose.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one between the check and here: then theirs stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> Result<Target> {
        target(url, RedisOptions::default()).map(|(t, _)| t)
    }

    #[test]
    fn tls_parameters_are_taken_off_the_url() {
        let t =
            split("rediss://u:p@h:1/2?tls_ca=/c%20a.pem&tls_cert=/c&tls_key=/k#insecure").unwrap();
        assert_eq!(t.url, "rediss://u:p@h:1/2#insecure");
        assert!(t.secure);
        assert_eq!(t.tls.ca.as_deref(), Some(Path::new("/c a.pem")));
        assert_eq!(t.tls.cert.as_deref(), Some(Path::new("/c")));
        assert_eq!(t.tls.key.as_deref(), Some(Path::new("/k")));
        let plain = split("redis://h:1?protocol=resp3").unwrap();
        assert_eq!(plain.url, "redis://h:1?protocol=resp3");
        assert!(!plain.secure && plain.tls.is_empty());
        let cluster = split("rediss+cluster://a:1,b:2?tls_ca=/ca").unwrap();
        assert_eq!(cluster.url, "rediss+cluster://a:1,b:2");
        assert!(cluster.secure);
    }

    #[test]
    fn bad_parameters_are_config_errors() {
        let with_ca = RedisOptions::default().with_tls_ca_file("/ca");
        for (url, options, why) in [
            (
                "rediss://h:1?tls_ca=/a&tls_ca=/b",
                RedisOptions::default(),
                "twice",
            ),
            (
                "rediss://h:1?sslmode=require",
                RedisOptions::default(),
                "unknown URL parameter",
            ),
            (
                "redis://h:1?tls_ca=/a",
                RedisOptions::default(),
                "not rediss",
            ),
            ("redis://h:1", with_ca.clone(), "not rediss"),
            (
                "rediss://h:1?tls_ca=/a",
                with_ca,
                "both in the URL and in the options",
            ),
        ] {
            match target(url, options) {
                Err(Error::Config { message, .. }) => {
                    assert!(message.contains(why), "{url}: {message}");
                }
                other => panic!("{url}: expected Config, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let half = TlsFiles {
            cert: Some("/c".into()),
            ..TlsFiles::default()
        };
        assert!(matches!(half.certificates(), Err(Error::Config { .. })));
        let missing = TlsFiles {
            ca: Some("/no/such/ca.pem".into()),
            ..TlsFiles::default()
        };
        match missing.certificates() {
            Err(Error::Config { message, .. }) => assert!(message.contains("/no/such/ca.pem")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("rediss://u:secret@h:1"), "rediss://u:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
