//! The simulated store: the in-memory reference store and fenced resource behind a TCP listener.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, FencingToken, Lease, LeaseKey, LeaseStore,
    MemoryFencedResource, MemoryLeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, WriteOp,
    WriteOutcome,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use turmoil::net::{TcpListener, TcpStream};

use crate::protocol::{Frame, Request, Response, WireHolder, micros};
use crate::trace::{EventKind, Trace};

/// The port the simulated server listens on.
pub const PORT: u16 = 7000;

/// The server's state: the reference store, the fenced resource, and the fault knobs.
#[derive(Debug, Clone)]
pub struct Server {
    store: MemoryLeaseStore,
    resource: MemoryFencedResource,
    trace: Trace,
    /// Probability that a response is dropped after the request was applied (a lost reply).
    drop_reply: f64,
    clock_rate: f64,
    rng: Arc<Mutex<fastrand::Rng>>,
}

impl Server {
    /// A server over fresh state. `drop_reply` is the probability of losing a reply after the
    /// request took effect; `seed` drives that choice.
    pub fn new(trace: Trace, drop_reply: f64, seed: u64) -> Self {
        Server {
            store: MemoryLeaseStore::new(),
            resource: MemoryFencedResource::new(),
            trace,
            drop_reply,
            clock_rate: 1.0,
            rng: Arc::new(Mutex::new(fastrand::Rng::with_seed(seed))),
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
        loop {
            let (stream, _) = listener.accept().await?;
            tokio::task::spawn_local(self.clone().connection(stream));
        }
    }

    async fn connection(self, stream: TcpStream) {
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(frame) = serde_json::from_str::<Frame<Request>>(&line) else {
                return;
            };
            let body = self.handle(frame.body).await;
            let lost = {
                let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
                self.drop_reply > 0.0 && rng.f64() < self.drop_reply
            };
            if lost {
                self.trace
                    .record("server", EventKind::ReplyDropped { id: frame.id });
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

    async fn handle(&self, req: Request) -> Response {
        match self.apply(req).await {
            Ok(r) => r,
            Err(e) => Response::Error {
                invalid: e.is_invalid_input(),
                message: e.to_string(),
            },
        }
    }

    async fn apply(&self, req: Request) -> leasehold_core::Result<Response> {
        let t = &self.trace;
        Ok(match req {
            Request::Acquire { key, owner, ttl_us } => {
                let key = LeaseKey::new(key)?;
                let owner = OwnerId::new(owner)?;
                let r = AcquireRequest::new(key.clone(), owner.clone(), self.store_ttl(ttl_us));
                match self.store.acquire(&r).await? {
                    AcquireOutcome::Acquired(l) => {
                        t.record(
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
                let out = self.store.renew(&lease).await?;
                let renewed = matches!(out, RenewOutcome::Renewed(_));
                t.record(
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
                match self.store.release(&lease).await? {
                    ReleaseOutcome::Released => {
                        t.record("server", EventKind::ReleasedAt { key, token });
                        Response::Released
                    }
                    ReleaseOutcome::NotHeld => Response::NotHeld,
                }
            }
            Request::Inspect { key } => {
                let s = self.store.inspect(&LeaseKey::new(key)?).await?;
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
                let out = self
                    .resource
                    .write(&k, FencingToken::new(token)?, WriteOp::Add(add))
                    .await?;
                self.fenced(key, token, true, out)
            }
            Request::Install { key, token } => {
                let k = LeaseKey::new(&key)?;
                let out = self.resource.install(&k, FencingToken::new(token)?).await?;
                self.fenced(key, token, false, out)
            }
        })
    }

    fn fenced(&self, key: String, token: u64, write: bool, out: WriteOutcome) -> Response {
        match out {
            WriteOutcome::Accepted { high_water } => {
                self.trace
                    .record("server", EventKind::FenceAccepted { key, token, write });
                Response::Accepted {
                    high_water: high_water.get(),
                }
            }
            WriteOutcome::Rejected {
                presented,
                high_water,
            } => {
                self.trace.record(
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
