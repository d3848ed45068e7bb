//! The Markdown report and the stdout summary: one file per table.

mod cpu;
mod goals;
mod handoff;
mod latency;
mod notes;
mod renewal;
mod shards;
mod takeover;
mod throughput;

use std::fmt::Write as _;
use std::time::Duration;

use crate::measure::{LIB, MIN, RenewalLoad, quantile_ms};

type M<T> = Result<T, String>;

use crate::stats::Interval;

/// The label of the ablation that runs the library's acquire with the minimal release: the
/// notes split a protocol cost into acquire and release by it.
pub(crate) const LIBRARY_ACQUIRE: &str = "library's acquire, minimal release";

/// One throughput row: the number of clients and, per side of [`crate::measure::SIDES`], then
/// per ablation, then per library configuration, its rate and its per-round rates.
#[derive(Debug)]
pub(crate) struct ThroughputRow {
    pub(crate) clients: usize,
    /// Each side's rate, the mean over the processes (an error if any process failed it).
    pub(crate) rates: Vec<M<f64>>,
    /// Per process (repeat), per round, per side: the side's rate in that round.
    pub(crate) rounds: Vec<Vec<Vec<Option<f64>>>>,
    /// The labels of the ablations measured with the sides: `rates[SIDES.len() + i]` is
    /// `ablations[i]`'s.
    pub(crate) ablations: Vec<&'static str>,
    /// The library's other configurations measured with the sides (etcd's
    /// `LeaseSharing::PerTtl`), after the ablations.
    pub(crate) configs: Vec<&'static str>,
}

impl ThroughputRow {
    /// The rate of side `i`.
    pub(crate) fn rate(&self, i: usize) -> M<f64> {
        self.rates
            .get(i)
            .map_or_else(|| Err("not measured".into()), Clone::clone)
    }
    /// Side `a` over side `b`: the geometric mean of their per-round ratios with its bootstrap
    /// interval (`None` where a side failed or fewer than two rounds ran both).
    pub(crate) fn ratio(&self, a: usize, b: usize) -> Option<Interval> {
        if self.rate(a).is_err() || self.rate(b).is_err() {
            return None;
        }
        let groups: Vec<Vec<f64>> = self
            .rounds
            .iter()
            .map(|process| {
                process
                    .iter()
                    .filter_map(|round| match (round.get(a), round.get(b)) {
                        (Some(Some(x)), Some(Some(y))) if *y > 0.0 => Some(x / y),
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        let seed = (self.clients as u64) << 32 | (a as u64) << 16 | b as u64;
        crate::stats::ratio_interval(&groups, seed)
    }
    /// How many processes and rounds the row rests on.
    pub(crate) fn extent(&self) -> (usize, usize) {
        (self.rounds.len(), self.rounds.iter().map(Vec::len).sum())
    }
    /// Each ablation's index and label (they follow the sides in `rates`).
    pub(crate) fn ablation_sides(&self) -> impl Iterator<Item = (usize, &'static str)> + '_ {
        let n = crate::measure::SIDES.len();
        self.ablations
            .iter()
            .enumerate()
            .map(move |(i, label)| (n + i, *label))
    }
    /// Each ablation's label with its rate.
    pub(crate) fn ablation_rates(&self) -> impl Iterator<Item = (&'static str, M<f64>)> + '_ {
        self.ablation_sides()
            .map(|(i, label)| (label, self.rate(i)))
    }
    /// Each library configuration's index and label (they follow the ablations).
    pub(crate) fn config_sides(&self) -> impl Iterator<Item = (usize, &'static str)> + '_ {
        let n = crate::measure::SIDES.len() + self.ablations.len();
        self.configs
            .iter()
            .enumerate()
            .map(move |(i, label)| (n + i, *label))
    }
}

/// Everything measured on one backend.
#[derive(Debug)]
pub(crate) struct BackendRun {
    pub(crate) name: &'static str,
    pub(crate) skipped: Option<String>,
    pub(crate) version: String,
    pub(crate) watch: bool,
    pub(crate) rtt_what: &'static str,
    pub(crate) rtt_ms: M<f64>,
    pub(crate) throughput: Vec<ThroughputRow>,
    /// Acquire latencies per side of [`crate::measure::SIDES`].
    pub(crate) latency: Vec<M<Vec<Duration>>>,
    pub(crate) takeover_ttl: Duration,
    pub(crate) takeover_watch: Vec<M<f64>>,
    pub(crate) takeover_poll: Vec<M<f64>>,
    /// Takeover from a holder process killed with SIGKILL (the waiter uses the watch where the
    /// store has one).
    pub(crate) takeover_killed: Vec<M<f64>>,
    pub(crate) handoff_watch: Vec<M<f64>>,
    pub(crate) handoff_poll: Vec<M<f64>>,
    /// The raw protocol's release then acquire, back to back.
    pub(crate) handoff_floor: Option<M<Vec<Duration>>>,
    /// The minimal protocol's release then acquire, back to back: the floor of any handoff.
    pub(crate) handoff_floor_minimal: Option<M<Vec<Duration>>>,
    /// The raw protocol's handoff with its own notification (`None` inside: no notification).
    pub(crate) handoff_notified: Option<M<Option<Vec<Duration>>>>,
    /// The store's own expiry delay (raw), where it has one to observe.
    pub(crate) expiry_floor: Vec<M<f64>>,
    /// The renewal load per configuration (the default first).
    pub(crate) renewal: Vec<(&'static str, M<RenewalLoad>)>,
    /// Shard ownership at scale, if run.
    pub(crate) shards: Option<M<crate::shards::ShardRun>>,
    /// The store configuration of the shard run, where it is not the default.
    pub(crate) shards_config: Option<&'static str>,
    /// Wall time and CPU per acquire+release pair at one client, per side (label first).
    pub(crate) cpu: Vec<(&'static str, M<crate::measure::PairCost>)>,
    /// The server processes whose CPU is counted, where the server runs apart.
    pub(crate) cpu_server: Option<String>,
}

impl BackendRun {
    pub(crate) fn new(name: &'static str) -> Self {
        BackendRun {
            name,
            skipped: None,
            version: String::new(),
            watch: false,
            rtt_what: "",
            rtt_ms: Err("not run".into()),
            throughput: Vec::new(),
            latency: Vec::new(),
            takeover_ttl: Duration::ZERO,
            takeover_watch: Vec::new(),
            takeover_poll: Vec::new(),
            takeover_killed: Vec::new(),
            handoff_watch: Vec::new(),
            handoff_poll: Vec::new(),
            handoff_floor: None,
            handoff_floor_minimal: None,
            handoff_notified: None,
            expiry_floor: Vec::new(),
            renewal: Vec::new(),
            shards: None,
            shards_config: None,
            cpu: Vec::new(),
            cpu_server: None,
        }
    }
}

/// The whole run.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) runs: Vec<BackendRun>,
    pub(crate) machine: Vec<(&'static str, String)>,
    pub(crate) command: String,
    pub(crate) started: jiff::Timestamp,
    pub(crate) finished: jiff::Timestamp,
    pub(crate) smoke: bool,
    pub(crate) optimized: bool,
    /// How long each throughput row ran, and the block the two sides alternated in.
    pub(crate) throughput_for: Duration,
    pub(crate) throughput_block: Duration,
    pub(crate) cpu_block: Duration,
    pub(crate) cpu_rounds: usize,
    /// The processes the throughput section ran in (each a repeat of it).
    pub(crate) repeats: usize,
}

fn median(v: &[M<f64>]) -> M<f64> {
    let mut ok = Vec::new();
    for r in v {
        match r {
            Ok(x) => ok.push(*x),
            Err(e) => return Err(e.clone()),
        }
    }
    if ok.is_empty() {
        return Err("no samples".into());
    }
    ok.sort_by(f64::total_cmp);
    Ok(ok[ok.len() / 2])
}

fn max_of(v: &[M<f64>]) -> Option<f64> {
    v.iter()
        .filter_map(|r| r.as_ref().ok())
        .copied()
        .reduce(f64::max)
}

fn f(v: &M<f64>, digits: usize) -> String {
    match v {
        Ok(x) => format!("{x:.digits$}"),
        Err(e) => format!("error: {}", one_line(e)),
    }
}

/// "median (max)" of a measurement, or `empty` when it was not taken.
fn cell(v: &[M<f64>], empty: &str) -> String {
    if v.is_empty() {
        return empty.into();
    }
    let m = median(v);
    match max_of(v) {
        Some(mx) if v.len() > 1 => format!("{} ({mx:.1})", f(&m, 1)),
        _ => f(&m, 1),
    }
}

fn one_line(s: &str) -> String {
    let s: String = s.chars().take(120).collect();
    s.replace(['\n', '|'], " ")
}

fn met(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "n/a",
    }
}

/// An interval as a cell, `-` where there is none.
fn iv(x: Option<Interval>, digits: usize) -> String {
    x.map_or("-".into(), |x| x.show(digits))
}

impl Report {
    fn measured(&self) -> impl Iterator<Item = &BackendRun> {
        self.runs.iter().filter(|r| r.skipped.is_none())
    }

    /// The Markdown report.
    pub(crate) fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# Benchmarks\n");
        let _ = writeln!(
            s,
            "Written by the benchmark itself (`leasehold-bench/src/main.rs`); do not edit by hand. \
             Each backend is measured in one run, interleaved, on six sides: the library's bare \
             store, the supervisor users run over it, the `leasehold-otel` decorated store, the \
             library's own protocol issued directly (*same protocol*: the library over it is the \
             **wrapper overhead**), a **minimal** lease with a fencing counter written by \
             hand the way an expert would (see the notes), and that minimal lease again as a \
             side of its own (*A/A*: the noise of the run). The goals are judged against the \
             minimal floor, so the ratios matter more than the absolute figures.\n"
        );
        let _ = writeln!(s, "## Run\n");
        let _ = writeln!(s, "- command: `{}`", self.command);
        let _ = writeln!(
            s,
            "- full command with services: `bash scripts/test.sh` starts the services; the full \
             benchmark is `cargo run --release -p leasehold-bench` with the services' env files sourced \
             (`. /tmp/lease-test/*.env`)"
        );
        let _ = writeln!(
            s,
            "- mode: {}; build: {}",
            if self.smoke {
                "smoke (tiny counts, figures meaningless)"
            } else {
                "full"
            },
            if self.optimized {
                "release"
            } else {
                "debug (figures not representative)"
            }
        );
        let _ = writeln!(
            s,
            "- started: {}, finished: {}",
            self.started
                .round(jiff::Unit::Second)
                .unwrap_or(self.started),
            self.finished
                .round(jiff::Unit::Second)
                .unwrap_or(self.finished)
        );
        for (k, v) in &self.machine {
            let _ = writeln!(s, "- {k}: {v}");
        }
        let _ = writeln!(
            s,
            "- the machine's cores are shared by the benchmark, the stores it measures (etcd and \
             the kube-apiserver run beside it) and whatever else the host schedules, so \
             absolute figures are noisy; the library and raw sides of each row are interleaved \
             to share the same load, and only their ratios are judged\n"
        );
        let _ = writeln!(s, "## Backends\n");
        for r in &self.runs {
            match &r.skipped {
                None => {
                    let _ = writeln!(
                        s,
                        "- `{}`: measured ({}; watch: {}; round trip = {} median {} ms)",
                        r.name,
                        r.version,
                        if r.watch { "yes" } else { "no" },
                        r.rtt_what,
                        f(&r.rtt_ms, 3)
                    );
                }
                Some(why) => {
                    let _ = writeln!(s, "- `{}`: skipped: {}", r.name, one_line(why));
                }
            }
        }
        s.push('\n');
        self.goals_table(&mut s);
        self.throughput_table(&mut s);
        self.throughput_steps_table(&mut s);
        self.cpu_table(&mut s);
        self.latency_table(&mut s);
        self.takeover_table(&mut s);
        self.handoff_table(&mut s);
        self.renewal_table(&mut s);
        self.shards_table(&mut s);
        self.notes(&mut s);
        s
    }

    /// A plain-text summary for stdout.
    pub(crate) fn summary(&self) -> String {
        let mut s = String::new();
        for r in &self.runs {
            if let Some(why) = &r.skipped {
                let _ = writeln!(s, "{}: skipped ({})", r.name, one_line(why));
                continue;
            }
            let _ = writeln!(s, "{} ({}), RTT {} ms", r.name, r.version, f(&r.rtt_ms, 3));
            for row in &r.throughput {
                let _ = writeln!(
                    s,
                    "  throughput {} client(s): library {} ops/s, minimal {} ops/s",
                    row.clients,
                    f(&row.rate(LIB), 0),
                    f(&row.rate(MIN), 0)
                );
            }
            let q = |i: usize, p: f64| -> String {
                match r.latency.get(i) {
                    Some(Ok(v)) if !v.is_empty() => format!("{:.3}", quantile_ms(v, p)),
                    _ => "-".into(),
                }
            };
            let _ = writeln!(
                s,
                "  acquire p50/p99 ms: library {}/{}, minimal {}/{}",
                q(LIB, 0.5),
                q(LIB, 0.99),
                q(MIN, 0.5),
                q(MIN, 0.99)
            );
            let _ = writeln!(
                s,
                "  takeover ms: watch {}, polling {}",
                median(&r.takeover_watch).map_or("-".into(), |x| format!("{x:.1}")),
                f(&median(&r.takeover_poll), 1)
            );
            let _ = writeln!(
                s,
                "  handoff ms: watch {}, polling {}",
                median(&r.handoff_watch).map_or("-".into(), |x| format!("{x:.1}")),
                f(&median(&r.handoff_poll), 1)
            );
            for (config, load) in &r.renewal {
                match load {
                    Ok(l) => {
                        let _ = writeln!(
                            s,
                            "  renewal ({config}): {} leases, {:.1} round trips/interval, {:.1} CPU ms/interval, {:.0} RSS bytes/lease",
                            l.leases,
                            l.round_trips_per_interval,
                            l.cpu_ms_per_interval,
                            l.rss_bytes_per_lease
                        );
                    }
                    Err(e) => {
                        let _ = writeln!(s, "  renewal ({config}): error: {}", one_line(e));
                    }
                }
            }
        }
        s
    }
}
