//! The exact objects this backend writes, in one place: the Lease record with the client-go
//! meaning of every field, the token annotations, the fenced resource's ConfigMap layout, and
//! the watch selector.
//!
//! For baselines and tooling: the exact text this backend sends. `leasehold-bench` builds its raw
//! Kubernetes requests from these functions instead of copying them. Applications do not need
//! this module.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::{Lease as KubeLease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use leasehold_core::backend::{corrupt, decode_token};
use leasehold_core::{FencingToken, LeaseKey, OwnerId, ResourceState, Result, mutation};

use crate::error::BACKEND;

/// The annotation that carries the fencing token of the current (or last) grant made by this
/// crate. Kept on release so that the generation survives.
pub const TOKEN_ANNOTATION: &str = "lease.rs/fencing-token";
/// The annotation naming the holder the token belongs to. A Go controller that takes the Lease
/// over keeps our annotations but writes its own `holderIdentity`; the mismatch tells us that the
/// current holder has no token of ours.
pub const TOKEN_HOLDER_ANNOTATION: &str = "lease.rs/token-holder";
/// The annotation holding the highest fencing token a fenced-resource ConfigMap accepted.
pub const HIGH_WATER_ANNOTATION: &str = "lease.rs/high-water";
/// The ConfigMap `data` field of the fenced resource's counter (decimal).
pub const COUNTER_FIELD: &str = "counter";
/// The ConfigMap `data` field counting the writes the fenced resource accepted (decimal).
pub const ACCEPTED_FIELD: &str = "accepted";
/// The ConfigMap `binaryData` field of the fenced resource's value.
pub const VALUE_FIELD: &str = "value";

/// The longest Kubernetes object name (a DNS-1123 subdomain).
pub const MAX_OBJECT_NAME_LEN: usize = 253;

/// The name of the ConfigMap that holds the fenced state of `key` for a store whose objects are
/// named with `prefix` (see [`K8sOptions::with_name_prefix`](crate::K8sOptions::with_name_prefix)):
/// `fence.<prefix><key>`, that is `fence.` and the name of the key's Lease object. Two stores
/// with different prefixes in one namespace therefore keep different high-water marks for the
/// same key, as they keep different Leases.
///
/// ```
/// use leasehold_core::LeaseKey;
/// use leasehold_k8s::protocol::fence_object_name;
/// assert_eq!(fence_object_name("", &LeaseKey::new("ledger")?)?, "fence.ledger");
/// assert_eq!(fence_object_name("team-a.", &LeaseKey::new("ledger")?)?, "fence.team-a.ledger");
/// # Ok::<(), leasehold_core::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidInput`](leasehold_core::Error::InvalidInput) if the name would exceed
/// [`MAX_OBJECT_NAME_LEN`] bytes (a key of more than 247 bytes minus the prefix's length).
pub fn fence_object_name(prefix: &str, key: &LeaseKey) -> Result<String> {
    let name = format!("fence.{prefix}{key}");
    if name.len() > MAX_OBJECT_NAME_LEN {
        return Err(leasehold_core::Error::InvalidInput(format!(
            "key {key:?} with name prefix {prefix:?}: the fence ConfigMap name {name:?} exceeds {MAX_OBJECT_NAME_LEN} bytes"
        )));
    }
    Ok(name)
}

/// The field selector of a watch (or list) of the one object named `name`.
pub fn name_selector(name: &str) -> String {
    format!("metadata.name={name}")
}

/// What a Lease object says, parsed once.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// `metadata.resourceVersion` as a number (an etcd revision in practice).
    pub(crate) rv: u64,
    /// A non-empty `spec.holderIdentity`.
    pub(crate) holder: Option<String>,
    /// `spec.leaseDurationSeconds` (at least 1 s).
    pub(crate) duration: Duration,
    /// Our token annotation.
    pub(crate) token: Option<FencingToken>,
    /// Whom the token annotation belongs to.
    pub(crate) token_holder: Option<String>,
}

/// Parses the resourceVersion of the object named `name`. The API calls it opaque; every
/// apiserver backed by etcd3 uses the etcd revision, a positive 64-bit integer
/// (docs/adr/0040-k8s-fencing-token.md).
///
/// # Errors
/// A corrupt-record [`Error::Backend`](leasehold_core::Error::Backend) naming the object, if the
/// version is missing or not numeric.
pub fn parse_resource_version(name: &str, rv: Option<&str>) -> Result<u64> {
    let rv = rv.ok_or_else(|| corrupt(BACKEND, name, "object without metadata.resourceVersion"))?;
    rv.parse::<u64>().map_err(|_| {
        corrupt(
            BACKEND,
            name,
            format_args!(
                "resourceVersion {rv:?} is not numeric; fencing tokens need etcd revisions"
            ),
        )
    })
}

impl Record {
    pub(crate) fn parse(obj: &KubeLease) -> Result<Record> {
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        let rv = parse_resource_version(name, obj.metadata.resource_version.as_deref())?;
        let spec = obj.spec.clone().unwrap_or_default();
        let annotations = obj.metadata.annotations.as_ref();
        let token = match annotations.and_then(|a| a.get(TOKEN_ANNOTATION)) {
            Some(t) => Some(decode_token(BACKEND, name, t.as_str())?),
            None => None,
        };
        let secs = spec.lease_duration_seconds.unwrap_or(1).max(1);
        Ok(Record {
            rv,
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            duration: Duration::from_secs(u64::try_from(secs).unwrap_or(1)),
            token,
            token_holder: annotations
                .and_then(|a| a.get(TOKEN_HOLDER_ANNOTATION))
                .cloned(),
        })
    }

    /// The holder's fencing token: ours if the token annotation belongs to the holder; for a
    /// holder that did not acquire through this crate (a Go controller), the object's
    /// resourceVersion stands in (it has no token of ours; see the crate docs).
    pub(crate) fn holder_token(&self) -> Result<FencingToken> {
        match (&self.token, &self.token_holder, &self.holder) {
            (Some(t), Some(th), Some(h)) if th == h => Ok(*t),
            _ => FencingToken::new(self.rv),
        }
    }

    /// Whether `owner` holds the record with `token`.
    pub(crate) fn is_held_by(&self, owner: &OwnerId, token: FencingToken) -> bool {
        self.holder.as_deref() == Some(owner.as_str())
            && self.token_holder.as_deref() == Some(owner.as_str())
            && self.token == Some(token)
    }
}

/// Now, in whole microseconds: what the apiserver keeps of a `MicroTime`. An object we send
/// must read back equal to what we remember sending (ADR 0041: a renewal whose answer was lost is
/// recognised by its exact content), so no nanoseconds that the server would drop.
pub fn now() -> MicroTime {
    MicroTime(micros(jiff::Timestamp::now()))
}

fn micros(t: jiff::Timestamp) -> jiff::Timestamp {
    // Truncation to whole microseconds of a valid timestamp is itself valid.
    jiff::Timestamp::from_microsecond(t.as_microsecond()).unwrap_or(t)
}

/// A new Lease object claiming `name` for `owner`, without a token: the token is the version the
/// create is given, written into the object by [`with_token`] before the grant is reported
/// (ADR 0040). Until then, readers report the claim's resourceVersion as its holder's token:
/// that same version.
pub fn new_claim(name: &str, owner: &OwnerId, secs: i32) -> KubeLease {
    let t = now();
    KubeLease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(owner.to_string()),
            lease_duration_seconds: Some(secs),
            acquire_time: Some(t.clone()),
            renew_time: Some(t),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// `created` (keeping its resourceVersion, so the replace is conditioned on it) with the token
/// annotations of `owner`'s grant added; the spec is unchanged.
pub fn with_token(created: &KubeLease, owner: &OwnerId, token: FencingToken) -> KubeLease {
    let mut next = created.clone();
    let annotations = next.metadata.annotations.take().unwrap_or_default();
    next.metadata.annotations = Some(token_annotations(annotations, owner, token));
    precondition(next, "k8s.claim.unconditional")
}

/// `next`, whose resourceVersion makes its replace conditional. A mutation switch point: the
/// mutant of `site` (never active without leasehold-core's `mutants` feature) drops the version,
/// so that the replace is unconditional.
fn precondition(mut next: KubeLease, site: &'static str) -> KubeLease {
    if mutation::on(site) {
        next.metadata.resource_version = None;
    }
    next
}

fn token_annotations(
    mut a: BTreeMap<String, String>,
    owner: &OwnerId,
    token: FencingToken,
) -> BTreeMap<String, String> {
    a.insert(TOKEN_ANNOTATION.to_string(), token.to_string());
    a.insert(TOKEN_HOLDER_ANNOTATION.to_string(), owner.to_string());
    a
}

/// The next version of `current` (keeping its resourceVersion, labels and other fields) after a
/// grant to `owner` with `token` for `secs` seconds. As client-go does: a holder re-acquiring
/// keeps `acquireTime` and `leaseTransitions`; a new holder sets `acquireTime` and increments
/// `leaseTransitions`.
pub fn regrant(current: &KubeLease, owner: &OwnerId, token: FencingToken, secs: i32) -> KubeLease {
    let mut next = current.clone();
    let annotations = next.metadata.annotations.take().unwrap_or_default();
    next.metadata.annotations = Some(token_annotations(annotations, owner, token));
    let mut spec = next.spec.take().unwrap_or_default();
    let t = now();
    let same_holder = spec.holder_identity.as_deref() == Some(owner.as_str());
    if !same_holder || spec.acquire_time.is_none() {
        spec.acquire_time = Some(t.clone());
    }
    if !same_holder {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.holder_identity = Some(owner.to_string());
    spec.lease_duration_seconds = Some(secs);
    spec.renew_time = Some(t);
    next.spec = Some(spec);
    precondition(next, "k8s.regrant.unconditional")
}

/// The next version after a renewal: `renewTime` now, `leaseDurationSeconds` the granted TTL.
pub fn renewal(current: &KubeLease, secs: i32) -> KubeLease {
    let mut next = current.clone();
    let mut spec = next.spec.take().unwrap_or_default();
    spec.lease_duration_seconds = Some(secs);
    spec.renew_time = Some(now());
    next.spec = Some(spec);
    precondition(next, "k8s.renewal.unconditional")
}

/// The next version after a release, exactly as client-go's `ReleaseOnCancel` writes it: empty
/// `holderIdentity`, `leaseDurationSeconds: 1`, `acquireTime` and `renewTime` now, transitions
/// kept. Our token annotation stays: it is the key's generation.
pub fn released(current: &KubeLease) -> KubeLease {
    let mut next = current.clone();
    let mut spec = next.spec.take().unwrap_or_default();
    let t = now();
    spec.holder_identity = Some(String::new());
    spec.lease_duration_seconds = Some(1);
    spec.acquire_time = Some(t.clone());
    spec.renew_time = Some(t);
    next.spec = Some(spec);
    precondition(next, "k8s.release.unconditional")
}

/// The fenced state kept in the ConfigMap `cm` (see [`fence_object_name`]): the mark in
/// [`HIGH_WATER_ANNOTATION`], the counters in [`COUNTER_FIELD`] and [`ACCEPTED_FIELD`], the value
/// in [`VALUE_FIELD`].
///
/// # Errors
/// A corrupt-record [`Error::Backend`](leasehold_core::Error::Backend) naming the ConfigMap.
pub fn parse_fence(cm: &ConfigMap) -> Result<ResourceState> {
    let name = cm.metadata.name.as_deref().unwrap_or_default();
    let num = |field: &str| -> Result<Option<i64>> {
        match cm.data.as_ref().and_then(|d| d.get(field)) {
            Some(v) => v.parse().map(Some).map_err(|_| {
                corrupt(
                    BACKEND,
                    name,
                    format_args!("ConfigMap field {field}: {v:?}"),
                )
            }),
            None => Ok(None),
        }
    };
    let high_water = match cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HIGH_WATER_ANNOTATION))
    {
        Some(t) => Some(decode_token(BACKEND, name, t.as_str())?),
        None => None,
    };
    Ok(ResourceState {
        high_water,
        value: cm
            .binary_data
            .as_ref()
            .and_then(|b| b.get(VALUE_FIELD))
            .map(|v| v.0.clone()),
        counter: num(COUNTER_FIELD)?.unwrap_or(0),
        accepted: u64::try_from(num(ACCEPTED_FIELD)?.unwrap_or(0))
            .map_err(|_| corrupt(BACKEND, name, "negative accepted count"))?,
    })
}

/// Writes `state` into the ConfigMap `cm` (the inverse of [`parse_fence`]), keeping every other
/// field.
pub fn render_fence(cm: &mut ConfigMap, state: &ResourceState) {
    if let Some(t) = state.high_water {
        cm.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(HIGH_WATER_ANNOTATION.into(), t.to_string());
    }
    let data = cm.data.get_or_insert_with(BTreeMap::new);
    data.insert(COUNTER_FIELD.into(), state.counter.to_string());
    data.insert(ACCEPTED_FIELD.into(), state.accepted.to_string());
    if let Some(v) = &state.value {
        cm.binary_data
            .get_or_insert_with(BTreeMap::new)
            .insert(VALUE_FIELD.into(), ByteString(v.clone()));
    }
}

/// A new ConfigMap named `name` holding `state`.
pub fn new_fence(name: &str, state: &ResourceState) -> ConfigMap {
    let mut cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    render_fence(&mut cm, state);
    cm
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(s: &str) -> OwnerId {
        OwnerId::new(s).unwrap()
    }

    #[test]
    fn fence_names_carry_the_prefix_and_stay_legal() {
        let key = LeaseKey::new("k".repeat(200)).unwrap();
        assert_eq!(fence_object_name("", &key).unwrap().len(), 206);
        let longest = "p".repeat(MAX_OBJECT_NAME_LEN - 206);
        assert_eq!(
            fence_object_name(&longest, &key).unwrap().len(),
            MAX_OBJECT_NAME_LEN
        );
        let over = format!("{longest}p");
        assert!(matches!(
            fence_object_name(&over, &key),
            Err(leasehold_core::Error::InvalidInput(m)) if m.contains("253")
        ));
        let short = LeaseKey::new("a").unwrap();
        assert_ne!(
            fence_object_name("x.", &short).unwrap(),
            fence_object_name("y.", &short).unwrap()
        );
    }

    fn with_rv(mut obj: KubeLease, rv: &str) -> KubeLease {
        obj.metadata.resource_version = Some(rv.into());
        obj
    }

    #[test]
    fn grant_regrant_and_release_follow_client_go() {
        let t = FencingToken::new(10).unwrap();
        let obj = with_rv(
            with_token(&new_claim("k", &owner("a"), 5), &owner("a"), t),
            "11",
        );
        let rec = Record::parse(&obj).unwrap();
        assert_eq!(
            (
                rec.rv,
                rec.holder.as_deref(),
                rec.duration,
                obj.spec.as_ref().unwrap().lease_transitions
            ),
            (11, Some("a"), Duration::from_secs(5), Some(0))
        );
        assert!(rec.is_held_by(&owner("a"), t));
        assert!(!rec.is_held_by(&owner("b"), t));
        assert_eq!(rec.holder_token().unwrap(), t);

        // The same identity re-acquiring keeps acquireTime and transitions; a new one increments.
        let acquired = obj.spec.as_ref().unwrap().acquire_time.clone();
        let same = regrant(&obj, &owner("a"), FencingToken::new(11).unwrap(), 5);
        assert_eq!(same.spec.as_ref().unwrap().acquire_time, acquired);
        assert_eq!(same.spec.as_ref().unwrap().lease_transitions, Some(0));
        let other = regrant(&obj, &owner("b"), FencingToken::new(11).unwrap(), 7);
        let spec = other.spec.as_ref().unwrap();
        assert_eq!(
            (
                spec.holder_identity.as_deref(),
                spec.lease_transitions,
                spec.lease_duration_seconds
            ),
            (Some("b"), Some(1), Some(7))
        );
        assert_eq!(
            other.metadata.resource_version.as_deref(),
            Some("11"),
            "the replace must carry the version read"
        );

        let free = with_rv(released(&other), "12");
        let rec = Record::parse(&free).unwrap();
        assert_eq!(
            (
                rec.holder,
                rec.duration,
                free.spec.as_ref().unwrap().lease_transitions
            ),
            (None, Duration::from_secs(1), Some(1))
        );
        assert_eq!(
            free.spec.as_ref().unwrap().holder_identity.as_deref(),
            Some("")
        );
        assert_eq!(
            rec.token,
            Some(FencingToken::new(11).unwrap()),
            "release keeps the generation"
        );
    }

    #[test]
    fn a_foreign_holder_has_no_token_of_ours() {
        let obj = with_rv(
            with_token(
                &new_claim("k", &owner("a"), 5),
                &owner("a"),
                FencingToken::new(10).unwrap(),
            ),
            "11",
        );
        let mut go = obj.clone();
        go.spec.as_mut().unwrap().holder_identity = Some("go-controller".into());
        let go = with_rv(go, "15");
        let rec = Record::parse(&go).unwrap();
        assert_eq!(rec.holder_token().unwrap(), FencingToken::new(15).unwrap());
        assert!(!rec.is_held_by(&owner("go-controller"), FencingToken::new(10).unwrap()));
    }

    #[test]
    fn a_claim_reports_its_own_version_until_the_token_is_written() {
        let claim = with_rv(new_claim("k", &owner("a"), 5), "40");
        let rec = Record::parse(&claim).unwrap();
        assert_eq!(rec.holder.as_deref(), Some("a"));
        assert_eq!(rec.token, None);
        assert_eq!(rec.holder_token().unwrap(), FencingToken::new(40).unwrap());
        let t = FencingToken::new(40).unwrap();
        let granted = with_token(&claim, &owner("a"), t);
        assert_eq!(
            granted.spec, claim.spec,
            "the token write changes no spec field"
        );
        assert_eq!(granted.metadata.resource_version.as_deref(), Some("40"));
        let rec = Record::parse(&with_rv(granted, "41")).unwrap();
        assert!(rec.is_held_by(&owner("a"), t));
        assert_eq!(rec.holder_token().unwrap(), t);
    }

    #[test]
    fn a_renewal_reads_back_exactly_as_sent() {
        // The apiserver keeps MicroTime to the microsecond; what we remember sending must equal
        // what it stores, or a renewal whose answer was lost is never recognised (ADR 0041).
        let base = with_rv(new_claim("k", &owner("a"), 5), "7");
        for _ in 0..100 {
            let sent = renewal(&base, 5);
            let wire = serde_json::to_string(&sent).unwrap();
            let back: KubeLease = serde_json::from_str(&wire).unwrap();
            assert_eq!(back.spec, sent.spec, "{wire}");
        }
    }

    #[test]
    fn opaque_resource_versions_are_rejected() {
        assert_eq!(parse_resource_version("k", Some("123")).unwrap(), 123);
        let e = parse_resource_version("k", Some("abc")).unwrap_err();
        assert!(
            e.to_string().contains("corrupt record for key \"k\""),
            "{e}"
        );
        assert!(parse_resource_version("k", None).is_err());
    }
}
