//! Settings that never panic: draw option values from a property strategy and run real
//! operations with each, in a task of its own and within a bound, so that a panic (tokio would
//! swallow it in a task) and a hang are both reported with the value that caused them.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use proptest::prelude::{Just, prop_oneof};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

use crate::CaseResult;

/// Durations from the edges (zero, 1 ms, `Duration::MAX`, `u64::MAX` seconds) mixed with
/// ordinary ones (1 ms to 10 s): the values every duration setting must survive.
pub fn edge_durations() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_millis(1)),
        Just(Duration::MAX),
        Just(Duration::from_secs(u64::MAX)),
        (1u64..10_000).prop_map(Duration::from_millis),
    ]
}

/// `n` values drawn from `strategy` with proptest's deterministic runner: the same values on
/// every run, so a failure is reproduced by running the case again.
///
/// # Errors
/// When the strategy cannot produce a value (it rejects everything).
pub fn draw<S: Strategy>(strategy: &S, n: usize) -> Result<Vec<S::Value>, String> {
    let mut runner = TestRunner::deterministic();
    (0..n)
        .map(|_| {
            strategy
                .new_tree(&mut runner)
                .map(|tree| tree.current())
                .map_err(|e| format!("drawing a value: {e}"))
        })
        .collect()
}

/// Runs `exercise(value, i)` for each value, each in a task of its own and within `bound`.
/// Whatever `exercise` returns, a value or an error, is accepted: the settings either work or are
/// refused with a typed error. A panic or a call that does not answer within `bound` fails the
/// case, naming the value.
///
/// ```
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let values = vec![Duration::ZERO, Duration::MAX];
/// let result = leasehold_testkit::settings::never_panics_or_hangs(values, Duration::from_secs(1), |d, _| async move {
///     leasehold_core::backend::validate_ttl(d, Duration::from_millis(1))
/// })
/// .await;
/// assert!(result.is_ok());
/// # }
/// ```
///
/// # Errors
/// The first value that panicked or hung, with what happened.
pub async fn never_panics_or_hangs<T, F, Fut>(
    values: impl IntoIterator<Item = T>,
    bound: Duration,
    exercise: F,
) -> CaseResult
where
    T: Debug + Send + 'static,
    F: Fn(T, usize) -> Fut,
    Fut: Future<Output = leasehold_core::Result<()>> + Send + 'static,
{
    for (i, value) in values.into_iter().enumerate() {
        let shown = format!("{value:?}");
        let run = tokio::spawn(tokio::time::timeout(bound, exercise(value, i)));
        match run.await {
            Err(e) if e.is_panic() => return Err(format!("panicked with {shown}: {e}").into()),
            Err(e) => return Err(format!("task failed with {shown}: {e}").into()),
            Ok(Err(_)) => return Err(format!("no answer within {bound:?} with {shown}").into()),
            Ok(Ok(_value_or_typed_error)) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checker fails on a panic and on a hang, naming the value, and accepts errors.
    #[tokio::test(start_paused = true)]
    async fn panics_and_hangs_fail_errors_do_not() {
        let run = |values: Vec<u32>| {
            never_panics_or_hangs(values, Duration::from_secs(1), |v, _| async move {
                match v {
                    0 => Err(leasehold_core::Error::InvalidInput("zero".into())),
                    1 => panic!("one"),
                    2 => std::future::pending().await,
                    _ => Ok(()),
                }
            })
        };
        assert!(run(vec![0, 3]).await.is_ok());
        let panicked = format!("{:?}", run(vec![3, 1]).await.unwrap_err());
        assert!(panicked.contains("panicked with 1"), "{panicked}");
        let hung = format!("{:?}", run(vec![2]).await.unwrap_err());
        assert!(
            hung.contains("no answer") && hung.contains("with 2"),
            "{hung}"
        );
        assert_eq!(draw(&(0u8..4), 5).map(|v| v.len()), Ok(5));
    }
}
