//! A loopback TCP fault proxy: sits between clients and a backend and can, at run time and per
//! connection, add latency, blackhole (accept bytes, forward nothing, send no reset), drop
//! responses while forwarding requests (the operation happens, the client never hears), reset
//! connections, and heal.
//!
//! ```
//! use leasehold_faults::proxy::{FaultProxy, Mode};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> std::io::Result<()> {
//! let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let proxy = FaultProxy::start(upstream.local_addr()?).await?;
//! // clients connect to proxy.addr() instead of the backend
//! proxy.set_mode(Mode::Blackhole);
//! proxy.heal();
//! assert_eq!(proxy.mode(), Mode::Pass);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    Pass,
    /// Forward both ways after this delay per chunk.
    Latency(Duration),
    /// Read and discard in both directions; never reset (a silent partition).
    Blackhole,
    /// Forward requests, discard responses: operations are applied, the client never hears.
    DropResponses,
    /// Reset every connection (RST) and every new one.
    Reset,
}

#[derive(Debug)]
struct Conn {
    mode: watch::Sender<Mode>,
}

#[derive(Debug)]
struct Inner {
    upstream: SocketAddr,
    default: watch::Sender<Mode>,
    conns: Mutex<HashMap<u64, Conn>>,
    next: AtomicU64,
    accepted: AtomicU64,
}

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    inner: Arc<Inner>,
    stop: CancellationToken,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    ///
    /// # Errors
    /// If no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            upstream,
            default: watch::channel(Mode::Pass).0,
            conns: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            accepted: AtomicU64::new(0),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(listener, inner.clone(), stop.clone()));
        Ok(FaultProxy { addr, inner, stop })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients should connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The mode for new connections (and the last one set for all).
    pub fn mode(&self) -> Mode {
        *self.inner.default.borrow()
    }

    /// Sets the mode of every current and future connection.
    pub fn set_mode(&self, mode: Mode) {
        self.inner.default.send_replace(mode);
        for c in self.lock().values() {
            c.mode.send_replace(mode);
        }
    }

    /// Sets the mode of one connection (ids from [`FaultProxy::connections`]).
    pub fn set_connection_mode(&self, id: u64, mode: Mode) {
        if let Some(c) = self.lock().get(&id) {
            c.mode.send_replace(mode);
        }
    }

    /// Ids of the open connections.
    pub fn connections(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.lock().keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// How many connections were accepted so far.
    pub fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::Relaxed)
    }

    /// Back to [`Mode::Pass`] everywhere.
    pub fn heal(&self) {
        self.set_mode(Mode::Pass);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        self.inner.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(listener: TcpListener, inner: Arc<Inner>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((client, _)) = accepted else { continue };
        inner.accepted.fetch_add(1, Ordering::Relaxed);
        let mode = *inner.default.borrow();
        if mode == Mode::Reset {
            reset(client);
            continue;
        }
        let id = inner.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(mode);
        inner
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Conn { mode: tx });
        let (inner2, stop2) = (inner.clone(), stop.clone());
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(inner2.upstream).await {
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                pump_pair(client, server, rx, stop2).await;
            }
            inner2
                .conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    }
}

fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn pump_pair(
    client: TcpStream,
    server: TcpStream,
    mode: watch::Receiver<Mode>,
    stop: CancellationToken,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let conn_stop = CancellationToken::new();
    let up = pump(
        &mut cr,
        &mut sw,
        mode.clone(),
        Direction::Request,
        conn_stop.clone(),
    );
    let down = pump(
        &mut sr,
        &mut cw,
        mode.clone(),
        Direction::Response,
        conn_stop.clone(),
    );
    let mut mode_rx = mode;
    let reset_watch = async {
        loop {
            if *mode_rx.borrow_and_update() == Mode::Reset {
                return;
            }
            if mode_rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    };
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = async { tokio::join!(up, down) } => {}
        _ = reset_watch => {
            conn_stop.cancel();
            if let (Ok(c), Ok(s)) = (cr.reunite(cw), sr.reunite(sw)) {
                reset(c);
                reset(s);
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Response,
}

async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    mode: watch::Receiver<Mode>,
    dir: Direction,
    stop: CancellationToken,
) where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            _ = stop.cancelled() => return,
            n = r.read(&mut buf) => match n {
                Ok(0) | Err(_) => {
                    let _ = w.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
        };
        let m = *mode.borrow();
        let forward = match m {
            Mode::Pass => true,
            Mode::Latency(d) => {
                tokio::time::sleep(d).await;
                true
            }
            Mode::Blackhole | Mode::Reset => false,
            Mode::DropResponses => dir == Direction::Request,
        };
        if forward && w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        s.write_all(b"ping").await.ok()?;
        let mut b = [0u8; 4];
        match tokio::time::timeout(within, s.read_exact(&mut b)).await {
            Ok(Ok(_)) => Some(b.to_vec()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn pass_blackhole_latency_heal_reset() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            roundtrip(&mut s, Duration::from_secs(5)).await.as_deref(),
            Some(&b"ping"[..])
        );
        proxy.set_mode(Mode::Blackhole);
        assert_eq!(
            roundtrip(&mut s, Duration::from_millis(200)).await,
            None,
            "blackhole forwarded"
        );
        proxy.heal();
        let mut s2 = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.set_mode(Mode::Latency(Duration::from_millis(150)));
        let t0 = std::time::Instant::now();
        assert!(roundtrip(&mut s2, Duration::from_secs(5)).await.is_some());
        assert!(
            t0.elapsed() >= Duration::from_millis(300),
            "latency not applied both ways"
        );
        proxy.set_mode(Mode::Reset);
        let mut b = [0u8; 4];
        let r = tokio::time::timeout(Duration::from_secs(5), s2.read(&mut b))
            .await
            .expect("reset not delivered");
        assert!(
            matches!(r, Ok(0) | Err(_)),
            "connection still open after reset: {r:?}"
        );
    }

    #[tokio::test]
    async fn drop_responses_forwards_requests() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = FaultProxy::start(l.local_addr().unwrap()).await.unwrap();
        proxy.set_mode(Mode::DropResponses);
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let (mut server, _) = l.accept().await.unwrap();
        c.write_all(b"req!").await.unwrap();
        let mut b = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), server.read_exact(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&b, b"req!");
        server.write_all(b"resp").await.unwrap();
        let r = tokio::time::timeout(Duration::from_millis(200), c.read(&mut b)).await;
        assert!(r.is_err(), "the response reached the client");
    }
}
