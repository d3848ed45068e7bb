//! Which store to use: `--store`, then `LEASE_STORE`, then the embedded SQLite default.

use std::path::PathBuf;
use std::sync::Arc;

use lease::{Error, LeaseStore, Result};

/// The environment variable naming the store when `--store` is not given.
pub(crate) const STORE_ENV: &str = "LEASE_STORE";

/// The store URL to use.
pub(crate) fn resolve(flag: Option<&str>) -> Result<String> {
    if let Some(url) = flag.filter(|s| !s.trim().is_empty()) {
        return Ok(url.to_string());
    }
    if let Ok(url) = std::env::var(STORE_ENV)
        && !url.trim().is_empty()
    {
        return Ok(url);
    }
    default_url()
}

/// `sqlite://` + the default database file, creating its directory.
fn default_url() -> Result<String> {
    if !cfg!(feature = "sqlite") {
        return Err(Error::config(
            "lease",
            format!(
                "no store given and this build has no embedded SQLite store: pass --store URL or set {STORE_ENV}"
            ),
            None,
        ));
    }
    let path = default_path()?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::config(
                "sqlite",
                format!("cannot create the state directory {}: {e}", dir.display()),
                Some(e.into()),
            )
        })?;
    }
    Ok(format!("sqlite://{}", path.display()))
}

/// `$XDG_STATE_HOME/lease/leases.db`, or `~/.local/state/lease/leases.db`.
pub(crate) fn default_path() -> Result<PathBuf> {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let base = absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|h| h.join(".local").join("state")))
        .ok_or_else(|| {
            Error::config(
                "lease",
                format!(
                    "neither XDG_STATE_HOME nor HOME is set to an absolute path: pass --store URL or set {STORE_ENV}"
                ),
                None,
            )
        })?;
    Ok(base.join("lease").join("leases.db"))
}

/// Resolves and connects.
pub(crate) async fn open(flag: Option<&str>) -> Result<(String, Arc<dyn LeaseStore>)> {
    let url = resolve(flag)?;
    let store = lease::connect(&url).await?;
    Ok((url, store))
}
