//! `lookback rules validate FILE`.
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct RulesArgs {
    #[command(subcommand)]
    pub command: RulesCommand,
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Parse and check a rules file; errors as FILE:LINE:COL: message (exit 2).
    Validate {
        /// The rules file (YAML, `version: 1`).
        file: PathBuf,
    },
}

pub fn run(_args: &RulesArgs) -> CliResult {
    Err(CliError::runtime(anyhow::anyhow!(
        "rules: not implemented yet"
    )))
}
