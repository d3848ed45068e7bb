//! Table 3: takeover after a holder dies.

use std::fmt::Write as _;

use super::{M, Report, cell, f, median, met};

impl Report {
    pub(super) fn takeover_table(&self, s: &mut String) {
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
             acquire add once the store has actually expired the key. *Killed process* is the \
             same figure with the holder in a process of its own (this binary re-executed), with \
             its own connections, killed with SIGKILL right after it reports its grant; the \
             waiter (watch where the store has one) is in this process.\n"
        );
        let _ = writeln!(
            s,
            "| backend | TTL | RTT (ms) | store expiry delay, raw (ms) | watch over the store's expiry (ms) | watch (ms) | polling (ms) | killed process (ms) | goal (watch) | met? |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
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
                "| {} | {:?} | {} | {} | {} | {} | {} | {} | {goal} | {verdict} |",
                r.name,
                r.takeover_ttl,
                f(&r.rtt_ms, 2),
                floor.map_or("-".into(), |_| cell(&r.expiry_floor, "-")),
                over.map_or("-".into(), |_| cell(&paired, "-")),
                cell(&r.takeover_watch, "no watch"),
                cell(&r.takeover_poll, "no watch"),
                cell(&r.takeover_killed, "not run"),
            );
        }
        s.push('\n');
    }
}
