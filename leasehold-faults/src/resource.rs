//! A fenced resource served over TCP: a stand-in for the downstream service (a database, an
//! object store, an API) that every holder writes to. It wraps the in-memory reference
//! [`MemoryFencedResource`], so a test can share one resource between in-process holders and
//! holder child processes, and it records every write for the history checker.
//!
//! Protocol (one line per request and per answer):
//! `W <key> <token> <delta>` -> `A <high_water>` | `R <presented> <high_water>`,
//! `I <key> <token>` (install) -> the same answers, `S <key>` -> `C <counter> <accepted>`.

use std::net::SocketAddr;
use std::sync::Arc;

use leasehold_core::{
    FencedResource, FencingToken, LeaseKey, MemoryFencedResource, WriteOp, WriteOutcome,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The server side; stops when dropped.
#[derive(Debug)]
pub struct ResourceServer {
    addr: SocketAddr,
    resource: MemoryFencedResource,
    stop: CancellationToken,
}

impl ResourceServer {
    /// Starts on a free loopback port.
    ///
    /// # Errors
    /// If no port can be bound.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let resource = MemoryFencedResource::new();
        let stop = CancellationToken::new();
        let (r, s) = (resource.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let conn = tokio::select! {
                    _ = s.cancelled() => return,
                    c = listener.accept() => c,
                };
                if let Ok((stream, _)) = conn {
                    tokio::spawn(serve(stream, r.clone()));
                }
            }
        });
        Ok(ResourceServer {
            addr,
            resource,
            stop,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The resource itself (for in-process writers and assertions).
    pub fn resource(&self) -> &MemoryFencedResource {
        &self.resource
    }
}

impl Drop for ResourceServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(stream: TcpStream, res: MemoryFencedResource) {
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let answer = handle(&res, &line)
            .await
            .unwrap_or_else(|e| format!("E {e}"));
        if w.write_all(format!("{answer}\n").as_bytes()).await.is_err() {
            return;
        }
    }
}

async fn handle(res: &MemoryFencedResource, line: &str) -> Result<String, String> {
    let parts: Vec<&str> = line.split_whitespace().collect();
    let key = |i: usize| {
        parts
            .get(i)
            .ok_or("missing key")
            .and_then(|k| LeaseKey::new(k).map_err(|_| "bad key"))
    };
    let token = |i: usize| -> Result<FencingToken, String> {
        parts
            .get(i)
            .ok_or("missing token")?
            .parse()
            .map_err(|e: leasehold_core::Error| e.to_string())
    };
    let out = match parts.first().copied() {
        Some("W") => {
            let delta: i64 = parts
                .get(3)
                .ok_or("missing delta")?
                .parse()
                .map_err(|_| "bad delta")?;
            res.write(&key(1)?, token(2)?, WriteOp::Add(delta)).await
        }
        Some("I") => res.install(&key(1)?, token(2)?).await,
        Some("S") => {
            let s = res.read(&key(1)?).await.map_err(|e| e.to_string())?;
            return Ok(format!("C {} {}", s.counter, s.accepted));
        }
        _ => return Err(format!("unknown request {line:?}")),
    };
    Ok(match out.map_err(|e| e.to_string())? {
        WriteOutcome::Accepted { high_water } => format!("A {high_water}"),
        WriteOutcome::Rejected {
            presented,
            high_water,
        } => format!("R {presented} {high_water}"),
    })
}

/// A client of a [`ResourceServer`] (used by holder processes).
#[derive(Debug)]
pub struct ResourceClient {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    w: tokio::net::tcp::OwnedWriteHalf,
}

impl ResourceClient {
    /// Connects.
    ///
    /// # Errors
    /// If the server is not reachable.
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Self> {
        let (r, w) = TcpStream::connect(addr).await?.into_split();
        Ok(ResourceClient {
            lines: BufReader::new(r).lines(),
            w,
        })
    }

    async fn call(&mut self, req: String) -> std::io::Result<String> {
        self.w.write_all(format!("{req}\n").as_bytes()).await?;
        self.lines
            .next_line()
            .await?
            .ok_or_else(|| std::io::Error::other("resource closed"))
    }

    /// A fenced increment; `true` if accepted.
    ///
    /// # Errors
    /// On I/O failure or a malformed answer.
    pub async fn add(
        &mut self,
        key: &LeaseKey,
        token: FencingToken,
        delta: i64,
    ) -> std::io::Result<bool> {
        let a = self.call(format!("W {key} {token} {delta}")).await?;
        match a.chars().next() {
            Some('A') => Ok(true),
            Some('R') => Ok(false),
            _ => Err(std::io::Error::other(a)),
        }
    }
}

/// Shared handle type for in-process writers.
pub type SharedResource = Arc<dyn FencedResource>;
