//! `lookback report FILE [--json]`: what a snapshot or a trace lookback wrote says happened
//! around its trigger.
//!
//! In: an `.lbsnap` (decoded again, the trace not written) or a trace (`.fxt`, `.json`,
//! gzipped or not, read back). Out: the trigger, the interval it is about (the slow call
//! from its kernel-timed entry to its return; the `--window` before a signal or entry
//! trigger), the triggering thread's time in it on and off the CPU by stack, a call tree
//! (`--depth`) and the verdict; `--json` prints the same as one object.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, anyhow};
use clap::Args;

use super::{CliError, CliResult};
use crate::report::{self, Options, Report, State, human_ns, percent};
use crate::rules::parse_duration;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  lookback report /var/lib/lookback/slow/2026-12-07T10-00-00Z-1234.fxt.gz\n  \
lookback report trace.lbsnap --json | jq .verdict\n  \
lookback report crash.fxt --window 50ms --depth 10"
)]
pub struct ReportArgs {
    /// A snapshot (`.lbsnap`) or a trace lookback wrote (`.fxt`, `.fxt.gz`, `.json`,
    /// `.json.gz`).
    pub file: PathBuf,
    /// One JSON object: trigger, `interval_ns`, breakdown, verdict (and the tree).
    #[arg(long)]
    pub json: bool,
    /// The interval before a trigger without a duration (signal, entry) to explain.
    #[arg(long, value_name = "DURATION", default_value = "10ms")]
    pub window: String,
    /// How many calls below the interval's root the tree shows.
    #[arg(long, default_value_t = report::DEFAULT_DEPTH)]
    pub depth: usize,
    /// Breakdown entries shown (all with --json).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

/// Prints the report of `args.file`.
///
/// # Errors
/// A file that cannot be read or is not a snapshot or trace of lookback's (exit 1), a
/// bad `--window` (exit 2), a trace without a trigger (exit 1).
pub fn run(args: &ReportArgs) -> CliResult {
    let window = parse_duration(&args.window)
        .map_err(|e| CliError::usage(anyhow!("--window {}: {e}", args.window)))?;
    let options = Options {
        window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
        depth: args.depth,
    };
    let report = load(&args.file, options).map_err(CliError::runtime)?;
    let mut out = if args.json {
        serde_json::to_string_pretty(&report).context("serializing the report")?
    } else {
        text(&report, args.top)
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    // A reader that stopped early (`| head`) is not an error.
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(CliError::runtime(anyhow!("writing the report: {e}")))
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// The report of the snapshot or trace at `path` (a snapshot told by its magic bytes).
fn load(path: &Path, options: Options) -> anyhow::Result<Report> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.starts_with(&crate::snapshot::MAGIC) {
        drop(bytes);
        let snap =
            crate::snapshot::read(path).with_context(|| format!("reading {}", path.display()))?;
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        return crate::writer::report_of(&snap, threads, options)
            .with_context(|| format!("decoding {}", path.display()))?
            .ok_or_else(|| {
                anyhow!(
                    "{}: the snapshot has no trigger on a thread",
                    path.display()
                )
            });
    }
    let (trigger, collector) = report::read::read_trace(&bytes, options.window_ns)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(collector.report(&trigger, options.depth))
}

/// The report for a person: trigger, interval, verdict, breakdown (`top` entries), tree.
fn text(r: &Report, top: usize) -> String {
    let t = &r.trigger;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "trigger    {} ({}: {}) in {}[{}] [{}]",
        t.rule,
        t.kind,
        t.detail,
        if t.comm.is_empty() {
            String::new()
        } else {
            format!("{} ", t.comm)
        },
        t.pid,
        t.tid
    );
    let what = if t.is_latency() {
        "the call, kernel-timed entry to return"
    } else {
        "the window before the trigger"
    };
    let _ = writeln!(
        out,
        "interval   {} ({what}); the samples cover {} %",
        human_ns(r.interval_ns),
        percent(r.covered_ns, r.interval_ns)
    );
    let _ = writeln!(
        out,
        "           on-CPU {} ({} %), off-CPU {} ({} %)",
        human_ns(r.on_cpu_ns),
        percent(r.on_cpu_ns, r.interval_ns),
        human_ns(r.off_cpu_ns),
        percent(r.off_cpu_ns, r.interval_ns)
    );
    let _ = writeln!(out, "verdict    {}\n", r.verdict);
    let _ = writeln!(out, "breakdown (largest first)");
    for e in r.breakdown.iter().take(top) {
        let state = match e.state {
            State::OnCpu => "on-CPU ",
            State::OffCpu => "off-CPU",
        };
        let reason = e.reason.map_or("", report::Reason::as_str);
        let _ = writeln!(
            out,
            "  {:>9} {:>3} %  {state} {reason:<9} {}",
            human_ns(e.ns),
            percent(e.ns, r.interval_ns),
            e.frames.join(" → ")
        );
    }
    if r.breakdown.len() > top {
        let _ = writeln!(out, "  … {} more (--top, --json)", r.breakdown.len() - top);
    }
    let _ = writeln!(out, "\ncall tree (time in the interval, off-CPU part)");
    for node in &r.tree {
        let _ = writeln!(
            out,
            "  {:>9} {:>3} %  {:>9} off  {}{}",
            human_ns(node.ns),
            percent(node.ns, r.interval_ns),
            human_ns(node.off_cpu_ns),
            "  ".repeat(node.depth),
            node.name
        );
    }
    out
}
