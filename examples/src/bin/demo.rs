//! The main demo, with no external service: three replicas contend for one key; the holder is
//! paused past its TTL (a GC pause, a VM suspend); another replica takes over with a greater
//! fencing token; the paused replica wakes up and its late write is rejected by the resource.
//!
//! ```text
//! cargo run -p lease-examples --bin demo
//! ```

use std::time::Duration;

use lease_core::{
    AcquireOutcome, AcquireRequest, FencedResource, LeaseKey, LeaseStore, MemoryFencedResource,
    MemoryLeaseStore, OwnerId, WriteOp, WriteOutcome,
};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_millis(800);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryLeaseStore::new();
    let ledger = MemoryFencedResource::new();
    let key = LeaseKey::new("tenant-42.reconcile")?;
    let t0 = Instant::now();
    let say = |who: &str, what: String| {
        println!(
            "[{:>6.0} ms] {who:<9} {what}",
            t0.elapsed().as_secs_f64() * 1e3
        );
    };

    let replicas: Vec<OwnerId> = ["replica-a", "replica-b", "replica-c"]
        .iter()
        .map(|n| OwnerId::new(*n))
        .collect::<Result<_, _>>()?;
    let (a, b, c) = (&replicas[0], &replicas[1], &replicas[2]);
    println!(
        "three replicas contend for {key} (ttl {TTL:?}); the resource keeps the highest token it accepted\n"
    );

    // All three try at once: exactly one wins.
    let mut lease_a = None;
    for r in &replicas {
        match store
            .acquire(&AcquireRequest::new(key.clone(), r.clone(), TTL))
            .await?
        {
            AcquireOutcome::Acquired(l) => {
                say(
                    r.as_str(),
                    format!("acquired the lease with fencing token {}", l.token()),
                );
                lease_a = Some(l);
            }
            AcquireOutcome::Held(h) => say(
                r.as_str(),
                format!(
                    "refused: held by {} (token {}, {:.0?} left)",
                    h.owner, h.token, h.remaining
                ),
            ),
        }
    }
    let lease_a = lease_a.ok_or("nobody acquired")?;
    assert_eq!(lease_a.owner(), a);
    let out = ledger
        .write(
            &key,
            lease_a.token(),
            WriteOp::Put(b"reconciled by a".to_vec()),
        )
        .await?;
    say(
        a.as_str(),
        format!("writes with token {}: {}", lease_a.token(), verdict(&out)),
    );

    say(
        a.as_str(),
        format!(
            "is PAUSED (stop-the-world GC) for {:?}, longer than its ttl",
            TTL * 2
        ),
    );
    // While a is paused, b and c keep trying; the store lets one of them in once a's lease expired.
    let lease_b = loop {
        match store
            .acquire(&AcquireRequest::new(key.clone(), b.clone(), TTL))
            .await?
        {
            AcquireOutcome::Acquired(l) => break l,
            AcquireOutcome::Held(h) => sleep(h.remaining + Duration::from_millis(5)).await,
        }
    };
    say(
        b.as_str(),
        format!(
            "acquired the expired lease with fencing token {} (> {})",
            lease_b.token(),
            lease_a.token()
        ),
    );
    let out = ledger.install(&key, lease_b.token()).await?;
    say(
        b.as_str(),
        format!(
            "installs generation {} at the resource before starting: {}",
            lease_b.token(),
            verdict(&out)
        ),
    );
    let out = ledger
        .write(
            &key,
            lease_b.token(),
            WriteOp::Put(b"reconciled by b".to_vec()),
        )
        .await?;
    say(
        b.as_str(),
        format!("writes with token {}: {}", lease_b.token(), verdict(&out)),
    );
    if let AcquireOutcome::Held(h) = store
        .acquire(&AcquireRequest::new(key.clone(), c.clone(), TTL))
        .await?
    {
        say(
            c.as_str(),
            format!("refused: held by {} with token {}", h.owner, h.token),
        );
    }

    // a wakes up, still believing it holds the lease, and finishes its work.
    let paused_until = t0 + TTL * 2 + Duration::from_millis(100);
    tokio::time::sleep_until(paused_until).await;
    say(
        a.as_str(),
        format!("wakes up and writes with its old token {}", lease_a.token()),
    );
    let late = ledger
        .write(
            &key,
            lease_a.token(),
            WriteOp::Put(b"reconciled by a (stale!)".to_vec()),
        )
        .await?;
    say(a.as_str(), format!("-> {}", verdict(&late)));
    let renew = store.renew(&lease_a).await?;
    say(
        a.as_str(),
        format!("tries to renew: {renew:?} -- it knows it lost the lease"),
    );

    let state = ledger.read(&key).await?;
    let value = String::from_utf8_lossy(state.value.as_deref().unwrap_or_default()).into_owned();
    println!(
        "\nresource: value {:?}, highest accepted token {}",
        value,
        state.high_water.map(|t| t.to_string()).unwrap_or_default()
    );
    match late {
        WriteOutcome::Rejected { .. } => {
            println!(
                "the stale write was REJECTED: the lease gave liveness, the fencing token gave safety."
            );
            Ok(())
        }
        WriteOutcome::Accepted { .. } => Err("BUG: the stale write was accepted".into()),
    }
}

fn verdict(out: &WriteOutcome) -> String {
    match out {
        WriteOutcome::Accepted { high_water } => {
            format!("accepted (highest token now {high_water})")
        }
        WriteOutcome::Rejected {
            presented,
            high_water,
        } => {
            format!("REJECTED: token {presented} is older than {high_water}")
        }
    }
}
