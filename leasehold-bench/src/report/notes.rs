//! The notes under the tables: what each side sends, and why a missed goal is missed.

use std::fmt::Write as _;

use super::latency::side_quantile;
use super::{LIBRARY_ACQUIRE, Report, median};
use crate::measure::{LIB, MIN, RAW, RENEW_CONCURRENCY};

impl Report {
    pub(super) fn notes(&self, s: &mut String) {
        let _ = writeln!(s, "## Notes\n");
        let _ = writeln!(
            s,
            "- **What the same-protocol side sends** (the library's own protocol, issued directly). PostgreSQL: the store's acquire (the \
             `UPDATE` of an existing row that computes the token; only when the key has no row, \
             a second statement with the `INSERT .. ON CONFLICT`) and its release `UPDATE` (with `pg_notify` when a refused \
             acquire marked the row) on its own pool. Redis: the store's acquire and release Lua \
             scripts (`EVALSHA`) on its connection manager. etcd: the store's request sequence \
             (acquire: lease grant, then one txn on the prefix's create revision that puts the \
             lock key under its slot name or reads the holder; release: lease revoke of the \
             tagged per-grant etcd lease) on its client. SQLite: the store's acquire upsert `RETURNING token` \
             (when refused, a read of the holder) on one write connection and its release \
             `UPDATE`, with the store's settings; the library adds its in-process write queue. \
             MySQL / MariaDB: the store's acquire (the guarded `UPDATE` of an existing row that \
             computes the token and hands it back in the OK packet through `LAST_INSERT_ID(expr)`; \
             when it matches nothing, a read of the holder, and only when the key has no row, \
             the `INSERT .. SELECT` and a read of the session's `LAST_INSERT_ID()`) and its \
             release `UPDATE`, on its own pool, against the library's table and triggers. Kubernetes: the store's requests with the same client (acquire: GET of \
             the Lease, then a resourceVersion-guarded REPLACE with the holder and token \
             annotations, or a CREATE; release: REPLACE of the granted object with an empty \
             holder); the library adds its observation bookkeeping."
        );
        let _ = writeln!(
            s,
            "- **What the minimal side sends** (the floor of the goals). PostgreSQL: one \
             `INSERT .. ON CONFLICT (lease_key) DO UPDATE .. WHERE lease_until < clock_timestamp() \
             OR owner_id = $2 RETURNING fencing_token` on a plain table without trigger, and one \
             guarded `UPDATE` to release. Redis: one script of `SET NX PX` plus `INCR` of a \
             counter key, and a compare-and-delete script to release. etcd: the shape of etcd's \
             own `concurrency.Mutex`: one etcd lease per TTL, granted once and kept alive in the \
             background (as a `Session`), a txn guarded by `create_revision == 0` that puts the \
             key with that lease (the token is the txn's revision), and a txn that deletes the \
             key if its create revision is still the token to release: two writes per pair. The \
             library's `LeaseSharing::PerTtl` is its counterpart (the `etcd (LeaseSharing::PerTtl)` \
             rows of table 1); the default gives a named key (all keys here) an etcd lease of its \
             own, as `PerGrant` does: it grants and revokes an etcd lease per grant, three writes. \
             Kubernetes: a GET and a resourceVersion-guarded REPLACE (or a CREATE), the token \
             being the written resourceVersion, and a REPLACE with an empty holder to release. \
             MySQL / MariaDB: one `INSERT .. ON DUPLICATE KEY UPDATE` on a plain InnoDB table \
             without trigger (the token first, then the owner, then the expiry, each assignment \
             judged on the old row), whose token comes back in the OK packet through \
             `LAST_INSERT_ID(expr)` (1 for a new key, the next token for a grant, 0 for a \
             refusal), and one guarded `UPDATE` to release; each one prepared statement, one \
             round trip; the benchmark checks on a probe key at start that the server reports the \
             token so. \
             SQLite: one upsert in autocommit (no explicit transaction: one statement \
             is its own), on a file of its own, and a guarded `UPDATE` to release, on a pool \
             that does not ping a connection before handing it out (as the library's). Each \
             runs on the library's own driver and pool (PostgreSQL and MySQL: the library's, \
             which does not ping before each checkout either), connection manager or client. It keeps the per-key fencing counter but none of the library's \
             other promises (no token floor surviving a key's deletion or a Redis restart, no \
             release notification, no watch)."
        );
        let _ = writeln!(
            s,
            "- **What the ablation rows of tables 1b and 1c send** (each prices one cost of the library's \
             over the minimal; none is a floor). Redis: the minimal acquire script with a `TIME` \
             read first (the clock alone); the minimal acquire script whose token is the \
             library's, the counter + 1 or the server's clock in microseconds if higher, computed \
             as the library's script computes it (a token that does not repeat after the \
             counter's loss); the minimal release with a `PUBLISH` (the release wake-up); and the \
             library's acquire script with a release that only compares and deletes (the \
             library's release without its `PUBLISH`). PostgreSQL: the minimal statements on a table of the library's \
             layout (a text owner, since an owner id is any string; `ttl_ms` written with each \
             grant; the `wake` column; the three CHECKs), without triggers; and the minimal \
             statements on the minimal table with a `BEFORE UPDATE OF fencing_token` row trigger \
             whose `WHEN` is false for them, as the library's floor trigger's is for the \
             library's own grants and releases (PostgreSQL locks the row before it evaluates \
             `WHEN`: one more WAL record per update; ADR 0010); the minimal upsert whose token \
             is the library's, `greatest(old + 1, the server's clock in microseconds)` (ADR \
             0010); and the library's acquire on the library's own table, triggers included, \
             with the minimal release (no expiry check, no wake-up mark, no `RETURNING`). The \
             last row of each backend splits its protocol cost in two: its rate over the \
             minimal's prices the library's acquire, and the library's own protocol over it \
             prices the library's release. MySQL / MariaDB: the minimal upsert whose token is \
             the library's, `GREATEST(old + 1, the server's clock in microseconds)` (a new key's: \
             the clock); and the library's acquire on the library's own table, triggers \
             included, with the minimal release (no expiry check). Kubernetes: the minimal requests \
             with the library's two token annotations written on every grant (the token is the \
             old annotation + 1, a counter that survives the object's deletion, which the \
             resourceVersion is not)."
        );
        let _ = writeln!(
            s,
            "- **The leasehold-otel side** wraps the bare store in \
             `leasehold_otel::LeaseMetrics::global().store(..)`; with no OpenTelemetry SDK installed \
             the global meter is a no-op, so the figure is the decorator's own cost (spans, \
             attribute building), not an exporter's."
        );
        for r in self.measured() {
            for row in &r.throughput {
                if let (Ok(l), Ok(w), Ok(m)) = (row.rate(LIB), row.rate(RAW), row.rate(MIN))
                    && l / m < 0.95
                {
                    let _ = writeln!(
                        s,
                        "- `{}` throughput, {} client(s): library / minimal {:.2} = wrapper \
                         overhead {:.2} (library over its own protocol issued directly) x \
                         protocol cost {:.2} (its own protocol over the minimal one). A protocol \
                         cost below 1 is what the library's extra guarantees cost in statements, \
                         commands or requests (see *What the same-protocol side sends*).{}",
                        r.name,
                        row.clients,
                        l / m,
                        l / w,
                        w / m,
                        if r.cpu.is_empty() {
                            ""
                        } else {
                            " Table 1b splits both into client CPU, server CPU and waiting, \
                             and prices guarantees one by one where it has ablation rows."
                        }
                    );
                    let priced: Vec<String> = row
                        .ablation_rates()
                        .filter_map(|(label, a)| a.ok().map(|a| format!("{label} {:.2}", a / m)))
                        .collect();
                    if !priced.is_empty() {
                        let _ = writeln!(
                            s,
                            "  Measured with it (table 1c), each ablation over the minimal: {}; \
                             minimal A/A {}.",
                            priced.join(", "),
                            super::iv(row.ratio(crate::measure::AA, MIN), 3)
                        );
                    }
                    if let Some(Ok(g)) = row
                        .ablation_rates()
                        .find(|(label, _)| *label == LIBRARY_ACQUIRE)
                        .map(|(_, a)| a)
                    {
                        let _ = writeln!(
                            s,
                            "  So the protocol cost {:.2} = the library's acquire {:.2} (its \
                             acquire with the minimal release, over the minimal) x the library's \
                             release {:.2} (its own protocol over that ablation).",
                            w / m,
                            g / m,
                            w / g
                        );
                    }
                }
            }
            let q = |i: usize| side_quantile(&r.latency, i, 0.99);
            if let (Ok(l), Ok(w), Ok(m)) = (q(LIB), q(RAW), q(MIN))
                && l / m > 1.1
            {
                let _ = writeln!(
                    s,
                    "- `{}` p99: library {l:.3} ms against the minimal {m:.3} ms ({:.2}x); the \
                     library's own protocol issued directly takes {w:.3} ms, so the wrapper adds \
                     {:.2}x and the protocol {:.2}x.",
                    r.name,
                    l / m,
                    l / w,
                    w / m
                );
            }
            if r.watch
                && let (Ok(m), Ok(rtt)) = (median(&r.takeover_watch), &r.rtt_ms)
                && m > rtt + 20.0
            {
                let why = match r.name {
                    "etcd" => {
                        "etcd does not delete a key when its lease's TTL runs out but when its \
                         leader's lessor next checks for expired leases, on a fixed 500 ms tick \
                         (etcd 3.4 `lessor.runLoop`), and then through a Raft proposal; the \
                         store-expiry-delay column measures that with the raw protocol, and the \
                         waiter is granted about one acquire after the deletion"
                    }
                    "redis" => {
                        "Redis deletes expired keys lazily or in its active-expiry cycle \
                                (10 times a second by default), and the keyspace event fires only \
                                then; without keyspace notifications the watch polls every 250 ms"
                    }
                    "k8s" => {
                        "Kubernetes has no server-side expiry: as client-go, the waiter must \
                              observe the record unchanged for a whole TTL from its own first \
                              observation (here the store's own record of the holder's grant), \
                              then acquire with a GET and a resourceVersion-guarded REPLACE, a \
                              write the API server commits to its etcd; one acquire (table 2) is \
                              the floor after the expiry"
                    }
                    _ => "the store signals the expiry late",
                };
                let _ = writeln!(
                    s,
                    "- `{}` takeover: {m:.1} ms after the estimated expiry with the watch (goal \
                     {:.1} ms). {why}.",
                    r.name,
                    rtt + 20.0
                );
            }
            let best = if r.watch {
                median(&r.handoff_watch)
            } else {
                median(&r.handoff_poll)
            };
            if let (Ok(b), Ok(rtt)) = (best, &r.rtt_ms)
                && b > 3.0 * rtt
            {
                let why = if r.watch {
                    "the release and the next acquire are themselves several round trips of the \
                     ping (see the raw floor in the table; etcd: three requests each), then the \
                     store's notification travels to the waiter and wakes it, which the raw \
                     waiter woken by the same notification pays too (see the table)"
                } else {
                    "this backend has no watch: the waiter polls with jittered backoff (up to a \
                     quarter of the TTL, capped at 1 s), so the handoff is bounded by the poll \
                     interval, not by round trips"
                };
                let _ = writeln!(
                    s,
                    "- `{}` handoff: {b:.1} ms = {:.1} round trips of {rtt:.2} ms; {why}.",
                    r.name,
                    b / rtt
                );
            }
            for (config, load) in &r.renewal {
                let Ok(l) = load else { continue };
                if r.name == "k8s" {
                    let _ = writeln!(
                        s,
                        "- `k8s` renewal: the Kubernetes API has no batch write; `renew_many` \
                         renews one Lease object per request, so one process holding N leases \
                         sends N requests per interval ({:.0} requests per interval for {} \
                         leases, at most {RENEW_CONCURRENCY} in flight, {:.0} ms of wall time \
                         per interval). Shard leases across processes or use one Lease per group \
                         where N is large.",
                        l.round_trips_per_interval, l.leases, l.renew_wall_ms_per_interval
                    );
                } else if l.round_trips_per_interval > 10.0 {
                    let _ = writeln!(
                        s,
                        "- `{}` renewal ({config}): {:.1} batches per interval, more than the \
                         supervisor's renewal grid should give (two waves per interval, one more \
                         per 5,000 leases in a wave; leases acquired over {:.1} s).",
                        r.name,
                        l.round_trips_per_interval,
                        l.acquire_spread.as_secs_f64(),
                    );
                }
                if r.name == "etcd" {
                    let _ = writeln!(
                        s,
                        "- `etcd` renewal ({config}): one `renew_many` is one keepalive per \
                         distinct etcd lease (one per grant with `PerGrant`, one per TTL with \
                         `PerTtl`) plus range reads of the batch's lock keys, so {:.1} calls make \
                         {} server requests per interval.",
                        l.round_trips_per_interval,
                        l.server_requests_per_interval
                            .map_or("-".to_string(), |x| format!("{x:.1}"))
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            "- SQLite runs on temporary files on local disk with the store's defaults (WAL, \
             synchronous NORMAL), the library and the raw protocol each on a file of its own: \
             on one shared file the WAL's automatic checkpoints (one every 1,000 pages, run by \
             whichever commit crosses the mark) fall, in step with the alternation of the \
             samples, on one side's acquires more than on the other's and decide its p99."
        );
        let _ = writeln!(
            s,
            "- **RSS per lease** is the growth of this process's resident set while the leases \
             are acquired. Only the first backend of a run starts from a fresh heap: later \
             backends reuse memory the allocator kept from earlier ones and read low (down to \
             zero). For a backend's own figure run it alone: \
             `cargo run --release -p leasehold-bench -- --backends NAME --out /tmp/NAME.md`."
        );
        let _ = writeln!(
            s,
            "- **CPU** comes from `/proc/self/stat` in clock ticks (10 ms), so small figures are \
             coarse; it covers the whole process (the supervisor's renewal tasks and batcher, the \
             driver and the runtime)."
        );
        let _ = writeln!(
            s,
            "- **Takeover, estimate of expiry.** The store-side expiry is taken as the midpoint of \
             the holder's acquire round trip plus the TTL; the error of that estimate is at most \
             half a round trip, and a figure can be slightly negative when the store expires a \
             key a little early by the client's clock."
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::measure::{LIB, RAW};
    use crate::report::{BackendRun, LIBRARY_ACQUIRE, Report, ThroughputRow};

    #[test]
    fn a_throughput_miss_is_split_into_acquire_and_release_by_the_ablation() {
        let mut r = BackendRun::new("test");
        let n = crate::measure::SIDES.len();
        let mut rates = vec![Ok(100.0); n];
        rates[LIB] = Ok(90.0);
        rates[RAW] = Ok(90.0);
        // The library's acquire with the minimal release: 0.95 of the minimal.
        rates.push(Ok(95.0));
        r.throughput = vec![ThroughputRow {
            clients: 8,
            rates,
            rounds: Vec::new(),
            ablations: vec![LIBRARY_ACQUIRE],
            configs: Vec::new(),
        }];
        let report = Report {
            runs: vec![r],
            machine: Vec::new(),
            command: String::new(),
            started: jiff::Timestamp::UNIX_EPOCH,
            finished: jiff::Timestamp::UNIX_EPOCH,
            smoke: true,
            optimized: false,
            throughput_for: Duration::from_secs(1),
            throughput_block: Duration::from_millis(100),
            cpu_block: Duration::from_millis(100),
            cpu_rounds: 1,
            repeats: 1,
        };
        let mut s = String::new();
        report.notes(&mut s);
        assert!(
            s.contains("So the protocol cost 0.90 = the library's acquire 0.95")
                && s.contains("the library's release 0.95"),
            "{s}"
        );
        // Without that ablation, no split is claimed.
        let mut report = report;
        report.runs[0].throughput[0].ablations.clear();
        report.runs[0].throughput[0].rates.pop();
        let mut s = String::new();
        report.notes(&mut s);
        assert!(!s.contains("So the protocol cost"), "{s}");
    }
}
