//! A lease holder as a real process, for the fault suite: it acquires `--key` through `--url`
//! with the supervisor, and while the lease may be acted on performs a side effect and a fenced
//! write to the resource at `--resource`, printing JSON lines. After the lease is lost it makes
//! one late fenced write with its old token (modelling a write that was already in flight) and
//! exits.
//!
//! `lease-fault-holder --url URL --key KEY --ttl-ms N --resource HOST:PORT [--rounds N]`
//! With `--rounds N` it acquires, writes, releases N times (storm mode) instead.

use std::time::Duration;

use lease_core::LeaseKey;
use lease_core::supervisor::{Acquisition, Health, Supervisor, SupervisorConfig};
use lease_faults::resource::ResourceClient;
use serde_json::json;
use tokio::time::Instant;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn emit(v: serde_json::Value) {
    println!("{v}");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        emit(json!({"event": "error", "message": e}));
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let url = arg("--url").ok_or("--url is required")?;
    let key = LeaseKey::new(arg("--key").ok_or("--key is required")?).map_err(|e| e.to_string())?;
    let ttl = Duration::from_millis(
        arg("--ttl-ms")
            .ok_or("--ttl-ms")?
            .parse()
            .map_err(|_| "bad --ttl-ms")?,
    );
    let resource = arg("--resource")
        .ok_or("--resource")?
        .parse()
        .map_err(|_| "bad --resource")?;
    let rounds: Option<u32> = arg("--rounds").and_then(|r| r.parse().ok());
    let store = lease::connect(&url).await.map_err(|e| e.to_string())?;
    let mut res = ResourceClient::connect(resource)
        .await
        .map_err(|e| e.to_string())?;
    let sup = Supervisor::from_arc(
        store,
        SupervisorConfig::new(ttl).with_acquire_wait(ttl * 10),
    );
    let start = Instant::now();
    let ms = |t: Instant| (t - start).as_millis();
    for _ in 0..rounds.unwrap_or(1) {
        let guard = match sup.acquire(&key).await.map_err(|e| e.to_string())? {
            Acquisition::Acquired(g) => g,
            other => {
                emit(json!({"event": "not_acquired", "detail": format!("{other:?}")}));
                continue;
            }
        };
        let token = guard.token();
        emit(json!({"event": "acquired", "token": token.get(), "at_ms": ms(Instant::now())}));
        let mut last = Instant::now();
        let mut writes = 0u32;
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = Instant::now();
            if now - last > ttl / 2 {
                emit(json!({"event": "resumed", "gap_ms": (now - last).as_millis()}));
            }
            last = now;
            if guard.may_act() {
                // An unfenced side effect is only started while the lease may be acted on.
                let within = Instant::now() < guard.lease().deadline();
                emit(json!({"event": "side_effect", "within_deadline": within}));
                let accepted = res.add(&key, token, 1).await.map_err(|e| e.to_string())?;
                emit(json!({"event": "write", "token": token.get(), "accepted": accepted}));
                writes += 1;
                if rounds.is_some() && writes >= 3 {
                    let out = guard.release().await.map_err(|e| e.to_string())?;
                    emit(
                        json!({"event": "released", "token": token.get(), "outcome": format!("{out:?}")}),
                    );
                    break;
                }
            } else if let Health::Lost(reason) = guard.health() {
                emit(json!({"event": "lost", "token": token.get(), "reason": reason.to_string()}));
                let accepted = res.add(&key, token, 1).await.map_err(|e| e.to_string())?;
                emit(json!({"event": "late_write", "token": token.get(), "accepted": accepted}));
                if rounds.is_none() {
                    return Ok(());
                }
                break;
            }
        }
    }
    emit(json!({"event": "done"}));
    Ok(())
}
