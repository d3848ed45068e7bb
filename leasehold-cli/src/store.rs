//! Which store to use: `--store`, then `LEASE_STORE`, then the embedded SQLite default.

use std::path::PathBuf;
use std::sync::Arc;

use leasehold::{Error, LeaseStore, Result};

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
    let parsed = leasehold::StoreUrl::parse(&url)?;
    if let (false, Some(feature)) = (parsed.is_enabled(), parsed.feature()) {
        return Err(Error::config(
            parsed.backend(),
            format!(
                "this `lease` binary was built without the `{feature}` backend; rebuild it with \
                 `cargo install leasehold-cli --features {feature}` (or pick another --store)"
            ),
            None,
        ));
    }
    let store = leasehold::connect(&url).await?;
    Ok((url, store))
}

/// The owner `lease run` acquires as: a readable label followed by a random part, or, on a store
/// that keeps owners in a `uuid` column (PostgreSQL's `layout=coordination_lease`, or `seed`, its
/// old name, in the URL), a random UUID, since no label fits that column.
pub(crate) fn owner_for(url: &str, label: &str) -> leasehold::OwnerId {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    let seed = matches!(scheme.as_deref(), Some("postgres" | "postgresql"))
        && leasehold::backend::UrlParams::parse("postgres", url)
            .ok()
            .and_then(|mut p| p.take("layout"))
            .is_some_and(|l| l == "coordination_lease" || l == "seed");
    if seed {
        leasehold::OwnerId::random()
    } else {
        leasehold::OwnerId::with_label(label)
    }
}

/// The environment variable that acknowledges Redis's asynchronous failover.
pub(crate) const ACCEPT_REDIS_FAILOVER_ENV: &str = "LEASE_ACCEPT_REDIS_FAILOVER";

/// With a Redis store, warns on stderr (unless `accepted`) that its failover is asynchronous:
/// two holders at once, and a fence kept in the same Redis can accept a lower token after a
/// higher one (docs/adr/0021-redis-failover-wait-and-fencing.md).
pub(crate) fn warn_redis_failover(url: &str, key: &leasehold::LeaseKey, accepted: bool) {
    let shares = leasehold::StoreUrl::parse(url).is_ok_and(|u| u.resource_shares_failover());
    if shares && !accepted {
        eprintln!(
            "lease: warning: Redis replicates asynchronously: after a failover (or in a split \
             brain) two holders can hold {key} at once, and a fence kept in the same Redis can \
             accept a lower token after a higher one. Fence your writes with the token in a \
             resource that does not fail over with this Redis. Pass --accept-redis-failover (or \
             set {ACCEPT_REDIS_FAILOVER_ENV}=1) to silence this warning."
        );
    }
}
