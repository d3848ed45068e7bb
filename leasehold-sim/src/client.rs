//! A [`LeaseStore`] and a [`FencedResource`] that talk to the simulated server over turmoil TCP.
//! Every call is bounded by the client's timeout; a call that times out or fails drops the
//! connection (the next call reconnects) and returns a retryable error.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, ExpiryClock, FenceOp, FencedResource,
    FencingToken, Holder, KeyState, Lease, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome,
    RenewOutcome, ResourceState, Result, TokenDurability, WriteOp, WriteOutcome,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::time::{Instant, timeout};
use turmoil::net::TcpStream;
use turmoil::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::protocol::{Frame, Request, Response, WireHolder, micros};

const BACKEND: &str = "sim";

/// A deliberately broken client behaviour, for the negative controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientFault {
    /// Correct behaviour.
    #[default]
    None,
    /// Starts the local deadline of a grant or renewal when the *reply arrives* instead of when
    /// the request was sent: a slow reply makes the client outlive the store's lease.
    StampAtReceipt,
    /// Takes a *refused* renewal for a confirmed one: the local deadline is extended although the
    /// store kept (or already ended) the old lease.
    RefusedRenewalAsRenewed,
    /// Never reconnects: after its first failed call (a timeout or a broken connection) every
    /// call waits out the timeout unanswered, as on a dead connection that is never replaced.
    NeverReconnects,
    /// A test hook for the per-seed time limit ([`Scenario::seed_timeout`](crate::Scenario)):
    /// the first call blocks its host's thread for good, so the run can never finish, as a
    /// deadlocked or endlessly looping build would not.
    BlockThread,
}

struct Conn {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

/// One connection to the simulated server, shared by a host's store and resource handles.
pub struct NetClient {
    server: String,
    timeout: Duration,
    fault: ClientFault,
    next_id: AtomicU64,
    conn: tokio::sync::Mutex<Option<Conn>>,
    /// Set on the first failure under [`ClientFault::NeverReconnects`].
    dead: AtomicBool,
}

impl fmt::Debug for NetClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetClient")
            .field("server", &self.server)
            .field("timeout", &self.timeout)
            .field("fault", &self.fault)
            .finish_non_exhaustive()
    }
}

impl NetClient {
    /// A client of the server at host `server`, every call bounded by `timeout`.
    pub fn new(server: impl Into<String>, timeout: Duration, fault: ClientFault) -> Self {
        NetClient {
            server: server.into(),
            timeout,
            fault,
            next_id: AtomicU64::new(1),
            conn: tokio::sync::Mutex::new(None),
            dead: AtomicBool::new(false),
        }
    }

    /// Sends `req` and waits for its response, at most the client's timeout.
    ///
    /// # Errors
    /// [`Error::Timeout`] or [`Error::Unavailable`] (both retryable; the outcome is unknown).
    ///
    /// # Cancellation safety
    /// Not cancel safe: a dropped call may or may not have been applied by the server.
    pub async fn call(&self, operation: &'static str, req: Request) -> Result<Response> {
        if self.fault == ClientFault::BlockThread {
            loop {
                std::thread::park();
            }
        }
        if self.dead.load(Ordering::Relaxed) {
            tokio::time::sleep(self.timeout).await;
            return Err(Error::Timeout {
                backend: BACKEND,
                operation,
                after: self.timeout,
            });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let exchange = async {
            let mut guard = self.conn.lock().await;
            let result = async {
                if guard.is_none() {
                    let stream = TcpStream::connect((self.server.as_str(), crate::server::PORT))
                        .await
                        .map_err(|e| {
                            Error::unavailable(BACKEND, "connect failed", Some(e.into()))
                        })?;
                    let (read, write) = stream.into_split();
                    *guard = Some(Conn {
                        lines: BufReader::new(read).lines(),
                        write,
                    });
                }
                let conn = guard
                    .as_mut()
                    .ok_or_else(|| Error::unavailable(BACKEND, "no connection", None))?;
                let mut line = serde_json::to_string(&Frame { id, body: req })
                    .map_err(|e| Error::store_fault(BACKEND, "encode", Some(e.into())))?;
                line.push('\n');
                conn.write
                    .write_all(line.as_bytes())
                    .await
                    .map_err(|e| Error::unavailable(BACKEND, "send failed", Some(e.into())))?;
                loop {
                    let got = conn
                        .lines
                        .next_line()
                        .await
                        .map_err(|e| Error::unavailable(BACKEND, "receive failed", Some(e.into())))?
                        .ok_or_else(|| Error::unavailable(BACKEND, "connection closed", None))?;
                    let frame: Frame<Response> = serde_json::from_str(&got)
                        .map_err(|e| Error::store_fault(BACKEND, "decode", Some(e.into())))?;
                    if frame.id == id {
                        return Ok(frame.body);
                    }
                    // A late answer to an earlier request: skip it.
                }
            }
            .await;
            if result.is_err() {
                *guard = None;
            }
            result
        };
        let result = timeout(self.timeout, exchange).await;
        if self.fault == ClientFault::NeverReconnects && !matches!(result, Ok(Ok(_))) {
            self.dead.store(true, Ordering::Relaxed);
        }
        match result {
            Ok(r) => r,
            Err(_) => {
                // The exchange was dropped mid-way: the connection may carry a late reply or a
                // half-written request. Start afresh next time.
                *self.conn.lock().await = None;
                Err(Error::Timeout {
                    backend: BACKEND,
                    operation,
                    after: self.timeout,
                })
            }
        }
    }
}

fn unexpected(operation: &str, r: &Response) -> Error {
    match r {
        Response::Error {
            invalid: true,
            message,
        } => Error::InvalidInput(message.clone()),
        Response::Error { message, .. } => Error::store_fault(BACKEND, message.clone(), None),
        other => Error::store_fault(
            BACKEND,
            format!("unexpected answer to {operation}: {other:?}"),
            None,
        ),
    }
}

fn holder(h: WireHolder) -> Result<Holder> {
    Ok(Holder {
        owner: OwnerId::new(h.owner)?,
        token: FencingToken::new(h.token)?,
        remaining: Duration::from_micros(h.remaining_us),
        ttl: Duration::from_micros(h.ttl_us),
    })
}

/// The simulated store as seen from a client host.
#[derive(Debug, Clone)]
pub struct NetStore {
    client: Arc<NetClient>,
}

impl NetStore {
    /// A store handle over `client`.
    pub fn new(client: Arc<NetClient>) -> Self {
        NetStore { client }
    }

    fn stamp(&self, sent: Instant) -> Instant {
        match self.client.fault {
            ClientFault::StampAtReceipt => Instant::now(),
            _ => sent,
        }
    }
}

#[async_trait]
impl LeaseStore for NetStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TokenDurability::Process, ExpiryClock::InProcess)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        leasehold_core::backend::validate_ttl(req.ttl, Duration::from_millis(1))?;
        let sent = Instant::now();
        let r = self
            .client
            .call(
                "acquire",
                Request::Acquire {
                    key: req.key.to_string(),
                    owner: req.owner.to_string(),
                    ttl_us: micros(req.ttl),
                },
            )
            .await?;
        match r {
            Response::Acquired { token } => Ok(AcquireOutcome::Acquired(
                leasehold_core::backend::granted_lease(
                    req.key.clone(),
                    req.owner.clone(),
                    FencingToken::new(token)?,
                    req.ttl,
                    req.drift_margin(),
                    self.stamp(sent),
                ),
            )),
            Response::Held(h) => Ok(AcquireOutcome::Held(holder(h)?)),
            other => Err(unexpected("acquire", &other)),
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        leasehold_core::backend::validate_ttl(lease.ttl(), Duration::from_millis(1))?;
        let sent = Instant::now();
        let r = self
            .client
            .call(
                "renew",
                Request::Renew {
                    key: lease.key().to_string(),
                    owner: lease.owner().to_string(),
                    token: lease.token().get(),
                    ttl_us: micros(lease.ttl()),
                },
            )
            .await?;
        match r {
            Response::Renewed => Ok(RenewOutcome::Renewed(
                lease.renewed(lease.ttl(), self.stamp(sent)),
            )),
            Response::Lost if self.client.fault == ClientFault::RefusedRenewalAsRenewed => Ok(
                RenewOutcome::Renewed(lease.renewed(lease.ttl(), self.stamp(sent))),
            ),
            Response::Lost => Ok(RenewOutcome::Lost),
            other => Err(unexpected("renew", &other)),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let r = self
            .client
            .call(
                "release",
                Request::Release {
                    key: lease.key().to_string(),
                    owner: lease.owner().to_string(),
                    token: lease.token().get(),
                    ttl_us: micros(lease.ttl()),
                },
            )
            .await?;
        match r {
            Response::Released => Ok(ReleaseOutcome::Released),
            Response::NotHeld => Ok(ReleaseOutcome::NotHeld),
            other => Err(unexpected("release", &other)),
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        let r = self
            .client
            .call(
                "inspect",
                Request::Inspect {
                    key: key.to_string(),
                },
            )
            .await?;
        match r {
            Response::State {
                holder: h,
                last_token,
            } => Ok(KeyState {
                key: key.clone(),
                holder: h.map(holder).transpose()?,
                last_token: last_token.map(FencingToken::new).transpose()?,
            }),
            other => Err(unexpected("inspect", &other)),
        }
    }
}

/// The simulated fenced resource as seen from a client host. Only counter increments
/// ([`WriteOp::Add`]) travel over the wire; reads are not offered to clients.
#[derive(Debug, Clone)]
pub struct NetFence {
    client: Arc<NetClient>,
}

impl NetFence {
    /// A resource handle over `client`.
    pub fn new(client: Arc<NetClient>) -> Self {
        NetFence { client }
    }

    fn outcome(operation: &str, r: Response) -> Result<WriteOutcome> {
        match r {
            Response::Accepted { high_water } => Ok(WriteOutcome::Accepted {
                high_water: FencingToken::new(high_water)?,
            }),
            Response::Rejected {
                presented,
                high_water,
            } => Ok(WriteOutcome::Rejected {
                presented: FencingToken::new(presented)?,
                high_water: FencingToken::new(high_water)?,
            }),
            other => Err(unexpected(operation, &other)),
        }
    }
}

#[async_trait]
impl FencedResource for NetFence {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        let op = match op {
            FenceOp::Write(op) => op,
            _ => return self.install_now(key, token).await,
        };
        let WriteOp::Add(add) = op else {
            return Err(Error::InvalidInput(
                "the simulated resource only takes counter increments".into(),
            ));
        };
        let r = self
            .client
            .call(
                "write",
                Request::Write {
                    key: key.to_string(),
                    token: token.get(),
                    add,
                },
            )
            .await?;
        Self::outcome("write", r)
    }

    async fn read(&self, _key: &LeaseKey) -> Result<ResourceState> {
        Err(Error::InvalidInput(
            "the simulated resource is read on the server side only".into(),
        ))
    }
}

impl NetFence {
    async fn install_now(&self, key: &LeaseKey, token: FencingToken) -> Result<WriteOutcome> {
        let r = self
            .client
            .call(
                "install",
                Request::Install {
                    key: key.to_string(),
                    token: token.get(),
                },
            )
            .await?;
        Self::outcome("install", r)
    }
}
