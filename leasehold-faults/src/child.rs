//! Holders that run as real child processes (the `lease-fault-holder` binary), so a test can
//! SIGSTOP, SIGCONT and SIGKILL them. They speak JSON lines on stdout.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// A running holder process; killed when dropped.
#[derive(Debug)]
pub struct HolderProcess {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// Every event read so far.
    pub events: Vec<Value>,
}

/// Signals a test sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Pause the process.
    Stop,
    /// Resume it.
    Cont,
    /// Kill it without cleanup.
    Kill,
    /// Ask it to stop.
    Term,
}

impl HolderProcess {
    /// Starts the holder binary with `args`.
    ///
    /// # Errors
    /// If the binary cannot be started.
    pub fn spawn(bin: &str, args: &[String]) -> std::io::Result<Self> {
        let mut child = Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        Ok(HolderProcess {
            child,
            lines: BufReader::new(stdout).lines(),
            events: Vec::new(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends a signal.
    ///
    /// # Errors
    /// If the process is gone.
    pub fn signal(&self, sig: Signal) -> std::io::Result<()> {
        use nix::sys::signal::{Signal as S, kill};
        let pid = self
            .pid()
            .ok_or_else(|| std::io::Error::other("process exited"))?;
        let sig = match sig {
            Signal::Stop => S::SIGSTOP,
            Signal::Cont => S::SIGCONT,
            Signal::Kill => S::SIGKILL,
            Signal::Term => S::SIGTERM,
        };
        let pid = i32::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
        kill(nix::unistd::Pid::from_raw(pid), sig).map_err(std::io::Error::from)
    }

    /// Reads events until one satisfies `pred` (returned) or `within` passes.
    ///
    /// # Errors
    /// On timeout or if the process closed its output first.
    pub async fn wait_for(
        &mut self,
        within: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value, String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .map_err(|_| format!("no matching event within {within:?}; saw {:?}", self.events))?
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("holder exited; events: {:?}", self.events))?;
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            self.events.push(v.clone());
            if pred(&v) {
                return Ok(v);
            }
        }
    }

    /// Waits for the process to exit (bounded), collecting remaining events.
    ///
    /// # Errors
    /// On timeout.
    pub async fn finish(&mut self, within: Duration) -> Result<Option<i32>, String> {
        let deadline = tokio::time::Instant::now() + within;
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout_at(deadline, self.lines.next_line()).await
        {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                self.events.push(v);
            }
        }
        let status = tokio::time::timeout_at(deadline, self.child.wait())
            .await
            .map_err(|_| "holder did not exit in time".to_string())?
            .map_err(|e| e.to_string())?;
        Ok(status.code())
    }
}

/// The path of the holder binary built alongside the tests.
pub fn holder_bin() -> String {
    std::env::var("LEASE_FAULT_HOLDER").unwrap_or_else(|_| {
        let exe = std::env::current_exe().unwrap_or_default();
        let mut dir = exe
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default();
        if dir.ends_with("deps") {
            dir.pop();
        }
        dir.join("lease-fault-holder")
            .to_string_lossy()
            .into_owned()
    })
}
