//! How the store authenticates to the apiserver, each way named: the static bearer token of the
//! test kubeconfig, a client certificate the apiserver trusts (`--client-ca-file`), and the typed
//! errors of a kubeconfig whose CA did not sign the server's certificate or whose token is wrong.

use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::{Error, FencedResource, LeaseStore, OwnerId, ReleaseOutcome, WriteOp};
use leasehold_k8s::{K8sLeaseStore, K8sOptions};
use leasehold_testkit::{CaseResult, Ctx};

use super::env;

/// No operation in these cases may take longer (a wrong CA must fail, not hang).
const BOUND: Duration = Duration::from_secs(20);

fn state_file(var: &str, default: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            let state =
                std::env::var("LEASE_STATE_DIR").unwrap_or_else(|_| "/tmp/lease-test".into());
            PathBuf::from(state).join(default)
        }
    }
}

fn read(path: &PathBuf) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{}: {e} (written by scripts/services/k8s.sh start)",
            path.display()
        )
    })
}

async fn store_from(path: &PathBuf) -> leasehold_core::Result<K8sLeaseStore> {
    K8sLeaseStore::connect_with(
        "k8s://",
        K8sOptions::default()
            .with_kubeconfig(path)
            .with_namespace(env::namespace())
            .with_request_timeout(Duration::from_secs(5)),
    )
    .await
}

/// A grant, a fenced write and a release through `store`, each bounded.
async fn round_trip(ctx: &Ctx, store: &K8sLeaseStore, name: &str) -> CaseResult {
    let key = ctx.key(name);
    let lease = tokio::time::timeout(
        BOUND,
        ctx.must_acquire_with(store, &key, &OwnerId::with_label("auth"), ctx.long_ttl()),
    )
    .await
    .map_err(|_| "acquire hung")??;
    let out = store
        .fenced_resource()
        .write(&key, lease.token(), WriteOp::Add(1))
        .await?;
    assert!(out.is_accepted(), "{out:?}");
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    Ok(())
}

/// The test kubeconfig authenticates with a static bearer token (`--token-auth-file`).
pub(crate) async fn bearer_token_kubeconfig_grants_and_fences(ctx: Ctx) -> CaseResult {
    let path = env::kubeconfig();
    let text = read(&path)?;
    assert!(
        text.contains("token:") && !text.contains("client-certificate"),
        "{} does not authenticate with a bearer token only",
        path.display()
    );
    round_trip(&ctx, &store_from(&path).await?, "bearer").await
}

/// A kubeconfig with a client certificate signed by the CA the apiserver trusts for clients.
pub(crate) async fn client_certificate_kubeconfig_grants_and_fences(ctx: Ctx) -> CaseResult {
    let path = state_file("LEASE_K8S_CERT_KUBECONFIG", "k8s/kubeconfig-client-cert");
    let text = read(&path)?;
    assert!(
        text.contains("client-certificate:") && !text.contains("token:"),
        "{} does not authenticate with a client certificate only",
        path.display()
    );
    round_trip(&ctx, &store_from(&path).await?, "cert").await
}

/// The bearer kubeconfig rewritten by `edit`, in a temporary file.
fn edited_kubeconfig(name: &str, edit: impl Fn(&str) -> String) -> Result<PathBuf, String> {
    let text = read(&env::kubeconfig())?;
    let edited: String = text.lines().map(|l| edit(l) + "\n").collect();
    let path =
        std::env::temp_dir().join(format!("leasehold-k8s-{name}-{}.yaml", std::process::id()));
    std::fs::write(&path, edited).map_err(|e| e.to_string())?;
    Ok(path)
}

/// A kubeconfig whose `certificate-authority` did not sign the apiserver's certificate: a typed,
/// non-retryable configuration error that names the certificate, promptly.
pub(crate) async fn wrong_ca_kubeconfig_is_a_config_error_not_a_hang(ctx: Ctx) -> CaseResult {
    let wrong_ca = state_file("LEASE_K8S_WRONG_CA", "k8s/pki/wrong-ca.crt");
    read(&wrong_ca)?;
    let path = edited_kubeconfig("wrong-ca", |l| {
        match l.split_once("certificate-authority:") {
            Some((indent, _)) => format!("{indent}certificate-authority: {}", wrong_ca.display()),
            None => l.to_owned(),
        }
    })?;
    let result = tokio::time::timeout(BOUND, async {
        let store = store_from(&path).await?;
        store.inspect(&ctx.key("wrong-ca")).await
    })
    .await
    .map_err(|_| "a wrong CA hung")?;
    let _ = std::fs::remove_file(&path);
    match result {
        Err(e @ Error::Config { .. }) => {
            assert!(!e.is_retryable(), "{e}");
            assert!(e.to_string().contains("certificate"), "{e}");
            Ok(())
        }
        other => Err(format!("wrong CA: expected Error::Config, got {other:?}").into()),
    }
}

/// A server whose certificate has expired: a typed, non-retryable configuration error that says
/// so, promptly. No apiserver here has an expired certificate, so the TLS etcd member that
/// `scripts/services/etcd-tls.sh` runs with one (`LEASE_ETCD_TLS_EXPIRED_ENDPOINTS`, signed by
/// the test CA in `LEASE_ETCD_TLS_DIR`) stands in: the kubeconfig names it as the server and
/// trusts that CA, so the client refuses the certificate in the TLS handshake, before any HTTP
/// is spoken, exactly as it would an apiserver's.
pub(crate) async fn expired_server_certificate_is_a_config_error_not_a_hang(
    ctx: Ctx,
) -> CaseResult {
    let endpoint = std::env::var("LEASE_ETCD_TLS_EXPIRED_ENDPOINTS")
        .ok()
        .and_then(|e| e.split(',').next().map(str::trim).map(str::to_owned))
        .filter(|e| !e.is_empty())
        .ok_or(
            "LEASE_ETCD_TLS_EXPIRED_ENDPOINTS is not set (source /tmp/lease-test/etcd-tls.env, \
             written by scripts/services/etcd-tls.sh start)",
        )?;
    let pki = std::env::var("LEASE_ETCD_TLS_DIR").unwrap_or_else(|_| "/tmp/lease-test/pki".into());
    let ca = PathBuf::from(pki).join("ca.crt");
    read(&ca)?;
    // The file's name must not say "expired": the error is checked for that word.
    let path = edited_kubeconfig("stale-server-cert", |l| {
        if let Some((indent, _)) = l.split_once("certificate-authority:") {
            format!("{indent}certificate-authority: {}", ca.display())
        } else if let Some((indent, _)) = l.split_once("server:") {
            format!("{indent}server: https://{endpoint}")
        } else {
            l.to_owned()
        }
    })?;
    let result = tokio::time::timeout(BOUND, async {
        let store = store_from(&path).await?;
        store.inspect(&ctx.key("stale-cert")).await
    })
    .await
    .map_err(|_| "an expired server certificate hung")?;
    let _ = std::fs::remove_file(&path);
    match result {
        Err(e @ Error::Config { .. }) => {
            assert!(!e.is_retryable(), "{e}");
            assert!(
                e.to_string()
                    .contains("the apiserver's certificate has expired"),
                "{e}"
            );
            println!("as expected: {e}");
            Ok(())
        }
        other => Err(format!("expired certificate: expected Error::Config, got {other:?}").into()),
    }
}

/// A client certificate from a CA the apiserver does not trust: the apiserver completes the TLS
/// handshake and answers 401, a typed non-retryable error, promptly.
pub(crate) async fn untrusted_client_certificate_is_a_typed_error(ctx: Ctx) -> CaseResult {
    let wrong_ca = state_file("LEASE_K8S_WRONG_CA", "k8s/pki/wrong-ca.crt");
    read(&wrong_ca)?;
    let key = wrong_ca.with_extension("key");
    let path = edited_kubeconfig("untrusted-cert", |l| match l.split_once("token:") {
        Some((indent, _)) => format!(
            "{indent}client-certificate: {}\n{indent}client-key: {}",
            wrong_ca.display(),
            key.display()
        ),
        None => l.to_owned(),
    })?;
    let result = tokio::time::timeout(BOUND, async {
        let store = store_from(&path).await?;
        store.inspect(&ctx.key("untrusted-cert")).await
    })
    .await
    .map_err(|_| "an untrusted client certificate hung")?;
    let _ = std::fs::remove_file(&path);
    match result {
        Err(e @ Error::Backend { .. }) => {
            assert!(!e.is_retryable(), "{e}");
            assert!(e.to_string().contains("401"), "{e}");
            Ok(())
        }
        other => Err(format!(
            "untrusted client certificate: expected Error::Backend (401), got {other:?}"
        )
        .into()),
    }
}

/// A bearer token the apiserver does not know: 401, a typed non-retryable error, promptly.
pub(crate) async fn wrong_bearer_token_is_a_typed_error(ctx: Ctx) -> CaseResult {
    let path = edited_kubeconfig("wrong-token", |l| match l.split_once("token:") {
        Some((indent, _)) => format!("{indent}token: not-the-token"),
        None => l.to_owned(),
    })?;
    let result = tokio::time::timeout(BOUND, async {
        let store = store_from(&path).await?;
        store.inspect(&ctx.key("wrong-token")).await
    })
    .await
    .map_err(|_| "a wrong token hung")?;
    let _ = std::fs::remove_file(&path);
    match result {
        Err(e @ Error::Backend { .. }) => {
            assert!(!e.is_retryable(), "{e}");
            assert!(e.to_string().contains("401"), "{e}");
            Ok(())
        }
        other => Err(format!("wrong token: expected Error::Backend (401), got {other:?}").into()),
    }
}
