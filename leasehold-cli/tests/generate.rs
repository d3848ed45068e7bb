//! `lease completions SHELL` and `lease man`: generated from the parser's own clap definitions.
//!
//! The subcommands are read from `lease --help`, so a subcommand added later is checked too. Each
//! completion script is syntax-checked by its shell (bash, zsh, fish; `scripts/test.sh` installs
//! them), and the manual page is rendered by groff with warnings as errors.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const USAGE: i32 = 64;

fn lease(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lease"))
        .args(args)
        .env_remove("LEASE_STORE")
        .env_remove("LEASE_LOG")
        .output()
        .expect("run lease")
}

fn stdout_ok(args: &[&str]) -> String {
    let out = lease(args);
    assert!(
        out.status.success(),
        "lease {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The subcommands `lease --help` lists (without clap's `help`).
fn subcommands() -> Vec<String> {
    let help = stdout_ok(&["--help"]);
    let section = help
        .split("Commands:\n")
        .nth(1)
        .expect("a Commands: section in lease --help");
    let names: Vec<String> = section
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect();
    for known in ["run", "status", "elect", "completions", "man"] {
        assert!(
            names.iter().any(|n| n == known),
            "`{known}` not parsed from lease --help: {names:?}"
        );
    }
    names
}

/// Runs `program args...` with `input` on stdin (or as the file argument) and asserts success.
fn shell_accepts(program: &str, args: &[&str], script: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("completion");
    std::fs::write(&path, script).expect("write script");
    let out = Command::new(program)
        .args(args)
        .arg(&path)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {program} ({e}); scripts/test.sh installs it (apt: {program})")
        });
    assert!(
        out.status.success(),
        "{program} {args:?} rejects the completion script: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn completions_name_every_subcommand_and_parse_in_their_shell() {
    let subs = subcommands();
    for (shell, check) in [
        ("bash", ("bash", &["-n"][..])),
        ("zsh", ("zsh", &["-n"][..])),
        ("fish", ("fish", &["--no-execute"][..])),
    ] {
        let script = stdout_ok(&["completions", shell]);
        assert!(
            script.contains("lease"),
            "{shell} completions do not name the command"
        );
        for sub in &subs {
            assert!(
                script.contains(sub.as_str()),
                "{shell} completions lack the subcommand `{sub}`"
            );
        }
        // Options of a subcommand, not only the subcommand names.
        // (fish writes long options as `-l no-wait`, so the names are without dashes.)
        for opt in ["no-wait", "accept-redis-failover", "store"] {
            assert!(script.contains(opt), "{shell} completions lack `{opt}`");
        }
        shell_accepts(check.0, check.1, &script);
    }
}

#[test]
fn completions_for_an_unknown_shell_are_a_usage_error() {
    let out = lease(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
    assert!(out.stdout.is_empty(), "nothing is printed: {out:?}");
    let out = lease(&["completions"]);
    assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
}

/// Renders roff with groff's man macros, warnings as errors; returns the text.
fn render(roff: &str) -> String {
    let mut child = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-rLL=200n"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run groff; scripts/test.sh installs it (apt: groff-base)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(roff.as_bytes())
        .expect("write to groff");
    let out = child.wait_with_output().expect("groff");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "groff: {:?}\n{stderr}",
        out.status
    );
    // Undo groff's overstriking and SGR escapes, if any, to compare plain text.
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    strip_formatting(&text)
}

fn strip_formatting(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{8}' => {
                out.pop();
            }
            '\u{1b}' => {
                for n in chars.by_ref() {
                    if n.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            c => out.push(c),
        }
    }
    out
}

#[test]
fn man_page_renders_and_names_every_subcommand() {
    let roff = stdout_ok(&["man"]);
    assert!(
        roff.starts_with(".ie") || roff.contains(".TH lease 1"),
        "{roff}"
    );
    let text = render(&roff);
    for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "SUBCOMMANDS"] {
        assert!(text.contains(section), "no {section} section:\n{text}");
    }
    assert!(
        text.contains("lease - The `lease` command: run a command under a lease"),
        "{text}"
    );
    for sub in subcommands() {
        assert!(
            text.contains(&format!("lease-{sub}(1)")),
            "the man page does not name `{sub}`:\n{text}"
        );
    }
    // The exit statuses (the same text as `lease --help`) are in the page.
    assert!(text.contains("NOTES"), "{text}");
    assert!(text.contains("76 lease lost"), "{text}");
    // Only pages that exist are named (no lease-help(1)).
    assert!(!text.contains("lease-help"), "{text}");
}

#[test]
fn man_dir_writes_one_rendering_page_per_subcommand() {
    let dir = tempfile::tempdir().expect("temp dir");
    let target = dir.path().join("man1");
    let out = lease(&["man", "--dir", target.to_str().expect("UTF-8 path")]);
    assert!(out.status.success(), "{out:?}");
    let page = |name: &str| {
        std::fs::read_to_string(target.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    assert_eq!(
        page("lease.1"),
        stdout_ok(&["man"]),
        "--dir and stdout agree"
    );
    for sub in subcommands() {
        let text = render(&page(&format!("lease-{sub}.1")));
        assert!(
            text.contains(&format!("lease-{sub}")),
            "lease-{sub}.1 does not name itself:\n{text}"
        );
    }
    let run = render(&page("lease-run.1"));
    for opt in ["--key", "--ttl", "--no-wait", "--grace"] {
        assert!(run.contains(opt), "lease-run.1 lacks {opt}:\n{run}");
    }
}

#[test]
fn man_dir_that_cannot_be_created_fails_without_panicking() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").expect("write");
    let out = lease(&["man", "--dir", file.join("sub").to_str().expect("UTF-8")]);
    assert_eq!(out.status.code(), Some(74), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot write manual pages"),
        "{out:?}"
    );
}
