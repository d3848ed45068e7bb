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
#[derive(Debug, Default)]
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
}

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
    /// Rescan after an eighth of an interval rather than a whole one.
    pub(crate) soon: bool,
}

impl Book {
    /// Shards counted as ours: held and not being released, plus acquisitions in flight.
    pub(crate) fn mine(&self) -> usize {
        self.held.values().filter(|h| !h.releasing).count() + self.pending.len()
    }

    /// Whether nothing is held or being acquired (a leave is done).
    pub(crate) fn settled(&self) -> bool {
        self.held.is_empty() && self.pending.is_empty()
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
    /// our share (as of the last scan), up to the number asked, choosing as the thief did (its
    /// rank of each shard). The shards returned are marked as being released.
    pub(crate) fn answer(
        &mut self,
        ctx: &Ctx<'_>,
        owner: &str,
        token: FencingToken,
    ) -> Option<Handover> {
        let target = self.target?;
        let mine = self.mine();
        if self.answered == Some(token) || mine <= target {
            return None;
        }
        let (thief, n) = owner.rsplit_once('/')?;
        let n = n.parse::<usize>().ok()?;
        if thief == ctx.me {
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
        self.members = members;
        let handover = view
            .mailbox
            .as_ref()
            .and_then(|(owner, token)| self.answer(ctx, owner, *token));
        let unowned = (0..ctx.shards.len()).any(|i| unowned(ctx, view, &self.members, i));
        let tell_death = self.after_death(gone, woken, unowned);
        let (take, inherit) = self.handout(ctx, view);
        let steals = self.steal(ctx, view);
        let soon = self.follow_ups > 0;
        if soon {
            self.follow_ups -= 1;
        }
        Rebalance {
            handover,
            tell_death,
            take,
            inherit,
            steals,
            soon,
        }
    }

    /// After a death: whether to tell the others, and the quick rescans. A member gone with
    /// shards free or still held by non-members is a death (a graceful leaver told everyone
    /// itself): whoever notices it first on its own rebalance wakes the others, so that they
    /// take their parts now rather than up to an interval later; the members it wakes tell
    /// nobody in turn. After a death (told or woken), rescan every eighth of an interval while
    /// shards are still free or held by non-members, for one interval at most: members that
    /// scanned at different moments of the takeover hand its shards out from different views,
    /// and a shard each believes is another's would otherwise wait for the next interval's scans
    /// (it is taken by whoever sees it free on two scans in a row).
    fn after_death(&mut self, gone: bool, woken: bool, unowned: bool) -> bool {
        if (woken || gone) && unowned {
            self.follow_ups = 8;
        } else if !unowned {
            self.follow_ups = 0;
        }
        gone && !woken && unowned
    }

    /// Free shards (and shards held by non-members): handed out, in a way every worker with the
    /// same view computes alike, to the members furthest below their share (so concurrent takers
    /// do not collide); a shard seen free on two scans in a row is taken by whoever sees it, at
    /// most one share's worth per worker and interval. Returns the takes and the inherits
    /// (marked pending), and remembers the free shards for the next scan.
    fn handout(&mut self, ctx: &Ctx<'_>, view: &View) -> (Vec<usize>, Vec<usize>) {
        let k = ctx.shards.len();
        let members = &self.members;
        let target = fair_share(k, members, ctx.me);
        let mine = self.mine();
        let free: BTreeSet<usize> = (0..k)
            .filter(|i| view.owners[*i].is_none())
            .filter(|i| !self.held.contains_key(i) && !self.pending.contains(i))
            .collect();
        let mut have: BTreeMap<&str, usize> = BTreeMap::new();
        for (w, _) in view.owners.iter().flatten() {
            *have.entry(w.as_str()).or_default() += 1;
        }
        let mut deficit: Vec<(&str, usize)> = members
            .iter()
            .map(|m| {
                let h = have.get(m.as_str()).copied().unwrap_or(0);
                let h = if m == ctx.me { h.max(mine) } else { h };
                (m.as_str(), fair_share(k, members, m).saturating_sub(h))
            })
            .collect();
        // Shards held by a worker that is no longer a member (it left gracefully and is
        // draining them, or it died) are handed out alike, with the free ones; ours of them we
        // wait on, and take on their release wake-up (or expiry).
        let mut take: BTreeSet<usize> = BTreeSet::new();
        let mut inherit: Vec<usize> = Vec::new();
        for i in (0..k).filter(|i| unowned(ctx, view, members, *i)) {
            let Some(best) = deficit
                .iter_mut()
                .filter(|(_, d)| *d > 0)
                .max_by_key(|(m, d)| (*d, rank(m, ctx.name(i))))
            else {
                break;
            };
            best.1 -= 1;
            if best.0 == ctx.me {
                if free.contains(&i) {
                    take.insert(i);
                } else if !self.held.contains_key(&i) && !self.pending.contains(&i) {
                    inherit.push(i);
                }
            }
        }
        let mut extra = target.max(1);
        for i in &free {
            if extra == 0 {
                break;
            }
            if self.prev_free.contains(i) && take.insert(*i) {
                extra -= 1;
            }
        }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn shards(k: usize) -> Vec<(Arc<str>, LeaseKey)> {
        (0..k)
            .map(|i| {
                let name = format!("s{i}");
                let key = LeaseKey::new(&name).expect("legal");
                (Arc::from(name.as_str()), key)
            })
            .collect()
    }

    fn members(ids: &[&str]) -> Vec<String> {
        let mut m: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        m.sort();
        m
    }

    fn token(n: u64) -> FencingToken {
        FencingToken::new(n).expect("a legal token")
    }

    fn view(ms: &[&str], owners: Vec<Option<(String, FencingToken)>>) -> View {
        View {
            members: members(ms),
            owners,
            mailbox: None,
        }
    }

    fn config() -> ShardSetConfig {
        ShardSetConfig::new(Duration::from_secs(3)).with_max_steals(2)
    }

    /// A book that has seen `ms` on a scan before (so none of them is new or gone).
    fn book(ms: &[&str]) -> Book {
        Book {
            members: members(ms),
            ..Book::default()
        }
    }

    #[test]
    fn members_with_one_view_take_disjoint_shards_that_cover_the_set() {
        let (s, c) = (shards(10), config());
        let ms = ["a", "b", "c"];
        let v = view(&ms, vec![None; 10]);
        let mut all = BTreeSet::new();
        for me in ms {
            let mut b = book(&ms);
            let r = b.rebalance(
                &Ctx {
                    me,
                    shards: &s,
                    config: &c,
                },
                &v,
            );
            assert_eq!(
                r.take.len(),
                fair_share(10, &members(&ms), me),
                "{me}: {r:?}"
            );
            assert_eq!(b.pending.len(), r.take.len());
            for i in r.take {
                assert!(all.insert(i), "shard {i} taken twice");
            }
            assert!(r.steals.is_empty() && r.inherit.is_empty() && !r.tell_death);
        }
        assert_eq!(all.len(), 10);
    }

    #[test]
    fn a_request_is_answered_once_with_what_is_above_the_share_in_the_thiefs_rank_order() {
        let (s, c) = (shards(6), config());
        let ctx = Ctx {
            me: "a",
            shards: &s,
            config: &c,
        };
        let mut b = book(&["a", "b"]);
        for i in 0..6 {
            b.hold(i, token(i as u64 + 1));
        }
        b.target = Some(3);
        let h = b.answer(&ctx, "b/5", token(9)).expect("above its share");
        assert_eq!(h.thief, "b");
        assert_eq!(h.shards.len(), 3, "only what is above the share moves");
        let mut by_rank: Vec<usize> = (0..6).collect();
        by_rank.sort_by_key(|i| std::cmp::Reverse(rank("b", &format!("s{i}"))));
        assert_eq!(h.shards, by_rank[..3]);
        assert_eq!(b.mine(), 3);
        assert_eq!(b.answer(&ctx, "b/5", token(9)), None, "answered once");
        assert_eq!(b.answer(&ctx, "a/1", token(10)), None, "never to itself");
    }

    #[test]
    fn notes_wake_once_and_never_for_ones_own() {
        let mut b = Book::default();
        assert_eq!(b.note("a", "b/0", token(1)), Some(true));
        assert_eq!(b.note("a", "b/0", token(1)), Some(false));
        assert_eq!(b.note("a", "a/0", token(2)), Some(false));
        assert_eq!(b.note("a", "b/3", token(3)), None, "a steal request");
    }

    #[test]
    fn below_the_share_with_nothing_free_a_worker_steals_from_the_fullest_within_the_bound() {
        let (s, c) = (shards(12), config());
        let ms = ["a", "b", "c"];
        // b holds 8, c holds 4, a (new) nothing: a's share is 4, b is 4 above its own.
        let owners = (0..12)
            .map(|i| Some((if i < 8 { "b" } else { "c" }.to_string(), token(1))))
            .collect();
        let v = view(&ms, owners);
        let mut b = book(&ms);
        let r = b.rebalance(
            &Ctx {
                me: "a",
                shards: &s,
                config: &c,
            },
            &v,
        );
        assert!(r.take.is_empty());
        assert_eq!(r.steals.len(), 1);
        let (victim, list) = &r.steals[0];
        assert_eq!(victim, "b");
        assert_eq!(list.len(), 2, "at most max_steals in flight");
        assert_eq!(b.steals, 2);
        // The next scan, with both in flight, asks for nothing more.
        let r = b.rebalance(
            &Ctx {
                me: "a",
                shards: &s,
                config: &c,
            },
            &v,
        );
        assert!(r.steals.is_empty());
        b.not_acquired(list[0], true);
        b.not_acquired(list[1], true);
        assert!(
            b.retick,
            "a round of steals that ended calls the next one soon"
        );
    }

    #[test]
    fn a_death_is_told_by_whoever_sees_it_first_and_not_by_those_it_wakes() {
        let (s, c) = (shards(4), config());
        // c was a member on the last scan; now it is gone and shard 3 is still held by it.
        let mut owners: Vec<Option<(String, FencingToken)>> = vec![
            Some(("a".into(), token(1))),
            Some(("b".into(), token(1))),
            None,
        ];
        owners.push(Some(("c".into(), token(1))));
        let v = view(&["a", "b"], owners);
        let ctx = Ctx {
            me: "a",
            shards: &s,
            config: &c,
        };
        let mut told = book(&["a", "b", "c"]);
        let r = told.rebalance(&ctx, &v);
        assert!(r.tell_death && r.soon);
        assert_eq!(told.follow_ups, 7);
        let mut woken = book(&["a", "b", "c"]);
        woken.woken = true;
        let r = woken.rebalance(&ctx, &v);
        assert!(!r.tell_death && r.soon);
        // Between them, a and b take the free shard and wait on the dead worker's one.
        let rb = book(&["a", "b", "c"]).rebalance(&Ctx { me: "b", ..ctx }, &v);
        let mut got: Vec<usize> = [r.take, r.inherit, rb.take, rb.inherit].concat();
        got.sort();
        assert_eq!(got, vec![2, 3]);
    }

    #[test]
    fn a_leave_releases_every_held_shard_once_and_is_done_when_all_ended() {
        let mut b = Book::default();
        b.hold(0, token(1));
        b.hold(1, token(2));
        assert_eq!(b.leave(), vec![0, 1]);
        assert!(b.leave().is_empty());
        assert_eq!(b.mine(), 0);
        assert!(!b.ended(0, token(9)), "another ownership's end");
        assert!(b.ended(0, token(1)) && b.ended(1, token(2)));
        assert!(b.settled());
    }
}
