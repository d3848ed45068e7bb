//! A switchable loopback front for a server that fails over: clients connect to the front (like a
//! virtual IP or a DNS name), which forwards each connection to the current upstream. Switching
//! the upstream (a promotion) cuts every open connection, as a moved virtual IP does, and sends
//! new connections to the new server.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// A running front; stops (and cuts its connections) when dropped.
#[derive(Debug)]
pub struct Front {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

#[derive(Debug)]
struct State {
    upstream: SocketAddr,
    /// Cancelled to cut every connection opened to the current upstream.
    epoch: CancellationToken,
}

impl Front {
    /// Listens on a free loopback port and forwards to `upstream`.
    ///
    /// # Errors
    /// If no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Front> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            upstream,
            epoch: CancellationToken::new(),
        }));
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, state.clone(), stop.clone()));
        Ok(Front { addr, state, stop })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The current upstream.
    pub fn upstream(&self) -> SocketAddr {
        self.lock().upstream
    }

    /// Sends new connections to `upstream` and cuts every open one.
    pub fn switch(&self, upstream: SocketAddr) {
        let mut s = self.lock();
        s.upstream = upstream;
        s.epoch.cancel();
        s.epoch = CancellationToken::new();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop.cancel();
        self.lock().epoch.cancel();
    }
}

async fn accept(listener: TcpListener, state: Arc<Mutex<State>>, stop: CancellationToken) {
    let mut conns = JoinSet::new();
    loop {
        let (mut down, _) = tokio::select! {
            () = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(_) => continue,
            },
        };
        let (upstream, epoch) = {
            let s = state.lock().unwrap_or_else(|p| p.into_inner());
            (s.upstream, s.epoch.clone())
        };
        conns.spawn(async move {
            let Ok(mut up) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = down.set_nodelay(true);
            let _ = up.set_nodelay(true);
            tokio::select! {
                () = epoch.cancelled() => {}
                _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
            }
        });
        while conns.try_join_next().is_some() {}
    }
    conns.abort_all();
}
