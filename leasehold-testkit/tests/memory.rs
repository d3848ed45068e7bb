//! The whole suite against the in-memory reference store.

use std::sync::Arc;

use leasehold_core::{FencedResource, LeaseStore, MemoryFencedResource, MemoryLeaseStore};
use leasehold_testkit::{Backend, BoxFuture};

/// One shared store and resource; every "client" is a handle to the same state.
#[derive(Debug, Default)]
struct Memory {
    store: MemoryLeaseStore,
    resource: MemoryFencedResource,
}

impl Backend for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }
    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(self.store.clone()) as Arc<dyn LeaseStore>) })
    }
    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async { Ok(Arc::new(self.resource.clone()) as Arc<dyn FencedResource>) })
    }
}

fn main() {
    leasehold_testkit::run(Memory::default());
}
