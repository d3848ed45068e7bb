//! Negative controls: every deliberately broken store, resource and configuration must be caught
//! by the storms, with the expected violation kind; the unbroken memory store must stay clean
//! under the same storms.

use leasehold_faults::controls::{
    CONTROL_TTL, Control, MemoryBackend, run_control, run_control_on_keys,
};
use leasehold_faults::storm::{StormShape, storm};

/// How many storms a control may take to be caught.
const MAX_STORMS: u64 = 8;

async fn caught(control: Control) {
    let r = run_control(control, MAX_STORMS)
        .await
        .expect("storm infrastructure");
    assert!(
        r.caught,
        "control '{}' was NOT caught in {} storms (expected: {})",
        control.name(),
        r.storms,
        control.expected()
    );
    let m = r.caught_by.expect("caught");
    eprintln!(
        "control '{}' caught as {} in storm {}: {:?}",
        control.name(),
        control.expected(),
        r.storms,
        m.verdict()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_that_grants_twice_is_caught() {
    caught(Control::GrantsTwice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_whose_tokens_go_back_after_a_restart_is_caught() {
    caught(Control::TokensGoBack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_that_answers_renewed_without_extending_is_caught() {
    caught(Control::RenewedWithoutExtending).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_that_extends_without_answering_is_caught() {
    caught(Control::ExtendsWithoutAnswering).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_with_zero_loss_lead_is_caught() {
    caught(Control::ZeroLossLead).await;
}

/// The storms compare each loss at the deadline with the store's own view: a store that lets a
/// lease go before the TTL it reported must show up as a late loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_that_expires_leases_early_is_caught() {
    caught(Control::ExpiresEarly).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_that_accepts_lower_tokens_is_caught() {
    caught(Control::AcceptsLowerTokens).await;
}

/// Storms over three keys (a contender draws its key each round, every key checked on its own)
/// catch every control too, so that the multi-key storms of the suite and the soak are not
/// blind where single-key storms see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_control_is_caught_on_three_key_storms() {
    let runs: Vec<_> = Control::ALL
        .iter()
        .map(|&c| tokio::spawn(run_control_on_keys(c, 2 * MAX_STORMS, 3)))
        .collect();
    let mut missed = Vec::new();
    for (c, h) in Control::ALL.iter().zip(runs) {
        let r = h
            .await
            .expect("control task")
            .expect("storm infrastructure");
        if r.caught {
            eprintln!(
                "control '{}' caught on three keys in storm {}",
                c.name(),
                r.storms
            );
        } else {
            missed.push(c.name());
        }
    }
    assert!(
        missed.is_empty(),
        "controls NOT caught on three-key storms in {} storms: {missed:?}",
        2 * MAX_STORMS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbroken_memory_store_stays_clean() {
    for seed in 1..=4 {
        let backend = MemoryBackend::new(None, CONTROL_TTL);
        // Seeds 1 and 3 on one key, 2 and 4 on three.
        let shape = StormShape {
            seed,
            contenders: 3,
            rounds: 3,
            keys: if seed % 2 == 0 { 3 } else { 1 },
        };
        let m = storm(&backend, shape).await.expect("storm infrastructure");
        assert!(
            m.violations.is_empty(),
            "seed {seed}: {:#?}\n{}",
            m.violations,
            m.history.unwrap_or_default()
        );
        assert!(m.renewals > 0, "the storm never renewed a lease: {m:?}");
    }
}
