//! [`KubeFencedResource`]: a fenced resource on the Kubernetes side, one ConfigMap per key, the
//! high-water mark in an annotation checked on every conditional update.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use lease_core::{
    Error, FencedResource, FencingToken, LeaseKey, ResourceState, Result, WriteOp, WriteOutcome,
};

use crate::error::{BACKEND, KubeError, corrupt, timed};
use crate::store::{DEFAULT_REQUEST_TIMEOUT, validate_namespace};

/// The annotation holding the highest fencing token a resource object accepted.
pub const HIGH_WATER_ANNOTATION: &str = "lease.rs/high-water";
const MAX_RACES: usize = 64;

/// A [`FencedResource`] kept in ConfigMaps named `fence.<key>`: the pattern a controller uses to
/// carry its term into the objects it writes.
///
/// Every write reads the object, compares the presented token with the
/// [`HIGH_WATER_ANNOTATION`], and writes the new value together with the new mark in one
/// `replace` conditioned on the resourceVersion it read (or a `create`), retrying lost races. A
/// deposed leader's write is therefore rejected even if it arrives after the new leader's.
///
/// ```no_run
/// use lease_core::{FencedResource, FencingToken, LeaseKey, WriteOp};
/// use lease_k8s::KubeFencedResource;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// let client = lease_k8s::infer_client().await?;
/// let res = KubeFencedResource::new(client, "default")?;
/// let out = res.write(&LeaseKey::new("ledger")?, FencingToken::new(7)?, WriteOp::Add(1)).await?;
/// println!("accepted: {}", out.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct KubeFencedResource {
    api: Api<ConfigMap>,
    timeout: Duration,
}

impl fmt::Debug for KubeFencedResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeFencedResource")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The name of the ConfigMap that holds the fenced state of `key`.
pub fn fence_object_name(key: &LeaseKey) -> String {
    format!("fence.{key}")
}

impl KubeFencedResource {
    /// A resource over `client` with its ConfigMaps in `namespace`.
    ///
    /// # Errors
    /// [`Error::Config`] if `namespace` is not a DNS-1123 label.
    pub fn new(client: kube::Client, namespace: &str) -> Result<Self> {
        validate_namespace(namespace)?;
        Ok(KubeFencedResource {
            api: Api::namespaced(client, namespace),
            timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: Option<WriteOp>,
    ) -> Result<WriteOutcome> {
        let name = fence_object_name(key);
        for _ in 0..MAX_RACES {
            let current = timed("get", self.timeout, self.api.get_opt(&name))
                .await
                .map_err(|e| e.into_error("get"))?;
            let mut state = match &current {
                Some(cm) => parse(cm)?,
                None => ResourceState::default(),
            };
            let out = state.apply(token, op.as_ref());
            if let WriteOutcome::Rejected { high_water, .. } = out {
                tracing::debug!(backend = BACKEND, key = %key, token = %token, high_water = %high_water, "stale token rejected");
                return Ok(out);
            }
            let result = match current {
                Some(mut cm) => {
                    render(&mut cm, &state);
                    timed(
                        "replace",
                        self.timeout,
                        self.api.replace(&name, &PostParams::default(), &cm),
                    )
                    .await
                }
                None => {
                    let mut cm = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            ..ObjectMeta::default()
                        },
                        ..ConfigMap::default()
                    };
                    render(&mut cm, &state);
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
                Err(KubeError::Conflict | KubeError::AlreadyExists) => continue,
                Err(KubeError::NotFound(m)) => {
                    return Err(Error::config(
                        BACKEND,
                        format!("cannot write ConfigMap {name:?}: {m}"),
                        None,
                    ));
                }
                Err(e) => return Err(e.into_error("write")),
            }
        }
        Err(Error::unavailable(
            BACKEND,
            format!("lost {MAX_RACES} consecutive write races on ConfigMap {name:?}"),
            None,
        ))
    }
}

fn parse(cm: &ConfigMap) -> Result<ResourceState> {
    let num = |field: &str| -> Result<Option<i64>> {
        match cm.data.as_ref().and_then(|d| d.get(field)) {
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| corrupt(format!("ConfigMap field {field}: {v:?}"))),
            None => Ok(None),
        }
    };
    let high_water = match cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HIGH_WATER_ANNOTATION))
    {
        Some(t) => Some(t.parse::<FencingToken>()?),
        None => None,
    };
    Ok(ResourceState {
        high_water,
        value: cm
            .binary_data
            .as_ref()
            .and_then(|b| b.get("value"))
            .map(|v| v.0.clone()),
        counter: num("counter")?.unwrap_or(0),
        accepted: u64::try_from(num("accepted")?.unwrap_or(0))
            .map_err(|_| corrupt("negative accepted count"))?,
    })
}

fn render(cm: &mut ConfigMap, state: &ResourceState) {
    if let Some(t) = state.high_water {
        cm.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(HIGH_WATER_ANNOTATION.into(), t.to_string());
    }
    let data = cm.data.get_or_insert_with(BTreeMap::new);
    data.insert("counter".into(), state.counter.to_string());
    data.insert("accepted".into(), state.accepted.to_string());
    if let Some(v) = &state.value {
        cm.binary_data
            .get_or_insert_with(BTreeMap::new)
            .insert("value".into(), ByteString(v.clone()));
    }
}

#[async_trait]
impl FencedResource for KubeFencedResource {
    async fn write(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: WriteOp,
    ) -> Result<WriteOutcome> {
        self.apply(key, token, Some(op)).await
    }

    async fn install(&self, key: &LeaseKey, token: FencingToken) -> Result<WriteOutcome> {
        self.apply(key, token, None).await
    }

    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        let name = fence_object_name(key);
        match timed("get", self.timeout, self.api.get_opt(&name))
            .await
            .map_err(|e| e.into_error("get"))?
        {
            Some(cm) => parse(&cm),
            None => Ok(ResourceState::default()),
        }
    }
}
