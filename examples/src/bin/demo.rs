//! The main demo, with no external service: three replicas contend for one key; the holder is
//! paused past its TTL (a GC pause, a VM suspend); another replica takes over with a greater
//! fencing token; the paused replica wakes up and its late write is rejected by the resource.
//!
//! ```text
//! cargo run -p leasehold-examples --bin demo                      # in-memory store
//! cargo run -p leasehold-examples --features redis --bin demo -- --store redis://127.0.0.1:6379
//! ```
//! Any store URL works (`postgres://`, `redis://`, `etcd://`, `k8s://`, `sqlite://`) with the
//! matching cargo feature; the fenced resource is then the backend's own.

use std::time::Duration;

use leasehold::{AcquireOutcome, AcquireRequest, LeaseKey, OwnerId, WriteOp, WriteOutcome};
use leasehold_examples::{Backend, store_url};
use tokio::time::{Instant, sleep};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = store_url();
    let backend = Backend::connect(&url).await?;
    // Stores without a server clock (Kubernetes) judge expiry by observation: give them longer.
    let wanted = match backend.store.capabilities().expiry_clock {
        leasehold::ExpiryClock::ObservedLocally => Duration::from_secs(3),
        _ => Duration::from_millis(800),
    };
    let ttl = backend.ttl(wanted);
    let (store, ledger) = (backend.store.clone(), backend.resource.clone());
    let other = backend.client().await?;
    let key = if url.starts_with("memory") {
        LeaseKey::new("tenant-42.reconcile")?
    } else {
        LeaseKey::derive(&format!("tenant-42.reconcile {}", OwnerId::random()))
    };
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
    println!(
        "three replicas contend for {key} on {} (ttl {ttl:?}); the resource keeps the highest token it accepted\n",
        store.backend()
    );

    // All three try at once: exactly one wins.
    let mut lease_a = None;
    for r in &replicas {
        match store
            .acquire(&AcquireRequest::new(key.clone(), r.clone(), ttl))
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
    // The winner ("a") gets paused; the others are "b" and "c".
    let a = lease_a.owner();
    let mut others = replicas.iter().filter(|r| *r != a);
    let (b, c) = (others.next().ok_or("b")?, others.next().ok_or("c")?);
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
            ttl * 2
        ),
    );
    // While a is paused, b and c keep trying; the store lets one of them in once a's lease expired.
    let give_up = Instant::now() + ttl * 5 + Duration::from_secs(10);
    let lease_b = loop {
        match other
            .acquire(&AcquireRequest::new(key.clone(), b.clone(), ttl * 10))
            .await?
        {
            AcquireOutcome::Acquired(l) => break l,
            AcquireOutcome::Held(h) if Instant::now() < give_up => {
                sleep(h.remaining.min(Duration::from_millis(200)) + Duration::from_millis(5)).await;
            }
            AcquireOutcome::Held(h) => {
                return Err(format!("{} still holds the key", h.owner).into());
            }
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
    if let AcquireOutcome::Held(h) = other
        .acquire(&AcquireRequest::new(key.clone(), c.clone(), ttl))
        .await?
    {
        say(
            c.as_str(),
            format!("refused: held by {} with token {}", h.owner, h.token),
        );
    }

    // a wakes up, still believing it holds the lease, and finishes its work.
    let paused_until = t0 + ttl * 2 + Duration::from_millis(100);
    tokio::time::sleep_until(paused_until.max(Instant::now())).await; // (a is "paused" until here; b already holds the key)
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
