//! An exhaustive model check of the lease protocol, with [`stateright`].
//!
//! The model's clients run the **real** supervisor state machine
//! ([`leasehold_core::supervisor::Machine`], called through `Machine::new` and `Machine::step`
//! exactly as the supervisor's driver feeds it), the fenced resource applies the **real** fencing
//! rule ([`leasehold_core::ResourceState::apply`]), and the store follows what one backend does
//! ([`StoreKind`]). Everything else is explicit nondeterminism: message loss, duplication and
//! delay, process pauses (every client step is optional), bounded clock drift between each
//! client and the store, store restart, promotion of an asynchronous replica and deletion of the
//! lease object.
//!
//! Time is discrete: the store's clock is the model's tick counter `now`; each client's clock is
//! `now - lag` with `lag` in `0..=max_lag`, changing by at most one per tick (so the drift a client
//! accumulates against the store over any interval is at most `max_lag` ticks). A client tick is
//! mapped onto a tokio [`Instant`] from one fixed base instant, since `Machine` takes tokio
//! instants.
//!
//! See `docs/verification.md` for what is proven, under which assumptions, and the measured
//! bounds.

pub mod trace;

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;
use std::time::Duration;

use leasehold_core::supervisor::Health;
use leasehold_core::supervisor::{Event, Machine, Next};
use leasehold_core::{FencingToken, LeaseKey, OwnerId, ResourceState, WriteOp};
use stateright::{Model, Property};
use tokio::time::Instant;

/// Milliseconds per model tick.
pub const TICK_MS: u64 = 1000;
/// The TTL every client requests and every store grants, in ticks.
pub const TTL_TICKS: u8 = 4;
/// The supervisor's default renew interval, in ticks ([`Config::renew_ticks`]).
pub const RENEW_TICKS: u8 = 2;
/// A request's default timeout (the supervisor's `op_timeout`), in ticks
/// ([`Config::op_timeout_ticks`]).
pub const OP_TIMEOUT_TICKS: u8 = 1;
/// The supervisor's loss lead (loss is declared this long before the local deadline).
pub const LOSS_LEAD: Duration = Duration::from_millis(500);
/// The retry interval after a failed renewal.
pub const RETRY: Duration = Duration::from_millis(1000);
/// Clock-floored tokens: token units per tick (like microseconds per second for Redis `TIME`).
pub const FLOOR_SCALE: u16 = 8;
/// Ticks a promotion of the replica takes (the store answers nothing meanwhile).
pub const FAILOVER_TICKS: u8 = 1;

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// The tokio instant of client-local tick `t`.
pub fn instant(t: u8) -> Instant {
    base() + Duration::from_millis(u64::from(t) * TICK_MS)
}

fn millis(i: Instant) -> u64 {
    u64::try_from(i.saturating_duration_since(base()).as_millis()).unwrap_or(u64::MAX)
}

fn key() -> LeaseKey {
    static KEY: OnceLock<LeaseKey> = OnceLock::new();
    KEY.get_or_init(|| LeaseKey::new("model").expect("valid key"))
        .clone()
}

fn owner(c: u8) -> OwnerId {
    OwnerId::new(format!("client-{c}")).expect("valid owner")
}

fn token(t: u16) -> FencingToken {
    FencingToken::new(u64::from(t.max(1))).expect("small tokens are valid")
}

/// What a store does: one variant per backend family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreKind {
    /// One row (or hash) changed atomically per request: compare-and-set on expiry and owner (a
    /// live record refuses another owner; its own owner gets a new token);
    /// tokens from a counter kept next to it (PostgreSQL's sequence, SQLite's token column floored by its deletion trigger,
    /// Redis's `gen` key). With `clock_floor`, a grant's token is `max(counter + 1, clock floor)`
    /// (the Redis script's rule, and the fixed PostgreSQL failover rule).
    Row {
        /// Floor each token by the serving store's clock.
        clock_floor: bool,
    },
    /// etcd: a lock key per holder created under a lease; the token is the key's create
    /// revision, the store's revision counter counts every write (including deletions).
    EtcdLockKey,
    /// Kubernetes: get, then (object missing) list and create, or (object expired) conditional
    /// replace, as separate requests; every write gets the next resourceVersion.
    Kubernetes {
        /// Fixed behaviour: after a create, a conditional replace writes the created object's own
        /// resourceVersion as the token. Old behaviour: the token is the revision returned by a
        /// `list` made before the create.
        token_from_own_write: bool,
    },
}

/// The bounds and faults of one check.
#[derive(Debug, Clone)]
pub struct Config {
    /// The store's behaviour.
    pub store: StoreKind,
    /// Number of clients (at most 3).
    pub clients: u8,
    /// Acquisition attempts per client.
    pub attempts: u8,
    /// Fenced writes per client.
    pub writes: u8,
    /// Whether clients may release.
    pub release: bool,
    /// The last tick.
    pub horizon: u8,
    /// The largest clock lag of a client behind the store, in ticks.
    pub max_lag: u8,
    /// The drift margin the clients' leases use, in ticks (the library's `drift_margin`).
    pub drift_margin_ticks: u8,
    /// Messages that may be lost.
    pub losses: u8,
    /// Requests that may be duplicated.
    pub duplicates: u8,
    /// Store restarts. A restart of a store that is not `durable` loses its state.
    pub restarts: u8,
    /// Whether a restart keeps the store's state.
    pub durable: bool,
    /// Promotions of an asynchronously replicated standby.
    pub promotions: u8,
    /// How far the promoted server's clock lags the old primary's, in ticks.
    pub promoted_clock_lag: u8,
    /// Deletions of the lease record by an operator (Kubernetes `kubectl delete lease`).
    pub deletions: u8,
    /// Largest number of messages in flight.
    pub max_in_flight: u8,
    /// The supervisor's renew interval, in ticks.
    pub renew_ticks: u8,
    /// A request's timeout (the supervisor's `op_timeout`), in ticks.
    pub op_timeout_ticks: u8,
}

impl Config {
    fn base(store: StoreKind) -> Self {
        Config {
            store,
            clients: 2,
            attempts: 1,
            writes: 1,
            release: false,
            horizon: 4,
            max_lag: 0,
            drift_margin_ticks: 1,
            losses: 1,
            duplicates: 0,
            restarts: 0,
            durable: true,
            promotions: 0,
            promoted_clock_lag: 0,
            deletions: 0,
            max_in_flight: 2,
            renew_ticks: RENEW_TICKS,
            op_timeout_ticks: OP_TIMEOUT_TICKS,
        }
    }

    /// PostgreSQL or SQLite: a durable compare-and-set row with a sequence; a restart keeps the
    /// state (so it is only the loss of in-flight messages, covered by `losses`). No request is
    /// duplicated here; set `duplicates` for a retried statement.
    pub fn cas_row() -> Self {
        Config {
            max_lag: 1,
            ..Config::base(StoreKind::Row { clock_floor: false })
        }
    }

    /// PostgreSQL failing over to an asynchronous standby; `clock_floor` is the fix.
    pub fn postgres_failover(clock_floor: bool) -> Self {
        Config {
            promotions: 1,
            ..Config::base(StoreKind::Row { clock_floor })
        }
    }

    /// Redis: the clock-floored counter script, without persistence (a restart loses
    /// everything) and with an asynchronous replica that can be promoted.
    pub fn redis() -> Self {
        Config {
            restarts: 1,
            durable: false,
            promotions: 1,
            ..Config::base(StoreKind::Row { clock_floor: true })
        }
    }

    /// etcd: lock keys with create revisions; durable (a restart keeps the state); clients may
    /// release.
    pub fn etcd() -> Self {
        Config {
            release: true,
            ..Config::base(StoreKind::EtcdLockKey)
        }
    }

    /// Kubernetes with operator deletion of the Lease object; `token_from_own_write` is the fix.
    pub fn kubernetes(token_from_own_write: bool) -> Self {
        Config {
            deletions: 1,
            ..Config::base(StoreKind::Kubernetes {
                token_from_own_write,
            })
        }
    }

    /// The model.
    pub fn into_model(self) -> LeaseModel {
        LeaseModel { cfg: self }
    }
}

/// A stored lease record (row, hash, lock key, Lease object).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rec {
    /// The holder, if any (a released Kubernetes object has none).
    pub holder: Option<u8>,
    /// The token of the holder's grant (the Kubernetes token annotation).
    pub token: u16,
    /// The store tick at which the record expires.
    pub expiry: u8,
    /// The record's version (Kubernetes resourceVersion); unused elsewhere.
    pub version: u16,
}

impl Rec {
    fn live(&self, now: u8) -> bool {
        self.holder.is_some() && now < self.expiry
    }
}

/// The store's replicated state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Durable {
    /// The record.
    pub rec: Option<Rec>,
    /// The token counter / sequence / revision.
    pub counter: u16,
}

/// A request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Req {
    /// One-step acquire (row, etcd).
    Acquire,
    /// Kubernetes get.
    Get,
    /// Kubernetes list (returns the current revision).
    List,
    /// Kubernetes create with a token annotation (0: none yet).
    Create(u16),
    /// Kubernetes acquiring replace, conditioned on a version, writing a token.
    Replace {
        /// The version the replace is conditioned on.
        expected: u16,
        /// The token it writes.
        token: u16,
    },
    /// Renewal of the grant with this token.
    Renew(u16),
    /// Release of the grant with this token.
    Release(u16),
}

/// A response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resp {
    /// Granted with a token.
    Granted(u16),
    /// Refused (held by someone else, conflict, not held any more).
    Refused,
    /// Kubernetes get result: the object's version, token annotation and whether it is live.
    Object(Option<(u16, u16, bool)>),
    /// Kubernetes list result: the current revision.
    Revision(u16),
    /// Kubernetes create succeeded; the created object's version.
    Created(u16),
    /// Renewed.
    Renewed,
    /// Released.
    Released,
}

/// A message in flight. `sent` is the sender's local tick of the request it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    /// Client to store.
    ToStore {
        /// Sender.
        from: u8,
        /// Local send tick.
        sent: u8,
        /// Request.
        req: Req,
    },
    /// Store to client.
    ToClient {
        /// Receiver.
        to: u8,
        /// The request's local send tick.
        sent: u8,
        /// The request answered (a renewal and a release sent at the same tick are told apart
        /// by it, as the driver tells them apart by the call that returns).
        req: Req,
        /// Response.
        resp: Resp,
    },
    /// Client to the fenced resource.
    Write {
        /// Writer.
        from: u8,
        /// Token presented.
        token: u16,
    },
}

/// The real supervisor state machine, hashed and compared by its observable projection (health,
/// token, deadlines, the next renewal time): two machines the driver and the properties cannot
/// tell apart are one state.
#[derive(Debug, Clone)]
pub struct Sup(pub Machine);

impl Sup {
    fn projection(
        &self,
    ) -> (
        u8,
        Option<leasehold_core::supervisor::LossReason>,
        u64,
        u64,
        u64,
        u64,
    ) {
        let m = &self.0;
        let (h, r) = match m.health() {
            Health::Held => (0, None),
            Health::AtRisk => (1, None),
            Health::Lost(r) => (2, Some(r)),
            Health::Released => (3, None),
            _ => (4, None),
        };
        let next = match m.next(base()) {
            Next::RenewAt { at, .. } => millis(at),
            Next::Stop => u64::MAX,
        };
        (
            h,
            r,
            m.lease().token().get(),
            millis(m.lease().deadline()),
            millis(m.loss_deadline()),
            next,
        )
    }
}

impl PartialEq for Sup {
    fn eq(&self, other: &Self) -> bool {
        self.projection() == other.projection()
    }
}
impl Eq for Sup {}
impl Hash for Sup {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.projection().hash(state);
    }
}

/// Where a client's acquisition stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Acq {
    /// Waiting for the answer to the request sent at local tick `sent` (bounded by the
    /// operation timeout).
    Waiting {
        /// Local send tick.
        sent: u8,
        /// The request.
        req: Req,
    },
    /// Has an answer and will send `req` next, whenever it runs again (a pause here is
    /// unbounded).
    Ready(Req),
}

/// A client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not holding; may try to acquire.
    Idle,
    /// Acquiring.
    Acquiring(Acq),
    /// Holding: the supervisor, and the local send tick of an outstanding renewal or release.
    Holding {
        /// The real state machine.
        sup: Sup,
        /// An outstanding renewal (local send tick).
        renewing: Option<u8>,
        /// An outstanding release (local send tick).
        releasing: Option<u8>,
        /// When the driver's renewal timer fires (ms after the base instant), as computed by
        /// `Machine::next` right after the last step, like the driver does.
        at: u64,
    },
}

/// A client and its budgets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    /// Its phase.
    pub phase: Phase,
    /// How far its clock lags the store's, in ticks.
    pub lag: u8,
    /// Acquisition attempts left.
    pub attempts: u8,
    /// Writes left.
    pub writes: u8,
}

/// The resource: the real fencing state, hashed by its observable fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Res(pub ResourceState);
impl Hash for Res {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.high_water.hash(state);
        self.0.counter.hash(state);
        self.0.accepted.hash(state);
    }
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The store's clock.
    pub now: u8,
    /// The clients.
    pub clients: Vec<Client>,
    /// The serving store's state.
    pub store: Durable,
    /// The asynchronous replica's (lagging) copy, where there is one.
    pub replica: Durable,
    /// The store answers nothing before this tick (failover in progress).
    pub down_until: u8,
    /// Whether the serving store was promoted.
    pub promoted: bool,
    /// Whether a grant may have been forgotten (volatile restart, promotion, deletion): the
    /// exclusion properties are only claimed while this is false.
    pub lost_state: bool,
    /// Messages in flight (sorted: a multiset).
    pub net: Vec<Msg>,
    /// Every grant the store made, in order: (client, token).
    pub grants: Vec<(u8, u16)>,
    /// The fenced resource.
    pub res: Res,
    /// Tokens the resource accepted, in order.
    pub accepted: Vec<u16>,
    /// Fault budgets left: losses, duplicates, restarts, promotions, deletions.
    pub budget: [u8; 5],
    /// Classes of step this path has taken that the current state does not show by itself
    /// (bits: [`EXPIRY_TAKEOVER`], [`K8S_TAKEOVER`], [`SAME_OWNER_REGRANT`], [`DUP_DELIVERED`],
    /// [`DUP_DELIVERED_TWICE`]); read by the coverage guards.
    pub seen: u8,
    /// The request that was duplicated, if any (at most one duplicate is tracked).
    pub dup: Option<Msg>,
}

/// [`State::seen`]: a grant to a client while the store's record was another client's expired
/// grant (never released), with no state lost on the way.
pub const EXPIRY_TAKEOVER: u8 = 1;
/// [`State::seen`]: a Kubernetes acquiring replace over another client's expired Lease object.
pub const K8S_TAKEOVER: u8 = 2;
/// [`State::seen`]: a grant to the client the store's record already names as holder of its
/// latest grant.
pub const SAME_OWNER_REGRANT: u8 = 4;
/// [`State::seen`]: one copy of the duplicated request reached the store.
pub const DUP_DELIVERED: u8 = 8;
/// [`State::seen`]: both copies of the duplicated request reached the store.
pub const DUP_DELIVERED_TWICE: u8 = 16;

/// Coverage guard: an expiry takeover.
pub const REACH_EXPIRY_TAKEOVER: &str =
    "reached: a grant to B after A's lease expired at the store (A never released)";
/// Coverage guard: the Kubernetes takeover path.
pub const REACH_K8S_TAKEOVER: &str =
    "reached: a Kubernetes replace takes over another client's expired Lease";
/// Coverage guard: a client in `AtRisk`.
pub const REACH_AT_RISK: &str = "reached: a client is AtRisk (a renewal failed before loss)";
/// Coverage guard: a release racing an in-flight renewal.
pub const REACH_RELEASE_RACE: &str =
    "reached: a release is sent while the same client's renewal is outstanding";
/// Coverage guard: a same-owner re-grant.
pub const REACH_SAME_OWNER: &str = "reached: the store grants again to its record's holder";
/// Coverage guard: a duplicated request delivered twice.
pub const REACH_DUP_TWICE: &str = "reached: both copies of a duplicated request reach the store";
/// Coverage guard (checks with three clients): each of three clients was granted the lease.
pub const REACH_THREE_HOLDERS: &str = "reached: three clients were each granted the lease";
/// Coverage guard (checks with three clients): writes of three clients were accepted.
pub const REACH_THREE_WRITERS: &str =
    "reached: the resource accepted writes of three clients' tokens";

/// A step of the system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes one tick; each client's new clock lag.
    Tick(Vec<u8>),
    /// Deliver the message at this index.
    Deliver(usize),
    /// Lose the message at this index.
    Lose(usize),
    /// Duplicate the request at this index.
    Duplicate(usize),
    /// Client starts an acquisition.
    StartAcquire(u8),
    /// Client sends its next acquisition request.
    SendNext(u8),
    /// Client's outstanding request times out.
    Timeout(u8),
    /// Client's renewal timer fires: it sends a renewal.
    Renew(u8),
    /// Client's loss-deadline timer fires: `Event::Tick`.
    LossTimer(u8),
    /// Client writes to the resource.
    Write(u8),
    /// Client releases.
    Release(u8),
    /// The replica catches up with the primary.
    Replicate,
    /// The replica is promoted.
    Promote,
    /// The store restarts.
    Restart,
    /// An operator deletes the lease record.
    Delete,
}

/// The model.
#[derive(Debug, Clone)]
pub struct LeaseModel {
    /// Its configuration.
    pub cfg: Config,
}

const LOSS: usize = 0;
const DUP: usize = 1;
const RESTART: usize = 2;
const PROMOTE: usize = 3;
const DELETE: usize = 4;

impl LeaseModel {
    fn local(&self, s: &State, c: u8) -> u8 {
        s.now - s.clients[usize::from(c)].lag
    }

    fn margin(&self) -> Duration {
        Duration::from_millis(u64::from(self.cfg.drift_margin_ticks) * TICK_MS)
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(u64::from(TTL_TICKS) * TICK_MS)
    }

    /// Whether client `c` believes it holds the lease: its real machine is Held or AtRisk and
    /// its loss deadline has not passed on its own clock (a superset of what `may_act` allows).
    pub fn believes(&self, s: &State, c: u8) -> bool {
        match &s.clients[usize::from(c)].phase {
            // An owner that asked to release has stopped acting (the driver cancels the work
            // before it sends the release).
            Phase::Holding { sup, releasing, .. } => {
                releasing.is_none()
                    && matches!(sup.0.health(), Health::Held | Health::AtRisk)
                    && instant(self.local(s, c)) < sup.0.loss_deadline()
            }
            _ => false,
        }
    }

    fn may_act(&self, s: &State, c: u8) -> bool {
        match &s.clients[usize::from(c)].phase {
            // The driver's gate: the real machine's `may_act` (Held, no release started, before
            // the loss deadline).
            Phase::Holding { sup, releasing, .. } => {
                releasing.is_none() && sup.0.may_act(instant(self.local(s, c)))
            }
            _ => false,
        }
    }

    fn send(&self, s: &mut State, m: Msg) -> bool {
        if s.net.len() >= usize::from(self.cfg.max_in_flight) {
            return false;
        }
        let at = s.net.partition_point(|x| *x <= m);
        s.net.insert(at, m);
        true
    }

    fn floor(&self, s: &State) -> u16 {
        let clock = if s.promoted {
            s.now.saturating_sub(self.cfg.promoted_clock_lag)
        } else {
            s.now
        };
        u16::from(clock) * FLOOR_SCALE
    }

    /// The store handles one request, returning its answer.
    fn serve(&self, s: &mut State, from: u8, req: Req) -> Option<Resp> {
        let before = (s.store.rec, s.grants.last().copied(), s.grants.len());
        let resp = self.serve_inner(s, from, req)?;
        let (prev, last, n) = before;
        if s.grants.len() > n
            && !s.lost_state
            && let Some(r) = prev
        {
            if r.holder.is_some_and(|h| h != from) && !r.live(s.now) {
                s.seen |= EXPIRY_TAKEOVER;
                if matches!(req, Req::Replace { .. }) {
                    s.seen |= K8S_TAKEOVER;
                }
            }
            if r.holder == Some(from) && last == Some((from, r.token)) {
                s.seen |= SAME_OWNER_REGRANT;
            }
        }
        Some(resp)
    }

    fn serve_inner(&self, s: &mut State, from: u8, req: Req) -> Option<Resp> {
        let now = s.now;
        let exp = now + TTL_TICKS;
        let floor = self.floor(s);
        let st = &mut s.store;
        let resp = match (self.cfg.store, req) {
            (StoreKind::Row { clock_floor }, Req::Acquire) => {
                // A live record of another owner refuses; the same owner gets a new token.
                if st
                    .rec
                    .is_some_and(|r| r.live(now) && r.holder != Some(from))
                {
                    Resp::Refused
                } else {
                    let mut t = st.counter + 1;
                    if clock_floor {
                        t = t.max(floor);
                    }
                    st.counter = t;
                    st.rec = Some(Rec {
                        holder: Some(from),
                        token: t,
                        expiry: exp,
                        version: 0,
                    });
                    s.grants.push((from, t));
                    Resp::Granted(t)
                }
            }
            (StoreKind::EtcdLockKey, Req::Acquire) => {
                match st.rec {
                    Some(r) if r.live(now) && r.holder != Some(from) => Resp::Refused,
                    old => {
                        if old.is_some() {
                            // The lease expired (etcd deletes the key) or the same owner
                            // re-acquires (its old key is replaced): a write of its own.
                            st.counter += 1;
                        }
                        st.counter += 1;
                        let t = st.counter;
                        st.rec = Some(Rec {
                            holder: Some(from),
                            token: t,
                            expiry: exp,
                            version: t,
                        });
                        s.grants.push((from, t));
                        Resp::Granted(t)
                    }
                }
            }
            (StoreKind::Kubernetes { .. }, Req::Get) => {
                Resp::Object(st.rec.map(|r| (r.version, r.token, r.live(now))))
            }
            (StoreKind::Kubernetes { .. }, Req::List) => Resp::Revision(st.counter),
            (
                StoreKind::Kubernetes {
                    token_from_own_write,
                },
                Req::Create(t),
            ) => {
                if st.rec.is_some() {
                    Resp::Refused
                } else {
                    st.counter += 1;
                    let v = st.counter;
                    st.rec = Some(Rec {
                        holder: Some(from),
                        token: t,
                        expiry: exp,
                        version: v,
                    });
                    if token_from_own_write {
                        Resp::Created(v)
                    } else {
                        s.grants.push((from, t));
                        Resp::Granted(t)
                    }
                }
            }
            (StoreKind::Kubernetes { .. }, Req::Replace { expected, token: t }) => match st.rec {
                Some(r) if r.version == expected => {
                    st.counter += 1;
                    let v = st.counter;
                    st.rec = Some(Rec {
                        holder: Some(from),
                        token: t,
                        expiry: exp,
                        version: v,
                    });
                    s.grants.push((from, t));
                    Resp::Granted(t)
                }
                _ => Resp::Refused,
            },
            (_, Req::Renew(t)) => match st.rec {
                Some(r) if r.live(now) && r.holder == Some(from) && r.token == t => {
                    st.counter += u16::from(matches!(self.cfg.store, StoreKind::Kubernetes { .. }));
                    let version = if matches!(self.cfg.store, StoreKind::Kubernetes { .. }) {
                        st.counter
                    } else {
                        r.version
                    };
                    st.rec = Some(Rec {
                        expiry: exp,
                        version,
                        ..r
                    });
                    Resp::Renewed
                }
                _ => Resp::Refused,
            },
            (kind, Req::Release(t)) => match st.rec {
                Some(r) if r.live(now) && r.holder == Some(from) && r.token == t => {
                    match kind {
                        StoreKind::Kubernetes { .. } => {
                            // The object stays, without holder, keeping its token annotation.
                            st.counter += 1;
                            st.rec = Some(Rec {
                                holder: None,
                                expiry: 0,
                                version: st.counter,
                                ..r
                            });
                        }
                        StoreKind::EtcdLockKey => {
                            st.counter += 1;
                            st.rec = None;
                        }
                        StoreKind::Row { .. } => st.rec = None,
                    }
                    Resp::Released
                }
                _ => Resp::Refused,
            },
            _ => return None,
        };
        Some(resp)
    }

    /// A client handles an answer.
    fn receive(&self, s: &mut State, c: u8, sent: u8, answered: Req, resp: Resp) {
        let now_local = self.local(s, c);
        let ci = usize::from(c);
        let phase = s.clients[ci].phase.clone();
        match phase {
            Phase::Acquiring(Acq::Waiting { sent: w, req }) if w == sent => {
                let next = match (req, resp) {
                    (_, Resp::Granted(t)) => {
                        let lease = leasehold_core::backend::granted_lease(
                            key(),
                            owner(c),
                            token(t),
                            self.ttl(),
                            self.margin(),
                            instant(sent),
                        );
                        let m = Machine::new(
                            lease,
                            Duration::from_millis(u64::from(self.cfg.renew_ticks) * TICK_MS),
                            RETRY,
                            LOSS_LEAD,
                            instant(now_local),
                        );
                        let at = next_at(&m, now_local);
                        Phase::Holding {
                            sup: Sup(m),
                            renewing: None,
                            releasing: None,
                            at,
                        }
                    }
                    (Req::Get, Resp::Object(None)) => match self.cfg.store {
                        StoreKind::Kubernetes {
                            token_from_own_write: false,
                        } => Phase::Acquiring(Acq::Ready(Req::List)),
                        _ => Phase::Acquiring(Acq::Ready(Req::Create(0))),
                    },
                    (Req::Get, Resp::Object(Some((v, ann, live)))) => {
                        if live {
                            Phase::Idle
                        } else {
                            // Token: the version read, floored above the annotation.
                            let t = v.max(ann + 1);
                            Phase::Acquiring(Acq::Ready(Req::Replace {
                                expected: v,
                                token: t,
                            }))
                        }
                    }
                    (Req::List, Resp::Revision(r)) => {
                        Phase::Acquiring(Acq::Ready(Req::Create(r.max(1))))
                    }
                    (Req::Create(_), Resp::Created(v)) => {
                        Phase::Acquiring(Acq::Ready(Req::Replace {
                            expected: v,
                            token: v,
                        }))
                    }
                    _ => Phase::Idle,
                };
                s.clients[ci].phase = next;
            }
            Phase::Holding {
                mut sup,
                renewing,
                releasing,
                ..
            } => {
                if renewing == Some(sent)
                    && matches!(answered, Req::Renew(_))
                    && releasing.is_some()
                {
                    // The driver stopped waiting for this renewal when the release began: the
                    // answer is dropped with the renewal's future.
                    if let Phase::Holding { renewing, .. } = &mut s.clients[ci].phase {
                        *renewing = None;
                    }
                } else if renewing == Some(sent) && matches!(answered, Req::Renew(_)) {
                    let ev = match resp {
                        Resp::Renewed => {
                            Event::RenewConfirmed(sup.0.lease().renewed(self.ttl(), instant(sent)))
                        }
                        _ => Event::RenewRefused,
                    };
                    sup.0.step(ev, instant(now_local));
                    let at = next_at(&sup.0, now_local);
                    s.clients[ci].phase = Phase::Holding {
                        sup,
                        renewing: None,
                        releasing,
                        at,
                    };
                } else if releasing == Some(sent) && matches!(answered, Req::Release(_)) {
                    let ev = match resp {
                        Resp::Released => Event::Released,
                        _ => Event::ReleaseNotHeld,
                    };
                    sup.0.step(ev, instant(now_local));
                    let at = next_at(&sup.0, now_local);
                    s.clients[ci].phase = Phase::Holding {
                        sup,
                        renewing: None,
                        releasing: None,
                        at,
                    };
                }
            }
            _ => {} // a late or duplicated answer: the driver has moved on and ignores it
        }
    }
}

/// The driver's next renewal time after a step at local tick `local` (ms after the base).
fn next_at(m: &Machine, local: u8) -> u64 {
    match m.next(instant(local)) {
        Next::RenewAt { at, .. } => millis(at),
        Next::Stop => u64::MAX,
    }
}

fn valid_tokens(grants: &[(u8, u16)]) -> bool {
    grants.windows(2).all(|w| w[0].1 < w[1].1)
}

impl LeaseModel {
    /// The coverage guards: `sometimes` properties naming classes of state a check must reach,
    /// so that a bound too small to reach them fails instead of passing vacuously. Every store
    /// variant has the common ones; checks with three clients also that each of them held and wrote;
    /// the Kubernetes variants also the takeover path.
    pub fn coverage_guards(&self) -> Vec<Property<Self>> {
        let mut g = vec![
            Property::sometimes(REACH_EXPIRY_TAKEOVER, |_: &LeaseModel, s: &State| {
                s.seen & EXPIRY_TAKEOVER != 0
            }),
            Property::sometimes(REACH_AT_RISK, |_: &LeaseModel, s: &State| {
                s.clients.iter().any(|c| {
                    matches!(&c.phase, Phase::Holding { sup, .. } if sup.0.health() == Health::AtRisk)
                })
            }),
            Property::sometimes(REACH_RELEASE_RACE, |_: &LeaseModel, s: &State| {
                s.clients.iter().any(|c| {
                    matches!(
                        &c.phase,
                        Phase::Holding {
                            renewing: Some(_),
                            releasing: Some(_),
                            ..
                        }
                    )
                })
            }),
            Property::sometimes(REACH_SAME_OWNER, |_: &LeaseModel, s: &State| {
                s.seen & SAME_OWNER_REGRANT != 0
            }),
            Property::sometimes(REACH_DUP_TWICE, |_: &LeaseModel, s: &State| {
                s.seen & DUP_DELIVERED_TWICE != 0
            }),
        ];
        if self.cfg.clients >= 3 {
            g.push(Property::sometimes(
                REACH_THREE_HOLDERS,
                |_: &LeaseModel, s: &State| (0..3).all(|c| s.grants.iter().any(|g| g.0 == c)),
            ));
            g.push(Property::sometimes(
                REACH_THREE_WRITERS,
                |_: &LeaseModel, s: &State| {
                    (0..3).all(|c| {
                        s.grants
                            .iter()
                            .any(|g| g.0 == c && s.accepted.contains(&g.1))
                    })
                },
            ));
        }
        if matches!(self.cfg.store, StoreKind::Kubernetes { .. }) {
            g.push(Property::sometimes(
                REACH_K8S_TAKEOVER,
                |_: &LeaseModel, s: &State| s.seen & K8S_TAKEOVER != 0,
            ));
        }
        g
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let c = &self.cfg;
        vec![State {
            now: c.max_lag,
            clients: (0..c.clients)
                .map(|_| Client {
                    phase: Phase::Idle,
                    lag: 0,
                    attempts: c.attempts,
                    writes: c.writes,
                })
                .collect(),
            store: Durable {
                rec: None,
                counter: 0,
            },
            replica: Durable {
                rec: None,
                counter: 0,
            },
            down_until: 0,
            promoted: false,
            lost_state: false,
            net: Vec::new(),
            grants: Vec::new(),
            res: Res(ResourceState::default()),
            accepted: Vec::new(),
            budget: [
                c.losses,
                c.duplicates,
                c.restarts,
                c.promotions,
                c.deletions,
            ],
            seen: 0,
            dup: None,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let cfg = &self.cfg;
        if s.now < cfg.horizon.saturating_add(cfg.max_lag) {
            // Every combination of lags (each moves by at most one tick).
            let mut combos: Vec<Vec<u8>> = vec![Vec::new()];
            for cl in &s.clients {
                let lo = cl.lag.saturating_sub(1);
                let hi = (cl.lag + 1).min(cfg.max_lag);
                combos = combos
                    .into_iter()
                    .flat_map(|v| {
                        (lo..=hi).map(move |l| {
                            let mut v = v.clone();
                            v.push(l);
                            v
                        })
                    })
                    .collect();
            }
            out.extend(combos.into_iter().map(Action::Tick));
        }
        for (i, m) in s.net.iter().enumerate() {
            if i > 0 && s.net[i - 1] == *m {
                continue;
            }
            let deliverable = !matches!(m, Msg::ToStore { .. }) || s.now >= s.down_until;
            if deliverable {
                out.push(Action::Deliver(i));
            }
            if s.budget[LOSS] > 0 {
                out.push(Action::Lose(i));
            }
            if s.budget[DUP] > 0 && matches!(m, Msg::ToStore { .. }) {
                out.push(Action::Duplicate(i));
            }
        }
        for c in 0..cfg.clients {
            let cl = &s.clients[usize::from(c)];
            let local = self.local(s, c);
            match &cl.phase {
                Phase::Idle => {
                    if cl.attempts > 0 {
                        out.push(Action::StartAcquire(c));
                    }
                }
                Phase::Acquiring(Acq::Ready(_)) => out.push(Action::SendNext(c)),
                Phase::Acquiring(Acq::Waiting { sent, .. }) => {
                    if local >= sent + cfg.op_timeout_ticks {
                        out.push(Action::Timeout(c));
                    }
                }
                Phase::Holding {
                    sup,
                    renewing,
                    releasing,
                    at,
                } => {
                    let now_i = instant(local);
                    let at = base() + Duration::from_millis(*at);
                    if let Next::RenewAt { loss_deadline, .. } = sup.0.next(now_i) {
                        if now_i >= loss_deadline {
                            out.push(Action::LossTimer(c));
                        }
                        match renewing {
                            None if releasing.is_none() && now_i >= at && now_i < loss_deadline => {
                                out.push(Action::Renew(c))
                            }
                            Some(sent)
                                if local >= sent + cfg.op_timeout_ticks
                                    && now_i < loss_deadline =>
                            {
                                out.push(Action::Timeout(c))
                            }
                            _ => {}
                        }
                        // The driver's stop request wins over a renewal in flight too: it stops
                        // waiting for it and releases.
                        if cfg.release && releasing.is_none() {
                            out.push(Action::Release(c));
                        }
                    }
                    if let Some(sent) = releasing
                        && local >= sent + cfg.op_timeout_ticks
                        && !sup.0.health().is_final()
                    {
                        out.push(Action::Timeout(c));
                    }
                    if cl.writes > 0 && self.may_act(s, c) {
                        out.push(Action::Write(c));
                    }
                }
            }
        }
        if cfg.promotions > 0 && s.replica != s.store {
            out.push(Action::Replicate);
        }
        if s.budget[PROMOTE] > 0 {
            out.push(Action::Promote);
        }
        if s.budget[RESTART] > 0 {
            out.push(Action::Restart);
        }
        if s.budget[DELETE] > 0 && s.store.rec.is_some() {
            out.push(Action::Delete);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick(lags) => {
                s.now += 1;
                for (cl, l) in s.clients.iter_mut().zip(lags) {
                    cl.lag = l;
                }
            }
            Action::Deliver(i) => {
                let m = s.net.remove(i);
                match m {
                    Msg::ToStore { from, sent, req } => {
                        if s.dup == Some(m) {
                            if s.seen & DUP_DELIVERED != 0 {
                                s.seen |= DUP_DELIVERED_TWICE;
                            }
                            s.seen |= DUP_DELIVERED;
                        }
                        let resp = self.serve(&mut s, from, req)?;
                        if !self.send(
                            &mut s,
                            Msg::ToClient {
                                to: from,
                                sent,
                                req,
                                resp,
                            },
                        ) {
                            return None;
                        }
                    }
                    Msg::ToClient {
                        to,
                        sent,
                        req,
                        resp,
                    } => self.receive(&mut s, to, sent, req, resp),
                    Msg::Write { token: t, .. } => {
                        let out = s.res.0.apply(token(t), Some(&WriteOp::Add(1)));
                        if out.is_accepted() {
                            s.accepted.push(t);
                        }
                    }
                }
            }
            Action::Lose(i) => {
                s.net.remove(i);
                s.budget[LOSS] -= 1;
            }
            Action::Duplicate(i) => {
                let m = s.net[i];
                s.budget[DUP] -= 1;
                s.dup = Some(m);
                if !self.send(&mut s, m) {
                    return None;
                }
            }
            Action::StartAcquire(c) => {
                let cl = &mut s.clients[usize::from(c)];
                cl.attempts -= 1;
                let first = match self.cfg.store {
                    StoreKind::Kubernetes { .. } => Req::Get,
                    _ => Req::Acquire,
                };
                cl.phase = Phase::Acquiring(Acq::Ready(first));
                return self.next_state(&s, Action::SendNext(c));
            }
            Action::SendNext(c) => {
                let sent = self.local(&s, c);
                let Phase::Acquiring(Acq::Ready(req)) = s.clients[usize::from(c)].phase else {
                    return None;
                };
                s.clients[usize::from(c)].phase = Phase::Acquiring(Acq::Waiting { sent, req });
                if !self.send(&mut s, Msg::ToStore { from: c, sent, req }) {
                    return None;
                }
            }
            Action::Timeout(c) => {
                let local = self.local(&s, c);
                let now_i = instant(local);
                let cl = &mut s.clients[usize::from(c)];
                match &mut cl.phase {
                    Phase::Acquiring(_) => cl.phase = Phase::Idle,
                    Phase::Holding {
                        sup,
                        releasing: Some(_),
                        ..
                    } => {
                        // A release that timed out: the driver reports it not held.
                        sup.0.step(Event::ReleaseNotHeld, now_i);
                    }
                    Phase::Holding {
                        sup, renewing, at, ..
                    } => {
                        sup.0.step(Event::RenewFailed, now_i);
                        *renewing = None;
                        *at = next_at(&sup.0, local);
                    }
                    Phase::Idle => return None,
                }
            }
            Action::Renew(c) => {
                let sent = self.local(&s, c);
                let Phase::Holding { sup, renewing, .. } = &mut s.clients[usize::from(c)].phase
                else {
                    return None;
                };
                *renewing = Some(sent);
                let t = u16::try_from(sup.0.lease().token().get()).ok()?;
                if !self.send(
                    &mut s,
                    Msg::ToStore {
                        from: c,
                        sent,
                        req: Req::Renew(t),
                    },
                ) {
                    return None;
                }
            }
            Action::LossTimer(c) => {
                let local = self.local(&s, c);
                let Phase::Holding { sup, at, .. } = &mut s.clients[usize::from(c)].phase else {
                    return None;
                };
                sup.0.step(Event::Tick, instant(local));
                *at = next_at(&sup.0, local);
            }
            Action::Write(c) => {
                let cl = &mut s.clients[usize::from(c)];
                cl.writes -= 1;
                let Phase::Holding { sup, .. } = &cl.phase else {
                    return None;
                };
                let t = u16::try_from(sup.0.lease().token().get()).ok()?;
                if !self.send(&mut s, Msg::Write { from: c, token: t }) {
                    return None;
                }
            }
            Action::Release(c) => {
                let sent = self.local(&s, c);
                let Phase::Holding { sup, releasing, .. } = &mut s.clients[usize::from(c)].phase
                else {
                    return None;
                };
                // As the driver: the release's start is stepped first (no more acting, no more
                // renewing), then the release is sent.
                sup.0.step(Event::ReleaseStarted, instant(sent));
                *releasing = Some(sent);
                let t = u16::try_from(sup.0.lease().token().get()).ok()?;
                if !self.send(
                    &mut s,
                    Msg::ToStore {
                        from: c,
                        sent,
                        req: Req::Release(t),
                    },
                ) {
                    return None;
                }
            }
            Action::Replicate => s.replica = s.store,
            Action::Promote => {
                s.budget[PROMOTE] -= 1;
                if s.store != s.replica {
                    s.lost_state = true;
                }
                s.store = s.replica;
                s.promoted = true;
                s.down_until = s.now + FAILOVER_TICKS;
            }
            Action::Restart => {
                s.budget[RESTART] -= 1;
                if !self.cfg.durable {
                    if s.store.rec.is_some() || s.store.counter > 0 {
                        s.lost_state = true;
                    }
                    s.store = Durable {
                        rec: None,
                        counter: 0,
                    };
                }
                // A restart takes at least one tick: the clock floor relies on it.
                s.down_until = s.now + FAILOVER_TICKS;
            }
            Action::Delete => {
                s.budget[DELETE] -= 1;
                s.store.rec = None;
                s.store.counter += 1;
                s.lost_state = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut props = vec![
            Property::always(
                "the resource never accepts a token lower than one it accepted",
                |_: &LeaseModel, s: &State| s.accepted.windows(2).all(|w| w[0] <= w[1]),
            ),
            Property::always(
                "no two grants share a token",
                |_: &LeaseModel, s: &State| {
                    let mut t: Vec<u16> = s.grants.iter().map(|g| g.1).collect();
                    t.sort_unstable();
                    t.windows(2).all(|w| w[0] != w[1])
                },
            ),
            Property::always(
                "tokens strictly increase in grant order",
                |_: &LeaseModel, s: &State| valid_tokens(&s.grants),
            ),
            Property::always(
                "within the drift bound, no two clients believe they hold the lease",
                |m: &LeaseModel, s: &State| {
                    s.lost_state || (0..m.cfg.clients).filter(|&c| m.believes(s, c)).count() <= 1
                },
            ),
            Property::always(
                "loss is reported before the store's expiry",
                |m: &LeaseModel, s: &State| {
                    s.lost_state
                        || (0..m.cfg.clients).all(|c| {
                            if !m.believes(s, c) {
                                return true;
                            }
                            let Phase::Holding { sup, .. } = &s.clients[usize::from(c)].phase
                            else {
                                return true;
                            };
                            let t = sup.0.lease().token().get();
                            s.store.rec.is_some_and(|r| {
                                r.live(s.now) && r.holder == Some(c) && u64::from(r.token) == t
                            })
                        })
                },
            ),
            Property::always(
                "a releasing client's machine has stepped ReleaseStarted",
                |_: &LeaseModel, s: &State| {
                    s.clients.iter().all(|c| match &c.phase {
                        Phase::Holding {
                            sup,
                            releasing: Some(_),
                            ..
                        } => sup.0.is_releasing() || sup.0.health().is_final(),
                        _ => true,
                    })
                },
            ),
            Property::sometimes(
                "a client writes to the resource",
                |_: &LeaseModel, s: &State| !s.accepted.is_empty(),
            ),
            Property::sometimes("two grants happen", |_: &LeaseModel, s: &State| {
                s.grants.len() >= 2
            }),
        ];
        props.extend(self.coverage_guards());
        props
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.net.len() <= usize::from(self.cfg.max_in_flight)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "t={} store={:?} grants={:?} accepted={:?}",
            self.now, self.store, self.grants, self.accepted
        )
    }
}
