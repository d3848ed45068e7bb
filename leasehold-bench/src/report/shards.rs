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
             run (a renewal not confirmed in time). A configuration after the backend's name is \
             the store's, where it is not the default: etcd's workers share one etcd lease per \
             TTL (`LeaseSharing::PerTtl`), as a process holding thousands of leases should; the \
             default's one keepalive per lease is measured at 10,000 leases in table 5.\n"
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
    }
}
