//! Contention: many tasks race on one key; the count through the fenced resource is exact.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{AcquireOutcome, Error, LeaseStore, OwnerId, ReleaseOutcome, WriteOp};
use tokio::time::Instant;

use super::Case;
use crate::history::{History, Op};
use crate::{CaseResult, Ctx};

/// This file's cases, with the capabilities each needs.
pub fn cases() -> Vec<Case> {
    vec![crate::case!(
        "conformance",
        contention_gives_exact_count_and_legal_history
    )]
}

/// Workers in the contention case.
pub const WORKERS: usize = 8;
/// Rounds per worker.
pub const ROUNDS: usize = 25;

/// 10. 8 tasks x 25 rounds race on one key (each with its own client); each holder increments a
///     counter through the fenced resource and releases. The final count is exact, no two grants
///     overlap while valid, and granted tokens are unique and increase in grant order.
pub async fn contention_gives_exact_count_and_legal_history(ctx: Ctx) -> CaseResult {
    let key = ctx.key("contention");
    let history = History::new();
    let ttl = ctx.long_ttl();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let store: Arc<dyn LeaseStore> = ctx.other_client().await?;
        let (ctx, key, history) = (ctx.clone(), key.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            let name = format!("w{w}");
            let owner = OwnerId::with_label(&name);
            for _ in 0..ROUNDS {
                let lease = loop {
                    if Instant::now() > deadline {
                        return Err(format!("{name} could not acquire within the deadline"));
                    }
                    let t0 = history.begin();
                    match store
                        .acquire(&ctx.request(&key, &owner, ttl))
                        .await
                        .map_err(|e| e.to_string())?
                    {
                        AcquireOutcome::Acquired(lease) => {
                            history.end(
                                &name,
                                &key,
                                t0,
                                Op::Granted {
                                    owner: owner.clone(),
                                    token: lease.token(),
                                    deadline: lease.deadline(),
                                },
                            );
                            break lease;
                        }
                        AcquireOutcome::Held(_) => {
                            history.end(&name, &key, t0, Op::Refused);
                            tokio::time::sleep(Duration::from_millis(fastrand::u64(1..8))).await;
                        }
                    }
                };
                let t0 = history.begin();
                let out = ctx
                    .resource()
                    .write(&key, lease.token(), WriteOp::Add(1))
                    .await
                    .map_err(|e| e.to_string())?;
                history.end(
                    &name,
                    &key,
                    t0,
                    Op::Write {
                        token: lease.token(),
                        accepted: out.is_accepted(),
                    },
                );
                let t0 = history.begin();
                let rel = store
                    .release(&lease)
                    .await
                    .map_err(|e: Error| e.to_string())?;
                history.end(
                    &name,
                    &key,
                    t0,
                    Op::Release {
                        token: lease.token(),
                    },
                );
                if rel != ReleaseOutcome::Released {
                    return Err(format!("{name}: release of a valid lease was refused"));
                }
                if !out.is_accepted() {
                    return Err(format!(
                        "{name}: write with a current token was rejected: {out:?}"
                    ));
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("worker panicked: {e}"))??;
    }
    let total = WORKERS * ROUNDS;
    let state = ctx.resource().read(&key).await?;
    assert_eq!(
        state.counter,
        i64::try_from(total).unwrap_or(i64::MAX),
        "count is not exact"
    );
    let tokens = history.granted_tokens();
    assert_eq!(tokens.len(), total);
    let violations = history.check();
    if !violations.is_empty() {
        return Err(format!("history violations: {violations:#?}\n{}", history.dump()).into());
    }
    Ok(())
}
