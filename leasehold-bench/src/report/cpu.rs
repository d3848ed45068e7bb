//! Table 1b: wall time and CPU per acquire+release pair, client and server, per side: where a
//! throughput gap goes, and what each of the library's guarantees costs the server.

use std::fmt::Write as _;

use super::{Report, one_line};
use crate::measure::{LIB, MIN, PairCost, RAW};

impl Report {
    pub(super) fn cpu_table(&self, s: &mut String) {
        if self.measured().all(|r| r.cpu.is_empty()) {
            return;
        }
        let _ = writeln!(s, "## 1b. Where an acquire+release pair's time goes\n");
        let _ = writeln!(
            s,
            "One client, one key per side, each side in turn for blocks of {} ms ({} rounds, \
             in an order that changes every round as in table 1). Around each block the bench reads the CPU time of every \
             thread of its own process (*client CPU*) and of the server's processes on this \
             machine (*server CPU*; the processes are named below), from \
             `/proc/<pid>/task/*/schedstat` in nanoseconds. Figures are per pair, in \
             microseconds: for each side the median over its blocks, so that a block that met \
             a periodic process of the server (a checkpoint, a snapshot) does not decide the \
             figure. The server's idle work during a block (Raft heartbeats, Redis's \
             `serverCron`) is counted too, at the same rate per second on every side. Rows \
             after *minimal* are the minimal lease with one of the library's guarantees added \
             (not floors: they price that guarantee). Where the same protocol's server CPU \
             exceeds the minimal's, the difference is what the library's extra guarantees cost \
             the server per pair; a wall-time difference larger than both CPU differences \
             together is spent waiting (wake-ups, scheduling, the network stack's latency).\n",
            self.cpu_block.as_millis(),
            self.cpu_rounds
        );
        let _ = writeln!(
            s,
            "| backend | side | wall µs / pair | client CPU µs / pair | server CPU µs / pair |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|");
        for r in self.measured() {
            for (label, cost) in &r.cpu {
                match cost {
                    Ok(c) => {
                        let _ = writeln!(
                            s,
                            "| {} | {label} | {:.1} | {:.1} | {} |",
                            r.name,
                            c.wall_us,
                            c.client_us,
                            c.server_us
                                .map_or_else(|| "in process".to_string(), |x| format!("{x:.1}"))
                        );
                    }
                    Err(e) => {
                        let _ =
                            writeln!(s, "| {} | {label} | error: {} | | |", r.name, one_line(e));
                    }
                }
            }
        }
        s.push('\n');
        for r in self.measured() {
            let Some(text) = cpu_summary(&r.cpu) else {
                continue;
            };
            let _ = writeln!(
                s,
                "- `{}`{}: {text}",
                r.name,
                r.cpu_server
                    .as_ref()
                    .map_or_else(String::new, |p| format!(" (server: {p})"))
            );
        }
        s.push('\n');
    }
}

/// The per-backend sentence under the table: the same protocol over the minimal, the library
/// over the same protocol, and each ablation over the minimal, in wall time and CPU.
fn cpu_summary(cpu: &[(&'static str, super::M<PairCost>)]) -> Option<String> {
    let get = |i: usize| cpu.get(i).and_then(|(_, c)| c.as_ref().ok()).copied();
    let (lib, raw, min) = (get(LIB)?, get(RAW)?, get(MIN)?);
    let server = |a: &PairCost, b: &PairCost| match (a.server_us, b.server_us) {
        (Some(x), Some(y)) => format!(", server CPU {:+.1}", x - y),
        _ => String::new(),
    };
    let mut out = format!(
        "same protocol over minimal: wall {:+.1} µs, client CPU {:+.1}{}; library over same \
         protocol: wall {:+.1} µs, client CPU {:+.1}{}",
        raw.wall_us - min.wall_us,
        raw.client_us - min.client_us,
        server(&raw, &min),
        lib.wall_us - raw.wall_us,
        lib.client_us - raw.client_us,
        server(&lib, &raw),
    );
    for (label, cost) in cpu.iter().skip(MIN + 1) {
        if let Ok(c) = cost {
            let _ = write!(
                out,
                "; {label} over minimal: wall {:+.1} µs{}",
                c.wall_us - min.wall_us,
                server(c, &min)
            );
        }
    }
    Some(out)
}
