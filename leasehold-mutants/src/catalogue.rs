//! The mutants: for each backend, changes to the text or the condition that decides safety. A
//! text mutant names a switch point (`leasehold_core::mutation::text`/`string`) and a
//! substitution made at it; a code mutant names a switch point of `leasehold_core::mutation::on`.

/// What a mutant changes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change {
    /// Every occurrence of `find` in the site's text becomes `replace`.
    Text {
        find: &'static str,
        replace: &'static str,
    },
    /// The site's `mutation::on` returns true.
    Code,
}

/// One mutant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mutant {
    /// Unique name: `<backend>.<site part>.<what>`.
    pub(crate) name: &'static str,
    /// The backend whose suites run it (`postgres`, `redis`, `etcd`, `k8s`, `sqlite`, `mysql`).
    pub(crate) backend: &'static str,
    /// The switch point.
    pub(crate) site: &'static str,
    /// The change made there.
    pub(crate) change: Change,
    /// What the change breaks, in words.
    pub(crate) what: &'static str,
    /// For a mutant expected to survive: why no test can tell it from the original.
    pub(crate) equivalent: Option<&'static str>,
    /// A control of the program itself: it must survive (the identity) to make a run valid.
    pub(crate) control: bool,
}

const fn text(
    name: &'static str,
    backend: &'static str,
    site: &'static str,
    find: &'static str,
    replace: &'static str,
    what: &'static str,
) -> Mutant {
    Mutant {
        name,
        backend,
        site,
        change: Change::Text { find, replace },
        what,
        equivalent: None,
        control: false,
    }
}

const fn code(name: &'static str, backend: &'static str, what: &'static str) -> Mutant {
    Mutant {
        name,
        backend,
        site: name,
        change: Change::Code,
        what,
        equivalent: None,
        control: false,
    }
}

const fn equivalent(mut m: Mutant, why: &'static str) -> Mutant {
    m.equivalent = Some(why);
    m
}

const FLOOR: &str =
    "greatest(l.fencing_token + 1, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint)";

/// The token a MySQL grant of a key that has a row writes (`Statements::acquire_free`): above
/// the old one and at least the server clock in µs.
const MY_GRANT_TOKEN: &str = "GREATEST(fencing_token + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))";

/// Every mutant, controls first.
pub(crate) const MUTANTS: &[Mutant] = &[
    // The control: a substitution that changes nothing. It is applied (the hits file says so)
    // and must survive every suite; a run in which it is killed is invalid.
    Mutant {
        name: "control.identity",
        backend: "sqlite",
        site: "sqlite.acquire",
        change: Change::Text {
            find: "RETURNING token",
            replace: "RETURNING token",
        },
        what: "nothing (the program's control: must survive)",
        equivalent: Some("the identity: it changes nothing"),
        control: true,
    },
    // ---- PostgreSQL: the statements (protocol.rs) and the triggers (sql/leases.sql.template).
    text(
        "postgres.acquire_free.no_expiry_guard",
        "postgres",
        "postgres.acquire_free",
        "AND (l.lease_until <= statement_timestamp() OR",
        "AND (true OR l.lease_until <= statement_timestamp() OR",
        "drop the guard: the fast-path grant takes a live key from its holder",
    ),
    text(
        "postgres.acquire_free.expiry_flipped",
        "postgres",
        "postgres.acquire_free",
        "l.lease_until <= statement_timestamp()",
        "l.lease_until > statement_timestamp()",
        "flip the expiry comparison of the fast-path grant",
    ),
    text(
        "postgres.acquire_free.owner_flipped",
        "postgres",
        "postgres.acquire_free",
        "OR l.owner = $2)",
        "OR l.owner <> $2)",
        "flip the same-owner comparison: any other owner may take a live key",
    ),
    text(
        "postgres.acquire_free.reuse_token",
        "postgres",
        "postgres.acquire_free",
        FLOOR,
        "l.fencing_token",
        "reuse the old token on a grant",
    ),
    equivalent(
        text(
            "postgres.acquire_free.no_clock_floor",
            "postgres",
            "postgres.acquire_free",
            FLOOR,
            "l.fencing_token + 1",
            "skip the clock floor in the grant (old + 1)",
        ),
        "the update trigger fires for a rise of exactly one and writes greatest(nextval, server clock in µs): the floor is applied by the trigger instead",
    ),
    text(
        "postgres.acquire.no_expiry_guard",
        "postgres",
        "postgres.acquire",
        "(l.lease_until <= c.now OR",
        "(true OR l.lease_until <= c.now OR",
        "drop the guard of the deciding statement: a held key is granted again",
    ),
    text(
        "postgres.acquire.reuse_token",
        "postgres",
        "postgres.acquire",
        FLOOR,
        "l.fencing_token",
        "reuse the old token in the deciding statement's grant",
    ),
    text(
        "postgres.trigger.no_clock_floor",
        "postgres",
        "postgres.migration",
        "floor_value := greatest(nextval(seq),\n                            floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint);",
        "floor_value := nextval(seq);",
        "skip the floor: the trigger draws new tokens from the sequence alone",
    ),
    text(
        "postgres.trigger.keep_dropped",
        "postgres",
        "postgres.migration",
        "    IF top > coalesce(pg_sequence_last_value(seq), 0) THEN\n        PERFORM pg_advisory_xact_lock",
        "    IF false THEN\n        PERFORM pg_advisory_xact_lock",
        "a deleted row's token no longer lifts the sequence",
    ),
    text(
        "postgres.trigger.update_floor_skipped",
        "postgres",
        "postgres.migration",
        "AND NOT (NEW.fencing_token > OLD.fencing_token + 1))",
        "AND false)",
        "the update trigger never fires: a takeover of old + 1 (the seed's) is not floored",
    ),
    text(
        "postgres.renew.no_expiry_check",
        "postgres",
        "postgres.renew",
        "AND lease_until > clock_timestamp()",
        "AND true",
        "forget the expiry check: an expired lease is renewed (revived)",
    ),
    text(
        "postgres.renew.no_token_check",
        "postgres",
        "postgres.renew",
        "AND fencing_token = $3",
        "AND $3::bigint IS NOT NULL",
        "drop the token guard of renew",
    ),
    text(
        "postgres.renew_many.no_expiry_check",
        "postgres",
        "postgres.renew_many",
        "AND l.lease_until > clock_timestamp()",
        "AND true",
        "forget the expiry check of the batched renewal",
    ),
    text(
        "postgres.release.no_token_check",
        "postgres",
        "postgres.release_notify",
        "AND fencing_token = $3",
        "AND $3::bigint IS NOT NULL",
        "drop the token guard of release: an old grant releases its successor",
    ),
    text(
        "postgres.release.no_owner_check",
        "postgres",
        "postgres.release_notify",
        "AND owner = $2",
        "AND $2::text IS NOT NULL",
        "drop the owner guard of release",
    ),
    text(
        "postgres.fence_write.accept_stale",
        "postgres",
        "postgres.fence_write",
        "WHERE r.last_fencing_token <= excluded.last_fencing_token",
        "WHERE true",
        "the high-water table accepts a token below its mark",
    ),
    text(
        "postgres.still_valid.no_expiry_check",
        "postgres",
        "postgres.still_valid",
        "SELECT lease_until > clock_timestamp() FROM",
        "SELECT true FROM",
        "a fenced transaction commits although the lease expired during it",
    ),
    // ---- Redis: the Lua scripts (protocol.rs).
    text(
        "redis.acquire.ignore_holder",
        "redis",
        "redis.acquire",
        "if cur ~= '' and not string.find(cur, ' ' .. ARGV[1] .. ' ', 1, true) then",
        "if false then",
        "drop the guard: a held key is granted to another owner",
    ),
    text(
        "redis.acquire.owner_flipped",
        "redis",
        "redis.acquire",
        "and not string.find(cur, ' ' .. ARGV[1] .. ' ', 1, true)",
        "and string.find(cur, ' ' .. ARGV[1] .. ' ', 1, true)",
        "flip the same-owner test",
    ),
    text(
        "redis.acquire.no_expiry",
        "redis",
        "redis.acquire",
        "'NX', 'GET', 'PX', ARGV[2])",
        "'NX', 'GET')",
        "forget the expiry: the record is written without PX",
    ),
    text(
        "redis.acquire.no_counter",
        "redis",
        "redis.acquire",
        "local old = redis.pcall('SET', KEYS[2], s, 'GET')",
        "local old = false",
        "skip the floor: the counter is neither read nor stored (token = server clock)",
    ),
    text(
        "redis.acquire.reuse_token",
        "redis",
        "redis.acquire",
        "local old = redis.pcall('SET', KEYS[2], s, 'GET')",
        "local old = redis.pcall('GET', KEYS[2]) if old then s = old end old = false",
        "reuse the old token: the grant takes the counter as it is",
    ),
    text(
        "redis.acquire.floor_flipped",
        "redis",
        "redis.acquire",
        "(#old == #s and old >= s)",
        "(#old == #s and old < s)",
        "flip the counter-versus-clock comparison",
    ),
    text(
        "redis.renew.no_prefix_check",
        "redis",
        "redis.renew",
        "if type(cur) == 'string' and string.sub(cur, 1, #ARGV[1]) == ARGV[1] then",
        "if type(cur) == 'string' then",
        "drop the token/owner guard of renew: a successor's record is extended",
    ),
    text(
        "redis.renew.revives_expired",
        "redis",
        "redis.renew",
        "if type(cur) == 'string' and string.sub(cur, 1, #ARGV[1]) == ARGV[1] then",
        "if not cur or (type(cur) == 'string' and string.sub(cur, 1, #ARGV[1]) == ARGV[1]) then",
        "forget the expiry check: an expired (deleted) record is written again",
    ),
    text(
        "redis.renew_many.no_prefix_check",
        "redis",
        "redis.renew_many",
        "if type(cur) == 'string' and string.sub(cur, 1, #p) == p then",
        "if type(cur) == 'string' then",
        "drop the guard of the batched renewal",
    ),
    text(
        "redis.release.no_prefix_check",
        "redis",
        "redis.release",
        "if type(cur) == 'string' and string.sub(cur, 1, #ARGV[1]) == ARGV[1] then",
        "if type(cur) == 'string' then",
        "drop the guard of release: an old grant deletes its successor's record",
    ),
    text(
        "redis.fence.accept_stale",
        "redis",
        "redis.fence",
        "if hw and less(ARGV[1], hw) then",
        "if false then",
        "the fenced resource accepts a token below its mark",
    ),
    text(
        "redis.fence.length_flipped",
        "redis",
        "redis.fence",
        "if #a ~= #b then return #a < #b end",
        "if #a ~= #b then return #a > #b end",
        "flip the length comparison of the decimal tokens",
    ),
    text(
        "redis.fence.equal_rejected",
        "redis",
        "redis.fence",
        "return a < b\nend",
        "return a <= b\nend",
        "flip < to <=: the holder's own token is rejected after its first write",
    ),
    // ---- etcd: the transactions (protocol.rs) and the read-back checks.
    code(
        "etcd.acquire.no_free_compare",
        "etcd",
        "drop the guard: the acquire txn creates its key although the lock is held",
    ),
    code(
        "etcd.acquire.replace_without_newer_check",
        "etcd",
        "a same-owner re-acquire replaces its key although newer contenders queue",
    ),
    equivalent(
        code(
            "etcd.acquire.replace_without_own_check",
            "etcd",
            "a same-owner re-acquire replaces its key without checking it is unchanged",
        ),
        "the replacement is sent only after a holder read that found the owner's key alone under \
         the lock prefix, and its other comparison requires every key under the prefix to be no \
         newer than that key; any key created since (a successor, a waiter, the name created \
         again) is newer, and a put keeps a key's create revision, so the own key can differ only \
         by being gone with the prefix empty: the lock is free, and the unmutated acquire grants \
         it in its next attempt (free-lock comparison) where the mutant grants it in this one, \
         both with the transaction's revision as the token (differences: the other slot name, \
         and a revoke of the gone key's etcd lease, which carried that key alone)",
    ),
    code(
        "etcd.acquire.no_lease",
        "etcd",
        "forget the expiry: the lock key is put without its etcd lease",
    ),
    code(
        "etcd.holder.newest_first",
        "etcd",
        "flip the holder order: the newest contender is reported as the holder",
    ),
    code(
        "etcd.release.no_token_compare",
        "etcd",
        "drop the create-revision (token) comparison of release",
    ),
    code(
        "etcd.release.no_owner_compare",
        "etcd",
        "drop the owner-value comparison of release",
    ),
    code(
        "etcd.delete.no_lease_compare",
        "etcd",
        "the sweeper's delete txn does not compare the etcd lease",
    ),
    code(
        "etcd.delete.no_revision_compare",
        "etcd",
        "the sweeper's delete txn does not compare the create revision (token)",
    ),
    code(
        "etcd.move.no_token_compare",
        "etcd",
        "the move txn (renewal through another store) does not compare the token",
    ),
    code(
        "etcd.fence.no_revision_compare",
        "etcd",
        "the fenced write's txn does not compare the state's mod revision (lost updates)",
    ),
    code(
        "etcd.fence.accept_stale",
        "etcd",
        "the fenced resource accepts (reports accepted) a token below its mark",
    ),
    code(
        "etcd.renew.no_read_back_check",
        "etcd",
        "a renewal does not check the read-back key's token, owner and etcd lease",
    ),
    // ---- Kubernetes: the requests and their conditions (protocol.rs, store.rs, fenced.rs).
    code(
        "k8s.acquire.ignore_live_holder",
        "k8s",
        "drop the guard: a live Lease of another holder is taken over",
    ),
    code(
        "k8s.expiry.never",
        "k8s",
        "forget the expiry check: nothing ever expires (takeover never, renew revives)",
    ),
    code("k8s.expiry.flipped", "k8s", "flip the expiry comparison"),
    code(
        "k8s.claim.unconditional",
        "k8s",
        "the replace that writes the token into a new claim has no resourceVersion precondition",
    ),
    code(
        "k8s.regrant.unconditional",
        "k8s",
        "the takeover replace has no resourceVersion precondition",
    ),
    code(
        "k8s.renewal.unconditional",
        "k8s",
        "the renewal replace has no resourceVersion precondition",
    ),
    code(
        "k8s.release.unconditional",
        "k8s",
        "the release replace has no resourceVersion precondition",
    ),
    code(
        "k8s.token.reuse_old",
        "k8s",
        "reuse the old token on a takeover",
    ),
    code(
        "k8s.token.skip_floor",
        "k8s",
        "skip the floor: the token is the next resourceVersion, not above the recorded token",
    ),
    code(
        "k8s.renew.no_holder_check",
        "k8s",
        "drop the holder/token check of renew",
    ),
    code(
        "k8s.release.no_holder_check",
        "k8s",
        "drop the holder/token check of release",
    ),
    code(
        "k8s.fence.accept_stale",
        "k8s",
        "the fenced resource accepts (reports accepted) a token below its mark",
    ),
    code(
        "k8s.fence.unconditional",
        "k8s",
        "the fenced ConfigMap replace has no resourceVersion precondition (lost updates)",
    ),
    // ---- SQLite: the statements and triggers (protocol.rs) and the fenced check.
    text(
        "sqlite.acquire.no_expiry_guard",
        "sqlite",
        "sqlite.acquire",
        "WHERE lease_holder.expires_ms <= ",
        "WHERE 1 OR lease_holder.expires_ms <= ",
        "drop the guard: a live key is taken from its holder",
    ),
    text(
        "sqlite.acquire.expiry_flipped",
        "sqlite",
        "sqlite.acquire",
        "WHERE lease_holder.expires_ms <= ",
        "WHERE lease_holder.expires_ms > ",
        "flip the expiry comparison",
    ),
    text(
        "sqlite.acquire.owner_flipped",
        "sqlite",
        "sqlite.acquire",
        " OR lease_holder.owner = excluded.owner",
        " OR lease_holder.owner <> excluded.owner",
        "flip the same-owner comparison",
    ),
    text(
        "sqlite.acquire.reuse_token",
        "sqlite",
        "sqlite.acquire",
        "token = max(lease_holder.token + 1, excluded.token)",
        "token = lease_holder.token",
        "reuse the old token on a takeover",
    ),
    text(
        "sqlite.acquire.skip_generation_floor",
        "sqlite",
        "sqlite.acquire",
        "coalesce((SELECT last_token FROM lease_generation WHERE key = ?1), 0) + 1",
        "1",
        "skip the floor: a new row starts at 1 whatever a deleted row had",
    ),
    text(
        "sqlite.renew.no_expiry_check",
        "sqlite",
        "sqlite.renew",
        "AND expires_ms > ",
        "AND 9223372036854775807 > ",
        "forget the expiry check: an expired lease is renewed (revived)",
    ),
    text(
        "sqlite.renew.no_token_check",
        "sqlite",
        "sqlite.renew",
        "AND token = ?3 AND",
        "AND ?3 = ?3 AND",
        "drop the token guard of renew",
    ),
    text(
        "sqlite.release.no_owner_check",
        "sqlite",
        "sqlite.release",
        "AND owner = ?2 AND",
        "AND ?2 = ?2 AND",
        "drop the owner guard of release",
    ),
    text(
        "sqlite.release.no_expiry_check",
        "sqlite",
        "sqlite.release",
        "AND expires_ms > ",
        "AND 9223372036854775807 > ",
        "release of an expired lease reports Released",
    ),
    text(
        "sqlite.trigger.keep_token_lost",
        "sqlite",
        "sqlite.ddl",
        "VALUES (old.key, old.token)",
        "VALUES (old.key, 1)",
        "a deleted row's token is not kept in lease_generation",
    ),
    text(
        "sqlite.trigger.token_may_go_back",
        "sqlite",
        "sqlite.ddl",
        "WHEN new.token < old.token",
        "WHEN 0",
        "the trigger that refuses a token going back never fires",
    ),
    code(
        "sqlite.fence.accept_stale",
        "sqlite",
        "the fenced resource accepts a token below its mark",
    ),
    // ---- MySQL/MariaDB: the statements and the migration's triggers (protocol.rs).
    text(
        "mysql.acquire.no_expiry_guard",
        "mysql",
        "mysql.acquire_free",
        "AND (lease_until <= UTC_TIMESTAMP(6) OR",
        "AND (TRUE OR lease_until <= UTC_TIMESTAMP(6) OR",
        "drop the guard of the grant's UPDATE: a live key is taken from its holder",
    ),
    text(
        "mysql.acquire.expiry_flipped",
        "mysql",
        "mysql.acquire_free",
        "(lease_until <= UTC_TIMESTAMP(6) OR",
        "(lease_until > UTC_TIMESTAMP(6) OR",
        "flip the expiry comparison of the grant's UPDATE",
    ),
    text(
        "mysql.acquire.owner_flipped",
        "mysql",
        "mysql.acquire_free",
        " OR owner = ?)",
        " OR owner <> ?)",
        "flip the same-owner comparison: any other owner may take a live key",
    ),
    text(
        "mysql.acquire.reuse_token",
        "mysql",
        "mysql.acquire_free",
        MY_GRANT_TOKEN,
        "fencing_token",
        "reuse the old token on a grant of a key that has a row",
    ),
    text(
        "mysql.acquire.no_clock_floor",
        "mysql",
        "mysql.acquire_free",
        MY_GRANT_TOKEN,
        "fencing_token + 1",
        "skip the clock floor (GREATEST with the server clock) in the grant: old + 1",
    ),
    text(
        "mysql.acquire_insert.no_floor_row",
        "mysql",
        "mysql.acquire_insert",
        "WHERE f.resource_key = ?), 0) + 1",
        "WHERE f.resource_key = ? AND FALSE), 0) + 1",
        "the INSERT of a new key ignores the key's floor row (a deleted row's token)",
    ),
    text(
        "mysql.acquire_insert.no_clock_floor",
        "mysql",
        "mysql.acquire_insert",
        "), 0) + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
        "), 0) + 1, 1",
        "skip the clock floor in the INSERT of a new key: floor + 1 (1 for a new key)",
    ),
    text(
        "mysql.trigger.insert_not_floored",
        "mysql",
        "mysql.migration",
        "WHERE f.resource_key = NEW.resource_key), 1))",
        "WHERE f.resource_key = NEW.resource_key AND FALSE), 1))",
        "the insert trigger ignores the floor row: a foreign insert after a delete goes back",
    ),
    text(
        "mysql.trigger.update_may_lower",
        "mysql",
        "mysql.migration",
        "GREATEST(NEW.fencing_token, OLD.fencing_token + 1))",
        "NEW.fencing_token)",
        "the update trigger keeps any new token: a foreign update may lower it",
    ),
    text(
        "mysql.trigger.keep_token_lost",
        "mysql",
        "mysql.migration",
        "VALUES (OLD.resource_key, OLD.fencing_token) ON DUPLICATE KEY UPDATE floor_token = GREATEST(floor_token, OLD.fencing_token)",
        "VALUES (OLD.resource_key, 1) ON DUPLICATE KEY UPDATE floor_token = floor_token",
        "the delete trigger does not keep the deleted row's token in the floor row",
    ),
    text(
        "mysql.renew.no_expiry_check",
        "mysql",
        "mysql.renew",
        "AND lease_until > UTC_TIMESTAMP(6)",
        "AND TRUE",
        "forget the expiry check: an expired lease is renewed (revived)",
    ),
    text(
        "mysql.renew.no_token_check",
        "mysql",
        "mysql.renew",
        "AND fencing_token = ?",
        "AND ? IS NOT NULL",
        "drop the token guard of renew",
    ),
    text(
        "mysql.renew_many.no_expiry_check",
        "mysql",
        "mysql.renew_many",
        "AND lease_until > UTC_TIMESTAMP(6)",
        "AND TRUE",
        "forget the expiry check of the batched renewal: an expired lease is revived",
    ),
    text(
        "mysql.renewed_many.no_expiry_check",
        "mysql",
        "mysql.renewed_many",
        "AND lease_until > UTC_TIMESTAMP(6)",
        "AND TRUE",
        "the batched renewal's read-back counts a released or expired row of the owner as renewed",
    ),
    text(
        "mysql.renewed_many.no_owner_check",
        "mysql",
        "mysql.renewed_many",
        "AND owner = ?",
        "AND ? IS NOT NULL",
        "the batched renewal's read-back counts another owner's row with the lease's token as renewed",
    ),
    text(
        "mysql.release.no_token_check",
        "mysql",
        "mysql.release",
        "AND fencing_token = ?",
        "AND ? IS NOT NULL",
        "drop the token guard of release: an old grant releases its successor",
    ),
    text(
        "mysql.release.no_owner_check",
        "mysql",
        "mysql.release",
        "AND owner = ?",
        "AND ? IS NOT NULL",
        "drop the owner guard of release",
    ),
    text(
        "mysql.release.no_expiry_check",
        "mysql",
        "mysql.release",
        "AND lease_until > UTC_TIMESTAMP(6)",
        "AND TRUE",
        "release of an expired lease reports Released",
    ),
    text(
        "mysql.fence_write.accept_stale",
        "mysql",
        "mysql.fence_write",
        "last_fencing_token <= VALUES(last_fencing_token)",
        "TRUE",
        "the high-water table applies a write whose token is below its mark",
    ),
    text(
        "mysql.lock_row.no_expiry_check",
        "mysql",
        "mysql.lock_row",
        "AND lease_until > UTC_TIMESTAMP(6) FOR UPDATE",
        "FOR UPDATE",
        "a fenced transaction starts (runs its closure) on an expired lease",
    ),
    text(
        "mysql.still_valid.no_expiry_check",
        "mysql",
        "mysql.still_valid",
        "SELECT lease_until > UTC_TIMESTAMP(6) FROM",
        "SELECT TRUE FROM",
        "a fenced transaction commits although the lease expired during it",
    ),
];

#[cfg(test)]
mod tests {
    use super::MUTANTS;

    const BACKENDS: [&str; 6] = ["postgres", "redis", "etcd", "k8s", "sqlite", "mysql"];

    /// Every backend has at least ten mutants of its safety text, names are unique, and every
    /// mutant names a backend the program runs.
    #[test]
    fn every_backend_has_at_least_ten_mutants_with_unique_names() {
        for b in BACKENDS {
            let n = MUTANTS
                .iter()
                .filter(|m| m.backend == b && !m.control)
                .count();
            assert!(n >= 10, "{b} has {n} mutants; at least 10 are wanted");
        }
        let mut names: Vec<&str> = MUTANTS.iter().map(|m| m.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "mutant names must be unique");
        for m in MUTANTS {
            assert!(
                BACKENDS.contains(&m.backend),
                "{} names an unknown backend {}",
                m.name,
                m.backend
            );
            assert!(
                m.control || m.name.starts_with(&format!("{}.", m.backend)),
                "{} is not named after its backend {}",
                m.name,
                m.backend
            );
        }
    }
}
