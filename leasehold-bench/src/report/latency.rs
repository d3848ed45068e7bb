//! Table 2: acquire latency of every side, against the minimal floor.

use std::fmt::Write as _;
use std::time::Duration;

use super::{M, Report, f, met, within_noise};
use crate::measure::{LIB, MIN, OTEL, RAW, SUP, quantile_ms};

/// The `q` quantile of side `i`'s samples, in milliseconds.
pub(super) fn side_quantile(lat: &[M<Vec<Duration>>], i: usize, q: f64) -> M<f64> {
    match lat.get(i) {
        Some(Ok(v)) if !v.is_empty() => Ok(quantile_ms(v, q)),
        Some(Ok(_)) | None => Err("no samples".into()),
        Some(Err(e)) => Err(e.clone()),
    }
}

/// The A/A ratio of side `i` at quantile `q`: its samples of even index over those of odd index.
fn side_aa(lat: &[M<Vec<Duration>>], i: usize, q: f64) -> Option<f64> {
    match lat.get(i) {
        Some(Ok(v)) if v.len() >= 2 => {
            let a: Vec<Duration> = v.iter().step_by(2).copied().collect();
            let b: Vec<Duration> = v.iter().skip(1).step_by(2).copied().collect();
            Some(quantile_ms(&a, q) / quantile_ms(&b, q))
        }
        _ => None,
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
             *library / minimal*; *wrapper overhead* is the library's p99 over its own \
             protocol's. *Minimal A/A p99* compares the minimal side's samples of even index \
             with those of odd index: the run's own noise.\n"
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
            let r99 = ratio(&l99, &m99);
            let aa = side_aa(&r.latency, MIN, 0.99);
            let verdict = match r99 {
                Some(x) if x <= 1.1 => "yes".to_string(),
                Some(x) => within_noise(&[(x, aa, x - 1.1)]),
                None => met(None).to_string(),
            };
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
                fr(r99),
                both(SUP),
                both(OTEL),
                both(RAW),
                fr(ratio(&l99, &q(RAW, 0.99))),
                fr(aa),
            );
        }
        s.push('\n');
    }
}
