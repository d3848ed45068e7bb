//! `lease completions SHELL` and `lease man`: shell completions and manual pages generated from
//! the same clap definitions as the parser, so they cannot drift from the real options.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::{Cli, exit};

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to write completions for.
    #[arg(value_enum, value_name = "SHELL")]
    shell: Shell,
}

#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// Write lease.1 and one page per subcommand (lease-run.1, ...) into DIR instead of printing
    /// lease(1) to stdout.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Writes the completion script for `args.shell` to stdout.
pub(crate) fn completions(args: CompletionsArgs) -> ExitCode {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "lease", &mut out);
    write_stdout(&out)
}

/// Prints lease(1) to stdout, or writes every page into `args.dir`.
pub(crate) fn man(args: ManArgs) -> ExitCode {
    let pages = match pages() {
        Ok(pages) => pages,
        Err(e) => {
            eprintln!("lease: cannot render the manual pages: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    match args.dir {
        Some(dir) => match write_pages(&dir, &pages) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lease: cannot write manual pages to {}: {e}", dir.display());
                ExitCode::from(exit::IOERR)
            }
        },
        // The first page is lease(1) itself.
        None => write_stdout(&pages[0].1),
    }
}

/// Every manual page as (file name, roff): lease.1 first, then lease-run.1 and the other
/// subcommands (recursively, hidden ones left out).
fn pages() -> std::io::Result<Vec<(String, Vec<u8>)>> {
    // No `help` subcommand: it would be listed as lease-help(1), a page that does not exist.
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    render(cmd, &mut pages)?;
    Ok(pages)
}

fn render(cmd: clap::Command, pages: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone());
    let mut roff = Vec::new();
    man.render(&mut roff)?;
    // clap_mangen titles the text of `after_help` "EXTRA"; in a manual page that is NOTES.
    let roff = String::from_utf8_lossy(&roff).replace("\n.SH EXTRA\n", "\n.SH NOTES\n");
    pages.push((man.get_filename(), roff.into_bytes()));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        render(sub.clone(), pages)?;
    }
    Ok(())
}

fn write_pages(dir: &Path, pages: &[(String, Vec<u8>)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, roff) in pages {
        std::fs::write(dir.join(name), roff)?;
    }
    Ok(())
}

fn write_stdout(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`lease man | head`) is not worth a complaint.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lease: cannot write to stdout: {e}");
            ExitCode::from(exit::IOERR)
        }
    }
}
