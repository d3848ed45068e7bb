//! Our own etcd members on free loopback ports, for the restart and failover cases. A [`Cluster`]
//! kills its members and deletes its data when dropped, even when the case fails.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use leasehold_testkit::Failed;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The etcd binary: `LEASE_ETCD_BIN`, default `/usr/bin/etcd`.
fn etcd_bin() -> String {
    std::env::var("LEASE_ETCD_BIN").unwrap_or_else(|_| "/usr/bin/etcd".to_string())
}

/// Timing of the members: heartbeat and election timeout in milliseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) heartbeat_ms: u64,
    pub(crate) election_ms: u64,
}

impl Timing {
    /// Fast elections (as the shared member): a minimum lease TTL of 1 s.
    pub(crate) const FAST: Timing = Timing {
        heartbeat_ms: 50,
        election_ms: 500,
    };
    /// etcd's defaults: a minimum lease TTL of 2 s.
    pub(crate) const DEFAULT: Timing = Timing {
        heartbeat_ms: 100,
        election_ms: 1000,
    };
}

#[derive(Debug)]
struct Member {
    name: String,
    client_url: String,
    peer_url: String,
    child: Option<Child>,
}

/// One or more etcd members forming a cluster.
#[derive(Debug)]
pub(crate) struct Cluster {
    dir: PathBuf,
    members: Vec<Member>,
    initial_cluster: String,
    timing: Timing,
}

fn free_ports(n: usize) -> Result<Vec<u16>, Failed> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("bind: {e}"))?;
    listeners
        .iter()
        .map(|l| {
            Ok(l.local_addr()
                .map_err(|e| format!("local_addr: {e}"))?
                .port())
        })
        .collect()
}

impl Cluster {
    /// Starts `n` members and waits until the cluster serves linearizable reads.
    pub(crate) async fn start(n: usize, timing: Timing) -> Result<Cluster, Failed> {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-etcd-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {dir:?}: {e}"))?;
        let ports = free_ports(2 * n)?;
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_url: format!("http://127.0.0.1:{}", ports[2 * i]),
                peer_url: format!("http://127.0.0.1:{}", ports[2 * i + 1]),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster {
            dir,
            members,
            initial_cluster,
            timing,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_ready(Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<(), Failed> {
        let m = &self.members[i];
        let data = self.dir.join(&m.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", m.name)))
            .map_err(|e| format!("log file: {e}"))?;
        let err = log.try_clone().map_err(|e| format!("log file: {e}"))?;
        let child = Command::new(etcd_bin())
            .args(["--name", &m.name, "--data-dir"])
            .arg(&data)
            .args([
                "--listen-client-urls",
                &m.client_url,
                "--advertise-client-urls",
                &m.client_url,
            ])
            .args([
                "--listen-peer-urls",
                &m.peer_url,
                "--initial-advertise-peer-urls",
                &m.peer_url,
            ])
            .args([
                "--initial-cluster",
                &self.initial_cluster,
                "--initial-cluster-state",
                "new",
            ])
            .args([
                "--initial-cluster-token",
                &format!("lease-test-{}", self.dir.display()),
            ])
            .args([
                "--heartbeat-interval",
                &self.timing.heartbeat_ms.to_string(),
            ])
            .args(["--election-timeout", &self.timing.election_ms.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", etcd_bin()))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// The client URLs of all members.
    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// The cluster's `etcd://` URL.
    pub(crate) fn url(&self) -> String {
        super::etcd_url(self.endpoints())
    }

    /// Kills member `i` with SIGKILL and waits for it to exit.
    pub(crate) async fn kill(&mut self, i: usize) -> Result<(), Failed> {
        if let Some(mut child) = self.members[i].child.take() {
            child
                .kill()
                .await
                .map_err(|e| format!("kill {}: {e}", self.members[i].name))?;
        }
        Ok(())
    }

    /// Starts member `i` again on its data directory and waits until the cluster is ready.
    pub(crate) async fn restart(&mut self, i: usize) -> Result<(), Failed> {
        self.spawn(i)?;
        self.wait_ready(Duration::from_secs(20)).await
    }

    async fn client(url: &str) -> Option<Client> {
        let opts = ConnectOptions::new().with_connect_timeout(Duration::from_millis(300));
        Client::connect([url], Some(opts)).await.ok()
    }

    /// Waits until a linearizable read succeeds through the live members.
    pub(crate) async fn wait_ready(&self, within: Duration) -> Result<(), Failed> {
        let deadline = Instant::now() + within;
        let live: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| m.client_url.clone())
            .collect();
        loop {
            let opts = ConnectOptions::new().with_connect_timeout(Duration::from_millis(300));
            if let Ok(mut c) = Client::connect(&live, Some(opts)).await
                && let Ok(Ok(_)) =
                    tokio::time::timeout(Duration::from_secs(1), c.get("ready-probe", None)).await
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "etcd members {live:?} not ready within {within:?}; logs in {:?}",
                    self.dir
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The index of the current leader, asking the live members (bounded wait).
    pub(crate) async fn leader(&self, within: Duration) -> Result<usize, Failed> {
        let deadline = Instant::now() + within;
        loop {
            let mut ids = Vec::new();
            let mut leader = None;
            for m in &self.members {
                let mut id = None;
                if m.child.is_some()
                    && let Some(mut c) = Self::client(&m.client_url).await
                    && let Ok(Ok(s)) =
                        tokio::time::timeout(Duration::from_secs(1), c.status()).await
                {
                    id = s.header().map(|h| h.member_id());
                    if s.leader() != 0 {
                        leader = Some(s.leader());
                    }
                }
                ids.push(id);
            }
            if let Some(l) = leader
                && let Some(i) = ids.iter().position(|id| *id == Some(l))
            {
                return Ok(i);
            }
            if Instant::now() >= deadline {
                return Err(format!("no leader within {within:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(child) = m.child.as_mut() {
                let _ = child.start_kill();
            }
        }
        if std::env::var_os("LEASE_ETCD_KEEP_DATA").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
