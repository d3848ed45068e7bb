//! Leader election with fenced heartbeats: three candidates; the leader writes a heartbeat with
//! its term through a fenced resource; the leader is frozen past its TTL (its network and its
//! worker both stall); a new leader is elected with a higher term; the old leader wakes, its
//! write is rejected, and it notices it lost.
//!
//! ```text
//! cargo run -p leasehold-examples --bin election
//! cargo run -p leasehold-examples --features etcd --bin election -- --store etcd://127.0.0.1:2379
//! ```

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use leasehold::election::{Election, ElectionEvent};
use leasehold::supervisor::SupervisorConfig;
use leasehold::{FencingToken, LeaseKey, OwnerId, WriteOp, WriteOutcome};
use leasehold_examples::{Backend, Network, store_url};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};

#[derive(Debug)]
enum Note {
    Event(usize, ElectionEvent),
    Wrote(usize, FencingToken, WriteOutcome),
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = store_url();
    let backend = Backend::connect(&url).await?;
    let wanted = match backend.store.capabilities().expiry_clock {
        leasehold::ExpiryClock::ObservedLocally => Duration::from_secs(3),
        _ => Duration::from_millis(900),
    };
    let ttl = backend.ttl(wanted);
    let heartbeat = backend.resource.clone();
    let key = if url.starts_with("memory") {
        LeaseKey::new("scheduler.leader")?
    } else {
        LeaseKey::derive(&format!("scheduler.leader {}", OwnerId::random()))
    };
    println!(
        "three candidates elect a leader for {key} on {} (ttl {ttl:?})\n",
        backend.store.backend()
    );
    let cfg = SupervisorConfig::new(ttl).with_acquire_wait(ttl);
    let t0 = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let names = ["node-1", "node-2", "node-3"];
    let mut networks = Vec::new();
    // The first term to be elected is the one whose leader freezes.
    let first_term: Arc<OnceLock<FencingToken>> = Arc::new(OnceLock::new());
    for (i, name) in names.iter().enumerate() {
        // Each node reaches the store through its own "network", which we can freeze.
        let net = Network::new(backend.client().await?);
        networks.push(net.clone());
        let mut node = Election::new(net, key.clone(), cfg.clone()).join(OwnerId::new(*name)?);
        let (tx, heartbeat, key, first) = (
            tx.clone(),
            heartbeat.clone(),
            key.clone(),
            first_term.clone(),
        );
        tokio::spawn(async move {
            while let Some(ev) = node.next_event().await {
                if let ElectionEvent::Elected { term, work, .. } = &ev {
                    let frozen = *first.get_or_init(|| *term) == *term;
                    // Leader-only work: a heartbeat every 200 ms, carrying the term.
                    let (term, work, tx, heartbeat, key) = (
                        *term,
                        work.clone(),
                        tx.clone(),
                        heartbeat.clone(),
                        key.clone(),
                    );
                    tokio::spawn(async move {
                        let mut beats = 0;
                        loop {
                            beats += 1;
                            if frozen && beats == 3 {
                                // The first leader freezes mid-work for 3 TTLs (it already decided to write).
                                sleep(ttl * 3).await;
                            } else if work.is_cancelled() {
                                return;
                            }
                            let out = match heartbeat.write(&key, term, WriteOp::Add(1)).await {
                                Ok(out) => out,
                                Err(e) => {
                                    // The resource is unreachable: nothing was written; retry.
                                    eprintln!("heartbeat failed: {e}");
                                    sleep(Duration::from_millis(200)).await;
                                    continue;
                                }
                            };
                            let _ = tx.send(Note::Wrote(i, term, out));
                            if !out.is_accepted() {
                                return;
                            }
                            sleep(Duration::from_millis(200)).await;
                        }
                    });
                }
                let _ = tx.send(Note::Event(i, ev));
            }
        });
    }
    drop(tx);
    let mut rejected = false;
    let mut shown = 0;
    let mut terms = Vec::new();
    let deadline = t0 + ttl * 10 + Duration::from_secs(20);
    while let Ok(Some(note)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        let at = t0.elapsed().as_secs_f64() * 1e3;
        match note {
            Note::Event(i, ElectionEvent::Elected { term, .. }) => {
                println!("[{at:>6.0} ms] {} is elected leader, term {term}", names[i]);
                terms.push(term);
                if first_term.get() == Some(&term) {
                    println!(
                        "[{at:>6.0} ms] {} will freeze after its second heartbeat (network and worker stall)",
                        names[i]
                    );
                }
            }
            Note::Event(i, ElectionEvent::SteppedDown { term, reason }) => {
                println!(
                    "[{at:>6.0} ms] {} notices it lost leadership of term {term} ({reason}) and steps down",
                    names[i]
                );
            }
            Note::Event(..) => {}
            Note::Wrote(i, term, WriteOutcome::Accepted { .. }) => {
                shown += 1;
                if shown <= 4 {
                    println!(
                        "[{at:>6.0} ms] {} heartbeat with term {term}: accepted",
                        names[i]
                    );
                } else if shown == 5 {
                    println!("[{at:>6.0} ms] ... (heartbeats continue)");
                }
                if first_term.get() == Some(&term) {
                    // freeze the first leader's network after its first heartbeat
                    networks[i].freeze();
                }
            }
            Note::Wrote(i, term, WriteOutcome::Rejected { high_water, .. }) => {
                println!(
                    "[{at:>6.0} ms] {} wakes up and writes a heartbeat with term {term}: REJECTED (term {high_water} is current)",
                    names[i]
                );
                rejected = true;
            }
        }
        if rejected && terms.len() >= 2 {
            break;
        }
    }
    let state = heartbeat.read(&key).await?;
    println!(
        "\nheartbeats accepted: {}, current term at the resource: {}",
        state.accepted,
        state.high_water.map(|t| t.to_string()).unwrap_or_default()
    );
    if rejected && terms.windows(2).all(|w| w[1] > w[0]) {
        let terms: Vec<String> = terms.iter().map(ToString::to_string).collect();
        println!(
            "a frozen leader's late write was rejected; terms only went up: {}",
            terms.join(" < ")
        );
        Ok(())
    } else {
        Err("the story did not unfold as expected".into())
    }
}
