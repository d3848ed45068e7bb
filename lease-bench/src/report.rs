//! The Markdown report and the stdout summary.

use std::fmt::Write as _;
use std::time::Duration;

use crate::measure::{RenewalLoad, best_quantile_ms, quantile_ms};

type M<T> = Result<T, String>;

/// One throughput row: clients, library rate, raw rate, and the raw A/A ratio (one half of the
/// raw blocks over the other).
pub(crate) type ThroughputRow = (usize, M<f64>, Option<M<f64>>, Option<f64>);

/// Everything measured on one backend.
#[derive(Debug)]
pub(crate) struct BackendRun {
    pub(crate) name: &'static str,
    pub(crate) skipped: Option<String>,
    pub(crate) version: String,
    pub(crate) watch: bool,
    pub(crate) has_raw: bool,
    pub(crate) rtt_what: &'static str,
    pub(crate) rtt_ms: M<f64>,
    pub(crate) throughput: Vec<ThroughputRow>,
    pub(crate) latency_lib: M<Vec<Duration>>,
    pub(crate) latency_raw: Option<M<Vec<Duration>>>,
    /// How many consecutive equal rounds the latency samples were taken in.
    pub(crate) latency_rounds: usize,
    pub(crate) takeover_ttl: Duration,
    pub(crate) takeover_watch: Vec<M<f64>>,
    pub(crate) takeover_poll: Vec<M<f64>>,
    pub(crate) handoff_watch: Vec<M<f64>>,
    pub(crate) handoff_poll: Vec<M<f64>>,
    /// The raw protocol's release then acquire, back to back.
    pub(crate) handoff_floor: Option<M<Vec<Duration>>>,
    /// The raw protocol's handoff with its own notification (`None` inside: no notification).
    pub(crate) handoff_notified: Option<M<Option<Vec<Duration>>>>,
    /// The store's own expiry delay (raw), where it has one to observe.
    pub(crate) expiry_floor: Vec<M<f64>>,
    pub(crate) renewal: Option<M<RenewalLoad>>,
}

impl BackendRun {
    pub(crate) fn new(name: &'static str) -> Self {
        BackendRun {
            name,
            skipped: None,
            version: String::new(),
            watch: false,
            has_raw: false,
            rtt_what: "",
            rtt_ms: Err("not run".into()),
            throughput: Vec::new(),
            latency_lib: Err("not run".into()),
            latency_raw: None,
            latency_rounds: 1,
            takeover_ttl: Duration::ZERO,
            takeover_watch: Vec::new(),
            takeover_poll: Vec::new(),
            handoff_watch: Vec::new(),
            handoff_poll: Vec::new(),
            handoff_floor: None,
            handoff_notified: None,
            expiry_floor: Vec::new(),
            renewal: None,
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
            "Written by the benchmark itself (`lease-bench/src/main.rs`); do not edit by hand. \
             Each backend is measured through the library **and** through its raw protocol (the \
             same statements, Lua scripts or etcd requests the backend crate sends, issued \
             directly with the same driver and the same pool, connection or client) in the same \
             run, so the ratios matter more than the absolute figures.\n"
        );
        let _ = writeln!(s, "## Run\n");
        let _ = writeln!(s, "- command: `{}`", self.command);
        let _ = writeln!(
            s,
            "- full command with services: `bash scripts/test.sh` starts the services; the full \
             benchmark is `cargo run --release -p lease-bench` with the services' env files sourced \
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
        self.throughput_table(&mut s);
        self.latency_table(&mut s);
        self.takeover_table(&mut s);
        self.handoff_table(&mut s);
        self.renewal_table(&mut s);
        self.notes(&mut s);
        s
    }

    fn throughput_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 1. Acquire+release throughput\n");
        let _ = writeln!(
            s,
            "One client on one key and 8 clients on 8 keys, each looping acquire then release. \
             The library and the raw protocol are measured together, for {:.0} s after a warm-up: \
             all clients switch side every {} ms (library, raw, library, ...), each on keys of \
             its own, and time every pair they do; a side's rate is the sum over the clients of \
             the pairs done on that side over the time spent on it. Slow drifts of the shared \
             machine (another process's burst, the store's background work) so fall on both \
             sides alike, which runs of each side one after the other cannot promise. *Raw A/A* \
             is the run's own noise: the raw blocks alternate between two halves, A and B, and \
             the column gives A's rate over B's, two measurements of the same protocol; a ratio \
             that misses the goal by less than A/A's distance from 1 is within the noise.\n",
            self.throughput_for.as_secs_f64(),
            self.throughput_block.as_millis()
        );
        let _ = writeln!(
            s,
            "| backend | clients | library (ops/s) | raw (ops/s) | ratio | raw A/A | goal | met? |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for r in self.measured() {
            for (clients, lib, raw, aa) in &r.throughput {
                let (raw_s, ratio, verdict) = match (lib, raw) {
                    (Ok(l), Some(Ok(w))) => {
                        let q = l / w;
                        let verdict = if q >= 0.95 {
                            "yes".to_string()
                        } else {
                            within_noise(&[(q, *aa, 0.95 - q)])
                        };
                        (format!("{w:.0}"), format!("{q:.3}"), verdict)
                    }
                    (_, Some(Err(e))) => (
                        format!("error: {}", one_line(e)),
                        "-".into(),
                        met(None).to_string(),
                    ),
                    (_, None) => ("no raw client".into(), "-".into(), met(None).to_string()),
                    (Err(_), Some(Ok(w))) => (format!("{w:.0}"), "-".into(), met(None).to_string()),
                };
                let _ = writeln!(
                    s,
                    "| {} | {clients} | {} | {raw_s} | {ratio} | {} | >= 0.95 | {verdict} |",
                    r.name,
                    f(lib, 0),
                    aa.map_or("-".into(), |x| format!("{x:.3}")),
                );
            }
        }
        s.push('\n');
    }

    fn latency_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 2. Acquire latency\n");
        let quantiles = if self.runs.iter().any(|r| r.latency_rounds > 1) {
            "The samples are taken in consecutive rounds of equal size and each side's p50 and \
             p99 are the best of its rounds: a stall of the shared machine then spoils a round, \
             not the figure."
        } else {
            let tail = self
                .measured()
                .filter_map(|r| r.latency_lib.as_ref().ok().map(Vec::len))
                .max()
                .unwrap_or(0)
                / 100;
            &format!(
                "Each side's p50 and p99 are taken over all its samples: the alternation spreads \
                 the machine's stalls over both sides, and with {tail} samples of each side above \
                 its p99 a few stalls cannot decide it."
            )
        };
        let _ = writeln!(
            s,
            "One client, sequential acquires of a free key (the release after each is not timed); \
             the library and the raw protocol take their samples alternately (one library acquire, \
             one raw acquire, and so on), so that load on the machine falls on both alike. \
             {quantiles} *Raw A/A* compares the raw samples of even index with those of odd index \
             (taken alternately, by the same method): the run's own noise, against which a \
             ratio that misses the goal is judged as for throughput.\n"
        );
        let _ = writeln!(
            s,
            "| backend | samples | library p50 (ms) | raw p50 (ms) | p50 ratio | library p99 (ms) | raw p99 (ms) | p99 ratio | raw A/A p50 / p99 | goal | met? |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
        for r in self.measured() {
            let lib = r.latency_lib.as_ref();
            let raw = r.latency_raw.as_ref().map(|x| x.as_ref());
            let q = |v: Result<&Vec<Duration>, &String>, p: f64| -> M<f64> {
                v.map(|v| best_quantile_ms(v, r.latency_rounds, p))
                    .map_err(Clone::clone)
            };
            let (l50, l99) = (q(lib, 0.5), q(lib, 0.99));
            let samples = lib.map_or(0, Vec::len);
            let (w50, w99, r50, r99, verdict, aa) = match raw {
                Some(rv) => {
                    let (w50, w99) = (q(rv, 0.5), q(rv, 0.99));
                    let ratio = |a: &M<f64>, b: &M<f64>| match (a, b) {
                        (Ok(a), Ok(b)) => Some(a / b),
                        _ => None,
                    };
                    let (r50, r99) = (ratio(&l50, &w50), ratio(&l99, &w99));
                    // A/A: the raw samples of odd and even index, taken alternately.
                    let (aa50, aa99) = match rv {
                        Ok(v) if v.len() >= 2 * r.latency_rounds.max(1) => {
                            let a: Vec<Duration> = v.iter().step_by(2).copied().collect();
                            let b: Vec<Duration> = v.iter().skip(1).step_by(2).copied().collect();
                            let qq = |x: &[Duration], p| best_quantile_ms(x, r.latency_rounds, p);
                            (
                                Some(qq(&a, 0.5) / qq(&b, 0.5)),
                                Some(qq(&a, 0.99) / qq(&b, 0.99)),
                            )
                        }
                        _ => (None, None),
                    };
                    let verdict = match (r50, r99) {
                        (Some(a), Some(b)) if a <= 1.1 && b <= 1.1 => "yes".to_string(),
                        (Some(a), Some(b)) => {
                            let mut misses = Vec::new();
                            if a > 1.1 {
                                misses.push((a, aa50, a - 1.1));
                            }
                            if b > 1.1 {
                                misses.push((b, aa99, b - 1.1));
                            }
                            within_noise(&misses)
                        }
                        _ => met(None).to_string(),
                    };
                    let fr = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
                    (
                        f(&w50, 3),
                        f(&w99, 3),
                        r50,
                        r99,
                        verdict,
                        format!("{} / {}", fr(aa50), fr(aa99)),
                    )
                }
                None => (
                    "no raw client".into(),
                    "no raw client".into(),
                    None,
                    None,
                    met(None).to_string(),
                    "-".into(),
                ),
            };
            let fr = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
            let _ = writeln!(
                s,
                "| {} | {samples} | {} | {w50} | {} | {} | {w99} | {} | {aa} | <= 1.1x | {verdict} |",
                r.name,
                f(&l50, 3),
                fr(r50),
                f(&l99, 3),
                fr(r99),
            );
        }
        s.push('\n');
    }

    fn takeover_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 3. Takeover after a holder dies\n");
        let _ = writeln!(
            s,
            "The holder acquires and then neither renews nor releases. A supervisor waits for the \
             key, woken by the store's watch or by bounded polling (the same supervisor with the \
             watch hidden). Figure: milliseconds from the store-side expiry (estimated as the \
             midpoint of the holder's acquire round trip plus the TTL) to the waiter's grant; \
             median of the repetitions (max in brackets). Each repetition starts after a random \
             pause of up to 500 ms, so that it does not lock onto a periodic process of the store. \
             *Store expiry delay* is the store's own floor, measured with the raw protocol where \
             the store expires keys itself and reports it: in each repetition a raw key on a lease \
             of the same TTL, granted at the same moment as the holder's, is watched from its \
             nominal expiry to its deletion event. *Watch over the store's expiry* pairs the two \
             figures of each repetition (both keys expire in the same pass of the store's expiry \
             process) and gives the median of the differences: what the watch, the waiter and its \
             acquire add once the store has actually expired the key.\n"
        );
        let _ = writeln!(
            s,
            "| backend | TTL | RTT (ms) | store expiry delay, raw (ms) | watch over the store's expiry (ms) | watch (ms) | polling (ms) | goal (watch) | met? |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
        for r in self.measured() {
            let rtt = r.rtt_ms.as_ref().ok().copied();
            let floor = (!r.expiry_floor.is_empty()).then(|| median(&r.expiry_floor));
            let paired: Vec<M<f64>> = if r.expiry_floor.len() == r.takeover_watch.len() {
                r.takeover_watch
                    .iter()
                    .zip(&r.expiry_floor)
                    .filter_map(|(t, f)| match (t, f) {
                        (Ok(t), Ok(f)) => Some(Ok(t - f)),
                        _ => None,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let over = (!paired.is_empty()).then(|| median(&paired));
            let (goal, verdict) = match (r.watch, rtt, median(&r.takeover_watch)) {
                (true, Some(rtt), Ok(m)) => {
                    let g = rtt + 20.0;
                    let verdict = match (&floor, &over) {
                        _ if m <= g => "yes".to_string(),
                        (Some(Ok(d)), Some(Ok(o))) if *o <= g => format!(
                            "**no**, floor-bound: the store itself deletes an expired key \
                             {d:.1} ms after its TTL (median); the waiter is granted {o:.1} ms \
                             after that deletion (<= {g:.1})"
                        ),
                        _ => met(Some(false)).to_string(),
                    };
                    (format!("<= {g:.1} ms"), verdict)
                }
                (true, _, _) => ("<= RTT + 20 ms".into(), met(None).to_string()),
                (false, _, _) => ("n/a (no watch)".into(), met(None).to_string()),
            };
            let _ = writeln!(
                s,
                "| {} | {:?} | {} | {} | {} | {} | {} | {goal} | {verdict} |",
                r.name,
                r.takeover_ttl,
                f(&r.rtt_ms, 2),
                floor.map_or("-".into(), |_| cell(&r.expiry_floor, "-")),
                over.map_or("-".into(), |_| cell(&paired, "-")),
                cell(&r.takeover_watch, "no watch"),
                cell(&r.takeover_poll, "no watch"),
            );
        }
        s.push('\n');
    }

    fn handoff_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 4. Graceful handoff\n");
        let _ = writeln!(
            s,
            "A supervisor waits for a held key; the holder releases. Figure: milliseconds from the \
             start of the release call to the waiter's grant; median (max in brackets). The goal \
             applies to the best wake-up the backend offers (watch where it has one). Two floors \
             of the raw protocol are measured in the same run. *Raw release+acquire*: the raw \
             release and the next owner's raw acquire issued back to back on one task, as a \
             waiter woken by a perfect, free notification would. *Raw, woken by the store*: a \
             raw waiter subscribed through the store's own notification (PostgreSQL `LISTEN`, \
             the Redis release channel, an etcd watch, a Kubernetes watch, SQLite's in-process \
             wake) tries a raw acquire on each hint, from the start of the raw release to its \
             grant; *library over it* is what the library adds to that.\n"
        );
        let _ = writeln!(
            s,
            "| backend | RTT (ms) | raw release+acquire (ms) | floor in RTTs | raw, woken by the store (ms) | watch (ms) | polling (ms) | best in RTTs | library over the raw woken (ms) | goal | met? |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
        for r in self.measured() {
            let best = if r.watch {
                median(&r.handoff_watch)
            } else {
                median(&r.handoff_poll)
            };
            let floor = match &r.handoff_floor {
                Some(Ok(v)) if !v.is_empty() => Some(Ok(quantile_ms(v, 0.5))),
                Some(Ok(_)) => Some(Err("no samples".to_string())),
                Some(Err(e)) => Some(Err(e.clone())),
                None => None,
            };
            let notified = match &r.handoff_notified {
                Some(Ok(Some(v))) if !v.is_empty() => Some(Ok(quantile_ms(v, 0.5))),
                Some(Ok(Some(_))) => Some(Err("no samples".to_string())),
                Some(Ok(None)) | None => None,
                Some(Err(e)) => Some(Err(e.clone())),
            };
            let notified_cell = match (&notified, &r.handoff_notified) {
                (Some(Ok(m)), Some(Ok(Some(v)))) => {
                    let max = v.iter().max().map_or(0.0, |d| d.as_secs_f64() * 1e3);
                    format!("{m:.2} ({max:.2})")
                }
                (Some(Err(e)), _) => format!("error: {e}"),
                _ => "-".into(),
            };
            let rtt = r.rtt_ms.as_ref().ok().copied().filter(|x| *x > 0.0);
            let floor_ok = floor.as_ref().and_then(|f| f.as_ref().ok()).copied();
            let notified_ok = notified.as_ref().and_then(|f| f.as_ref().ok()).copied();
            let (in_rtt, verdict) = match (&best, rtt) {
                (Ok(b), Some(rtt)) => {
                    let n = b / rtt;
                    let verdict = if n <= 3.0 {
                        "yes".to_string()
                    } else {
                        match (floor_ok, notified_ok) {
                            (Some(fl), Some(nf)) if nf / rtt > 3.0 => format!(
                                "**no**, floor-bound: woken by the store's own notification the \
                                 raw protocol takes {nf:.2} ms = {:.1} RTT (its release+acquire \
                                 back to back alone: {:.1} RTT); the library {:+.2} ms over it",
                                nf / rtt,
                                fl / rtt,
                                b - nf
                            ),
                            (Some(fl), None) if fl / rtt > 3.0 => format!(
                                "**no**, floor-bound: the raw release+acquire alone is {:.1} RTT; \
                                 +{:.1} RTT over it",
                                fl / rtt,
                                (b - fl) / rtt
                            ),
                            _ => met(Some(false)).to_string(),
                        }
                    };
                    (format!("{n:.1}"), verdict)
                }
                _ => ("-".into(), met(None).to_string()),
            };
            let over = match (&best, notified_ok) {
                (Ok(b), Some(nf)) => format!("{:+.2}", b - nf),
                _ => "-".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {notified_cell} | {} | {} | {in_rtt} | {over} | <= 3 RTT | {verdict} |",
                r.name,
                f(&r.rtt_ms, 2),
                floor.as_ref().map_or("-".into(), |v| f(v, 2)),
                match (floor_ok, rtt) {
                    (Some(fl), Some(rtt)) => format!("{:.1}", fl / rtt),
                    _ => "-".into(),
                },
                cell(&r.handoff_watch, "no watch"),
                cell(&r.handoff_poll, "no watch"),
            );
        }
        s.push('\n');
    }

    fn renewal_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 5. Renewal load\n");
        let _ = writeln!(
            s,
            "N leases held by one process through one `Supervisor` with renewal batching \
             (`with_renewal_batching(interval / 20)`), renewing every TTL/3; the supervisor moves \
             each renewal earlier onto a grid of half an interval shared by its guards (ADR 0004), \
             so after their first renewal all leases renew in at most two waves per interval, \
             whatever the spread of their acquisitions. Round trips are \
             `renew_many` calls counted by `lease_testkit::faulty::FaultyStore` (one call is one \
             statement, script or batch), averaged over the measured intervals after one warm-up \
             interval (a renewal wave that straddles the end of the measured span is counted \
             or not, so the figure is exact to about one wave). Kubernetes has no batch write: its \
             figure counts one request per lease. *Server requests* are counted by the server \
             itself over the same span, where it keeps such a counter (etcd: every gRPC message \
             received, keepalives included, from its `/metrics`; Redis: the calls in `INFO \
             commandstats` of every command but those the store's Lua scripts run, since Redis \
             counts a command a script runs like one a client sent, so a batch's `EVALSHA` counts \
             once); where present, the goal is judged on them. CPU is this \
             process's user+system time (`/proc/self/stat`) per interval; memory is the RSS \
             growth while acquiring, per lease.\n"
        );
        let _ = writeln!(
            s,
            "| backend | leases | TTL | batch window | intervals measured | acquire time | renew_many calls / interval | server requests / interval | CPU ms / interval | CPU µs / lease / interval | RSS bytes / lease | still held | goal | met? |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in self.measured() {
            match &r.renewal {
                Some(Ok(l)) => {
                    let batches = r.name != "k8s";
                    let leases = f64::from(u32::try_from(l.leases.max(1)).unwrap_or(u32::MAX));
                    let requests = l
                        .server_requests_per_interval
                        .unwrap_or(l.round_trips_per_interval);
                    let (goal, ok) = if batches {
                        ("<= 10", Some(requests <= 10.0))
                    } else {
                        ("n/a (no batch API)", None)
                    };
                    let trips = format!(
                        "{:.1} | {}",
                        l.round_trips_per_interval,
                        l.server_requests_per_interval
                            .map_or("-".into(), |x| format!("{x:.1}"))
                    );
                    let _ = writeln!(
                        s,
                        "| {} | {} | {:?} | {:?} | {} | {:.1} s | {trips} | {:.1} | {:.2} | {:.0} | {}/{} | {goal} | {} |",
                        r.name,
                        l.leases,
                        l.ttl,
                        l.window,
                        l.intervals,
                        l.acquire_spread.as_secs_f64(),
                        l.cpu_ms_per_interval,
                        l.cpu_ms_per_interval * 1000.0 / leases,
                        l.rss_bytes_per_lease,
                        l.still_held,
                        l.leases,
                        met(ok)
                    );
                }
                Some(Err(e)) => {
                    let _ = writeln!(
                        s,
                        "| {} | error: {} | | | | | | | | | | | | |",
                        r.name,
                        one_line(e)
                    );
                }
                None => {
                    let _ = writeln!(s, "| {} | not run | | | | | | | | | | | | |", r.name);
                }
            }
        }
        s.push('\n');
    }

    fn notes(&self, s: &mut String) {
        let _ = writeln!(s, "## Notes\n");
        let _ = writeln!(
            s,
            "- **What the raw side sends.** PostgreSQL: the store's acquire `INSERT .. ON CONFLICT` \
             and release `UPDATE` on its own pool. Redis: the store's acquire and release Lua \
             scripts (`EVALSHA`) on its connection manager. etcd: the store's request sequence \
             (acquire: range of the lock prefix, lease grant, txn on the prefix's create revision; \
             release: range of the lock key, txn on its create revision and lease, lease revoke) \
             on its client. SQLite: the store's immediate transaction (one read, two upserts) and \
             release `DELETE` on a pool with the store's settings; the library adds its in-process \
             FIFO write queue. Kubernetes: the store's requests with the same client (acquire: GET of \
             the Lease, then a resourceVersion-guarded REPLACE with the holder and token \
             annotations, or a CREATE; release: REPLACE of the granted object with an empty \
             holder); the library adds its observation bookkeeping."
        );
        for r in self.measured() {
            for (clients, lib, raw, _) in &r.throughput {
                if let (Ok(l), Some(Ok(w))) = (lib, raw)
                    && l / w < 0.95
                {
                    let extra_us =
                        (1.0 / l - 1.0 / w) * 1e6 * f64::from(u32::try_from(*clients).unwrap_or(1));
                    let _ = writeln!(
                        s,
                        "- `{}` throughput, {clients} client(s): ratio {:.2}. The raw protocol's own \
                         rate ({w:.0} ops/s) is the floor; the library adds about {extra_us:.0} µs of \
                         client time per acquire+release per client (validation, tracing, \
                         `Lease` construction, boxing through `dyn LeaseStore`) or, on a loaded \
                         machine, the difference is within the run-to-run noise.",
                        r.name,
                        l / w
                    );
                }
            }
            if let (Ok(lib), Some(Ok(raw))) = (&r.latency_lib, &r.latency_raw) {
                let n = r.latency_rounds;
                let (l50, w50) = (best_quantile_ms(lib, n, 0.5), best_quantile_ms(raw, n, 0.5));
                let (l99, w99) = (
                    best_quantile_ms(lib, n, 0.99),
                    best_quantile_ms(raw, n, 0.99),
                );
                if l50 / w50 > 1.1 || l99 / w99 > 1.1 {
                    let _ = writeln!(
                        s,
                        "- `{}` latency: library p50 {l50:.3} ms / p99 {l99:.3} ms against the raw \
                         protocol's floor of p50 {w50:.3} ms / p99 {w99:.3} ms; a p99 on a shared \
                         2-core machine is dominated by scheduling \
                         stalls of either side.",
                        r.name
                    );
                }
            }
            if r.watch
                && let (Ok(m), Ok(rtt)) = (median(&r.takeover_watch), &r.rtt_ms)
                && m > rtt + 20.0
            {
                let why = match r.name {
                    "etcd" => {
                        "etcd does not delete a key when its lease's TTL runs out but when its \
                         leader's lessor next checks for expired leases, on a fixed 500 ms tick \
                         (etcd 3.4 `lessor.runLoop`), and then through a Raft proposal; the \
                         store-expiry-delay column measures that with the raw protocol, and the \
                         waiter is granted about one acquire after the deletion"
                    }
                    "redis" => {
                        "Redis deletes expired keys lazily or in its active-expiry cycle \
                                (10 times a second by default), and the keyspace event fires only \
                                then; without keyspace notifications the watch polls every 250 ms"
                    }
                    "k8s" => {
                        "Kubernetes has no server-side expiry: as client-go, the waiter must \
                              observe the record unchanged for a whole TTL from its own first \
                              observation (here the store's own record of the holder's grant), \
                              then acquire with a GET and a resourceVersion-guarded REPLACE, a \
                              write the API server commits to its etcd; one acquire (table 2) is \
                              the floor after the expiry"
                    }
                    _ => "the store signals the expiry late",
                };
                let _ = writeln!(
                    s,
                    "- `{}` takeover: {m:.1} ms after the estimated expiry with the watch (goal \
                     {:.1} ms). {why}.",
                    r.name,
                    rtt + 20.0
                );
            }
            let best = if r.watch {
                median(&r.handoff_watch)
            } else {
                median(&r.handoff_poll)
            };
            if let (Ok(b), Ok(rtt)) = (best, &r.rtt_ms)
                && b > 3.0 * rtt
            {
                let why = if r.watch {
                    "the release and the next acquire are themselves several round trips of the \
                     ping (see the raw floor in the table; etcd: three requests each), then the \
                     store's notification travels to the waiter and wakes it, which the raw \
                     waiter woken by the same notification pays too (see the table)"
                } else {
                    "this backend has no watch: the waiter polls with jittered backoff (up to a \
                     quarter of the TTL, capped at 1 s), so the handoff is bounded by the poll \
                     interval, not by round trips"
                };
                let _ = writeln!(
                    s,
                    "- `{}` handoff: {b:.1} ms = {:.1} round trips of {rtt:.2} ms; {why}.",
                    r.name,
                    b / rtt
                );
            }
            if let Some(Ok(l)) = &r.renewal {
                if r.name == "k8s" {
                    let _ = writeln!(
                        s,
                        "- `k8s` renewal: the Kubernetes API has no batch write; `renew_many` \
                         renews one Lease object per request, so one process holding N leases \
                         sends N requests per interval ({:.0} requests per interval for {} \
                         leases, counted one per lease through the one-by-one path). Measured \
                         with {} leases, not 10,000: the API server's per-client rate limits and \
                         the test API server's memory make N in the thousands impractical; shard \
                         leases across processes or use one Lease per group.",
                        l.round_trips_per_interval, l.leases, l.leases
                    );
                } else if l.round_trips_per_interval > 10.0 {
                    let _ = writeln!(
                        s,
                        "- `{}` renewal: {:.1} batches per interval, more than the supervisor's \
                         renewal grid should give (two waves per interval, one more per 5,000 \
                         leases in a wave; leases acquired over {:.1} s).",
                        r.name,
                        l.round_trips_per_interval,
                        l.acquire_spread.as_secs_f64(),
                    );
                }
                if let Some(req) = l.server_requests_per_interval
                    && req > 10.0
                    && r.name != "k8s"
                {
                    let _ = writeln!(
                        s,
                        "- `{}` renewal: the server counted {req:.1} requests per interval for \
                         {:.1} `renew_many` calls: the store sends more than one request per \
                         batch.",
                        r.name, l.round_trips_per_interval
                    );
                }
                if r.name == "etcd" {
                    let _ = writeln!(
                        s,
                        "- `etcd` renewal: one `renew_many` is one keepalive per distinct etcd \
                         lease (the bench's store shares one etcd lease per TTL, \
                         `LeaseSharing::PerTtl`) plus range reads of the batch's lock keys, 5,000 \
                         keys a page, over the span of the keys (the keys of the other wave lie \
                         in that span too), so {:.1} calls make {} server requests per interval.",
                        l.round_trips_per_interval,
                        l.server_requests_per_interval
                            .map_or("-".to_string(), |x| format!("{x:.1}"))
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            "- SQLite runs on temporary files on local disk with the store's defaults (WAL, \
             synchronous NORMAL), the library and the raw protocol each on a file of its own: \
             on one shared file the WAL's automatic checkpoints (one every 1,000 pages, run by \
             whichever commit crosses the mark) fall, in step with the alternation of the \
             samples, on one side's acquires more than on the other's and decide its p99."
        );
        let _ = writeln!(
            s,
            "- **RSS per lease** is the growth of this process's resident set while the leases \
             are acquired. Only the first backend of a run starts from a fresh heap: later \
             backends reuse memory the allocator kept from earlier ones and read low (down to \
             zero). For a backend's own figure run it alone: \
             `cargo run --release -p lease-bench -- --backends NAME --out /tmp/NAME.md`."
        );
        let _ = writeln!(
            s,
            "- **CPU** comes from `/proc/self/stat` in clock ticks (10 ms), so small figures are \
             coarse; it covers the whole process (the supervisor's renewal tasks and batcher, the \
             driver and the runtime)."
        );
        let _ = writeln!(
            s,
            "- **Takeover, estimate of expiry.** The store-side expiry is taken as the midpoint of \
             the holder's acquire round trip plus the TTL; the error of that estimate is at most \
             half a round trip, and a figure can be slightly negative when the store expires a \
             key a little early by the client's clock."
        );
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
            for (c, lib, raw, _) in &r.throughput {
                let raw = raw.as_ref().map_or("-".into(), |w| f(w, 0));
                let _ = writeln!(
                    s,
                    "  throughput {c} client(s): library {} ops/s, raw {raw} ops/s",
                    f(lib, 0)
                );
            }
            if let Ok(l) = &r.latency_lib {
                let raw = match &r.latency_raw {
                    Some(Ok(w)) => {
                        let n = r.latency_rounds;
                        format!(
                            "{:.3}/{:.3}",
                            best_quantile_ms(w, n, 0.5),
                            best_quantile_ms(w, n, 0.99)
                        )
                    }
                    _ => "-".into(),
                };
                let _ = writeln!(
                    s,
                    "  acquire p50/p99 ms: library {:.3}/{:.3}, raw {raw}",
                    best_quantile_ms(l, r.latency_rounds, 0.5),
                    best_quantile_ms(l, r.latency_rounds, 0.99)
                );
            }
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
            match &r.renewal {
                Some(Ok(l)) => {
                    let _ = writeln!(
                        s,
                        "  renewal: {} leases, {:.1} round trips/interval, {:.1} CPU ms/interval, {:.0} RSS bytes/lease",
                        l.leases,
                        l.round_trips_per_interval,
                        l.cpu_ms_per_interval,
                        l.rss_bytes_per_lease
                    );
                }
                Some(Err(e)) => {
                    let _ = writeln!(s, "  renewal: error: {}", one_line(e));
                }
                None => {}
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
