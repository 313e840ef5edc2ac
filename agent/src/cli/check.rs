//! `lookback check [--json]`.
use clap::Args;

use super::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Machine-readable output (one JSON object).
    #[arg(long)]
    pub json: bool,
}

pub fn run(_args: &CheckArgs) -> CliResult {
    Err(CliError::runtime(anyhow::anyhow!(
        "check: not implemented yet"
    )))
}
