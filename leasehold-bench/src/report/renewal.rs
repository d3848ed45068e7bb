//! Table 5: renewal load.

use std::fmt::Write as _;

use super::{Report, met, one_line};
use crate::measure::RENEW_CONCURRENCY;

impl Report {
    pub(super) fn renewal_table(&self, s: &mut String) {
        let _ = writeln!(s, "## 5. Renewal load\n");
        let _ = writeln!(
            s,
            "N leases held by one process through one `Supervisor` with renewal batching \
             (`with_renewal_batching(interval / 20)`), renewing every TTL/3; the supervisor moves \
             each renewal earlier onto a grid of half an interval shared by its guards (ADR 0004), \
             so after their first renewal all leases renew in at most two waves per interval, \
             whatever the spread of their acquisitions. Round trips are \
             `renew_many` calls counted by the bench's own forwarding store (one call is one \
             statement, script or batch), averaged over the measured intervals after one warm-up \
             interval, or more where the server's counter is late (a renewal wave that \
             straddles the end of the measured span is counted or not, so the figure is exact \
             to about one wave). Kubernetes has no batch write: its \
             figure counts one request per lease, sent at most {RENEW_CONCURRENCY} at once, and \
             *renew wall ms / interval* is the time spent in those batches (summed over \
             overlapping calls). Backends with several configurations get one row each, the \
             default first (etcd: the default `LeaseSharing::ReservedPerTtl`, which gives each of \
             these named keys an etcd lease of its own and so one keepalive per grant, and \
             `PerTtl`, one etcd lease shared per TTL). *Server requests* are counted by the server \
             itself over the same span, where it keeps such a counter (etcd: every gRPC message \
             received, keepalives included, from its `/metrics`; PostgreSQL: transactions of the \
             database in `pg_stat_database`, which backends publish up to 10 s late, so counting \
             starts after as many warm-up intervals as take 12 s, none of the acquisitions is \
             counted, and the figure is exact to about one wave (a pool connection's first use of \
             the renewal statement adds one transaction, its prepare); the load starts only once no \
             store listener connection is left from earlier sections, since a listening backend \
             reads each notification in a transaction of its own and publishes them only when it \
             closes; Redis: the calls in `INFO \
             commandstats` of every command but those the store's Lua scripts run, since Redis \
             counts a command a script runs like one a client sent, so a batch's `EVALSHA` counts \
             once; Kubernetes: `apiserver_request_total` on Leases from the kube-apiserver's \
             `/metrics`); where present, the goal is judged on them. CPU is this \
             process's user+system time (`/proc/self/stat`) per interval; memory is the RSS \
             growth while acquiring, per lease. The server's counters include other clients of \
             the same server during the span.\n"
        );
        let _ = writeln!(
            s,
            "| backend | configuration | leases | TTL | batch window | intervals measured | acquire time | renew_many calls / interval | renew wall ms / interval | server requests / interval | CPU ms / interval | CPU µs / lease / interval | RSS bytes / lease | still held | goal | met? |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in self.measured() {
            for (config, load) in &r.renewal {
                match load {
                    Ok(l) => {
                        let batches = r.name != "k8s";
                        let leases = f64::from(u32::try_from(l.leases.max(1)).unwrap_or(u32::MAX));
                        let requests = l
                            .server_requests_per_interval
                            .unwrap_or(l.round_trips_per_interval);
                        let (goal, ok) = if batches {
                            ("<= 10", Some(requests <= 10.0))
                        } else {
                            ("n/a (no batch API)", None)
                        };
                        let trips = format!(
                            "{:.1} | {:.1} | {}",
                            l.round_trips_per_interval,
                            l.renew_wall_ms_per_interval,
                            l.server_requests_per_interval
                                .map_or("-".into(), |x| format!("{x:.1}"))
                        );
                        let _ = writeln!(
                            s,
                            "| {} | {config} | {} | {:?} | {:?} | {} | {:.1} s | {trips} | {:.1} | {:.2} | {:.0} | {}/{} | {goal} | {} |",
                            r.name,
                            l.leases,
                            l.ttl,
                            l.window,
                            l.intervals,
                            l.acquire_spread.as_secs_f64(),
                            l.cpu_ms_per_interval,
                            l.cpu_ms_per_interval * 1000.0 / leases,
                            l.rss_bytes_per_lease,
                            l.still_held,
                            l.leases,
                            met(ok)
                        );
                    }
                    Err(e) => {
                        let _ = writeln!(
                            s,
                            "| {} | {config} | error: {} | | | | | | | | | | | | | |",
                            r.name,
                            one_line(e)
                        );
                    }
                }
            }
        }
        s.push('\n');
    }
}
