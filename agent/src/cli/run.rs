//! `lookback run` and `lookback attach`.
use clap::Args;

use super::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The command to start, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Process ids, comma-separated.
    #[arg(short, long, value_delimiter = ',', required = true)]
    pub pid: Vec<u32>,
}

pub fn run(_args: RunArgs) -> CliResult {
    Err(CliError::runtime(anyhow::anyhow!(
        "run: not implemented yet"
    )))
}

pub fn attach(_args: AttachArgs) -> CliResult {
    Err(CliError::runtime(anyhow::anyhow!(
        "attach: not implemented yet"
    )))
}
