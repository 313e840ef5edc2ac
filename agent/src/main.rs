//! `lookback`: the command-line edge. Parses arguments, installs the logger, runs one
//! subcommand and maps its outcome to the exit code contract (0 ok, 1 runtime, 2 usage).
use std::process::ExitCode;

fn main() -> ExitCode {
    lookback::cli::main()
}
