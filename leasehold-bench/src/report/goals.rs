//! The goal-by-backend table: every goal judged against the minimal floor, from this run's
//! measurements only.

use std::fmt::Write as _;

use super::latency::side_quantile;
use super::{BackendRun, Report, median};
use crate::measure::{LIB, MIN};
use crate::stats::{Interval, Outcome};

/// The verdict of several intervals on one goal (every client count): missed if any is missed,
/// met if all are met, inconclusive otherwise.
fn combine(outcomes: impl IntoIterator<Item = Outcome>) -> Outcome {
    let all: Vec<Outcome> = outcomes.into_iter().collect();
    if all.contains(&Outcome::Missed) {
        Outcome::Missed
    } else if all.iter().all(|o| *o == Outcome::Met) {
        Outcome::Met
    } else {
        Outcome::Inconclusive
    }
}

/// The median of repeated measurements with its bootstrap interval; an error if any failed.
fn median_of(v: &[super::M<f64>], seed: u64) -> Result<Interval, String> {
    median(v)?;
    let ok: Vec<f64> = v.iter().filter_map(|x| x.as_ref().ok().copied()).collect();
    crate::stats::median_interval(&ok, seed).ok_or_else(|| "no samples".into())
}

/// `iv` with every figure multiplied by `k` (> 0).
fn scaled(iv: &Interval, k: f64) -> Interval {
    Interval {
        est: iv.est * k,
        lo: iv.lo * k,
        hi: iv.hi * k,
        ..*iv
    }
}

/// The paired bootstrap interval of the `q` quantile of side `a`'s latencies over side `b`'s:
/// sample `i` of each side was taken in round `i`.
pub(super) fn latency_ratio(r: &BackendRun, a: usize, b: usize, q: f64) -> Option<Interval> {
    let ms = |i: usize| -> Option<Vec<f64>> {
        match r.latency.get(i) {
            Some(Ok(v)) => Some(v.iter().map(|d| d.as_secs_f64() * 1000.0).collect()),
            _ => None,
        }
    };
    let seed = (a as u64) << 16 | b as u64;
    crate::stats::quantile_ratio_interval(&ms(a)?, &ms(b)?, q, seed)
}

/// One goal's verdict on one backend: met, missed or inconclusive (`Some`), or not judged
/// (`None`, with the reason in `detail`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Verdict {
    pub(super) met: Option<Outcome>,
    pub(super) detail: String,
}

impl Verdict {
    fn with_interval(outcome: Outcome, detail: String) -> Self {
        Verdict {
            met: Some(outcome),
            detail,
        }
    }
    fn not_judged(why: &str) -> Self {
        Verdict {
            met: None,
            detail: why.into(),
        }
    }
    fn cell(&self) -> String {
        match self.met {
            Some(o) => format!("{} ({})", o.word(), self.detail),
            None => format!("n/a ({})", self.detail),
        }
    }
}

/// The goals, in column order.
pub(super) const GOALS: [&str; 4] = [
    "acquire+release >= 0.95x minimal",
    "p99 <= 1.1x minimal",
    "handoff <= 3 RTT",
    "takeover <= TTL + 1 RTT + 20 ms",
];

/// Judges the four goals of [`GOALS`] on one backend's measurements.
pub(super) fn judge(r: &BackendRun) -> [Verdict; 4] {
    let rtt = r.rtt_ms.as_ref().ok().copied().filter(|x| *x > 0.0);

    // Throughput: library / minimal at every client count, each with its interval.
    let mut ratios = Vec::new();
    let mut throughput = None;
    for row in &r.throughput {
        match row.ratio(LIB, MIN) {
            Some(q) => ratios.push((row.clients, q)),
            None => throughput = Some(Verdict::not_judged("a side failed")),
        }
    }
    let throughput = throughput.unwrap_or_else(|| {
        if ratios.is_empty() {
            return Verdict::not_judged("not measured");
        }
        let detail = ratios
            .iter()
            .map(|(c, q)| format!("{c} cl. {}", q.show(2)))
            .collect::<Vec<_>>()
            .join(", ");
        Verdict::with_interval(
            combine(ratios.iter().map(|(_, q)| Outcome::at_least(q, 0.95))),
            detail,
        )
    });

    // p99: library over minimal, with the interval of the rounds' paired samples.
    let p99 = match (
        latency_ratio(r, LIB, MIN, 0.99),
        side_quantile(&r.latency, LIB, 0.99),
        side_quantile(&r.latency, MIN, 0.99),
    ) {
        (Some(q), Ok(l), Ok(m)) => Verdict::with_interval(
            Outcome::at_most(&q, 1.1),
            format!("{}x: {l:.2} / {m:.2} ms", q.show(2)),
        ),
        _ => Verdict::not_judged("a side failed"),
    };

    // Handoff: the best wake-up the backend offers, in round trips of this run; the median
    // with the bootstrap interval of the repetitions.
    let best = if r.watch {
        &r.handoff_watch
    } else {
        &r.handoff_poll
    };
    let min_floor = super::handoff::floor_median(&r.handoff_floor_minimal).and_then(Result::ok);
    let handoff = match (median_of(best, 1), rtt) {
        (Ok(b), Some(rtt)) => {
            let q = scaled(&b, 1.0 / rtt);
            let outcome = Outcome::at_most(&q, 3.0);
            Verdict::with_interval(
                outcome,
                match min_floor.filter(|mf| outcome != Outcome::Met && mf / rtt > 3.0) {
                    Some(mf) => format!(
                        "{} RTT: {:.1} ms, RTT {rtt:.2} ms; floor-bound: the minimal release+acquire back to back alone is {:.1} RTT",
                        q.show(1),
                        b.est,
                        mf / rtt
                    ),
                    None => format!("{} RTT: {:.1} ms, RTT {rtt:.2} ms", q.show(1), b.est),
                },
            )
        }
        (Err(e), _) => Verdict::not_judged(&e),
        (_, None) => Verdict::not_judged("no RTT"),
    };

    // Takeover: milliseconds after the TTL (the figure is measured from the estimated expiry),
    // from a SIGKILLed holder process where measured; the median with its interval.
    let after = if !r.takeover_killed.is_empty() {
        &r.takeover_killed
    } else if r.watch {
        &r.takeover_watch
    } else {
        &r.takeover_poll
    };
    let takeover = match (median_of(after, 2), rtt) {
        (Ok(t), Some(rtt)) => Verdict::with_interval(
            Outcome::at_most(&t, rtt + 20.0),
            format!("TTL + {} ms, bound TTL + {:.1} ms", t.show(1), rtt + 20.0),
        ),
        (Err(e), _) => Verdict::not_judged(&e),
        (_, None) => Verdict::not_judged("no RTT"),
    };
    [throughput, p99, handoff, takeover]
}

impl Report {
    pub(super) fn goals_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 0. Goals against the minimal floor\n");
        let _ = writeln!(
            s,
            "Computed by the benchmark from the measurements below, in this run. Throughput and \
             p99 compare the library's bare store with the minimal hand-written lease (tables 1 \
             and 2, all client counts); handoff is the supervisor's graceful handoff with the \
             best wake-up the backend offers (table 4) in round trips of this run's ping; \
             takeover is the supervisor's grant after the holder's process is killed with SIGKILL, \
             in milliseconds after the TTL (table 3, *killed process*). A ratio goal is **met** \
             when its {:.0}% bootstrap interval (in brackets) lies wholly on the goal's side, \
             **missed** when it lies wholly on the other, *inconclusive* when it straddles the \
             goal; handoff and takeover are judged the same way on the interval of their median \
             (the repetitions drawn with replacement). A missed goal is explained \
             under *Notes*.\n",
            crate::stats::LEVEL * 100.0
        );
        let _ = writeln!(s, "| backend | {} |", GOALS.join(" | "));
        let _ = writeln!(s, "|---|---|---|---|---|");
        for r in self.measured() {
            let cells: Vec<String> = judge(r).iter().map(Verdict::cell).collect();
            let _ = writeln!(s, "| {} | {} |", r.name, cells.join(" | "));
        }
        s.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::report::ThroughputRow;

    /// A throughput row whose library side runs at `ratios[p][r]` of the minimal's 100 ops/s in
    /// round `r` of process `p` (every other side at 100).
    pub(crate) fn row(clients: usize, ratios: &[Vec<f64>]) -> ThroughputRow {
        let n = crate::measure::SIDES.len();
        let rounds: Vec<Vec<Vec<Option<f64>>>> = ratios
            .iter()
            .map(|p| {
                p.iter()
                    .map(|q| {
                        let mut v = vec![Some(100.0); n];
                        v[LIB] = Some(100.0 * q);
                        v
                    })
                    .collect()
            })
            .collect();
        ThroughputRow {
            clients,
            rates: vec![Ok(100.0); n],
            rounds,
            ablations: Vec::new(),
            configs: Vec::new(),
        }
    }

    fn run() -> BackendRun {
        let mut r = BackendRun::new("test");
        r.watch = true;
        r.rtt_ms = Ok(1.0);
        r.throughput = vec![
            row(1, &[vec![0.96, 0.97, 0.98], vec![0.97, 0.99, 0.96]]),
            row(8, &[vec![0.90, 0.91, 0.89], vec![0.90, 0.92, 0.90]]),
        ];
        let ms = |x: u64| vec![Duration::from_millis(x); 100];
        r.latency = vec![Ok(ms(2)); crate::measure::SIDES.len()];
        r.latency[LIB] = Ok(ms(2));
        r.latency[MIN] = Ok(ms(2));
        r.handoff_watch = [2.5, 2.9, 2.6, 2.8, 2.7, 2.9, 2.5, 9.0]
            .into_iter()
            .map(Ok)
            .collect();
        r.takeover_watch = vec![Ok(5.0)];
        r.takeover_killed = vec![Ok(30.0)];
        r
    }

    #[test]
    fn every_goal_is_judged_against_the_minimal_floor_and_this_runs_rtt() {
        let [t, p, h, k] = judge(&run());
        // 8 clients at about 0.90 misses even though 1 client at about 0.97 meets.
        assert_eq!(t.met, Some(Outcome::Missed), "{t:?}");
        assert_eq!(p.met, Some(Outcome::Met), "{p:?}");
        // The median handoff 2.8 ms is 2.8 RTT, its interval under 3 (one slow repetition).
        assert_eq!(h.met, Some(Outcome::Met), "{h:?}");
        // The killed process decides: 30 ms after the TTL against a bound of 1 + 20 ms.
        assert_eq!(k.met, Some(Outcome::Missed), "{k:?}");
    }

    #[test]
    fn a_handoff_missed_because_the_minimal_floor_exceeds_the_goal_says_so() {
        let mut r = run();
        r.handoff_watch = vec![Ok(6.0)];
        // The minimal protocol's release+acquire alone takes 4 RTT of the 1 ms ping.
        r.handoff_floor_minimal = Some(Ok(vec![Duration::from_millis(4); 3]));
        let [_, _, h, _] = judge(&r);
        assert_eq!(h.met, Some(Outcome::Missed), "{h:?}");
        assert!(h.detail.contains("floor-bound"), "{h:?}");
        assert!(h.detail.contains("4.0 RTT"), "{h:?}");
        // A floor under the goal explains nothing: a plain miss.
        r.handoff_floor_minimal = Some(Ok(vec![Duration::from_millis(2); 3]));
        let [_, _, h, _] = judge(&r);
        assert_eq!(h.met, Some(Outcome::Missed), "{h:?}");
        assert!(!h.detail.contains("floor-bound"), "{h:?}");
    }

    /// A ratio whose interval straddles the goal is neither met nor missed: one process at
    /// 0.99 and one at 0.91 (a spread five full reports showed) cannot decide 0.95.
    #[test]
    fn a_straddling_interval_is_inconclusive() {
        let mut r = run();
        r.throughput = vec![row(
            1,
            &[vec![0.99, 0.985, 0.995], vec![0.91, 0.905, 0.915]],
        )];
        let [t, ..] = judge(&r);
        assert_eq!(t.met, Some(Outcome::Inconclusive), "{t:?}");
        assert!(
            t.cell().starts_with("inconclusive (1 cl. 0.95 ["),
            "{}",
            t.cell()
        );
        // A slower library p99 in every round is missed against 1.1x.
        r.latency[LIB] = Ok(vec![Duration::from_millis(3); 100]);
        let [_, p, ..] = judge(&r);
        assert_eq!(p.met, Some(Outcome::Missed), "{p:?}");
    }

    #[test]
    fn a_failed_side_is_not_judged() {
        let mut r = run();
        r.latency[MIN] = Err("boom".into());
        r.rtt_ms = Err("no ping".into());
        let [_, p, h, _] = judge(&r);
        assert_eq!(p.met, None);
        assert_eq!(h.met, None);
    }
}
