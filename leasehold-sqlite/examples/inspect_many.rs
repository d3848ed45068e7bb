//! Measures `inspect_many` over 10,000 keys against 10,000 single `inspect`s on one SQLite file
//! (what `leasehold-shard` does every rebalance interval).
//!
//! `cargo run --release -p leasehold-sqlite --example inspect_many [KEYS] [ROUNDS]`
//!
//! Of the keys, a third is held, a third was released, a third was never granted. Prints the
//! median and the maximum of each over the rounds (the two alternate, so load on the machine
//! falls on both alike).

use std::time::{Duration, Instant};

use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, OwnerId};
use leasehold_sqlite::SqliteLeaseStore;

#[tokio::main(flavor = "current_thread")]
async fn main() -> leasehold_core::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(11);
    let dir = std::env::temp_dir().join(format!(
        "leasehold-sqlite-inspect-many-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("create the directory");
    let store = SqliteLeaseStore::open(dir.join("leases.db")).await?;
    let owner = OwnerId::with_label("bench");
    let keys: Vec<LeaseKey> = (0..n)
        .map(|i| LeaseKey::new(format!("shard-{i}")))
        .collect::<leasehold_core::Result<_>>()?;
    for (i, key) in keys.iter().enumerate() {
        if i % 3 == 2 {
            continue;
        }
        let req = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(600));
        let lease = store
            .acquire(&req)
            .await?
            .lease()
            .expect("a fresh key is free");
        if i % 3 == 1 {
            let _ = store.release(&lease).await?;
        }
    }
    let (mut many, mut single) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let states = store.inspect_many(&keys).await?;
        many.push(t.elapsed());
        assert_eq!(states.len(), n);
        let t = Instant::now();
        let mut held = 0;
        for key in &keys {
            held += usize::from(store.inspect(key).await?.holder.is_some());
        }
        single.push(t.elapsed());
        assert_eq!(held, states.iter().filter(|s| s.holder.is_some()).count());
    }
    many.sort();
    single.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (m, s) = (many[rounds / 2], single[rounds / 2]);
    println!(
        "{n} keys, {rounds} rounds: inspect_many median {:.1} ms (max {:.1}); {n} x inspect median {:.1} ms (max {:.1}); ratio {:.1}x",
        ms(m),
        ms(many[rounds - 1]),
        ms(s),
        ms(single[rounds - 1]),
        s.as_secs_f64() / m.as_secs_f64()
    );
    store.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
