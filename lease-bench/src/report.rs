//! The Markdown report and the stdout summary.

use std::fmt::Write as _;
use std::time::Duration;

use crate::measure::{RenewalLoad, quantile_ms};

type M<T> = Result<T, String>;

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
    pub(crate) throughput: Vec<(usize, M<f64>, Option<M<f64>>)>,
    pub(crate) latency_lib: M<Vec<Duration>>,
    pub(crate) latency_raw: Option<M<Vec<Duration>>>,
    pub(crate) takeover_ttl: Duration,
    pub(crate) takeover_watch: Vec<M<f64>>,
    pub(crate) takeover_poll: Vec<M<f64>>,
    pub(crate) handoff_watch: Vec<M<f64>>,
    pub(crate) handoff_poll: Vec<M<f64>>,
    /// The raw protocol's release then acquire, back to back.
    pub(crate) handoff_floor: Option<M<Vec<Duration>>>,
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
            takeover_ttl: Duration::ZERO,
            takeover_watch: Vec::new(),
            takeover_poll: Vec::new(),
            handoff_watch: Vec::new(),
            handoff_poll: Vec::new(),
            handoff_floor: None,
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
            "- the machine is shared: other builds, test suites and a soak run were active during \
             the run, so absolute figures are noisy; the library and raw runs of each row are \
             interleaved to share the same load\n"
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
            "One client on one key and 8 clients on 8 keys, each looping acquire then release; \
             the best of the rounds.\n"
        );
        let _ = writeln!(
            s,
            "| backend | clients | library (ops/s) | raw (ops/s) | ratio | goal | met? |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for r in self.measured() {
            for (clients, lib, raw) in &r.throughput {
                let (raw_s, ratio, ok) = match (lib, raw) {
                    (Ok(l), Some(Ok(w))) => {
                        let q = l / w;
                        (format!("{w:.0}"), format!("{q:.3}"), Some(q >= 0.95))
                    }
                    (_, Some(Err(e))) => (format!("error: {}", one_line(e)), "-".into(), None),
                    (_, None) => ("no raw client".into(), "-".into(), None),
                    (Err(_), Some(Ok(w))) => (format!("{w:.0}"), "-".into(), None),
                };
                let _ = writeln!(
                    s,
                    "| {} | {clients} | {} | {raw_s} | {ratio} | >= 0.95 | {} |",
                    r.name,
                    f(lib, 0),
                    met(ok)
                );
            }
        }
        s.push('\n');
    }

    fn latency_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 2. Acquire latency\n");
        let _ = writeln!(
            s,
            "One client, sequential acquires of a free key (the release after each is not timed).\n"
        );
        let _ = writeln!(
            s,
            "| backend | samples | library p50 (ms) | raw p50 (ms) | p50 ratio | library p99 (ms) | raw p99 (ms) | p99 ratio | goal | met? |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
        for r in self.measured() {
            let lib = r.latency_lib.as_ref();
            let raw = r.latency_raw.as_ref().map(|x| x.as_ref());
            let q = |v: Result<&Vec<Duration>, &String>, p: f64| -> M<f64> {
                v.map(|v| quantile_ms(v, p)).map_err(Clone::clone)
            };
            let (l50, l99) = (q(lib, 0.5), q(lib, 0.99));
            let samples = lib.map_or(0, Vec::len);
            let (w50, w99, r50, r99, ok) = match raw {
                Some(rv) => {
                    let (w50, w99) = (q(rv, 0.5), q(rv, 0.99));
                    let ratio = |a: &M<f64>, b: &M<f64>| match (a, b) {
                        (Ok(a), Ok(b)) => Some(a / b),
                        _ => None,
                    };
                    let (r50, r99) = (ratio(&l50, &w50), ratio(&l99, &w99));
                    let ok = match (r50, r99) {
                        (Some(a), Some(b)) => Some(a <= 1.1 && b <= 1.1),
                        _ => None,
                    };
                    (f(&w50, 3), f(&w99, 3), r50, r99, ok)
                }
                None => (
                    "no raw client".into(),
                    "no raw client".into(),
                    None,
                    None,
                    None,
                ),
            };
            let fr = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
            let _ = writeln!(
                s,
                "| {} | {samples} | {} | {w50} | {} | {} | {w99} | {} | <= 1.1x | {} |",
                r.name,
                f(&l50, 3),
                fr(r50),
                f(&l99, 3),
                fr(r99),
                met(ok)
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
             the store expires keys itself and reports it: a key on a lease of the same TTL, \
             watched, from its nominal expiry to its deletion event. *Acquire p50* (from table 2) \
             is the other part of the floor: after the expiry the waiter still has to acquire.\n"
        );
        let _ = writeln!(
            s,
            "| backend | TTL | RTT (ms) | store expiry delay, raw (ms) | acquire p50 (ms) | watch (ms) | polling (ms) | goal (watch) | met? |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
        for r in self.measured() {
            let rtt = r.rtt_ms.as_ref().ok().copied();
            let acquire_p50 = r.latency_lib.as_ref().ok().map(|l| quantile_ms(l, 0.5));
            let floor = (!r.expiry_floor.is_empty()).then(|| median(&r.expiry_floor));
            let (goal, verdict) = match (r.watch, rtt, median(&r.takeover_watch)) {
                (true, Some(rtt), Ok(m)) => {
                    let g = rtt + 20.0;
                    // The floor: the store's own expiry delay (where measured) plus one acquire.
                    let store_delay = match &floor {
                        Some(Ok(fl)) => Some(*fl),
                        Some(Err(_)) => None,
                        None => Some(0.0),
                    };
                    let verdict = if m <= g {
                        "yes".to_string()
                    } else {
                        match (store_delay, acquire_p50) {
                            (Some(d), Some(a)) if m <= d + a + g => format!(
                                "**no**, floor-bound: floor {:.1} ms (store expiry delay {d:.1} + \
                                 acquire p50 {a:.1}); {:.1} ms above it",
                                d + a,
                                m - d - a
                            ),
                            _ => met(Some(false)).to_string(),
                        }
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
                acquire_p50.map_or("-".into(), |x| format!("{x:.2}")),
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
             applies to the best wake-up the backend offers (watch where it has one). *Raw \
             release+acquire* is the protocol's own floor, measured in the same run: the raw \
             release and the next owner's raw acquire issued back to back on one task, as a \
             waiter woken by a perfect, free notification would; *over the floor* is what the \
             notification and the library add to it.\n"
        );
        let _ = writeln!(
            s,
            "| backend | RTT (ms) | raw release+acquire (ms) | floor in RTTs | watch (ms) | polling (ms) | best in RTTs | over the floor (ms) | goal | met? |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
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
            let rtt = r.rtt_ms.as_ref().ok().copied().filter(|x| *x > 0.0);
            let floor_ok = floor.as_ref().and_then(|f| f.as_ref().ok()).copied();
            let (in_rtt, verdict) = match (&best, rtt) {
                (Ok(b), Some(rtt)) => {
                    let n = b / rtt;
                    let verdict = if n <= 3.0 {
                        "yes".to_string()
                    } else {
                        match floor_ok {
                            Some(fl) if fl / rtt > 3.0 && b - fl <= rtt => format!(
                                "**no**: the raw floor alone is {:.1} RTT; +{:.1} RTT over it",
                                fl / rtt,
                                (b - fl) / rtt
                            ),
                            Some(fl) if fl / rtt > 3.0 => format!(
                                "**no**: the raw floor alone is {:.1} RTT; +{:.1} RTT over it",
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
            let over = match (&best, floor_ok) {
                (Ok(b), Some(fl)) => format!("{:.2}", b - fl),
                _ => "-".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {in_rtt} | {over} | <= 3 RTT | {verdict} |",
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
             (`with_renewal_batching(interval / 20)`), renewing every TTL/3. Round trips are \
             `renew_many` calls counted by `lease_testkit::faulty::FaultyStore` (one call is one \
             statement, script or batch), averaged over the measured intervals after one warm-up \
             interval (a renewal wave that straddles the end of the measured span is counted \
             or not, so the figure is exact to about one wave). Kubernetes has no batch write: its \
             figure counts one request per lease. *Server requests* are counted by the server \
             itself over the same span, where it keeps such a counter (etcd: every gRPC message \
             received, keepalives included, from its `/metrics`; Redis: \
             `total_commands_processed`); where present, the goal is judged on them. CPU is this \
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
            for (clients, lib, raw) in &r.throughput {
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
                let (l50, w50) = (quantile_ms(lib, 0.5), quantile_ms(raw, 0.5));
                let (l99, w99) = (quantile_ms(lib, 0.99), quantile_ms(raw, 0.99));
                if l50 / w50 > 1.1 || l99 / w99 > 1.1 {
                    let _ = writeln!(
                        s,
                        "- `{}` latency: library p50 {l50:.3} ms / p99 {l99:.3} ms against the raw \
                         protocol's floor of p50 {w50:.3} ms / p99 {w99:.3} ms; a p99 over a few \
                         hundred samples on a shared 2-core machine is dominated by scheduling \
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
                     watch event travels to the waiter and wakes it"
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
                        "- `{}` renewal: {:.1} batches per interval. The supervisor's batches stay \
                         aligned with the acquisitions: leases acquired over {:.1} s fall into \
                         about acquire time / window = {:.0} windows, and each window is one batch.",
                        r.name,
                        l.round_trips_per_interval,
                        l.acquire_spread.as_secs_f64(),
                        l.acquire_spread.as_secs_f64() / l.window.as_secs_f64().max(1e-9)
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
            }
        }
        let _ = writeln!(
            s,
            "- SQLite runs on a temporary file on local disk with the store's defaults \
             (WAL, synchronous NORMAL)."
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
            for (c, lib, raw) in &r.throughput {
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
                        format!("{:.3}/{:.3}", quantile_ms(w, 0.5), quantile_ms(w, 0.99))
                    }
                    _ => "-".into(),
                };
                let _ = writeln!(
                    s,
                    "  acquire p50/p99 ms: library {:.3}/{:.3}, raw {raw}",
                    quantile_ms(l, 0.5),
                    quantile_ms(l, 0.99)
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
