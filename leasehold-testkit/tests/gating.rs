//! Capability gating: a case whose needs the backend lacks is reported as ignored, never passed.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, FencedResource, KeyState, KeyWatch, Lease,
    LeaseKey, LeaseStore, MemoryFencedResource, MemoryLeaseStore, ReleaseOutcome, RenewOutcome,
    Result,
};
use leasehold_testkit::cases::{self, Case, Need};
use leasehold_testkit::{Backend, BoxFuture};
use libtest_mimic::{Arguments, Conclusion};

/// The memory store with watch switched off: capabilities say so and `watch()` gives `None`.
#[derive(Debug, Clone, Default)]
struct NoWatch(MemoryLeaseStore);

#[async_trait]
impl LeaseStore for NoWatch {
    fn backend(&self) -> &'static str {
        "memory-no-watch"
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities().with_watch(false)
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.0.acquire(req).await
    }
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        self.0.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.0.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.0.inspect(key).await
    }
    async fn watch(&self, _key: &LeaseKey) -> Result<Option<KeyWatch>> {
        Ok(None)
    }
}

#[derive(Debug, Default)]
struct Memory {
    watch: bool,
    store: MemoryLeaseStore,
    resource: MemoryFencedResource,
}

impl Backend for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }
    fn connect(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseStore>>> {
        Box::pin(async {
            Ok(if self.watch {
                Arc::new(self.store.clone()) as Arc<dyn LeaseStore>
            } else {
                Arc::new(NoWatch(self.store.clone())) as Arc<dyn LeaseStore>
            })
        })
    }
    fn resource(&self) -> BoxFuture<'_, Result<Arc<dyn FencedResource>>> {
        Box::pin(async { Ok(Arc::new(self.resource.clone()) as Arc<dyn FencedResource>) })
    }
}

fn watch_cases() -> Vec<Case> {
    cases::acquire::cases()
        .into_iter()
        .filter(|c| c.name.starts_with("watch_"))
        .collect()
}

fn run(watch: bool, args: &Arguments) -> Conclusion {
    let backend: Arc<dyn Backend> = Arc::new(Memory {
        watch,
        ..Memory::default()
    });
    let availability = leasehold_testkit::check_available(&backend);
    let trials = leasehold_testkit::trials(backend, watch_cases(), availability, true);
    libtest_mimic::run(args, trials)
}

fn args() -> Arguments {
    Arguments {
        test_threads: Some(1),
        ..Arguments::default()
    }
}

#[test]
fn the_watch_case_is_registered_with_its_need() {
    let cases = watch_cases();
    let wake = cases
        .iter()
        .find(|c| c.name == "watch_wakes_on_release")
        .expect("registered");
    assert_eq!(wake.needs, &[Need::Watch]);
    let agree = cases
        .iter()
        .find(|c| c.name == "watch_agrees_with_capabilities")
        .expect("registered");
    assert!(
        agree.needs.is_empty(),
        "every backend runs the agreement case"
    );
    let no_watch = MemoryLeaseStore::new().capabilities().with_watch(false);
    assert!(wake.unmet(&no_watch).unwrap().contains("watch"));
    assert_eq!(wake.unmet(&MemoryLeaseStore::new().capabilities()), None);
}

#[test]
fn a_backend_without_watch_reports_the_watch_case_ignored_not_passed() {
    // service_available and watch_agrees_with_capabilities pass; watch_wakes_on_release is ignored.
    let c = run(false, &args());
    assert_eq!(
        (c.num_passed, c.num_ignored, c.num_failed),
        (2, 1, 0),
        "{c:?}"
    );
    // Asking for ignored cases to run does not turn the unsupported one into a pass.
    let c = run(
        false,
        &Arguments {
            include_ignored: true,
            ..args()
        },
    );
    assert_eq!(
        (c.num_passed, c.num_ignored, c.num_failed),
        (2, 1, 0),
        "{c:?}"
    );
}

#[test]
fn a_backend_with_watch_runs_and_passes_the_watch_case() {
    let c = run(true, &args());
    assert_eq!(
        (c.num_passed, c.num_ignored, c.num_failed),
        (3, 0, 0),
        "{c:?}"
    );
}

/// A required backend that cannot be reached fails every run of its target, also one filtered to
/// a few cases by name (which filters out `service_available`): no filter can make it pass by
/// reporting everything as ignored.
#[test]
fn a_required_unreachable_backend_fails_whatever_the_filter() {
    let trials = || {
        let backend: Arc<dyn Backend> = Arc::new(Memory::default());
        leasehold_testkit::trials(
            backend,
            watch_cases(),
            Err("connection refused".to_string()),
            true,
        )
    };
    let c = libtest_mimic::run(&args(), trials());
    assert_eq!((c.num_passed, c.num_failed), (0, 3), "{c:?}");
    let filtered = Arguments {
        filter: Some("watch_wakes".to_string()),
        ..args()
    };
    let c = libtest_mimic::run(&filtered, trials());
    assert_eq!((c.num_passed, c.num_failed), (0, 1), "{c:?}");
    // Not required (a developer's machine without the service): ignored, with the reason.
    let backend: Arc<dyn Backend> = Arc::new(Memory::default());
    let lax = leasehold_testkit::trials(
        backend,
        watch_cases(),
        Err("connection refused".to_string()),
        false,
    );
    let c = libtest_mimic::run(&filtered, lax);
    assert_eq!((c.num_failed, c.num_ignored), (0, 1), "{c:?}");
}
