//! Table 4: graceful handoff.

use std::fmt::Write as _;

use super::{Report, cell, f, median, met};
use crate::measure::quantile_ms;

impl Report {
    pub(super) fn handoff_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 4. Graceful handoff\n");
        let _ = writeln!(
            s,
            "A supervisor waits for a held key; the holder releases. Figure: milliseconds from the \
             start of the release call to the waiter's grant; median (max in brackets). The goal \
             applies to the best wake-up the backend offers (watch where it has one), in round \
             trips of this run's ping. Three floors are measured in the same run. *Minimal \
             release+acquire*: the minimal hand-written protocol's release and the next owner's \
             acquire, issued back to back on one task with no notification at all: no handoff \
             on this store can be faster, so where it alone exceeds 3 RTT the goal is \
             floor-bound (a write costs more than the ping: a WAL flush, a Raft commit). \
             *Raw release+acquire*: the same with the library's own protocol (the raw \
             release and the next owner's raw acquire issued back to back on one task, as a \
             waiter woken by a perfect, free notification would. *Raw, woken by the store*: a \
             raw waiter subscribed through the store's own notification (PostgreSQL `LISTEN`, \
             the Redis release channel, an etcd watch, a Kubernetes watch, SQLite's in-process \
             wake) tries a raw acquire on each hint, from the start of the raw release to its \
             grant; *library over it* is what the library adds to that.\n"
        );
        let _ = writeln!(
            s,
            "| backend | RTT (ms) | minimal release+acquire (ms) | in RTTs | raw release+acquire (ms) | in RTTs | raw, woken by the store (ms) | watch (ms) | polling (ms) | best in RTTs | library over the minimal floor (ms) | library over the raw woken (ms) | goal | met? |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in self.measured() {
            let best = if r.watch {
                median(&r.handoff_watch)
            } else {
                median(&r.handoff_poll)
            };
            let floor = floor_median(&r.handoff_floor);
            let min_floor = floor_median(&r.handoff_floor_minimal);
            let min_ok = min_floor.as_ref().and_then(|f| f.as_ref().ok()).copied();
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
                    } else if let Some(mf) = min_ok.filter(|mf| mf / rtt > 3.0) {
                        format!(
                            "**no**, floor-bound: the minimal protocol's release and acquire back \
                             to back, with no notification at all, take {mf:.2} ms = {:.1} RTT; \
                             the library's handoff is {:+.2} ms over that floor",
                            mf / rtt,
                            b - mf
                        )
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
            let over_min = match (&best, min_ok) {
                (Ok(b), Some(mf)) => format!("{:+.2}", b - mf),
                _ => "-".into(),
            };
            let in_rtts = |x: Option<f64>| match (x, rtt) {
                (Some(x), Some(rtt)) => format!("{:.1}", x / rtt),
                _ => "-".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {notified_cell} | {} | {} | {in_rtt} | {over_min} | {over} | <= 3 RTT | {verdict} |",
                r.name,
                f(&r.rtt_ms, 2),
                min_floor.as_ref().map_or("-".into(), |v| f(v, 2)),
                in_rtts(min_ok),
                floor.as_ref().map_or("-".into(), |v| f(v, 2)),
                in_rtts(floor_ok),
                cell(&r.handoff_watch, "no watch"),
                cell(&r.handoff_poll, "no watch"),
            );
        }
        s.push('\n');
    }
}

/// The median of a floor's samples, in milliseconds.
pub(super) fn floor_median(
    v: &Option<Result<Vec<std::time::Duration>, String>>,
) -> Option<Result<f64, String>> {
    match v {
        Some(Ok(v)) if !v.is_empty() => Some(Ok(quantile_ms(v, 0.5))),
        Some(Ok(_)) => Some(Err("no samples".to_string())),
        Some(Err(e)) => Some(Err(e.clone())),
        None => None,
    }
}
