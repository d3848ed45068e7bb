//! The mutation program: runs every protocol mutant of every backend against the real servers
//! through the backend's test suite and the fault suite, and writes `docs/mutants.md`.
//!
//! A backend's suites are its test target, any further targets of it in `EXTRA_TARGETS`
//! (PostgreSQL's `postgres_failover`: a throwaway primary and standby, about ten seconds), then the
//! fault suite's cases of that backend. A prebuilt extra target is given as
//! `--bin <backend>+<target>=PATH` (`--bin postgres+postgres_failover=PATH`).
//!
//! The backend crates pass the text and conditions that decide safety through the switch points
//! of `leasehold_core::mutation`. This program builds the test binaries once with the
//! `leasehold-core/mutants` feature, then runs them once with no mutant (they must pass, or the
//! run is invalid), once with the control (an identity substitution: it must survive), and once
//! per mutant with the mutant named in the environment. A mutant is *killed* by the first test
//! that fails (the binary is stopped there), *killed by timeout* if the suites do not finish within
//! the per-mutant limit (a hang), *not reached* if no test ran its switch point (or its text was
//! not found there), or *survived*.
//!
//! ```text
//! cargo run -p leasehold-mutants -- [--backend B]... [--mutant NAME]... [--sample N [--seed S]]
//!     [--no-faults] [--timeout SECS] [--jobs N] [--bin BACKEND=PATH]... [--journal FILE]
//!     [--write] [--list]
//! ```
//!
//! Services: load `/tmp/lease-test/*.env` first (as scripts/test.sh does). PostgreSQL mutants run
//! in a database of their own (`lease_mutants` on the server of `LEASE_POSTGRES_URL`), because a
//! trigger mutant installs its trigger there. MySQL's run in `lease_mutants` on the server of
//! `LEASE_MYSQL_URL` (its TLS URLs moved there too), dropped and created empty with the
//! `mariadb` client before the baseline and before each mutant: the migration creates a trigger
//! only when it is missing, so a trigger mutant is installed only in an empty database. `--write` writes `docs/mutants.md` (only for a full
//! run: every mutant of the chosen backends). `--sample N` runs N mutants chosen by `--seed`
//! (default: the commit hash), so that CI rotates through the catalogue; the run fails if a
//! sampled mutant survives without an explanation or is not reached. `--jobs N` runs N backends
//! side by side (each backend's mutants still one at a time).

mod catalogue;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use catalogue::{Change, MUTANTS, Mutant};

/// The backends, each with its test target.
const BACKENDS: &[(&str, &str)] = &[
    ("postgres", "postgres"),
    ("redis", "redis"),
    ("etcd", "etcd"),
    ("k8s", "k8s"),
    ("sqlite", "sqlite"),
    ("mysql", "mysql"),
];

/// The database MySQL's mutants run in, on the server of `LEASE_MYSQL_URL`. It is dropped and
/// created empty before the baseline and before each MySQL mutant: the migration creates its
/// triggers only when they are missing (`CREATE TRIGGER IF NOT EXISTS`), so a trigger mutant is
/// installed only in a database without them, and must not stay there for the next mutant.
const MYSQL_DB: &str = "lease_mutants";

/// The variables of MySQL's URLs, each moved to [`MYSQL_DB`] when set.
const MYSQL_URL_VARS: &[&str] = &[
    "LEASE_MYSQL_URL",
    "LEASE_MYSQL_TLS_URL",
    "LEASE_MYSQL_TLS_CERT_URL",
];

/// `LEASE_MYSQL_URL`, or the default of the MySQL test target.
fn mysql_url() -> String {
    std::env::var("LEASE_MYSQL_URL")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".into())
}

/// Further test targets of a backend, run after its test target and before the fault suite:
/// (backend, package, target). PostgreSQL's failover target builds a throwaway primary and
/// streaming standby (scripts/services/postgres-failover.sh) and is the only test that kills a
/// trigger that forgets the clock floor (a promoted standby's sequence is behind the lost
/// grants; only the server clock floor keeps the next token above them).
const EXTRA_TARGETS: &[(&str, &str, &str)] =
    &[("postgres", "leasehold-postgres", "postgres_failover")];

/// The key of an extra target's binary among the built binaries: `<backend>+<target>`.
fn extra_key(backend: &str, target: &str) -> String {
    format!("{backend}+{target}")
}

/// Storms per backend in the fault suite (`LEASE_FAULTS_STORMS`) under a mutant.
const FAULT_STORMS: &str = "4";

#[derive(Debug, Default)]
struct Args {
    backends: Vec<String>,
    mutants: Vec<String>,
    sample: Option<usize>,
    seed: Option<u64>,
    faults: bool,
    timeout: Option<Duration>,
    write: bool,
    list: bool,
    jobs: usize,
    prebuilt: Vec<(String, PathBuf)>,
    journal: Option<PathBuf>,
    report_only: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        faults: true,
        jobs: 1,
        ..Args::default()
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--backend" => a.backends.push(value("--backend")?),
            "--mutant" => a.mutants.push(value("--mutant")?),
            "--sample" => {
                a.sample = Some(
                    value("--sample")?
                        .parse()
                        .map_err(|e| format!("--sample: {e}"))?,
                )
            }
            "--seed" => {
                let s = value("--seed")?;
                a.seed = Some(seed_of(&s));
            }
            "--timeout" => {
                let secs: u64 = value("--timeout")?
                    .parse()
                    .map_err(|e| format!("--timeout: {e}"))?;
                a.timeout = Some(Duration::from_secs(secs));
            }
            "--jobs" => {
                a.jobs = value("--jobs")?
                    .parse()
                    .map_err(|e| format!("--jobs: {e}"))?
            }
            "--bin" => {
                let v = value("--bin")?;
                let (b, path) = v
                    .split_once('=')
                    .ok_or(format!("--bin {v:?}: expected BACKEND=PATH"))?;
                a.prebuilt.push((b.to_string(), PathBuf::from(path)));
            }
            "--journal" => a.journal = Some(PathBuf::from(value("--journal")?)),
            "--report-only" => a.report_only = true,
            "--no-faults" => a.faults = false,
            "--write" => a.write = true,
            "--list" => a.list = true,
            other => return Err(format!("unknown argument {other:?} (see the crate docs)")),
        }
    }
    for b in &a.backends {
        if !BACKENDS.iter().any(|(n, _)| n == b) {
            return Err(format!("unknown backend {b:?}"));
        }
    }
    for m in &a.mutants {
        if !MUTANTS.iter().any(|x| x.name == m) {
            return Err(format!("unknown mutant {m:?} (--list lists them)"));
        }
    }
    if a.write && (a.sample.is_some() || !a.mutants.is_empty()) {
        return Err("--write is for a full run (no --sample, no --mutant)".into());
    }
    Ok(a)
}

/// A seed from text: a decimal number, else the FNV-1a hash of the text (a commit hash).
fn seed_of(s: &str) -> u64 {
    s.parse().unwrap_or_else(|_| {
        s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    })
}

/// The outcome of one mutant.
#[derive(Debug, Clone)]
enum Outcome {
    Killed {
        suite: String,
        test: String,
    },
    Timeout {
        suite: String,
        after: Duration,
    },
    Survived,
    NotReached {
        why: String,
    },
    /// `--report-only`: the journal has no result for it (the run stopped before it).
    NotRun,
}

impl Outcome {
    fn label(&self) -> String {
        match self {
            Outcome::Killed { suite, test } => format!("killed by `{suite}`: `{test}`"),
            Outcome::Timeout { suite, after } => format!(
                "killed by timeout (`{suite}` hung: no result within {} s)",
                after.as_secs()
            ),
            Outcome::Survived => "**survived**".into(),
            Outcome::NotReached { why } => format!("**not reached** ({why})"),
            Outcome::NotRun => "not run (the run stopped before it)".into(),
        }
    }
}

/// One result: the mutant, its outcome and the time it took.
type Row<'m> = (&'m Mutant, Outcome, Duration);

/// `--journal FILE`: every baseline and result is appended to FILE as it is known, and a run
/// given the same file takes what it holds instead of running it again (an interrupted run goes
/// on where it stopped).
#[derive(Debug, Default)]
struct Journal {
    path: Option<PathBuf>,
    lines: Vec<Vec<String>>,
    write: std::sync::Mutex<()>,
}

impl Journal {
    fn open(path: Option<PathBuf>) -> Journal {
        let lines = path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
            .lines()
            .map(|l| l.split('\t').map(str::to_string).collect())
            .collect();
        Journal {
            path,
            lines,
            write: std::sync::Mutex::new(()),
        }
    }

    fn append(&self, fields: &[&str]) {
        let Some(path) = &self.path else { return };
        let _w = self.write.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            use std::io::Write;
            let _ = writeln!(f, "{}", fields.join("\t"));
        }
    }

    fn baseline(&self, b: &str) -> Option<Duration> {
        self.lines
            .iter()
            .find(|l| l.len() == 3 && l[0] == "baseline" && l[1] == b)
            .and_then(|l| l[2].parse().ok())
            .map(Duration::from_secs)
    }

    fn record_baseline(&self, b: &str, took: Duration) {
        self.append(&["baseline", b, &took.as_secs().to_string()]);
    }

    fn result(&self, name: &str) -> Option<(Outcome, Duration)> {
        let l = self
            .lines
            .iter()
            .find(|l| l.len() == 6 && l[0] == "mutant" && l[1] == name)?;
        let took = Duration::from_secs(l[5].parse().ok()?);
        let outcome = match l[2].as_str() {
            "killed" => Outcome::Killed {
                suite: l[3].clone(),
                test: l[4].clone(),
            },
            "timeout" => Outcome::Timeout {
                suite: l[3].clone(),
                after: Duration::from_secs(l[4].parse().ok()?),
            },
            "survived" => Outcome::Survived,
            "notreached" => Outcome::NotReached { why: l[3].clone() },
            _ => return None,
        };
        Some((outcome, took))
    }

    fn record(&self, name: &str, outcome: &Outcome, took: Duration) {
        let secs = took.as_secs().to_string();
        let clean = |t: &str| t.replace(['\t', '\n'], " ");
        match outcome {
            Outcome::Killed { suite, test } => {
                self.append(&["mutant", name, "killed", &clean(suite), &clean(test), &secs])
            }
            Outcome::Timeout { suite, after } => self.append(&[
                "mutant",
                name,
                "timeout",
                &clean(suite),
                &after.as_secs().to_string(),
                &secs,
            ]),
            Outcome::Survived => self.append(&["mutant", name, "survived", "", "", &secs]),
            Outcome::NotReached { why } => {
                self.append(&["mutant", name, "notreached", &clean(why), "", &secs])
            }
            Outcome::NotRun => {}
        }
    }
}

/// How one run of a test binary ended.
#[derive(Debug)]
enum RunEnd {
    Passed,
    Failed(String),
    TimedOut,
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lease-mutants: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode, String> {
    let args = parse_args()?;
    if args.list {
        for m in MUTANTS {
            println!("{:<48} {:<9} {}", m.name, m.backend, m.what);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let root = workspace_root()?;
    let head = git(&root, &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let mut commit = head.clone();
    if git(&root, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty())
    {
        // The binaries are built from the working tree: say that it differs from the commit.
        commit.push_str(" (with uncommitted changes in the working tree)");
    }
    let backends: Vec<&str> = BACKENDS
        .iter()
        .map(|(b, _)| *b)
        .filter(|b| args.backends.is_empty() || args.backends.iter().any(|x| x == b))
        .collect();
    let mut chosen: Vec<&Mutant> = MUTANTS
        .iter()
        .filter(|m| !m.control && backends.contains(&m.backend))
        .filter(|m| args.mutants.is_empty() || args.mutants.iter().any(|x| x == m.name))
        .collect();
    if let Some(n) = args.sample {
        let seed = args.seed.unwrap_or_else(|| seed_of(&head));
        chosen = sample(chosen, n, seed);
        println!("sample of {n} (seed {seed}): {:?}", names(&chosen));
    }
    let control = MUTANTS.iter().find(|m| m.control).expect("a control");
    let run_control = backends.contains(&control.backend);
    let needed: Vec<&str> = backends
        .iter()
        .copied()
        .filter(|b| {
            chosen.iter().any(|m| m.backend == *b) || (run_control && *b == control.backend)
        })
        .collect();

    // `--bin B=PATH`: a test binary of backend B built earlier (with the feature) is used as it
    // is, and B is left out of the build.
    let to_build: Vec<&str> = needed
        .iter()
        .copied()
        .filter(|b| !args.prebuilt.iter().any(|(p, _)| p == b))
        .collect();
    let mut bins = if args.report_only || (to_build.is_empty() && !args.faults) {
        BTreeMap::new()
    } else {
        build(&root, &to_build, args.faults)?
    };
    for (b, path) in &args.prebuilt {
        bins.insert(b.clone(), path.clone());
    }
    let env = if args.report_only {
        Vec::new()
    } else {
        prepare_env()?
    };

    // Backends run side by side (`--jobs`), each with its own hits file; a backend's baseline,
    // control and mutants run one after another.
    let journal = Journal::open(args.journal.clone());
    let queue = std::sync::Mutex::new(needed.clone());
    let done = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..args.jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let Some(b) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop() else {
                        break;
                    };
                    let ms: Vec<&Mutant> =
                        chosen.iter().copied().filter(|m| m.backend == b).collect();
                    let control = (run_control && control.backend == b).then_some(control);
                    let out = if args.report_only {
                        from_journal(b, control, &ms, &journal)
                    } else {
                        run_backend(b, control, &ms, &bins, &env, args.timeout, &journal)
                    };
                    if let Err(e) = &out {
                        println!("   {b}: {e}");
                    }
                    done.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((b, out));
                }
            });
        }
    });
    let mut results: Vec<Row<'_>> = Vec::new();
    let mut baseline: BTreeMap<&str, Duration> = BTreeMap::new();
    let mut done = done.into_inner().unwrap_or_else(|p| p.into_inner());
    done.sort_by_key(|(b, _)| *b);
    for (b, out) in done {
        let (took, rs) = match out {
            Ok(r) => r,
            Err(_) if args.report_only => continue,
            Err(e) => return Err(e),
        };
        baseline.insert(b, took);
        results.extend(rs);
    }
    // Catalogue order (controls first).
    results.sort_by_key(|(m, _, _)| {
        MUTANTS
            .iter()
            .position(|x| x.name == m.name)
            .unwrap_or(usize::MAX)
    });

    let bad: Vec<&str> = results
        .iter()
        .filter(|(m, o, _)| {
            !m.control
                && match o {
                    Outcome::Survived => m.equivalent.is_none(),
                    Outcome::NotReached { .. } | Outcome::NotRun => true,
                    _ => false,
                }
        })
        .map(|(m, _, _)| m.name)
        .collect();
    if args.write {
        let cmd = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
        let doc = report(&results, &baseline, &commit, &cmd, args.faults);
        let path = root.join("docs/mutants.md");
        std::fs::write(&path, doc).map_err(|e| format!("write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if bad.is_empty() {
        println!("every mutant was killed or is an explained equivalent");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("unexplained survivors or unreached mutants: {bad:?}");
        Ok(ExitCode::FAILURE)
    }
}

/// `--report-only`: backend `b`'s baseline and results as the journal has them; a backend
/// without a baseline there is left out.
fn from_journal<'m>(
    b: &str,
    control: Option<&'m Mutant>,
    chosen: &[&'m Mutant],
    journal: &Journal,
) -> Result<(Duration, Vec<Row<'m>>), String> {
    let baseline = journal
        .baseline(b)
        .ok_or(format!("the journal has no baseline of {b}"))?;
    Ok((
        baseline,
        control
            .into_iter()
            .chain(chosen.iter().copied())
            .map(|m| {
                let (out, took) = journal
                    .result(m.name)
                    .unwrap_or((Outcome::NotRun, Duration::ZERO));
                (m, out, took)
            })
            .collect(),
    ))
}

/// Backend `b`: its baseline (the suites must pass without a mutant), its control (must
/// survive), then each of its mutants.
fn run_backend<'m>(
    b: &str,
    control: Option<&'m Mutant>,
    chosen: &[&'m Mutant],
    bins: &BTreeMap<String, PathBuf>,
    env: &[(String, String)],
    timeout: Option<Duration>,
    journal: &Journal,
) -> Result<(Duration, Vec<Row<'m>>), String> {
    let hits = std::env::temp_dir().join(format!("lease-mutants-{}-{b}.hits", std::process::id()));
    let started = Instant::now();
    let known = journal.baseline(b);
    println!("== {b}: baseline (no mutant)");
    if known.is_none() {
        fresh_state(b)?;
    }
    for (suite, bin, filter) in suites(bins, b).into_iter().filter(|_| known.is_none()) {
        let limit = timeout.unwrap_or(Duration::from_secs(1800));
        match run_binary(&bin, filter.as_deref(), env, None, &hits, limit)? {
            RunEnd::Passed => {}
            RunEnd::Failed(t) => {
                return Err(format!(
                    "the baseline of {b} failed (`{suite}`: {t}): the run is invalid"
                ));
            }
            RunEnd::TimedOut => {
                return Err(format!("the baseline of {b} (`{suite}`) did not finish"));
            }
        }
    }
    let baseline = known.unwrap_or_else(|| {
        let took = started.elapsed();
        journal.record_baseline(b, took);
        took
    });
    println!("   {b}: baseline passed in {} s", baseline.as_secs());
    let limit = timeout.unwrap_or(baseline * 2 + Duration::from_secs(60));
    let mut results = Vec::new();
    if let Some(control) = control {
        let (out, took) = match journal.result(control.name) {
            Some(known) => known,
            None => {
                let (out, took) = run_mutant(control, bins, env, &hits, limit)?;
                journal.record(control.name, &out, took);
                (out, took)
            }
        };
        println!("   {} -> {}", control.name, out.label());
        if !matches!(out, Outcome::Survived) {
            return Err(format!(
                "the control {} must survive, but: {}; the run is invalid",
                control.name,
                out.label()
            ));
        }
        results.push((control, out, took));
    }
    for m in chosen {
        let (out, took) = match journal.result(m.name) {
            Some(known) => known,
            None => {
                let (out, took) = run_mutant(m, bins, env, &hits, limit)?;
                journal.record(m.name, &out, took);
                (out, took)
            }
        };
        println!("   {} -> {} ({} s)", m.name, out.label(), took.as_secs());
        results.push((*m, out, took));
    }
    let _ = std::fs::remove_file(&hits);
    Ok((baseline, results))
}

fn names(ms: &[&Mutant]) -> Vec<&'static str> {
    ms.iter().map(|m| m.name).collect()
}

/// `n` mutants of `all`, by a seeded shuffle (xorshift64*).
fn sample(mut all: Vec<&Mutant>, n: usize, seed: u64) -> Vec<&Mutant> {
    let mut x = seed | 1;
    for i in (1..all.len()).rev() {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let j = usize::try_from(r % (i as u64 + 1)).unwrap_or(0);
        all.swap(i, j);
    }
    all.truncate(n);
    all
}

fn workspace_root() -> Result<PathBuf, String> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "no workspace root".to_string())
}

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The test binaries: backend name (or `faults`) to executable.
fn build(
    root: &Path,
    backends: &[&str],
    faults: bool,
) -> Result<BTreeMap<String, PathBuf>, String> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root)
        .args([
            "test",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(["--features", "leasehold-core/mutants"]);
    for b in backends {
        let target = BACKENDS
            .iter()
            .find(|(n, _)| n == b)
            .map(|(_, t)| *t)
            .unwrap_or(b);
        cmd.args(["-p", &format!("leasehold-{b}"), "--test", target]);
        for (_, package, extra) in EXTRA_TARGETS.iter().filter(|(e, _, _)| e == b) {
            cmd.args(["-p", package, "--test", extra]);
        }
    }
    if faults {
        cmd.args(["-p", "leasehold-faults", "--test", "faults"]);
    }
    println!("building: {cmd:?}");
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !out.status.success() {
        return Err("the build failed".into());
    }
    let mut bins = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let (Some(name), Some(exe)) = (v["target"]["name"].as_str(), v["executable"].as_str())
        else {
            continue;
        };
        // The package: the directory of its manifest.
        let package = v["manifest_path"]
            .as_str()
            .map(Path::new)
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let key = if let Some((b, _, t)) = EXTRA_TARGETS
            .iter()
            .find(|(_, p, t)| *p == package && *t == name)
        {
            extra_key(b, t)
        } else if name == "faults" && package == "leasehold-faults" {
            "faults".to_string()
        } else if let Some((b, _)) = BACKENDS
            .iter()
            .find(|(b, t)| *t == name && package == format!("leasehold-{b}"))
        {
            (*b).to_string()
        } else {
            continue;
        };
        bins.insert(key, PathBuf::from(exe));
    }
    for b in backends {
        if !bins.contains_key(*b) {
            return Err(format!("no test binary for {b} in cargo's output"));
        }
        for (_, _, t) in EXTRA_TARGETS.iter().filter(|(e, _, _)| e == b) {
            if !bins.contains_key(&extra_key(b, t)) {
                return Err(format!("no {t} test binary of {b} in cargo's output"));
            }
        }
    }
    if faults && !bins.contains_key("faults") {
        return Err("no fault-suite binary in cargo's output".into());
    }
    Ok(bins)
}

/// The environment of every run: the caller's, with `LEASE_TEST_REQUIRE=1` and PostgreSQL
/// moved to a database of its own.
fn prepare_env() -> Result<Vec<(String, String)>, String> {
    let url = std::env::var("LEASE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let base = url
        .rsplit_once('/')
        .map(|(b, _)| b.to_string())
        .ok_or_else(|| format!("LEASE_POSTGRES_URL {url:?} has no database"))?;
    // Idempotent: "already exists" is fine; a server that is down shows in the baseline.
    let _ = Command::new("psql")
        .args([
            &format!("{base}/postgres"),
            "-qc",
            "CREATE DATABASE lease_mutants",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let mut env = vec![
        ("LEASE_TEST_REQUIRE".into(), "1".into()),
        ("LEASE_POSTGRES_URL".into(), format!("{base}/lease_mutants")),
        ("LEASE_FAULTS_STORMS".into(), FAULT_STORMS.into()),
    ];
    for var in MYSQL_URL_VARS {
        let url = match *var {
            "LEASE_MYSQL_URL" => mysql_url(),
            _ => match std::env::var(var) {
                Ok(v) if !v.trim().is_empty() => v,
                _ => continue,
            },
        };
        let moved = with_database(&url, MYSQL_DB)
            .ok_or_else(|| format!("{var} {url:?} is not a mysql:// URL with a database"))?;
        env.push(((*var).into(), moved));
    }
    Ok(env)
}

/// `url` with its database (the path) replaced by `db`; the query is kept.
fn with_database(url: &str, db: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let (main, query) = match rest.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (rest, None),
    };
    let authority = main.split_once('/').map_or(main, |(a, _)| a);
    let mut out = format!("{scheme}://{authority}/{db}");
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Some(out)
}

/// What a backend needs before each of its runs (the baseline and every mutant): MySQL's
/// database emptied ([`MYSQL_DB`]); nothing for the others (PostgreSQL's migration replaces its
/// trigger functions on every run, so the next run undoes a trigger mutant).
fn fresh_state(b: &str) -> Result<(), String> {
    match b {
        "mysql" => reset_mysql_db(),
        _ => Ok(()),
    }
}

/// Drops and creates [`MYSQL_DB`] on the server of `LEASE_MYSQL_URL`, with the `mariadb` client
/// (or `mysql` on older systems), the URL's user and password.
fn reset_mysql_db() -> Result<(), String> {
    let url = mysql_url();
    let bad =
        || format!("LEASE_MYSQL_URL {url:?}: expected mysql://user[:password]@host[:port]/db");
    let rest = url.split_once("://").ok_or_else(bad)?.1;
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let (userinfo, hostport) = authority.rsplit_once('@').unwrap_or(("root", authority));
    let (user, password) = match userinfo.split_once(':') {
        Some((u, p)) => (percent_decode(u), Some(percent_decode(p))),
        None => (percent_decode(userinfo), None),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') => (h, p),
        _ => (hostport, "3306"),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let sql = format!("DROP DATABASE IF EXISTS `{MYSQL_DB}`; CREATE DATABASE `{MYSQL_DB}`");
    for client in ["mariadb", "mysql"] {
        let mut cmd = Command::new(client);
        cmd.args([
            "--protocol=tcp",
            "-h",
            host,
            "-P",
            port,
            "-u",
            &user,
            "-e",
            &sql,
        ])
        .stdin(Stdio::null());
        if let Some(p) = &password {
            cmd.env("MYSQL_PWD", p);
        }
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{client}: {e}")),
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => {
                return Err(format!(
                    "{client} could not empty the database {MYSQL_DB}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
        }
    }
    Err("neither the mariadb nor the mysql client is installed".into())
}

/// `%XX` escapes of a URL's user or password decoded (anything else as it is).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The suites of backend `b`: (label, binary, name filter).
fn suites(bins: &BTreeMap<String, PathBuf>, b: &str) -> Vec<(String, PathBuf, Option<String>)> {
    let mut out = vec![(format!("{b} test target"), bins[b].clone(), None)];
    for (_, _, t) in EXTRA_TARGETS.iter().filter(|(e, _, _)| *e == b) {
        if let Some(bin) = bins.get(&extra_key(b, t)) {
            out.push((format!("{b} {t} target"), bin.clone(), None));
        }
    }
    if let Some(f) = bins.get("faults") {
        out.push(("fault suite".to_string(), f.clone(), Some(format!("{b}::"))));
    }
    out
}

fn run_mutant(
    m: &Mutant,
    bins: &BTreeMap<String, PathBuf>,
    env: &[(String, String)],
    hits: &Path,
    limit: Duration,
) -> Result<(Outcome, Duration), String> {
    println!("== {} ({})", m.name, m.backend);
    let started = Instant::now();
    let _ = std::fs::remove_file(hits);
    fresh_state(m.backend)?;
    for (suite, bin, filter) in suites(bins, m.backend) {
        let end = run_binary(&bin, filter.as_deref(), env, Some(m), hits, limit)?;
        let outcome = match end {
            RunEnd::Passed => continue,
            RunEnd::Failed(test) => Outcome::Killed { suite, test },
            RunEnd::TimedOut => Outcome::Timeout {
                suite,
                after: limit,
            },
        };
        return Ok((outcome, started.elapsed()));
    }
    let seen = std::fs::read_to_string(hits).unwrap_or_default();
    let outcome = if seen.lines().any(|l| l.starts_with("hit ")) {
        Outcome::Survived
    } else if seen.lines().any(|l| l.starts_with("miss ")) {
        Outcome::NotReached {
            why: "the site ran, but its text was not found".into(),
        }
    } else {
        Outcome::NotReached {
            why: "no test ran the switch point".into(),
        }
    };
    Ok((outcome, started.elapsed()))
}

/// Runs one test binary (all its tests, or those matching `filter`), stopping at its first
/// failing test. Returns that test's name.
fn run_binary(
    bin: &Path,
    filter: Option<&str>,
    env: &[(String, String)],
    mutant: Option<&Mutant>,
    hits: &Path,
    limit: Duration,
) -> Result<RunEnd, String> {
    let mut cmd = Command::new(bin);
    if let Some(f) = filter {
        cmd.arg(f);
    }
    // Test binaries run with the crate directory as their working directory under cargo.
    if let Some(dir) = crate_dir_of(bin) {
        cmd.current_dir(dir);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("LEASEHOLD_MUTANT")
        .env_remove("LEASEHOLD_MUTANT_SITE")
        .env_remove("LEASEHOLD_MUTANT_FIND")
        .env_remove("LEASEHOLD_MUTANT_REPLACE")
        .env("LEASEHOLD_MUTANT_HITS", hits)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0);
    if let Some(m) = mutant {
        cmd.env("LEASEHOLD_MUTANT", m.name)
            .env("LEASEHOLD_MUTANT_SITE", m.site);
        if let Change::Text { find, replace } = m.change {
            cmd.env("LEASEHOLD_MUTANT_FIND", find)
                .env("LEASEHOLD_MUTANT_REPLACE", replace);
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("run {}: {e}", bin.display()))?;
    let pid = child.id();
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + limit;
    let mut end = None;
    let mut tail: Vec<String> = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(test) = failed_test(&line) {
                    end = Some(RunEnd::Failed(test));
                    break;
                }
                tail.push(line);
                if tail.len() > 20 {
                    tail.remove(0);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                end = Some(RunEnd::TimedOut);
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    if end.is_some() {
        // The whole process group: the suite's child processes too.
        kill_group(pid, "KILL");
    }
    let status = child.wait().map_err(|e| format!("wait: {e}"))?;
    let _ = reader.join();
    Ok(match end {
        Some(e) => e,
        None if status.success() => RunEnd::Passed,
        None => RunEnd::Failed(format!(
            "the binary exited with {status} before naming a failed test; last output: {}",
            tail.last().map_or("", String::as_str)
        )),
    })
}

/// Sends `signal` to the process group `pgid` (a test binary spawned with `process_group(0)`).
///
/// The `--` matters: procps-ng 4.0's `kill -KILL -1234` takes `-1234` for an option and calls
/// `kill(-1, SIGKILL)` (seen with strace: `kill -0 -PGID` made `kill(-1, 0)`), which as root kills
/// every process of the machine, the services and the shell that started the run included.
fn kill_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args(["-s", signal, "--", &format!("-{pgid}")])
        .status();
}

/// The crate directory of a test binary: cargo runs tests there (some read files relative to it).
fn crate_dir_of(bin: &Path) -> Option<PathBuf> {
    let name = bin.file_name()?.to_str()?;
    let stem = name.rsplit_once('-').map_or(name, |(s, _)| s);
    let root = workspace_root().ok()?;
    let crate_name = if stem == "faults" {
        "leasehold-faults".to_string()
    } else if let Some((_, package, _)) = EXTRA_TARGETS.iter().find(|(_, _, t)| *t == stem) {
        (*package).to_string()
    } else {
        format!("leasehold-{stem}")
    };
    let dir = root.join(crate_name);
    dir.is_dir().then_some(dir)
}

/// `test NAME ... FAILED` (libtest and libtest-mimic) gives NAME.
fn failed_test(line: &str) -> Option<String> {
    let rest = line.strip_prefix("test ")?;
    let name = rest.strip_suffix(" ... FAILED")?;
    Some(name.trim().to_string())
}

fn report(
    results: &[Row<'_>],
    baseline: &BTreeMap<&str, Duration>,
    commit: &str,
    cmd: &str,
    faults: bool,
) -> String {
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut s = String::new();
    s.push_str("# Protocol mutants\n\n");
    s.push_str(&format!(
        "Generated by `cargo run -p leasehold-mutants -- {cmd}` at commit `{commit}` on {date}. \
         Do not edit: run the program again.\n\n"
    ));
    s.push_str(
        "Each mutant changes the text or the condition that decides safety on one backend \
         (an SQL statement or trigger, a Lua script, an etcd transaction, a Kubernetes request \
         or its condition), through a switch point of `leasehold_core::mutation` (compiled in \
         only with the `leasehold-core/mutants` feature). It runs against the real server \
         through the backend's test target (PostgreSQL's failover target too)",
    );
    s.push_str(if faults {
        " and then the fault suite's cases of that backend (`LEASE_FAULTS_STORMS=4`)"
    } else {
        " (the fault suite was not run: `--no-faults`)"
    });
    s.push_str(
        ". The first failing test kills it; a suite that does not finish within the limit \
         (twice the baseline plus 60 s) kills it by timeout. Every run starts with the suites \
         passing without a mutant, and with the control (an identity substitution) surviving.\n\n",
    );
    s.push_str("| backend | mutants | killed | by timeout | survived (explained) | not reached | not run | baseline |\n|---|---|---|---|---|---|---|---|\n");
    for (b, took) in baseline {
        let of: Vec<_> = results
            .iter()
            .filter(|(m, _, _)| m.backend == *b && !m.control)
            .collect();
        let count = |f: &dyn Fn(&Outcome) -> bool| of.iter().filter(|(_, o, _)| f(o)).count();
        let explained = of
            .iter()
            .filter(|(m, o, _)| matches!(o, Outcome::Survived) && m.equivalent.is_some())
            .count();
        s.push_str(&format!(
            "| {b} | {} | {} | {} | {} ({explained}) | {} | {} | {} s |\n",
            of.len(),
            count(&|o| matches!(o, Outcome::Killed { .. })),
            count(&|o| matches!(o, Outcome::Timeout { .. })),
            count(&|o| matches!(o, Outcome::Survived)),
            count(&|o| matches!(o, Outcome::NotReached { .. })),
            count(&|o| matches!(o, Outcome::NotRun)),
            took.as_secs()
        ));
    }
    s.push_str("\n| mutant | backend | change | result | time |\n|---|---|---|---|---|\n");
    for (m, o, took) in results {
        let mut label = o.label();
        if let (Outcome::Survived, Some(why)) = (o, m.equivalent) {
            label = format!("survived: equivalent ({why})");
        }
        s.push_str(&format!(
            "| `{}` | {} | {} | {} | {} s |\n",
            m.name,
            m.backend,
            m.what,
            label.replace('|', "\\|"),
            took.as_secs()
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::kill_group;

    /// The group is killed and nothing else: a process outside it (here in a group of its own)
    /// is still running afterwards.
    #[test]
    fn kill_group_kills_the_group_and_nothing_else() {
        let spawn = || {
            Command::new("sleep")
                .arg("30")
                .stdin(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("spawn sleep")
        };
        let mut target = spawn();
        let mut bystander = spawn();
        kill_group(target.id(), "KILL");
        let status = target.wait().expect("wait for the target");
        assert!(!status.success(), "the target was killed: {status}");
        // The bystander must still be running (poll briefly: a kill would land at once).
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            assert!(
                bystander.try_wait().expect("try_wait").is_none(),
                "a process outside the group was killed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = bystander.kill();
        let _ = bystander.wait();
    }
}
