//! Table 6: shard ownership at scale.

use std::fmt::Write as _;

use super::{Report, met, one_line};
use crate::stats::Outcome;

impl Report {
    pub(super) fn shards_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 6. Shard ownership at scale\n");
        let _ = writeln!(
            s,
            "`leasehold-shard` with its default configuration (`ShardSetConfig::new(TTL)`: rebalance \
             every renewal interval, TTL/3; steals of up to the whole fair share in flight, one \
             round; free shards taken in batches of up to 128 per store call, 32 calls in flight \
             per worker; a thief takes a handover with batched acquires of every shard it still awaits, \
             woken by the release of one of them). The workers run in \
             this process over one client of the store, each through a link of its own. They \
             join at once; *initial split* is the time until every shard is owned at exactly the \
             fair shares, with the acquire calls it took per shard (the floor is one). The steady \
             state is counted over two intervals, all workers together: `renew_many` calls (one \
             statement, script or batch where the store batches; Kubernetes sends one request per \
             lease inside it), scans (one per worker and interval: an `inspect_many` of the \
             membership slots and the worker's mailbox with a `holders_many` of the shards in \
             flight beside it, counted once), and the \
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
             run (a renewal not confirmed in time). Every store runs in its default configuration \
             but Kubernetes, which runs the grouped mode (`K8sLeaseStore::grouped`, 16 group \
             ConfigMaps and one membership Lease per worker: one Lease per shard would cost a \
             request per shard and interval), its server count covering Leases and ConfigMaps; \
             on etcd the default (`LeaseSharing::ReservedPerTtl`) puts a shard set's keys, which \
             are reserved keys, on one etcd lease per store and TTL, so the workers here (one \
             process, one store) share one etcd lease; one keepalive per lease is measured at \
             10,000 leases in table 5.\n"
        );
        let _ = writeln!(
            s,
            "| backend | shards | workers | TTL | interval | initial split | acquires / shard | renew_many / interval | scans / interval | server requests / interval | join: balanced after | join: moved / minimum (grants) | death: owned again after | bound | met? | death: balanced after | death: moved / minimum (grants) | lost |"
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
        self.shard_goals_table(s);
    }

    /// The fleet-scale goals of table 6, judged on this run's measurements.
    fn shard_goals_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### Goals at fleet scale\n\n\
             Each goal is judged on the measurements above. Where the split runs give several \
             figures, the goal is *met* when the greatest of them is within it, *missed* when \
             even the least is not, and *inconclusive* otherwise (least-greatest shown). \
             *Settle after the last join*: the library's split time less the spread (the last \
             join's offset), at most {SPLIT_GOAL:?} ({SPLIT_GOAL_K8S:?} on Kubernetes). \
             *Acquires / shard*: keys asked for per shard during the split, membership slots \
             included, at most {ACQUIRES_GOAL}. *Round trips / worker*: each worker's acquiring \
             round trips (its `acquire` and `acquire_many` calls, those in flight side by side \
             counted once; a steal's mailbox request and its waits are another owner's, counted \
             apart) and its scans during the split, at most {ROUND_TRIPS_GOAL}; a watch's \
             notifications are not counted. The figure after the last join counts only the \
             round trips made from the last join on: while joins are spread, the workers that \
             joined earlier rescan every eighth of an interval until two scans in a row see the \
             same members (for at most an interval), and those rescans are the rest. \
             *Owned again*: a dead \
             worker's shards all have a live owner within TTL + one interval (two where expiry \
             is observed locally: Kubernetes), from the single death of the run. *Requests / \
             interval*: the server's count for the whole set in the steady state, at most \
             {K8S_REQUESTS_GOAL} on Kubernetes (the other servers are not judged on it). *Two \
             believers*: the history checker over every worker's beliefs in every split run \
             found none.\n"
        );
        let _ = writeln!(
            s,
            "| backend | settle after the last join | acquires / shard | round trips / worker | owned again | requests / interval | two believers |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for r in self.measured() {
            match &r.shards {
                Some(Ok(x)) => {
                    let _ = writeln!(s, "| {} | {} |", r.name, shard_goals(r.name, x).join(" | "));
                }
                Some(Err(e)) => {
                    let _ = writeln!(s, "| {} | error: {} | | | | | |", r.name, one_line(e));
                }
                None => {}
            }
        }
        s.push('\n');
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
             include the spread, and the library's include its deliberate waits before the \
             first take: an eighth of an interval (at most a second) after a join, and an \
             eighth of an interval after each scan that saw members the scan before did not (a \
             worker takes on a membership two scans in a row agree on, deferring at most eight \
             times in a row), \
             so that workers joining over a rollout take each shard once on the final \
             membership rather than on an early one's larger shares. Both use the same \
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

/// The split's goal after the last join, and Kubernetes's.
const SPLIT_GOAL: std::time::Duration = std::time::Duration::from_secs(2);
const SPLIT_GOAL_K8S: std::time::Duration = std::time::Duration::from_secs(10);
/// Keys asked for per shard during the split.
const ACQUIRES_GOAL: f64 = 1.05;
/// Acquiring calls and scans per worker during the split.
const ROUND_TRIPS_GOAL: f64 = 5.0;
/// Kubernetes: the server's requests per interval for the whole set in the steady state.
const K8S_REQUESTS_GOAL: f64 = 100.0;

/// The verdict of figures `xs` on the goal `x <= goal`: met when the greatest is within it,
/// missed when even the least exceeds it, inconclusive otherwise; with the least and greatest.
fn range_at_most(xs: &[f64], goal: f64) -> Option<(Outcome, f64, f64)> {
    let (_, lo, hi) = crate::split::spread_of(xs)?;
    let outcome = if hi <= goal {
        Outcome::Met
    } else if lo > goal {
        Outcome::Missed
    } else {
        Outcome::Inconclusive
    };
    Some((outcome, lo, hi))
}

/// The goal cells of one backend's shard run: settle after the last join, acquires per shard,
/// round trips per worker, owned again after a death, requests per interval (Kubernetes), two
/// believers.
pub(crate) fn shard_goals(backend: &str, x: &crate::shards::ShardRun) -> Vec<String> {
    let k8s = backend == "k8s";
    let cell = |v: Option<(Outcome, f64, f64)>, digits: usize, unit: &str| match v {
        Some((o, lo, hi)) if (hi - lo).abs() < f64::EPSILON => {
            format!("{} ({lo:.digits$}{unit})", o.word())
        }
        Some((o, lo, hi)) => format!("{} ({lo:.digits$}-{hi:.digits$}{unit})", o.word()),
        None => "n/a (not measured)".to_string(),
    };
    let runs: &[crate::split::Split] = x.splits.as_deref().unwrap_or(&[]);
    let count = |n: usize| f64::from(u32::try_from(n.max(1)).unwrap_or(u32::MAX));
    let per = |n: u64, of: usize| f64::from(u32::try_from(n).unwrap_or(u32::MAX)) / count(of);
    let goal = if k8s { SPLIT_GOAL_K8S } else { SPLIT_GOAL };
    let settle: Vec<f64> = runs
        .iter()
        .map(|r| r.library.saturating_sub(r.spread).as_secs_f64())
        .collect();
    let acquires: Vec<f64> = runs
        .iter()
        .map(|r| per(r.library_acquires, x.shards))
        .collect();
    let trips: Vec<f64> = runs
        .iter()
        .map(|r| per(r.library_rounds + r.library_scans, x.workers))
        .collect();
    let trips_after: Vec<f64> = runs
        .iter()
        .map(|r| per(r.library_trips_after_last_join, x.workers))
        .collect();
    let bound = x.ttl + x.interval * if k8s { 2 } else { 1 };
    let owned = {
        let slack = x.interval / 10;
        let o = if x.kill_owned <= bound + slack {
            Outcome::Met
        } else {
            Outcome::Missed
        };
        format!(
            "{} ({:.1} s, bound {:.1} s)",
            o.word(),
            x.kill_owned.as_secs_f64(),
            bound.as_secs_f64()
        )
    };
    let requests = match (k8s, x.server_requests_per_interval) {
        (true, Some(v)) => cell(range_at_most(&[v], K8S_REQUESTS_GOAL), 0, ""),
        (true, None) => "n/a (the server's count is not readable)".to_string(),
        (false, Some(v)) => format!("n/a ({v:.0}, not judged)"),
        (false, None) => "n/a".to_string(),
    };
    let beliefs: u64 = runs.iter().map(|r| r.beliefs).sum();
    let violations: u64 = runs.iter().map(|r| r.violations).sum();
    let two = match (beliefs, violations) {
        (0, _) => "n/a (no belief recorded)".to_string(),
        (b, 0) => format!("{} (none in {b} grants)", Outcome::Met.word()),
        (b, v) => format!("{} ({v} violations in {b} grants)", Outcome::Missed.word()),
    };
    vec![
        cell(range_at_most(&settle, goal.as_secs_f64()), 2, " s"),
        cell(range_at_most(&acquires, ACQUIRES_GOAL), 2, ""),
        match (
            cell(range_at_most(&trips, ROUND_TRIPS_GOAL), 1, ""),
            crate::split::spread_of(&trips_after),
        ) {
            (c, Some((_, lo, hi))) if runs.iter().any(|r| !r.spread.is_zero()) => {
                let after = if (hi - lo).abs() < f64::EPSILON {
                    format!("{lo:.1}")
                } else {
                    format!("{lo:.1}-{hi:.1}")
                };
                format!("{c}; {after} after the last join")
            }
            (c, _) => c,
        },
        owned,
        requests,
        two,
    ]
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
            library_rounds: 30,
            library_scans: 20,
            library_trips_after_last_join: 40,
            library_server: server.map(|s| s.0),
            beliefs: 100,
            violations: 0,
            minimal: Duration::from_millis(minimal_ms),
            minimal_calls: 10,
            minimal_server: server.map(|s| s.1),
        }
    }

    fn shard_run(
        splits: Vec<Split>,
        kill_owned_ms: u64,
        server: Option<f64>,
    ) -> crate::shards::ShardRun {
        let phase = crate::shards::Phase {
            balanced: Duration::from_secs(1),
            moved: 1,
            minimum: 1,
            grants: 1,
        };
        crate::shards::ShardRun {
            shards: 100,
            workers: 10,
            ttl: Duration::from_secs(9),
            interval: Duration::from_secs(3),
            initial: Duration::from_secs(1),
            initial_acquires: 110,
            renew_calls_per_interval: 10.0,
            scans_per_interval: 10.0,
            server_requests_per_interval: server,
            join: phase.clone(),
            kill_owned: Duration::from_millis(kill_owned_ms),
            kill: phase,
            lost: 0,
            splits: Ok(splits),
        }
    }

    #[test]
    fn fleet_goals_are_met_missed_or_inconclusive_by_the_least_and_greatest_run() {
        // Settle after the last join: 1.5 s and 2.5 s less the 0.5 s spread = 1.0-2.0 s, met;
        // acquires 1.05 per shard, met at the goal; (30 + 20) / 10 = 5 round trips, met.
        let runs = vec![run(1500, 1000, None), run(2500, 1000, None)];
        let goals = super::shard_goals("redis", &shard_run(runs, 11_000, Some(40.0)));
        assert_eq!(goals[0], "met (1.00-2.00 s)");
        assert_eq!(goals[1], "met (1.05)");
        assert_eq!(goals[2], "met (5.0); 4.0 after the last join");
        assert_eq!(goals[3], "met (11.0 s, bound 12.0 s)");
        assert_eq!(goals[4], "n/a (40, not judged)");
        assert_eq!(goals[5], "met (none in 200 grants)");
        // One run past the goal: inconclusive; all past it: missed; a late takeover, a
        // violation and Kubernetes's request count are judged too.
        let mut late = run(3000, 1000, None);
        late.violations = 2;
        let goals = super::shard_goals(
            "redis",
            &shard_run(vec![run(1500, 1000, None), late.clone()], 13_000, None),
        );
        assert_eq!(goals[0], "inconclusive (1.00-2.50 s)");
        assert_eq!(goals[3], "**missed** (13.0 s, bound 12.0 s)");
        assert_eq!(goals[5], "**missed** (2 violations in 200 grants)");
        let goals = super::shard_goals("redis", &shard_run(vec![late.clone(), late], 0, None));
        assert_eq!(goals[0], "**missed** (2.50 s)");
        // Kubernetes: 10 s for the split, two intervals for the takeover, 100 requests.
        let k8s = super::shard_goals(
            "k8s",
            &shard_run(vec![run(3000, 1000, None)], 14_000, Some(101.0)),
        );
        assert_eq!(k8s[0], "met (2.50 s)");
        assert_eq!(k8s[3], "met (14.0 s, bound 15.0 s)");
        assert_eq!(k8s[4], "**missed** (101)");
        let none = super::shard_goals("k8s", &shard_run(Vec::new(), 0, None));
        assert_eq!(none[0], "n/a (not measured)");
        assert_eq!(none[4], "n/a (the server's count is not readable)");
        assert_eq!(none[5], "n/a (no belief recorded)");
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
