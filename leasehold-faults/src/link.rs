//! The link between a contender and a service (its store or its fenced resource), and the faults
//! a storm injects on it. A network backend's link is a loopback
//! [`FaultProxy`]; an in-process one (the memory store, SQLite)
//! is a wrapper that hangs, fails, delays or drops the answers of calls.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::proxy::{FaultProxy, Mode};
use async_trait::async_trait;
use leasehold_core::{
    Error, FenceOp, FencedResource, FencingToken, LeaseKey, LeaseStore, ResourceState, Result,
    WriteOutcome,
};
use leasehold_testkit::faulty::{Fault, FaultyStore};

/// A fault on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkFault {
    /// Nothing gets through and nothing answers (a silent partition).
    Blackhole,
    /// Requests get through and are applied; answers are lost.
    DropResponses,
    /// Connections are reset (calls fail at once).
    Reset,
    /// Every call takes this much longer (both directions together).
    Latency(Duration),
}

/// A link whose fault can be switched at run time.
pub trait Link: Send + Sync + std::fmt::Debug {
    /// Injects `fault` until [`heal`](Link::heal).
    fn set(&self, fault: LinkFault);
    /// Passes everything again.
    fn heal(&self);
}

/// A proxy link.
#[derive(Debug)]
pub struct ProxyLink(pub Arc<FaultProxy>);

impl Link for ProxyLink {
    fn set(&self, fault: LinkFault) {
        self.0.set_mode(match fault {
            LinkFault::Blackhole => Mode::Blackhole,
            LinkFault::DropResponses => Mode::DropResponses,
            LinkFault::Reset => Mode::Reset,
            // The proxy delays each chunk in each direction.
            LinkFault::Latency(d) => Mode::Latency(d / 2),
        });
    }
    fn heal(&self) {
        self.0.heal();
    }
}

fn fault_of(f: LinkFault) -> Fault {
    match f {
        LinkFault::Blackhole => Fault::Hang,
        LinkFault::DropResponses => Fault::DropResponse,
        LinkFault::Reset => Fault::Fail,
        LinkFault::Latency(d) => Fault::Delay(d),
    }
}

/// An in-process store link: a [`FaultyStore`] around the contender's store.
#[derive(Debug, Clone)]
pub struct StoreLink(pub FaultyStore<Arc<dyn LeaseStore>>);

impl Link for StoreLink {
    fn set(&self, fault: LinkFault) {
        self.0.set_all(fault_of(fault));
    }
    fn heal(&self) {
        self.0.heal();
    }
}

/// An in-process fenced-resource link: forwards to the resource, faulted like [`FaultyStore`].
/// `base` latency (if any) is added to every call, so that writes take time as over a network.
#[derive(Debug, Clone)]
pub struct FaultyResource {
    inner: Arc<dyn FencedResource>,
    fault: Arc<Mutex<Option<Fault>>>,
    base: Duration,
}

impl FaultyResource {
    /// Wraps `inner`; every call takes at least `base`.
    pub fn new(inner: Arc<dyn FencedResource>, base: Duration) -> Self {
        FaultyResource {
            inner,
            fault: Arc::default(),
            base,
        }
    }

    async fn run<T, F>(&self, f: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>> + Send,
    {
        if !self.base.is_zero() {
            tokio::time::sleep(self.base).await;
        }
        let fault = *self.fault.lock().unwrap_or_else(|p| p.into_inner());
        match fault {
            None | Some(Fault::Pass) => f.await,
            Some(Fault::Fail) => Err(Error::unavailable(
                "faulty-resource",
                "injected failure".to_string(),
                None,
            )),
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                f.await
            }
            Some(Fault::DropResponse) => {
                let _applied = f.await;
                std::future::pending().await
            }
        }
    }
}

impl Link for FaultyResource {
    fn set(&self, fault: LinkFault) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(fault_of(fault));
    }
    fn heal(&self) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

#[async_trait]
impl FencedResource for FaultyResource {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        self.run(self.inner.apply(key, token, op)).await
    }
    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        self.run(self.inner.read(key)).await
    }
}
