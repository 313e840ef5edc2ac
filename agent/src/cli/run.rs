//! `lookback run [OPTS] -- CMD` and `lookback attach -p PID[,PID..] [OPTS]`.
//!
//! Until the recorders exist, both run in `--dry-run` mode: the triggers are decided in the
//! kernel and each one is printed (one line, or one JSON object per line with `--json`).
use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, anyhow};
use clap::Args;

use super::{
    CliError, CliResult,
    live::{self, Session, Target},
    record::RecordOptions,
};
use crate::{
    capture::{BackendRequest, CaptureOptions, PtOptions},
    rules::{self, Trigger},
    triggers::{EngineRule, pump::Wait},
};

/// Options shared by `run` and `attach`.
#[derive(Debug, Args)]
#[command(next_help_heading = "Triggers and output")]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent command-line flags"
)]
pub struct CommonArgs {
    /// When to snapshot (repeatable): func:SYMBOL, func:SYMBOL>2ms, syscall:fsync,fdatasync>50ms,
    /// syscall:openat=ENOENT,EACCES, signal:SIGSEGV,SIGABRT. Durations: 500us, 2ms, 1.5s.
    #[arg(long = "trigger", value_name = "SPEC", value_parser = parse_trigger)]
    pub triggers: Vec<Trigger>,
    /// Rules file (YAML): the trigger and snapshot parts of each rule apply to the
    /// process(es) given here; `target` is ignored.
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,
    /// Print each trigger instead of recording.
    #[arg(long)]
    pub dry_run: bool,
    /// Recorder: intel-pt (Intel PT through perf AUX buffers), sampling (cpu-clock or
    /// cycles with callchains; works everywhere), auto (intel-pt when `lookback check` says
    /// it works).
    #[arg(long, value_name = "BACKEND", default_value = "auto", value_parser = ["auto", "intel-pt", "sampling"])]
    pub backend: String,
    /// Ring size per CPU (PT AUX area or sample ring); rounded up to a power of two.
    #[arg(long, value_name = "SIZE", default_value = "4MiB", value_parser = parse_size)]
    pub buffer_size: u64,
    /// Samples per second per thread (sampling backend).
    #[arg(long, value_name = "HZ", default_value_t = 10_000)]
    pub sample_frequency: u64,
    /// Record kernel code too (PT kernel trace, kernel callchains).
    #[arg(long)]
    pub include_kernel: bool,
    /// Intel PT only: trace only the code of this binary (an executable or shared
    /// library; repeat for several). Each takes one of the CPU's address filter ranges
    /// (`lookback check`: `nr_addr_filters`, usually 2 to 4), and the trace is smaller and
    /// reaches further back in the same buffer. Example: --trace-binary /usr/bin/myserver
    /// --trace-binary /usr/lib/x86_64-linux-gnu/libssl.so.3. Ignored by the sampling
    /// backend.
    #[arg(long = "trace-binary", value_name = "PATH")]
    pub trace_binaries: Vec<PathBuf>,
    /// Keep recording this long after a trigger before freezing.
    #[arg(long, value_name = "DURATION", default_value = "0ms", value_parser = parse_duration)]
    pub post_trigger: Duration,
    /// Trace file: FXT (`.fxt`, `.fxt.gz`) or Chrome JSON (`.json`, `.json.gz`), gzipped
    /// when the name ends in `.gz`; later snapshots go to `trace-2.fxt.gz`, ... Raw
    /// snapshots (`--keep-raw`) take its stem (`trace.lbsnap`, `trace-2.lbsnap`, ...).
    /// `-o x.lbsnap` writes raw snapshots only.
    #[arg(short, long, value_name = "PATH", default_value = "trace.fxt.gz")]
    pub output: PathBuf,
    /// Also keep the raw `.lbsnap` snapshot (`lookback decode` turns it into a trace).
    #[arg(long)]
    pub keep_raw: bool,
    /// With --dry-run: one JSON object per trigger on stdout, then a summary object.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many triggers (0 = no limit).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub max_snapshots: u64,
    /// Minimum time between two triggers of one rule, enforced in the kernel.
    #[arg(long, value_name = "DURATION", default_value = "0ms", value_parser = parse_duration)]
    pub cooldown: Duration,
    /// At most this many triggers per rule and rolling hour, enforced in the kernel (0 = no
    /// limit).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_per_hour: u32,
    /// Do not follow children forked by the target.
    #[arg(long)]
    pub no_follow_forks: bool,
    /// Keep one CPU spinning on the trigger ring instead of sleeping until a trigger
    /// arrives: the recorder freezes a few µs after the kernel's decision instead of after
    /// a scheduler wakeup (60 µs typical, and milliseconds at the tail, on a busy VM), so
    /// less of the moment is overwritten. Costs a whole CPU while tracing; for short,
    /// targeted recordings.
    #[arg(long)]
    pub freeze_spin: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The command to start, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Process ids, comma-separated (all their threads are traced).
    #[arg(short, long, value_delimiter = ',', required = true)]
    pub pid: Vec<u32>,
}

fn parse_trigger(spec: &str) -> Result<Trigger, String> {
    rules::parse_trigger_spec(spec).map_err(|e| e.to_string())
}

fn parse_size(s: &str) -> Result<u64, String> {
    rules::parse_size(s).map_err(|e| e.to_string())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    rules::parse_duration(s).map_err(|e| e.to_string())
}

/// The rules the `--rules` file and the `--trigger` options describe, with ids in order.
fn engine_rules(common: &CommonArgs) -> Result<Vec<EngineRule>, CliError> {
    let from_file = match &common.rules {
        Some(path) => {
            rules::RuleSet::from_file(path)
                .map_err(CliError::usage)?
                .rules
        }
        None => Vec::new(),
    };
    if common.triggers.is_empty() && from_file.is_empty() && common.dry_run {
        return Err(CliError::usage(anyhow!(
            "no trigger given: add --trigger SPEC (e.g. --trigger 'func:handle_request>2ms') \
             or --rules FILE"
        )));
    }
    let max = lookback_common::MAX_RULES as usize;
    if common.triggers.len() + from_file.len() > max {
        return Err(CliError::usage(anyhow!(
            "at most {max} rules and triggers together"
        )));
    }
    let follow_forks = !common.no_follow_forks;
    let file_rules = from_file.into_iter().map(|rule| EngineRule {
        id: 0,
        name: rule.name,
        trigger: rule.trigger,
        cooldown: rule.snapshot.cooldown,
        max_per_hour: rule.snapshot.max_per_hour,
        follow_forks,
    });
    let cli_rules = common.triggers.iter().map(|trigger| EngineRule {
        id: 0,
        name: trigger.describe(),
        trigger: trigger.clone(),
        cooldown: common.cooldown,
        max_per_hour: common.max_per_hour,
        follow_forks,
    });
    Ok(file_rules
        .chain(cli_rules)
        .zip(0u32..)
        .map(|(rule, id)| EngineRule { id, ..rule })
        .collect())
}

fn record_options(common: &CommonArgs) -> Option<RecordOptions> {
    if common.dry_run {
        return None;
    }
    let backend = match common.backend.as_str() {
        "intel-pt" => BackendRequest::IntelPt,
        "sampling" => BackendRequest::Sampling,
        _ => BackendRequest::Auto,
    };
    Some(RecordOptions {
        capture: CaptureOptions {
            backend,
            buffer_size: usize::try_from(common.buffer_size).unwrap_or(usize::MAX),
            sample_frequency: common.sample_frequency,
            include_kernel: common.include_kernel,
            pt: PtOptions {
                trace_binaries: common.trace_binaries.clone(),
                ..PtOptions::default()
            },
            ..CaptureOptions::default()
        },
        output: common.output.clone(),
        post_trigger: common.post_trigger,
        keep_raw: common.keep_raw,
    })
}

fn session(common: &CommonArgs, target: Target) -> Result<Session, CliError> {
    Ok(Session {
        rules: engine_rules(common)?,
        target,
        json: common.json,
        max_events: common.max_snapshots,
        record: record_options(common),
        wait: if common.freeze_spin {
            Wait::Spin
        } else {
            Wait::Sleep
        },
    })
}

pub fn run(args: RunArgs) -> CliResult {
    let program = resolve_program(&args.command[0]).map_err(CliError::usage)?;
    let session = session(
        &args.common,
        Target::Spawn {
            program,
            argv: args.command,
        },
    )?;
    live::run_session(session)
}

pub fn attach(args: AttachArgs) -> CliResult {
    for &pid in &args.pid {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(CliError::usage(anyhow!("process {pid} not found")));
        }
    }
    let session = session(&args.common, Target::Attach { pids: args.pid })?;
    live::run_session(session)
}

/// Finds the executable `cmd` names, like the shell does (PATH lookup without a slash).
fn resolve_program(cmd: &str) -> anyhow::Result<PathBuf> {
    let candidates: Vec<PathBuf> = if cmd.contains('/') {
        vec![PathBuf::from(cmd)]
    } else {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join(cmd))
            .collect()
    };
    let found = candidates
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| format!("{cmd}: command not found"))?;
    found
        .canonicalize()
        .with_context(|| format!("resolving {}", found.display()))
}
