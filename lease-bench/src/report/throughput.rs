//! Table 1: acquire+release throughput of every side, against the minimal floor.

use std::fmt::Write as _;

use super::{Report, f, met, within_noise};
use crate::measure::{LIB, MIN, OTEL, RAW, SUP};

impl Report {
    pub(super) fn throughput_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 1. Acquire+release throughput\n");
        let _ = writeln!(
            s,
            "One client on one key and 8 clients on 8 keys per side, each looping acquire then \
             release. All sides are measured together, for {:.0} s after a warm-up: all clients \
             switch side every {} ms (library, supervisor, lease-otel store, same protocol, \
             minimal, library, ...), each on keys of its own, and time every pair they do; a \
             side's rate is the sum over the clients of the pairs done on that side over the time \
             spent on it. Slow drifts of the shared machine so fall on all sides alike. The goal \
             is judged on *library / minimal*; *wrapper overhead* is the library over its own \
             protocol issued directly (what the Rust wrapper costs, not the protocol). *Minimal \
             A/A* is the run's own noise: the minimal side's blocks alternate between two halves, \
             A and B, and the column gives A's rate over B's; a ratio that misses the goal by \
             less than A/A's distance from 1 is within the noise.\n",
            self.throughput_for.as_secs_f64(),
            self.throughput_block.as_millis()
        );
        let _ = writeln!(
            s,
            "| backend | clients | library (ops/s) | supervisor (ops/s) | lease-otel store (ops/s) | same protocol (ops/s) | minimal (ops/s) | library / minimal | supervisor / minimal | wrapper overhead (library / same protocol) | minimal A/A | goal | met? |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in self.measured() {
            for row in &r.throughput {
                let ratio = |a: usize, b: usize| match (row.rate(a), row.rate(b)) {
                    (Ok(a), Ok(b)) if b > 0.0 => Some(a / b),
                    _ => None,
                };
                let fr = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.3}"));
                let q = ratio(LIB, MIN);
                let verdict = match q {
                    Some(q) if q >= 0.95 => "yes".to_string(),
                    Some(q) => within_noise(&[(q, row.aa(MIN), 0.95 - q)]),
                    None => met(None).to_string(),
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | >= 0.95 | {verdict} |",
                    r.name,
                    row.clients,
                    f(&row.rate(LIB), 0),
                    f(&row.rate(SUP), 0),
                    f(&row.rate(OTEL), 0),
                    f(&row.rate(RAW), 0),
                    f(&row.rate(MIN), 0),
                    fr(q),
                    fr(ratio(SUP, MIN)),
                    fr(ratio(LIB, RAW)),
                    fr(row.aa(MIN)),
                );
            }
        }
        s.push('\n');
    }
}
