//! Running the suite: availability checks, the CI rule, and one named trial per case.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::Capabilities;
use libtest_mimic::{Arguments, Completion, Failed, Trial};

use crate::cases::{self, Case};
use crate::{Backend, Ctx};

/// Whether a missing service must fail the run: `CI` is `true`/`1` or `LEASE_TEST_REQUIRE` is `1`.
pub fn require_services() -> bool {
    let set = |name: &str| {
        std::env::var(name)
            .map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
            .unwrap_or(false)
    };
    set("CI") || set("LEASE_TEST_REQUIRE")
}

/// How long a single case may run before it fails.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// A runtime for one case (two worker threads, time and I/O enabled).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs every conformance case against `backend` and exits the process with the result.
pub fn run<B: Backend>(backend: B) -> ! {
    run_with(backend, Vec::new())
}

/// Runs every conformance case plus `extra` backend-specific cases, then exits.
///
/// A case whose [`needs`](Case::needs) the backend's capabilities lack is reported as ignored,
/// with the reason.
pub fn run_with<B: Backend>(backend: B, extra: Vec<Case>) -> ! {
    let args = Arguments::from_args();
    let backend: Arc<dyn Backend> = Arc::new(backend);
    let mut all = cases::all();
    all.extend(extra);
    let availability = check_available(&backend);
    let trials = trials(backend, all, availability, require_services());
    libtest_mimic::run(&args, trials).exit()
}

/// Turns `cases` into one named trial each, for a backend whose availability probe gave
/// `availability` (its capabilities, or why it could not be reached).
///
/// - An unreachable backend, when `require` is set (CI or `LEASE_TEST_REQUIRE`), gives a
///   `service_available` trial and every case as trials that fail with the reason, so that a run
///   filtered to some cases by name fails too; without `require`, every case is ignored with the
///   reason.
/// - A reachable backend gives a passing `service_available` trial; a case whose needs its
///   capabilities lack is ignored with the reason (never passed); every other case runs.
pub fn trials(
    backend: Arc<dyn Backend>,
    cases: Vec<Case>,
    availability: Result<Capabilities, String>,
    require: bool,
) -> Vec<Trial> {
    let name = backend.name();
    let mut trials = Vec::new();
    let caps = match availability {
        Ok(caps) => {
            trials.push(Trial::test("service_available", || Ok(())));
            Some(caps)
        }
        Err(reason) => {
            if require {
                let msg = format!(
                    "backend {name} is required (CI or LEASE_TEST_REQUIRE) but unavailable: {reason}"
                );
                eprintln!("ERROR: {msg}");
                let unavailable =
                    |trial: String, msg: String| Trial::test(trial, move || Err(Failed::from(msg)));
                trials.push(unavailable("service_available".into(), msg.clone()));
                trials.extend(
                    cases
                        .into_iter()
                        .map(|case| unavailable(case.full_name(), msg.clone())),
                );
                return trials;
            } else {
                eprintln!(
                    "WARNING: backend {name} unavailable, every case is reported as ignored: {reason}\n\
                     (set LEASE_TEST_REQUIRE=1 to make this a failure)"
                );
            }
            None
        }
    };
    for case in cases {
        let full = case.full_name();
        let Some(caps) = caps else {
            let why = format!("backend {name} unavailable");
            trials.push(ignored(full, why));
            continue;
        };
        if let Some(why) = case.unmet(&caps) {
            trials.push(ignored(full, why));
            continue;
        }
        let backend = backend.clone();
        trials.push(Trial::test(full, move || run_case(backend, case)));
    }
    trials
}

/// A trial that never runs its case and is reported as ignored with `why` (shown in the report
/// as `ignored (why)`), whatever the flags: `--include-ignored` cannot turn it into a pass.
pub(crate) fn ignored(name: String, why: String) -> Trial {
    Trial::ignorable_test(name, move || Ok(Completion::ignored_with(why)))
}

/// Probes the backend: a client, an `inspect`, and a fenced resource, within 20 s. Gives the
/// store's capabilities, or why it could not be reached.
pub fn check_available(backend: &Arc<dyn Backend>) -> Result<Capabilities, String> {
    let rt = runtime();
    let backend = backend.clone();
    rt.block_on(async move {
        match tokio::time::timeout(Duration::from_secs(20), async {
            let store = backend.connect().await?;
            let key = leasehold_core::LeaseKey::new("lt-availability-probe")?;
            store.inspect(&key).await?;
            backend.resource().await?;
            Ok::<_, leasehold_core::Error>(store.capabilities())
        })
        .await
        {
            Ok(Ok(caps)) => Ok(caps),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 20 s".to_string()),
        }
    })
}

/// Runs one case in its own runtime, with a fresh namespace and the case timeout.
pub fn run_case(backend: Arc<dyn Backend>, case: Case) -> Result<(), Failed> {
    let rt = runtime();
    let result = rt.block_on(async {
        let ctx = Ctx::new(backend.clone())
            .await
            .map_err(|e| Failed::from(format!("setup: {e}")))?;
        let ns = ctx.namespace().to_string();
        let out = match tokio::time::timeout(CASE_TIMEOUT, (case.run)(ctx)).await {
            Ok(r) => r,
            Err(_) => Err(Failed::from(format!(
                "case did not finish within {CASE_TIMEOUT:?}"
            ))),
        };
        backend.cleanup(&ns).await;
        out
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    result
}
