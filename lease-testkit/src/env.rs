//! Running the suite: availability checks, the CI rule, and one named trial per case.

use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

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
pub fn run_with<B: Backend>(backend: B, extra: Vec<Case>) -> ! {
    let args = Arguments::from_args();
    let backend: Arc<dyn Backend> = Arc::new(backend);
    let name = backend.name();
    let mut all = cases::all();
    all.extend(extra);

    let unavailable = check_available(&backend);
    let mut trials = Vec::new();
    if let Some(reason) = &unavailable {
        if require_services() {
            let msg = format!(
                "backend {name} is required (CI or LEASE_TEST_REQUIRE) but unavailable: {reason}"
            );
            eprintln!("ERROR: {msg}");
            trials.push(Trial::test("service_available", move || {
                Err(Failed::from(msg))
            }));
        } else {
            eprintln!(
                "WARNING: backend {name} unavailable, every case is reported as ignored: {reason}\n\
                 (set LEASE_TEST_REQUIRE=1 to make this a failure)"
            );
        }
    } else {
        trials.push(Trial::test("service_available", || Ok(())));
    }
    for case in all {
        let full = format!("{}::{}", case.group, case.name);
        if unavailable.is_some() {
            trials.push(Trial::test(full, || Ok(())).with_ignored_flag(true));
            continue;
        }
        let backend = backend.clone();
        trials.push(Trial::test(full, move || run_case(backend, case)));
    }
    libtest_mimic::run(&args, trials).exit()
}

fn check_available(backend: &Arc<dyn Backend>) -> Option<String> {
    let rt = runtime();
    let backend = backend.clone();
    rt.block_on(async move {
        match tokio::time::timeout(Duration::from_secs(20), async {
            let store = backend.connect().await?;
            let key = lease_core::LeaseKey::new("lt-availability-probe")?;
            store.inspect(&key).await?;
            backend.resource().await?;
            Ok::<_, lease_core::Error>(())
        })
        .await
        {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("no answer within 20 s".to_string()),
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
