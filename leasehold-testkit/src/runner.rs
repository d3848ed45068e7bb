//! One runner for suites that run the same named cases on several backends (the shard and
//! election suites of `leasehold-shard`): each backend's store is built from the
//! [test store table](crate::stores), probed once, and every case becomes a trial named
//! `BACKEND::CASE`, next to a `BACKEND::service_available` trial.
//!
//! The availability rule is the conformance suite's ([`trials`](crate::trials)):
//!
//! - a reachable backend gives a passing `service_available` trial and runs every case;
//! - an unreachable backend, when a service is required (`CI` or `LEASE_TEST_REQUIRE=1`, see
//!   [`require_services`](crate::require_services)), fails `service_available` **and every case**
//!   with the reason, so a run filtered to some cases by name fails too;
//! - an unreachable backend otherwise reports every case as ignored with the reason (and
//!   `--include-ignored` cannot turn that into a pass).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LeaseKey, LeaseStore, MemoryLeaseStore};
use libtest_mimic::{Arguments, Conclusion, Failed, Trial};

use crate::stores::TestStore;
use crate::{BoxFuture, CaseResult};

/// How a suite builds a new client of one backend's store (each call: its own connection).
pub type ConnectFn =
    Arc<dyn Fn() -> BoxFuture<'static, leasehold_core::Result<Arc<dyn LeaseStore>>> + Send + Sync>;

/// One backend a multi-backend suite runs on: its name and how to build a client of its store,
/// or why none can be built.
#[derive(Clone)]
pub struct SuiteBackend {
    name: &'static str,
    connect: Result<ConnectFn, String>,
}

impl std::fmt::Debug for SuiteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SuiteBackend")
            .field("name", &self.name)
            .field("connect", &self.connect.as_ref().map(|_| "..."))
            .finish()
    }
}

impl SuiteBackend {
    /// A backend whose clients `connect` builds.
    pub fn new<F, Fut>(name: &'static str, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = leasehold_core::Result<Arc<dyn LeaseStore>>> + Send + 'static,
    {
        SuiteBackend {
            name,
            connect: Ok(Arc::new(move || Box::pin(connect()))),
        }
    }

    /// A backend that cannot be built (`why` says so); it is reported unavailable.
    pub fn missing(name: &'static str, why: impl Into<String>) -> Self {
        SuiteBackend {
            name,
            connect: Err(why.into()),
        }
    }

    /// The in-memory store, named `memory`: every client is a handle on one shared store.
    pub fn memory() -> Self {
        let store = MemoryLeaseStore::new();
        SuiteBackend::new("memory", move || {
            let store = store.clone();
            async move { Ok(Arc::new(store) as Arc<dyn LeaseStore>) }
        })
    }

    /// The backend of a test store in the table: `connect` is given the store's URL in the form
    /// `leasehold::connect` takes ([`TestStore::store_url`]). A store with no URL (its variable
    /// unset and without a default) is [`missing`](Self::missing).
    pub fn from_table<F, Fut>(store: &'static TestStore, connect: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = leasehold_core::Result<Arc<dyn LeaseStore>>> + Send + 'static,
    {
        match store.store_url() {
            Some(url) => SuiteBackend::new(store.name, move || connect(url.clone())),
            None => SuiteBackend::missing(
                store.name,
                format!(
                    "{} is not set",
                    store.vars.first().map_or(store.name, |v| v.name)
                ),
            ),
        }
    }

    /// The backend's name, used in trial names (`NAME::case`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// A new client of the backend's store; a backend that cannot be built is a `Config` error.
    ///
    /// Cancel safe: dropping the future drops the half-built client.
    pub async fn connect(&self) -> leasehold_core::Result<Arc<dyn LeaseStore>> {
        match &self.connect {
            Ok(connect) => connect().await,
            Err(why) => Err(leasehold_core::Error::config(
                "testkit",
                format!("backend {} cannot be built: {why}", self.name),
                None,
            )),
        }
    }

    /// Connects and reads one key within 20 s, in a runtime of its own (call it outside any
    /// runtime): `Ok`, or why the backend cannot be reached.
    pub fn probe(&self) -> Result<(), String> {
        if let Err(why) = &self.connect {
            return Err(why.clone());
        }
        let rt = crate::env::runtime();
        let this = self.clone();
        let out = rt.block_on(async move {
            match tokio::time::timeout(Duration::from_secs(20), async {
                let store = this.connect().await?;
                store
                    .inspect(&LeaseKey::new("lt-availability-probe")?)
                    .await?;
                Ok::<_, leasehold_core::Error>(())
            })
            .await
            {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("no answer within 20 s".to_string()),
            }
        });
        rt.shutdown_timeout(Duration::from_secs(5));
        out
    }
}

/// One case of a multi-backend suite: a name and a function run once per backend.
#[derive(Clone, Copy)]
pub struct SuiteCase {
    name: &'static str,
    run: fn(SuiteBackend) -> BoxFuture<'static, CaseResult>,
}

impl std::fmt::Debug for SuiteCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SuiteCase")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl SuiteCase {
    /// A case named `name` (its trials are `BACKEND::name`).
    pub fn new(
        name: &'static str,
        run: fn(SuiteBackend) -> BoxFuture<'static, CaseResult>,
    ) -> Self {
        SuiteCase { name, run }
    }

    /// The case's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// The trials of `cases` on each of `backends`, each case bounded by `timeout`, with
/// `availability` the probe's result per backend (in `backends`' order) and `require` whether
/// an unreachable backend fails (see the [module docs](self)).
///
/// # Panics
/// If `availability` is not as long as `backends` (a caller's mistake, not input).
pub fn suite_trials(
    backends: &[SuiteBackend],
    availability: Vec<Result<(), String>>,
    cases: &[SuiteCase],
    timeout: Duration,
    require: bool,
) -> Vec<Trial> {
    assert_eq!(backends.len(), availability.len(), "one probe per backend");
    let mut trials = Vec::new();
    for (backend, up) in backends.iter().zip(availability) {
        let name = backend.name;
        match up {
            Ok(()) => {
                trials.push(Trial::test(format!("{name}::service_available"), || Ok(())));
                for case in cases {
                    let (backend, run) = (backend.clone(), case.run);
                    trials.push(Trial::test(format!("{name}::{}", case.name), move || {
                        run_one(backend, run, timeout)
                    }));
                }
            }
            Err(reason) if require => {
                let msg = format!(
                    "backend {name} is required (CI or LEASE_TEST_REQUIRE) but unavailable: {reason}"
                );
                eprintln!("ERROR: {msg}");
                let failing =
                    |trial: String, msg: String| Trial::test(trial, move || Err(Failed::from(msg)));
                trials.push(failing(format!("{name}::service_available"), msg.clone()));
                for case in cases {
                    trials.push(failing(format!("{name}::{}", case.name), msg.clone()));
                }
            }
            Err(reason) => {
                eprintln!(
                    "WARNING: backend {name} unavailable, every case is reported as ignored: \
                     {reason}\n(set LEASE_TEST_REQUIRE=1 to make this a failure)"
                );
                for case in cases {
                    trials.push(crate::env::ignored(
                        format!("{name}::{}", case.name),
                        format!("backend {name} unavailable"),
                    ));
                }
            }
        }
    }
    trials
}

/// Runs `cases` on every one of `backends` with the command line's arguments, after `extra`
/// trials of the suite's own, and returns the conclusion (the caller exits with it).
///
/// Each backend is probed once before any case runs (not when the run only lists the trials).
pub fn run_suite(
    backends: &[SuiteBackend],
    cases: &[SuiteCase],
    timeout: Duration,
    extra: Vec<Trial>,
) -> Conclusion {
    let args = Arguments::from_args();
    let availability = backends
        .iter()
        .map(|b| if args.list { Ok(()) } else { b.probe() })
        .collect();
    let mut trials = extra;
    trials.extend(suite_trials(
        backends,
        availability,
        cases,
        timeout,
        crate::require_services(),
    ));
    libtest_mimic::run(&args, trials)
}

fn run_one(
    backend: SuiteBackend,
    run: fn(SuiteBackend) -> BoxFuture<'static, CaseResult>,
    timeout: Duration,
) -> CaseResult {
    let rt = crate::env::runtime();
    let out = rt.block_on(async {
        match tokio::time::timeout(timeout, run(backend)).await {
            Ok(r) => r,
            Err(_) => Err(Failed::from(format!(
                "case did not finish within {timeout:?}"
            ))),
        }
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passes(_: SuiteBackend) -> BoxFuture<'static, CaseResult> {
        Box::pin(async { Ok(()) })
    }

    fn names(trials: &[Trial]) -> Vec<String> {
        trials.iter().map(|t| t.name().to_string()).collect()
    }

    /// Required and unreachable: `service_available` and every case fail, so a name filter
    /// that leaves out `service_available` still fails the run.
    #[test]
    fn a_required_unreachable_backend_fails_every_case_even_filtered() {
        let backends = [
            SuiteBackend::memory(),
            SuiteBackend::missing("redis", "down"),
        ];
        let cases = [SuiteCase::new("a", passes), SuiteCase::new("b", passes)];
        let avail = vec![Ok(()), Err("down".to_string())];
        let trials = suite_trials(&backends, avail, &cases, Duration::from_secs(5), true);
        assert_eq!(trials.len(), 6);
        let args = Arguments {
            filter: Some("redis::a".into()),
            exact: true,
            test_threads: Some(1),
            ..Arguments::default()
        };
        let out = libtest_mimic::run(&args, trials);
        assert_eq!((out.num_failed, out.num_passed), (1, 0), "{out:?}");
    }

    /// Not required: every case of the unreachable backend is ignored with the reason, and
    /// `--include-ignored` runs none of them.
    #[test]
    fn an_unreachable_backend_is_ignored_when_not_required() {
        let backends = [
            SuiteBackend::memory(),
            SuiteBackend::missing("redis", "down"),
        ];
        let cases = [SuiteCase::new("a", passes)];
        let avail = vec![Ok(()), Err("down".to_string())];
        let trials = suite_trials(&backends, avail, &cases, Duration::from_secs(5), false);
        assert_eq!(
            names(&trials),
            ["memory::service_available", "memory::a", "redis::a"]
        );
        let args = Arguments {
            include_ignored: true,
            test_threads: Some(1),
            ..Arguments::default()
        };
        let out = libtest_mimic::run(&args, trials);
        assert_eq!(
            (out.num_failed, out.num_passed, out.num_ignored),
            (0, 2, 1),
            "{out:?}"
        );
    }

    #[test]
    fn a_missing_backend_probes_as_its_reason_and_connects_to_a_config_error() {
        let b = SuiteBackend::missing("redis", "LEASE_REDIS_URL is not set");
        assert_eq!(b.probe(), Err("LEASE_REDIS_URL is not set".to_string()));
        let err = crate::env::runtime()
            .block_on(b.connect())
            .expect_err("an error");
        assert_eq!(err.kind(), leasehold_core::ErrorKind::Config);
    }

    #[test]
    fn memory_probes_and_runs() {
        assert_eq!(SuiteBackend::memory().probe(), Ok(()));
        let trials = suite_trials(
            &[SuiteBackend::memory()],
            vec![Ok(())],
            &[SuiteCase::new("a", passes)],
            Duration::from_secs(5),
            true,
        );
        let args = Arguments {
            test_threads: Some(1),
            ..Arguments::default()
        };
        let out = libtest_mimic::run(&args, trials);
        assert_eq!((out.num_failed, out.num_passed), (0, 2), "{out:?}");
    }
}
