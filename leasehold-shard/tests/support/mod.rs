//! Shared by the paused-time tests and the conformance cases: a recorder of every worker's
//! beliefs (into leasehold-testkit's history checker), and deadline-bounded waits.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::hook::{Hook, RenewalResult};
use leasehold_core::supervisor::Health;
use leasehold_core::{FencingToken, Lease, LeaseKey};
use leasehold_shard::{RevokeReason, ShardHook, ShardSet, Snapshot};
use leasehold_testkit::history::{Attempt, History, Op};
use tokio::time::Instant;

/// One line of the shard log: what each worker believed, when.
#[derive(Debug, Clone)]
pub struct Move {
    pub at: Instant,
    pub worker: String,
    pub shard: String,
    pub token: FencingToken,
    /// `None` for an assignment, the reason for an end of belief.
    pub ended: Option<RevokeReason>,
}

/// Records beliefs: grants, confirmed renewals and losses from the supervisor's hook (shard keys
/// only), and the start of every release from the set's hook.
#[derive(Debug, Clone)]
pub struct Recorder {
    pub set_name: String,
    pub history: History,
    pub log: Arc<Mutex<Vec<Move>>>,
    pub steals: Arc<Mutex<u64>>,
    /// The owner (a worker's instance) each grant went to, by shard and token: a worker's hook
    /// names it by its id, its leases by the instance, and the history needs the latter.
    pub instances: Arc<Mutex<BTreeMap<(String, FencingToken), String>>>,
}

impl Recorder {
    pub fn new(set_name: &str) -> Self {
        Recorder {
            set_name: set_name.to_string(),
            history: History::new(),
            log: Arc::default(),
            steals: Arc::default(),
            instances: Arc::default(),
        }
    }

    /// The set's key for `shard`.
    fn key(&self, shard: &str) -> LeaseKey {
        LeaseKey::new(&self.set_name)
            .and_then(|name| name.reserved(&format!("s.{shard}")))
            .expect("legal")
    }

    /// What the set's shard keys start with (its key for a shard `x`, less the `x`).
    fn shard_prefix(&self) -> String {
        let k = self.key("x");
        k.as_str()[..k.as_str().len() - 1].to_string()
    }

    fn is_shard(&self, key: &LeaseKey) -> bool {
        key.as_str().starts_with(&self.shard_prefix())
    }

    pub fn moves(&self) -> Vec<Move> {
        self.log.lock().unwrap().clone()
    }

    /// Checks the recorded history with leasehold-testkit's checker; `Err` lists the violations.
    pub fn check(&self) -> Result<(), String> {
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

    /// Tokens per shard, in assignment order, must strictly increase.
    pub fn check_tokens(&self) -> Result<(), String> {
        let mut last: BTreeMap<String, FencingToken> = BTreeMap::new();
        for m in self.moves().iter().filter(|m| m.ended.is_none()) {
            if let Some(prev) = last.get(&m.shard)
                && *prev >= m.token
            {
                return Err(format!(
                    "shard {}: token {} assigned after {}",
                    m.shard, m.token, prev
                ));
            }
            last.insert(m.shard.clone(), m.token);
        }
        Ok(())
    }

    /// For every planned release (handoff or leave) after `since`, the time until the next
    /// assignment of that shard; the largest one, and the shards never reassigned.
    pub fn planned_gaps(&self, since: Instant) -> (Duration, Vec<String>) {
        let moves = self.moves();
        let mut worst = Duration::ZERO;
        let mut open = Vec::new();
        for (i, m) in moves.iter().enumerate() {
            if m.at < since
                || !matches!(
                    m.ended,
                    Some(RevokeReason::Handoff { .. }) | Some(RevokeReason::Leaving)
                )
            {
                continue;
            }
            match moves[i + 1..]
                .iter()
                .find(|n| n.shard == m.shard && n.ended.is_none())
            {
                Some(n) => worst = worst.max(n.at - m.at),
                None => open.push(m.shard.clone()),
            }
        }
        (worst, open)
    }

    /// [`planned_gaps`](Self::planned_gaps), waiting up to `within` for the shards not
    /// reassigned yet (the observer can see a grant before the recorder does).
    pub async fn planned_gaps_within(
        &self,
        since: Instant,
        within: Duration,
    ) -> (Duration, Vec<String>) {
        let deadline = Instant::now() + within;
        loop {
            let r = self.planned_gaps(since);
            if r.1.is_empty() || Instant::now() >= deadline {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// How many times each cause ended a belief after `since`.
    pub fn ends_since(&self, since: Instant) -> (usize, usize, usize) {
        let (mut handoff, mut lost, mut leaving) = (0, 0, 0);
        for m in self.moves().iter().filter(|m| m.at >= since) {
            match &m.ended {
                Some(RevokeReason::Handoff { .. }) => handoff += 1,
                Some(RevokeReason::Lost(_)) => lost += 1,
                Some(RevokeReason::Leaving) => leaving += 1,
                _ => {}
            }
        }
        (handoff, lost, leaving)
    }
}

impl Hook for Recorder {
    fn acquired(&self, lease: &Lease, _waited: Duration) {
        if !self.is_shard(lease.key()) {
            return;
        }
        // The request was sent at deadline - ttl + drift margin.
        let sent = lease
            .deadline()
            .checked_sub(lease.ttl())
            .map(|t| t + lease.drift_margin())
            .unwrap_or_else(Instant::now)
            .min(Instant::now());
        let prefix = self.shard_prefix();
        let shard = lease.key().as_str()[prefix.len()..].to_string();
        self.instances.lock().unwrap().insert(
            (shard.clone(), lease.token()),
            lease.owner().as_str().to_string(),
        );
        self.log.lock().unwrap().push(Move {
            at: Instant::now(),
            worker: lease.owner().identity().to_string(),
            shard,
            token: lease.token(),
            ended: None,
        });
        self.history.record(
            lease.owner().as_str(),
            lease.key(),
            sent,
            Op::Granted {
                owner: lease.owner().clone(),
                token: lease.token(),
                deadline: lease.deadline(),
            },
        );
    }

    fn renewal(&self, lease: &Lease, result: RenewalResult, latency: Duration) {
        if !self.is_shard(lease.key()) {
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
        if !self.is_shard(lease.key()) || !matches!(to, Health::Lost(_)) {
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

impl ShardHook for Recorder {
    fn releasing(&self, worker: &str, shard: &str, token: FencingToken, reason: &RevokeReason) {
        let s = self.history.begin();
        let instance = self
            .instances
            .lock()
            .unwrap()
            .get(&(shard.to_string(), token))
            .cloned()
            .unwrap_or_else(|| worker.to_string());
        self.history
            .end(&instance, &self.key(shard), s, Op::Release { token });
        self.log.lock().unwrap().push(Move {
            at: Instant::now(),
            worker: worker.to_string(),
            shard: shard.to_string(),
            token,
            ended: Some(reason.clone()),
        });
    }

    fn revoked(&self, worker: &str, shard: &str, token: FencingToken, reason: &RevokeReason) {
        if matches!(reason, RevokeReason::Lost(_)) {
            self.log.lock().unwrap().push(Move {
                at: Instant::now(),
                worker: worker.to_string(),
                shard: shard.to_string(),
                token,
                ended: Some(reason.clone()),
            });
        }
    }

    fn steal_requested(&self, _thief: &str, _victim: &str, _shard: &str) {
        *self.steals.lock().unwrap() += 1;
    }
}

/// Polls `set.snapshot()` until `ok` holds or `within` passes; the last snapshot either way.
pub async fn wait_for(
    set: &ShardSet,
    within: Duration,
    poll: Duration,
    mut ok: impl FnMut(&Snapshot) -> bool,
) -> Result<Snapshot, Snapshot> {
    let deadline = Instant::now() + within;
    let mut last = Snapshot::default();
    loop {
        if let Ok(s) = set.snapshot().await {
            if ok(&s) {
                return Ok(s);
            }
            last = s;
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(poll).await;
    }
}

/// Every shard owned by one of `workers`, each within one of its fair share among them.
pub fn balanced(s: &Snapshot, workers: &[&str]) -> bool {
    let mut members: Vec<String> = workers.iter().map(|w| w.to_string()).collect();
    members.sort();
    let k = s.owners.len();
    let counts = s.counts();
    s.owners.values().all(|o| {
        o.as_ref()
            .is_some_and(|(w, _)| workers.contains(&w.as_str()))
    }) && workers.iter().all(|w| {
        let have = counts.get(*w).copied().unwrap_or(0);
        let fair = leasehold_shard::fair_share(k, &members, w);
        have + 1 >= fair && have <= fair + 1
    })
}

/// Every shard owned by one of `workers`, each holding exactly its fair share among them.
pub fn at_fair_shares(s: &Snapshot, workers: &[&str]) -> bool {
    let mut members: Vec<String> = workers.iter().map(|w| w.to_string()).collect();
    members.sort();
    let k = s.owners.len();
    let counts = s.counts();
    all_owned_by(s, workers)
        && workers.iter().all(|w| {
            counts.get(*w).copied().unwrap_or(0) == leasehold_shard::fair_share(k, &members, w)
        })
}

/// Every shard owned by one of `workers`.
pub fn all_owned_by(s: &Snapshot, workers: &[&str]) -> bool {
    s.owners.values().all(|o| {
        o.as_ref()
            .is_some_and(|(w, _)| workers.contains(&w.as_str()))
    })
}

/// Shard names `p0`..`p{n-1}`.
pub fn shard_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("p{i}")).collect()
}
