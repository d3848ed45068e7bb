//! The TLS settings of an `etcds://` connection, from the PEM files the options name.
//!
//! The files are read (synchronously: a few kilobytes) and checked when the store connects, so a
//! missing file, or one without a certificate or key, is a configuration error naming the file
//! rather than a failed handshake later.

use std::path::Path;

use etcd_client::{Certificate, Identity, TlsOptions};
use leasehold_core::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::EtcdOptions;
use crate::error::BACKEND;

/// The TLS settings for `options`: its CA file (else the system's trust store) and its client
/// certificate and key, if any.
pub(crate) fn tls_options(options: &EtcdOptions) -> Result<TlsOptions> {
    let mut tls = TlsOptions::new();
    tls = match options.tls_ca() {
        Some(ca) => {
            let pem = read(ca, "CA certificate")?;
            certificates(ca, "CA certificate", &pem)?;
            tls.ca_certificate(Certificate::from_pem(pem))
        }
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = options.tls_client_cert() {
        let cert_pem = read(cert, "client certificate")?;
        certificates(cert, "client certificate", &cert_pem)?;
        let key_pem = read(key, "client key")?;
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            Error::config(
                BACKEND,
                format!("client key {}: no PEM private key: {e}", key.display()),
                None,
            )
        })?;
        tls = tls.identity(Identity::from_pem(cert_pem, key_pem));
    }
    Ok(tls)
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::config(
            BACKEND,
            format!("{what} {}: {e}", path.display()),
            Some(Box::new(e) as _),
        )
    })
}

/// Checks that `pem` holds at least one certificate, and nothing unparsable.
fn certificates(path: &Path, what: &str, pem: &[u8]) -> Result<()> {
    let bad =
        |why: String| Error::config(BACKEND, format!("{what} {}: {why}", path.display()), None);
    let mut n = 0usize;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| bad(format!("unreadable PEM: {e}")))?;
        n += 1;
    }
    if n == 0 {
        return Err(bad("no PEM certificate in the file".into()));
    }
    Ok(())
}
