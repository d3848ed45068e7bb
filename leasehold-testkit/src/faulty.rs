//! A fault-injecting [`LeaseStore`] wrapper, switchable at run time.
//!
//! Wrap any store; then make any operation fail, hang, slow down, or be *applied with its response
//! dropped* (the outcome-unknown case), and heal it again. The wrapper also counts calls per
//! operation, which the benchmarks use to count round trips.
//!
//! ```
//! use std::time::Duration;
//! use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId};
//! use leasehold_testkit::faulty::{Fault, FaultyStore, Operation};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = FaultyStore::new(MemoryLeaseStore::new());
//! store.set(Operation::Acquire, Fault::Fail);
//! let req = AcquireRequest::new(LeaseKey::new("k")?, OwnerId::random(), Duration::from_secs(1));
//! assert!(store.acquire(&req).await.unwrap_err().is_retryable());
//! store.heal();
//! assert!(store.acquire(&req).await?.lease().is_some());
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, HeldBy, KeyState, KeyWatch, Lease,
    LeaseKey, LeaseStore, ReleaseOutcome, RenewOutcome, Result,
};

/// The operations that can be faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `acquire`
    Acquire,
    /// `renew`
    Renew,
    /// `release`
    Release,
    /// `inspect`
    Inspect,
    /// `watch`
    Watch,
}

/// What happens to an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward normally.
    Pass,
    /// Fail with a retryable [`Error::Unavailable`] without reaching the store.
    Fail,
    /// Never answer (until the caller gives up) without reaching the store.
    Hang,
    /// Wait this long, then forward.
    Delay(Duration),
    /// Forward (the store applies it), then never answer: the outcome is unknown to the caller.
    DropResponse,
}

#[derive(Debug, Default)]
struct Counters {
    calls: HashMap<Operation, AtomicU64>,
}

/// The wrapper. Cloning shares the fault switches and counters.
#[derive(Debug, Clone)]
pub struct FaultyStore<S> {
    inner: S,
    faults: Arc<Mutex<HashMap<Operation, Fault>>>,
    counters: Arc<Counters>,
}

impl<S: LeaseStore> FaultyStore<S> {
    /// Wraps `inner` with every operation passing.
    pub fn new(inner: S) -> Self {
        let mut calls = HashMap::new();
        for op in [
            Operation::Acquire,
            Operation::Renew,
            Operation::Release,
            Operation::Inspect,
            Operation::Watch,
        ] {
            calls.insert(op, AtomicU64::new(0));
        }
        FaultyStore {
            inner,
            faults: Arc::default(),
            counters: Arc::new(Counters { calls }),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Sets the fault for `op`.
    pub fn set(&self, op: Operation, fault: Fault) {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(op, fault);
    }

    /// Sets the same fault for acquire, renew, release and inspect (a partition).
    pub fn set_all(&self, fault: Fault) {
        for op in [
            Operation::Acquire,
            Operation::Renew,
            Operation::Release,
            Operation::Inspect,
        ] {
            self.set(op, fault);
        }
    }

    /// Every operation passes again.
    pub fn heal(&self) {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// How many times `op` was called (faulted or not).
    pub fn calls(&self, op: Operation) -> u64 {
        self.counters
            .calls
            .get(&op)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    fn fault(&self, op: Operation) -> Fault {
        if let Some(c) = self.counters.calls.get(&op) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        *self
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&op)
            .unwrap_or(&Fault::Pass)
    }

    async fn run<T, F>(&self, op: Operation, f: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>> + Send,
    {
        match self.fault(op) {
            Fault::Pass => f.await,
            Fault::Fail => Err(Error::unavailable(
                "faulty",
                format!("injected failure of {op:?}"),
                None,
            )),
            Fault::Hang => std::future::pending().await,
            Fault::Delay(d) => {
                tokio::time::sleep(d).await;
                f.await
            }
            Fault::DropResponse => {
                let _applied = f.await;
                std::future::pending().await
            }
        }
    }
}

#[async_trait]
impl<S: LeaseStore> LeaseStore for FaultyStore<S> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.run(Operation::Acquire, self.inner.acquire(req)).await
    }
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        self.run(Operation::Renew, self.inner.renew(lease)).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.run(Operation::Release, self.inner.release(lease))
            .await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.run(Operation::Inspect, self.inner.inspect(key)).await
    }
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        self.run(Operation::Inspect, self.inner.inspect_many(keys))
            .await
    }
    async fn holders_many(&self, keys: &[LeaseKey]) -> Result<Vec<Option<HeldBy>>> {
        self.run(Operation::Inspect, self.inner.holders_many(keys))
            .await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        self.run(Operation::Watch, self.inner.watch(key)).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        self.run(Operation::Renew, self.inner.renew_many(leases))
            .await
    }
}
