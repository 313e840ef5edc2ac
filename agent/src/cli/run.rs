//! `lookback run [OPTS] -- CMD` and `lookback attach -p PID[,PID..] [OPTS]`.
//!
//! The triggers are decided in the kernel; each one is snapshotted, or printed with
//! `--dry-run` (one line, or one JSON object per line with `--json`).
use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, anyhow};
use clap::{
    Args,
    builder::{PossibleValuesParser, TypedValueParser as _},
};

use super::{
    CliError, CliResult,
    json_out::{JsonDest, JsonSink},
    live::{self, Session, Target},
    record::RecordOptions,
};
use crate::{
    capture::{BackendRequest, CaptureOptions, PtOptions, aux_pause, procmaps},
    daemon::targets::capture_options,
    elf::debuginfod::Servers,
    rules::{self, Backend, Detect, DetectConflict, ReturnProbe, Rule, SnapshotScope, Trigger},
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
    /// Rules file (YAML): the trigger, capture and snapshot parts of each rule apply to the
    /// process(es) given here; `target` and `output` are ignored. A run has one recorder,
    /// so the first rule's `capture` section applies (with a warning naming the rules whose
    /// capture differs), and every trigger waits the largest `post_trigger` of the rules, so
    /// no rule gets less than it asks for. Recorder flags given on the command line override
    /// the file.
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,
    /// Print each trigger instead of recording.
    #[arg(long)]
    pub dry_run: bool,
    /// Recorder: intel-pt (Intel PT through perf AUX buffers), sampling (cpu-clock or
    /// cycles with callchains; works everywhere), auto (intel-pt when `lookback check` says
    /// it works). [default: auto, or the rules file's]
    // The recorder flags are `Option`s (defaults in the help text) so that a flag given on
    // the command line can be told from one left out, which the rules file then decides.
    #[arg(long, value_name = "BACKEND", value_parser = PossibleValuesParser::new(["auto", "intel-pt", "sampling"]).try_map(|s| s.parse::<Backend>()))]
    pub backend: Option<Backend>,
    /// Ring size per CPU (PT AUX area or sample ring): a power of two, at least 4KiB, as
    /// in a rules file. [default: 4MiB, or the rules file's]
    #[arg(long, value_name = "SIZE", value_parser = rules::parse_buffer_size)]
    pub buffer_size: Option<u64>,
    /// Samples per second per thread (sampling backend), at least 1. [default: 10000, or
    /// the rules file's]
    #[arg(long, value_name = "HZ", value_parser = parse_frequency)]
    pub sample_frequency: Option<u64>,
    /// Bytes of user stack copied with each sample (sampling backend), unwound at decode
    /// time with the binaries' unwind tables (`.eh_frame`), so that code built without
    /// frame pointers has deep stacks: 0 to 60KiB, a multiple of 8; 0 records only the
    /// kernel's frame-pointer callchain. Larger copies reach deeper stacks; smaller ones
    /// keep more history in the same --buffer-size. [default: 8KiB, or the rules file's]
    #[arg(long, value_name = "SIZE", value_parser = rules::parse_stack_size)]
    pub stack_size: Option<u32>,
    /// Record kernel code too (PT kernel trace; sampling: the kernel's functions above
    /// the user frames, named from /proc/kallsyms, instead of one `[kernel]` frame); also
    /// when the rules file says `include_kernel: true`.
    #[arg(long)]
    pub include_kernel: bool,
    /// Intel PT only: trace only the code of this binary (an executable or shared
    /// library; repeat for several). Each takes one of the CPU's address filter ranges
    /// (`lookback check`: `nr_addr_filters`, usually 2 to 4), and the trace is smaller and
    /// reaches further back in the same buffer. Example: --trace-binary /usr/bin/myserver
    /// --trace-binary /usr/lib/x86_64-linux-gnu/libssl.so.3. Ignored by the sampling
    /// backend. Replaces the rules file's `trace_binaries`.
    #[arg(long = "trace-binary", value_name = "PATH")]
    pub trace_binaries: Vec<PathBuf>,
    /// Keep recording this long after a trigger before freezing. [default: 0ms, or the
    /// largest `post_trigger` of the rules file]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub post_trigger: Option<Duration>,
    /// Trace file: FXT (`.fxt`, `.fxt.gz`) or Chrome JSON (`.json`, `.json.gz`), gzipped
    /// when the name ends in `.gz`; later snapshots go to `trace-2.fxt.gz`, ... Raw
    /// snapshots (`--keep-raw`) take its stem (`trace.lbsnap`, `trace-2.lbsnap`, ...).
    /// `-o x.lbsnap` writes raw snapshots only.
    #[arg(short, long, value_name = "PATH", default_value = "trace.fxt.gz")]
    pub output: PathBuf,
    /// Create the directory of `-o` when it does not exist (without it, a missing
    /// directory is an error before anything is traced).
    #[arg(long)]
    pub mkdir: bool,
    /// Also keep the raw `.lbsnap` snapshot (`lookback decode` turns it into a trace).
    #[arg(long)]
    pub keep_raw: bool,
    /// Machine-readable lines: one JSON object per trigger (--dry-run) or written
    /// snapshot, then a summary object, to FILE or to stdout with `-` (the default when no
    /// FILE is given). With stdout, `run` sends the command's own stdout to stderr, so the
    /// lines are never mixed with the program's output; `--json /dev/fd/3` writes to an
    /// inherited descriptor instead and leaves the program's stdout alone.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<JsonDest>,
    /// Stop after this many triggers (0 = no limit). [default: 1; with --dry-run: no
    /// limit, so that a dry run shows how often the rules would fire]
    #[arg(long, value_name = "N")]
    pub max_snapshots: Option<u64>,
    /// Minimum time between two triggers of one rule, enforced in the kernel.
    #[arg(long, value_name = "DURATION", default_value = "0ms", value_parser = parse_duration)]
    pub cooldown: Duration,
    /// At most this many triggers per rule and rolling hour, enforced in the kernel (0 = no
    /// limit).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_per_hour: u32,
    /// Do not follow children forked by the target (`run` then also ends when the command
    /// exits, without waiting for the processes it left running).
    #[arg(long)]
    pub no_follow_forks: bool,
    /// Stop tracing after this long (the snapshot taken, the probes removed); `run` then
    /// waits for the command to exit as it would without lookback. Without it, tracing
    /// ends when the targets exit, at the snapshot limit, or at Ctrl-C.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Keep one CPU spinning on the trigger ring instead of sleeping until a trigger
    /// arrives: the recorder freezes a few µs after the kernel's decision instead of after
    /// a scheduler wakeup (60 µs typical, and milliseconds at the tail, on a busy VM), so
    /// less of the moment is overwritten. Costs a whole CPU while tracing; for short,
    /// targeted recordings.
    #[arg(long)]
    pub freeze_spin: bool,
    /// How latency function triggers (func:SYMBOL>DURATION) see the return: `exits` puts a
    /// uprobe on each instruction that leaves the function and never touches the stack;
    /// `uretprobe` replaces the return address on the stack, which aborts C++ programs
    /// whose exceptions and Rust programs whose panics unwind through the function, and is
    /// refused for Go. Replaces the rules file's `return_probe`. [default: exits, or the
    /// rules file's]
    #[arg(long, value_name = "HOW", value_parser = PossibleValuesParser::new(["exits", "uretprobe"]).try_map(|s| s.parse::<ReturnProbe>()))]
    pub return_probe: Option<ReturnProbe>,
    /// When latency triggers of --trigger (func:SYMBOL>DURATION, syscall:NAMES>DURATION)
    /// judge a call: `returned` measures it at its return; `running` judges it slow once it
    /// has run longer than DURATION while still in progress, so calls that never return
    /// fire too (functions then get only the entry probe). Every func: and syscall:
    /// --trigger must then have a DURATION, and no ERRNO. A rules file says `detect:` per
    /// rule.
    #[arg(long, value_name = "WHEN", default_value = "returned", value_parser = PossibleValuesParser::new(["returned", "running"]).try_map(|s| s.parse::<Detect>()))]
    pub detect: Detect,
    /// Function triggers probe every function their name selects (C++ overloads, template
    /// and generic instances) instead of refusing an ambiguous name; as `all: true` in a
    /// rules file. Glob patterns (`func:handle_*`) always do, up to 64 functions.
    #[arg(long)]
    pub all_functions: bool,
    /// Also look for separate debug files (build-id `.build-id/xx/yyyy.debug` and
    /// `.gnu_debuglink` names) in DIR, before the target's /usr/lib/debug; repeatable.
    #[arg(long, value_name = "DIR")]
    pub debug_dir: Vec<PathBuf>,
    /// Never ask debuginfod servers (`DEBUGINFOD_URLS`) for the debug files of stripped
    /// binaries, neither to place probes nor to name frames.
    #[arg(long)]
    pub no_debuginfod: bool,
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
    /// Process ids, comma-separated (all their threads, and the processes they have
    /// forked, are traced).
    #[arg(short, long, value_delimiter = ',', required = true)]
    pub pid: Vec<u32>,
    /// Trace only the given processes, not their existing descendants (an nginx master
    /// without its workers). Children forked after the attach are followed unless
    /// --no-follow-forks.
    #[arg(long)]
    pub no_children: bool,
}

fn parse_trigger(spec: &str) -> Result<Trigger, String> {
    rules::parse_trigger_spec(spec).map_err(|e| e.to_string())
}

/// `--sample-frequency`: a positive integer, as `sample_frequency:`.
fn parse_frequency(s: &str) -> Result<u64, String> {
    rules::parse_positive(s).map(u64::from)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    rules::parse_duration(s).map_err(|e| e.to_string())
}

/// The rules of the `--rules` file, in file order (none without the option).
fn file_rules(common: &CommonArgs) -> Result<Vec<Rule>, CliError> {
    match &common.rules {
        Some(path) => Ok(rules::RuleSet::from_file(path)
            .map_err(CliError::usage)?
            .rules),
        None => Ok(Vec::new()),
    }
}

/// The rules `file_rules` and the `--trigger` options describe, with ids in order.
fn engine_rules(common: &CommonArgs, file_rules: &[Rule]) -> Result<Vec<EngineRule>, CliError> {
    if common.triggers.is_empty() && file_rules.is_empty() && common.dry_run {
        return Err(CliError::usage(anyhow!(
            "no trigger given: add --trigger SPEC (e.g. --trigger 'func:handle_request>2ms') \
             or --rules FILE"
        )));
    }
    let max = lookback_common::MAX_RULES as usize;
    if common.triggers.len() + file_rules.len() > max {
        return Err(CliError::usage(anyhow!(
            "at most {max} rules and triggers together"
        )));
    }
    let follow_forks = !common.no_follow_forks;
    let from_file = file_rules.iter().map(|rule| EngineRule {
        id: 0,
        name: rule.name.clone(),
        trigger: rule.trigger.clone(),
        cooldown: rule.snapshot.cooldown,
        max_per_hour: rule.snapshot.max_per_hour,
        follow_forks,
        per_process: rule.snapshot.scope == SnapshotScope::Process,
    });
    let cli_rules = common.triggers.iter().map(|trigger| EngineRule {
        id: 0,
        name: trigger.describe(),
        trigger: trigger.clone().with_detect(common.detect),
        cooldown: common.cooldown,
        max_per_hour: common.max_per_hour,
        follow_forks,
        per_process: true,
    });
    let rules: Vec<EngineRule> = from_file
        .chain(cli_rules)
        .zip(0u32..)
        .map(|(rule, id)| EngineRule {
            id,
            trigger: with_function_flags(rule.trigger, common),
            ..rule
        })
        .collect();
    for rule in &rules {
        if let Some(conflict) = rule.trigger.detect_conflict() {
            return Err(CliError::usage(anyhow!(detect_error(&rule.name, conflict))));
        }
    }
    Ok(rules)
}

/// Why rule `name` (a `--trigger` spec, or a rules file's rule that `--return-probe`
/// changed) cannot detect calls while they run, in the command line's words.
fn detect_error(name: &str, conflict: DetectConflict) -> String {
    match conflict {
        DetectConflict::NoDuration => format!(
            "--detect running: trigger `{name}` has no DURATION; running judges a call slow \
             once it has run that long (e.g. func:SYMBOL>5s, syscall:read>1s)"
        ),
        DetectConflict::Errno => format!(
            "--detect running: trigger `{name}` tests an errno, which is known only at the \
             return"
        ),
        DetectConflict::Uretprobe => format!(
            "`{name}`: detect running places no return probe; --return-probe uretprobe \
             cannot go with it"
        ),
    }
}

/// `trigger` with the function flags given (`--return-probe`, `--all-functions`,
/// `--debug-dir`), when it is a function trigger.
fn with_function_flags(trigger: Trigger, common: &CommonArgs) -> Trigger {
    match trigger {
        Trigger::Function(mut f) => {
            if let Some(choice) = common.return_probe {
                f.return_probe = choice;
            }
            f.all |= common.all_functions;
            f.debug_dirs.extend(common.debug_dir.iter().cloned());
            Trigger::Function(f)
        }
        trigger => trigger,
    }
}

/// The recorder of a run: the first file rule's capture section (one recorder per run, as
/// the agent's one per process) with the recorder flags given on the command line on top;
/// without a file, the flags and their defaults alone.
fn record_options(common: &CommonArgs, file_rules: &[Rule]) -> Option<RecordOptions> {
    if common.dry_run {
        return None;
    }
    let mut capture = file_rules
        .first()
        .map_or_else(CaptureOptions::default, |rule| {
            capture_options(&rule.capture)
        });
    if let Some(backend) = common.backend {
        capture.backend = match backend {
            Backend::Auto => BackendRequest::Auto,
            Backend::IntelPt => BackendRequest::IntelPt,
            Backend::Sampling => BackendRequest::Sampling,
        };
    }
    if let Some(size) = common.buffer_size {
        capture.buffer_size = usize::try_from(size).unwrap_or(usize::MAX);
    }
    if let Some(hz) = common.sample_frequency {
        capture.sample_frequency = hz;
    }
    if let Some(size) = common.stack_size {
        capture.stack_size = size;
    }
    capture.include_kernel |= common.include_kernel;
    if !common.trace_binaries.is_empty() {
        capture.pt = PtOptions {
            trace_binaries: common.trace_binaries.clone(),
            ..PtOptions::default()
        };
    }
    // The largest wait leaves every rule at least the time after its trigger it asks for.
    let post_trigger = common.post_trigger.unwrap_or_else(|| {
        file_rules
            .iter()
            .map(|rule| rule.snapshot.post_trigger)
            .max()
            .unwrap_or(Duration::ZERO)
    });
    if post_trigger.is_zero() {
        // Triggers the kernel can turn into a pause of the PT trace at the event itself
        // (the PT recorder checks the kernel takes them). Not with a post_trigger: that
        // asks for trace after the trigger.
        capture.pt.pause_on = file_rules
            .iter()
            .map(|rule| &rule.trigger)
            .chain(&common.triggers)
            .filter_map(|trigger| aux_pause::pause_source(trigger).ok())
            .collect();
    }
    Some(RecordOptions {
        capture,
        output: common.output.clone(),
        post_trigger,
        keep_raw: common.keep_raw,
        debuginfod: session_servers(common, file_rules),
        debug_dirs: file_rules
            .iter()
            .flat_map(|rule| rule.trigger.debug_dirs())
            .chain(&common.debug_dir)
            .fold(Vec::new(), |mut dirs, dir| {
                if !dirs.contains(dir) {
                    dirs.push(dir.clone());
                }
                dirs
            }),
    })
}

/// The warning for file rules whose capture section differs from the first rule's: the run
/// has one recorder, so theirs is ignored. `None` when all agree.
fn capture_warning(file_rules: &[Rule]) -> Option<String> {
    let (first, rest) = file_rules.split_first()?;
    let ignored: Vec<String> = rest
        .iter()
        .filter(|rule| rule.capture != first.capture)
        .map(|rule| format!("`{}`", rule.name))
        .collect();
    if ignored.is_empty() {
        return None;
    }
    Some(format!(
        "one recorder per run, with the capture options of the first rule, `{}`: the \
         differing capture section of rule(s) {} is ignored",
        first.name,
        ignored.join(", ")
    ))
}

/// The session's debuginfod servers: none with `--no-debuginfod`; else the first rule's
/// own choice (`debuginfod:` of a rules file's rule or its defaults); else
/// `DEBUGINFOD_URLS`.
fn session_servers(common: &CommonArgs, file_rules: &[Rule]) -> Servers {
    if common.no_debuginfod {
        return Servers::Off;
    }
    file_rules
        .iter()
        .map(|rule| &rule.debuginfod)
        .find(|servers| **servers != Servers::FromEnv)
        .cloned()
        .unwrap_or_default()
}

fn session(common: &CommonArgs, target: Target) -> Result<Session, CliError> {
    let file_rules = file_rules(common)?;
    let debuginfod = session_servers(common, &file_rules);
    let record = record_options(common, &file_rules);
    if record.is_some() {
        // Before the command starts or a probe is placed: a snapshot must have a place.
        super::output_path::check_output(&common.output, common.mkdir).map_err(CliError::usage)?;
    }
    if record.is_some()
        && let Some(path) = &common.rules
        && let Some(warning) = capture_warning(&file_rules)
    {
        log::warn!("{}: {warning}", path.display());
    }
    let json = match &common.json {
        Some(dest) => Some(
            JsonSink::open(dest)
                .map_err(|e| CliError::usage(anyhow!("--json {}: {e}", json_dest_name(dest))))?,
        ),
        None => None,
    };
    Ok(Session {
        rules: engine_rules(common, &file_rules)?,
        target,
        debuginfod,
        json,
        duration: common.duration,
        follow_descendants: !common.no_follow_forks,
        max_events: common
            .max_snapshots
            // A dry run shows how often the rules fire: no limit (0); a recording, one.
            .unwrap_or(u64::from(!common.dry_run)),
        record,
        wait: if common.freeze_spin {
            Wait::Spin
        } else {
            Wait::Sleep
        },
    })
}

fn json_dest_name(dest: &JsonDest) -> String {
    match dest {
        JsonDest::Stdout => "-".into(),
        JsonDest::File(path) => path.display().to_string(),
    }
}

pub fn run(args: RunArgs) -> CliResult {
    let program = resolve_program(&args.command[0]).map_err(CliError::usage)?;
    let stdout_to_stderr = args
        .common
        .json
        .as_ref()
        .is_some_and(JsonDest::takes_stdout);
    let session = session(
        &args.common,
        Target::Spawn {
            program,
            argv: args.command,
            stdout_to_stderr,
        },
    )?;
    live::run_session(session)
}

pub fn attach(args: &AttachArgs) -> CliResult {
    for &pid in &args.pid {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(CliError::usage(anyhow!("process {pid} not found")));
        }
    }
    let pids = attach_targets(&args.pid, args.no_children);
    let session = session(&args.common, Target::Attach { pids })?;
    live::run_session(session)
}

/// The processes `attach -p` traces: the given ones and, unless `no_children`, every
/// descendant they have now (a server's workers are where its requests run). Logged, so
/// the user sees what is traced and what is not.
fn attach_targets(given: &[u32], no_children: bool) -> Vec<u32> {
    let descendants: Vec<u32> = procmaps::descendants(given)
        .into_iter()
        .filter(|p| !given.contains(p))
        .collect();
    let mut pids = given.to_vec();
    if descendants.is_empty() {
        return pids;
    }
    if no_children {
        log::warn!(
            "{} existing descendant process(es) of {} not traced (--no-children): {}",
            descendants.len(),
            pid_list(given),
            pid_list(&descendants)
        );
    } else {
        log::info!(
            "also tracing {} existing descendant process(es) of {}: {}",
            descendants.len(),
            pid_list(given),
            pid_list(&descendants)
        );
        pids.extend(descendants);
    }
    pids
}

fn pid_list(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Finds the executable `cmd` names, like the shell does (PATH lookup without a slash).
/// The path is kept as found, symlinks and all: the kernel names the process (comm) after
/// the file executed, so `redis-server` must not become the `redis-check-rdb` it links to.
fn resolve_program(cmd: &str) -> anyhow::Result<PathBuf> {
    let candidates: Vec<PathBuf> = if cmd.contains('/') {
        vec![PathBuf::from(cmd)]
    } else {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join(cmd))
            .collect()
    };
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| format!("{cmd}: command not found"))
}

#[cfg(test)]
mod tests {
    use std::{path::PathBuf, time::Duration};

    use clap::{CommandFactory as _, Parser};

    use super::{CommonArgs, capture_warning, engine_rules, record_options};
    use crate::{
        capture::BackendRequest,
        cli::record::RecordOptions,
        rules::{Rule, RuleSet},
    };

    /// `CommonArgs` alone, parsed like `lookback run`'s.
    #[derive(Debug, Parser)]
    struct Common {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn parse(args: &[&str]) -> CommonArgs {
        let command_line = std::iter::once("lookback").chain(args.iter().copied());
        match Common::try_parse_from(command_line) {
            Ok(parsed) => parsed.common,
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    #[test]
    fn numbers_the_rules_file_refuses_are_refused_here_too() {
        for (args, reason) in [
            (["--sample-frequency", "0"], "positive integer"),
            (["--buffer-size", "1KiB"], "below one page"),
            (["--buffer-size", "5MiB"], "not a power of two"),
        ] {
            let command_line = std::iter::once("lookback").chain(args);
            let err = Common::try_parse_from(command_line).expect_err("refused");
            assert!(err.to_string().contains(reason), "{args:?}: {err}");
        }
        assert_eq!(
            parse(&["--sample-frequency", "1"]).sample_frequency,
            Some(1)
        );
    }

    fn rules(yaml: &str) -> Vec<Rule> {
        match RuleSet::from_str(yaml, "test.yaml") {
            Ok(set) => set.rules,
            Err(e) => panic!("{e}"),
        }
    }

    fn record(common: &CommonArgs, file: &[Rule]) -> RecordOptions {
        record_options(common, file).unwrap_or_else(|| panic!("no record options"))
    }

    /// One rule with every capture field and a `post_trigger` set, none at its default.
    const FULL: &str = "version: 1
rules:
  - name: slow
    target: { pid: 1 }
    trigger: { signal: { signals: [SIGSEGV] } }
    capture:
      backend: sampling
      buffer_size: 1MiB
      sample_frequency: 997
      include_kernel: true
      trace_binaries: [/usr/bin/true]
    snapshot: { post_trigger: 20ms }
";

    #[test]
    fn without_rules_file_the_cli_defaults_apply() {
        let opts = record(&parse(&[]), &[]);
        assert_eq!(opts.capture.backend, BackendRequest::Auto);
        assert_eq!(opts.capture.buffer_size, 4 << 20);
        assert_eq!(opts.capture.sample_frequency, 10_000);
        assert!(!opts.capture.include_kernel);
        assert!(opts.capture.pt.trace_binaries.is_empty());
        assert_eq!(opts.post_trigger, Duration::ZERO);
        assert_eq!(opts.output, PathBuf::from("trace.fxt.gz"));
        let opts = record(
            &parse(&[
                "--backend",
                "sampling",
                "--buffer-size",
                "64KiB",
                "--sample-frequency",
                "99",
                "--include-kernel",
                "--trace-binary",
                "/bin/ls",
                "--post-trigger",
                "5ms",
            ]),
            &[],
        );
        assert_eq!(opts.capture.backend, BackendRequest::Sampling);
        assert_eq!(opts.capture.buffer_size, 64 << 10);
        assert_eq!(opts.capture.sample_frequency, 99);
        assert!(opts.capture.include_kernel);
        assert_eq!(opts.capture.pt.trace_binaries, [PathBuf::from("/bin/ls")]);
        assert_eq!(opts.post_trigger, Duration::from_millis(5));
    }

    #[test]
    fn rules_file_capture_and_post_trigger_apply() {
        let file = rules(FULL);
        let opts = record(&parse(&["--rules", "test.yaml"]), &file);
        assert_eq!(opts.capture.backend, BackendRequest::Sampling);
        assert_eq!(opts.capture.buffer_size, 1 << 20);
        assert_eq!(opts.capture.sample_frequency, 997);
        assert!(opts.capture.include_kernel);
        assert_eq!(
            opts.capture.pt.trace_binaries,
            [PathBuf::from("/usr/bin/true")]
        );
        assert_eq!(opts.post_trigger, Duration::from_millis(20));
        assert_eq!(capture_warning(&file), None);
    }

    #[test]
    fn flags_given_override_the_rules_file() {
        let file = rules(FULL);
        let opts = record(
            &parse(&[
                "--backend",
                "intel-pt",
                "--rules",
                "test.yaml",
                "--buffer-size",
                "64KiB",
                "--sample-frequency",
                "50",
                "--trace-binary",
                "/bin/ls",
                "--post-trigger",
                "0ms",
            ]),
            &file,
        );
        assert_eq!(opts.capture.backend, BackendRequest::IntelPt);
        assert_eq!(opts.capture.buffer_size, 64 << 10);
        assert_eq!(opts.capture.sample_frequency, 50);
        assert_eq!(opts.capture.pt.trace_binaries, [PathBuf::from("/bin/ls")]);
        assert_eq!(opts.post_trigger, Duration::ZERO);
        // One flag overrides its field only; the rest still come from the file.
        let opts = record(&parse(&["--sample-frequency", "50"]), &file);
        assert_eq!(opts.capture.sample_frequency, 50);
        assert_eq!(opts.capture.backend, BackendRequest::Sampling);
        assert_eq!(opts.capture.buffer_size, 1 << 20);
        assert_eq!(opts.post_trigger, Duration::from_millis(20));
        // --include-kernel turns it on over a file that leaves it off.
        let plain = rules(&FULL.replace("include_kernel: true", "include_kernel: false"));
        assert!(!record(&parse(&[]), &plain).capture.include_kernel);
        assert!(
            record(&parse(&["--include-kernel"]), &plain)
                .capture
                .include_kernel
        );
    }

    #[test]
    fn triggers_the_kernel_can_pause_pt_on_go_to_the_recorder_unless_post_trigger() {
        use crate::capture::aux_pause::PauseSource;
        // FULL: a SIGSEGV trigger (mappable), post_trigger 20ms: no pause in the kernel.
        let file = rules(FULL);
        assert!(record(&parse(&[]), &file).capture.pt.pause_on.is_empty());
        // Without the post_trigger, the file's signal trigger and a plain syscall trigger
        // from the command line pause; a duration trigger does not.
        let opts = record(
            &parse(&[
                "--post-trigger",
                "0ms",
                "--trigger",
                "syscall:fsync>5ms",
                "--trigger",
                "syscall:fsync=EIO",
            ]),
            &file,
        );
        let pause = &opts.capture.pt.pause_on;
        assert_eq!(pause.len(), 2, "{pause:?}");
        assert!(matches!(
            &pause[0],
            PauseSource::Tracepoint { name: "signal_deliver", filter: Some(f), .. } if f == "sig == 11"
        ));
        assert!(matches!(
            &pause[1],
            PauseSource::Tracepoint { name: "sys_exit", filter: Some(f), .. } if f.contains("ret == -5")
        ));
    }

    #[test]
    fn first_rule_capture_wins_with_a_warning() {
        let file = rules(
            "version: 1
rules:
  - name: first
    target: { pid: 1 }
    trigger: { signal: { signals: [SIGSEGV] } }
    capture: { backend: sampling, sample_frequency: 500 }
    snapshot: { post_trigger: 1ms }
  - name: same
    target: { pid: 1 }
    trigger: { signal: { signals: [SIGABRT] } }
    capture: { backend: sampling, sample_frequency: 500 }
    snapshot: { post_trigger: 30ms }
  - name: other
    target: { pid: 1 }
    trigger: { signal: { signals: [SIGBUS] } }
    capture: { sample_frequency: 2000 }
  - name: bigger
    target: { pid: 1 }
    trigger: { signal: { signals: [SIGILL] } }
    capture: { backend: sampling, sample_frequency: 500, buffer_size: 16MiB }
",
        );
        let opts = record(&parse(&[]), &file);
        assert_eq!(opts.capture.backend, BackendRequest::Sampling);
        assert_eq!(opts.capture.sample_frequency, 500);
        assert_eq!(opts.capture.buffer_size, 4 << 20);
        assert_eq!(opts.post_trigger, Duration::from_millis(30));
        assert_eq!(
            capture_warning(&file).as_deref(),
            Some(
                "one recorder per run, with the capture options of the first rule, `first`: \
                 the differing capture section of rule(s) `other`, `bigger` is ignored"
            )
        );
    }

    #[test]
    fn dry_run_records_nothing() {
        assert!(record_options(&parse(&["--dry-run"]), &rules(FULL)).is_none());
    }

    #[test]
    fn file_rules_come_before_trigger_options() {
        let common = parse(&[
            "--rules",
            "test.yaml",
            "--trigger",
            "syscall:fsync>5ms",
            "--cooldown",
            "1s",
        ]);
        let engine =
            engine_rules(&common, &rules(FULL)).unwrap_or_else(|e| panic!("{:#}", e.error));
        let names: Vec<(u32, &str)> = engine.iter().map(|r| (r.id, r.name.as_str())).collect();
        assert_eq!(names, [(0, "slow"), (1, "syscall:fsync>5ms")]);
        assert_eq!(engine[0].cooldown, Duration::from_secs(10));
        assert_eq!(engine[1].cooldown, Duration::from_secs(1));
    }

    /// The engine rules of `args`, or the usage error's text.
    fn engine(args: &[&str], file: &[Rule]) -> Result<Vec<crate::triggers::EngineRule>, String> {
        engine_rules(&parse(args), file).map_err(|e| format!("{:#}", e.error))
    }

    #[test]
    fn detect_applies_to_every_latency_trigger_option() {
        use crate::rules::{Detect, Trigger};
        let detect = |trigger: &Trigger| match trigger {
            Trigger::Function(f) => Some(f.detect),
            Trigger::Syscall(s) => Some(s.detect),
            Trigger::Signal(_) => None,
        };
        let args = [
            "--trigger",
            "func:f>5s",
            "--trigger",
            "syscall:read,futex>1s",
        ];
        let got = engine(&args, &[]).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            got.iter()
                .all(|r| detect(&r.trigger) == Some(Detect::Returned))
        );
        let running = [
            &args[..],
            &["--detect", "running", "--trigger", "signal:SIGSEGV"],
        ]
        .concat();
        let got = engine(&running, &[]).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<_> = got.iter().map(|r| detect(&r.trigger)).collect();
        assert_eq!(
            got,
            [Some(Detect::Running), Some(Detect::Running), None],
            "a signal trigger has no call in flight"
        );
        // The rules file's rules keep their own `detect:`.
        let file = rules(&FULL.replace(
            "trigger: { signal: { signals: [SIGSEGV] } }",
            "trigger: { function: { symbol: g, min_duration: 1s } }",
        ));
        let got = engine(&["--detect", "running"], &file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(detect(&got[0].trigger), Some(Detect::Returned));
        let err =
            Common::try_parse_from(["lookback", "--detect", "inflight"]).expect_err("refused");
        assert!(
            err.to_string()
                .contains("[possible values: returned, running]"),
            "{err}"
        );
    }

    #[test]
    fn detect_running_refuses_triggers_without_a_duration_naming_them() {
        for (spec, needle) in [
            (
                "func:f",
                "--detect running: trigger `func:f` has no DURATION",
            ),
            (
                "syscall:read",
                "--detect running: trigger `syscall:read` has no DURATION",
            ),
            (
                "syscall:openat=ENOENT",
                "trigger `syscall:openat=ENOENT` has no DURATION",
            ),
            (
                "syscall:read>1s=EIO",
                "--detect running: trigger `syscall:read>1s=EIO` tests an errno, which is \
                 known only at the return",
            ),
        ] {
            let err =
                engine(&["--detect", "running", "--trigger", spec], &[]).expect_err("refused");
            assert!(err.contains(needle), "{spec}: {err}");
            // Without --detect running the same trigger is fine.
            assert!(engine(&["--trigger", spec], &[]).is_ok(), "{spec}");
        }
        let err = engine(
            &[
                "--detect",
                "running",
                "--return-probe",
                "uretprobe",
                "--trigger",
                "func:f>1s",
            ],
            &[],
        )
        .expect_err("refused");
        assert!(
            err.contains(
                "`func:f>1s`: detect running places no return probe; --return-probe uretprobe"
            ),
            "{err}"
        );
    }

    #[test]
    fn help_shows_the_defaults() {
        // Words only: the help is wrapped to the terminal's width.
        let help = Common::command().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for default in [
            "[default: auto, or the rules file's]",
            "[default: 4MiB, or the rules file's]",
            "[default: 10000, or the rules file's]",
            "[default: 0ms, or the largest `post_trigger` of the rules file]",
            "[possible values: auto, intel-pt, sampling]",
            "[default: returned] [possible values: returned, running]",
        ] {
            assert!(help.contains(default), "{default} missing from:\n{help}");
        }
    }
}
