//! The conformance cases, one function per property. Each is public so a backend can also call
//! it directly.

pub mod acquire;
pub mod contention;
pub mod expiry;
pub mod fencing;
pub mod input;
pub mod release;
pub mod renew;
pub mod supervisor;

use crate::{BoxFuture, CaseResult, Ctx};

/// A named case.
#[derive(Clone, Copy)]
pub struct Case {
    /// The group (`conformance`, `supervisor`, `election`, or a backend's own).
    pub group: &'static str,
    /// The property's name.
    pub name: &'static str,
    /// The case.
    pub run: fn(Ctx) -> BoxFuture<'static, CaseResult>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}::{}", self.group, self.name)
    }
}

/// Builds a [`Case`] from an `async fn(Ctx) -> CaseResult`.
#[macro_export]
macro_rules! case {
    ($group:literal, $path:path) => {
        $crate::cases::Case {
            group: $group,
            name: $crate::cases::last_segment(stringify!($path)),
            run: |ctx| Box::pin($path(ctx)),
        }
    };
}

/// The last `::` segment of a path (used by [`case!`]).
pub const fn last_segment(path: &'static str) -> &'static str {
    let bytes = path.as_bytes();
    let mut i = bytes.len();
    while i > 0 {
        if bytes[i - 1] == b':' || bytes[i - 1] == b' ' {
            break;
        }
        i -= 1;
    }
    let (_, tail) = bytes.split_at(i);
    match std::str::from_utf8(tail) {
        Ok(s) => s,
        Err(_) => path,
    }
}

/// Every case of the shared suite.
pub fn all() -> Vec<Case> {
    vec![
        case!("conformance", acquire::first_acquire_is_granted),
        case!(
            "conformance",
            acquire::other_owner_is_refused_and_told_the_holder
        ),
        case!(
            "conformance",
            acquire::same_owner_reacquire_gets_a_greater_token
        ),
        case!("conformance", acquire::keys_are_independent),
        case!("conformance", renew::renew_by_holder_extends),
        case!(
            "conformance",
            renew::renew_with_wrong_owner_or_token_changes_nothing
        ),
        case!("conformance", renew::renew_many_matches_renew),
        case!("conformance", release::release_by_holder_frees_the_key),
        case!(
            "conformance",
            release::release_with_wrong_owner_or_token_changes_nothing
        ),
        case!(
            "conformance",
            release::inspect_agrees_with_grant_renew_and_release
        ),
        case!(
            "conformance",
            expiry::after_expiry_another_owner_takes_over_without_revival
        ),
        case!(
            "conformance",
            expiry::tokens_increase_across_release_expiry_and_reacquire
        ),
        case!(
            "conformance",
            fencing::stale_owner_is_rejected_by_the_resource
        ),
        case!(
            "conformance",
            fencing::installed_generation_rejects_the_old_owner_before_the_new_writes
        ),
        case!(
            "conformance",
            contention::contention_gives_exact_count_and_legal_history
        ),
        case!(
            "conformance",
            input::bad_input_is_a_typed_error_and_changes_nothing
        ),
        case!("conformance", input::token_of_another_key_changes_nothing),
        case!("conformance", acquire::watch_wakes_on_release_if_supported),
        case!("supervisor", supervisor::supervisor_renews_past_the_ttl),
        case!(
            "supervisor",
            supervisor::supervisor_refused_renewal_is_lost_at_once
        ),
        case!(
            "supervisor",
            supervisor::supervisor_hanging_store_is_lost_before_the_deadline
        ),
        case!(
            "supervisor",
            supervisor::supervisor_drop_releases_in_the_background
        ),
        case!(
            "election",
            supervisor::election_one_leader_at_a_time_with_increasing_terms
        ),
        case!(
            "election",
            supervisor::election_resign_hands_over_without_waiting_for_the_ttl
        ),
    ]
}
