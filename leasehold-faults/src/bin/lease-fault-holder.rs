//! A lease holder as a real process, for the fault suite: it acquires `--key` through `--url`
//! with the supervisor, and while the lease may be acted on performs a side effect and a fenced
//! write to the resource at `--resource`, printing JSON lines. After the lease is lost it makes
//! one late fenced write with its old token (modelling a write that was already in flight) and
//! exits.
//!
//! `lease-fault-holder --url URL --key KEY --ttl-ms N --resource HOST:PORT [--rounds N]`
//! With `--rounds N` it acquires, writes, releases N times (storm mode) instead.
//!
//! `lease-fault-holder --process-storm --url URL --resource-url URL --keys KEY[,KEY...] --ttl-ms N
//! --rounds N --seed S`: the holder of a process storm (`leasehold_faults::procstorm`). Each round it
//! picks one of the keys at random, acquires it, holds for 0.5 to 2 TTLs writing `Add(1)` through the fenced resource at
//! `--resource-url` while `may_act()` holds, and releases. Every operation is printed twice, when
//! invoked (`begin`) and when it ended, with `CLOCK_MONOTONIC` nanoseconds (`t`, `t0`, `t1`,
//! `deadline`), a clock shared with the parent process, so the parent can build one history of
//! processes it kills and pauses, and with its key; each `begin` also carries the process's wall
//! clock (`wall_ms`), so the parent can see a skew or step of it take effect.

use std::time::Duration;

use leasehold_core::LeaseKey;
use leasehold_core::supervisor::{Acquisition, Health, Supervisor, SupervisorConfig};
use leasehold_faults::resource::ResourceClient;
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
    // Die with the process that started us (the storm or scenario), also when it is killed and
    // cannot kill us: a holder left behind SIGSTOPped keeps its database locks for good (a killed
    // soak once left one whose open transaction blocked the next run's DDL). The signal is
    // delivered even to a stopped process. If that parent is already gone, stop now.
    let parent = nix::unistd::getppid();
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    if nix::unistd::getppid() != parent {
        std::process::exit(3);
    }
    if let Err(e) = run().await {
        emit(json!({"event": "error", "message": e}));
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    if std::env::args().any(|a| a == "--process-storm") {
        return process_storm().await;
    }
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
    let store = leasehold::connect(&url).await.map_err(|e| e.to_string())?;
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

/// `CLOCK_MONOTONIC` now, in nanoseconds.
fn mono() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

/// A tokio instant as `CLOCK_MONOTONIC` nanoseconds.
fn mono_of(at: Instant) -> u64 {
    let now = Instant::now();
    let m = mono();
    if at >= now {
        m + u64::try_from((at - now).as_nanos()).unwrap_or(u64::MAX / 2)
    } else {
        m.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(0))
    }
}

/// Prints confirmed renewals and losses.
#[derive(Debug)]
struct Printer;

impl leasehold_core::supervisor::Hook for Printer {
    fn renewal(
        &self,
        lease: &leasehold_core::Lease,
        result: leasehold_core::supervisor::RenewalResult,
        latency: Duration,
    ) {
        if let leasehold_core::supervisor::RenewalResult::Confirmed { .. } = result {
            let t1 = mono();
            let t0 = t1.saturating_sub(u64::try_from(latency.as_nanos()).unwrap_or(0));
            emit(
                json!({"event": "renewed", "key": lease.key().as_str(), "token": lease.token().get(),
                "t0": t0, "t1": t1, "deadline": mono_of(lease.deadline())}),
            );
        }
    }
    fn health_changed(&self, lease: &leasehold_core::Lease, _from: Health, to: Health) {
        if matches!(to, Health::Lost(_)) {
            emit(
                json!({"event": "lost", "key": lease.key().as_str(), "token": lease.token().get(),
                "t": mono()}),
            );
        }
    }
}

async fn process_storm() -> Result<(), String> {
    use leasehold_core::WriteOp;
    let url = arg("--url").ok_or("--url is required")?;
    let rurl = arg("--resource-url").ok_or("--resource-url is required")?;
    let keys = arg("--keys")
        .or_else(|| arg("--key"))
        .ok_or("--keys is required")?
        .split(',')
        .map(|k| LeaseKey::new(k).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let ttl = Duration::from_millis(
        arg("--ttl-ms")
            .and_then(|v| v.parse().ok())
            .ok_or("bad --ttl-ms")?,
    );
    let rounds: u32 = arg("--rounds").and_then(|r| r.parse().ok()).unwrap_or(3);
    let mut rng = fastrand::Rng::with_seed(arg("--seed").and_then(|r| r.parse().ok()).unwrap_or(1));
    let store = leasehold::connect(&url).await.map_err(|e| e.to_string())?;
    let resource = leasehold::connect_resource(&rurl)
        .await
        .map_err(|e| e.to_string())?;
    let sup = Supervisor::from_arc(store, SupervisorConfig::new(ttl).with_acquire_wait(ttl * 5))
        .with_hook(std::sync::Arc::new(Printer));
    // The wall clock (here and in every `begin`), so that the storm can see that a skew or a
    // step it asked for (libfaketime) took effect.
    let wall_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    };
    emit(json!({"event": "ready", "wall_ms": wall_ms()}));
    for _ in 0..rounds {
        let key = keys[rng.usize(0..keys.len())].clone();
        let k = key.as_str();
        let t0 = mono();
        emit(json!({"event": "begin", "op": "acquire", "key": k, "t": t0, "wall_ms": wall_ms()}));
        let acq = tokio::time::timeout(ttl * 6, sup.acquire(&key)).await;
        let guard = match acq {
            Ok(Ok(Acquisition::Acquired(g))) => g,
            Ok(Ok(_)) => {
                emit(json!({"event": "refused", "key": k, "t0": t0, "t1": mono()}));
                continue;
            }
            _ => {
                emit(json!({"event": "acquire_unknown", "key": k, "t0": t0, "t1": mono()}));
                continue;
            }
        };
        let token = guard.token();
        emit(
            json!({"event": "granted", "key": k, "token": token.get(), "t0": t0, "t1": mono(),
            "deadline": mono_of(guard.lease().deadline())}),
        );
        let until = Instant::now() + ttl.mul_f64(0.5 + rng.f64() * 1.5);
        while Instant::now() < until && guard.may_act() {
            let t0 = mono();
            emit(
                json!({"event": "begin", "op": "write", "key": k, "token": token.get(), "t": t0,
                "wall_ms": wall_ms()}),
            );
            let w = guard
                .run(tokio::time::timeout(
                    ttl / 3,
                    resource.write(&key, token, WriteOp::Add(1)),
                ))
                .await;
            match w {
                Ok(Ok(Ok(out))) => emit(json!({"event": "write", "key": k, "token": token.get(),
                    "accepted": out.is_accepted(), "t0": t0, "t1": mono()})),
                // An error that states nothing was sent or applied: not accepted.
                Ok(Ok(Err(e))) if !e.outcome_unknown() => emit(json!({"event": "write",
                    "key": k, "token": token.get(), "accepted": false, "t0": t0, "t1": mono()})),
                _ => emit(
                    json!({"event": "write_unknown", "key": k, "token": token.get(), "t0": t0,
                    "t1": mono()}),
                ),
            }
            tokio::time::sleep(Duration::from_millis(rng.u64(5..25))).await;
        }
        let t0 = mono();
        emit(
            json!({"event": "begin", "op": "release", "key": k, "token": token.get(), "t": t0,
            "wall_ms": wall_ms()}),
        );
        let _ = tokio::time::timeout(ttl * 2, guard.release()).await;
        emit(json!({"event": "released", "key": k, "token": token.get(), "t0": t0, "t1": mono()}));
    }
    emit(json!({"event": "done"}));
    Ok(())
}
