//! The `lookback` command line: clap definitions and dispatch. Argument structs stay here
//! and are converted into domain types, so pipeline stages never see clap.
#![expect(clippy::print_stderr, reason = "the CLI edge reports errors on stderr")]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod agent;
pub mod check;
pub mod decode;
#[cfg(test)]
mod decode_pt_tests;
mod json_out;
mod live;
mod local_binaries;
mod output_path;
pub mod pt_tool;
mod record;
pub mod report;
pub mod rules;
pub mod run;
pub mod snapshots;
pub mod view;
mod write_queue;

/// Exit code for runtime errors.
pub const EXIT_RUNTIME: u8 = 1;
/// Exit code for usage and configuration errors.
pub const EXIT_USAGE: u8 = 2;

/// An error at the CLI edge, with the exit code it maps to.
#[derive(Debug)]
pub struct CliError {
    pub code: u8,
    pub error: anyhow::Error,
}

impl CliError {
    /// A usage or configuration error (exit 2).
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Self {
            code: EXIT_USAGE,
            error: error.into(),
        }
    }

    /// A runtime error (exit 1).
    pub fn runtime(error: impl Into<anyhow::Error>) -> Self {
        Self {
            code: EXIT_RUNTIME,
            error: error.into(),
        }
    }
}

impl From<anyhow::Error> for CliError {
    fn from(error: anyhow::Error) -> Self {
        Self::runtime(error)
    }
}

/// Result of a subcommand: `Ok(code)` lets a command choose a non-zero exit without an error
/// message (e.g. `check` when no backend is usable).
pub type CliResult = Result<ExitCode, CliError>;

/// lookback keeps the last milliseconds of a process's control flow and freezes them when
/// something goes wrong: a function slower than a threshold, a slow or failing syscall, a
/// fatal signal. The conditions are decided by eBPF programs in the kernel.
#[derive(Debug, Parser)]
#[command(name = "lookback", version, about, long_about = None, propagate_version = true)]
#[command(
    after_help = "Start with `lookback check` to see what this machine supports.\n\
Examples:\n  lookback run --trigger 'func:handle_request>2ms' -- ./server\n  \
lookback attach -p 1234 --trigger 'syscall:fsync>50ms'\n  \
lookback agent --config configs/slow-handler.yaml --output-dir /tmp/lookback\n  \
lookback rules validate configs/example.yaml"
)]
pub struct Cli {
    /// More log output (-v debug, -vv trace); `RUST_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Report what this machine supports (BPF, uprobes, tracefs, `intel_pt`, PMU) and which
    /// backend `auto` picks.
    Check(check::CheckArgs),
    /// Start a command under the recorder. Exits with the command's status (128 + the
    /// signal number when it was killed, as a shell does); lookback's own errors: 1
    /// (runtime), 2 (usage or rules).
    Run(run::RunArgs),
    /// Record running processes (all their threads).
    Attach(run::AttachArgs),
    /// Work with rules files.
    Rules(rules::RulesArgs),
    /// Decode a snapshot, a perf.data recording or raw Intel PT into a trace.
    Decode(decode::DecodeArgs),
    /// The daemon: rules from a YAML file for every matching process, snapshots to disk,
    /// Prometheus metrics.
    Agent(agent::AgentArgs),
    /// Find and fetch the snapshots agents uploaded to object storage.
    Snapshots(snapshots::SnapshotsArgs),
    /// What a snapshot or trace says happened: the triggering call's time on and off the
    /// CPU, by stack, and a one-line verdict.
    Report(report::ReportArgs),
    /// Open a trace in the Perfetto UI: serve it on 127.0.0.1 and print (or open) the link.
    View(view::ViewArgs),
}

/// The command line as `T`, or the exit code after clap printed help, the version (exit
/// 0, on stdout) or a usage error (exit 2).
fn parse_or_exit<T: Parser>() -> Result<T, ExitCode> {
    T::try_parse().map_err(|err| {
        let _ = err.print();
        if err.use_stderr() {
            ExitCode::from(EXIT_USAGE)
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// The exit code of `result`; an error printed with its causes as `PROGRAM: error: ...`.
fn finish(program: &str, result: CliResult) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(CliError { code, error }) => {
            eprintln!("{program}: error: {error:#}");
            ExitCode::from(code)
        }
    }
}

/// Parses the command line, runs the subcommand, prints errors with their causes.
pub fn main() -> ExitCode {
    let cli = match parse_or_exit::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    init_logger(cli.verbose, cli.quiet);
    let result = match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Run(args) => run::run(args),
        Command::Attach(args) => run::attach(&args),
        Command::Rules(args) => rules::run(&args),
        Command::Decode(args) => decode::run(&args),
        Command::Agent(args) => agent::run(args),
        Command::Snapshots(args) => snapshots::run(&args),
        Command::Report(args) => report::run(&args),
        Command::View(args) => view::run(&args),
    };
    finish("lookback", result)
}

fn init_logger(verbose: u8, quiet: bool) {
    // aya's own debug output (relocations, map creation) only at -vv.
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "info",
        (false, 1) => "debug,aya=info,aya_obj=info",
        (false, _) => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp_micros()
        .init();
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn clap_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
