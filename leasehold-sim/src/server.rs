//! The simulated store: the in-memory reference store and fenced resource behind a TCP listener.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, FencingToken, Lease, LeaseKey, LeaseStore,
    MemoryFencedResource, MemoryLeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, WriteOp,
    WriteOutcome,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::sleep;
use turmoil::net::{TcpListener, TcpStream};

use crate::clock::HostClock;
use crate::protocol::{Frame, Request, Response, WireHolder, micros};
use crate::trace::{EventKind, Trace};

/// The port the simulated server listens on.
pub const PORT: u16 = 7000;

/// A deliberately broken store or resource, for the negative controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServerFault {
    /// Correct behaviour: the reference store, durable across restarts, and a fencing resource.
    #[default]
    None,
    /// The store keeps its leases and tokens in memory only: a restart starts it afresh, so its
    /// next grant has token 1 again (a store that claims durable tokens and has none).
    TokensLostOnRestart,
    /// The fenced resource applies every write and install without comparing its token.
    UnfencedResource,
}

/// The store's restarts: windows of simulated time during which it is down.
#[derive(Debug, Clone, Default)]
struct Downtime(Arc<Vec<(Duration, Duration)>>);

impl Downtime {
    /// How many restarts have begun by `now`.
    fn epoch(&self, now: Duration) -> usize {
        self.0.iter().filter(|(from, _)| *from <= now).count()
    }

    fn is_down(&self, now: Duration) -> bool {
        self.0.iter().any(|(from, to)| *from <= now && now < *to)
    }

    /// The next restart after `now`.
    fn next_after(&self, now: Duration) -> Option<Duration> {
        self.0
            .iter()
            .map(|(from, _)| *from)
            .find(|from| *from > now)
    }
}

/// The server's state: the reference store, the fenced resource, and the fault knobs.
#[derive(Debug, Clone)]
pub struct Server {
    /// The store, and how many restarts it has been through (a store that loses its state on a
    /// restart is replaced by a fresh one).
    store: Arc<Mutex<(MemoryLeaseStore, usize)>>,
    resource: MemoryFencedResource,
    fault: ServerFault,
    downtime: Downtime,
    /// Probability that a renewal of a live lease is refused anyway (the lease keeps its old
    /// expiry), as a store does whose renewal is conditioned on a version that moved.
    refuse_live: f64,
    faults_until: Option<Duration>,
    trace: Trace,
    /// Probability that a response is dropped after the request was applied (a lost reply).
    drop_reply: f64,
    clock_rate: f64,
    rng: Arc<Mutex<fastrand::Rng>>,
    clock: HostClock,
    clock_steps: Vec<(Duration, Duration)>,
}

impl Server {
    /// A server over fresh state. `drop_reply` is the probability of losing a reply after the
    /// request took effect; `seed` drives that choice.
    pub fn new(trace: Trace, drop_reply: f64, seed: u64) -> Self {
        Server {
            store: Arc::new(Mutex::new((MemoryLeaseStore::new(), 0))),
            resource: MemoryFencedResource::new(),
            fault: ServerFault::None,
            downtime: Downtime::default(),
            refuse_live: 0.0,
            faults_until: None,
            trace,
            drop_reply,
            clock_rate: 1.0,
            rng: Arc::new(Mutex::new(fastrand::Rng::with_seed(seed))),
            clock: HostClock::default(),
            clock_steps: Vec::new(),
        }
    }

    /// Models clock-rate drift: the store's clock runs `rate` times as fast as the clients', so a
    /// TTL of `t` lasts `t / rate` of client time. turmoil runs every host clock at one rate; this
    /// is how a run gets drift. Rates at or below 1 (and non-finite ones) mean no drift.
    pub fn with_clock_rate(mut self, rate: f64) -> Self {
        self.clock_rate = if rate.is_finite() && rate > 1.0 {
            rate
        } else {
            1.0
        };
        self
    }

    /// Deliberately breaks the store or the resource (negative controls).
    pub fn with_fault(mut self, fault: ServerFault) -> Self {
        self.fault = fault;
        self
    }

    /// Restarts the store: during each window `(from, to)` of simulated time it is down (every
    /// connection is closed at `from`, connections made until `to` are closed at once, no request
    /// is applied). Its leases and tokens survive (a durable store) unless the fault is
    /// [`ServerFault::TokensLostOnRestart`].
    pub fn with_restarts(mut self, mut windows: Vec<(Duration, Duration)>) -> Self {
        windows.sort();
        self.downtime = Downtime(Arc::new(windows));
        self
    }

    /// Steps the store's clock forward by each `(at, by)` (simulated time, size): every lease
    /// then expires `by` early (beyond the drift margin, a negative control).
    pub fn with_clock_steps(mut self, steps: Vec<(Duration, Duration)>) -> Self {
        self.clock_steps = steps;
        self
    }

    /// Refuses a renewal of a live lease with probability `p` (drawn from the server's seeded
    /// generator); the lease then expires when it would have without the renewal.
    pub fn with_refused_renewals(mut self, p: f64) -> Self {
        self.refuse_live = if p.is_finite() {
            p.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// Stops the server's faults (lost replies, refused renewals) at simulated time `until` (when
    /// the network heals). Without it they go on for the whole run.
    pub fn with_faults_until(mut self, until: Duration) -> Self {
        self.faults_until = Some(until);
        self
    }

    fn faulty(&self) -> bool {
        self.faults_until
            .is_none_or(|until| self.clock.now() < until)
    }

    /// The store as of `now`: a store that loses its state on a restart starts afresh once per
    /// restart begun.
    fn store(&self, now: Duration) -> MemoryLeaseStore {
        let mut s = self.store.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = self.downtime.epoch(now);
        if s.1 != epoch {
            s.1 = epoch;
            if self.fault == ServerFault::TokensLostOnRestart {
                s.0 = MemoryLeaseStore::new();
            }
        }
        s.0.clone()
    }

    fn draw(&self, p: f64) -> bool {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        p > 0.0 && rng.f64() < p
    }

    /// A TTL as it elapses on the store's clock, in client time.
    fn store_ttl(&self, ttl_us: u64) -> Duration {
        Duration::from_micros(ttl_us).div_f64(self.clock_rate)
    }

    /// Accepts connections on [`PORT`] and serves each until it closes.
    ///
    /// # Errors
    /// When the listener cannot be bound.
    ///
    /// # Cancellation safety
    /// Cancel safe: dropping it stops accepting; connections already accepted keep being served.
    pub async fn serve(self) -> turmoil::Result {
        let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
        self.clock.start();
        if !self.clock_steps.is_empty() {
            tokio::task::spawn_local(self.clock.clone().run_steps(
                self.clock_steps.clone(),
                self.trace.clone(),
                "server".into(),
            ));
        }
        loop {
            let (stream, _) = listener.accept().await?;
            let now = self.clock.now();
            if self.downtime.is_down(now) {
                // Down: the connection is closed at once.
                drop(stream);
                continue;
            }
            let epoch = self.downtime.epoch(now);
            tokio::task::spawn_local(self.clone().connection(stream, epoch));
        }
    }

    /// Serves one connection, made during restart epoch `epoch`, until it closes or the store
    /// restarts.
    async fn connection(self, stream: TcpStream, epoch: usize) {
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        loop {
            let now = self.clock.now();
            let restart = self.downtime.next_after(now).map(|at| at - now);
            let line = tokio::select! {
                biased;
                () = sleep(restart.unwrap_or_default()), if restart.is_some() => return,
                line = lines.next_line() => line,
            };
            let Ok(Some(line)) = line else { return };
            let now = self.clock.now();
            if self.downtime.epoch(now) != epoch || self.downtime.is_down(now) {
                return;
            }
            let Ok(frame) = serde_json::from_str::<Frame<Request>>(&line) else {
                return;
            };
            let body = self.handle(frame.body, now).await;
            if self.faulty() && self.draw(self.drop_reply) {
                self.trace.record_at(
                    self.clock.now(),
                    "server",
                    EventKind::ReplyDropped { id: frame.id },
                );
                continue;
            }
            let Ok(mut out) = serde_json::to_string(&Frame { id: frame.id, body }) else {
                return;
            };
            out.push('\n');
            if write.write_all(out.as_bytes()).await.is_err() {
                return;
            }
        }
    }

    async fn handle(&self, req: Request, now: Duration) -> Response {
        match self.apply(req, self.store(now)).await {
            Ok(r) => r,
            Err(e) => Response::Error {
                invalid: e.is_invalid_input(),
                message: e.to_string(),
            },
        }
    }

    async fn apply(
        &self,
        req: Request,
        store: MemoryLeaseStore,
    ) -> leasehold_core::Result<Response> {
        let t = &self.trace;
        Ok(match req {
            Request::Acquire { key, owner, ttl_us } => {
                let key = LeaseKey::new(key)?;
                let owner = OwnerId::new(owner)?;
                let r = AcquireRequest::new(key.clone(), owner.clone(), self.store_ttl(ttl_us));
                let before = store.inspect(&key).await?.holder;
                match store.acquire(&r).await? {
                    AcquireOutcome::Acquired(l) => {
                        if let Some(old) = before.filter(|h| h.owner == owner) {
                            // The contract's same-owner re-grant: a new, greater token to the
                            // owner that holds the key.
                            t.record_at(
                                self.clock.now(),
                                "server",
                                EventKind::SameOwnerRegrant {
                                    key: key.to_string(),
                                    owner: owner.to_string(),
                                    old: old.token.get(),
                                    new: l.token().get(),
                                },
                            );
                        }
                        t.record_at(
                            self.clock.now(),
                            "server",
                            EventKind::Granted {
                                key: key.to_string(),
                                owner: owner.to_string(),
                                token: l.token().get(),
                            },
                        );
                        Response::Acquired {
                            token: l.token().get(),
                        }
                    }
                    AcquireOutcome::Held(h) => Response::Held(WireHolder {
                        owner: h.owner.to_string(),
                        token: h.token.get(),
                        remaining_us: micros(h.remaining),
                        ttl_us: micros(h.ttl.mul_f64(self.clock_rate)),
                    }),
                }
            }
            Request::Renew {
                key,
                owner,
                token,
                ttl_us,
            } => {
                let lease = resume(&key, &owner, token, self.store_ttl(ttl_us))?;
                if self.refuse_live > 0.0 && self.faulty() {
                    let live = store
                        .inspect(lease.key())
                        .await?
                        .holder
                        .is_some_and(|h| h.owner == *lease.owner() && h.token == lease.token());
                    if live && self.draw(self.refuse_live) {
                        t.record_at(
                            self.clock.now(),
                            "server",
                            EventKind::LiveRenewalRefused { key, token },
                        );
                        return Ok(Response::Lost);
                    }
                }
                let out = store.renew(&lease).await?;
                let renewed = matches!(out, RenewOutcome::Renewed(_));
                t.record_at(
                    self.clock.now(),
                    "server",
                    EventKind::RenewAnswered {
                        key,
                        token,
                        renewed,
                    },
                );
                if renewed {
                    Response::Renewed
                } else {
                    Response::Lost
                }
            }
            Request::Release {
                key,
                owner,
                token,
                ttl_us,
            } => {
                let lease = resume(&key, &owner, token, self.store_ttl(ttl_us))?;
                match store.release(&lease).await? {
                    ReleaseOutcome::Released => {
                        t.record_at(
                            self.clock.now(),
                            "server",
                            EventKind::ReleasedAt { key, token },
                        );
                        Response::Released
                    }
                    ReleaseOutcome::NotHeld => Response::NotHeld,
                }
            }
            Request::Inspect { key } => {
                let s = store.inspect(&LeaseKey::new(key)?).await?;
                Response::State {
                    holder: s.holder.map(|h| WireHolder {
                        owner: h.owner.to_string(),
                        token: h.token.get(),
                        remaining_us: micros(h.remaining),
                        ttl_us: micros(h.ttl),
                    }),
                    last_token: s.last_token.map(FencingToken::get),
                }
            }
            Request::Write { key, token, add } => {
                let k = LeaseKey::new(&key)?;
                let token = FencingToken::new(token)?;
                let out = self.resource.write(&k, token, WriteOp::Add(add)).await?;
                self.fenced(key, token, true, out)
            }
            Request::Install { key, token } => {
                let k = LeaseKey::new(&key)?;
                let token = FencingToken::new(token)?;
                let out = self.resource.install(&k, token).await?;
                self.fenced(key, token, false, out)
            }
        })
    }

    fn fenced(
        &self,
        key: String,
        presented: FencingToken,
        write: bool,
        out: WriteOutcome,
    ) -> Response {
        let token = presented.get();
        let out = match out {
            // The broken resource applies the write anyway (its high-water mark is not kept).
            WriteOutcome::Rejected { .. } if self.fault == ServerFault::UnfencedResource => {
                WriteOutcome::Accepted {
                    high_water: presented,
                }
            }
            out => out,
        };
        match out {
            WriteOutcome::Accepted { high_water } => {
                self.trace.record_at(
                    self.clock.now(),
                    "server",
                    EventKind::FenceAccepted { key, token, write },
                );
                Response::Accepted {
                    high_water: high_water.get(),
                }
            }
            WriteOutcome::Rejected {
                presented,
                high_water,
            } => {
                self.trace.record_at(
                    self.clock.now(),
                    "server",
                    EventKind::FenceRejected {
                        key,
                        token,
                        high_water: high_water.get(),
                    },
                );
                Response::Rejected {
                    presented: presented.get(),
                    high_water: high_water.get(),
                }
            }
        }
    }
}

fn resume(key: &str, owner: &str, token: u64, ttl: Duration) -> leasehold_core::Result<Lease> {
    Ok(Lease::resume(
        LeaseKey::new(key)?,
        OwnerId::new(owner)?,
        FencingToken::new(token)?,
        ttl,
    ))
}
