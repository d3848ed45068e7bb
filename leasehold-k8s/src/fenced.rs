//! [`K8sFencedResource`]: a fenced resource on the Kubernetes side, one ConfigMap per key, the
//! high-water mark in an annotation checked on every conditional update (layout in
//! [`protocol`](crate::protocol)).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use leasehold_core::{
    Error, FenceOp, FencedResource, FencingToken, LeaseKey, ResourceState, Result, WriteOutcome,
};

use crate::error::{BACKEND, K8sError, timed};
use crate::protocol::{self, fence_object_name};

impl crate::K8sLeaseStore {
    /// The [`FencedResource`](leasehold_core::FencedResource) next to this store: ConfigMaps in the
    /// same namespace, named with the same prefix (`fence.<prefix><key>`), over the same client,
    /// with the same request timeout. Sends nothing.
    ///
    /// ```no_run
    /// use leasehold_core::{FencedResource, FencingToken, LeaseKey, WriteOp};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = leasehold_k8s::K8sLeaseStore::connect("k8s://payments").await?;
    /// let res = store.fenced_resource();
    /// let out = res.write(&LeaseKey::new("ledger")?, FencingToken::new(7)?, WriteOp::Add(1)).await?;
    /// println!("accepted: {}", out.is_accepted());
    /// # Ok(()) }
    /// ```
    pub fn fenced_resource(&self) -> K8sFencedResource {
        K8sFencedResource::new(
            Api::namespaced(self.client.clone(), self.namespace()),
            self.prefix.clone(),
            self.timeout,
        )
    }
}

const MAX_RACES: usize = 64;

/// A [`FencedResource`] kept in ConfigMaps named `fence.<prefix><key>` (the store's name prefix,
/// see [`fence_object_name`](crate::protocol::fence_object_name)), made by
/// [`K8sLeaseStore::fenced_resource`](crate::K8sLeaseStore::fenced_resource): the pattern a controller uses to
/// carry its term into the objects it writes.
///
/// Every write reads the object, compares the presented token with the
/// [`HIGH_WATER_ANNOTATION`](crate::protocol::HIGH_WATER_ANNOTATION), and writes the new value together with the new mark in one
/// `replace` conditioned on the resourceVersion it read (or a `create`), retrying lost races. A
/// deposed leader's write is therefore rejected even if it arrives after the new leader's.
///
/// ```no_run
/// use leasehold_core::{FencedResource, FencingToken, LeaseKey, WriteOp};
/// use leasehold_k8s::K8sFencedResource;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = leasehold_k8s::K8sLeaseStore::connect("k8s://default").await?;
/// let res: K8sFencedResource = store.fenced_resource();
/// let out = res.write(&LeaseKey::new("ledger")?, FencingToken::new(7)?, WriteOp::Add(1)).await?;
/// println!("accepted: {}", out.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct K8sFencedResource {
    api: Api<ConfigMap>,
    prefix: String,
    timeout: Duration,
}

impl fmt::Debug for K8sFencedResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("K8sFencedResource")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl K8sFencedResource {
    pub(crate) fn new(api: Api<ConfigMap>, prefix: String, timeout: Duration) -> Self {
        K8sFencedResource {
            api,
            prefix,
            timeout,
        }
    }

    async fn apply_op(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        let op = op.into_write_op();
        let name = fence_object_name(&self.prefix, key)?;
        for _ in 0..MAX_RACES {
            let current = timed("get", self.timeout, self.api.get_opt(&name))
                .await
                .map_err(|e| e.into_error("get"))?;
            let mut state = match &current {
                Some(cm) => protocol::parse_fence(cm)?,
                None => ResourceState::default(),
            };
            let out = state.apply(token, op.as_ref());
            if let WriteOutcome::Rejected { high_water, .. } = out
                && !leasehold_core::mutation::on("k8s.fence.accept_stale")
            {
                tracing::debug!(backend = BACKEND, key = %key, token = %token, high_water = %high_water, "stale token rejected");
                return Ok(out);
            }
            let result = match current {
                Some(mut cm) => {
                    protocol::render_fence(&mut cm, &state);
                    // Mutation switch point: the mutant drops the replace's precondition.
                    if leasehold_core::mutation::on("k8s.fence.unconditional") {
                        cm.metadata.resource_version = None;
                    }
                    timed(
                        "replace",
                        self.timeout,
                        self.api.replace(&name, &PostParams::default(), &cm),
                    )
                    .await
                }
                None => {
                    let cm = protocol::new_fence(&name, &state);
                    timed(
                        "create",
                        self.timeout,
                        self.api.create(&PostParams::default(), &cm),
                    )
                    .await
                }
            };
            match result {
                Ok(_) => return Ok(WriteOutcome::Accepted { high_water: token }),
                Err(K8sError::Conflict | K8sError::AlreadyExists) => continue,
                Err(K8sError::NotFound(m)) => {
                    return Err(Error::config(
                        BACKEND,
                        format!("cannot write ConfigMap {name:?}: {m}"),
                        None,
                    ));
                }
                Err(e) => return Err(e.into_error("write")),
            }
        }
        // Every write lost its race (a 409): none was applied.
        Err(Error::refused(
            BACKEND,
            format!("lost {MAX_RACES} consecutive write races on ConfigMap {name:?}"),
            None,
        ))
    }
}

#[async_trait]
impl FencedResource for K8sFencedResource {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        self.apply_op(key, token, op).await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        let name = fence_object_name(&self.prefix, key)?;
        match timed("get", self.timeout, self.api.get_opt(&name))
            .await
            .map_err(|e| e.into_error("get"))?
        {
            Some(cm) => protocol::parse_fence(&cm),
            None => Ok(ResourceState::default()),
        }
    }
}
