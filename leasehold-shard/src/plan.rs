//! The pure plan: given what a scan saw, or what an event says, what a worker does next (take,
//! inherit, steal, hand over, drain, rescan soon). No I/O, no timers, no tasks: the
//! [driver](crate::driver) reads the store, steps the worker's [`Book`] with it and carries out
//! what the step returns. Every decision of a rebalance is here and unit-tested without a store.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use leasehold_core::{FencingToken, LeaseKey};

use crate::{ShardSetConfig, fair_share};

/// A stable pseudo-random rank of `shard` for `worker` (FNV-1a): spreads concurrent takers over
/// different shards, and lets a thief and its victim pick the same shards by it.
pub(crate) fn rank(worker: &str, shard: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in worker.bytes().chain([0u8]).chain(shard.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// What one scan of the store saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct View {
    /// Live members, sorted; two instances of one id are one member.
    pub(crate) members: Vec<String>,
    /// Each shard's owner (its id) and token, by shard index; `None` if free.
    pub(crate) owners: Vec<Option<(String, FencingToken)>>,
    /// The request in the mailbox: its owner (`THIEF/N`) and token.
    pub(crate) mailbox: Option<(String, FencingToken)>,
}

/// A shard the worker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    /// The token of this ownership.
    pub(crate) token: FencingToken,
    /// A planned release (handover or leave) has started: no longer counted as ours.
    pub(crate) releasing: bool,
}

/// Who plans: the worker's id, the set's shards and configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    /// The worker's id.
    pub(crate) me: &'a str,
    /// The set's shards (name and key), by index.
    pub(crate) shards: &'a [(Arc<str>, LeaseKey)],
    /// The set's configuration (the steal bound).
    pub(crate) config: &'a ShardSetConfig,
}

impl Ctx<'_> {
    fn name(&self, idx: usize) -> &str {
        &self.shards[idx].0
    }
}

/// The worker's book: everything its decisions depend on besides the scan.
#[derive(Debug, Default, Clone)]
pub(crate) struct Book {
    /// The shards held, by index.
    pub(crate) held: BTreeMap<usize, Held>,
    /// Acquisitions in flight (takes, inherits, steals), by shard index.
    pub(crate) pending: BTreeSet<usize>,
    /// Shards being stolen (in `pending`), the steal bound's count.
    pub(crate) steals: usize,
    /// The shards free on the last scan.
    pub(crate) prev_free: BTreeSet<usize>,
    /// The mailbox request (its token) this worker last answered: each is answered once.
    pub(crate) answered: Option<FencingToken>,
    /// Our fair share as of the last scan (what a mailbox request is answered against).
    pub(crate) target: Option<usize>,
    /// The members as of the last scan (told of a graceful leave).
    pub(crate) members: Vec<String>,
    /// A round of steals just ended below our share.
    pub(crate) retick: bool,
    /// The next rebalance was called by another member's note (`WORKER/0`: it left, or it saw a
    /// member die): that rebalance tells nobody in turn.
    pub(crate) woken: bool,
    /// Quick rescans left after a death while its shards are not all owned again.
    pub(crate) follow_ups: u8,
    /// Rebalances deferred in a row because members joined since the scan before.
    pub(crate) deferred: u8,
}

/// The most rebalances in a row a worker defers while members keep joining: an interval of
/// rescans an eighth of an interval apart. Past it, a worker takes and steals on the membership
/// it sees, so that a membership that never settles (workers joining and leaving without end)
/// does not keep shards unowned.
pub(crate) const MAX_DEFERRED: u8 = 8;

/// Shards to hand over to `thief` (a request in our mailbox).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handover {
    /// The thief's id.
    pub(crate) thief: String,
    /// The shards to release to it, by index.
    pub(crate) shards: Vec<usize>,
}

/// What one rebalance decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Rebalance {
    /// Shards to hand over now (the request in the mailbox).
    pub(crate) handover: Option<Handover>,
    /// A member died: tell the others ([`Book::members`]) so that they take its shards now.
    pub(crate) tell_death: bool,
    /// Free shards to try once each.
    pub(crate) take: Vec<usize>,
    /// Shards held by non-members to wait on and take on their release or expiry.
    pub(crate) inherit: Vec<usize>,
    /// Steal requests: the victim and the shards asked of it.
    pub(crate) steals: Vec<(String, Vec<usize>)>,
    /// Rescan after an eighth of an interval rather than a whole one (after a death, or short
    /// of the share with free shards seen).
    pub(crate) soon: bool,
    /// The takes and steals were deferred: members joined since the scan before (rescan an
    /// eighth of an interval later).
    pub(crate) deferred: bool,
}

/// The longest wait between a join and its first scan (an eighth of the rebalance interval where
/// that is shorter): workers started together by one deployment take their membership slots
/// within moments of each other, whatever the TTL. The deferral's rescans that follow are an
/// eighth of an interval apart whatever its length, since a rollout's joins come up to a tenth
/// of an interval apart and a rescan must see one to go on deferring.
pub(crate) const JOIN_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

impl Book {
    /// Shards counted as ours: held and not being released, plus acquisitions in flight.
    pub(crate) fn mine(&self) -> usize {
        self.held.values().filter(|h| !h.releasing).count() + self.pending.len()
    }

    /// Whether nothing is held or being acquired (a leave is done).
    pub(crate) fn settled(&self) -> bool {
        self.held.is_empty() && self.pending.is_empty()
    }

    /// Before a scan: whether it is a first scan that will defer whatever the shards show, so
    /// that it may read the membership slots and the mailbox alone (a view without owners).
    /// After a join the first scan sees every member as new, itself included, and defers
    /// ([`defer`](Self::defer)) unless a note woke it: its read of every shard would go unused,
    /// and on a set of 10,000 shards that read is most of what the store serves per worker.
    pub(crate) fn first_scan_defers(&self) -> bool {
        self.members.is_empty()
            && !self.woken
            && self.follow_ups == 0
            && self.deferred < MAX_DEFERRED
    }

    /// Before a scan: whether to skip it and rescan an eighth of an interval later. A quick
    /// rescan after a death is for a member still below its share (its handout fell short of
    /// what the others' views left it): at its share, counting its acquisitions in flight, a
    /// member leaves the store to the members still taking (on SQLite the scans of 10,000 keys
    /// share one process and one write queue with their acquisitions) and rescans at the usual
    /// cadence.
    pub(crate) fn skip_scan(&mut self) -> bool {
        if self.follow_ups > 0 && !self.woken && self.target.is_some_and(|t| self.mine() >= t) {
            self.follow_ups -= 1;
            return true;
        }
        false
    }

    /// A mailbox holder `owner` with `token`, read on the mailbox's watch: `Some(new)` if it is
    /// a note (`WORKER/0`: that worker is leaving, or it saw a member die), `new` if it is
    /// another member's and not seen before; `None` if it is a steal request (answer it).
    pub(crate) fn note(&mut self, me: &str, owner: &str, token: FencingToken) -> Option<bool> {
        let (who, "0") = owner.rsplit_once('/')? else {
            return None;
        };
        let new = who != me && self.answered != Some(token);
        self.answered = Some(token);
        Some(new)
    }

    /// Answers the request `owner` (`THIEF/N`) with `token`, once: hands over what we have above
    /// our share, up to the number asked, choosing as the thief did (its rank of each shard).
    /// The share is that of the last scan's members, with the thief counted if that scan did not
    /// see it (it joined since: waiting for our next scan to count it would hold its join up to
    /// an interval). The shards returned are marked as being released.
    pub(crate) fn answer(
        &mut self,
        ctx: &Ctx<'_>,
        owner: &str,
        token: FencingToken,
    ) -> Option<Handover> {
        let scanned = self.target?;
        let (thief, n) = owner.rsplit_once('/')?;
        let n = n.parse::<usize>().ok()?;
        if thief == ctx.me {
            return None;
        }
        let target = if self.members.iter().any(|m| m == thief) {
            scanned
        } else {
            let mut members = self.members.clone();
            members.push(thief.to_string());
            members.sort();
            fair_share(ctx.shards.len(), &members, ctx.me)
        };
        let mine = self.mine();
        if self.answered == Some(token) || mine <= target {
            return None;
        }
        self.answered = Some(token);
        let mut ours: Vec<usize> = self
            .held
            .iter()
            .filter(|(_, h)| !h.releasing)
            .map(|(i, _)| *i)
            .collect();
        ours.sort_by_key(|i| std::cmp::Reverse(rank(thief, ctx.name(*i))));
        ours.truncate(n.min(mine - target));
        for i in &ours {
            if let Some(h) = self.held.get_mut(i) {
                h.releasing = true;
            }
        }
        Some(Handover {
            thief: thief.to_string(),
            shards: ours,
        })
    }

    /// A leave: every shard held and not yet being released is to be released now.
    pub(crate) fn leave(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, h) in self.held.iter_mut().filter(|(_, h)| !h.releasing) {
            h.releasing = true;
            out.push(*i);
        }
        out
    }

    /// An acquisition of `idx` failed (a steal's, or not).
    pub(crate) fn not_acquired(&mut self, idx: usize, steal: bool) {
        self.pending.remove(&idx);
        if steal {
            self.steals = self.steals.saturating_sub(1);
            self.retick |= self.steals == 0;
        }
    }

    /// An acquisition of `idx` succeeded: whether to keep it (not while `leaving`, nor a
    /// duplicate); if kept, [`Book::hold`] it.
    pub(crate) fn acquired(&mut self, idx: usize, steal: bool, leaving: bool) -> bool {
        self.pending.remove(&idx);
        if steal {
            self.steals = self.steals.saturating_sub(1);
            self.retick |= self.steals == 0 && self.target.is_some_and(|t| self.mine() + 1 < t);
        }
        !leaving && !self.held.contains_key(&idx)
    }

    /// We own `idx` with `token` now.
    pub(crate) fn hold(&mut self, idx: usize, token: FencingToken) {
        self.held.insert(
            idx,
            Held {
                token,
                releasing: false,
            },
        );
    }

    /// The ownership of `idx` with `token` ended: whether it was the one held.
    pub(crate) fn ended(&mut self, idx: usize, token: FencingToken) -> bool {
        if self.held.get(&idx).is_some_and(|h| h.token == token) {
            self.held.remove(&idx);
            return true;
        }
        false
    }

    /// One rebalance over `view`: records the new members and share, answers the mailbox, and
    /// plans the takes, inherits and steals (marking them pending).
    pub(crate) fn rebalance(&mut self, ctx: &Ctx<'_>, view: &View) -> Rebalance {
        let mut members = view.members.clone();
        if !members.iter().any(|m| m == ctx.me) {
            members.push(ctx.me.to_string());
            members.sort();
        }
        let target = fair_share(ctx.shards.len(), &members, ctx.me);
        self.target = Some(target);
        // Members of the last scan that are gone now (a membership that expired or was given
        // up), told to the others if they left shards to take.
        let woken = std::mem::take(&mut self.woken);
        let gone = self
            .members
            .iter()
            .any(|m| m != ctx.me && !members.contains(m));
        let joined = members.iter().any(|m| !self.members.contains(m));
        self.members = members;
        let handover = view
            .mailbox
            .as_ref()
            .and_then(|(owner, token)| self.answer(ctx, owner, *token));
        if self.defer(joined, gone || woken) {
            return Rebalance {
                handover,
                soon: true,
                deferred: true,
                ..Rebalance::default()
            };
        }
        // A view of the members alone (see `first_scan_defers`) plans nothing more: rescan soon,
        // reading the shards.
        if view.owners.len() != ctx.shards.len() {
            return Rebalance {
                handover,
                soon: true,
                ..Rebalance::default()
            };
        }
        let unowned = (0..ctx.shards.len()).any(|i| unowned(ctx, view, &self.members, i));
        let tell_death = self.after_death(gone, woken, unowned);
        let (take, inherit) = self.handout(ctx, view);
        let steals = self.steal(ctx, view);
        // Short of the share with free shards seen (and taken, as far as they were ours):
        // steals wait for a scan that sees none free, which an eighth of an interval brings once
        // the takes have landed, rather than a whole interval.
        let short = !self.prev_free.is_empty() && self.mine() < target;
        let soon = self.follow_ups > 0 || short;
        if self.follow_ups > 0 {
            self.follow_ups -= 1;
        }
        Rebalance {
            handover,
            tell_death,
            take,
            inherit,
            steals,
            soon,
            deferred: false,
        }
    }

    /// Whether to defer this rebalance's takes and steals to a rescan an eighth of an interval
    /// later: members `joined` since the scan before (all of them, on a worker's first scan),
    /// and none `left` (a member gone, or a note that one left or died: its shards are taken
    /// now, within the death bound). Shares computed while workers are still joining are too
    /// large: every shard taken on them moves again, by a steal and its drain, as the later
    /// joiners arrive. Deferring until a scan an eighth of an interval after the one before sees
    /// the same members, for at most [`MAX_DEFERRED`] rescans in a row, lets workers started
    /// over a rollout of up to an interval (ten workers: one every tenth of it) take each shard
    /// once, from one membership that every member sees alike.
    fn defer(&mut self, joined: bool, left: bool) -> bool {
        if joined && !left && self.follow_ups == 0 && self.deferred < MAX_DEFERRED {
            self.deferred += 1;
            self.prev_free.clear();
            return true;
        }
        self.deferred = 0;
        false
    }

    /// After a death: whether to tell the others, and the quick rescans. A member gone with
    /// shards free or still held by non-members is a death (a graceful leaver told everyone
    /// itself): whoever notices it first on its own rebalance wakes the others, so that they
    /// take their parts now rather than up to an interval later; the members it wakes tell
    /// nobody in turn. After a death (told or woken), rescan every eighth of an interval while
    /// shards are still free or held by non-members, for one interval at most: members that
    /// scanned at different moments of the takeover hand its shards out from different views,
    /// and a shard each believes is another's would otherwise wait for the next interval's scans
    /// (it is taken by whoever sees it free on two scans in a row while below its share).
    fn after_death(&mut self, gone: bool, woken: bool, unowned: bool) -> bool {
        if (woken || gone) && unowned {
            self.follow_ups = 8;
        } else if !unowned {
            self.follow_ups = 0;
        }
        gone && !woken && unowned
    }

    /// Free shards (and shards held by non-members): handed out in blocks that every member
    /// computes alike from the same scan (see [`block`]), each member taking its own block up to
    /// its share, counting its acquisitions in flight. A shard seen free on two scans in a row
    /// (its block's member did not take it: its view differed, or it is gone) is taken by whoever
    /// sees it while still below its share, in its own rank order; never beyond the share, so
    /// workers at their share do not all go for the same shards (which the steals that follow
    /// would move back). Returns the takes and the inherits (marked pending), and remembers the
    /// free shards for the next scan.
    fn handout(&mut self, ctx: &Ctx<'_>, view: &View) -> (Vec<usize>, Vec<usize>) {
        let k = ctx.shards.len();
        let members = &self.members;
        let mut room = fair_share(k, members, ctx.me).saturating_sub(self.mine());
        let free: BTreeSet<usize> = (0..k)
            .filter(|i| view.owners[*i].is_none())
            .filter(|i| !self.held.contains_key(i) && !self.pending.contains(i))
            .collect();
        // Shards held by a worker that is no longer a member (it left gracefully and is
        // draining them, or it died) are handed out alike, with the free ones; ours of them we
        // wait on, and take on their release wake-up (or expiry).
        let mut take: BTreeSet<usize> = BTreeSet::new();
        let mut inherit: Vec<usize> = Vec::new();
        for i in block(ctx, view, members) {
            if room == 0 {
                break;
            }
            if free.contains(&i) {
                take.insert(i);
            } else if !self.held.contains_key(&i) && !self.pending.contains(&i) {
                inherit.push(i);
            } else {
                continue;
            }
            room -= 1;
        }
        let mut again: Vec<usize> = free
            .intersection(&self.prev_free)
            .filter(|i| !take.contains(i))
            .copied()
            .collect();
        again.sort_by_key(|i| std::cmp::Reverse(rank(ctx.me, ctx.name(*i))));
        take.extend(again.into_iter().take(room));
        self.prev_free = free;
        self.pending.extend(take.iter().copied());
        self.pending.extend(inherit.iter().copied());
        (take.into_iter().collect(), inherit)
    }

    /// Steals: below our share with nothing free, from the members most above their own, at
    /// most the steal bound in flight, one request per victim at a time; the shards asked of a
    /// victim are those the thief ranks first (marked pending).
    fn steal(&mut self, ctx: &Ctx<'_>, view: &View) -> Vec<(String, Vec<usize>)> {
        let k = ctx.shards.len();
        let members = &self.members;
        let target = fair_share(k, members, ctx.me);
        let max_steals = ctx.config.max_steals(target);
        let mut out = Vec::new();
        if self.mine() >= target || self.steals >= max_steals || !self.prev_free.is_empty() {
            return out;
        }
        let mut lists: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, o) in view.owners.iter().enumerate() {
            if let Some((owner, _)) = o {
                lists.entry(owner.as_str()).or_default().push(i);
            }
        }
        let mut victims: Vec<(usize, &str, Vec<usize>)> = lists
            .into_iter()
            .filter(|(w, _)| *w != ctx.me && members.iter().any(|m| m == *w))
            .map(|(w, list)| {
                let excess = list.len().saturating_sub(fair_share(k, members, w));
                (excess, w, list)
            })
            .filter(|(excess, _, _)| *excess > 0)
            .collect();
        victims.sort_by_key(|(excess, w, _)| (std::cmp::Reverse(*excess), *w));
        let mut want = target - self.mine();
        for (excess, victim, mut list) in victims {
            let room = max_steals.saturating_sub(self.steals).min(want).min(excess);
            if room == 0 {
                break;
            }
            list.retain(|i| !self.pending.contains(i));
            list.sort_by_key(|i| std::cmp::Reverse(rank(ctx.me, ctx.name(*i))));
            list.truncate(room);
            if list.is_empty() {
                continue;
            }
            self.steals += list.len();
            want -= list.len();
            self.pending.extend(list.iter().copied());
            out.push((victim.to_string(), list));
        }
        out
    }
}

/// Whether shard `i` is free or held by a worker that is not one of `members` (it left or died).
fn unowned(ctx: &Ctx<'_>, view: &View, members: &[String], i: usize) -> bool {
    match &view.owners[i] {
        None => true,
        Some((w, _)) => w != ctx.me && !members.iter().any(|m| m == w),
    }
}

/// This worker's block of the shards to hand out (free, or held by non-members), from `view`
/// alone, so that every member with the same view computes the same blocks: the shards in index
/// order, cut into consecutive blocks, one per member in id order, each as long as what the
/// member lacks of its share as the view shows it. The blocks are stable while acquisitions
/// land: a shard its member takes leaves the pool together with one of that member's lack, so
/// the other blocks stay as they were, and a member's next scan finds its own acquisitions in
/// flight in its own block rather than another's.
fn block(ctx: &Ctx<'_>, view: &View, members: &[String]) -> Vec<usize> {
    let k = ctx.shards.len();
    let mut have: BTreeMap<&str, usize> = BTreeMap::new();
    for (w, _) in view.owners.iter().flatten() {
        *have.entry(w.as_str()).or_default() += 1;
    }
    let pool: Vec<usize> = (0..k).filter(|i| unowned(ctx, view, members, *i)).collect();
    let mut start: usize = 0;
    for m in members {
        let lack =
            fair_share(k, members, m).saturating_sub(have.get(m.as_str()).copied().unwrap_or(0));
        let end = start.saturating_add(lack).min(pool.len());
        if m == ctx.me {
            return pool[start..end].to_vec();
        }
        start = end;
    }
    Vec::new()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
