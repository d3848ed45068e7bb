//! The pure parts of the grouped mode: a key's entry and its encoding, the group of a key, the
//! token of a grant, and the judgement of an owner's term from its membership Lease.

use std::time::Duration;

use leasehold_core::backend::{corrupt, decode_token};
use leasehold_core::{Error, FencingToken, OwnerId, Result};
use tokio::time::Instant;

use super::MAX_SET_LEN;
use crate::error::BACKEND;
use crate::protocol::Record;
use crate::store::expired;

/// One key's entry in its group object: the key's last token (kept after release, so that the
/// entry also records the key's generation) and, while assigned, whom to and under which term
/// of which membership Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) token: FencingToken,
    pub(crate) held: Option<Assigned>,
}

/// An assignment: the owner, the token of the owner's membership Lease when the key was granted
/// (the term, "incarnation"), and the TTL in seconds (which membership Lease: one per owner and
/// TTL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Assigned {
    pub(crate) inc: FencingToken,
    pub(crate) secs: u32,
    pub(crate) owner: OwnerId,
}

impl Entry {
    /// `TOKEN` for a free key, `TOKEN INCARNATION SECONDS OWNER` for an assigned one (an owner
    /// id has no whitespace, so the encoding is unambiguous).
    pub(crate) fn encode(&self) -> String {
        match &self.held {
            None => self.token.get().to_string(),
            Some(a) => format!(
                "{} {} {} {}",
                self.token.get(),
                a.inc.get(),
                a.secs,
                a.owner.as_str()
            ),
        }
    }

    /// The entry of `key` in group `group`, or a corrupt-record error naming both.
    pub(crate) fn decode(group: &str, key: &str, text: &str) -> Result<Entry> {
        let bad = |what: &str| corrupt(BACKEND, key, format_args!("group {group:?}: {what}"));
        let parts: Vec<&str> = text.split(' ').collect();
        let token = |s: &str| -> Result<FencingToken> {
            let n: u64 = s.parse().map_err(|_| bad("token is not a number"))?;
            decode_token(BACKEND, key, n)
        };
        match parts.as_slice() {
            [t] => Ok(Entry {
                token: token(t)?,
                held: None,
            }),
            [t, inc, secs, owner] => Ok(Entry {
                token: token(t)?,
                held: Some(Assigned {
                    inc: token(inc)?,
                    secs: secs
                        .parse()
                        .ok()
                        .filter(|s| *s > 0)
                        .ok_or_else(|| bad("TTL is not a positive number of seconds"))?,
                    owner: OwnerId::new(*owner)
                        .map_err(|_| bad("owner is not a legal owner id"))?,
                }),
            }),
            _ => Err(bad("entry is neither `TOKEN` nor `TOKEN INC SECS OWNER`")),
        }
    }
}

/// FNV-1a, 64 bits: a hash that never changes between builds or platforms (the group of a key
/// and the name of an owner's membership Lease must be computed alike by every process).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The group (0..groups) that holds `key`'s entry.
pub(crate) fn group_of(key: &str, groups: u16) -> u16 {
    // The remainder is below `groups`, a u16.
    u16::try_from(fnv1a(key.as_bytes()) % u64::from(groups.max(1))).unwrap_or(0)
}

/// The token of a grant written by a replace conditioned on group version `rv`: above that
/// version (every token issued in the group so far is at most its current version, and the
/// replace writes a version above `rv`) and above the key's recorded token.
pub(crate) fn next_token(rv: u64, previous: Option<FencingToken>) -> Result<FencingToken> {
    let at_least = rv.checked_add(1).ok_or_else(|| {
        Error::store_fault(BACKEND, format!("resourceVersion {rv} overflows"), None)
    })?;
    let floor = previous.map_or(0, |p| p.get().saturating_add(1));
    FencingToken::new(at_least.max(floor))
}

/// What a reader concludes about an owner's term from the owner's membership Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Term {
    /// The Lease names the owner with the term's token and this store has not yet seen it
    /// unchanged for its duration: the keys of the term are held.
    Live { remaining: Duration, ttl: Duration },
    /// The Lease still names the owner with the term's token, but this store has seen it
    /// unchanged for its whole duration: the term may be ended (revoked) by a conditional write.
    Expired,
    /// The Lease is gone, free, or names another holder or token: the term is over for good
    /// (tokens never go back, so that term never returns).
    Over,
}

/// Judges the term `inc` of `owner` from the owner's membership Lease record as this store read
/// it (`None`: no such object) and first saw it (`first_seen`, on this store's monotonic clock),
/// at `now`. Never compares timestamps written by other hosts.
pub(crate) fn judge_term(
    owner: &OwnerId,
    inc: FencingToken,
    read: Option<(&Record, Instant)>,
    now: Instant,
) -> Term {
    let Some((rec, first_seen)) = read else {
        return Term::Over;
    };
    if !rec.is_held_by(owner, inc) {
        return Term::Over;
    }
    if expired(rec, first_seen, now) {
        Term::Expired
    } else {
        Term::Live {
            remaining: (first_seen + rec.duration).saturating_duration_since(now),
            ttl: rec.duration,
        }
    }
}

/// Checks a set name: a DNS-1123 label of at most [`MAX_SET_LEN`] bytes, not `fence` (whose
/// group names could meet the fenced resource's ConfigMaps).
pub(crate) fn validate_set(set: &str) -> Result<()> {
    let ok = !set.is_empty()
        && set.len() <= MAX_SET_LEN
        && set
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !set.starts_with('-')
        && !set.ends_with('-')
        && set != "fence";
    if ok {
        Ok(())
    } else {
        Err(Error::config(
            BACKEND,
            format!(
                "set name {set:?} must be a DNS-1123 label (lowercase letters, digits, '-') of 1 to {MAX_SET_LEN} bytes, and not \"fence\""
            ),
            None,
        ))
    }
}
