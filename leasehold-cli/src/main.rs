//! The `lease` command: run a command under a lease, show who holds keys, join elections.
//!
//! See `docs/cli.md` for the manual; `lease --help` for the summary.

/// `println!` without the panic: a line to stdout through [`print_line`], a write error ignored
/// (`lease elect` and `lease shards` keep running when nobody reads their output any more).
macro_rules! print_out {
    ($($arg:tt)*) => {{
        let _ = $crate::print_line(format_args!($($arg)*));
    }};
}

mod duration;
mod elect;
mod events;
mod exit;
mod generate;
mod hold;
mod limit;
mod run;
mod shards;
mod shim;
mod status;
mod store;
mod tree;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

const AFTER_HELP: &str = "\
Store: --store URL, else $LEASE_STORE, else the embedded SQLite file
$XDG_STATE_HOME/lease/leases.db (~/.local/state/lease/leases.db). URLs: memory:, sqlite://PATH,
postgres://USER@HOST:PORT/DB, mysql://USER@HOST:PORT/DB, redis://HOST:PORT,
etcd://HOST:PORT,HOST:PORT, k8s://NAMESPACE.

Durations: 500ms, 30s, 2m, 1h, 1m30s, 1.5s. --ttl: 1ms to 24h; --wait: 0 to 168h; --grace: 0 to
half the loss lead (a tenth of --ttl). Out of range: status 64.

Redis (redis://) replicates asynchronously: after a failover, or in a split brain, two runners can
hold a key at once, and a fence kept in the same Redis (its high-water mark) can accept a lower
token after a higher one. Fence your writes with LEASE_FENCING_TOKEN in a resource that does not
fail over with that Redis. `lease run` and `lease elect` warn about this on stderr unless
--accept-redis-failover (or LEASE_ACCEPT_REDIS_FAILOVER=1) is given.

Exit statuses of `lease run`: the command's own status; 128+N if it was killed by signal N;
75 not acquired in time (or the status given with -E); 76 lease lost (the command was stopped); 126 command not executable;
127 command not found. All commands: 64 usage error (bad arguments, a duration unparsable or out
of its range, a --grace that does not fit), 69 store unavailable or timed out, 70 unexpected
store error, 74 output not writable (completions, man), 78 bad configuration (URL, key, a TTL the
store cannot grant, disabled backend).";

/// Distributed leases with fencing tokens, from the shell.
#[derive(Debug, Parser)]
#[command(name = "lease", version, about, after_help = AFTER_HELP)]
struct Cli {
    /// The format of the library's logs on stderr (enabled with LEASE_LOG or RUST_LOG): `text`,
    /// or `json` (one object per line with `ts`, `level`, `target`, `message` and fields).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "LEASE_LOG_FORMAT"
    )]
    log_format: events::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding a lease on KEY (renewed in the background).
    ///
    /// The command gets LEASE_KEY, LEASE_OWNER and LEASE_FENCING_TOKEN in its environment and
    /// runs in its own process group; everything it starts counts as part of it, even processes
    /// that call setsid. SIGINT, SIGTERM and SIGHUP are forwarded to it. If the lease is lost,
    /// every such process gets SIGTERM, then SIGKILL after --grace, and `lease` exits with status
    /// 76. SIGKILL always comes before the lease's local deadline: --grace may be at most half the
    /// loss lead (a tenth of --ttl), and is shortened further when the loss is noticed late.
    /// When the command has ended and nothing it started still runs, the lease is released and
    /// the command's status is passed through (76 if the lease was found lost). Ctrl-Z stops the
    /// command too; it continues only under a valid lease. If `lease` is killed, the command and
    /// its descendants are killed. Linux only.
    Run(RunArgs),
    /// Acquire KEY, print its fencing token, and hold it until SIGINT, SIGTERM, SIGHUP or SIGQUIT.
    ///
    /// The lease is renewed in the background and released on the signal (status 0). For
    /// scripts that fence their own writes with the printed token, as `etcdctl lock` does: the
    /// token line (or JSON event) comes only once the lease is held. If the lease is lost,
    /// `lease` says so on stderr (a `lost` event with --json) and exits with status 76.
    Hold(HoldArgs),
    /// Show the holder, fencing token and time left of each KEY.
    Status(StatusArgs),
    /// Join an election under a name and print leadership changes as they happen.
    ///
    /// The term printed with `elected` is the lease's fencing token. Runs until interrupted
    /// (SIGINT or SIGTERM), then resigns (releasing the lease if leading). With `-- CMD`, runs
    /// CMD while leading (with LEASE_FENCING_TOKEN set to the term), stops it (SIGTERM, then
    /// SIGKILL after --grace) when the term ends, and runs it again at the next term; when CMD
    /// exits on its own, `lease` resigns and exits with CMD's status. With --observe, only
    /// prints who leads, without joining.
    Elect(ElectArgs),
    /// Print a completion script for SHELL (bash, zsh, fish, elvish, powershell) to stdout.
    ///
    /// For example: `lease completions bash > ~/.local/share/bash-completion/completions/lease`,
    /// `lease completions zsh > ~/.zfunc/_lease`, `lease completions fish >
    /// ~/.config/fish/completions/lease.fish`.
    Completions(generate::CompletionsArgs),
    /// Print the manual page lease(1) (roff) to stdout, or write one page per command into --dir.
    ///
    /// For example: `lease man | man -l -`, or `lease man --dir /usr/local/share/man/man1`.
    Man(generate::ManArgs),
    /// Join a shard set as one worker and print assignment events (one line each; `--json` for
    /// scripts) until SIGINT/SIGTERM, then leave gracefully (drain and release every shard).
    Shards(ShardsArgs),
}

/// Where the leases live.
#[derive(Debug, Args)]
struct StoreArg {
    /// Store URL (default: the embedded SQLite file). The environment variable's value is not
    /// shown here: a URL may hold a password.
    #[arg(long, value_name = "URL", env = "LEASE_STORE", hide_env_values = true)]
    store: Option<String>,
}

/// How long to wait for a held key, and the status when it stays held (flock's -w, -n, -E).
#[derive(Debug, Args)]
struct WaitArgs {
    /// How long to wait for a held key before giving up with status 75 (0 to 168h).
    #[arg(long, short = 'w', default_value = "2m", value_parser = duration::wait, conflicts_with = "no_wait")]
    wait: Duration,
    /// Try once; exit with status 75 at once if the key is held.
    #[arg(long, short = 'n')]
    no_wait: bool,
    /// The exit status when the key is not acquired (held by another owner past --wait, or at
    /// once with --no-wait), instead of 75.
    #[arg(long, short = 'E', value_name = "STATUS", default_value_t = exit::NOT_ACQUIRED)]
    conflict_exit_code: u8,
}

impl WaitArgs {
    /// The wait: zero with --no-wait.
    fn wait(&self) -> Duration {
        if self.no_wait {
            Duration::ZERO
        } else {
            self.wait
        }
    }
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The lease key (lowercase letters, digits, '-' and '.').
    #[arg(long, short)]
    key: String,
    #[command(flatten)]
    store: StoreArg,
    /// Lease time to live (1ms to 24h); renewed every third of it while the command runs. Loss is
    /// declared a tenth of it (the loss lead) before the lease's local deadline.
    #[arg(long, default_value = "30s", value_parser = duration::ttl)]
    ttl: Duration,
    #[command(flatten)]
    wait: WaitArgs,
    /// After a lost lease: time between SIGTERM and SIGKILL to the command. At most half the
    /// loss lead, so that the command is dead before the lease's local deadline (default: that
    /// maximum, 1.5s at --ttl 30s). A longer grace needs a longer --ttl (twenty times the grace).
    #[arg(long, value_parser = duration::grace)]
    grace: Option<Duration>,
    /// When the command exits, stop whatever it left running (SIGTERM, then SIGKILL after
    /// --grace) and release at once, instead of keeping the lease until those processes end.
    #[arg(long)]
    stop_leftovers: bool,
    #[command(flatten)]
    failover: FailoverArg,
    /// Run as one of at most N holders of KEY at a time (a fenced semaphore, like `consul lock
    /// -n`), 1 to 1024. The command holds one of N slots, KEY.lease--permit.0 to
    /// KEY.lease--permit.{N-1}: LEASE_KEY and LEASE_FENCING_TOKEN are that slot's (fence writes
    /// by the slot key: tokens increase per slot), LEASE_SLOT is its number, LEASE_LIMIT is N
    /// and LEASE_SEMAPHORE is KEY. Runs with different N share slots: at most the largest N run
    /// at once.
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(leasehold::semaphore::MAX_PERMITS))
    )]
    limit: Option<u32>,
    /// A readable label for the owner id (default: HOSTNAME.PID); a random suffix is added.
    #[arg(long)]
    label: Option<String>,
    /// Run STRING with `/bin/sh -c` instead of a CMD after `--` (as flock -c does).
    #[arg(
        short = 'c',
        long = "command",
        value_name = "STRING",
        conflicts_with = "command"
    )]
    shell_command: Option<OsString>,
    /// The command and its arguments (after `--`).
    #[arg(
        required_unless_present = "shell_command",
        trailing_var_arg = true,
        value_name = "CMD"
    )]
    command: Vec<OsString>,
}

impl RunArgs {
    /// The program and arguments to run: CMD, or `/bin/sh -c STRING`.
    fn argv(&self) -> Vec<OsString> {
        match &self.shell_command {
            Some(script) => vec!["/bin/sh".into(), "-c".into(), script.clone()],
            None => self.command.clone(),
        }
    }
}

#[derive(Debug, Args)]
struct HoldArgs {
    /// The lease key (lowercase letters, digits, '-' and '.').
    #[arg(value_name = "KEY")]
    key: String,
    #[command(flatten)]
    store: StoreArg,
    /// Lease time to live (1ms to 24h); renewed every third of it.
    #[arg(long, default_value = "30s", value_parser = duration::ttl)]
    ttl: Duration,
    #[command(flatten)]
    wait: WaitArgs,
    #[command(flatten)]
    failover: FailoverArg,
    /// A readable label for the owner id (default: HOSTNAME.PID); a random suffix is added.
    #[arg(long)]
    label: Option<String>,
    /// Print JSON event lines (`acquired`, `at_risk`, `renewed`, `lost`, `released`, each with
    /// `ts`) instead of the bare token.
    #[arg(long)]
    json: bool,
}

/// Acknowledges Redis's asynchronous failover (silences the warning).
#[derive(Debug, Args)]
struct FailoverArg {
    /// With a redis:// store: do not warn that a Redis failover (or split brain) can let two
    /// holders run at once and can make a fence kept in the same Redis accept a lower token
    /// after a higher one. Fence writes in a resource that does not fail over with that Redis.
    #[arg(
        long,
        env = "LEASE_ACCEPT_REDIS_FAILOVER",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    accept_redis_failover: bool,
}

#[derive(Debug, Args)]
struct StatusArgs {
    #[command(flatten)]
    store: StoreArg,
    /// One JSON object per key and line.
    #[arg(long)]
    json: bool,
    /// Show the N slots of each KEY run with `lease run --limit N` (KEY.lease--permit.0 to
    /// KEY.lease--permit.{N-1}, one line each) instead of KEY itself.
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(leasehold::semaphore::MAX_PERMITS))
    )]
    limit: Option<u32>,
    /// The keys to show.
    #[arg(required = true, value_name = "KEY")]
    keys: Vec<String>,
}

#[derive(Debug, Args)]
struct ElectArgs {
    /// The election's name (a lease key).
    #[arg(long)]
    name: String,
    #[command(flatten)]
    store: StoreArg,
    /// Lease time to live of the leader (1ms to 24h).
    #[arg(long, default_value = "15s", value_parser = duration::ttl)]
    ttl: Duration,
    #[command(flatten)]
    failover: FailoverArg,
    /// A readable label for this candidate's id (default: HOSTNAME.PID).
    #[arg(long)]
    label: Option<String>,
    /// Print JSON lines (each with `ts`, RFC 3339 UTC) instead of text.
    #[arg(long)]
    json: bool,
    /// Only print who leads (`leader` events), without joining the election.
    #[arg(long, conflicts_with = "command")]
    observe: bool,
    /// With a CMD: after a term ends, the time between SIGTERM and SIGKILL to CMD (default: half
    /// the loss lead, a twentieth of --ttl, as for `lease run`).
    #[arg(long, value_parser = duration::grace)]
    grace: Option<Duration>,
    /// A command to run while leading (after `--`).
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// Arguments of `lease shards`.
#[derive(Debug, Args)]
struct ShardsArgs {
    /// The shard set's name (a legal lease key).
    #[arg(long)]
    name: String,
    /// How many shards the set has (named s0, s1, ...).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    shards: u32,
    /// This worker's id (a legal key label); default `w-HOSTNAME-PID-RANDOM`.
    #[arg(long)]
    worker: Option<String>,
    #[command(flatten)]
    store: StoreArg,
    /// The TTL of every shard lease.
    #[arg(long, default_value = "15s", value_parser = duration::ttl)]
    ttl: Duration,
    #[command(flatten)]
    failover: FailoverArg,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == shim::ARG) {
        return shim::main(&argv[2..]);
    }
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_tracing(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lease: cannot start the runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::main(args).await,
            Command::Hold(args) => hold::main(args).await,
            Command::Status(args) => status::main(args).await,
            Command::Elect(args) => elect::main(args).await,
            Command::Completions(args) => generate::completions(args),
            Command::Man(args) => generate::man(args),
            Command::Shards(args) => shards::main(args).await,
        }
    });
    // Do not wait for background tasks (a release already finished or was abandoned).
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

/// Logs of the library to stderr, filtered by `LEASE_LOG` (for example `LEASE_LOG=debug`), else
/// by `RUST_LOG`; off by default. `format` chooses text lines or JSON objects.
fn init_tracing(format: events::LogFormat) {
    let set = |name: &str| std::env::var(name).ok().filter(|f| !f.trim().is_empty());
    let Some(filter) = set("LEASE_LOG").or_else(|| set("RUST_LOG")) else {
        return;
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr);
    let _ = match format {
        events::LogFormat::Text => builder.try_init(),
        events::LogFormat::Json => builder.event_format(events::JsonLines).try_init(),
    };
}

/// Prints one line to stdout. A stdout nobody reads any more (a closed pipe) or that cannot be
/// written is an error for the caller to act on, never a panic (as `println!` would).
fn print_line(line: impl std::fmt::Display) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

/// A label for owner ids: the given one, else `HOSTNAME.PID`.
fn owner_label(label: Option<&str>) -> String {
    if let Some(l) = label {
        return l.to_string();
    }
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_string());
    format!("{host}.{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lease run` and `lease elect` owners: a label plus a random UUID, so two defaults differ
    /// even with the same host name and PID (two containers).
    #[test]
    fn default_owner_ids_differ() {
        let label = owner_label(None);
        let a = leasehold::OwnerId::with_label(&label);
        let b = leasehold::OwnerId::with_label(&label);
        assert_ne!(a, b);
        assert!(a.as_str().starts_with(&label), "{a}");
    }
}
