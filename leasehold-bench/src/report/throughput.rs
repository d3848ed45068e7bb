//! Table 1: acquire+release throughput of every side, against the minimal floor.

use std::fmt::Write as _;

use super::{Report, f, iv};
use crate::measure::{AA, LIB, MIN, OTEL, RAW, SUP};
use crate::stats::Outcome;

impl Report {
    pub(super) fn throughput_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 1. Acquire+release throughput\n");
        let _ = writeln!(
            s,
            "One client on one key and 8 clients on 8 keys per side, each looping acquire then \
             release. All sides are measured together, for {:.0} s after a warm-up in each of \
             {} processes (the benchmark runs itself again for each, with connections of its \
             own): all clients switch side every {} ms, each on keys of its own, in an order \
             that changes every round (the rows of a balanced Latin square, so that no side \
             always follows the same one), and time every pair they do; a side's rate is the sum \
             over the clients of the pairs done on that side over the time spent on it (the \
             mean over the processes). Slow drifts of the shared machine so fall on all sides \
             alike. Every ratio is the geometric mean of the per-round ratios of the two sides \
             (each round gives every side one block), pooled over the processes, with its {:.0}% \
             bootstrap interval in brackets (processes drawn with replacement, then the rounds \
             of each: the rounds of one process share its luck). The goal is judged on *library \
             / minimal*: **met** when the interval's lower bound clears 0.95, **missed** when \
             its upper bound falls short, *inconclusive* otherwise. *Wrapper overhead* is the \
             library over its own protocol issued directly (what the Rust wrapper costs, not the \
             protocol). *Minimal A/A* is the minimal side measured twice, as two sides of the \
             same rounds: its interval around 1 is the run's own noise. A row named with a \
             configuration (`etcd (LeaseSharing::PerTtl)`) is the library's store in that \
             configuration, measured in the same rounds. Where table 1c lists ablations, they \
             run in the same rounds as further sides, and the run is longer in proportion so \
             that every side keeps {:.1} s per process.\n",
            self.throughput_for.as_secs_f64(),
            self.repeats,
            self.throughput_block.as_millis(),
            crate::stats::LEVEL * 100.0,
            self.throughput_for.as_secs_f64() / crate::measure::SIDES.len() as f64,
        );
        let _ = writeln!(
            s,
            "| backend | clients | library (ops/s) | supervisor (ops/s) | leasehold-otel store (ops/s) | same protocol (ops/s) | minimal (ops/s) | library / minimal | supervisor / minimal | wrapper overhead (library / same protocol) | minimal A/A | processes, rounds | goal | met? |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in self.measured() {
            for row in &r.throughput {
                let verdict = |lib: usize| {
                    row.ratio(lib, MIN)
                        .map_or("n/a", |q| Outcome::at_least(&q, 0.95).word())
                };
                let (processes, rounds) = row.extent();
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {processes}, {rounds} | >= 0.95 | {} |",
                    r.name,
                    row.clients,
                    f(&row.rate(LIB), 0),
                    f(&row.rate(SUP), 0),
                    f(&row.rate(OTEL), 0),
                    f(&row.rate(RAW), 0),
                    f(&row.rate(MIN), 0),
                    iv(row.ratio(LIB, MIN), 3),
                    iv(row.ratio(SUP, MIN), 3),
                    iv(row.ratio(LIB, RAW), 3),
                    iv(row.ratio(AA, MIN), 3),
                    verdict(LIB),
                );
                for (i, config) in row.config_sides() {
                    let _ = writeln!(
                        s,
                        "| {} ({config}) | {} | {} | - | - | - | {} | {} | - | - | {} | {processes}, {rounds} | >= 0.95 | {} |",
                        r.name,
                        row.clients,
                        f(&row.rate(i), 0),
                        f(&row.rate(MIN), 0),
                        iv(row.ratio(i, MIN), 3),
                        iv(row.ratio(AA, MIN), 3),
                        verdict(i),
                    );
                }
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
             issued directly, and the library. Each is over the minimal in the same rounds \
             (the geometric mean of the per-round ratios, with its bootstrap interval as in \
             table 1). The ablations are described in *Notes*.\n"
        );
        let _ = writeln!(s, "| backend | clients | side | ops/s | over minimal |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        for r in self.measured() {
            for row in r.throughput.iter().filter(|row| !row.ablations.is_empty()) {
                let steps = std::iter::once((MIN, "minimal"))
                    .chain(row.ablation_sides())
                    .chain([(RAW, "same protocol"), (LIB, "library")]);
                for (i, label) in steps {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {label} | {} | {} |",
                        r.name,
                        row.clients,
                        f(&row.rate(i), 0),
                        if i == MIN {
                            "1".to_string()
                        } else {
                            iv(row.ratio(i, MIN), 3)
                        }
                    );
                }
            }
        }
        s.push('\n');
    }
}
