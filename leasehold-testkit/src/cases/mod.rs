//! The conformance cases, one function per property. Each is public so a backend can also call
//! it directly.
//!
//! Each case file registers its own cases with a `pub fn cases() -> Vec<Case>`, declaring the
//! capabilities each needs ([`Need`]); [`all`] gathers them. The runner reports a case whose
//! needs the backend's [`Capabilities`] lack as ignored, with the reason.

pub mod acquire;
pub mod acquire_many;
pub mod contention;
pub mod expiry;
pub mod fencing;
pub mod input;
pub mod release;
pub mod renew;
pub mod semaphore;
pub mod supervisor;

use leasehold_core::{Capabilities, ExpiryClock, TokenDurability};

use crate::{BoxFuture, CaseResult, Ctx};

/// A capability a case needs from the backend (see [`leasehold_core::Capabilities`]).
///
/// A case whose needs the backend's capabilities do not meet is reported as **ignored**, with the
/// reason, never as passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Need {
    /// [`Capabilities::watch`]: `watch()` wakes a waiter when the key changes.
    Watch,
    /// [`Capabilities::tokens_survive_restart`]: tokens do not go back after a store restart.
    TokensSurviveRestart,
    /// [`TokenDurability::Durable`]: tokens are stored durably.
    DurableTokens,
    /// Expiry judged by this clock ([`Capabilities::expiry_clock`]).
    ExpiryClock(ExpiryClock),
}

impl Need {
    /// Whether `caps` meet this need.
    pub fn met_by(&self, caps: &Capabilities) -> bool {
        match self {
            Need::Watch => caps.watch,
            Need::TokensSurviveRestart => caps.tokens_survive_restart(),
            Need::DurableTokens => caps.token_durability == TokenDurability::Durable,
            Need::ExpiryClock(clock) => caps.expiry_clock == *clock,
        }
    }

    /// Why `caps` do not meet this need, or `None` if they do.
    pub fn unmet_reason(&self, caps: &Capabilities) -> Option<String> {
        if self.met_by(caps) {
            return None;
        }
        Some(match self {
            Need::Watch => "needs capability `watch`; the backend has none".to_string(),
            Need::TokensSurviveRestart => format!(
                "needs tokens that survive a restart; the backend's are {:?}",
                caps.token_durability
            ),
            Need::DurableTokens => format!(
                "needs durable tokens; the backend's are {:?}",
                caps.token_durability
            ),
            Need::ExpiryClock(clock) => format!(
                "needs expiry clock {clock:?}; the backend's is {:?}",
                caps.expiry_clock
            ),
        })
    }
}

/// A named case, with the capabilities it needs.
///
/// Build one with [`case!`](crate::case) and declare its needs with [`Case::needs`]:
///
/// ```
/// use leasehold_testkit::cases::{Case, Need};
/// use leasehold_testkit::{CaseResult, Ctx};
///
/// async fn wakes_on_release(ctx: Ctx) -> CaseResult {
///     let _ = ctx;
///     Ok(())
/// }
///
/// fn cases() -> Vec<Case> {
///     vec![leasehold_testkit::case!("mybackend", wakes_on_release).needs(&[Need::Watch])]
/// }
/// # assert_eq!(cases()[0].name, "wakes_on_release");
/// ```
#[derive(Clone, Copy)]
pub struct Case {
    /// The group (`conformance`, `supervisor`, `election`, or a backend's own).
    pub group: &'static str,
    /// The property's name.
    pub name: &'static str,
    /// The case.
    pub run: fn(Ctx) -> BoxFuture<'static, CaseResult>,
    /// The capabilities the case needs; empty for a case every backend must pass.
    pub needs: &'static [Need],
}

impl Case {
    /// Declares the capabilities this case needs (replacing any declared before).
    #[must_use]
    pub const fn needs(mut self, needs: &'static [Need]) -> Self {
        self.needs = needs;
        self
    }

    /// Why a backend with `caps` cannot run this case (every unmet need, joined), or `None` if
    /// it can.
    pub fn unmet(&self, caps: &Capabilities) -> Option<String> {
        let reasons: Vec<String> = self
            .needs
            .iter()
            .filter_map(|n| n.unmet_reason(caps))
            .collect();
        if reasons.is_empty() {
            None
        } else {
            Some(reasons.join("; "))
        }
    }

    /// The case's full test name, `group::name`.
    pub fn full_name(&self) -> String {
        format!("{}::{}", self.group, self.name)
    }
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}::{}", self.group, self.name)?;
        if !self.needs.is_empty() {
            write!(f, " (needs {:?})", self.needs)?;
        }
        Ok(())
    }
}

/// Builds a [`Case`] from an `async fn(Ctx) -> CaseResult`, needing nothing; add needs with
/// [`Case::needs`].
#[macro_export]
macro_rules! case {
    ($group:literal, $path:path) => {
        $crate::cases::Case {
            group: $group,
            name: $crate::cases::last_segment(stringify!($path)),
            run: |ctx| Box::pin($path(ctx)),
            needs: &[],
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

/// Every case of the shared suite: each case file's `cases()`, in file order.
pub fn all() -> Vec<Case> {
    [
        acquire::cases(),
        acquire_many::cases(),
        renew::cases(),
        release::cases(),
        expiry::cases(),
        fencing::cases(),
        contention::cases(),
        input::cases(),
        supervisor::cases(),
        semaphore::cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}
