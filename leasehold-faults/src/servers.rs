//! Throwaway servers that the restart and failover scenarios start, kill, restart and promote:
//! never the shared services. Each is stopped (and its data deleted) when dropped.
//!
//! - [`PgPair`]: a PostgreSQL primary and a streaming standby, built by
//!   `scripts/services/postgres-failover.sh` on free ports (optionally a synchronous standby);
//! - [`RedisNode`]: a `redis-server` process on a free port (a primary or a replica);
//! - [`EtcdCluster`]: three `etcd` members on free ports;
//! - [`KubeInstance`]: a kube-apiserver over its own etcd, started by `scripts/services/k8s.sh`
//!   with a state directory of its own.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

/// The repository's `scripts/services` directory.
fn services() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/services")
}

/// A state directory of our own, under `LEASE_STATE_DIR` (default `/tmp/lease-test`).
fn state_dir(what: &str) -> PathBuf {
    PathBuf::from(leasehold_testkit::stores::state_dir()).join(format!(
        "faults-{what}-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ))
}

/// A free loopback port for a server this suite starts, drawn below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`) and bound once to check that it is free.
///
/// A port the kernel hands out for port 0 comes from the ephemeral range, where every outgoing
/// connection and every proxy of the suite draws its own port too: between the check and the
/// server's own bind one of them could take it (seen in the soak: a restarted kube-apiserver found
/// its port in use). Below the range only another server started here can take it.
///
/// # Errors
/// If no port can be bound.
pub fn free_port() -> Result<u16, String> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if low > 12_000 {
        for _ in 0..64 {
            let port = fastrand::u16(10_000..low);
            if std::net::TcpListener::bind(loopback(port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The blocking part of a server's `Drop`: runs `cmd` (output discarded) to completion, then
/// deletes `dir`.
///
/// A drop runs wherever the value goes out of scope, usually inside a task of the soak's or a
/// test's runtime, and a stop script can take seconds. Run on a worker thread, it would stop that
/// worker and strand the task it last woke (in the worker's LIFO slot, which other workers cannot
/// steal). On a multi-thread runtime the work therefore runs through
/// [`block_in_place`](tokio::task::block_in_place), which first hands the worker's tasks to
/// another thread; elsewhere (a current-thread runtime, no runtime) it simply runs.
fn teardown(cmd: Option<std::process::Command>, dir: Option<&std::path::Path>) {
    let work = move || {
        if let Some(mut cmd) = cmd {
            let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
        if let Some(dir) = dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    };
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// Runs a command to completion within `within`; its stdout, or an error with its output.
async fn run(cmd: &mut Command, within: Duration) -> Result<String, String> {
    let what = format!("{cmd:?}");
    let out = tokio::time::timeout(within, cmd.kill_on_drop(true).output())
        .await
        .map_err(|_| format!("{what} did not finish within {within:?}"))?
        .map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Polls `ok` every 100 ms until it returns true or `within` passes.
async fn wait_until<F, Fut>(within: Duration, what: &str, mut ok: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if ok().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: not reached within {within:?}"));
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Sends one plain HTTP/1.0 GET to `addr` and returns the whole answer (bounded).
async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let io = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        Some(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), io)
        .await
        .ok()
        .flatten()
}

/// A PostgreSQL primary and streaming standby of our own (`postgres-failover.sh`).
#[derive(Debug)]
pub struct PgPair {
    dir: PathBuf,
    /// The primary's address.
    pub primary: SocketAddr,
    /// The standby's address.
    pub standby: SocketAddr,
}

impl PgPair {
    /// Builds the pair; with `synchronous`, the primary waits for the standby on every commit
    /// (`synchronous_standby_names = '*'`, `synchronous_commit = on`).
    ///
    /// # Errors
    /// If the script fails (no PostgreSQL binaries, not root, ...).
    pub async fn setup(synchronous: bool) -> Result<PgPair, String> {
        // The script picks the first free ports from 25432 on: two setups at once would race
        // for them, so this process builds one pair at a time and retries a lost race.
        static SETUP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _one = SETUP.lock().await;
        let mut last = String::new();
        for _ in 0..3 {
            match Self::setup_once(synchronous).await {
                Ok(p) => return Ok(p),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn setup_once(synchronous: bool) -> Result<PgPair, String> {
        let dir = state_dir("pg");
        let mut pair = PgPair {
            dir,
            primary: loopback(0),
            standby: loopback(0),
        };
        let out = pair.script(&["setup"]).await?;
        for line in out.lines() {
            if let Some(p) = line.strip_prefix("PRIMARY_PORT=") {
                pair.primary = loopback(p.trim().parse().map_err(|e| format!("{line}: {e}"))?);
            }
            if let Some(p) = line.strip_prefix("STANDBY_PORT=") {
                pair.standby = loopback(p.trim().parse().map_err(|e| format!("{line}: {e}"))?);
            }
        }
        if pair.primary.port() == 0 || pair.standby.port() == 0 {
            return Err(format!("postgres-failover.sh printed no ports: {out}"));
        }
        if synchronous {
            pair.psql(
                pair.primary,
                "ALTER SYSTEM SET synchronous_standby_names = '*'",
            )
            .await?;
            pair.psql(pair.primary, "ALTER SYSTEM SET synchronous_commit = 'on'")
                .await?;
            pair.psql(pair.primary, "SELECT pg_reload_conf()").await?;
            let p = pair.primary;
            let me = &pair;
            wait_until(
                Duration::from_secs(30),
                "synchronous standby",
                || async move {
                    me.psql(
                        p,
                        "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                    )
                    .await
                    .is_ok_and(|o| o.trim() == "1")
                },
            )
            .await?;
        }
        Ok(pair)
    }

    /// Runs one SQL statement as `postgres` on the server at `addr`; its unaligned output.
    ///
    /// # Errors
    /// If psql fails.
    pub async fn psql(&self, addr: SocketAddr, sql: &str) -> Result<String, String> {
        run(
            Command::new("psql")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-d",
                    "test",
                    "-tAc",
                    sql,
                ])
                .arg("-p")
                .arg(addr.port().to_string()),
            Duration::from_secs(30),
        )
        .await
    }

    async fn script(&self, args: &[&str]) -> Result<String, String> {
        run(
            Command::new("bash")
                .arg(services().join("postgres-failover.sh"))
                .arg(args[0])
                .arg(&self.dir)
                .args(&args[1..]),
            Duration::from_secs(120),
        )
        .await
    }

    /// Kills the primary (`pg_ctl stop -m immediate`: no shutdown checkpoint, like a crash).
    ///
    /// # Errors
    /// If pg_ctl fails.
    pub async fn crash_primary(&self) -> Result<(), String> {
        self.script(&["stop", "primary", "immediate"])
            .await
            .map(drop)
    }

    /// Starts the primary again (crash recovery).
    ///
    /// # Errors
    /// If pg_ctl fails.
    pub async fn start_primary(&self) -> Result<(), String> {
        self.script(&["start", "primary"]).await.map(drop)
    }

    /// Promotes the standby (waits until it accepts writes).
    ///
    /// # Errors
    /// If pg_ctl fails.
    pub async fn promote(&self) -> Result<(), String> {
        self.script(&["promote"]).await.map(drop)
    }

    /// The store URL template (`{addr}` for the front).
    pub fn template() -> String {
        "postgres://postgres@{addr}/test".to_string()
    }
}

impl Drop for PgPair {
    fn drop(&mut self) {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(services().join("postgres-failover.sh"))
            .arg("teardown")
            .arg(&self.dir);
        teardown(Some(cmd), None);
    }
}

/// A `redis-server` of our own on a free port, with append-only persistence (`appendfsync
/// always`), so a restart keeps every acknowledged write.
#[derive(Debug)]
pub struct RedisNode {
    dir: PathBuf,
    /// Its address.
    pub addr: SocketAddr,
    args: Vec<String>,
    child: Option<Child>,
}

impl RedisNode {
    /// Starts a primary, or a replica of `replica_of`.
    ///
    /// # Errors
    /// If `redis-server` cannot be started or does not answer.
    pub async fn start(replica_of: Option<SocketAddr>) -> Result<RedisNode, String> {
        Self::start_with(replica_of, true).await
    }

    /// Starts a primary or a replica; without `persistent`, nothing is saved (`--appendonly
    /// no`): a restart loses every key (for the negative control of the restart scenario).
    ///
    /// # Errors
    /// If `redis-server` cannot be started or does not answer.
    pub async fn start_with(
        replica_of: Option<SocketAddr>,
        persistent: bool,
    ) -> Result<RedisNode, String> {
        let dir = state_dir("redis");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = free_port()?;
        let mut args: Vec<String> = [
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            if persistent { "yes" } else { "no" },
            "--appendfsync",
            "always",
            "--notify-keyspace-events",
            "KEA",
            "--protected-mode",
            "no",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        args.extend(["--port".into(), port.to_string()]);
        args.extend(["--dir".into(), dir.to_string_lossy().into_owned()]);
        if let Some(p) = replica_of {
            args.extend([
                "--replicaof".into(),
                "127.0.0.1".into(),
                p.port().to_string(),
            ]);
        }
        let mut node = RedisNode {
            dir,
            addr: loopback(port),
            args,
            child: None,
        };
        node.restart().await?;
        if replica_of.is_some() {
            let me = &node;
            wait_until(
                Duration::from_secs(30),
                "redis replica in sync",
                || async move {
                    me.cli(&["info", "replication"])
                        .await
                        .is_ok_and(|o| o.contains("master_link_status:up"))
                },
            )
            .await?;
        }
        Ok(node)
    }

    /// Starts the server (again) with the same port, data and arguments; waits for PONG.
    ///
    /// # Errors
    /// If it does not start.
    pub async fn restart(&mut self) -> Result<(), String> {
        let child = Command::new("redis-server")
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        self.child = Some(child);
        let me = &*self;
        wait_until(
            Duration::from_secs(30),
            "redis-server PONG",
            || async move { me.cli(&["ping"]).await.is_ok_and(|o| o.contains("PONG")) },
        )
        .await
    }

    /// Kills the server with SIGKILL and waits for it to exit.
    ///
    /// # Errors
    /// If it is not running.
    pub async fn kill(&mut self) -> Result<(), String> {
        let mut c = self.child.take().ok_or("redis-server is not running")?;
        c.kill().await.map_err(|e| e.to_string())
    }

    /// Runs `redis-cli` against this server.
    ///
    /// # Errors
    /// If redis-cli fails.
    pub async fn cli(&self, args: &[&str]) -> Result<String, String> {
        run(
            Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p"])
                .arg(self.addr.port().to_string())
                .args(args),
            Duration::from_secs(10),
        )
        .await
    }

    /// Promotes this replica (`REPLICAOF NO ONE`).
    ///
    /// # Errors
    /// If the command fails.
    pub async fn promote(&self) -> Result<(), String> {
        let out = self.cli(&["replicaof", "no", "one"]).await?;
        if out.contains("OK") {
            Ok(())
        } else {
            Err(format!("REPLICAOF NO ONE answered {out}"))
        }
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        teardown(None, Some(&self.dir));
    }
}

/// Three `etcd` members of our own on free ports.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: PathBuf,
    /// The members' client addresses.
    pub clients: Vec<SocketAddr>,
    args: Vec<Vec<String>>,
    children: Vec<Option<Child>>,
}

impl EtcdCluster {
    /// Starts three members and waits until the cluster has a leader.
    ///
    /// # Errors
    /// If etcd cannot be started or elects no leader.
    pub async fn start() -> Result<EtcdCluster, String> {
        let dir = state_dir("etcd");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut clients = Vec::new();
        let mut peers = Vec::new();
        for _ in 0..3 {
            clients.push(free_port()?);
            peers.push(free_port()?);
        }
        let initial: Vec<String> = (0..3)
            .map(|i| format!("m{i}=http://127.0.0.1:{}", peers[i]))
            .collect();
        let initial = initial.join(",");
        let args = (0..3)
            .map(|i| {
                let c = format!("http://127.0.0.1:{}", clients[i]);
                let p = format!("http://127.0.0.1:{}", peers[i]);
                vec![
                    "--name".into(),
                    format!("m{i}"),
                    "--data-dir".into(),
                    dir.join(format!("m{i}")).to_string_lossy().into_owned(),
                    "--listen-client-urls".into(),
                    c.clone(),
                    "--advertise-client-urls".into(),
                    c,
                    "--listen-peer-urls".into(),
                    p.clone(),
                    "--initial-advertise-peer-urls".into(),
                    p,
                    "--initial-cluster".into(),
                    initial.clone(),
                    "--initial-cluster-state".into(),
                    "new".into(),
                    "--heartbeat-interval".into(),
                    "50".into(),
                    "--election-timeout".into(),
                    "500".into(),
                ]
            })
            .collect();
        let mut cluster = EtcdCluster {
            dir,
            clients: clients.into_iter().map(loopback).collect(),
            args,
            children: vec![None, None, None],
        };
        for i in 0..3 {
            cluster.start_member(i)?;
        }
        cluster.leader(Duration::from_secs(30)).await?;
        Ok(cluster)
    }

    fn start_member(&mut self, i: usize) -> Result<(), String> {
        let child = Command::new("etcd")
            .args(&self.args[i])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("etcd: {e}"))?;
        self.children[i] = Some(child);
        Ok(())
    }

    /// The index of the member that is leader (by its `etcd_server_is_leader` metric), waiting
    /// up to `within` for one.
    ///
    /// # Errors
    /// If no member reports itself leader in time.
    pub async fn leader(&self, within: Duration) -> Result<usize, String> {
        let deadline = Instant::now() + within;
        loop {
            for (i, a) in self.clients.iter().enumerate() {
                if self.children[i].is_some()
                    && http_get(*a, "/metrics")
                        .await
                        .is_some_and(|m| m.lines().any(|l| l == "etcd_server_is_leader 1"))
                {
                    return Ok(i);
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("no etcd leader within {within:?}"));
            }
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills member `i` with SIGKILL.
    ///
    /// # Errors
    /// If it is not running.
    pub async fn kill(&mut self, i: usize) -> Result<(), String> {
        let mut c = self.children[i].take().ok_or("member is not running")?;
        c.kill().await.map_err(|e| e.to_string())
    }

    /// Starts member `i` again (same data directory) and waits until it is healthy.
    ///
    /// # Errors
    /// If it does not come back.
    pub async fn restart(&mut self, i: usize) -> Result<(), String> {
        self.start_member(i)?;
        let a = self.clients[i];
        wait_until(
            Duration::from_secs(30),
            "etcd member health",
            || async move {
                http_get(a, "/health")
                    .await
                    .is_some_and(|h| h.contains("\"health\":\"true\""))
            },
        )
        .await
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.start_kill();
        }
        teardown(None, Some(&self.dir));
    }
}

/// A kube-apiserver of our own (over its own etcd), started by `scripts/services/k8s.sh` in a
/// state directory of its own; the shared apiserver is never touched.
#[derive(Debug)]
pub struct KubeInstance {
    state: PathBuf,
    /// Its kubeconfig.
    pub kubeconfig: String,
    /// The apiserver's address.
    pub addr: SocketAddr,
}

impl KubeInstance {
    /// Starts it (minutes on first use if the apiserver binary must be built).
    ///
    /// # Errors
    /// If the script fails.
    pub async fn start() -> Result<KubeInstance, String> {
        let state = state_dir("k8s");
        let mut inst = KubeInstance {
            state: state.clone(),
            kubeconfig: state.join("k8s/kubeconfig").to_string_lossy().into_owned(),
            addr: loopback(0),
        };
        // Another server started here may still take a port between its check and the
        // apiserver's bind: such a start is tried again on fresh ports.
        let mut tries = 0;
        while let Err(e) = inst.script("start").await {
            tries += 1;
            if tries >= 3 || !e.contains("address already in use") {
                return Err(e);
            }
        }
        let port: u16 = std::fs::read_to_string(state.join("k8s/api.port"))
            .map_err(|e| format!("api.port: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("api.port: {e}"))?;
        inst.addr = loopback(port);
        Ok(inst)
    }

    async fn script(&self, cmd: &str) -> Result<String, String> {
        run(
            Command::new("bash")
                .arg(services().join("k8s.sh"))
                .arg(cmd)
                .env("LEASE_STATE_DIR", &self.state)
                .env("LEASE_K8S_ETCD_PORT", free_port()?.to_string())
                .env("LEASE_K8S_API_PORT", free_port()?.to_string()),
            Duration::from_secs(1800),
        )
        .await
    }

    /// Restarts the apiserver (graceful stop, start, wait for `/readyz`); etcd keeps running.
    ///
    /// # Errors
    /// If it does not come back.
    pub async fn restart(&self) -> Result<(), String> {
        self.script("restart-apiserver").await.map(drop)
    }
}

impl Drop for KubeInstance {
    fn drop(&mut self) {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(services().join("k8s.sh"))
            .arg("stop")
            .env("LEASE_STATE_DIR", &self.state);
        teardown(Some(cmd), Some(&self.state));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::teardown;

    /// The suite's servers take ports below the ephemeral range, where no outgoing connection or
    /// proxy of the suite can take them between the check and the server's bind.
    #[test]
    fn a_free_port_lies_below_the_ephemeral_range() {
        let Some(low) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
            .filter(|&l| l > 12_000)
        else {
            return;
        };
        for _ in 0..20 {
            let p = super::free_port().expect("a free port");
            assert!((10_000..low).contains(&p), "port {p} not below {low}");
        }
    }

    /// A server dropped inside a task must not stall the runtime's other tasks while its stop
    /// script runs. The task it has just woken sits in its worker's LIFO slot, which no other
    /// worker may steal from: if the drop blocks that worker, the woken task waits for the whole
    /// teardown (in the soak, a storm's timers then fire up to a second late and the checker
    /// reports late losses and writes after the deadline).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_teardown_in_drop_does_not_stall_the_task_it_woke() {
        let finished = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let (wake_tx, wake_rx) = tokio::sync::oneshot::channel::<()>();
        let f = finished.clone();
        // Reports whether the teardown had already finished when it ran after its wake-up.
        let woken = tokio::spawn(async move {
            let _ = ready_tx.send(());
            let _ = wake_rx.await;
            f.load(Ordering::SeqCst)
        });
        let _ = ready_rx.await;
        let f = finished.clone();
        tokio::spawn(async move {
            let _ = wake_tx.send(());
            let mut cmd = std::process::Command::new("sleep");
            cmd.arg("2");
            teardown(Some(cmd), None);
            f.store(true, Ordering::SeqCst);
        })
        .await
        .expect("teardown task");
        assert!(
            !woken.await.expect("woken task"),
            "the task woken right before the teardown ran only after it had finished"
        );
    }
}
