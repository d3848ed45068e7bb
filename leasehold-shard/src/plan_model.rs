//! A bounded model check of the split: every interleaving of the workers' scans and of their
//! acquisitions landing, for a few workers and shards, stepped through the real [`Book`].
//!
//! The store is abstract (each shard free or owned, with a token; an acquisition of a free shard
//! is granted, of an owned one refused); a scan reads it as it is at that moment, and the
//! worker's rebalance runs on that view while the acquisitions of the others are still in flight,
//! which is where the real split's views go stale. All workers are members from the start (they
//! join at once, as in the bench's split).
//!
//! Checked in every explored state:
//! - **no overshoot**: no worker holds or is taking more than its fair share;
//! - **no steals**: a split from all-free shards never needs a steal (no worker is ever above
//!   its share for another to steal from);
//! - **no inherits**: no shard is ever held by a non-member;
//! - **settles**: from the state, landing what is in flight and then rounds of fresh scans (each
//!   worker scans and its acquisitions land) reach every shard owned at exactly the fair shares
//!   within [`SETTLE_ROUNDS`] rounds.
//!
//! And over all explored executions: no acquisition is ever refused (no two workers go for one
//! shard: a split without contest, one acquisition per shard in every interleaving). Coverage
//! guard: scans taken while another worker's acquisitions are in flight (stale views) must be
//! reached, so that the bounds cannot make the check vacuous; a negative control (a worker whose
//! view of the members lags, believing it is alone) must be caught.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{FencingToken, LeaseKey};

use super::plan::{Book, Ctx, View};
use crate::{ShardSetConfig, fair_share};

/// Rounds of fresh scans within which any explored state must settle.
const SETTLE_ROUNDS: usize = 2;

/// The model's bounds and its one deliberate fault.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    workers: usize,
    shards: usize,
    /// Scans each worker makes in the explored part (fresh scans to settle come after).
    scans: usize,
    /// Negative control: this worker's scans do not see the other members (it believes it is
    /// alone), as a membership view that lags would.
    alone: Option<usize>,
}

#[derive(Debug, Default)]
struct Found {
    states: usize,
    violations: Vec<String>,
    refused: usize,
    stale_scans: usize,
    max_acquires: usize,
    max_settle_rounds: usize,
}

#[derive(Debug, Clone)]
struct State {
    owners: Vec<Option<(usize, u64)>>,
    next_token: u64,
    books: Vec<Book>,
    scans_left: Vec<usize>,
    acquires: usize,
}

struct Model {
    bounds: Bounds,
    ids: Vec<String>,
    shards: Vec<(Arc<str>, LeaseKey)>,
    config: ShardSetConfig,
}

fn token(n: u64) -> FencingToken {
    FencingToken::new(n).expect("model tokens start at 1")
}

impl Model {
    fn new(bounds: Bounds) -> Model {
        let ids = (0..bounds.workers).map(|w| format!("w{w}")).collect();
        let shards = (0..bounds.shards)
            .map(|i| {
                let name = format!("s{i}");
                (
                    Arc::from(name.as_str()),
                    LeaseKey::new(&name).expect("legal"),
                )
            })
            .collect();
        Model {
            bounds,
            ids,
            shards,
            config: ShardSetConfig::new(Duration::from_secs(3)),
        }
    }

    fn initial(&self) -> State {
        State {
            owners: vec![None; self.bounds.shards],
            next_token: 1,
            // Each worker's first scan, which sees every member as new and only defers (the
            // plan's `defer`: nothing taken, nothing planned), is taken as done: each book has
            // seen the members its scans show. A fresh book's deferral is unit-tested.
            books: (0..self.bounds.workers)
                .map(|w| Book {
                    members: self.view_members(w),
                    ..Book::default()
                })
                .collect(),
            scans_left: vec![self.bounds.scans; self.bounds.workers],
            acquires: 0,
        }
    }

    /// The members worker `w`'s scans show.
    fn view_members(&self, w: usize) -> Vec<String> {
        if self.bounds.alone == Some(w) {
            vec![self.ids[w].clone()]
        } else {
            self.ids.clone()
        }
    }

    fn view(&self, s: &State, w: usize) -> View {
        View {
            members: self.view_members(w),
            owners: s
                .owners
                .iter()
                .map(|o| o.map(|(w, t)| (self.ids[w].clone(), token(t))))
                .collect(),
            mailbox: None,
        }
    }

    /// Worker `w` scans and rebalances; returns what is wrong with the plan, if anything.
    fn scan(&self, s: &mut State, w: usize, found: &mut Found) -> Option<String> {
        let view = self.view(s, w);
        let ctx = Ctx {
            me: &self.ids[w],
            shards: &self.shards,
            config: &self.config,
        };
        if (0..self.bounds.workers).any(|o| o != w && !s.books[o].pending.is_empty()) {
            found.stale_scans += 1;
        }
        let r = s.books[w].rebalance(&ctx, &view);
        if !r.steals.is_empty() {
            return Some(format!(
                "{} plans steals {:?} in a split",
                self.ids[w], r.steals
            ));
        }
        if !r.inherit.is_empty() {
            return Some(format!(
                "{} plans inherits {:?} with no non-member",
                self.ids[w], r.inherit
            ));
        }
        if r.handover.is_some() {
            return Some(format!("{} hands over with no request", self.ids[w]));
        }
        None
    }

    /// Worker `w`'s acquisition of shard `i` lands.
    fn land(&self, s: &mut State, w: usize, i: usize, found: &mut Found) {
        s.acquires += 1;
        if s.owners[i].is_none() {
            let t = s.next_token;
            s.next_token += 1;
            s.owners[i] = Some((w, t));
            if s.books[w].acquired(i, false, false) {
                s.books[w].hold(i, token(t));
            } else {
                s.owners[i] = None;
            }
        } else {
            found.refused += 1;
            s.books[w].not_acquired(i, false);
        }
    }

    fn check(&self, s: &State) -> Option<String> {
        for (w, b) in s.books.iter().enumerate() {
            let share = fair_share(self.bounds.shards, &self.ids, &self.ids[w]);
            if b.mine() > share {
                return Some(format!(
                    "{} holds or takes {} shards, above its share {share}",
                    self.ids[w],
                    b.mine()
                ));
            }
        }
        None
    }

    /// Lands everything in flight, then runs rounds of fresh scans until settled: the rounds
    /// it took, or what went wrong.
    fn settle(&self, s: &State, found: &mut Found) -> Result<usize, String> {
        let mut s = s.clone();
        self.land_all(&mut s, found);
        for round in 0..=SETTLE_ROUNDS {
            if self.settled(&s) {
                return Ok(round);
            }
            for w in 0..self.bounds.workers {
                if let Some(bad) = self.scan(&mut s, w, found) {
                    return Err(bad);
                }
                self.land_all(&mut s, found);
            }
        }
        if self.settled(&s) {
            return Ok(SETTLE_ROUNDS + 1);
        }
        Err(format!(
            "not settled after {SETTLE_ROUNDS} rounds of fresh scans: owners {:?}",
            s.owners
        ))
    }

    fn land_all(&self, s: &mut State, found: &mut Found) {
        for w in 0..self.bounds.workers {
            let pending: Vec<usize> = s.books[w].pending.iter().copied().collect();
            for i in pending {
                self.land(s, w, i, found);
            }
        }
    }

    fn settled(&self, s: &State) -> bool {
        let mut held: BTreeMap<usize, usize> = BTreeMap::new();
        for o in &s.owners {
            match o {
                Some((w, _)) => *held.entry(*w).or_default() += 1,
                None => return false,
            }
        }
        (0..self.bounds.workers).all(|w| {
            held.get(&w).copied().unwrap_or(0)
                == fair_share(self.bounds.shards, &self.ids, &self.ids[w])
        })
    }

    /// A canonical key of the state for the visited set.
    fn key(s: &State) -> String {
        let books: Vec<_> = s
            .books
            .iter()
            .map(|b| {
                (
                    b.held
                        .iter()
                        .map(|(i, h)| (*i, h.token))
                        .collect::<Vec<_>>(),
                    &b.pending,
                    &b.prev_free,
                    b.target,
                    &b.members,
                )
            })
            .collect();
        format!("{:?}|{books:?}|{:?}", s.owners, s.scans_left)
    }

    fn explore(&self) -> Found {
        let mut found = Found::default();
        let mut seen = HashSet::new();
        let mut stack = vec![self.initial()];
        while let Some(s) = stack.pop() {
            if !seen.insert(Model::key(&s)) {
                continue;
            }
            found.states += 1;
            if let Some(bad) = self.check(&s) {
                found.violations.push(bad);
                continue;
            }
            match self.settle(&s, &mut found) {
                Ok(rounds) => found.max_settle_rounds = found.max_settle_rounds.max(rounds),
                Err(bad) => {
                    found.violations.push(bad);
                    continue;
                }
            }
            let mut leaf = true;
            for w in 0..self.bounds.workers {
                if s.scans_left[w] > 0 {
                    let mut next = s.clone();
                    next.scans_left[w] -= 1;
                    leaf = false;
                    match self.scan(&mut next, w, &mut found) {
                        Some(bad) => found.violations.push(bad),
                        None => stack.push(next),
                    }
                }
                for &i in &s.books[w].pending {
                    let mut next = s.clone();
                    self.land(&mut next, w, i, &mut found);
                    leaf = false;
                    stack.push(next);
                }
            }
            if leaf {
                found.max_acquires = found.max_acquires.max(s.acquires);
            }
            if found.violations.len() > 20 {
                break;
            }
        }
        found
    }
}

fn run(bounds: Bounds) -> Found {
    let found = Model::new(bounds).explore();
    eprintln!(
        "{bounds:?}: {} states, {} stale scans, {} refused acquisitions, at most {} acquisitions \
         for {} shards, settled within {} rounds; violations: {:?}",
        found.states,
        found.stale_scans,
        found.refused,
        found.max_acquires,
        bounds.shards,
        found.max_settle_rounds,
        found.violations.first()
    );
    found
}

#[test]
fn every_interleaving_of_the_split_settles_without_overshoot_or_steals() {
    for (workers, shards, scans) in [(2, 6, 3), (3, 5, 2)] {
        let bounds = Bounds {
            workers,
            shards,
            scans,
            alone: None,
        };
        let found = run(bounds);
        assert!(
            found.violations.is_empty(),
            "{bounds:?}: {:?}",
            found.violations
        );
        // Coverage guard: scans that see other workers' acquisitions still in flight (the
        // stale views of a real split); without them the properties would hold vacuously.
        assert!(
            found.stale_scans > 0,
            "{bounds:?}: no scan with another worker's acquisitions in flight"
        );
        assert!(
            found.states > 100,
            "{bounds:?}: only {} states",
            found.states
        );
        // A split without contest: no acquisition is refused, one per shard in every execution.
        assert_eq!(found.refused, 0, "{bounds:?}: acquisitions were refused");
        assert_eq!(
            found.max_acquires, shards,
            "{bounds:?}: an execution made {} acquisitions for {shards} shards",
            found.max_acquires
        );
        assert!(
            found.max_settle_rounds <= 1,
            "{bounds:?}: {} rounds",
            found.max_settle_rounds
        );
    }
}

#[test]
fn a_member_that_believes_it_is_alone_is_caught() {
    let found = run(Bounds {
        workers: 3,
        shards: 5,
        scans: 2,
        alone: Some(0),
    });
    assert!(
        !found.violations.is_empty(),
        "a worker taking every shard went unnoticed"
    );
}
