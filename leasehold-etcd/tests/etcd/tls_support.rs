//! The TLS member of `scripts/services/etcd-tls.sh` (client certificates required,
//! authentication enabled) as a leasehold-testkit backend, in one of two ways of authenticating, and
//! the cases in which TLS or authentication must fail with a typed error naming the cause.
//!
//! Environment (written to `etcd-tls.env` by the script): `LEASE_ETCD_TLS_ENDPOINTS` (host:port),
//! `LEASE_ETCD_TLS_EXPIRED_ENDPOINTS` (a member whose server certificate has expired),
//! `LEASE_ETCD_TLS_USER` / `LEASE_ETCD_TLS_PASSWORD`, `LEASE_ETCD_TLS_DIR` (the test PKI).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Error, FencedResource, LeaseStore};
use leasehold_etcd::{EtcdLeaseStore, EtcdOptions};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{Backend, BoxFuture, CaseResult, Ctx, Failed};

#[path = "wipe.rs"]
mod wipe;

/// How a store authenticates to the TLS member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// The client certificate alone (etcd takes its common name, `lease-client`, as the user),
    /// every TLS file named by the URL's query parameters.
    Certificate,
    /// The client certificate and a user with a password, set through the `EtcdOptions`
    /// builder methods.
    Password,
}

fn env(name: &str) -> leasehold_core::Result<String> {
    std::env::var(name).map_err(|_| {
        Error::config(
            "etcd",
            format!(
                "{name} is not set (run scripts/services/etcd-tls.sh start and source etcd-tls.env)"
            ),
            None,
        )
    })
}

fn pki(file: &str) -> leasehold_core::Result<String> {
    Ok(format!("{}/{file}", env("LEASE_ETCD_TLS_DIR")?))
}

/// The URL and options of a store on the TLS member.
pub(crate) fn target(auth: Auth) -> leasehold_core::Result<(String, EtcdOptions)> {
    let endpoint = env("LEASE_ETCD_TLS_ENDPOINTS")?;
    Ok(match auth {
        Auth::Certificate => (
            format!(
                "etcds://{endpoint}?tls_ca={}&tls_cert={}&tls_key={}",
                pki("ca.crt")?,
                pki("client.crt")?,
                pki("client.key")?
            ),
            EtcdOptions::default(),
        ),
        Auth::Password => (
            format!("etcds://{endpoint}"),
            EtcdOptions::default()
                .with_tls_ca(pki("ca.crt")?)
                .with_tls_client_cert(pki("client.crt")?, pki("client.key")?)
                .with_user(env("LEASE_ETCD_TLS_USER")?, env("LEASE_ETCD_TLS_PASSWORD")?),
        ),
    })
}

async fn connect(auth: Auth) -> leasehold_core::Result<EtcdLeaseStore> {
    let (url, options) = target(auth)?;
    EtcdLeaseStore::connect_with(&url, options).await
}

/// The TLS member, authenticated one way.
#[derive(Debug)]
pub(crate) struct EtcdTls(pub(crate) Auth);

impl Backend for EtcdTls {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(connect(self.0).await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(connect(self.0).await?.fenced_resource()) as Arc<dyn FencedResource>)
        })
    }

    /// As for the plain member: etcd's TTLs are whole seconds.
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = connect(self.0).await {
                wipe::delete_case_namespace(&store, namespace).await;
            }
        })
    }
}

/// The cases in which connecting must fail with a typed error naming the cause.
pub(crate) fn refusals() -> Vec<Case> {
    vec![
        case!("etcd", a_wrong_ca_is_a_config_error_naming_the_certificate),
        case!("etcd", an_expired_server_certificate_is_a_config_error),
        case!("etcd", a_wrong_password_is_a_config_error),
        case!("etcd", a_missing_client_certificate_fails_typed_and_bounded),
        case!("etcd", missing_tls_files_are_config_errors_naming_them),
        case!("etcd", etcdctl_lock_over_tls_and_auth_excludes_the_store),
    ]
}

/// Connects to `url` with `options` and expects [`Error::Config`] whose message contains each of
/// `naming`, within 20 s (a bound, never a hang).
async fn refused(url: &str, options: EtcdOptions, naming: &[&str]) -> CaseResult {
    let options = options
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(5));
    let outcome = tokio::time::timeout(
        Duration::from_secs(20),
        EtcdLeaseStore::connect_with(url, options),
    )
    .await
    .map_err(|_| format!("{url}: no answer within 20 s"))?;
    match outcome {
        Err(e @ Error::Config { .. }) => {
            let text = e.to_string();
            println!("{url}: {text}");
            for word in naming {
                if !text.contains(word) {
                    return Err(format!("{url}: the error does not name {word:?}: {text}").into());
                }
            }
            if e.is_retryable() {
                return Err(format!("{url}: a configuration error is retryable: {text}").into());
            }
            Ok(())
        }
        other => Err(Failed::from(format!(
            "{url}: expected a configuration error, got {other:?}"
        ))),
    }
}

/// A CA that signed nothing of the member's: the handshake's refusal of the server certificate
/// is the error.
pub(crate) async fn a_wrong_ca_is_a_config_error_naming_the_certificate(_ctx: Ctx) -> CaseResult {
    let (_, options) = target(Auth::Password)?;
    let url = format!(
        "etcds://{}?tls_ca={}",
        env("LEASE_ETCD_TLS_ENDPOINTS")?,
        pki("other-ca.crt")?
    );
    refused(&url, options, &["TLS", "certificate", "UnknownIssuer"]).await
}

/// A member whose server certificate (signed by the right CA) has expired.
pub(crate) async fn an_expired_server_certificate_is_a_config_error(_ctx: Ctx) -> CaseResult {
    let (_, options) = target(Auth::Certificate)?;
    let url = format!(
        "etcds://{}?tls_ca={}&tls_cert={}&tls_key={}",
        env("LEASE_ETCD_TLS_EXPIRED_ENDPOINTS")?,
        pki("ca.crt")?,
        pki("client.crt")?,
        pki("client.key")?
    );
    refused(&url, options, &["TLS", "certificate", "expired"]).await
}

/// The right certificates, the right user, the wrong password: etcd's refusal is the error, and
/// the password appears nowhere in it.
pub(crate) async fn a_wrong_password_is_a_config_error(_ctx: Ctx) -> CaseResult {
    let (url, options) = target(Auth::Password)?;
    let user = env("LEASE_ETCD_TLS_USER")?;
    let options = options.with_user(user.clone(), "not-the-password");
    refused(
        &url,
        options.clone(),
        &["credentials", &user, "authentication failed"],
    )
    .await?;
    let text = format!(
        "{:?}",
        EtcdLeaseStore::connect_with(&url, options).await.err()
    );
    assert!(!text.contains("not-the-password"), "{text}");
    Ok(())
}

/// The member requires a client certificate; a store without one is refused. The server closes
/// the connection after the handshake, which the client sees as a broken pipe rather than as a
/// TLS alert (so not always as a certificate problem): a typed error either way, within 20 s.
pub(crate) async fn a_missing_client_certificate_fails_typed_and_bounded(_ctx: Ctx) -> CaseResult {
    let url = format!(
        "etcds://{}?tls_ca={}",
        env("LEASE_ETCD_TLS_ENDPOINTS")?,
        pki("ca.crt")?
    );
    let options = EtcdOptions::default()
        .with_user(env("LEASE_ETCD_TLS_USER")?, env("LEASE_ETCD_TLS_PASSWORD")?)
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(5));
    let outcome = tokio::time::timeout(
        Duration::from_secs(20),
        EtcdLeaseStore::connect_with(&url, options),
    )
    .await
    .map_err(|_| format!("{url}: no answer within 20 s"))?;
    match outcome {
        Err(e @ (Error::Config { .. } | Error::Unavailable { .. })) => {
            println!("{url}: {e}");
            Ok(())
        }
        other => Err(format!("{url}: expected Config or Unavailable, got {other:?}").into()),
    }
}

/// A CA file that does not exist, and a key file that holds no key: errors naming the file,
/// before any connection.
pub(crate) async fn missing_tls_files_are_config_errors_naming_them(_ctx: Ctx) -> CaseResult {
    let endpoint = env("LEASE_ETCD_TLS_ENDPOINTS")?;
    let url = format!("etcds://{endpoint}?tls_ca=/nonexistent/ca.crt");
    refused(&url, EtcdOptions::default(), &["/nonexistent/ca.crt"]).await?;
    let ca = pki("ca.crt")?;
    let url = format!("etcds://{endpoint}?tls_ca={ca}&tls_cert={ca}&tls_key={ca}");
    refused(&url, EtcdOptions::default(), &["client key", &ca]).await
}

/// `etcdctl lock` on the TLS member needs the CA, a client certificate and a user (here the
/// password user; its role may read and write the lock's keys): it holds the name, the store is
/// refused and names the etcdctl key; once etcdctl unlocks (SIGINT), the store acquires.
pub(crate) async fn etcdctl_lock_over_tls_and_auth_excludes_the_store(ctx: Ctx) -> CaseResult {
    use leasehold_core::{AcquireOutcome, OwnerId, ReleaseOutcome};
    use tokio::io::AsyncBufReadExt;
    let store = connect(Auth::Password).await?;
    let key = ctx.key("etcdctl-tls");
    let name = store.options().lock_name(&key);
    let bin = std::env::var("LEASE_ETCDCTL_BIN").unwrap_or_else(|_| "/usr/bin/etcdctl".into());
    let user = format!(
        "{}:{}",
        env("LEASE_ETCD_TLS_USER")?,
        env("LEASE_ETCD_TLS_PASSWORD")?
    );
    let mut child = tokio::process::Command::new(&bin)
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &format!("https://{}", env("LEASE_ETCD_TLS_ENDPOINTS")?),
            "--cacert",
            &pki("ca.crt")?,
            "--cert",
            &pki("client.crt")?,
            "--key",
            &pki("client.key")?,
            "--user",
            &user,
            "lock",
            "--ttl",
            "10",
            &name,
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawn {bin}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let held = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .map_err(|_| "etcdctl did not lock a free name within 10 s")??
        .ok_or("etcdctl exited without taking the lock")?;
    assert!(
        held.starts_with(&format!("{name}/")),
        "etcdctl printed {held:?}"
    );

    let b = OwnerId::with_label("b");
    match store
        .acquire(&ctx.request(&key, &b, ctx.long_ttl()))
        .await?
    {
        AcquireOutcome::Held(h) => assert_eq!(h.owner.as_str(), format!("etcd-lock:{held}")),
        AcquireOutcome::Acquired(l) => {
            return Err(format!("granted token {} while etcdctl holds the lock", l.token()).into());
        }
    }
    let pid = child.id().ok_or("etcdctl already exited")?;
    let status = tokio::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .await?;
    assert!(status.success(), "kill -INT failed");
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .map_err(|_| "etcdctl did not exit")??;
    let lease = ctx
        .acquire_within(&store, &key, &b, ctx.long_ttl(), Duration::from_secs(10))
        .await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    Ok(())
}
