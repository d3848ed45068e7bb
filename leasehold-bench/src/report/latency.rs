//! Table 2: acquire latency of every side, against the minimal floor.

use std::fmt::Write as _;
use std::time::Duration;

use super::goals::latency_ratio;
use super::{M, Report, f, iv};
use crate::measure::{AA, LIB, MIN, OTEL, RAW, SUP, quantile_ms};
use crate::stats::Outcome;

/// The `q` quantile of side `i`'s samples, in milliseconds.
pub(super) fn side_quantile(lat: &[M<Vec<Duration>>], i: usize, q: f64) -> M<f64> {
    match lat.get(i) {
        Some(Ok(v)) if !v.is_empty() => Ok(quantile_ms(v, q)),
        Some(Ok(_)) | None => Err("no samples".into()),
        Some(Err(e)) => Err(e.clone()),
    }
}

impl Report {
    pub(super) fn latency_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 2. Acquire latency\n");
        let _ = writeln!(
            s,
            "One client, sequential acquires of a free key (the release after each is not \
             timed); the sides take their samples in turn (one acquire of each side per round, \
             in an order that changes every round as in table 1), so that load on the machine falls on all alike. p50 and \
             p99 are taken over all samples of a side. The goal is judged on the p99 of \
             *library / minimal*, with its {:.0}% bootstrap interval in brackets (the rounds \
             drawn with replacement, each with its sample of both sides): **met** when the \
             upper bound is within 1.1, **missed** when the lower bound exceeds it, \
             *inconclusive* otherwise. *Wrapper overhead* is the library's p99 over its own \
             protocol's. *Minimal A/A p99* is the minimal side measured twice, as two sides of \
             the same rounds: its interval around 1 is the run's own noise.\n",
            crate::stats::LEVEL * 100.0
        );
        let _ = writeln!(
            s,
            "| backend | samples | library p50 (ms) | minimal p50 (ms) | p50 ratio | library p99 (ms) | minimal p99 (ms) | p99 ratio | supervisor p50 / p99 (ms) | leasehold-otel store p50 / p99 (ms) | same protocol p50 / p99 (ms) | wrapper overhead p99 | minimal A/A p99 | goal | met? |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in self.measured() {
            let q = |i: usize, p: f64| side_quantile(&r.latency, i, p);
            let ratio = |a: &M<f64>, b: &M<f64>| match (a, b) {
                (Ok(a), Ok(b)) if *b > 0.0 => Some(a / b),
                _ => None,
            };
            let fr = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
            let both = |i: usize| format!("{} / {}", f(&q(i, 0.5), 3), f(&q(i, 0.99), 3));
            let (l50, l99, m50, m99) = (q(LIB, 0.5), q(LIB, 0.99), q(MIN, 0.5), q(MIN, 0.99));
            let r99 = latency_ratio(r, LIB, MIN, 0.99);
            let aa = latency_ratio(r, AA, MIN, 0.99);
            let verdict = r99.map_or("n/a", |x| Outcome::at_most(&x, 1.1).word());
            let samples = match r.latency.get(LIB) {
                Some(Ok(v)) => v.len(),
                _ => 0,
            };
            let _ = writeln!(
                s,
                "| {} | {samples} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | <= 1.1x | {verdict} |",
                r.name,
                f(&l50, 3),
                f(&m50, 3),
                fr(ratio(&l50, &m50)),
                f(&l99, 3),
                f(&m99, 3),
                iv(r99, 2),
                both(SUP),
                both(OTEL),
                both(RAW),
                fr(ratio(&l99, &q(RAW, 0.99))),
                iv(aa, 2),
            );
        }
        s.push('\n');
    }
}
