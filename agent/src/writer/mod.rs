//! Writer stage: a snapshot → a trace file (FXT or Chrome JSON, gzipped when the name
//! ends in `.gz`). Sampling snapshots are written here, Intel PT snapshots by [`pt`]
//! (branch events → call stacks), into the same tracks, slices and trigger instant.
//!
//! In: a [`Snapshot`] and an output path. Out: the file, written atomically (temp file +
//! rename, mode 0600) and streamed: the decoded samples are held (like the snapshot), but
//! records go out as each thread's slices are found and the trace is never built in memory.
//! One track per thread named `comm [pid] [tid]`; nested slices named by demangled function,
//! inlined functions nested inside their caller (args `address`, `location` =
//! `file:line`, `module`); the trigger as an instant `trigger: <rule>` (args rule, kind, detail, pid, tid, `duration_ns`)
//! on the trigger thread's track; samples the kernel lost show as instants `[lost samples]`
//! (arg `lost`), stretches without samples (more than two periods) as slices `[untraced]`
//! inside the frames around them.
//!
//! Timestamps are absolute `CLOCK_MONOTONIC` nanoseconds, the clock of the samples and of
//! `trigger_time_ns` (FXT: 1 tick = 1 ns; JSON: microseconds with a fraction), so a trace
//! lines up with logs and the snapshot's metadata; viewers show them relative to the start.
//!
//! `fxt` and `json` are the two encoders behind [`TraceSink`]; the pipeline here calls
//! `decode::samples` → `symbols` → `stacks` and feeds the sink.
#![forbid(unsafe_code)]

pub mod fxt;
pub mod json;
pub mod pt;
pub mod speedscope;
mod tee;

use std::fs::{self, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use flate2::Compression;
use flate2::write::GzEncoder;

use crate::capture::Backend;
use crate::decode::samples::{self, ThreadSamples};
use crate::snapshot::{Snapshot, TriggerMeta};
use crate::stacks::{self, StackEvent, StackSample};
use crate::symbols::{Frame, Symbolizer};
use crate::unwind::StackUnwinder;

use crate::decode::pt::flow::branches::ParallelStats;
pub use fxt::FxtWriter;
pub use json::JsonWriter;
pub use speedscope::SpeedscopeWriter;

use crate::report::{self, Report};

/// An argument value of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgValue<'a> {
    Str(&'a str),
    U64(u64),
    I64(i64),
    /// An address (FXT pointer; JSON hex string).
    Pointer(u64),
}

/// A named argument of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg<'a> {
    pub name: &'a str,
    pub value: ArgValue<'a>,
}

impl<'a> Arg<'a> {
    pub fn new(name: &'a str, value: ArgValue<'a>) -> Self {
        Self { name, value }
    }
}

/// What a trace encoder accepts. A thread is (pid, tid); timestamps are ns.
pub trait TraceSink {
    /// Names a process.
    fn process(&mut self, pid: u32, name: &str) -> io::Result<()>;
    /// Names a thread (its track).
    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()>;
    fn begin(
        &mut self,
        thread: (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()>;
    /// Ends the innermost open slice of `thread`, which is named `name`.
    fn end(&mut self, thread: (u32, u32), ts: u64, name: &str) -> io::Result<()>;
    fn instant(
        &mut self,
        thread: (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()>;
    /// Completes the document and flushes.
    fn finish(&mut self) -> io::Result<()>;
}

/// The trace file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Fxt,
    ChromeJson,
    /// speedscope's own file format (`.speedscope.json`): frame names without args.
    Speedscope,
}

impl Format {
    /// `.speedscope.json` → speedscope, `.json`/`.json.gz` → Chrome JSON, anything else
    /// FXT; gzip when the name ends `.gz`.
    #[expect(
        clippy::case_sensitive_file_extension_comparisons,
        reason = "the name is lowercased first"
    )]
    pub fn from_path(path: &Path) -> (Self, bool) {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        let gz = name.ends_with(".gz");
        let base = name.strip_suffix(".gz").unwrap_or(&name);
        let format = if base.ends_with(".speedscope.json") {
            Self::Speedscope
        } else if base.ends_with(".json") {
            Self::ChromeJson
        } else {
            Self::Fxt
        };
        (format, gz)
    }
}

/// Why a trace could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A frame of the trigger's stack: its address and function.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StackFrameName {
    pub address: u64,
    pub function: String,
}

/// The trigger's stack of `snap`, symbolized, leaf first, kernel frames (if kept) before
/// the user's (return addresses looked up in their call instruction, as the samples' are).
fn trigger_stack(snap: &Snapshot, symbols: &mut Symbolizer<'_>) -> Vec<StackFrameName> {
    let Some(t) = snap.meta.trigger.as_ref() else {
        return Vec::new();
    };
    t.lookup_stack()
        .into_iter()
        .map(|(address, at)| StackFrameName {
            address,
            function: symbols.frame(t.pid, at).name.clone(),
        })
        .collect()
}

/// How the trigger call's slice was timed: to the return, or (fired while it ran) to the
/// look that found it still inside; the call is open at the slice's end.
fn timed_by(t: &TriggerMeta) -> &'static str {
    if t.detail.ends_with(STILL_INSIDE) {
        "kernel: entry, and a look while it still ran (open at the end)"
    } else {
        "kernel: entry and return"
    }
}

/// The end of the detail of a trigger fired while the call ran (`TriggerEvent::detail`).
const STILL_INSIDE: &str = "(still inside)";

/// The probed function's name of a trigger fired while the call ran.
fn call_name(snap: &Snapshot, symbols: &mut Symbolizer<'_>) -> Option<String> {
    let t = snap.meta.trigger.as_ref()?;
    Some(symbols.frame(t.pid, t.call?).name.clone())
}

/// The name of process `pid`'s track: `comm [pid]`, and ` (container <12 hex digits>)`
/// when it runs in a container (its maps' origin, or the snapshot's for the triggering
/// process).
pub(crate) fn process_track_name(snap: &Snapshot, pid: u32, comm: &str) -> String {
    let own = snap
        .maps
        .iter()
        .find(|m| m.pid == pid)
        .and_then(|m| m.origin.short_container_id().map(str::to_owned));
    let of_trigger = || {
        snap.meta.trigger.as_ref().filter(|t| t.pid == pid)?;
        snap.meta
            .origin
            .as_ref()?
            .container_id
            .as_deref()
            .map(|id| id.get(..12).unwrap_or(id).to_owned())
    };
    match own.or_else(of_trigger) {
        Some(id) => format!("{comm} [{pid}] (container {id})"),
        None => format!("{comm} [{pid}]"),
    }
}

/// The functions of a trigger stack (leaf first), outermost first, as one line:
/// `main → run → __libc_open64 → do_syscall_64`.
fn stack_line(stack: &[StackFrameName]) -> String {
    let names: Vec<&str> = stack.iter().rev().map(|f| f.function.as_str()).collect();
    names.join(" → ")
}

/// One warning per module of `summary` most of whose frames have no name and that lacks
/// symbols: `83% of the frames in /usr/bin/x (412 of 496) have no name: stripped; ...`.
#[must_use]
pub fn symbol_warnings(summary: &TraceSummary) -> Vec<String> {
    summary
        .symbols
        .iter()
        .filter_map(|m| {
            let hint = m.hint.as_ref()?;
            Some(format!(
                "{}% of the frames in {} ({} of {}) have no name: {hint}",
                m.unknown_percent(),
                m.module,
                m.unknown,
                m.frames
            ))
        })
        .collect()
}

pub use crate::report::{OFF_CPU, UNTRACED};

/// An `[off-cpu]` slice over `span`: args say whether the thread was preempted (else it
/// blocked) and in which function (the innermost frame at the switch: for a blocking
/// syscall, its libc wrapper).
fn off_cpu_slice(
    sink: &mut impl TraceSink,
    key: (u32, u32),
    span: (u64, u64),
    preempted: bool,
    blocked_in: Option<&str>,
) -> io::Result<()> {
    let mut args = vec![Arg::new(
        "reason",
        ArgValue::Str(if preempted { "preempted" } else { "blocked" }),
    )];
    if let Some(name) = blocked_in {
        args.push(Arg::new("in", ArgValue::Str(name)));
    }
    sink.begin(key, span.0, OFF_CPU, &args)?;
    sink.end(key, span.1, OFF_CPU)
}

/// What went into a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceSummary {
    pub threads: usize,
    pub samples: u64,
    pub slices: u64,
    /// Addresses without a symbol.
    pub unknown_frames: u64,
    /// Sampled stacks cut at an address outside every executable mapping (heap, stack or
    /// data: a frame-pointer walk through a frame without one), that frame and all beyond
    /// it dropped.
    pub truncated_stacks: u64,
    /// The stack the kernel took at the trigger, symbolized, leaf first.
    pub trigger_stack: Vec<StackFrameName>,
    /// The probed function of a trigger fired while the call ran (`TriggerMeta::call`),
    /// symbolized: the call's name, which the leaf of `trigger_stack` is not.
    pub call_name: Option<String>,
    /// Frames and `[unknown]` frames per mapped file, with the hint to install debug
    /// symbols where most are unknown.
    pub symbols: Vec<crate::symbols::ModuleSymbols>,
    /// Sample records that could not be read.
    pub malformed_samples: u64,
    /// Samples the kernel reported lost (each loss is an instant `[lost samples]`); PT:
    /// sideband records lost.
    pub lost_samples: u64,
    /// PT: AUX records the kernel flagged truncated, partial or collided.
    pub lost_aux: u64,
    /// PT: branch events decoded.
    pub branches: u64,
    /// PT: decode errors (each a `[decode error: ...]` slice).
    pub decode_errors: u64,
    /// PT: the threads each ring was decoded on, and how its pieces went (all rings).
    pub decode_threads: usize,
    pub decode_pieces: ParallelStats,
    /// What the trigger's interval was spent on, and the verdict (a snapshot with a
    /// trigger on a thread).
    pub report: Option<Report>,
}

/// Writes the trace of `snap` to `path` (format and compression from the name), decoding
/// on one thread (the agent and `record`: their node's cores are the traced programs').
pub fn write_trace(snap: &Snapshot, path: &Path) -> Result<TraceSummary, WriterError> {
    write_trace_on(snap, path, 1)
}

/// [`write_trace`], decoding a PT snapshot's rings on `threads` threads (`lookback
/// decode`: the user's machine, every core); the trace is the same.
pub fn write_trace_on(
    snap: &Snapshot,
    path: &Path,
    threads: usize,
) -> Result<TraceSummary, WriterError> {
    let (format, gz) = Format::from_path(path);
    let tmp = temp_path(path);
    let err = |source| WriterError::Write {
        path: path.to_owned(),
        source,
    };
    let result = write_file(snap, &tmp, format, gz, threads).and_then(|summary| {
        fs::rename(&tmp, path)?;
        Ok(summary)
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(err)
}

fn temp_path(path: &Path) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map_or_else(|| "trace".to_owned(), |n| n.to_string_lossy().into_owned());
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.tmp-{}-{seq}", std::process::id()))
}

/// Bytes handed to the gzip encoder at a time.
const GZ_CHUNK: usize = 256 << 10;

fn write_file(
    snap: &Snapshot,
    tmp: &Path,
    format: Format,
    gz: bool,
    threads: usize,
) -> io::Result<TraceSummary> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(tmp)?;
    // Large writes: a PT trace is tens of MB, and each `write` into the page cache of a VM
    // costs ~30 µs (9,000 of them were 0.3 s of a 4 MiB snapshot's decode with 8 KiB).
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let summary = if gz {
        // Level 1: a PT trace has a slice per call (75 MB of FXT for a 4 MiB snapshot);
        // level 6 took 1.9 s instead of 1.2 s to compress that, for a file 21% smaller.
        // The encoders write a record (8–40 bytes) at a time; gzip fed that directly spent
        // more time in per-call CRC and deflate setup than compressing: batch it.
        let mut enc =
            BufWriter::with_capacity(GZ_CHUNK, GzEncoder::new(&mut out, Compression::fast()));
        let summary = encode_on(snap, &mut enc, format, threads)?;
        enc.into_inner()
            .map_err(io::IntoInnerError::into_error)?
            .finish()?;
        summary
    } else {
        encode_on(snap, &mut out, format, threads)?
    };
    let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.sync_all()?;
    Ok(summary)
}

/// Encodes the trace of `snap` into `out` in `format`.
pub fn encode<W: Write>(snap: &Snapshot, out: W, format: Format) -> io::Result<TraceSummary> {
    encode_on(snap, out, format, 1)
}

/// [`encode`], decoding a PT snapshot on `threads` threads.
fn encode_on<W: Write>(
    snap: &Snapshot,
    out: W,
    format: Format,
    threads: usize,
) -> io::Result<TraceSummary> {
    match format {
        Format::Fxt => emit_reported(snap, &mut FxtWriter::new(out)?, threads),
        Format::ChromeJson => emit_reported(snap, &mut JsonWriter::new(out)?, threads),
        Format::Speedscope => emit_reported(snap, &mut SpeedscopeWriter::new(out), threads),
    }
}

/// [`emit`] into `sink` and [`TraceSink::finish`] it, with the trigger thread's events
/// teed into a report collector: the summary carries the report.
fn emit_reported(
    snap: &Snapshot,
    sink: &mut impl TraceSink,
    threads: usize,
) -> io::Result<TraceSummary> {
    let mut tee = tee::Tee::new(sink, snap, report::Options::default());
    let mut summary = emit(snap, &mut tee, threads)?;
    summary.report = tee.report(snap, &summary);
    tee.finish()?;
    Ok(summary)
}

/// The report of `snap` without writing a trace: its events go to the report collector
/// only (`lookback report SNAPSHOT`). `None` when the snapshot has no trigger on a thread.
///
/// # Errors
/// None in practice (no file is written); the sink's signature has them.
pub fn report_of(
    snap: &Snapshot,
    threads: usize,
    options: report::Options,
) -> io::Result<Option<Report>> {
    let mut null = tee::NullSink;
    let mut tee = tee::Tee::new(&mut null, snap, options);
    let summary = emit(snap, &mut tee, threads)?;
    Ok(tee.report(snap, &summary))
}

/// The sample period: from the frequency, else the median gap between samples, else 1 ms.
fn period_ns(snap: &Snapshot, threads: &[&ThreadSamples]) -> u64 {
    if let Some(hz) = snap.meta.recorder.sample_frequency.filter(|&hz| hz > 0) {
        return (1_000_000_000 / hz).max(1);
    }
    let mut gaps: Vec<u64> = threads
        .iter()
        .flat_map(|t| t.stacks.windows(2).map(|w| w[1].time_ns - w[0].time_ns))
        .filter(|&g| g > 0)
        .collect();
    gaps.sort_unstable();
    gaps.get(gaps.len() / 2).copied().unwrap_or(1_000_000)
}

/// A frame of a stack: the symbol, and the address it was sampled at.
#[derive(Debug, Clone)]
struct At {
    frame: Rc<Frame>,
    addr: u64,
}

/// Feeds the whole trace of `snap` to `sink` (without [`TraceSink::finish`]).
/// `threads`: how many a PT snapshot's decode may use.
pub fn emit(
    snap: &Snapshot,
    sink: &mut impl TraceSink,
    threads: usize,
) -> io::Result<TraceSummary> {
    let summary = match snap.meta.backend {
        Backend::IntelPt => pt::emit(snap, sink, threads),
        Backend::Sampling => emit_sampled(snap, sink),
    }?;
    trigger_call(snap, sink, &summary)?;
    Ok(summary)
}

/// The bit that makes a thread id the track of its trigger's call: Linux thread ids stay
/// below 2^22 (`PID_MAX_LIMIT`), so no real thread has it.
pub const CALL_TRACK: u32 = 1 << 30;

/// A latency trigger's call, exact: one slice from the kernel's entry timestamp to its
/// return (`trigger_time_ns − duration_ns` to `trigger_time_ns`, both `bpf_ktime_get_ns`),
/// on a track of its own beside the thread's (`comm [pid] [tid] trigger call`, thread id
/// `tid | CALL_TRACK`): the sampled slices there begin and end at samples, this one at
/// the call's own edges, and one track cannot hold both nested. Named after the probed
/// function (the trigger stack's leaf) or `syscall NAME`.
fn trigger_call(
    snap: &Snapshot,
    sink: &mut impl TraceSink,
    summary: &TraceSummary,
) -> io::Result<()> {
    let Some(t) = snap.meta.trigger.as_ref().filter(|t| t.pid != 0) else {
        return Ok(());
    };
    let Some(duration) = t.duration_ns.filter(|_| report::is_latency_kind(&t.kind)) else {
        return Ok(());
    };
    let name = if let Some(name) = &summary.call_name {
        name.clone()
    } else if t.kind == "function" {
        summary
            .trigger_stack
            .iter()
            .find(|f| !crate::sys::is_kernel_address(f.address))
            .map_or_else(|| t.rule.clone(), |f| f.function.clone())
    } else {
        let syscall = report::syscall_of_detail(&t.detail).unwrap_or("?");
        if syscall.starts_with("syscall ") {
            syscall.to_owned()
        } else {
            format!("syscall {syscall}")
        }
    };
    let key = (t.pid, t.tid | CALL_TRACK);
    let comm = if t.comm.is_empty() { "?" } else { &t.comm };
    sink.thread(
        key.0,
        key.1,
        &format!("{comm} [{}] [{}] trigger call", t.pid, t.tid),
    )?;
    let args = [
        Arg::new("rule", ArgValue::Str(&t.rule)),
        Arg::new("duration_ns", ArgValue::U64(duration)),
        Arg::new("tid", ArgValue::U64(u64::from(t.tid))),
        Arg::new("timed_by", ArgValue::Str(timed_by(t))),
    ];
    sink.begin(
        key,
        t.trigger_time_ns.saturating_sub(duration),
        &name,
        &args,
    )?;
    sink.end(key, t.trigger_time_ns, &name)
}

fn emit_sampled(snap: &Snapshot, sink: &mut impl TraceSink) -> io::Result<TraceSummary> {
    let mut unwinder = StackUnwinder::for_snapshot(snap);
    let mut symbols = Symbolizer::new(&snap.maps, &snap.code, &snap.meta.debug_dirs)
        .with_debuginfod(&snap.meta.debuginfod)
        .with_kernel_symbols(&snap.meta.kernel_symbols)
        .with_perf_maps(&snap.perf_maps);
    let sampled = samples::read_named(
        snap,
        &mut |pid, regs, stack| unwinder.unwind(pid, regs, stack),
        &mut |pid, addr| symbols.frame(pid, addr).unknown.is_none(),
    );
    let threads: Vec<&ThreadSamples> = sampled.threads.values().collect();
    let mut summary = TraceSummary {
        threads: threads.len(),
        malformed_samples: sampled.malformed,
        ..TraceSummary::default()
    };
    summary.trigger_stack = trigger_stack(snap, &mut symbols);
    summary.call_name = call_name(snap, &mut symbols);
    let ctx = Context {
        snap,
        period_ns: period_ns(snap, &threads),
        trigger: snap.meta.trigger.as_ref().filter(|t| t.pid != 0),
        trigger_stack: stack_line(&summary.trigger_stack),
    };
    let mut named = std::collections::BTreeSet::new();
    for thread in &threads {
        if named.insert(thread.pid) {
            let comm = ctx.comm_of(thread.pid).unwrap_or_else(|| "?".to_owned());
            sink.process(thread.pid, &process_track_name(snap, thread.pid, &comm))?;
        }
    }
    for thread in &threads {
        emit_thread(&ctx, sink, thread, &mut symbols, &mut summary)?;
    }
    for loss in &sampled.losses {
        summary.lost_samples += loss.count;
        lost_instant(sink, snap, loss, threads.first().map(|t| (t.pid, t.tid)))?;
    }
    let sampled_trigger_thread =
        |t: &TriggerMeta| threads.iter().any(|th| (th.pid, th.tid) == (t.pid, t.tid));
    if let Some(t) = ctx.trigger.filter(|t| !sampled_trigger_thread(t)) {
        // The trigger thread was never sampled: give it its own track.
        let comm = if t.comm.is_empty() { "?" } else { &t.comm };
        sink.thread(t.pid, t.tid, &format!("{comm} [{}] [{}]", t.pid, t.tid))?;
        trigger_instant(sink, t, &ctx.trigger_stack)?;
    }
    summary.unknown_frames = symbols.misses;
    summary.symbols = symbols.module_report();
    Ok(summary)
}

/// What every thread's part of the trace needs from the snapshot.
struct Context<'a> {
    snap: &'a Snapshot,
    period_ns: u64,
    /// The trigger, when it names a thread.
    trigger: Option<&'a TriggerMeta>,
    /// Its stack's functions, for its instant ([`stack_line`]).
    trigger_stack: String,
}

impl Context<'_> {
    fn comm_of(&self, pid: u32) -> Option<String> {
        self.snap
            .maps
            .iter()
            .find(|m| m.pid == pid)
            .map(|m| m.comm.clone())
            .filter(|c| !c.is_empty())
    }
}

/// The symbolized stacks of `thread`, outermost frame first, each only as far out from
/// the leaf as its addresses are code (see [`code_frames`]); the stacks cut short are
/// counted in `truncated`.
fn symbolized(
    thread: &ThreadSamples,
    symbols: &mut Symbolizer<'_>,
    truncated: &mut u64,
) -> Vec<StackSample<At>> {
    thread
        .stacks
        .iter()
        .map(|s| {
            // Without the process's maps every address is kept (and named `[unknown]`).
            let (addrs, cut) = code_frames(&s.addrs, |addr| {
                symbols.is_code(thread.pid, addr).unwrap_or(true)
            });
            *truncated += u64::from(cut);
            StackSample {
                time_ns: s.time_ns,
                off_cpu: s.off_cpu.map(|off| (off.until_ns, off.preempted)),
                frames: addrs
                    .iter()
                    .map(|&addr| (symbols.frame(thread.pid, addr), addr))
                    .flat_map(|(frame, addr)| expand(&frame, addr))
                    .collect(),
            }
        })
        .collect()
}

/// Addresses below which a stack entry is a walk's terminator (a null frame pointer's
/// return address, small integers), not a frame someone lost.
const NOT_AN_ADDRESS: u64 = 0x1000;

/// The frames of a sampled stack (`addrs` outermost first) that are real code: from the
/// leaf outwards, up to the first address `is_code` refuses, which ends the stack. Returns
/// them (outermost first) and whether a real-looking address ended it (not the walk's
/// terminator: 0 or a small number outermost).
fn code_frames(addrs: &[u64], is_code: impl Fn(u64) -> bool) -> (&[u64], bool) {
    let Some(stop) = addrs.iter().rposition(|&addr| !is_code(addr)) else {
        return (addrs, false);
    };
    let cut = addrs[..=stop].iter().any(|&addr| addr >= NOT_AN_ADDRESS);
    (&addrs[stop + 1..], cut)
}

/// One thread's track: its name, its slices, and the trigger instant when it is the
/// trigger's thread.
fn emit_thread(
    ctx: &Context<'_>,
    sink: &mut impl TraceSink,
    thread: &ThreadSamples,
    symbols: &mut Symbolizer<'_>,
    summary: &mut TraceSummary,
) -> io::Result<()> {
    let key = (thread.pid, thread.tid);
    let comm = thread
        .comm
        .clone()
        .or_else(|| ctx.comm_of(thread.pid))
        .unwrap_or_else(|| "?".to_owned());
    sink.thread(key.0, key.1, &format!("{comm} [{}] [{}]", key.0, key.1))?;
    let stacks = symbolized(thread, symbols, &mut summary.truncated_stacks);
    summary.samples += stacks.len() as u64;
    let events = stacks::slices(&stacks, ctx.period_ns, |a, b| a.frame.name == b.frame.name);
    let mut pending = ctx.trigger.filter(|t| (t.pid, t.tid) == key);
    let mut open: Vec<Rc<Frame>> = Vec::new();
    for event in events {
        let ts = match &event {
            StackEvent::Begin { ts, .. }
            | StackEvent::End { ts }
            | StackEvent::Gap { start: ts, .. }
            | StackEvent::OffCpu { start: ts, .. } => *ts,
        };
        if let Some(t) = pending.filter(|t| t.trigger_time_ns < ts) {
            trigger_instant(sink, t, &ctx.trigger_stack)?;
            pending = None;
        }
        match event {
            StackEvent::Begin { ts, frame } => {
                summary.slices += 1;
                begin(sink, key, ts, &frame)?;
                open.push(frame.frame);
            }
            StackEvent::End { ts } => {
                let name = open.pop().map(|f| f.name.clone()).unwrap_or_default();
                sink.end(key, ts, &name)?;
            }
            StackEvent::Gap { start, end } => {
                sink.begin(key, start, UNTRACED, &[])?;
                sink.end(key, end, UNTRACED)?;
            }
            StackEvent::OffCpu {
                start,
                end,
                preempted,
            } => {
                let blocked_in = open.last().map(|f| f.name.as_str());
                off_cpu_slice(sink, key, (start, end), preempted, blocked_in)?;
            }
        }
    }
    match pending {
        Some(t) => trigger_instant(sink, t, &ctx.trigger_stack),
        None => Ok(()),
    }
}

/// The frame of an address and the frames inlined there, outermost first.
fn expand(frame: &Rc<Frame>, addr: u64) -> Vec<At> {
    let mut all = vec![At {
        frame: Rc::clone(frame),
        addr,
    }];
    all.extend(frame.inlined.iter().map(|f| At {
        frame: Rc::new(f.clone()),
        addr,
    }));
    all
}

fn begin(sink: &mut impl TraceSink, key: (u32, u32), ts: u64, at: &At) -> io::Result<()> {
    let mut args = vec![Arg::new("address", ArgValue::Pointer(at.addr))];
    if let Some(loc) = &at.frame.location {
        args.push(Arg::new("location", ArgValue::Str(loc)));
    }
    if let Some(module) = &at.frame.module {
        args.push(Arg::new("module", ArgValue::Str(module)));
    }
    sink.begin(key, ts, &at.frame.name, &args)
}

/// An instant `[lost samples]` on the loss's thread (else `fallback`'s), at its time (else
/// the window's start).
fn lost_instant(
    sink: &mut impl TraceSink,
    snap: &Snapshot,
    loss: &samples::Loss,
    fallback: Option<(u32, u32)>,
) -> io::Result<()> {
    let Some(thread) = loss.thread.or(fallback) else {
        return Ok(());
    };
    let ts = loss
        .time_ns
        .or(snap.meta.window_start_ns)
        .unwrap_or(snap.meta.freeze_time_ns);
    sink.instant(
        thread,
        ts,
        "[lost samples]",
        &[Arg::new("lost", ArgValue::U64(loss.count))],
    )
}

/// The trigger's instant; `stack`: its stack's functions ([`stack_line`]), an arg when
/// not empty.
fn trigger_instant(sink: &mut impl TraceSink, t: &TriggerMeta, stack: &str) -> io::Result<()> {
    let mut args = vec![
        Arg::new("rule", ArgValue::Str(&t.rule)),
        Arg::new("kind", ArgValue::Str(&t.kind)),
        Arg::new("detail", ArgValue::Str(&t.detail)),
        Arg::new("pid", ArgValue::U64(u64::from(t.pid))),
        Arg::new("tid", ArgValue::U64(u64::from(t.tid))),
    ];
    if let Some(d) = t.duration_ns {
        args.push(Arg::new("duration_ns", ArgValue::U64(d)));
    }
    if !stack.is_empty() {
        args.push(Arg::new("stack", ArgValue::Str(stack)));
    }
    sink.instant(
        (t.pid, t.tid),
        t.trigger_time_ns,
        &format!("trigger: {}", t.rule),
        &args,
    )
}

#[cfg(test)]
pub(crate) mod pt_tests;
#[cfg(test)]
mod tests;
