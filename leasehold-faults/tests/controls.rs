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

/// The storms' check of the resource's own record can fail: a storm on a SQLite target with its
/// record installed stays clean and reads accepted writes back from the record; the same storm
/// with one forged entry slipped into the record (an accepted write with a token nobody was
/// granted, as a resource that let an unfenced write through would show) is caught. Only the
/// record holds the forged entry, so only the record's check can catch it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_only_the_resources_record_holds_is_caught() {
    use leasehold_faults::storm::storm_with;
    use leasehold_faults::target::{Endpoint, Target};
    use leasehold_testkit::history::ViolationKind;
    use std::time::Duration;

    let dir = std::env::temp_dir().join(format!("leasehold-record-ctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("record.db").to_string_lossy().into_owned();
    let target = Target {
        name: "sqlite",
        endpoint: Endpoint::Sqlite { path: path.clone() },
        ttl: Duration::from_millis(1000),
        takeover_slack: Duration::from_millis(500),
    };
    let recorded = target
        .recorded()
        .await
        .expect("installing the record")
        .expect("SQLite keeps a record");

    let clean = storm(&recorded, StormShape::rotating(1, 3, 2))
        .await
        .expect("storm infrastructure");
    assert!(clean.violations.is_empty(), "{:#?}", clean.violations);
    assert!(clean.recorded > 0, "the record held no accepted write");

    // Once the storm's first accepted write is in the record, forge one more for its key.
    let forger = path.clone();
    let forge = async move {
        let sql = "INSERT INTO leasehold_faults_accepted (key, token, accepted) \
                   SELECT key, 999999, accepted + 1 FROM leasehold_faults_accepted \
                   WHERE key LIKE 'lf%-storm%' AND id > (SELECT coalesce(max(id), 0) FROM \
                   leasehold_faults_accepted WHERE key = 'leasehold-record-ctl-mark') \
                   ORDER BY id DESC LIMIT 1; SELECT changes();";
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let out = tokio::process::Command::new("sqlite3")
                .args(["-batch", "-cmd", ".timeout 10000", &forger, sql])
                .output()
                .await
                .map_err(|e| format!("sqlite3: {e}"))?;
            if String::from_utf8_lossy(&out.stdout).trim() == "1" {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err("no accepted write reached the record within 30 s".to_string());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // The clean storm's rows stay in the log: a marker row bounds the forger to the next storm.
    let mark = std::process::Command::new("sqlite3")
        .args([
            "-batch",
            "-cmd",
            ".timeout 10000",
            &path,
            "INSERT INTO leasehold_faults_accepted (key, token, accepted) \
             VALUES ('leasehold-record-ctl-mark', 1, 1);",
        ])
        .status()
        .expect("sqlite3");
    assert!(mark.success());
    let forged = storm_with(
        &recorded,
        StormShape::rotating(1, 3, 2),
        Some(Box::pin(forge)),
    )
    .await
    .expect("storm infrastructure");
    assert!(
        forged
            .violations
            .iter()
            .any(|v| v.kind == ViolationKind::WriteCountMismatch && v.detail.contains("999999")),
        "the forged entry was not caught: {:#?}",
        forged.violations
    );
    let _ = std::fs::remove_dir_all(&dir);
}
