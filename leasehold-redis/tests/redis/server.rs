//! `redis-server` processes started by a test on free loopback ports, each with its own
//! directory, no persistence, and a guard that kills the process and removes the directory when
//! dropped (also when the case fails or panics).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold_testkit::Failed;
use tokio::time::Instant;

/// A running `redis-server` owned by the test.
#[derive(Debug)]
pub(crate) struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    /// Listens with TLS only (`--port 0 --tls-port`): ready once the port accepts.
    tls: bool,
}

fn free_port() -> Result<u16, Failed> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

impl RedisServer {
    /// Starts a server on a free port with `extra` arguments (for example `--replicaof`).
    pub(crate) async fn start(extra: &[&str]) -> Result<Self, Failed> {
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("leasehold-redis-test-{port}-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            tls: false,
        };
        server.spawn().await?;
        Ok(server)
    }

    /// Starts a server whose wall clock (`CLOCK_REALTIME`, which `TIME` and key expiry read) is
    /// faked by libfaketime and can be stepped with [`FakeClock::step`]; its monotonic clock (the
    /// event loop's timers) is left alone. Needs the Debian package `faketime`.
    ///
    /// Redis on Debian is linked with jemalloc, which libfaketime cannot initialise under
    /// (wolfcw/libfaketime#130: jemalloc's init calls `clock_gettime` before libfaketime is
    /// ready, and both hang). glibc's `libc_malloc_debug.so.0`, preloaded first, serves
    /// `malloc`/`free` from glibc instead, so jemalloc is never initialised during libfaketime's
    /// start-up.
    pub(crate) async fn start_with_fake_clock(extra: &[&str]) -> Result<(Self, FakeClock), Failed> {
        let faketime = find_lib(&["/usr/lib", "/lib"], "faketime/libfaketime.so.1").ok_or(
            "libfaketime.so.1 not found: install the Debian package faketime \
             (scripts/services/redis.sh does)",
        )?;
        let malloc = find_lib(&["/lib", "/usr/lib"], "libc_malloc_debug.so.0")
            .ok_or("glibc's libc_malloc_debug.so.0 not found")?;
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("leasehold-redis-test-{port}-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let clock = FakeClock {
            file: dir.join("faketime"),
        };
        clock.write("+0")?;
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: vec![
                (
                    "LD_PRELOAD".into(),
                    format!("{} {}", malloc.display(), faketime.display()),
                ),
                (
                    "FAKETIME_TIMESTAMP_FILE".into(),
                    clock.file.display().to_string(),
                ),
                // Read the file on every clock call, so a step takes effect at once.
                ("FAKETIME_NO_CACHE".into(), "1".into()),
                ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
            ],
            tls: false,
        };
        server.spawn().await?;
        Ok((server, clock))
    }

    /// Starts a server that speaks only TLS on a free port, with `extra` arguments (which must
    /// name its certificate and key: `--tls-cert-file`, `--tls-key-file`, `--tls-ca-cert-file`).
    #[allow(dead_code, reason = "used by the redis-tls target only")]
    pub(crate) async fn start_tls(extra: &[&str]) -> Result<Self, Failed> {
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("leasehold-redis-test-{port}-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        extra.extend(["--tls-port".to_string(), port.to_string()]);
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra,
            env: Vec::new(),
            tls: true,
        };
        server.spawn().await?;
        Ok(server)
    }

    async fn spawn(&mut self) -> Result<(), Failed> {
        let plain_port = if self.tls { 0 } else { self.port };
        let child = Command::new("redis-server")
            .args([
                "--port",
                &plain_port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--logfile", "redis.log", "--daemonize", "no"])
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server (is it installed?): {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if self.ping().await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "redis-server on port {} did not answer PING within 15 s",
                    self.port
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn ping(&self) -> redis::RedisResult<()> {
        if self.tls {
            tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
            return Ok(());
        }
        let client = redis::Client::open(self.url().as_str())?;
        let mut con = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async(&mut con).await
    }

    /// The port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id.
    pub(crate) fn pid(&self) -> Result<u32, Failed> {
        self.child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| "server not running".into())
    }

    /// Kills the process (no save: the data is gone) and waits for it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again on the same port and directory, empty.
    pub(crate) async fn restart(&mut self) -> Result<(), Failed> {
        self.kill();
        self.spawn().await
    }

    /// Sends a signal (`STOP`, `CONT`) to the process.
    pub(crate) fn signal(&self, signal: &str) -> Result<(), Failed> {
        let pid = self.pid()?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .map_err(|e| format!("kill -{signal} {pid}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill -{signal} {pid} failed: {status}").into())
        }
    }

    /// A plain connection for administrative commands.
    pub(crate) async fn admin(&self) -> Result<redis::aio::MultiplexedConnection, Failed> {
        let client = redis::Client::open(self.url().as_str()).map_err(|e| e.to_string())?;
        Ok(client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?)
    }

    /// The `INFO replication` field `name`.
    pub(crate) async fn replication_field(&self, name: &str) -> Result<Option<String>, Failed> {
        let mut con = self.admin().await?;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut con)
            .await
            .map_err(|e| e.to_string())?;
        Ok(info.lines().find_map(|l| {
            l.strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_string())
        }))
    }

    /// Waits until `INFO replication` shows `name:value`, or fails after `within`.
    pub(crate) async fn wait_replication(
        &self,
        name: &str,
        value: &str,
        within: Duration,
    ) -> Result<(), Failed> {
        let deadline = Instant::now() + within;
        loop {
            if self.replication_field(name).await?.as_deref() == Some(value) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "server {}: {name} was not {value} within {within:?}",
                    self.port
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// The first `<root>/<multiarch dir>/<name>` (or `<root>/<name>`) that exists.
fn find_lib(roots: &[&str], name: &str) -> Option<PathBuf> {
    roots.iter().find_map(|root| {
        let direct = PathBuf::from(root).join(name);
        if direct.exists() {
            return Some(direct);
        }
        std::fs::read_dir(root).ok()?.find_map(|entry| {
            let candidate = entry.ok()?.path().join(name);
            candidate.exists().then_some(candidate)
        })
    })
}

/// The faked wall clock of a server started with [`RedisServer::start_with_fake_clock`].
#[derive(Debug)]
pub(crate) struct FakeClock {
    file: PathBuf,
}

impl FakeClock {
    /// Steps the server's wall clock to `offset` from the real one (`+3600s`: one hour ahead).
    /// Atomic (written aside, then renamed), so the server never reads a half-written offset.
    pub(crate) fn step(&self, offset: &str) -> Result<(), Failed> {
        self.write(offset)
    }

    /// Sets the server's wall clock to `at` (`2030-01-01 00:00:00`) and stops it there: every
    /// clock read returns that instant until the next step or set.
    pub(crate) fn freeze(&self, at: &str) -> Result<(), Failed> {
        self.write(at)
    }

    fn write(&self, offset: &str) -> Result<(), Failed> {
        let aside = self.file.with_extension("next");
        std::fs::write(&aside, format!("{offset}\n"))
            .and_then(|()| std::fs::rename(&aside, &self.file))
            .map_err(|e| format!("write {}: {e}", self.file.display()).into())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
