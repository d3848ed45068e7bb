//! leasehold-mysql over TLS, against the real MariaDB of `scripts/services/mariadb.sh` (plain and
//! TLS on one port): the shared leasehold-testkit suite, unchanged, over
//! `ssl-mode=verify-identity` with a client certificate (a user the server admits only with it),
//! plus the cases of this file (group `mysql_tls`): password authentication over verified TLS,
//! the client certificate required for its user, `verify-ca` without the name check, and a wrong
//! CA, a wrong host name, a missing client certificate, a wrong password and a connection without
//! TLS each refused with a typed, non-retryable error that names the cause, within a bound, with
//! nothing written.
//!
//! Servers: `LEASE_MYSQL_TLS_CERT_URL` (client certificate), `LEASE_MYSQL_TLS_URL` (password, TLS
//! required for the user), as the script exports them, read through leasehold-testkit's test
//! store table (`stores::MYSQL`). Missing, the backend is reported unavailable (a failure under
//! CI / LEASE_TEST_REQUIRE).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{AcquireRequest, Error, FencedResource, LeaseStore, OwnerId, ReleaseOutcome};
use leasehold_mysql::{MysqlLeaseStore, MysqlOptions, TableName};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{Backend, BoxFuture, CaseResult, Ctx, case};

/// How long a refused connection may take to be reported: far above a handshake on loopback, far
/// below "hangs".
const REFUSAL_BOUND: Duration = Duration::from_secs(15);

/// The table of the suite over TLS (the plain suite's is `lease_my_test`).
const TABLE: &str = "lease_my_tls";

/// The value of the variable `name` of leasehold-testkit's test store `mysql` (the TLS URLs have
/// no default), or a configuration error naming it.
fn env(name: &str) -> leasehold_core::Result<String> {
    leasehold_testkit::stores::MYSQL
        .var(name)
        .ok_or_else(|| format!("{name} is not in leasehold-testkit's test store table"))
        .and_then(|v| v.require())
        .map_err(|e| Error::config("mysql", e, None))
}

/// `url` with its query parameter `name` set to `value` (added, or replaced).
fn with_param(url: &str, name: &str, value: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut params: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty() && p.split('=').next() != Some(name))
        .map(str::to_string)
        .collect();
    params.push(format!("{name}={value}"));
    format!("{base}?{}", params.join("&"))
}

/// `url` without the query parameters named in `names`.
fn without_params(url: &str, names: &[&str]) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !names.contains(&p.split('=').next().unwrap_or_default()))
        .collect();
    format!("{base}?{}", kept.join("&"))
}

/// The directory of the test PKI, from the CA the URL names.
fn tls_dir(url: &str) -> String {
    let ca = url
        .split(['?', '&'])
        .find_map(|p| p.strip_prefix("ssl-ca="))
        .expect("the TLS URLs name their CA");
    ca.rsplit_once('/')
        .map(|(d, _)| d.to_string())
        .expect("a path")
}

/// The `host:port` of a URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest).to_string()
}

fn options(table: &str) -> MysqlOptions {
    MysqlOptions::new(TableName::parse(table).expect("legal table name"))
        .with_max_connections(2)
        .with_acquire_timeout(Duration::from_secs(5))
}

/// A client of the suite's table over mutual TLS (the schema is installed once in `main`).
async fn cert_store() -> leasehold_core::Result<MysqlLeaseStore> {
    MysqlLeaseStore::connect_with(
        &env("LEASE_MYSQL_TLS_CERT_URL")?,
        options(TABLE).with_migrate(false),
    )
    .await
}

#[derive(Debug)]
struct MysqlTls;

impl Backend for MysqlTls {
    fn name(&self) -> &'static str {
        "mysql_tls"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(cert_store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(cert_store().await?.fenced_resource()) as Arc<dyn FencedResource>)
        })
    }

    /// As the plain suite's: the shared 2-core machine can stall a round trip past TTL / 3.
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(2000)
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = cert_store().await {
                let _ = store.delete_prefix(namespace).await;
            }
        })
    }
}

/// The session's TLS version (`Ssl_version`), empty without TLS.
async fn tls_version(store: &MysqlLeaseStore) -> Result<String, sqlx::Error> {
    let row: (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_version'")
        .fetch_one(store.pool())
        .await?;
    Ok(row.1)
}

/// A lease over `ssl-mode=verify-identity` with password authentication for a user the server
/// admits over TLS only: granted, released, and the session is encrypted.
async fn password_auth_over_verified_tls_works(ctx: Ctx) -> CaseResult {
    let store =
        MysqlLeaseStore::connect_with(&env("LEASE_MYSQL_TLS_URL")?, options("lease_my_tls_pw"))
            .await?;
    let version = tls_version(&store).await?;
    assert!(version.starts_with("TLS"), "not encrypted: {version:?}");
    let key = ctx.key("pw");
    let lease = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("pw"), ctx.long_ttl())
        .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    let _ = store.delete_prefix(ctx.namespace()).await;
    Ok(())
}

/// The certificate user logs in by its certificate alone (no password), over TLS; the session
/// is that user's.
async fn client_certificate_logs_its_user_in(_ctx: Ctx) -> CaseResult {
    let store = cert_store().await?;
    let version = tls_version(&store).await?;
    assert!(version.starts_with("TLS"), "not encrypted: {version:?}");
    let user: String = sqlx::query_scalar("SELECT CURRENT_USER()")
        .fetch_one(store.pool())
        .await?;
    assert!(user.starts_with("lease-client@"), "logged in as {user}");
    Ok(())
}

/// A TCP forwarder on 127.0.0.2 (a loopback address the server's certificate does not name) to
/// `upstream`, for as long as the returned task runs.
async fn forwarder(upstream: String) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    Ok((addr, task))
}

/// Connects to `url` and expects a refusal: within [`REFUSAL_BOUND`], an [`Error::Config`] (never
/// retryable: retrying cannot fix a certificate or a password) whose text names `cause`.
async fn refused(url: &str, what: &str, cause: &[&str]) -> CaseResult {
    let result = tokio::time::timeout(
        REFUSAL_BOUND,
        MysqlLeaseStore::connect_with(url, options("lease_my_tls_refused")),
    )
    .await
    .map_err(|_| format!("{what}: no answer within {REFUSAL_BOUND:?}"))?;
    let err = match result {
        Ok(_) => return Err(format!("{what}: the connection was accepted").into()),
        Err(e) => e,
    };
    let text = format!("{err} / {:?}", std::error::Error::source(&err)).to_lowercase();
    if !matches!(err, Error::Config { .. }) || err.is_retryable() {
        return Err(format!("{what}: not a non-retryable configuration error: {err:?}").into());
    }
    if !cause.iter().any(|c| text.contains(c)) {
        return Err(
            format!("{what}: the error does not name the cause ({cause:?}): {text}").into(),
        );
    }
    Ok(())
}

/// A CA that did not sign the server's certificate, a host name the certificate does not name
/// (`verify-ca` accepts it: the chain alone is checked), a missing client certificate, a wrong
/// password and a connection without TLS for a user that requires it.
async fn bad_credentials_are_typed_errors_naming_the_cause(_ctx: Ctx) -> CaseResult {
    let pw = env("LEASE_MYSQL_TLS_URL")?;
    let cert = env("LEASE_MYSQL_TLS_CERT_URL")?;
    let dir = tls_dir(&pw);
    let wrong_ca = with_param(&pw, "ssl-ca", &format!("{dir}/other-ca.crt"));
    refused(&wrong_ca, "wrong CA", &["unknownissuer", "unknown issuer"]).await?;

    let hp = host_port(&pw);
    let (addr, task) = forwarder(hp.clone()).await?;
    let other_host = pw.replacen(&hp, &addr.to_string(), 1);
    let result = refused(
        &other_host,
        "host name not in the certificate",
        &["notvalidforname", "not valid for name"],
    )
    .await;
    // verify-ca checks the chain alone: accepted through the same address, and encrypted.
    let verify_ca = with_param(&other_host, "ssl-mode", "verify-ca");
    let accepted: CaseResult = async {
        let store = MysqlLeaseStore::connect_with(&verify_ca, options("lease_my_tls_refused"))
            .await
            .map_err(|e| format!("verify-ca through {addr}: {e}"))?;
        let version = tls_version(&store).await?;
        assert!(version.starts_with("TLS"), "not encrypted: {version:?}");
        Ok(())
    }
    .await;
    // The forwarder serves both checks above: stopped only after them.
    task.abort();
    result?;
    accepted?;

    let no_cert = without_params(&cert, &["ssl-cert", "ssl-key"]);
    refused(&no_cert, "no client certificate", &["access denied"]).await?;
    let wrong_pw = pw.replacen("lease-tls-pw", "not-the-password", 1);
    refused(&wrong_pw, "wrong password", &["access denied"]).await?;
    let plain = without_params(&with_param(&pw, "ssl-mode", "disabled"), &["ssl-ca"]);
    refused(&plain, "no TLS", &["access denied"]).await?;
    Ok(())
}

/// A client whose TLS settings are wrong writes nothing: with a CA that did not sign the
/// server's certificate, an acquire (on a pool that connects on first use) fails with a
/// non-retryable configuration error and the key stays without a row.
async fn a_refused_handshake_changes_nothing(ctx: Ctx) -> CaseResult {
    let pw = env("LEASE_MYSQL_TLS_URL")?;
    let wrong_ca = with_param(&pw, "ssl-ca", &format!("{}/other-ca.crt", tls_dir(&pw)));
    let lazy = MysqlLeaseStore::connect_lazy(&wrong_ca, options(TABLE))?;
    let key = ctx.key("untouched");
    let err = match tokio::time::timeout(
        REFUSAL_BOUND,
        lazy.acquire(&AcquireRequest::new(
            key.clone(),
            OwnerId::with_label("wrong-ca"),
            ctx.long_ttl(),
        )),
    )
    .await
    .map_err(|_| format!("no answer within {REFUSAL_BOUND:?}"))?
    {
        Ok(outcome) => {
            return Err(format!("acquired over an unverified server: {outcome:?}").into());
        }
        Err(e) => e,
    };
    assert!(
        matches!(err, Error::Config { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    let good = cert_store().await?;
    let state = good.inspect(&key).await?;
    assert!(
        state.holder.is_none() && state.last_token.is_none(),
        "the key was written: {state:?}"
    );
    Ok(())
}

/// Installs the suite's schema once, over mutual TLS. A failure is left to the testkit, which
/// reports the backend unavailable.
fn migrate_once() {
    let rt = leasehold_testkit::env::runtime();
    let result = rt.block_on(async {
        let store =
            MysqlLeaseStore::connect_lazy(&env("LEASE_MYSQL_TLS_CERT_URL")?, options(TABLE))?;
        store.migrate().await
    });
    if let Err(e) = result {
        eprintln!("leasehold-mysql: migrate before the TLS suite failed: {e}");
    }
}

fn main() {
    migrate_once();
    leasehold_testkit::run_with(
        MysqlTls,
        vec![
            case!("mysql_tls", password_auth_over_verified_tls_works),
            case!("mysql_tls", client_certificate_logs_its_user_in),
            case!(
                "mysql_tls",
                bad_credentials_are_typed_errors_naming_the_cause
            ),
            case!("mysql_tls", a_refused_handshake_changes_nothing),
        ] as Vec<Case>,
    );
}
