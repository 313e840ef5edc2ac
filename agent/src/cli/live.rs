//! A live session of `run`/`attach`: start or find the targets, load and attach the trigger
//! engine, deliver trigger events until the targets exit, the event limit is reached, or
//! the user interrupts; then report the per-rule counters and detach everything.
#![expect(clippy::print_stdout, reason = "dry-run trigger lines go to stdout")]

use std::{
    os::fd::{AsRawFd as _, RawFd},
    path::{Path, PathBuf},
    process::{ExitCode, ExitStatus},
    time::Duration,
};

use anyhow::{Context as _, anyhow};
use serde_json::json;
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{SignalKind, signal},
};

use super::{
    CliError, CliResult,
    json_out::JsonSink,
    record::{OnWritten, RecordOptions, Recording, WhenFull},
};
use crate::{
    capture::aux_pause,
    elf::debuginfod::Servers,
    inflight::Watcher,
    rules::{Detect, Trigger},
    sys::process::{self, HeldProcess},
    triggers::{
        AttachedProbe, EngineRule, ProbePoint, TriggerEngine, TriggerEvent,
        engine::log_probes,
        pump::{FreezeHook, TriggerPump, Wait},
        resolve::{self, ResolveError},
        stream::forward_logs,
    },
};

/// What to trace.
#[derive(Debug)]
pub enum Target {
    /// Start `argv` (the resolved `program`) suspended, attach, then let it run;
    /// `stdout_to_stderr` when our stdout carries the JSON lines.
    Spawn {
        program: PathBuf,
        argv: Vec<String>,
        stdout_to_stderr: bool,
    },
    /// Running processes.
    Attach { pids: Vec<u32> },
}

/// A `run`/`attach` session.
#[derive(Debug)]
pub struct Session {
    pub rules: Vec<EngineRule>,
    pub target: Target,
    /// Where stripped binaries' debug files may come from, to place function probes.
    pub debuginfod: Servers,
    /// `--json`: where the machine-readable lines go.
    pub json: Option<JsonSink>,
    /// `--duration`: stop tracing after this long.
    pub duration: Option<Duration>,
    /// Follow forks; for `run`, also keep tracing after the command exits while processes
    /// it started live on (a daemonizing server).
    pub follow_descendants: bool,
    /// Stop after this many triggers (dry run) or snapshots; 0 = no limit.
    pub max_events: u64,
    /// `None`: dry run (print triggers only).
    pub record: Option<RecordOptions>,
    /// How the trigger thread waits (`--freeze-spin`).
    pub wait: Wait,
}

pub fn run_session(session: Session) -> CliResult {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run_async(session))
}

/// Probe points for a function trigger, resolved for the session's target.
fn probe_points(
    target: &Target,
    trigger: &Trigger,
    servers: &Servers,
) -> Result<Vec<ProbePoint>, ResolveError> {
    let Trigger::Function(f) = trigger else {
        return Ok(Vec::new());
    };
    let lookup = resolve::Lookup::of(f).servers(servers);
    match target {
        Target::Spawn { program, .. } => {
            let binary = f.binary.clone().unwrap_or_else(|| program.clone());
            match resolve::resolve_symbol(&binary, &lookup) {
                Err(e @ ResolveError::NoSymbol { .. }) if f.binary.is_none() => {
                    resolve_in_needed_libs(program, &lookup, e)
                }
                other => other,
            }
        }
        Target::Attach { pids } => {
            let pid = pids.first().copied().unwrap_or(0);
            resolve::resolve_for_process(pid, f.binary.as_deref(), &lookup)
        }
    }
}

/// `opts` with each function-entry PT pause source pointed at the entry uprobe the engine
/// placed for that function (the pause event must fire where the trigger does).
fn with_entry_probes(
    opts: &RecordOptions,
    installed: &[(EngineRule, Vec<AttachedProbe>)],
) -> RecordOptions {
    let mut opts = opts.clone();
    aux_pause::resolve_entries(&mut opts.capture.pt.pause_on, |symbol| {
        installed
            .iter()
            .find_map(|(rule, probes)| match &rule.trigger {
                Trigger::Function(f) if f.symbol == symbol && f.min_duration.is_none() => probes
                    .iter()
                    .find(|p| !p.is_return)
                    .map(|p| (PathBuf::from(&p.path), p.file_offset)),
                _ => None,
            })
    });
    opts
}

/// Before exec, a program's shared libraries are not mapped yet: ask the dynamic loader
/// which ones it would load (`ldd`) and look there.
/// `not_in_program`: the program's own lookup error, returned when no library has it.
fn resolve_in_needed_libs(
    program: &Path,
    lookup: &resolve::Lookup<'_>,
    not_in_program: ResolveError,
) -> Result<Vec<ProbePoint>, ResolveError> {
    let Ok(out) = std::process::Command::new("ldd").arg(program).output() else {
        return Err(not_in_program);
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let libraries: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split("=>").nth(1)?.split_whitespace().next())
        .map(PathBuf::from)
        .collect();
    resolve::resolve_in_libraries(&libraries, lookup, not_in_program)
}

/// Installs every rule; a rule that cannot be placed is reported and the others run.
fn install_rules(
    engine: &mut TriggerEngine,
    rules: &[EngineRule],
    target: &Target,
    servers: &Servers,
) -> Result<Vec<(EngineRule, Vec<AttachedProbe>)>, CliError> {
    let mut installed = Vec::new();
    // Every failure a name that selects no function, or several: the rules are wrong (2).
    let mut only_name_errors = true;
    for rule in rules {
        let points = match probe_points(target, &rule.trigger, servers) {
            Ok(points) => points,
            Err(e) => {
                only_name_errors &= matches!(
                    e,
                    ResolveError::NoSymbol { .. }
                        | ResolveError::Ambiguous { .. }
                        | ResolveError::TooMany { .. }
                        | ResolveError::InSeveral { .. }
                );
                log::error!("rule {}: {e}", rule.name);
                continue;
            }
        };
        match engine.add_rule(rule.clone(), &points) {
            Ok(probes) => {
                log_probes(&rule.name, &probes);
                installed.push((rule.clone(), probes));
            }
            Err(e) => {
                only_name_errors = false;
                log::error!("rule {}: {:#}", rule.name, anyhow::Error::from(e));
            }
        }
    }
    if installed.is_empty() && !rules.is_empty() {
        let e = anyhow!("no rule could be installed");
        return Err(if only_name_errors {
            CliError::usage(e)
        } else {
            CliError::runtime(e)
        });
    }
    Ok(installed)
}

/// Everything a running session holds.
struct Live {
    engine: TriggerEngine,
    events: TriggerPump,
    installed: Vec<(EngineRule, Vec<AttachedProbe>)>,
    held: Option<HeldProcess>,
    /// The command's pidfd until the command exits.
    child_exit: Option<AsyncFd<RawFd>>,
    pids: Vec<u32>,
    recording: Option<Recording>,
    snapshots: u64,
    /// The `detect: running` watcher, while such a rule is loaded (stops on drop).
    _inflight: Option<Watcher>,
}

/// The signals that end a session, handled from before the command starts or a probe is
/// placed: a Ctrl-C right after the start must end the session cleanly (the summary, the
/// snapshot), not kill lookback by the default action.
struct Stops {
    sigint: tokio::signal::unix::Signal,
    sigterm: tokio::signal::unix::Signal,
}

impl Stops {
    fn install() -> Result<Self, CliError> {
        Ok(Self {
            sigint: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            sigterm: signal(SignalKind::terminate()).context("SIGTERM handler")?,
        })
    }
}

async fn run_async(session: Session) -> CliResult {
    let mut stops = Stops::install()?;
    let mut live = start(&session)?;
    let exit_status = deliver(&session, &mut live, &mut stops)
        .await?
        // Tracing ended after the command exited (its descendants still traced).
        .or_else(|| live.held.as_ref().and_then(HeldProcess::status));
    // Triggers still in the ring when the targets exited: a dry run prints them, a recording
    // snapshots them (the rings still hold the window before each; writing a trace takes
    // long enough for a short-lived target to exit with triggers pending).
    // Nothing is dropped here: the snapshots wait for the writer if need be.
    for event in live.events.drain() {
        let full = session.max_events != 0 && live.snapshots >= session.max_events;
        if full || on_trigger(&session, &mut live, &event, WhenFull::Wait).await? {
            break;
        }
    }
    let mut dropped = 0;
    if let Some(mut recording) = live.recording.take() {
        if session.rules.is_empty() {
            // No trigger given: the snapshot is taken at exit or interrupt.
            recording.snapshot(None, WhenFull::Wait)?;
        }
        dropped = recording.dropped();
        // Every snapshot taken is written before the summary and the exit.
        recording.finish()?;
    }
    report(
        &session,
        &live.engine,
        &live.installed,
        exit_status.as_ref(),
        dropped,
        &live.pids,
    )?;
    let Live {
        engine,
        held,
        child_exit,
        ..
    } = live;
    drop(engine);
    let mut final_status = exit_status;
    if let Some(mut h) = held
        && exit_status.is_none()
    {
        // Probes are gone; let the command finish as it would have without lookback.
        loop {
            if let Some(status) = h.try_wait().context("waiting for the command")? {
                log::info!("command exited: {status}");
                final_status = Some(status);
                break;
            }
            wait_readable(child_exit.as_ref()).await;
        }
    }
    Ok(final_status.map_or(ExitCode::SUCCESS, command_exit_code))
}

/// The exit code of `run` for the command's `status`, as a shell gives it: the command's
/// own code, or 128 + the signal that killed it.
fn command_exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt as _;
    let code = status
        .code()
        .or_else(|| status.signal().map(|sig| 128 + sig))
        .unwrap_or(0);
    ExitCode::from(u8::try_from(code & 0xff).unwrap_or(u8::MAX))
}

/// Starts or finds the targets, loads the engine, installs the rules, lets the command run.
fn start(session: &Session) -> Result<Live, CliError> {
    let mut held = match &session.target {
        Target::Spawn {
            program,
            argv,
            stdout_to_stderr,
        } => {
            if session.follow_descendants {
                // Before the fork: processes the command leaves behind become ours.
                process::become_subreaper().context("following the command's descendants")?;
            }
            Some(
                HeldProcess::spawn(program, argv, *stdout_to_stderr)
                    .with_context(|| format!("starting {}", program.display()))?,
            )
        }
        Target::Attach { .. } => None,
    };
    // The rules are known now and never change: the programs' rule loops are verified
    // for their ids only (a fraction of the start-up time, see TriggerEngine::load_for).
    let slots = session.rules.iter().map(|r| r.id + 1).max().unwrap_or(1);
    let running = session
        .rules
        .iter()
        .any(|r| r.trigger.detect() == Detect::Running);
    let mut engine =
        TriggerEngine::load_for(slots, running).context("loading the trigger engine")?;
    if let Some(logger) = engine.logger() {
        tokio::spawn(forward_logs(logger));
    }
    let ring = engine
        .take_events()
        .context("taking the trigger ring buffer")?;
    let installed = install_rules(
        &mut engine,
        &session.rules,
        &session.target,
        &session.debuginfod,
    )?;
    let mask = installed.iter().fold(0u64, |m, (r, _)| m | 1 << r.id);
    let pids = match (&held, &session.target) {
        (Some(h), _) => vec![h.pid()],
        (None, Target::Attach { pids }) => pids.clone(),
        (None, Target::Spawn { .. }) => Vec::new(),
    };
    for &pid in &pids {
        engine
            .add_target(pid, mask)
            .with_context(|| format!("adding target {pid}"))?;
    }
    let recording = match &session.record {
        Some(opts) => {
            let filter = engine.sample_filter().context("the sample filter")?;
            let opts = with_entry_probes(opts, &installed);
            let mut recording =
                Recording::start(opts, &pids, Some(filter), print_written(session))?;
            if recording.filters_in_kernel() {
                // Each trigger stops its process's samples in the kernel at once; the
                // pump's pause of the rings follows as the second line.
                recording.set_frozen(engine.take_frozen().context("the FROZEN map")?);
                engine
                    .set_freeze_in_kernel(true)
                    .context("turning on the in-kernel freeze")?;
            }
            Some(recording)
        }
        None => None,
    };
    // Triggers that fired meanwhile wait in the kernel's ring; the pump reads them first.
    let events = TriggerPump::start(ring, freeze_hook(recording.as_ref()), session.wait)
        .context("starting the trigger reader")?;
    let inflight = match engine.inflight_handles() {
        Some(handles) => Some(
            Watcher::start(handles.context("the in-flight programs")?)
                .context("starting the in-flight watcher")?,
        ),
        None => None,
    };
    let child_exit = match held.as_mut() {
        Some(h) => {
            h.release().context("starting the command")?;
            // SAFETY: the pidfd is owned by `held`, which outlives this registration.
            Some(
                unsafe { AsyncFd::register(h.pidfd().as_raw_fd()) }
                    .context("watching the command")?,
            )
        }
        None => None,
    };
    log::info!(
        "tracing {} process(es) with {} rule(s); waiting for triggers",
        pids.len(),
        installed.len()
    );
    Ok(Live {
        engine,
        events,
        installed,
        held,
        child_exit,
        pids,
        recording,
        snapshots: 0,
        _inflight: inflight,
    })
}

/// What the pump does at each trigger: stop the recorder's rings right there, unless the
/// trigger asks to keep recording a while (`post_trigger`) or nothing records.
fn freeze_hook(recording: Option<&Recording>) -> FreezeHook {
    let switch = recording
        .filter(|r| r.post_trigger().is_zero())
        .and_then(Recording::freeze_switch);
    match switch {
        Some(switch) => Box::new(move |_| {
            switch.freeze();
        }),
        None => Box::new(|_| {}),
    }
}

/// Handles triggers until the targets exit, the limit is reached or we are interrupted;
/// returns the command's exit status if it exited.
async fn deliver(
    session: &Session,
    live: &mut Live,
    stops: &mut Stops,
) -> Result<Option<ExitStatus>, CliError> {
    let mut poll = tokio::time::interval(Duration::from_millis(200));
    let mut recorder_poll = tokio::time::interval(Duration::from_millis(20));
    let deadline = session.duration.map(|d| tokio::time::Instant::now() + d);
    // `run` follows the command's descendants: they are ours to reap (subreaper), and the
    // session lasts until the last of them exits.
    let following = session.follow_descendants && live.held.is_some();
    loop {
        tokio::select! {
            batch = live.events.next_batch() => {
                for event in batch.context("reading triggers")? {
                    if on_trigger(session, live, &event, WhenFull::Drop).await? {
                        return Ok(None);
                    }
                }
            }
            _ = recorder_poll.tick(), if live.recording.is_some() => {
                if let Some(r) = live.recording.as_mut() {
                    r.poll();
                }
            }
            () = wait_readable(live.child_exit.as_ref()), if live.child_exit.is_some() => {
                if let Some(h) = live.held.as_mut()
                    && let Some(status) = h.try_wait().context("waiting for the command")?
                {
                    if !following || !process::reap_orphans(None).context("reaping")? {
                        return Ok(Some(status));
                    }
                    log::info!(
                        "command exited: {status}; still tracing the processes it started \
                         (until they exit, Ctrl-C or --duration)"
                    );
                    // The pidfd stays readable from now on.
                    live.child_exit = None;
                }
            }
            _ = poll.tick(), if following || live.held.is_none() => {
                if following {
                    // The command itself is reaped by the branch above, with its status.
                    let command = live.held.as_ref().filter(|h| h.status().is_none());
                    let left = process::reap_orphans(command.map(HeldProcess::pid))
                        .context("reaping")?;
                    if !left && live.child_exit.is_none() {
                        log::info!("the last process the command started exited");
                        return Ok(live.held.as_ref().and_then(HeldProcess::status));
                    }
                } else if live.pids.iter().all(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                    log::info!("all target processes exited");
                    return Ok(None);
                }
            }
            () = sleep_until(deadline), if deadline.is_some() => {
                log::info!("--duration reached: tracing ends");
                return Ok(None);
            }
            _ = stops.sigint.recv() => {
                forward(live.held.as_ref(), libc::SIGINT);
                return Ok(None);
            }
            _ = stops.sigterm.recv() => {
                forward(live.held.as_ref(), libc::SIGTERM);
                return Ok(None);
            }
        }
    }
}

/// Handles one trigger: print it (dry run) or snapshot it. Returns whether the session's
/// limit is reached (a dropped trigger does not count).
async fn on_trigger(
    session: &Session,
    live: &mut Live,
    event: &TriggerEvent,
    when_full: WhenFull,
) -> Result<bool, CliError> {
    let Some(recording) = live.recording.as_mut() else {
        print_event(session, event);
        live.snapshots += 1;
        return Ok(session.max_events != 0 && live.snapshots >= session.max_events);
    };
    let rule = rule_name(session, event.rule_id);
    log::info!("trigger {rule}: {event}");
    let post = recording.post_trigger();
    if !post.is_zero() {
        tokio::time::sleep(post).await;
    }
    if recording.snapshot(Some((rule, event)), when_full)? {
        live.snapshots += 1;
    }
    Ok(session.max_events != 0 && live.snapshots >= session.max_events)
}

/// With `--json`, one line per triggered snapshot once its files are written (on the
/// writer thread, in snapshot order); without, nothing (the log says it).
fn print_written(session: &Session) -> OnWritten {
    let Some(sink) = session.json.clone() else {
        return Box::new(|_, _| {});
    };
    Box::new(move |job, files| {
        let Some((rule, trigger)) = job.trigger.as_ref() else {
            return;
        };
        sink.line(&json!({
                "snapshot": files.raw,
                "trace": files.trace,
                "trigger_to_freeze_ns": files.trigger_to_freeze_ns,
                "rule": rule,
                "trigger": trigger,
            // Per binary: frames, `[unknown]` frames, the debug-symbols hint.
            "symbols": files.symbols,
            // Where the trigger's interval went (`lookback report` has the breakdown).
            "verdict": files.verdict,
        }));
    })
}

/// Resolves at `deadline`; never without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits until the pidfd says the command exited; never resolves without one.
async fn wait_readable(fd: Option<&AsyncFd<RawFd>>) {
    match fd {
        Some(fd) => {
            if let Ok(mut guard) = fd.readable().await {
                guard.clear_ready();
            }
        }
        None => std::future::pending().await,
    }
}

/// Passes the user's interrupt on to the command we started (it may not share our
/// terminal's process group, e.g. under a supervisor).
fn forward(held: Option<&HeldProcess>, signal: i32) {
    if let Some(h) = held {
        h.kill(signal);
    }
}

fn rule_name(session: &Session, id: u32) -> &str {
    session
        .rules
        .iter()
        .find(|r| r.id == id)
        .map_or("?", |r| r.name.as_str())
}

fn print_event(session: &Session, event: &TriggerEvent) {
    let rule = rule_name(session, event.rule_id);
    if let Some(sink) = &session.json {
        let mut value = serde_json::to_value(event).unwrap_or_default();
        if let Some(obj) = value.as_object_mut() {
            obj.insert("rule".into(), json!(rule));
            obj.insert("detail".into(), json!(event.detail()));
        }
        sink.line(&value);
    } else {
        println!("trigger {rule}: {event}");
    }
}

fn report(
    session: &Session,
    engine: &TriggerEngine,
    installed: &[(EngineRule, Vec<AttachedProbe>)],
    exit: Option<&ExitStatus>,
    dropped: u64,
    pids: &[u32],
) -> Result<(), CliError> {
    let mut rules = Vec::new();
    for (rule, probes) in installed {
        let counters = engine.counters(rule.id).context("reading counters")?;
        log::info!(
            "rule {}: {} met, {} sent, {} suppressed by cooldown, {} by rate limit, {} lost",
            rule.name,
            counters.met,
            counters.emitted,
            counters.suppressed_cooldown,
            counters.suppressed_rate_limit,
            counters.lost_ringbuf_full
        );
        if matches!(&rule.trigger, Trigger::Function(f) if f.min_duration.is_some()) {
            log::info!(
                "rule {}: {} call(s) abandoned by longjmp, an exception or a panic (not \
                 measured), {} exit(s) without a recorded entry",
                rule.name,
                counters.unwound,
                counters.unmatched_return
            );
        }
        if counters.depth_overflow > 0 {
            log::warn!(
                "rule {}: {} call(s) deeper than {} nested calls of the function on one \
                 thread were not measured (depth_overflow)",
                rule.name,
                counters.depth_overflow,
                lookback_common::rule::MAX_CALL_DEPTH
            );
        }
        rules.push(
            json!({ "rule": rule.name, "id": rule.id, "counters": counters, "probes": probes }),
        );
    }
    if dropped > 0 {
        log::warn!("{dropped} trigger(s) dropped: earlier snapshots were still being written");
    }
    if let Some(status) = exit {
        log::info!("command exited: {status}");
    }
    if let Some(sink) = &session.json {
        let exit = exit.map(|s| json!({ "code": s.code(), "signal": std::os::unix::process::ExitStatusExt::signal(s) }));
        sink.line(&json!({ "summary": {
            "rules": rules,
            "exit": exit,
            "snapshots_dropped": dropped,
            "targets": pids,
        } }));
    }
    Ok(())
}
