use std::time::Duration;

use leasehold_core::{Error, FencingToken, OwnerId};
use proptest::prelude::*;
use tokio::time::Instant;

use super::entry::{Assigned, Entry, Term, fnv1a, group_of, judge_term, next_token, validate_set};
use crate::protocol::Record;

fn token(n: u64) -> FencingToken {
    FencingToken::new(n).unwrap()
}

#[test]
fn entries_round_trip_free_and_assigned() {
    let free = Entry {
        token: token(42),
        held: None,
    };
    assert_eq!(free.encode(), "42");
    assert_eq!(Entry::decode("g", "k", "42").unwrap(), free);
    let held = Entry {
        token: token(9001),
        held: Some(Assigned {
            inc: token(77),
            secs: 15,
            owner: OwnerId::new("worker-3:ab12").unwrap(),
        }),
    };
    assert_eq!(held.encode(), "9001 77 15 worker-3:ab12");
    assert_eq!(Entry::decode("g", "k", &held.encode()).unwrap(), held);
}

#[test]
fn malformed_entries_are_typed_errors_not_panics() {
    for bad in [
        "",
        "x",
        "0",
        "-1",
        "1 2",
        "1 2 3",
        "1 2 0 owner",
        "1 2 x owner",
        "1 0 3 owner",
        "1 2 3 owner extra",
        "1 2 3 ",
        "18446744073709551616",
    ] {
        let err = Entry::decode("grp", "key", bad).unwrap_err();
        assert!(matches!(err, Error::Backend { .. }), "{bad:?}: {err}");
        assert!(err.to_string().contains("key"), "{err}");
    }
}

#[test]
fn the_group_of_a_key_is_stable_and_in_range() {
    // Pinned: every process (and every version of this crate) must agree.
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(group_of("a", 16), 0xc);
    assert_eq!(group_of("anything", 1), 0);
    let mut counts = [0usize; 16];
    for i in 0..10_000 {
        counts[usize::from(group_of(&format!("shard-{i}"), 16))] += 1;
    }
    // Spread: no group gets more than twice its share.
    assert!(counts.iter().all(|&c| c > 300 && c < 1250), "{counts:?}");
}

#[test]
fn tokens_are_above_the_version_and_the_recorded_token() {
    assert_eq!(next_token(10, None).unwrap(), token(11));
    assert_eq!(next_token(10, Some(token(5))).unwrap(), token(11));
    assert_eq!(next_token(10, Some(token(20))).unwrap(), token(21));
    assert!(next_token(u64::MAX, None).is_err());
}

#[test]
fn set_names_are_checked() {
    for ok in ["shards", "a", "shard-set-1"] {
        assert!(validate_set(ok).is_ok(), "{ok}");
    }
    for bad in ["", "Shards", "-a", "a-", "a.b", "fence", &"x".repeat(41)] {
        assert!(
            matches!(validate_set(bad), Err(Error::Config { .. })),
            "{bad}"
        );
    }
}

fn record(holder: Option<&str>, token: Option<u64>, secs: u64) -> Record {
    Record {
        rv: 100,
        holder: holder.map(str::to_string),
        duration: Duration::from_secs(secs),
        token: token.map(|t| FencingToken::new(t).unwrap()),
        token_holder: holder.map(str::to_string),
    }
}

#[tokio::test(start_paused = true)]
async fn terms_are_judged_by_local_elapsed_time_since_first_seen() {
    let owner = OwnerId::new("w1").unwrap();
    let seen = Instant::now();
    let rec = record(Some("w1"), Some(7), 10);
    let at = |secs: u64| seen + Duration::from_secs(secs);
    assert_eq!(
        judge_term(&owner, token(7), Some((&rec, seen)), at(4)),
        Term::Live {
            remaining: Duration::from_secs(6),
            ttl: Duration::from_secs(10)
        }
    );
    assert_eq!(
        judge_term(&owner, token(7), Some((&rec, seen)), at(10)),
        Term::Expired
    );
    // Another term of the same owner, another holder, a free or missing Lease: over.
    assert_eq!(
        judge_term(&owner, token(6), Some((&rec, seen)), at(0)),
        Term::Over
    );
    let other = record(Some("w2"), Some(7), 10);
    assert_eq!(
        judge_term(&owner, token(7), Some((&other, seen)), at(0)),
        Term::Over
    );
    let free = record(None, Some(7), 10);
    assert_eq!(
        judge_term(&owner, token(7), Some((&free, seen)), at(0)),
        Term::Over
    );
    assert_eq!(judge_term(&owner, token(7), None, at(0)), Term::Over);
}

/// The greatest token ([`FencingToken`] stays within `i64`).
const MAX_TOKEN: u64 = i64::MAX as u64;

proptest! {
    #[test]
    fn any_entry_round_trips(t in 1u64..=MAX_TOKEN, inc in 1u64..=MAX_TOKEN, secs in 1u32..=86_400, owner in "[a-z0-9:._-]{1,40}") {
        let e = Entry { token: token(t), held: Some(Assigned { inc: token(inc), secs, owner: OwnerId::new(owner).unwrap() }) };
        prop_assert_eq!(Entry::decode("g", "k", &e.encode()).unwrap(), e);
    }

    #[test]
    fn decoding_never_panics(s in "\\PC{0,60}") {
        let _ = Entry::decode("g", "k", &s);
    }
}
