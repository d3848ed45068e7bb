//! Planned leadership handover and preferred candidates of [`Election`] on every backend, against
//! the real services, in real time with short TTLs (1-2 s):
//!
//! - `handover`: a leader hands over to a named successor; the successor leads, no other
//!   candidate leads in between, its term is greater, and the gap (the old leader's leader-only
//!   work cancelled -> the successor elected) is reported;
//! - `absent_successor`: a handover to a successor that never claims: nobody leads before the
//!   bound, someone leads within the bound + TTL after;
//! - `preferred`: a leader yields to a preferred candidate that joins, within about one renewal
//!   interval (reported), and does not take the lead back;
//! - `same_id`: two candidates joined with one id (two processes started with the same stable
//!   id) are two owners to the store: the second is not elected while the first leads, and takes
//!   over when the first resigns;
//! - every candidate's leader-only work takes [`DRAIN`] to finish after its token is cancelled,
//!   holding the term's drain guard meanwhile: a successor (named or preferred) must be elected
//!   only after the old leader's work has drained (the election drains, then releases);
//! - in every case, at most one candidate believes it leads at any instant: leasehold-testkit's
//!   history checker over every candidate's recorded beliefs. A belief starts at the `Elected`
//!   event (with the lease's local deadline, extended by confirmed renewals) and ends when the
//!   term's leader-only work is cancelled (seen synchronously when another candidate is granted
//!   the key, not only when a task awaiting the token runs) or the lease is reported lost.
//!   Beliefs are recorded per candidate *instance* (the owner its leases are held under), so two
//!   candidates joined with one id are two clients to the checker; helpers that name a
//!   candidate take the id it joined with.
//!
//! Backends: memory, PostgreSQL (`LEASE_POSTGRES_URL`), Redis (`LEASE_REDIS_URL`), etcd
//! (`LEASE_ETCD_ENDPOINTS`), Kubernetes (`KUBECONFIG`, namespace `LEASE_K8S_NAMESPACE`) and SQLite
//! (a temporary file); the variables' defaults are leasehold-testkit's test store table
//! (`leasehold_testkit::stores`). The suite runs on leasehold-testkit's multi-backend runner
//! (`run_suite`): a backend whose service is missing has its cases reported ignored, or, under
//! `CI`/`LEASE_TEST_REQUIRE=1`, its `service_available` and every one of its cases failed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::election::{Candidate, DrainGuard, Election, ElectionEvent, StepDownReason};
use leasehold_core::hook::{Hook, RenewalResult};
use leasehold_core::supervisor::{Health, SupervisorConfig};
use leasehold_core::{FencingToken, Lease, LeaseKey, OwnerId};
use leasehold_testkit::SuiteCase;
use leasehold_testkit::history::{Attempt, History, Op};
use libtest_mimic::{Failed, Trial};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Real time is not paused time: store calls take milliseconds, and a loaded 2-core machine
/// adds scheduling delay. Every time bound below is the property's bound plus this.
const SLACK: Duration = Duration::from_secs(1);

/// How long leader-only work takes to finish once its token is cancelled (it holds the term's
/// drain guard until then).
const DRAIN: Duration = Duration::from_millis(300);

#[path = "support/backends.rs"]
mod backends;
use backends::{Backend, backends};

/// The id a candidate joined with, from the instance owner its leases are held under.
fn ident(instance: &str) -> String {
    OwnerId::new(instance)
        .map(|o| o.identity().to_string())
        .unwrap_or_else(|_| instance.to_string())
}

fn unique(case: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("el{case}{:x}{:x}", std::process::id(), nanos)
}

/// (owner, token) -> (request sent, local deadline).
type Grants = HashMap<(String, FencingToken), (Instant, Instant)>;

/// (owner, term) -> the term's work token, or `None` once its end is recorded.
type Terms = HashMap<(String, FencingToken), Option<CancellationToken>>;

/// What happened to the candidates, in the order it was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// `Elected`: the candidate believes it leads from here.
    Elected(FencingToken),
    /// The term's leader-only work was cancelled: the belief ends here.
    WorkEnded(FencingToken),
    /// The term's leader-only work finished (its drain guard dropped), [`DRAIN`] after it was
    /// cancelled.
    Drained(FencingToken),
    /// `SteppedDown`.
    SteppedDown(FencingToken, StepDownReason),
}

/// Records every candidate's beliefs: the lease's grants, renewals and losses from the
/// supervisor's hook (the election key only), turned into a belief at `Elected`, and ended when
/// the term's work is cancelled.
#[derive(Debug, Clone)]
struct Recorder {
    key: LeaseKey,
    history: History,
    /// (owner, token) -> (request sent, local deadline) of every grant of the key.
    grants: Arc<Mutex<Grants>>,
    /// Every followed term: its work token, or `None` once its end is recorded.
    terms: Arc<Mutex<Terms>>,
    log: Arc<Mutex<Vec<(Instant, String, Seen)>>>,
}

impl Recorder {
    fn new(key: LeaseKey) -> Self {
        Recorder {
            key,
            history: History::new(),
            grants: Arc::default(),
            terms: Arc::default(),
            log: Arc::default(),
        }
    }

    fn elected(&self, who: &str, term: FencingToken) -> Result<(), String> {
        let Some((sent, deadline)) = self
            .grants
            .lock()
            .unwrap()
            .get(&(who.to_string(), term))
            .copied()
        else {
            return Err(format!(
                "{who} elected with term {term} and no grant was seen"
            ));
        };
        self.history.record(
            who,
            &self.key,
            sent,
            Op::Granted {
                owner: OwnerId::new(who).expect("legal"),
                token: term,
                deadline,
            },
        );
        self.seen(who, Seen::Elected(term));
        Ok(())
    }

    /// Notes a grant of the key to `who` with `term`: the request's send time and its local
    /// deadline, for [`Recorder::elected`].
    fn granted(&self, who: &str, term: FencingToken, sent: Instant, deadline: Instant) {
        self.grants
            .lock()
            .unwrap()
            .insert((who.to_string(), term), (sent, deadline));
    }

    /// Follows the term's leader-only work: its belief ends when `work` is cancelled; the work
    /// finishes [`DRAIN`] later, holding `drain` (if any) until then.
    fn follow(
        &self,
        who: &str,
        term: FencingToken,
        work: CancellationToken,
        drain: Option<DrainGuard>,
    ) {
        self.terms
            .lock()
            .unwrap()
            .insert((who.to_string(), term), Some(work.clone()));
        let (rec, who) = (self.clone(), who.to_string());
        tokio::spawn(async move {
            work.cancelled().await;
            rec.work_ended(&who, term);
            if let Some(drain) = drain {
                tokio::time::sleep(DRAIN).await;
                rec.seen(&who, Seen::Drained(term));
                drop(drain);
            }
        });
    }

    /// Records the end of every followed term whose work is cancelled by now. Called when any
    /// candidate is granted the key, before its grant is recorded: the library cancels a term's
    /// work before it releases, so an ended term is seen ended here, without depending on when
    /// the task awaiting its token is scheduled. A term whose work is still running when another
    /// candidate is granted stays believed, and the checker reports the overlap.
    fn end_cancelled(&self) {
        let ended: Vec<(String, FencingToken)> = self
            .terms
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, w)| w.as_ref().is_some_and(|w| w.is_cancelled()))
            .map(|(k, _)| k.clone())
            .collect();
        for (who, term) in ended {
            self.work_ended(&who, term);
        }
    }

    /// Ends `who`'s belief in `term` (once).
    fn work_ended(&self, who: &str, term: FencingToken) {
        let mut terms = self.terms.lock().unwrap();
        if terms.insert((who.to_string(), term), None) == Some(None) {
            return; // already recorded
        }
        let s = self.history.begin();
        self.history
            .end(who, &self.key, s, Op::Release { token: term });
        self.seen(who, Seen::WorkEnded(term));
    }

    fn seen(&self, who: &str, what: Seen) {
        self.log
            .lock()
            .unwrap()
            .push((Instant::now(), who.to_string(), what));
    }

    fn log(&self) -> Vec<(Instant, String, Seen)> {
        self.log.lock().unwrap().clone()
    }

    /// Every `Elected` at or after `since`: (when, who, term), `who` being the candidate's
    /// instance.
    fn elections_since(&self, since: Instant) -> Vec<(Instant, String, FencingToken)> {
        self.log()
            .into_iter()
            .filter_map(|(at, who, s)| match s {
                Seen::Elected(t) if at >= since => Some((at, who, t)),
                _ => None,
            })
            .collect()
    }

    fn check(&self) -> Result<(), String> {
        let v = self.history.check();
        if v.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} violation(s): {v:?}\n{}",
                v.len(),
                self.history.dump()
            ))
        }
    }
}

impl Hook for Recorder {
    fn acquired(&self, lease: &Lease, _waited: Duration) {
        if *lease.key() != self.key {
            return;
        }
        self.end_cancelled();
        // The request was sent at deadline - ttl + drift margin.
        let sent = lease
            .deadline()
            .checked_sub(lease.ttl())
            .map(|t| t + lease.drift_margin())
            .unwrap_or_else(Instant::now)
            .min(Instant::now());
        self.granted(
            lease.owner().as_str(),
            lease.token(),
            sent,
            lease.deadline(),
        );
    }

    fn renewal(&self, lease: &Lease, result: RenewalResult, latency: Duration) {
        if *lease.key() != self.key {
            return;
        }
        let invoked = Instant::now()
            .checked_sub(latency)
            .unwrap_or_else(Instant::now);
        let op = match result {
            RenewalResult::Confirmed { .. } => Op::Renewed {
                token: lease.token(),
                deadline: lease.deadline(),
            },
            RenewalResult::Refused => return,
            _ => Op::Unknown(Attempt::Renew(lease.token())),
        };
        self.history
            .record(lease.owner().as_str(), lease.key(), invoked, op);
    }

    fn health_changed(&self, lease: &Lease, _from: Health, to: Health) {
        if *lease.key() != self.key || !matches!(to, Health::Lost(_)) {
            return;
        }
        let s = self.history.begin();
        self.history.end(
            lease.owner().as_str(),
            lease.key(),
            s,
            Op::RenewLost {
                token: lease.token(),
            },
        );
    }
}

enum Cmd {
    Handover(OwnerId, Duration, oneshot::Sender<bool>),
    Resign(oneshot::Sender<()>),
}

/// A candidate driven by its own task, which records its events as they come.
struct Driven {
    cmd: mpsc::UnboundedSender<Cmd>,
    /// The owner its leases are held under.
    instance: String,
}

impl Driven {
    fn start(mut c: Candidate, rec: Recorder) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let who = c.owner().as_str().to_string();
        let instance = who.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    ev = c.next_event() => match ev {
                        Some(ElectionEvent::Elected { term, work, drain }) => {
                            if let Err(e) = rec.elected(&who, term) {
                                eprintln!("{e}");
                                rec.seen(&who, Seen::SteppedDown(term, StepDownReason::Resigned));
                            }
                            rec.follow(&who, term, work, Some(drain));
                        }
                        Some(ElectionEvent::SteppedDown { term, reason }) => {
                            rec.seen(&who, Seen::SteppedDown(term, reason));
                        }
                        Some(_) => {}
                        None => return,
                    },
                    cmd = rx.recv() => match cmd {
                        Some(Cmd::Handover(to, within, reply)) => {
                            let _ = reply.send(c.handover(&to, within).await);
                        }
                        Some(Cmd::Resign(reply)) => {
                            c.resign().await;
                            let _ = reply.send(());
                            return;
                        }
                        None => return,
                    },
                }
            }
        });
        Driven { cmd: tx, instance }
    }

    async fn handover(&self, to: &str, within: Duration) -> bool {
        let (tx, rx) = oneshot::channel();
        let to = OwnerId::new(to).expect("legal");
        if self.cmd.send(Cmd::Handover(to, within, tx)).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    async fn resign(self) {
        let (tx, rx) = oneshot::channel();
        if self.cmd.send(Cmd::Resign(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// One election case on one backend: every candidate joins over its own connection.
struct Setup {
    backend: Backend,
    key: LeaseKey,
    rec: Recorder,
    preferred: Vec<OwnerId>,
}

impl Setup {
    fn new(backend: Backend, case: &str) -> Result<Self, Failed> {
        let key = LeaseKey::new(unique(case))?;
        Ok(Setup {
            backend,
            rec: Recorder::new(key.clone()),
            key,
            preferred: Vec::new(),
        })
    }

    fn config(&self) -> SupervisorConfig {
        SupervisorConfig::new(self.backend.ttl).with_op_timeout(self.backend.ttl / 3)
    }

    async fn join(&self, who: &str) -> Result<Driven, Failed> {
        let store = self.backend.connect().await?;
        let e = Election::from_arc(store, self.key.clone(), self.config())
            .with_drain_timeout(DRAIN * 10)
            .with_preferred(self.preferred.clone())
            .with_hook(Arc::new(self.rec.clone()) as Arc<dyn Hook>);
        Ok(Driven::start(e.join(OwnerId::new(who)?), self.rec.clone()))
    }

    /// Waits up to `within` for a log line after `since` that `ok` accepts (given the id the
    /// candidate joined with).
    async fn wait_seen(
        &self,
        since: Instant,
        within: Duration,
        mut ok: impl FnMut(&str, &Seen) -> bool,
    ) -> Result<(Instant, String, Seen), Failed> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(l) = self
                .rec
                .log()
                .into_iter()
                .find(|(at, who, s)| *at >= since && ok(&ident(who), s))
            {
                return Ok(l);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{}: not seen within {within:?}; log: {:?}",
                    self.backend.name,
                    self.rec.log()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// When `who`'s work of `term` drained; an error unless that was logged before `led` (the
    /// successor's election): the election drains, then releases.
    fn drained_before(
        &self,
        who: &str,
        term: FencingToken,
        led: Instant,
    ) -> Result<Instant, Failed> {
        let log = self.rec.log();
        match log
            .iter()
            .find(|(_, w, x)| ident(w) == who && *x == Seen::Drained(term))
        {
            Some((at, _, _)) if *at <= led => Ok(*at),
            found => Err(format!(
                "{}: the successor was elected before {who}'s work of term {term} drained ({found:?}); log: {log:?}",
                self.backend.name
            )
            .into()),
        }
    }

    /// Waits until `who` is elected (after `since`); its term.
    async fn elected(
        &self,
        who: &str,
        since: Instant,
        within: Duration,
    ) -> Result<(Instant, FencingToken), Failed> {
        let (at, _, s) = self
            .wait_seen(since, within, |w, s| {
                w == who && matches!(s, Seen::Elected(_))
            })
            .await?;
        match s {
            Seen::Elected(t) => Ok((at, t)),
            _ => unreachable!(),
        }
    }

    /// Waits for `n` confirmed renewals of `who`'s lease recorded after `since` (so that the
    /// other candidates have campaigned against it for that long).
    async fn renewals(
        &self,
        who: &str,
        n: usize,
        since: Instant,
        within: Duration,
    ) -> Result<(), Failed> {
        let deadline = Instant::now() + within;
        loop {
            let seen = self
                .rec
                .history
                .events()
                .iter()
                .filter(|e| {
                    (e.client == who || ident(&e.client) == who)
                        && e.completed.at >= since
                        && matches!(e.op, Op::Renewed { .. })
                })
                .count();
            if seen >= n {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{}: {who} renewed {seen} times, not {n}, within {within:?}",
                    self.backend.name
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// (a) A planned handover to a named successor.
async fn handover(b: Backend) -> Result<(), Failed> {
    let s = Setup::new(b, "h")?;
    let ttl = s.backend.ttl;
    let wait = ttl * 5 + SLACK * 5;
    let start = Instant::now();
    let a = s.join("a").await?;
    let (_, t1) = s.elected("a", start, wait).await?;
    // Four others campaign against a for two renewals: a race the successor must win by its
    // reservation, not by luck.
    let others = [
        s.join("b").await?,
        s.join("c").await?,
        s.join("d").await?,
        s.join("e").await?,
    ];
    s.renewals("a", 2, Instant::now(), wait).await?;
    let within = ttl * 2;
    let at = Instant::now();
    if !a.handover("c", within).await {
        return Err("the leader's handover was refused".into());
    }
    // A follower's handover changes nothing.
    if others[0].handover("b", within).await {
        return Err("a follower's handover was accepted".into());
    }
    let (ended, _, _) = s
        .wait_seen(at, wait, |w, x| {
            w == "a" && matches!(x, Seen::WorkEnded(t) if *t == t1)
        })
        .await?;
    s.wait_seen(at, wait, |w, x| {
        w == "a" && *x == Seen::SteppedDown(t1, StepDownReason::HandedOver)
    })
    .await?;
    let (led, t2) = s.elected("c", at, within + SLACK).await?;
    let between = s.rec.elections_since(at);
    if between.first().map(|(_, w, _)| ident(w)).as_deref() != Some("c") {
        return Err(format!("another candidate led before the successor: {between:?}").into());
    }
    let drained = s.drained_before("a", t1, led)?;
    if t2 <= t1 {
        return Err(format!("successor's term {t2} is not greater than {t1}").into());
    }
    // c keeps the lead over two renewals; nobody else is elected meanwhile.
    s.renewals("c", 2, led, wait).await?;
    let after = s.rec.elections_since(at);
    if after.len() != 1 {
        return Err(format!("elections after the handover: {after:?}").into());
    }
    eprintln!(
        "{}: handover: a's work cancelled -> drained {:?} -> c elected {:?}, handover call -> c elected {:?}, terms {t1} -> {t2}",
        s.backend.name,
        drained - ended,
        led - drained,
        led - at
    );
    a.resign().await;
    for o in others {
        o.resign().await;
    }
    s.rec.check()?;
    Ok(())
}

/// (b) A handover to a successor that never claims.
async fn absent_successor(b: Backend) -> Result<(), Failed> {
    let s = Setup::new(b, "g")?;
    let ttl = s.backend.ttl;
    let wait = ttl * 5 + SLACK * 5;
    let start = Instant::now();
    let a = s.join("a").await?;
    let (_, t1) = s.elected("a", start, wait).await?;
    let others = [s.join("b").await?, s.join("c").await?];
    s.renewals("a", 2, Instant::now(), wait).await?;
    let bound = ttl * 2;
    let at = Instant::now();
    if !a.handover("ghost", bound).await {
        return Err("the leader's handover was refused".into());
    }
    // Someone leads within bound + TTL (+ slack) ...
    let (led, who, _) = s
        .wait_seen(at, bound + ttl + SLACK, |_, x| {
            matches!(x, Seen::Elected(_))
        })
        .await?;
    // ... and nobody before the bound.
    if led < at + bound {
        return Err(format!(
            "{who} led {:?} after a handover bounded {bound:?}",
            led - at
        )
        .into());
    }
    let Some((_, _, t2)) = s.rec.elections_since(at).first().cloned() else {
        unreachable!()
    };
    if t2 <= t1 {
        return Err(format!("term {t2} after {t1}").into());
    }
    eprintln!(
        "{}: absent successor: {who} led {:?} after the handover (bound {bound:?}, TTL {ttl:?})",
        s.backend.name,
        led - at
    );
    a.resign().await;
    for o in others {
        o.resign().await;
    }
    s.rec.check()?;
    Ok(())
}

/// (c) A leader yields to a preferred candidate that joins.
async fn preferred(b: Backend) -> Result<(), Failed> {
    let mut s = Setup::new(b, "p")?;
    s.preferred = vec![OwnerId::new("p")?];
    let ttl = s.backend.ttl;
    let interval = s.config().renew_interval();
    let wait = ttl * 5 + SLACK * 5;
    let start = Instant::now();
    let a = s.join("a").await?;
    let (_, t1) = s.elected("a", start, wait).await?;
    let b_ = s.join("b").await?;
    s.renewals("a", 2, Instant::now(), wait).await?;
    let joined = Instant::now();
    let p = s.join("p").await?;
    let (led, t2) = s
        .elected("p", joined, interval + ttl + DRAIN + SLACK)
        .await?;
    let between = s.rec.elections_since(joined);
    if between.first().map(|(_, w, _)| ident(w)).as_deref() != Some("p") {
        return Err(format!("another candidate led before the preferred one: {between:?}").into());
    }
    s.drained_before("a", t1, led)?;
    if t2 <= t1 {
        return Err(format!("term {t2} after {t1}").into());
    }
    s.wait_seen(joined, wait, |w, x| {
        w == "a" && *x == Seen::SteppedDown(t1, StepDownReason::HandedOver)
    })
    .await?;
    // p keeps the lead; nobody takes it back.
    s.renewals("p", 3, led, wait).await?;
    let after = s.rec.elections_since(joined);
    if after.len() != 1 {
        return Err(format!("elections after p joined: {after:?}").into());
    }
    eprintln!(
        "{}: preferred: p joined -> p elected {:?} (renewal interval {interval:?}), terms {t1} -> {t2}",
        s.backend.name,
        led - joined
    );
    for c in [a, b_, p] {
        c.resign().await;
    }
    s.rec.check()?;
    Ok(())
}

/// (d) Two candidates joined with one id (two processes started with the same stable id): the
/// second is never elected while the first leads (the checker sees no overlapping beliefs), and
/// it takes over once the first resigns.
async fn same_id(b: Backend) -> Result<(), Failed> {
    let s = Setup::new(b, "s")?;
    let ttl = s.backend.ttl;
    let wait = ttl * 5 + SLACK * 5;
    let start = Instant::now();
    let first = s.join("a").await?;
    let (_, t1) = s.elected("a", start, wait).await?;
    let second = s.join("a").await?;
    let other = s.join("b").await?;
    // The second instance campaigns against the first over three of its renewals.
    s.renewals(&first.instance, 3, Instant::now(), wait).await?;
    let after = s.rec.elections_since(start);
    if after.len() != 1 {
        return Err(format!("{}: elections while a leads: {after:?}", s.backend.name).into());
    }
    s.rec.check()?;
    let at = Instant::now();
    first.resign().await;
    let (led, who, _) = s
        .wait_seen(at, ttl + SLACK, |_, x| matches!(x, Seen::Elected(_)))
        .await?;
    let Some((_, _, t2)) = s.rec.elections_since(at).first().cloned() else {
        unreachable!()
    };
    if t2 <= t1 {
        return Err(format!("term {t2} after {t1}").into());
    }
    eprintln!(
        "{}: same id: {who} elected {:?} after the first instance resigned (second instance {})",
        s.backend.name,
        led - at,
        second.instance
    );
    second.resign().await;
    other.resign().await;
    s.rec.check()?;
    Ok(())
}

/// The recorder feeds the checker: two candidates elected with overlapping beliefs (no work
/// ended in between) must be reported, and so must a grant while the old term's work token is
/// still live.
fn recorder_reports_overlapping_leaders() -> Result<(), Failed> {
    let rt = leasehold_testkit::env::runtime();
    rt.block_on(async {
        let rec = Recorder::new(LeaseKey::new("el-known-bad")?);
        let far = Instant::now() + Duration::from_secs(60);
        for (who, t) in [("a", 1u64), ("b", 2)] {
            let t = FencingToken::new(t)?;
            rec.granted(who, t, Instant::now(), far);
            rec.elected(who, t)?;
        }
        match rec.check() {
            Err(e) if e.contains("OverlappingBelief") => {}
            other => return Err(format!("overlap not reported: {other:?}").into()),
        }
        // Ending a's belief first makes the same history legal.
        let rec2 = Recorder::new(LeaseKey::new("el-known-good")?);
        for (who, t) in [("a", 1u64), ("b", 2)] {
            let t = FencingToken::new(t)?;
            rec2.granted(who, t, Instant::now(), far);
            rec2.elected(who, t)?;
            rec2.work_ended(who, t);
        }
        rec2.check()?;
        // A term followed by its work token: when b is granted, a's belief ends only if a's
        // work is already cancelled (the library cancels before it releases).
        for cancel_first in [false, true] {
            let rec = Recorder::new(LeaseKey::new("el-known-work")?);
            let work = CancellationToken::new();
            for (who, t) in [("a", 1u64), ("b", 2)] {
                let t = FencingToken::new(t)?;
                rec.granted(who, t, Instant::now(), far);
                if who == "a" {
                    rec.elected(who, t)?;
                    rec.follow(who, t, work.clone(), None);
                    if cancel_first {
                        work.cancel();
                    }
                } else {
                    rec.end_cancelled(); // what the grant's hook does
                    rec.elected(who, t)?;
                }
            }
            match (cancel_first, rec.check()) {
                (false, Err(e)) if e.contains("OverlappingBelief") => {}
                (true, Ok(())) => {}
                other => return Err(format!("work-token recording wrong: {other:?}").into()),
            }
        }
        Ok(())
    })
}

fn main() {
    let dir = std::env::temp_dir().join(format!("lease-election-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let cases = [
        SuiteCase::new("handover", |b| Box::pin(handover(Backend::of(b)))),
        SuiteCase::new("absent_successor", |b| {
            Box::pin(absent_successor(Backend::of(b)))
        }),
        SuiteCase::new("preferred", |b| Box::pin(preferred(Backend::of(b)))),
        SuiteCase::new("same_id", |b| Box::pin(same_id(Backend::of(b)))),
    ];
    let out = leasehold_testkit::run_suite(
        &backends(&dir, "election.db"),
        &cases,
        Duration::from_secs(60),
        vec![Trial::test(
            "recorder_reports_overlapping_leaders",
            recorder_reports_overlapping_leaders,
        )],
    );
    let _ = std::fs::remove_dir_all(&dir);
    out.exit()
}
