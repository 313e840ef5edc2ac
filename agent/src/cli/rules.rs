//! `lookback rules validate FILE`: parses and checks a rules file. Prints a one-line summary
//! per rule on stdout (exit 0), or the first problem as `FILE:LINE:COL: message` on stderr
//! (exit 2).
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::{CliError, CliResult, EXIT_USAGE};
use crate::rules::{FunctionTrigger, RuleSet, RulesError, Trigger};

#[derive(Debug, Args)]
pub struct RulesArgs {
    #[command(subcommand)]
    pub command: RulesCommand,
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Parse and check a rules file; errors as `FILE:LINE:COL: message` (exit 2).
    Validate {
        /// The rules file (YAML, `version: 1`).
        file: PathBuf,
    },
}

pub fn run(args: &RulesArgs) -> CliResult {
    match &args.command {
        RulesCommand::Validate { file } => validate(file),
    }
}

fn validate(file: &std::path::Path) -> CliResult {
    match RuleSet::from_file(file) {
        Ok(rules) => {
            let summary = summary(&file.display().to_string(), &rules);
            // A closed stdout (`| head`) is not a failure of the rules file.
            let _ = io::stdout().lock().write_all(summary.as_bytes());
            Ok(ExitCode::SUCCESS)
        }
        Err(err @ RulesError::Invalid { .. }) => {
            // Exactly `FILE:LINE:COL: message`, as editors and CI annotators parse it.
            let _ = writeln!(io::stderr().lock(), "{err}");
            Ok(ExitCode::from(EXIT_USAGE))
        }
        Err(err @ RulesError::Read { .. }) => Err(CliError::usage(err)),
    }
}

/// `FILE: N rules OK`, then `  NAME  TRIGGER  TARGET` per rule.
fn summary(file: &str, rules: &RuleSet) -> String {
    let count = rules.rules.len();
    let mut out = format!(
        "{file}: {count} rule{} OK\n",
        if count == 1 { "" } else { "s" }
    );
    let name_width = rules
        .rules
        .iter()
        .map(|rule| rule.name.len())
        .max()
        .unwrap_or(0);
    for rule in &rules.rules {
        let binary = match &rule.trigger {
            Trigger::Function(FunctionTrigger {
                binary: Some(binary),
                ..
            }) => format!(" in {}", binary.display()),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  {:name_width$}  {}{binary}  on {}",
            rule.name,
            rule.trigger.describe(),
            rule.target
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_lists_each_rule() {
        let text = "version: 1\nrules:\n  - name: slow\n    target: {comm: server}\n    \
                    trigger: {function: {symbol: handle, binary: /srv/server, min_duration: 2ms}}\n  \
                    - name: crash-all\n    target: {pid: 7}\n    trigger: {signal: {signals: SEGV}}\n";
        let rules = RuleSet::from_str(text, "r.yaml").expect("valid rules");
        assert_eq!(
            summary("r.yaml", &rules),
            "r.yaml: 2 rules OK\n  slow       func:handle>2ms in /srv/server  on comm=server\n  \
             crash-all  signal:SIGSEGV  on pid=7\n"
        );
    }
}
