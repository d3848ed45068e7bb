//! The processes a command started, found in `/proc` by their ancestry.
//!
//! `lease run` and its guard are child subreapers (`PR_SET_CHILD_SUBREAPER`): a process whose
//! parent dies is re-parented to the nearest of them instead of to init, so every descendant of
//! the command, including one that called `setsid` or double-forked, keeps an ancestry that leads
//! back to `lease`. These functions walk that ancestry; they read only `/proc` and send signals.
//!
//! A pid read from `/proc` may be gone (and, in theory, reused) by the time it is signalled; a
//! process is only signalled while it is listed as a descendant, and a subreaper's children cannot
//! be reused before it reaps them, so the window is that of a grandchild exiting and its pid being
//! handed out again between one read and one `kill`.

use std::collections::{HashMap, HashSet};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getpid};

/// One line of `/proc/PID/stat`: the fields this module needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proc {
    pub(crate) pid: Pid,
    pub(crate) ppid: Pid,
    pub(crate) pgrp: Pid,
    /// The state letter: `R`, `S`, `D`, `T`, `Z`, ...
    pub(crate) state: char,
}

impl Proc {
    /// Whether the process has exited (a zombie waiting to be reaped, or being torn down).
    pub(crate) fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses the text of `/proc/PID/stat`. The command name is in parentheses and may itself hold
/// spaces and parentheses, so the fields are read after the last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<Proc> {
    let (head, rest) = text.rsplit_once(')')?;
    let pid = head.split_whitespace().next()?.parse().ok()?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Proc {
        pid: Pid::from_raw(pid),
        ppid: Pid::from_raw(ppid),
        pgrp: Pid::from_raw(pgrp),
        state,
    })
}

/// Every process in `/proc` now (those that vanish while being read are left out).
fn snapshot() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let name = entry.file_name();
        let name = name.to_str()?;
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let text = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        parse_stat(&text)
    })
    .collect()
}

/// The descendants of `root` in `procs`, exited ones included.
///
/// With `skip_group`, a direct child of `root` in that process group is left out with all its
/// descendants. `lease run` passes its own group: the command and everything it starts runs in
/// the command's own group (or one it made later), while a child left in `lease`'s group was
/// started by `lease` itself for something else (a credentials helper of a store client, for
/// example) and is waited for by whoever started it.
pub(crate) fn descendants_in(procs: &[Proc], root: Pid, skip_group: Option<Pid>) -> Vec<Proc> {
    let mut children: HashMap<Pid, Vec<&Proc>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    let mut todo: Vec<Pid> = vec![root];
    while let Some(parent) = todo.pop() {
        for p in children.get(&parent).map(Vec::as_slice).unwrap_or_default() {
            if parent == root && Some(p.pgrp) == skip_group {
                continue;
            }
            if seen.insert(p.pid) {
                found.push(**p);
                todo.push(p.pid);
            }
        }
    }
    found
}

/// Which descendants of this process count as the command's tree.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scope {
    /// All of them (the shim: it starts nothing but the command).
    All,
    /// All but the children left in this process's own group (`lease run`, see
    /// [`descendants_in`]).
    OutsideMyGroup,
}

/// The descendants of this process now (see [`descendants_in`]).
pub(crate) fn descendants(scope: Scope) -> Vec<Proc> {
    let skip = match scope {
        Scope::All => None,
        Scope::OutsideMyGroup => Some(getpgrp()),
    };
    descendants_in(&snapshot(), getpid(), skip)
}

/// Whether any descendant of this process still runs (exited ones do not count).
pub(crate) fn any_running(scope: Scope) -> bool {
    descendants(scope).iter().any(|p| !p.exited())
}

/// Sends `signal` once to every running descendant of this process: to the process group
/// `group` as a whole, and to each descendant outside it; how many processes outside the group
/// were signalled.
pub(crate) fn signal_all(scope: Scope, group: Option<Pid>, signal: Signal) -> usize {
    if let Some(g) = group {
        let _ = nix::sys::signal::killpg(g, signal);
    }
    let mut sent = 0;
    for p in descendants(scope) {
        if !p.exited() && Some(p.pgrp) != group && kill(p.pid, signal).is_ok() {
            sent += 1;
        }
    }
    sent
}

/// Reaps the exited children of this process that are part of the command's tree, except `keep`
/// (a child someone else waits for). A subreaper inherits orphans; without this they would stay
/// zombies.
pub(crate) fn reap_orphans(scope: Scope, keep: Option<Pid>) {
    let me = getpid();
    for p in descendants(scope) {
        if p.ppid == me && p.exited() && Some(p.pid) != keep {
            reap(p.pid);
        }
    }
}

/// Reaps `pid` if it has exited; its status then.
pub(crate) fn reap(pid: Pid) -> Option<WaitStatus> {
    match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD | Errno::EINTR) => None,
        Ok(status) => Some(status),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, pgrp: i32, state: char) -> Proc {
        Proc {
            pid: Pid::from_raw(pid),
            ppid: Pid::from_raw(ppid),
            pgrp: Pid::from_raw(pgrp),
            state,
        }
    }

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let line = "4242 (we (ird) name) S 17 4242 17 0 -1 4194560 0 0";
        assert_eq!(parse_stat(line), Some(p(4242, 17, 4242, 'S')));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) Z"), None);
    }

    #[test]
    fn descendants_follow_ancestry_and_skip_children_left_in_the_roots_group() {
        // 10 is the root (group 10). 11: the command (group 11); 12: its child; 13: a setsid'd
        // orphan re-parented to the root (group 13); 14: a helper in the root's group, with its
        // own child 15; 16: unrelated.
        let procs = [
            p(10, 1, 10, 'S'),
            p(11, 10, 11, 'S'),
            p(12, 11, 11, 'Z'),
            p(13, 10, 13, 'R'),
            p(14, 10, 10, 'S'),
            p(15, 14, 10, 'S'),
            p(16, 1, 16, 'S'),
        ];
        let mut found: Vec<i32> =
            descendants_in(&procs, Pid::from_raw(10), Some(Pid::from_raw(10)))
                .iter()
                .map(|p| p.pid.as_raw())
                .collect();
        found.sort_unstable();
        assert_eq!(found, vec![11, 12, 13]);
    }
}
