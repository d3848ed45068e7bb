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
             switch side every {} ms, each on keys of its own, in an order that changes every \
             round (the rows of a balanced Latin square, so that no side always follows the \
             same one), and time every pair they do; a \
             side's rate is the sum over the clients of the pairs done on that side over the time \
             spent on it. Slow drifts of the shared machine so fall on all sides alike. The goal \
             is judged on *library / minimal*; *wrapper overhead* is the library over its own \
             protocol issued directly (what the Rust wrapper costs, not the protocol). *Minimal \
             A/A* is the run's own noise: the minimal side's blocks alternate between two halves, \
             A and B, and the column gives A's rate over B's; a ratio that misses the goal by \
             less than A/A's distance from 1 is within the noise. Where table 1c lists \
             ablations, they run in the same rounds as further sides, and the run is longer in \
             proportion so that every side keeps {:.1} s.\n",
            self.throughput_for.as_secs_f64(),
            self.throughput_block.as_millis(),
            self.throughput_for.as_secs_f64() / crate::measure::SIDES.len() as f64,
        );
        let _ = writeln!(
            s,
            "| backend | clients | library (ops/s) | supervisor (ops/s) | leasehold-otel store (ops/s) | same protocol (ops/s) | minimal (ops/s) | library / minimal | supervisor / minimal | wrapper overhead (library / same protocol) | minimal A/A | goal | met? |"
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

    /// Table 1c: the throughput of the minimal lease with one of the library's costs added at a
    /// time, then the library's protocol and the library, each over the minimal (same run).
    pub(super) fn throughput_steps_table(&self, s: &mut String) {
        if self
            .measured()
            .all(|r| r.throughput.iter().all(|row| row.ablations.is_empty()))
        {
            return;
        }
        let _ = writeln!(s, "## 1c. Where a throughput gap goes\n");
        let _ = writeln!(
            s,
            "Measured with table 1, in the same rounds: the minimal lease, the *ablations* (the \
             minimal lease with one of the library's costs added, or the library's acquire with \
             the minimal release: not floors, each prices a cost), the library's own protocol \
             issued directly, and the library. Each rate is over the \
             minimal's in the same run; a difference between two rows smaller than the minimal \
             A/A's distance from 1 (table 1) is within the noise. The ablations are described in \
             *Notes*.\n"
        );
        let _ = writeln!(s, "| backend | clients | side | ops/s | over minimal |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        for r in self.measured() {
            for row in r.throughput.iter().filter(|row| !row.ablations.is_empty()) {
                let min = row.rate(MIN);
                let steps = std::iter::once(("minimal", min.clone()))
                    .chain(row.ablation_rates())
                    .chain([("same protocol", row.rate(RAW)), ("library", row.rate(LIB))]);
                for (label, rate) in steps {
                    let over = match (&rate, &min) {
                        (Ok(a), Ok(b)) if *b > 0.0 => format!("{:.3}", a / b),
                        _ => "-".into(),
                    };
                    let _ = writeln!(
                        s,
                        "| {} | {} | {label} | {} | {over} |",
                        r.name,
                        row.clients,
                        f(&rate, 0)
                    );
                }
            }
        }
        s.push('\n');
    }
}
