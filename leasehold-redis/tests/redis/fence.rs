//! The fenced resource's token comparison. The fence script keeps the high-water mark as the
//! decimal text Redis stores and compares two tokens by length first, then as text; the shared
//! suite's tokens all have the same number of digits, so these cases write tokens of different
//! lengths.

use leasehold_core::{FencedResource, FencingToken, WriteOp, WriteOutcome};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx};

/// Token pairs whose decimal texts differ in length and compare the other way round as text
/// ("9" > "10" as strings).
const PAIRS: [(u64, u64); 3] = [(9, 10), (99, 100), (999_999_999, 1_000_000_000)];

/// A greater token with more digits is accepted after a smaller one, and the smaller one is then
/// rejected (and changes nothing); the marks read back are the numbers written.
pub(crate) async fn tokens_of_different_lengths_compare_as_numbers(ctx: Ctx) -> CaseResult {
    let resource = ctx.resource();
    for (i, (low, high)) in PAIRS.into_iter().enumerate() {
        let key = ctx.key(&format!("digits-{i}"));
        let (low, high) = (FencingToken::new(low)?, FencingToken::new(high)?);
        assert_eq!(
            resource.write(&key, low, WriteOp::Add(1)).await?,
            WriteOutcome::Accepted { high_water: low }
        );
        assert_eq!(
            resource.write(&key, high, WriteOp::Add(10)).await?,
            WriteOutcome::Accepted { high_water: high },
            "token {high} (more digits) after {low}"
        );
        assert_eq!(
            resource.write(&key, low, WriteOp::Add(100)).await?,
            WriteOutcome::Rejected {
                presented: low,
                high_water: high
            },
            "token {low} (fewer digits) after {high}"
        );
        let state = resource.read(&key).await?;
        assert_eq!(
            (state.high_water, state.counter, state.accepted),
            (Some(high), 11, 2)
        );
    }
    Ok(())
}

/// Installing a token with fewer digits than the mark is rejected; one with more digits is
/// accepted.
pub(crate) async fn installs_of_different_lengths_compare_as_numbers(ctx: Ctx) -> CaseResult {
    let resource = ctx.resource();
    let key = ctx.key("digits-install");
    let (nine, ten, hundred) = (
        FencingToken::new(9)?,
        FencingToken::new(10)?,
        FencingToken::new(100)?,
    );
    assert!(resource.install(&key, ten).await?.is_accepted());
    assert_eq!(
        resource.install(&key, nine).await?,
        WriteOutcome::Rejected {
            presented: nine,
            high_water: ten
        }
    );
    assert!(resource.install(&key, hundred).await?.is_accepted());
    assert_eq!(resource.read(&key).await?.high_water, Some(hundred));
    Ok(())
}

/// This file's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("redis", tokens_of_different_lengths_compare_as_numbers),
        case!("redis", installs_of_different_lengths_compare_as_numbers),
    ]
}
