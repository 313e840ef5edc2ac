//! `lookback agent --config FILE [--metrics-addr ADDR] [--output-dir DIR]`: the daemon.
use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::Args;

use super::{CliError, CliResult};
use crate::daemon::{self, AgentOptions, DEFAULT_METRICS_ADDR};

/// Options of `lookback agent`.
#[derive(Debug, Args)]
#[command(
    after_help = "Snapshots go to DIR/RULE/<UTC time>-<pid>-<tid>.fxt.gz with a .json of \
metadata beside each (and the raw .lbsnap when the rule keeps it).\n\
SIGHUP, or a change of FILE, reloads the rules: a valid new file replaces the rules by \
difference (unchanged rules keep their probes and state); an invalid one is reported with \
its line:column and the old rules keep running. SIGTERM/SIGINT detach everything and exit 0.\n\
Examples:\n  lookback agent --config configs/slow-handler.yaml --output-dir /tmp/lookback\n  \
lookback agent --config /etc/lookback/rules.yaml --metrics-addr 0.0.0.0:9464\n  \
curl -s localhost:9464/metrics | grep lookback_"
)]
pub struct AgentArgs {
    /// Rules file (YAML, `version: 1`; see `lookback rules validate`).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_METRICS_ADDR)]
    pub metrics_addr: String,
    /// Output directory for every rule (overrides the rules' `output.dir`; default
    /// /var/lib/lookback).
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// The proc filesystem that lists the processes to match (in a container: the host's,
    /// with hostPID).
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Snapshots decoded at once.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub workers: usize,
    /// Snapshots frozen and waiting to be written at most; a trigger beyond is suppressed
    /// (`lookback_triggers_suppressed_total{reason="busy"}`).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_queued: usize,
    /// Measure eBPF program run time (`lookback_bpf_program_*`; ~20 ns per program run).
    #[arg(long)]
    pub bpf_stats: bool,
    /// Processes the kernel's target set holds at most (selected by the rules at once;
    /// threads do not count). Beyond it, new processes are not selected at exec or fork
    /// in the kernel: counted in `lookback_errors_total{op="target_set",errno="E2BIG"}`
    /// and logged. Each entry takes ~100 bytes of kernel memory.
    #[arg(long, value_name = "N", default_value_t = lookback_common::process::DEFAULT_MAX_TARGETS,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub max_targets: u32,
    /// Files of traced processes held open at most (one fd each, shared by every process
    /// that maps the file), so that a process that crashes or exits, or whose container
    /// is removed, still has its frames unwound and named; beyond, a file is read by its
    /// path at decode time (`lookback_held_files_refused_total`). Capped at a quarter of
    /// the open-file limit.
    #[arg(long, value_name = "N", default_value_t = crate::capture::held_files::DEFAULT_LIMIT)]
    pub max_held_files: usize,
    /// TLS and basic auth for the HTTP endpoint: a file in the Prometheus exporter
    /// toolkit's format (`tls_server_config`, `basic_auth_users` with bcrypt hashes,
    /// `http_server_config.headers`); off by default. `/healthz` and `/readyz` need no
    /// credentials; with TLS they are served over TLS too.
    #[arg(long, value_name = "FILE")]
    pub web_config: Option<PathBuf>,
    /// Seconds SIGTERM waits for snapshots still being written.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub shutdown_timeout: u64,
}

pub fn run(args: AgentArgs) -> CliResult {
    let opts = AgentOptions {
        metrics_addr: args.metrics_addr,
        output_dir: args.output_dir,
        proc_root: args.proc_root,
        workers: args.workers,
        max_queued: args.max_queued,
        bpf_stats: args.bpf_stats,
        max_targets: args.max_targets,
        max_held_files: args.max_held_files,
        web_config: args.web_config,
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
        ..AgentOptions::new(args.config)
    };
    match daemon::run(opts) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.is_usage() => Err(CliError::usage(e)),
        Err(e) => Err(CliError::runtime(e)),
    }
}
