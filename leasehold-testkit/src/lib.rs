//! # leasehold-testkit
//!
//! The conformance suite every lease backend runs **unchanged**, plus the tools the fault suite
//! builds on: a history recorder and checker, and a fault-injecting store wrapper.
//!
//! A backend crate runs the suite from `tests/conformance.rs` with `harness = false`:
//!
//! ```no_run
//! use std::sync::Arc;
//! use leasehold_core::{FencedResource, LeaseStore, MemoryFencedResource, MemoryLeaseStore};
//! use leasehold_testkit::{Backend, BoxFuture};
//!
//! #[derive(Debug, Default)]
//! struct Memory { store: MemoryLeaseStore, resource: MemoryFencedResource }
//!
//! impl Backend for Memory {
//!     fn name(&self) -> &'static str { "memory" }
//!     fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
//!         Box::pin(async { Ok(Arc::new(self.store.clone()) as Arc<dyn LeaseStore>) })
//!     }
//!     fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
//!         Box::pin(async { Ok(Arc::new(self.resource.clone()) as Arc<dyn FencedResource>) })
//!     }
//! }
//!
//! fn main() {
//!     leasehold_testkit::run(Memory::default());
//! }
//! ```
//!
//! Every case is reported as its own named test (`conformance::acquire_first_grant`, ...), runs
//! in a fresh random key namespace, and bounds every wait by a deadline.
//!
//! ## Cases are registered per file, gated by capability
//! Each file in [`cases`] registers its cases with a `pub fn cases() -> Vec<Case>`; a case that
//! needs a capability says so with [`Case::needs`](cases::Case::needs) (for example
//! `case!("conformance", watch_wakes_on_release).needs(&[Need::Watch])`). A backend adds its own
//! cases the same way and passes them to [`run_with`]. When the backend's
//! [`Capabilities`](leasehold_core::Capabilities) lack a need, the case is reported as **ignored**
//! with the reason (`ignored (needs capability `watch`; ...)`), never as passed.
//!
//! ## Never skipping silently
//! If the backend's service cannot be reached, the suite **fails** when `CI=true` or
//! `LEASE_TEST_REQUIRE=1` is set, with a test named `service_available` that says which backend
//! was missing and why. Otherwise (a developer machine without the service) every case is reported
//! as *ignored* with that reason, so the report shows it plainly.

pub mod cases;
pub mod env;
pub mod faulty;
pub mod history;
pub mod runner;
pub mod settings;
pub mod stores;
pub mod wipe;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, Lease, LeaseKey, LeaseStore, OwnerId,
};

pub use env::{check_available, require_services, run, run_with, trials};
pub use libtest_mimic::Failed;
pub use runner::{SuiteBackend, SuiteCase, run_suite};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What one case returns. Assertion macros may also panic; both are reported as a failure.
pub type CaseResult = Result<(), Failed>;

/// How the suite reaches a backend. Implemented once per backend crate in its
/// `tests/conformance.rs`.
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// The backend's name, used in the report.
    fn name(&self) -> &'static str;

    /// A new, independent client of the store (its own connection or pool). Called inside the
    /// tokio runtime of the case that uses it.
    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>>;

    /// A fenced resource living in (or next to) the store.
    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>>;

    /// A short TTL the backend can grant, used by the expiry cases. Defaults to 600 ms.
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(600)
    }

    /// Removes whatever the case left under `namespace` (best effort). Defaults to nothing.
    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        let _ = namespace;
        Box::pin(async {})
    }
}

/// What a case gets: a fresh key namespace, a store client, a fenced resource, and helpers.
#[derive(Clone)]
pub struct Ctx {
    backend: Arc<dyn Backend>,
    namespace: String,
    store: Arc<dyn LeaseStore>,
    resource: Arc<dyn FencedResource>,
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("backend", &self.backend.name())
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    /// Builds a context with a fresh random namespace.
    pub async fn new(backend: Arc<dyn Backend>) -> leasehold_core::Result<Self> {
        let store = backend.connect().await?;
        let resource = backend.resource().await?;
        let namespace = random_namespace();
        Ok(Ctx {
            backend,
            namespace,
            store,
            resource,
        })
    }

    /// The backend under test.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The case's key namespace (lowercase, starts with `lt`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A key unique to this case.
    pub fn key(&self, name: &str) -> LeaseKey {
        LeaseKey::new(format!("{}-{name}", self.namespace)).expect("test key names are legal")
    }

    /// The case's store client.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.store
    }

    /// The case's fenced resource.
    pub fn resource(&self) -> &Arc<dyn FencedResource> {
        &self.resource
    }

    /// Another, independent client of the same store.
    pub async fn other_client(&self) -> leasehold_core::Result<Arc<dyn LeaseStore>> {
        self.backend.connect().await
    }

    /// A short TTL for expiry cases: the backend's, rounded up to its granularity and minimum.
    pub fn short_ttl(&self) -> Duration {
        let caps = self.store.capabilities();
        round_up(
            self.backend.short_ttl().max(caps.min_ttl),
            caps.ttl_granularity,
        )
    }

    /// A TTL that does not run out during a case (30 s).
    pub fn long_ttl(&self) -> Duration {
        Duration::from_secs(30)
    }

    /// A generous deadline for something the store should do within `ttl` (expiry, takeover):
    /// three TTLs plus five seconds.
    pub fn expiry_deadline(&self, ttl: Duration) -> Duration {
        ttl * 3 + Duration::from_secs(5)
    }

    /// An acquire request.
    pub fn request(&self, key: &LeaseKey, owner: &OwnerId, ttl: Duration) -> AcquireRequest {
        AcquireRequest::new(key.clone(), owner.clone(), ttl)
    }

    /// Acquires `key` for `owner`, failing the case if the key is held.
    pub async fn must_acquire(
        &self,
        key: &LeaseKey,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Lease, Failed> {
        match self.store.acquire(&self.request(key, owner, ttl)).await? {
            AcquireOutcome::Acquired(lease) => Ok(lease),
            AcquireOutcome::Held(h) => Err(format!(
                "expected to acquire {key}, but {} holds it with token {}",
                h.owner, h.token
            )
            .into()),
        }
    }

    /// Acquires `key` for `owner` through `store`, failing the case if the key is held.
    pub async fn must_acquire_with(
        &self,
        store: &dyn LeaseStore,
        key: &LeaseKey,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Lease, Failed> {
        match store.acquire(&self.request(key, owner, ttl)).await? {
            AcquireOutcome::Acquired(lease) => Ok(lease),
            AcquireOutcome::Held(h) => Err(format!(
                "expected to acquire {key}, but {} holds it with token {}",
                h.owner, h.token
            )
            .into()),
        }
    }

    /// Retries acquiring `key` until granted or `within` passes (polling every 20 ms, or woken by
    /// the store's watch). Used to wait out an expiry.
    pub async fn acquire_within(
        &self,
        store: &dyn LeaseStore,
        key: &LeaseKey,
        owner: &OwnerId,
        ttl: Duration,
        within: Duration,
    ) -> Result<Lease, Failed> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let AcquireOutcome::Acquired(lease) =
                store.acquire(&self.request(key, owner, ttl)).await?
            {
                return Ok(lease);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("{key} was not acquirable within {within:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the store reports no holder for `key`, or fails after `within`.
    pub async fn wait_free(&self, key: &LeaseKey, within: Duration) -> CaseResult {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.store.inspect(key).await?.holder.is_none() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("{key} still held after {within:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn round_up(d: Duration, granularity: Duration) -> Duration {
    let g = granularity.as_nanos().max(1);
    let n = d.as_nanos().div_ceil(g) * g;
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

fn random_namespace() -> String {
    let mut s = String::from("lt");
    for _ in 0..10 {
        s.push(fastrand::alphanumeric().to_ascii_lowercase());
    }
    s
}

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
