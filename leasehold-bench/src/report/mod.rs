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

/// The label of the ablation that runs the library's acquire with the minimal release: the
/// notes split a protocol cost into acquire and release by it.
pub(crate) const LIBRARY_ACQUIRE: &str = "library's acquire, minimal release";

/// One throughput row: the number of clients and, per side of [`crate::measure::SIDES`] and
/// then per ablation, its rate and A/A ratio.
#[derive(Debug)]
pub(crate) struct ThroughputRow {
    pub(crate) clients: usize,
    pub(crate) rates: Vec<crate::measure::Rate>,
    /// The labels of the ablations measured with the sides: `rates[SIDES.len() + i]` is
    /// `ablations[i]`'s.
    pub(crate) ablations: Vec<&'static str>,
}

impl ThroughputRow {
    /// The rate of side `i`.
    pub(crate) fn rate(&self, i: usize) -> M<f64> {
        self.rates
            .get(i)
            .map_or_else(|| Err("not measured".into()), |r| r.0.clone())
    }
    /// The A/A ratio of side `i`.
    pub(crate) fn aa(&self, i: usize) -> Option<f64> {
        self.rates.get(i).and_then(|r| r.1)
    }
    /// Each ablation's label with its rate (they follow the sides in `rates`).
    pub(crate) fn ablation_rates(&self) -> impl Iterator<Item = (&'static str, M<f64>)> + '_ {
        let n = crate::measure::SIDES.len();
        self.ablations
            .iter()
            .enumerate()
            .map(move |(i, label)| (*label, self.rate(n + i)))
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
             Each backend is measured in one run, interleaved, on five sides: the library's bare \
             store, the supervisor users run over it, the `leasehold-otel` decorated store, the \
             library's own protocol issued directly (*same protocol*: the library over it is the \
             **wrapper overhead**), and a **minimal** lease with a fencing counter written by \
             hand the way an expert would (see the notes). The goals are judged against the \
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

/// The verdict on ratios that miss their goal (`(ratio, raw A/A, shortfall)` each): within the
/// noise when every shortfall is smaller than the distance of the run's A/A ratio from 1, that
/// is when two measurements of the raw protocol against itself differ by more than the ratio
/// misses by.
fn within_noise(misses: &[(f64, Option<f64>, f64)]) -> String {
    let explained = !misses.is_empty()
        && misses
            .iter()
            .all(|(_, aa, short)| aa.is_some_and(|aa| *short <= (1.0 - aa).abs()));
    if !explained {
        return "**no**".to_string();
    }
    let spread = misses
        .iter()
        .filter_map(|(_, aa, _)| aa.map(|aa| (1.0 - aa).abs()))
        .fold(0.0_f64, f64::max);
    let short = misses.iter().map(|m| m.2).fold(0.0_f64, f64::max);
    format!(
        "**no**, within the noise: misses by {:.1}%, the raw protocol against itself (A/A) \
         differs by {:.1}% in this run",
        short * 100.0,
        spread * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::within_noise;

    #[test]
    fn a_miss_is_within_the_noise_only_when_the_raw_protocol_varies_more() {
        // Throughput 0.945 against 0.95: short by 0.005; A/A 0.97 differs by 0.03.
        assert!(within_noise(&[(0.945, Some(0.97), 0.005)]).contains("within the noise"));
        // The same miss with an A/A of 0.998 is a plain miss.
        assert_eq!(within_noise(&[(0.945, Some(0.998), 0.005)]), "**no**");
        // Without an A/A figure nothing is explained.
        assert_eq!(within_noise(&[(0.945, None, 0.005)]), "**no**");
        // Every miss must be covered (p50 covered, p99 not).
        assert_eq!(
            within_noise(&[(1.12, Some(1.05), 0.02), (1.30, Some(1.05), 0.20)]),
            "**no**"
        );
        assert_eq!(within_noise(&[]), "**no**");
    }
}
