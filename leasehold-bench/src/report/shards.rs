//! Table 6: shard ownership at scale.

use std::fmt::Write as _;

use super::{Report, met, one_line};

impl Report {
    pub(super) fn shards_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 6. Shard ownership at scale\n");
        let _ = writeln!(
            s,
            "`leasehold-shard` with its default configuration (`ShardSetConfig::new(TTL)`: rebalance \
             every renewal interval, TTL/3; steals of up to an eighth of the fair share in \
             flight; 32 acquisitions of free shards in flight per worker). The workers run in \
             this process over one client of the store, each through a link of its own. They \
             join at once; *initial split* is the time until every shard is owned at exactly the \
             fair shares, with the acquire calls it took per shard (the floor is one). The steady \
             state is counted over two intervals, all workers together: `renew_many` calls (one \
             statement, script or batch where the store batches; Kubernetes sends one request per \
             lease inside it), `inspect_many` calls (one scan per worker and interval), and the \
             server's own request count where it keeps one (etcd `/metrics`, PostgreSQL's \
             transactions in `pg_stat_database`, Redis `INFO commandstats`, the kube-apiserver's \
             `apiserver_request_total` on Leases, LISTs and watches included). Then one more worker joins, and later the first worker dies (its \
             link is cut: no renewal, no release). *Moved / minimum* compares the shards whose \
             owner changed between the settled assignments before and after with the least that \
             must move (the joiner's share; the dead worker's shards); *grants* counts every \
             assignment in the phase. *Owned again* is the time from the death until every shard \
             has a live owner, against its bound (TTL + one interval; two where expiry \
             is observed locally, Kubernetes); times are polled every tenth of an interval, so \
             they are late by up to that. *Lost* counts leases that live workers lost during the \
             run (a renewal not confirmed in time). Every store runs in its default configuration: \
             on etcd the default (`LeaseSharing::ReservedPerTtl`) puts a shard set's keys, which \
             are reserved keys, on one etcd lease per store and TTL, so the workers here (one \
             process, one store) share one etcd lease; one keepalive per lease is measured at \
             10,000 leases in table 5.\n"
        );
        let _ = writeln!(
            s,
            "| backend | shards | workers | TTL | interval | initial split | acquires / shard | renew_many / interval | inspect_many / interval | server requests / interval | join: balanced after | join: moved / minimum (grants) | death: owned again after | bound | met? | death: balanced after | death: moved / minimum (grants) | lost |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in self.measured() {
            match &r.shards {
                None => {}
                Some(Ok(x)) => {
                    let observed = r.name == "k8s";
                    let bound = x.ttl + x.interval * if observed { 2 } else { 1 };
                    let ok = x.kill_owned <= bound + x.interval / 10;
                    let shards = f64::from(u32::try_from(x.shards.max(1)).unwrap_or(u32::MAX));
                    let acq = f64::from(u32::try_from(x.initial_acquires).unwrap_or(u32::MAX));
                    let _ = writeln!(
                        s,
                        "| {}{} | {} | {} | {:?} | {:.2} s | {:.1} s | {:.2} | {:.1} | {:.1} | {} | {:.1} s ({:.1} intervals) | {} / {} ({}) | {:.1} s | {:.1} s | {} | {:.1} s | {} / {} ({}) | {} |",
                        r.name,
                        r.shards_config
                            .map(|c| format!(" ({c})"))
                            .unwrap_or_default(),
                        x.shards,
                        x.workers,
                        x.ttl,
                        x.interval.as_secs_f64(),
                        x.initial.as_secs_f64(),
                        acq / shards,
                        x.renew_calls_per_interval,
                        x.scans_per_interval,
                        x.server_requests_per_interval
                            .map_or("-".into(), |v| format!("{v:.1}")),
                        x.join.balanced.as_secs_f64(),
                        x.join.balanced.as_secs_f64() / x.interval.as_secs_f64(),
                        x.join.moved,
                        x.join.minimum,
                        x.join.grants,
                        x.kill_owned.as_secs_f64(),
                        bound.as_secs_f64(),
                        met(Some(ok)),
                        x.kill.balanced.as_secs_f64(),
                        x.kill.moved,
                        x.kill.minimum,
                        x.kill.grants,
                        x.lost,
                    );
                }
                Some(Err(e)) => {
                    let _ = writeln!(
                        s,
                        "| {}{} | error: {} | | | | | | | | | | | | | | | | |",
                        r.name,
                        r.shards_config
                            .map(|c| format!(" ({c})"))
                            .unwrap_or_default(),
                        one_line(e)
                    );
                }
            }
        }
        s.push('\n');
        self.split_table(s);
    }

    /// The initial split against the hand-written minimal split ([`crate::split`]).
    fn split_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### The initial split against a minimal split\n\n\
             Before the run above, the same split is measured {} times on both sides, on sets of \
             their own, the two sides in alternating order. *Library*: the workers join (all at \
             once in the first run; in run r, spread evenly over r/4 of an interval, a whole \
             interval from the fourth on: *spread* is the last join's offset) and the split ends \
             when every worker's own assignment holds exactly its fair share (read from the \
             workers' watches in this process, no store reads). *Minimal*: worker i of n takes \
             the shards whose index is i modulo n with the store's `acquire_many` (its natural \
             batch: one statement, script per slot, transactions, bounded concurrency), starting \
             at the same offsets, and ends when every batch has answered: no membership, no \
             scan, no contest, the floor of a split over the store's API. Both sides' times \
             include the spread, and the library's include its deliberate wait of a quarter of \
             an interval between a join and the first take (so that workers started together \
             count each other); a worker that joins alone takes every free shard and hands them \
             over by steals as the others join. Both use the same \
             reserved shard keys. Times are median (least-greatest) over the runs; *ratio* is \
             the median of the runs' library / minimal ratios. *Acquires / shard* counts the \
             keys the library asked for (membership slots included); *calls / worker* counts the \
             library's `acquire` and `acquire_many` calls and the minimal side's \
             `acquire_many` calls, medians over the runs. *Server requests* are \
             counted by the server from before the first join to after the last grant (plus the \
             counter's delay: PostgreSQL's, during which the library's workers keep renewing \
             and scanning), medians, library / minimal. *Beliefs / violations*: every \
             library worker's beliefs during the split (each shard grant with its local \
             deadline, confirmed renewals, releases and losses, from the shard and lease hooks) \
             go through `leasehold-testkit`'s history checker when the split settles; the grants \
             checked and the violations found (two believers of one shard at once, a token that \
             went back or repeated), summed over the runs.\n",
            self.measured()
                .filter_map(|r| r.shards.as_ref()?.as_ref().ok())
                .filter_map(|x| x.splits.as_ref().ok().map(Vec::len))
                .max()
                .unwrap_or(0)
        );
        let _ = writeln!(
            s,
            "| backend | shards | workers | runs | spread | library split | minimal split | ratio | acquires / shard | calls / worker (library / minimal) | server requests (library / minimal) | beliefs / violations |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in self.measured() {
            let Some(Ok(x)) = &r.shards else { continue };
            match &x.splits {
                Ok(v) if !v.is_empty() => {
                    let row = split_row(x.shards, x.workers, v);
                    let _ = writeln!(s, "| {} | {row} |", r.name);
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = writeln!(
                        s,
                        "| {} | error: {} | | | | | | | | | | |",
                        r.name,
                        one_line(e)
                    );
                }
            }
        }
        s.push('\n');
    }
}

/// One row of the split table (without the backend's cell): medians and ranges over `runs`.
pub(crate) fn split_row(shards: usize, workers: usize, runs: &[crate::split::Split]) -> String {
    use crate::split::spread_of;
    let f = |n: u64| f64::from(u32::try_from(n).unwrap_or(u32::MAX));
    let secs = |xs: Vec<f64>| {
        spread_of(&xs).map_or("-".to_string(), |(m, lo, hi)| {
            format!("{m:.2} s ({lo:.2}-{hi:.2})")
        })
    };
    let median = |xs: Vec<f64>, digits: usize| {
        spread_of(&xs).map_or("-".to_string(), |(m, _, _)| format!("{m:.digits$}"))
    };
    let spread = spread_of(
        &runs
            .iter()
            .map(|x| x.spread.as_secs_f64())
            .collect::<Vec<_>>(),
    )
    .map_or("-".to_string(), |(_, lo, hi)| format!("{lo:.1}-{hi:.1} s"));
    let ratios: Vec<f64> = runs
        .iter()
        .map(|x| x.library.as_secs_f64() / x.minimal.as_secs_f64())
        .collect();
    let n = f(u64::try_from(shards.max(1)).unwrap_or(u64::MAX));
    let w = f(u64::try_from(workers.max(1)).unwrap_or(u64::MAX));
    let server = |pick: fn(&crate::split::Split) -> Option<u64>| {
        let xs: Vec<f64> = runs.iter().filter_map(|x| pick(x).map(f)).collect();
        median(xs, 0)
    };
    let beliefs: u64 = runs.iter().map(|x| x.beliefs).sum();
    let violations: u64 = runs.iter().map(|x| x.violations).sum();
    format!(
        "{shards} | {workers} | {} | {spread} | {} | {} | {} | {} | {} / {} | {} / {} | \
         {beliefs} / {violations}",
        runs.len(),
        secs(runs.iter().map(|x| x.library.as_secs_f64()).collect()),
        secs(runs.iter().map(|x| x.minimal.as_secs_f64()).collect()),
        median(ratios, 1),
        median(runs.iter().map(|x| f(x.library_acquires) / n).collect(), 2),
        median(runs.iter().map(|x| f(x.library_calls) / w).collect(), 1),
        median(runs.iter().map(|x| f(x.minimal_calls) / w).collect(), 1),
        server(|x| x.library_server),
        server(|x| x.minimal_server),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::split::Split;

    fn run(library_ms: u64, minimal_ms: u64, server: Option<(u64, u64)>) -> Split {
        Split {
            spread: Duration::from_millis(500),
            library: Duration::from_millis(library_ms),
            library_acquires: 105,
            library_calls: 30,
            library_server: server.map(|s| s.0),
            beliefs: 100,
            violations: 0,
            minimal: Duration::from_millis(minimal_ms),
            minimal_calls: 10,
            minimal_server: server.map(|s| s.1),
        }
    }

    #[test]
    fn a_split_row_reports_medians_ranges_and_the_median_ratio() {
        let runs = [
            run(2000, 1000, Some((300, 20))),
            run(1500, 500, Some((200, 10))),
            run(4000, 1000, None),
        ];
        assert_eq!(
            super::split_row(100, 10, &runs),
            "100 | 10 | 3 | 0.5-0.5 s | 2.00 s (1.50-4.00) | 1.00 s (0.50-1.00) | 3.0 | 1.05 | \
             3.0 / 1.0 | 250 / 15 | 300 / 0"
        );
        assert!(super::split_row(100, 10, &[run(1, 1, None)]).ends_with("| - / - | 100 / 0"));
    }
}
