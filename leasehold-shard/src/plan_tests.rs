//! The plan's unit tests: every decision from a scan or an event, without a store.

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

/// A book that has seen `ms`, holds shards `0..n` (token `i + 1`) and whose last scan gave it a
/// share of `share`.
fn holding(ms: &[&str], n: usize, share: usize) -> Book {
    let mut b = book(ms);
    for i in 0..n {
        b.hold(i, token(i as u64 + 1));
    }
    b.target = Some(share);
    b
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
    let mut b = holding(&["a", "b"], 6, 3);
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

/// A request from a worker that joined after our last scan is answered at once, against the
/// share with it counted, not refused until our next scan (a join used to wait up to a whole
/// interval for the victims' scans before its first handover).
#[test]
fn a_request_from_a_member_we_have_not_scanned_yet_counts_it_in_the_share() {
    let (s, c) = (shards(6), config());
    let ctx = Ctx {
        me: "a",
        shards: &s,
        config: &c,
    };
    // Our last scan saw only "a" and "b": a share of 3, which we hold.
    let mut b = holding(&["a", "b"], 3, 3);
    // "c" joined since: with it the share is 2, so one shard is asked of us and handed over.
    let h = b
        .answer(&ctx, "c/2", token(9))
        .expect("above the share that counts c");
    assert_eq!((h.thief.as_str(), h.shards.len()), ("c", 1));
    assert_eq!(b.mine(), 2);
    // A member we know is answered against the share of the last scan, as before.
    let mut b = holding(&["a", "b"], 3, 3);
    assert_eq!(b.answer(&ctx, "b/2", token(10)), None, "at our share");
}

/// A member that takes the free shards it sees and still lacks part of its share rescans an
/// eighth of an interval later (when its takes have left the free set) and steals the rest
/// then, instead of a whole interval later.
#[test]
fn a_member_short_of_its_share_after_taking_the_free_shards_rescans_soon_to_steal() {
    let (s, c) = (shards(40), ShardSetConfig::new(Duration::from_secs(3)));
    let ms = ["w0", "w1", "w2"];
    let ctx = Ctx {
        me: "w2",
        shards: &s,
        config: &c,
    };
    let owners: Vec<Option<(String, FencingToken)>> = (0..40)
        .map(|i| match i {
            0..20 => Some(("w0".to_string(), token(i + 1))),
            20..33 => Some(("w1".to_string(), token(i + 1))),
            _ => None,
        })
        .collect();
    let mut b = book(&ms);
    let r = b.rebalance(&ctx, &view(&ms, owners.clone()));
    assert_eq!(
        r.take,
        (33..40).collect::<Vec<_>>(),
        "the free shards first"
    );
    assert!(r.steals.is_empty(), "no steal while shards are seen free");
    assert!(r.soon, "short of its share by 6: rescan soon");
    // The rescan: its takes landed, nothing is free, and w0 is 6 above its share.
    for i in 33..40 {
        assert!(b.acquired(i, false, false));
        b.hold(i, token(100 + i as u64));
    }
    let mut owners = owners;
    for (i, o) in owners.iter_mut().enumerate().skip(33) {
        *o = Some(("w2".to_string(), token(100 + i as u64)));
    }
    let r = b.rebalance(&ctx, &view(&ms, owners));
    let asked: usize = r.steals.iter().map(|(_, l)| l.len()).sum();
    assert_eq!((r.steals.len(), asked), (1, 6), "{:?}", r.steals);
    assert_eq!(r.steals[0].0, "w0");
    assert!(!r.soon);
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

/// Ten members over 1,000 shards whose acquisitions land slowly: every scan while they are in
/// flight finds each member's own in its own block, so nobody takes anything more (the herd
/// that went for the shards seen free twice, whatever it already held or was taking).
#[test]
fn while_acquisitions_land_every_member_finds_its_own_and_takes_nothing_more() {
    let (s, c) = (shards(1000), config());
    let ids: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
    let ms: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut books: Vec<Book> = ms.iter().map(|_| book(&ms)).collect();
    let mut owners: Vec<Option<(String, FencingToken)>> = vec![None; 1000];
    let mut taken = BTreeSet::new();
    for (me, b) in ms.iter().zip(&mut books) {
        let r = b.rebalance(
            &Ctx {
                me,
                shards: &s,
                config: &c,
            },
            &view(&ms, owners.clone()),
        );
        assert_eq!(r.take.len(), 100);
        for i in r.take {
            assert!(taken.insert(i), "shard {i} taken twice");
        }
    }
    // Scans while a third, then two thirds, of each member's takes have landed.
    for round in 1..=2 {
        for (me, b) in ms.iter().zip(&mut books) {
            let landed: Vec<usize> = b.pending.iter().copied().take(34 * round).collect();
            for i in landed {
                b.pending.remove(&i);
                b.hold(i, token(1));
                owners[i] = Some((me.to_string(), token(1)));
            }
        }
        for (me, b) in ms.iter().zip(&mut books) {
            let r = b.rebalance(
                &Ctx {
                    me,
                    shards: &s,
                    config: &c,
                },
                &view(&ms, owners.clone()),
            );
            assert!(
                r.take.is_empty() && r.steals.is_empty(),
                "round {round}: {me} took {:?} more, stole {:?}",
                r.take,
                r.steals
            );
            assert_eq!(b.mine(), 100);
        }
    }
}

/// A shard seen free on two scans in a row (its block's member did not take it) is taken by a
/// member below its share, up to what it lacks, and never by one at its share.
#[test]
fn a_shard_free_twice_is_taken_below_the_share_only_up_to_it() {
    let (s, c) = (shards(4), config());
    let ms = ["a", "b"];
    // a holds 0 and 1 (shares are 2 and 2), b holds 2: shard 3 is in b's block.
    let owners = vec![
        Some(("a".to_string(), token(1))),
        Some(("a".to_string(), token(1))),
        Some(("b".to_string(), token(1))),
        None,
    ];
    let v = view(&ms, owners);
    let ctx = Ctx {
        me: "a",
        shards: &s,
        config: &c,
    };
    // a is handing shard 1 over: below its share by its own count, though not in the view.
    let mut a = book(&ms);
    a.hold(0, token(1));
    a.hold(1, token(1));
    a.held.get_mut(&1).expect("held").releasing = true;
    assert!(a.rebalance(&ctx, &v).take.is_empty(), "not a's block");
    assert_eq!(
        a.rebalance(&ctx, &v).take,
        vec![3],
        "free twice, a below its share"
    );
    let mut full = book(&ms);
    full.hold(0, token(1));
    full.hold(1, token(1));
    assert!(full.rebalance(&ctx, &v).take.is_empty());
    assert!(
        full.rebalance(&ctx, &v).take.is_empty(),
        "at its share: never"
    );
}

/// Members joined since the scan before: takes and steals wait for a scan that sees the same
/// members as the one before, an eighth of an interval later, so that workers started over a
/// rollout take each shard once on the final membership instead of taking too much on an early
/// one and handing it over as the others arrive. A request in the mailbox is still answered.
#[test]
fn while_members_join_a_worker_defers_its_takes_until_two_scans_agree() {
    let (s, c) = (shards(8), config());
    let ctx = Ctx {
        me: "a",
        shards: &s,
        config: &c,
    };
    // The first scan: every member is new.
    let mut b = Book::default();
    let r = b.rebalance(&ctx, &view(&["a"], vec![None; 8]));
    assert!(r.take.is_empty() && r.steals.is_empty() && r.soon, "{r:?}");
    assert!(b.pending.is_empty());
    // b joined since: defer again.
    let r = b.rebalance(&ctx, &view(&["a", "b"], vec![None; 8]));
    assert!(r.take.is_empty() && r.soon, "{r:?}");
    // The same members twice: take the share of two.
    let r = b.rebalance(&ctx, &view(&["a", "b"], vec![None; 8]));
    assert_eq!(r.take.len(), 4, "{r:?}");
    // Holding more than its share when c joins: a steal request is answered while deferring.
    let mut b = holding(&["a", "b"], 4, 2);
    let mut v = view(&["a", "b", "c"], vec![None; 8]);
    v.mailbox = Some(("c/2".to_string(), token(40)));
    let r = b.rebalance(&ctx, &v);
    assert!(r.take.is_empty() && r.soon, "{r:?}");
    // a's share of 8 over three members is 3: one of its four goes.
    assert_eq!(r.handover.map(|h| h.shards.len()), Some(1));
}

/// A worker's first scan defers whatever the shards show, so it may read the members alone: a
/// view without owners defers as a full one does, the next scan reads the shards, a note that
/// woke the worker before its first scan makes it read everything, and a view without owners
/// that does not defer plans nothing but a rescan soon.
#[test]
fn a_first_scan_may_read_the_members_alone() {
    let (s, c) = (shards(8), config());
    let ctx = Ctx {
        me: "a",
        shards: &s,
        config: &c,
    };
    let mut b = Book::default();
    assert!(b.first_scan_defers());
    let r = b.rebalance(&ctx, &view(&["a", "b"], Vec::new()));
    assert!(r.deferred && r.soon && r.take.is_empty(), "{r:?}");
    assert!(
        !b.first_scan_defers(),
        "members seen: the next scan reads the shards"
    );
    let r = b.rebalance(&ctx, &view(&["a", "b"], vec![None; 8]));
    assert_eq!(r.take.len(), 4, "{r:?}");
    let woken = Book {
        woken: true,
        ..Book::default()
    };
    assert!(!woken.first_scan_defers());
    let mut m = book(&["a", "b"]);
    let r = m.rebalance(&ctx, &view(&["a", "b"], Vec::new()));
    assert!(
        !r.deferred
            && r.soon
            && r.take.is_empty()
            && r.inherit.is_empty()
            && r.steals.is_empty()
            && !r.tell_death,
        "{r:?}"
    );
}

/// A departure is never deferred, even with a join in the same scan: a dead member's shards must
/// be owned again within TTL plus one interval.
#[test]
fn a_departure_is_acted_on_at_once_even_with_a_join_in_the_same_scan() {
    let (s, c) = (shards(6), config());
    let ctx = Ctx {
        me: "a",
        shards: &s,
        config: &c,
    };
    let mut b = book(&["a", "b", "c"]);
    // c is gone and d joined; the shards are free (c's expired).
    let r = b.rebalance(&ctx, &view(&["a", "b", "d"], vec![None; 6]));
    assert_eq!(r.take.len(), 2, "{r:?}");
    assert!(r.tell_death);
}

/// Deferring ends after `MAX_DEFERRED` rescans in a row: a membership that never settles does
/// not keep shards unowned.
#[test]
fn a_membership_that_keeps_changing_defers_at_most_max_deferred_rescans() {
    let (s, c) = (shards(4), config());
    let ctx = Ctx {
        me: "a",
        shards: &s,
        config: &c,
    };
    let mut b = book(&["a"]);
    let mut ms: Vec<String> = vec!["a".to_string()];
    for n in 0..=MAX_DEFERRED {
        ms.push(format!("j{n}"));
        let ids: Vec<&str> = ms.iter().map(String::as_str).collect();
        let r = b.rebalance(&ctx, &view(&ids, vec![None; 4]));
        if n < MAX_DEFERRED {
            assert!(r.take.is_empty(), "rescan {n}: {r:?}");
        } else {
            let share = fair_share(4, &members(&ids), "a");
            assert_eq!(r.take.len(), share, "past the bound: {r:?}");
        }
    }
}
