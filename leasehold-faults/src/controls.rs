//! Negative controls: deliberately broken stores, resources and configurations, each run through
//! the same [`storm`] code on the in-memory reference store. Each must be
//! caught with the violation it breaks named in the verdict; a storm on the unbroken store must
//! stay clean. This is how we know a green storm means something.
//!
//! | control | broken how | caught as |
//! |---|---|---|
//! | [`GrantsTwice`](Control::GrantsTwice) | grants a held key to a second owner (with the holder's token) | overlapping belief |
//! | [`TokensGoBack`](Control::TokensGoBack) | loses its state on every second release (a restart without durable tokens) | token regression |
//! | [`RenewedWithoutExtending`](Control::RenewedWithoutExtending) | answers `Renewed` but does not extend the lease | overlapping belief |
//! | [`ExtendsWithoutAnswering`](Control::ExtendsWithoutAnswering) | extends the lease but never answers a renewal | false expiry (a liveness finding: the holder must give up, and does) |
//! | [`ZeroLossLead`](Control::ZeroLossLead) | a supervisor whose loss lead is zero (leasehold-core takes the smallest lead, 1 ns) | late loss |
//! | [`ExpiresEarly`](Control::ExpiresEarly) | keeps each lease for 60% of the TTL it reports granting | late loss (the store let go before the holder reported the loss) |
//! | [`AcceptsLowerTokens`](Control::AcceptsLowerTokens) | a fenced resource that accepts any token | stale write accepted |

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::supervisor::SupervisorConfig;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, FenceOp, FencedResource, FencingToken, KeyState,
    KeyWatch, Lease, LeaseKey, LeaseStore, MemoryFencedResource, MemoryLeaseStore, ReleaseOutcome,
    RenewOutcome, ResourceState, Result, WriteOp, WriteOutcome,
};
use leasehold_testkit::faulty::FaultyStore;
use leasehold_testkit::history::ViolationKind;
use tokio::time::Instant;

use crate::link::{FaultyResource, StoreLink};
use crate::scenarios::Measured;
use crate::storm::{Contender, StormBackend, StormShape, storm};

/// A deliberately broken component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Control {
    /// A store that grants a held key to a second owner.
    GrantsTwice,
    /// A store whose tokens go back after a restart.
    TokensGoBack,
    /// A store that answers `Renewed` without extending.
    RenewedWithoutExtending,
    /// A store that extends a lease without answering the renewal.
    ExtendsWithoutAnswering,
    /// A supervisor with a zero loss lead.
    ZeroLossLead,
    /// A store that expires leases before the TTL it reports granting.
    ExpiresEarly,
    /// A fenced resource that accepts equal or lower tokens.
    AcceptsLowerTokens,
}

/// What a control must produce to count as caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A violation of this kind.
    Violation(ViolationKind),
    /// A holder that gave up while the store still held its lease.
    FalseExpiry,
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expect::Violation(k) => write!(f, "{k}"),
            Expect::FalseExpiry => f.write_str("false expiry"),
        }
    }
}

impl Control {
    /// Every control.
    pub const ALL: [Control; 7] = [
        Control::GrantsTwice,
        Control::TokensGoBack,
        Control::RenewedWithoutExtending,
        Control::ExtendsWithoutAnswering,
        Control::ZeroLossLead,
        Control::ExpiresEarly,
        Control::AcceptsLowerTokens,
    ];

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Control::GrantsTwice => "store grants twice",
            Control::TokensGoBack => "store tokens go back after a restart",
            Control::RenewedWithoutExtending => "store answers Renewed without extending",
            Control::ExtendsWithoutAnswering => "store extends without answering",
            Control::ZeroLossLead => "supervisor with a zero loss lead",
            Control::ExpiresEarly => "store expires leases early",
            Control::AcceptsLowerTokens => "resource accepts equal or lower tokens",
        }
    }

    /// What the storms must report for this control.
    pub fn expected(self) -> Expect {
        match self {
            Control::GrantsTwice | Control::RenewedWithoutExtending => {
                Expect::Violation(ViolationKind::OverlappingBelief)
            }
            Control::TokensGoBack => Expect::Violation(ViolationKind::TokenRegression),
            Control::ExtendsWithoutAnswering => Expect::FalseExpiry,
            Control::ZeroLossLead | Control::ExpiresEarly => {
                Expect::Violation(ViolationKind::LateLoss)
            }
            Control::AcceptsLowerTokens => Expect::Violation(ViolationKind::StaleWriteAccepted),
        }
    }

    /// Whether `m` shows what this control must produce.
    pub fn caught_by(self, m: &Measured) -> bool {
        match self.expected() {
            Expect::Violation(k) => m.verdict().count(k) > 0,
            Expect::FalseExpiry => m.false_expiries > 0,
        }
    }
}

/// A store around the memory store, broken as its control says.
#[derive(Debug)]
struct BrokenStore {
    control: Option<Control>,
    inner: Mutex<MemoryLeaseStore>,
    releases: AtomicU64,
}

impl BrokenStore {
    fn inner(&self) -> MemoryLeaseStore {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl LeaseStore for BrokenStore {
    fn backend(&self) -> &'static str {
        "memory"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let sent = Instant::now();
        if self.control == Some(Control::ExpiresEarly) {
            let short = AcquireRequest::new(req.key.clone(), req.owner.clone(), early(req.ttl));
            return Ok(match self.inner().acquire(&short).await? {
                AcquireOutcome::Acquired(l) => {
                    AcquireOutcome::Acquired(leasehold_core::backend::granted_lease(
                        req.key.clone(),
                        req.owner.clone(),
                        l.token(),
                        req.ttl,
                        req.drift_margin(),
                        sent,
                    ))
                }
                other => other,
            });
        }
        let out = self.inner().acquire(req).await?;
        match out {
            AcquireOutcome::Held(h)
                if self.control == Some(Control::GrantsTwice) && fastrand::bool() =>
            {
                Ok(AcquireOutcome::Acquired(
                    leasehold_core::backend::granted_lease(
                        req.key.clone(),
                        req.owner.clone(),
                        h.token,
                        req.ttl,
                        req.drift_margin(),
                        sent,
                    ),
                ))
            }
            other => Ok(other),
        }
    }
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        match self.control {
            Some(Control::RenewedWithoutExtending) => Ok(RenewOutcome::Renewed(
                lease.renewed(lease.ttl(), Instant::now()),
            )),
            Some(Control::ExtendsWithoutAnswering) => {
                let _applied = self.inner().renew(lease).await;
                std::future::pending().await
            }
            Some(Control::ExpiresEarly) => {
                let sent = Instant::now();
                let short = Lease::resume(
                    lease.key().clone(),
                    lease.owner().clone(),
                    lease.token(),
                    early(lease.ttl()),
                );
                Ok(match self.inner().renew(&short).await? {
                    RenewOutcome::Renewed(_) => {
                        RenewOutcome::Renewed(lease.renewed(lease.ttl(), sent))
                    }
                    other => other,
                })
            }
            _ => self.inner().renew(lease).await,
        }
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let out = self.inner().release(lease).await?;
        if self.control == Some(Control::TokensGoBack)
            && out == ReleaseOutcome::Released
            && self.releases.fetch_add(1, Ordering::SeqCst) % 2 == 1
        {
            // A restart that loses every record, tokens included.
            *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = MemoryLeaseStore::new();
        }
        Ok(out)
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.inner().inspect(key).await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        self.inner().watch(key).await
    }
}

/// The time an [`ExpiresEarly`](Control::ExpiresEarly) store really keeps a lease of `ttl`.
fn early(ttl: Duration) -> Duration {
    ttl.mul_f64(0.6)
}

/// A fenced resource that applies every write, whatever its token.
#[derive(Debug, Default)]
struct AcceptingResource {
    state: Mutex<HashMap<LeaseKey, ResourceState>>,
}

impl AcceptingResource {
    fn apply(&self, key: &LeaseKey, token: FencingToken, op: Option<WriteOp>) -> WriteOutcome {
        let mut map = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let s = map.entry(key.clone()).or_default();
        let high_water = s.high_water.map_or(token, |h| h.max(token));
        s.high_water = Some(high_water);
        if let Some(WriteOp::Add(n)) = op {
            s.counter += n;
            s.accepted += 1;
        }
        WriteOutcome::Accepted { high_water }
    }
}

#[async_trait]
impl FencedResource for AcceptingResource {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        Ok(self.apply(key, token, op.into_write_op()))
    }
    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        let map = self.state.lock().unwrap_or_else(|p| p.into_inner());
        Ok(map.get(key).cloned().unwrap_or_default())
    }
}

/// The in-memory storm backend, optionally broken by a control.
#[derive(Debug)]
pub struct MemoryBackend {
    control: Option<Control>,
    ttl: Duration,
    store: Arc<BrokenStore>,
    resource: Arc<dyn FencedResource>,
}

impl MemoryBackend {
    /// A memory backend with leases of `ttl`, broken by `control` (or not).
    pub fn new(control: Option<Control>, ttl: Duration) -> Self {
        let resource: Arc<dyn FencedResource> = if control == Some(Control::AcceptsLowerTokens) {
            Arc::new(AcceptingResource::default())
        } else {
            Arc::new(MemoryFencedResource::new())
        };
        MemoryBackend {
            control,
            ttl,
            store: Arc::new(BrokenStore {
                control,
                inner: Mutex::new(MemoryLeaseStore::new()),
                releases: AtomicU64::new(0),
            }),
            resource,
        }
    }
}

#[async_trait]
impl StormBackend for MemoryBackend {
    fn ttl(&self) -> Duration {
        self.ttl
    }
    fn config(&self) -> SupervisorConfig {
        let c = SupervisorConfig::new(self.ttl);
        if self.control == Some(Control::ZeroLossLead) {
            c.with_loss_lead(Duration::ZERO)
        } else {
            c
        }
    }
    async fn contender(&self) -> std::result::Result<Contender, String> {
        let store = FaultyStore::new(self.store.clone() as Arc<dyn LeaseStore>);
        // Writes take a little time, as over a network, so that some are in flight at a loss.
        let resource = FaultyResource::new(self.resource.clone(), Duration::from_millis(2));
        Ok(Contender {
            store: Arc::new(store.clone()),
            resource: Arc::new(resource.clone()),
            store_link: Arc::new(StoreLink(store)),
            resource_link: Arc::new(resource),
        })
    }
    async fn observer(
        &self,
    ) -> std::result::Result<(Arc<dyn LeaseStore>, Arc<dyn FencedResource>), String> {
        Ok((self.store.clone(), self.resource.clone()))
    }
}

/// The result of running one control.
#[derive(Debug, Clone)]
pub struct ControlResult {
    /// The control.
    pub control: Control,
    /// Storms run (they stop at the first that catches the control).
    pub storms: u64,
    /// Whether it was caught.
    pub caught: bool,
    /// The storm that caught it.
    pub caught_by: Option<Measured>,
}

/// The TTL of the control storms.
pub const CONTROL_TTL: Duration = Duration::from_secs(1);

/// Runs `control` through up to `max_storms` storms (three contenders, three rounds each, seeds
/// 1, 2, ...) on a fresh broken memory store each, until one catches it.
///
/// # Errors
/// Only for a failure of the test infrastructure.
pub async fn run_control(
    control: Control,
    max_storms: u64,
) -> std::result::Result<ControlResult, String> {
    run_control_on_keys(control, max_storms, 1).await
}

/// As [`run_control`], with storms over `keys` keys ([`StormShape::keys`]).
///
/// # Errors
/// Only for a failure of the test infrastructure.
pub async fn run_control_on_keys(
    control: Control,
    max_storms: u64,
    keys: usize,
) -> std::result::Result<ControlResult, String> {
    for seed in 1..=max_storms {
        let backend = MemoryBackend::new(Some(control), CONTROL_TTL);
        let shape = StormShape {
            seed,
            contenders: 3,
            rounds: 3,
            keys,
        };
        let m = storm(&backend, shape).await?;
        if control.caught_by(&m) {
            return Ok(ControlResult {
                control,
                storms: seed,
                caught: true,
                caught_by: Some(m),
            });
        }
    }
    Ok(ControlResult {
        control,
        storms: max_storms,
        caught: false,
        caught_by: None,
    })
}

/// A real backend whose supervisors have a zero loss lead (the [`ZeroLossLead`](Control::ZeroLossLead)
/// control on a real store).
#[derive(Debug)]
pub struct ZeroLead<B>(pub B);

#[async_trait]
impl<B: StormBackend> StormBackend for ZeroLead<B> {
    fn ttl(&self) -> Duration {
        self.0.ttl()
    }
    fn config(&self) -> SupervisorConfig {
        self.0.config().with_loss_lead(Duration::ZERO)
    }
    async fn contender(&self) -> std::result::Result<Contender, String> {
        self.0.contender().await
    }
    async fn observer(
        &self,
    ) -> std::result::Result<(Arc<dyn LeaseStore>, Arc<dyn FencedResource>), String> {
        self.0.observer().await
    }
}
