//! Process and machine facts from `/proc` (no `unsafe`, no libc).

use std::sync::OnceLock;
use std::time::Duration;

/// The resident set size of this process, in bytes (`VmRSS`).
pub(crate) fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn clock_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100)
    })
}

/// User plus system CPU time of this process (`/proc/self/stat` utime + stime).
pub(crate) fn cpu_time() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let ticks = get(11) + get(12);
    Duration::from_micros(ticks * 1_000_000 / clock_ticks())
}

fn command(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The checkout's commit (`git rev-parse --short HEAD`), marked when the work tree has changes
/// (the figures then come from code that no commit holds).
fn commit() -> String {
    let head = command("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    if dirty {
        format!("{head} with uncommitted changes")
    } else {
        head
    }
}

/// `(label, value)` lines describing the machine.
pub(crate) fn machine() -> Vec<(&'static str, String)> {
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into());
    vec![
        (
            "CPUs (nproc)",
            std::thread::available_parallelism()
                .map_or_else(|_| "unknown".into(), |n| n.to_string()),
        ),
        ("memory", mem),
        ("kernel", command("uname", &["-sr"])),
        ("rustc", command("rustc", &["--version"])),
        ("load average at start (1/5/15 min)", load),
        ("commit", commit()),
    ]
}

/// A server's processes, found in `/proc` by command name (`comm`), and where `arg` is given,
/// by one argument of their command line that contains it (an address or a member name), so
/// that another server of the same program on this machine is not counted.
#[derive(Debug, Clone)]
pub(crate) struct ServerProcs {
    /// `(comm, arg)` pairs; a process matching any pair is counted.
    pub(crate) matches: Vec<(&'static str, Option<String>)>,
}

impl ServerProcs {
    /// What is counted, for the report (`redis-server (127.0.0.1:6379)`, ...).
    pub(crate) fn describe(&self) -> String {
        self.matches
            .iter()
            .map(|(comm, arg)| match arg {
                Some(a) => format!("{comm} ({a})"),
                None => (*comm).to_string(),
            })
            .collect::<Vec<_>>()
            .join(" + ")
    }

    fn matches(&self, comm: &str, cmdline: &str) -> bool {
        self.matches.iter().any(|(c, arg)| {
            *c == comm
                && arg.as_deref().is_none_or(|a| {
                    cmdline
                        .split(['\0', ' ', '='])
                        .any(|token| contains_exactly(token, a))
                })
        })
    }

    /// CPU time of every thread of the matching processes so far (`None` if none matches).
    pub(crate) fn cpu(&self) -> Option<Duration> {
        let mut total = Duration::ZERO;
        let mut found = false;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let cmdline =
                std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if self.matches(comm.trim(), &cmdline) {
                found = true;
                total += threads_cpu(&format!("/proc/{pid}"));
            }
        }
        found.then_some(total)
    }
}

/// Whether `token` contains `needle` not followed by a digit (so `127.0.0.1:6379` is not found
/// in `127.0.0.1:63790`).
fn contains_exactly(token: &str, needle: &str) -> bool {
    token.match_indices(needle).any(|(i, _)| {
        !token[i + needle.len()..]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit())
    })
}

/// The CPU time of every thread of the process at `proc_dir` (`/proc/<pid>` or `/proc/self`),
/// in nanoseconds from each thread's `schedstat` (exact, unlike `stat`'s clock ticks). Threads
/// that have exited are not counted.
fn threads_cpu(proc_dir: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("{proc_dir}/task")) else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// The CPU time of every thread of this process so far, in nanoseconds (see [`threads_cpu`]).
pub(crate) fn self_cpu() -> Duration {
    threads_cpu("/proc/self")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_matched_whole() {
        assert!(contains_exactly("127.0.0.1:6379", "127.0.0.1:6379"));
        assert!(contains_exactly(
            "http://127.0.0.1:23790",
            "127.0.0.1:23790"
        ));
        assert!(!contains_exactly("127.0.0.1:63790", "127.0.0.1:6379"));
        let p = ServerProcs {
            matches: vec![("redis-server", Some("127.0.0.1:6379".into()))],
        };
        assert!(p.matches("redis-server", "redis-server 127.0.0.1:6379"));
        assert!(!p.matches("redis-server", "redis-server 127.0.0.1:7101 [cluster]"));
        assert!(!p.matches("postgres", "redis-server 127.0.0.1:6379"));
    }

    #[test]
    fn this_process_uses_cpu() {
        let before = self_cpu();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(self_cpu() > before, "{x}");
    }
}
