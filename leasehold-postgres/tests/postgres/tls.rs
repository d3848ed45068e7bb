//! leasehold-postgres over TLS, against a real PostgreSQL server that accepts TLS connections only
//! (`scripts/services/postgres-tls.sh`): the shared leasehold-testkit suite, unchanged, over
//! `sslmode=verify-full` with client-certificate authentication, plus the cases of this file
//! (group `postgres_tls`): password authentication over verified TLS, and a wrong CA, an expired
//! server certificate, a missing client certificate, a wrong password and a plain connection each
//! refused with a typed, non-retryable error that names the cause, within a bound.
//!
//! Servers: `LEASE_POSTGRES_TLS_CERT_URL` (mutual TLS), `LEASE_POSTGRES_TLS_URL` (password),
//! `LEASE_POSTGRES_TLS_EXPIRED_URL` (a server whose certificate expired), as the script exports
//! them. Missing, the backend is reported unavailable (a failure under CI / LEASE_TEST_REQUIRE).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Error, FencedResource, LeaseStore, OwnerId, ReleaseOutcome};
use leasehold_postgres::{PostgresLeaseStore, PostgresOptions, TableName};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{Backend, BoxFuture, CaseResult, Ctx, case};

/// How long a refused connection may take to be reported: far above a handshake on loopback, far
/// below "hangs".
const REFUSAL_BOUND: Duration = Duration::from_secs(15);

/// The `postgres-tls` variable `name` of the test store table (`leasehold_testkit::stores`):
/// these have no default, so an unset one is a typed configuration error.
fn env(name: &str) -> leasehold_core::Result<String> {
    let var = leasehold_testkit::stores::POSTGRES_TLS
        .var(name)
        .ok_or_else(|| {
            Error::config(
                "postgres",
                format!("{name} is not a postgres-tls variable of the test store table"),
                None,
            )
        })?;
    var.require().map_err(|e| {
        Error::config(
            "postgres",
            format!("{e}: run scripts/services/postgres-tls.sh start"),
            None,
        )
    })
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

fn tls_dir(url: &str) -> String {
    let ca = url
        .split(['?', '&'])
        .find_map(|p| p.strip_prefix("sslrootcert="))
        .expect("the TLS URLs name their CA");
    ca.rsplit_once('/')
        .map(|(d, _)| d.to_string())
        .expect("a path")
}

fn options(table: &str) -> PostgresOptions {
    PostgresOptions::new(TableName::parse(table).expect("legal table name"))
        .with_max_connections(2)
        .with_acquire_timeout(Duration::from_secs(5))
}

async fn cert_store() -> leasehold_core::Result<PostgresLeaseStore> {
    PostgresLeaseStore::connect_with(
        &env("LEASE_POSTGRES_TLS_CERT_URL")?,
        options("public.lease_tls"),
    )
    .await
}

#[derive(Debug)]
struct PostgresTls;

impl Backend for PostgresTls {
    fn name(&self) -> &'static str {
        "postgres_tls"
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

/// A lease over `sslmode=verify-full` with password (SCRAM) authentication: granted, released,
/// and the session is encrypted.
async fn password_auth_over_verified_tls_works(ctx: Ctx) -> CaseResult {
    let store = PostgresLeaseStore::connect_with(
        &env("LEASE_POSTGRES_TLS_URL")?,
        options("lease_tls_pw.leases"),
    )
    .await?;
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(store.pool())
            .await?;
    assert!(encrypted, "the session must be encrypted");
    let key = ctx.key("pw");
    let lease = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("pw"), ctx.long_ttl())
        .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    let _ = store.delete_prefix(ctx.namespace()).await;
    Ok(())
}

/// Connects to `url` and expects a refusal: within [`REFUSAL_BOUND`], an [`Error::Config`] (never
/// retryable: retrying cannot fix a certificate or a password) whose text names `cause`.
async fn refused(url: &str, what: &str, cause: &[&str]) -> CaseResult {
    let result = tokio::time::timeout(
        REFUSAL_BOUND,
        PostgresLeaseStore::connect_with(url, options("public.lease_tls_refused")),
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

/// A CA that did not sign the server's certificate, an expired server certificate, a missing
/// client certificate, a wrong password and a connection without TLS.
async fn bad_credentials_are_typed_errors_naming_the_cause(_ctx: Ctx) -> CaseResult {
    let pw = env("LEASE_POSTGRES_TLS_URL")?;
    let cert = env("LEASE_POSTGRES_TLS_CERT_URL")?;
    let dir = tls_dir(&pw);
    let wrong_ca = with_param(&pw, "sslrootcert", &format!("{dir}/other-ca.crt"));
    refused(&wrong_ca, "wrong CA", &["certificate", "unknownissuer"]).await?;
    let expired = env("LEASE_POSTGRES_TLS_EXPIRED_URL")?;
    refused(&expired, "expired server certificate", &["expired"]).await?;
    let no_cert = cert
        .split(['?', '&'])
        .filter(|p| !p.starts_with("sslcert=") && !p.starts_with("sslkey="))
        .collect::<Vec<_>>();
    let no_cert = format!("{}?{}", no_cert[0], no_cert[1..].join("&"));
    refused(&no_cert, "no client certificate", &["certificate"]).await?;
    let wrong_pw = pw.replacen("lease-pw-secret", "not-the-password", 1);
    refused(&wrong_pw, "wrong password", &["password"]).await?;
    let plain = with_param(&pw, "sslmode", "disable");
    refused(&plain, "no TLS", &["no encryption", "pg_hba"]).await?;
    Ok(())
}

fn main() {
    leasehold_testkit::run_with(
        PostgresTls,
        vec![
            case!("postgres_tls", password_auth_over_verified_tls_works),
            case!(
                "postgres_tls",
                bad_credentials_are_typed_errors_naming_the_cause
            ),
        ] as Vec<Case>,
    );
}
