//! The whole leasehold-testkit suite over TLS with ACL authentication
//! (`LEASE_REDIS_TLS_URL`, started by `scripts/services/redis-tls.sh`), plus the TLS cases:
//! mutual TLS, and a wrong CA, an expired server certificate, a missing client certificate and a
//! wrong password each failing with a typed error that names the cause, within the connect
//! timeout. The servers with other certificates are started by the cases, from the test PKI
//! (`LEASE_TLS_DIR`, written by `scripts/services/certs.sh`).

#[allow(dead_code)]
mod cases;
#[allow(dead_code)]
mod server;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Error, FencedResource, LeaseStore, OwnerId};
use leasehold_redis::{RedisLeaseStore, RedisOptions};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{Backend, BoxFuture, CaseResult, Ctx, Failed, case};

use cases::{PREFIX, acquire_on};
use server::RedisServer;

/// The TLS server's URL: `LEASE_REDIS_TLS_URL`, default the service script's.
fn url() -> String {
    leasehold_testkit::stores::REDIS_TLS_URL.get()
}

/// A file of the test PKI: `$LEASE_TLS_DIR/<name>`, default `/tmp/lease-test/pki/<name>`.
fn pki(name: &str) -> PathBuf {
    PathBuf::from(leasehold_testkit::stores::pki_dir()).join(name)
}

/// `url()` without its query (host, port and credentials only).
fn base_url() -> String {
    let url = url();
    url.split_once('?')
        .map_or(url.clone(), |(b, _)| b.to_string())
}

#[derive(Debug)]
struct Tls;

async fn store() -> leasehold_core::Result<RedisLeaseStore> {
    RedisLeaseStore::connect_with(&url(), RedisOptions::default().with_prefix(PREFIX)).await
}

impl Backend for Tls {
    fn name(&self) -> &'static str {
        "redis-tls"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(store().await?.fenced_resource()) as Arc<dyn FencedResource>)
        })
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = store().await {
                cases::delete_matching(&store, &store.layout().scan_pattern(namespace)).await;
            }
        })
    }
}

/// Short timeouts, so that a failing connect shows it is bounded by them.
fn quick() -> RedisOptions {
    RedisOptions::default()
        .with_prefix(PREFIX)
        .with_connect_timeout(Duration::from_secs(2))
        .with_response_timeout(Duration::from_secs(2))
        .with_connect_retries(0)
}

/// Connects to `url` with `options`, expecting an [`Error::Config`] whose message contains every
/// one of `words`; a hang (past twice the operation deadline) fails the case.
async fn expect_config(url: &str, options: RedisOptions, words: &[&str]) -> CaseResult {
    let hung = Duration::from_secs(20);
    let out = tokio::time::timeout(hung, RedisLeaseStore::connect_with(url, options))
        .await
        .map_err(|_| format!("connect to {url} hung for {hung:?}"))?;
    match out {
        Err(Error::Config {
            backend: "redis",
            message,
            ..
        }) => {
            for word in words {
                if !message.contains(word) {
                    return Err(format!("{word:?} missing from {message:?}").into());
                }
            }
            assert!(!message.contains("lease-pass"), "password in {message:?}");
            eprintln!("as expected: {message}");
            Ok(())
        }
        other => Err(format!("{url}: expected Error::Config, got {other:?}").into()),
    }
}

/// A server that requires a client certificate (`--tls-auth-clients yes`): with the client
/// certificate the store works; without one the connect fails with a `Config` error naming it.
async fn mutual_tls(ctx: Ctx) -> CaseResult {
    let ca = pki("ca.crt");
    let server = tls_server("server", "yes").await?;
    let url = format!("rediss://127.0.0.1:{}", server.port());
    let store = RedisLeaseStore::connect_with(
        &url,
        quick()
            .with_tls_ca_file(&ca)
            .with_tls_client_cert(pki("client.crt"), pki("client.key")),
    )
    .await?;
    acquire_on(
        &store,
        &ctx.key("mtls"),
        &OwnerId::with_label("a"),
        Duration::from_secs(5),
    )
    .await?;
    // The same through the URL's parameters.
    let by_url = format!(
        "{url}?tls_ca={}&tls_cert={}&tls_key={}",
        ca.display(),
        pki("client.crt").display(),
        pki("client.key").display()
    );
    RedisLeaseStore::connect_with(&by_url, quick()).await?;
    expect_config(
        &url,
        quick().with_tls_ca_file(&ca),
        &["client", "certificate"],
    )
    .await
}

/// A server whose certificate has expired: `Config`, naming the expiry.
async fn an_expired_server_certificate_is_a_config_error(_ctx: Ctx) -> CaseResult {
    let server = tls_server("expired", "no").await?;
    let url = format!("rediss://127.0.0.1:{}", server.port());
    expect_config(&url, quick().with_tls_ca_file(pki("ca.crt")), &["expired"]).await
}

/// A CA that did not sign the server's certificate (given, or the built-in web roots when none
/// is): `Config`, naming the untrusted issuer.
async fn a_wrong_ca_is_a_config_error(_ctx: Ctx) -> CaseResult {
    let base = base_url();
    expect_config(
        &base,
        quick().with_tls_ca_file(pki("other-ca.crt")),
        &["not signed by a trusted CA"],
    )
    .await?;
    expect_config(&base, quick(), &["not signed by a trusted CA"]).await
}

/// A wrong password, an unknown user, no credentials: `Config` (authentication), never a hang.
async fn a_wrong_password_is_a_config_error(_ctx: Ctx) -> CaseResult {
    let good = url();
    let wrong = good.replacen(":lease-pass@", ":not-the-password@", 1);
    let unknown = good.replacen("lease:lease-pass@", "nobody:lease-pass@", 1);
    let anonymous = good.replacen("lease:lease-pass@", "", 1);
    assert!(
        wrong != good && unknown != good && anonymous != good,
        "{good}"
    );
    expect_config(&wrong, quick(), &["auth"]).await?;
    expect_config(&unknown, quick(), &["auth"]).await?;
    expect_config(&anonymous, quick(), &["NOAUTH"]).await
}

/// Parameters the store does not know, a file that does not exist, and TLS files on a plain
/// `redis://` URL are `Config` errors before any connection.
async fn bad_tls_parameters_are_config_errors(_ctx: Ctx) -> CaseResult {
    let base = base_url();
    expect_config(
        &format!("{base}?tls_ca_file=/x"),
        quick(),
        &["unknown URL parameter"],
    )
    .await?;
    expect_config(
        &format!("{base}?tls_ca=/no/such/ca.crt"),
        quick(),
        &["/no/such/ca.crt"],
    )
    .await?;
    expect_config(
        "redis://127.0.0.1:6379",
        quick().with_tls_ca_file(pki("ca.crt")),
        &["rediss://"],
    )
    .await
}

/// A TLS-only server with the PKI's `<cert>.crt`/`<cert>.key` and `--tls-auth-clients <auth>`.
async fn tls_server(cert: &str, auth: &str) -> Result<RedisServer, Failed> {
    let (crt, key, ca) = (
        pki(&format!("{cert}.crt")),
        pki(&format!("{cert}.key")),
        pki("ca.crt"),
    );
    for f in [&crt, &key, &ca] {
        if !f.exists() {
            return Err(format!(
                "{} missing: run scripts/services/certs.sh start (or set LEASE_TLS_DIR)",
                f.display()
            )
            .into());
        }
    }
    RedisServer::start_tls(&[
        "--tls-cert-file",
        &crt.display().to_string(),
        "--tls-key-file",
        &key.display().to_string(),
        "--tls-ca-cert-file",
        &ca.display().to_string(),
        "--tls-auth-clients",
        auth,
    ])
    .await
}

fn extra() -> Vec<Case> {
    vec![
        case!("redis_tls", mutual_tls),
        case!("redis_tls", an_expired_server_certificate_is_a_config_error),
        case!("redis_tls", a_wrong_ca_is_a_config_error),
        case!("redis_tls", a_wrong_password_is_a_config_error),
        case!("redis_tls", bad_tls_parameters_are_config_errors),
    ]
}

fn main() {
    leasehold_testkit::run_with(Tls, extra());
}
