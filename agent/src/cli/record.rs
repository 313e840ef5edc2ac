//! The recording half of `run`/`attach`: a recorder on the targets, frozen on each trigger
//! (after `post_trigger`), its snapshot written next to `-o`, then resumed.
//!
//! Each snapshot is first written as the raw `.lbsnap` bundle, then turned into the trace
//! file at `-o` (decode → stacks → symbols → writer; numbered `trace.fxt.gz`,
//! `trace-2.fxt.gz`, ...); the `.lbsnap` stays only with `--keep-raw`, or when no trace
//! could be written, so `lookback decode` can retry later.
//!
//! Only the copy happens at the trigger (then the process is unfrozen and the rings run
//! again); the files are written on a background thread (`write_queue`), in trigger order,
//! so a trigger that comes while an earlier trace is being written is frozen and copied
//! on time.
use std::{
    os::fd::BorrowedFd,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

use super::write_queue::WriteQueue;
use crate::{
    capture::{CaptureOptions, Recorder, monotonic_ns, open_recorder_filtered},
    snapshot::{self, Snapshot, TriggerMeta},
    triggers::{
        TriggerEvent,
        engine::{FrozenProcesses, kernel_freeze},
        event::format_ns,
    },
    writer,
};

/// How to record and where snapshots go.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub capture: CaptureOptions,
    /// `-o`: the trace file path; snapshots take its stem (`trace.fxt.gz` → `trace.lbsnap`,
    /// then `trace-2.lbsnap`, ...).
    pub output: PathBuf,
    /// Keep recording this long after a trigger before freezing.
    pub post_trigger: Duration,
    /// Keep the `.lbsnap` next to the trace.
    pub keep_raw: bool,
    /// Extra debug directories for the traces' symbols (`--debug-dir`, the rules'
    /// `debug_dirs:`).
    pub debug_dirs: Vec<PathBuf>,
    /// debuginfod servers for the traces' symbols (`--no-debuginfod`, the rules'
    /// `debuginfod:`, `DEBUGINFOD_URLS`).
    pub debuginfod: crate::elf::debuginfod::Servers,
}

/// The files one snapshot left on disk.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotFiles {
    /// The trace file, when one was written.
    pub trace: Option<PathBuf>,
    /// The raw snapshot, when kept.
    pub raw: Option<PathBuf>,
    /// Kernel trigger timestamp to the rings stopping, when there was a trigger.
    pub trigger_to_freeze_ns: Option<u64>,
    /// Frames and `[unknown]` frames per mapped file of the trace (with the hint to
    /// install debug symbols where most are unknown).
    pub symbols: Vec<crate::symbols::ModuleSymbols>,
    /// The report's one line: where the trigger's interval went.
    pub verdict: Option<String>,
}

/// Snapshots copied and not yet written at most (each holds a copy of every ring: up to
/// `--buffer-size` × CPUs). A trigger beyond is dropped, counted and reported, not waited
/// for: waiting would hold the triggering process frozen (its samples dropped in the
/// kernel) and the rings paused until a trace file is written, losing the very samples a
/// later snapshot would show — perf and magic-trace likewise skip a trigger that comes
/// while they are busy rather than stall the target. At exit nothing is dropped: the
/// last triggers wait for room.
const MAX_IN_FLIGHT: usize = 4;

/// One copied snapshot on its way to disk.
pub struct WriteJob {
    pub snap: Snapshot,
    /// 1 for the first snapshot of the session: decides the file names.
    pub number: u32,
    /// The rule and trigger it was taken for; `None` at exit or on Ctrl-C.
    pub trigger: Option<(String, TriggerEvent)>,
}

/// Called on the writer thread after each snapshot's files are written, in order.
pub type OnWritten = Box<dyn FnMut(&WriteJob, &SnapshotFiles) + Send>;

/// What to do with a trigger when [`MAX_IN_FLIGHT`] snapshots wait to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Unfreeze and resume at once; the trigger is counted as dropped.
    Drop,
    /// Wait for room (at exit: nothing is held any more that waiting could harm).
    Wait,
}

/// A live recorder and the snapshots taken so far.
pub struct Recording {
    recorder: Box<dyn Recorder>,
    opts: RecordOptions,
    /// Snapshots copied (and queued for writing) so far.
    taken: u32,
    /// Triggers dropped because the writer was [`MAX_IN_FLIGHT`] behind.
    dropped: u64,
    /// Writes each snapshot's files on a background thread, in order.
    queue: WriteQueue<WriteJob>,
    /// Whether the recorder runs the engine's `sample_filter` on its samples.
    filtered: bool,
    /// The processes the kernel froze at their trigger, when the rules do that.
    frozen: Option<FrozenProcesses>,
}

impl Recording {
    /// Starts recording `pids` (threads and children follow). `sample_filter`: the trigger
    /// engine's program, set on the recorder's samples when it takes it (sampling backend)
    /// and the snapshots are taken at once (no `post_trigger`). `on_written` runs after each
    /// snapshot's files are on disk.
    pub fn start(
        opts: RecordOptions,
        pids: &[u32],
        sample_filter: Option<BorrowedFd<'_>>,
        mut on_written: OnWritten,
    ) -> anyhow::Result<Self> {
        let sample_filter = sample_filter.filter(|_| opts.post_trigger.is_zero());
        let opened = match sample_filter {
            // A kernel that refuses the filter still records; only the freeze is later.
            Some(filter) => {
                open_recorder_filtered(&opts.capture, pids, Some(filter)).or_else(|e| {
                    log::warn!(
                        "recording without the in-kernel freeze: {:#}",
                        anyhow::Error::from(e)
                    );
                    open_recorder_filtered(&opts.capture, pids, None)
                })
            }
            None => open_recorder_filtered(&opts.capture, pids, None),
        };
        let (recorder, filtered) = opened.context("starting the recorder")?;
        log::info!(
            "recording with {} ({}), {} per ring",
            recorder.backend().as_str(),
            recorder.params().event,
            crate::rules::format_size(opts.capture.buffer_size as u64)
        );
        let (output, keep_raw) = (opts.output.clone(), opts.keep_raw);
        let queue = WriteQueue::start(
            "lookback-writer",
            MAX_IN_FLIGHT,
            Box::new(move |mut job: WriteJob| {
                // On the writer thread, not the freeze path: it reads the unwind tables
                // of the process's files (tens of ms) while the rings are paused.
                let copy = job
                    .trigger
                    .as_ref()
                    .and_then(|(_, e)| e.stack_copy.as_ref());
                crate::unwind::complete_trigger_stack(&mut job.snap, copy);
                let files = write_snapshot(&output, keep_raw, &job)?;
                on_written(&job, &files);
                Ok(())
            }),
        )?;
        Ok(Self {
            recorder,
            opts,
            taken: 0,
            dropped: 0,
            queue,
            filtered,
            frozen: None,
        })
    }

    /// Whether the recorder drops the samples of processes the kernel froze at a trigger
    /// (then hand the engine's `FROZEN` map over with [`set_frozen`](Self::set_frozen)).
    pub fn filters_in_kernel(&self) -> bool {
        self.filtered
    }

    /// The engine's `FROZEN` map: each snapshot reads its process's freeze time there and
    /// removes the process, so that its samples are recorded again.
    pub fn set_frozen(&mut self, frozen: FrozenProcesses) {
        self.frozen = Some(frozen);
    }

    /// Lets the recorder drain its sideband (PT); cheap, call it often.
    pub fn poll(&mut self) {
        if let Err(e) = self.recorder.poll() {
            log::warn!("recorder: {e:#}");
        }
    }

    /// The recorder's freeze switch (for the trigger pump).
    pub fn freeze_switch(&self) -> Option<std::sync::Arc<crate::capture::freeze::FreezeSwitch>> {
        self.recorder.freeze_switch()
    }

    /// How long to keep recording after a trigger.
    pub fn post_trigger(&self) -> Duration {
        self.opts.post_trigger
    }

    /// Triggers dropped so far because snapshots were still being written.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Takes the snapshot for `trigger` (`None`: at exit or on Ctrl-C): copies the rings,
    /// unfreezes the process, resumes, and queues the files for the writer thread. Returns
    /// whether a snapshot was taken (`false`: dropped, the writer being behind). Fails when
    /// an earlier snapshot could not be written, as the session then stops.
    pub fn snapshot(
        &mut self,
        trigger: Option<(&str, &TriggerEvent)>,
        when_full: WhenFull,
    ) -> anyhow::Result<bool> {
        if let Some(e) = self.queue.take_error() {
            return Err(e);
        }
        if !self.queue.has_room() {
            if when_full == WhenFull::Drop {
                self.drop_trigger(trigger);
                return Ok(false);
            }
            self.queue.wait_for_room();
        }
        let snap = self.capture(trigger)?;
        let resumed = self.recorder.resume();
        self.taken += 1;
        log::info!(
            "snapshot {}: {} bytes of {} data, trigger to freeze {}; {} being written",
            self.taken,
            snap.raw_bytes(),
            snap.meta.backend.as_str(),
            snap.meta
                .trigger_to_freeze_ns
                .map_or_else(|| "-".to_owned(), format_ns),
            self.queue.in_flight()
        );
        self.queue.push(WriteJob {
            snap,
            number: self.taken,
            trigger: trigger.map(|(rule, event)| (rule.to_owned(), event.clone())),
        })?;
        resumed.context("resuming the recorder")?;
        Ok(true)
    }

    /// Writes every queued snapshot and stops the writer thread; returns the first failure.
    pub fn finish(self) -> anyhow::Result<()> {
        self.queue.finish()
    }

    /// Copies the rings for `trigger` and, when the kernel froze its process, reads the
    /// freeze time and lets the process be sampled again.
    fn capture(&mut self, trigger: Option<(&str, &TriggerEvent)>) -> anyhow::Result<Snapshot> {
        let mut data = self.recorder.freeze().context("freezing the recorder")?;
        if let (Some((_, event)), Some(frozen)) = (trigger, self.frozen.as_mut()) {
            // The rings are copied: the process may record again once they resume.
            let at = frozen.frozen_at(event.pid);
            log::debug!(
                "process {} frozen in the kernel at {at:?}, trigger at {}, rings paused at {}",
                event.pid,
                event.timestamp_ns,
                data.freeze_time_ns
            );
            if let Err(e) = frozen.thaw(event.pid) {
                log::warn!("unfreezing process {}: {e:#}", event.pid);
            }
            if let Some(at) = kernel_freeze(event.timestamp_ns, at, data.freeze_time_ns) {
                data.freeze_time_ns = at;
            }
        }
        let meta = match trigger {
            Some((rule, event)) => TriggerMeta::from_event(rule, event),
            None => TriggerMeta {
                rule: "manual".to_owned(),
                kind: "manual".to_owned(),
                detail: "end of recording (exit or interrupt)".to_owned(),
                pid: 0,
                tid: 0,
                comm: String::new(),
                trigger_time_ns: monotonic_ns(),
                duration_ns: None,
                stack: Vec::new(),
                kernel_stack: Vec::new(),
                call: None,
            },
        };
        let mut snap = Snapshot::from_captured(data, Some(meta));
        snap.meta.debug_dirs.clone_from(&self.opts.debug_dirs);
        snap.meta.debuginfod.clone_from(&self.opts.debuginfod);
        Ok(snap)
    }

    /// Lets go of a trigger that gets no snapshot: its process is sampled again and the
    /// rings the trigger thread paused run again.
    fn drop_trigger(&mut self, trigger: Option<(&str, &TriggerEvent)>) {
        self.dropped += 1;
        let rule = trigger.map_or("manual", |(rule, _)| rule);
        log::warn!(
            "trigger {rule}: {} snapshots are still being written; trigger dropped ({} so far)",
            self.queue.in_flight(),
            self.dropped
        );
        if let (Some((_, event)), Some(frozen)) = (trigger, self.frozen.as_mut())
            && let Err(e) = frozen.thaw(event.pid)
        {
            log::warn!("unfreezing process {}: {e:#}", event.pid);
        }
        if self
            .recorder
            .freeze_switch()
            .is_some_and(|s| s.frozen_at().is_some())
            && let Err(e) = self.recorder.resume()
        {
            log::warn!("resuming the recorder: {:#}", anyhow::Error::from(e));
        }
    }
}

/// Writes one snapshot's files (on the writer thread): the `.lbsnap`, then the trace,
/// after which the `.lbsnap` is removed unless it is to be kept or no trace was written.
fn write_snapshot(output: &Path, keep_raw: bool, job: &WriteJob) -> anyhow::Result<SnapshotFiles> {
    let path = numbered(output, job.number);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    snapshot::write_atomic(&path, &job.snap)
        .with_context(|| format!("writing {}", path.display()))?;
    // Named at info level only where it stays (kept, or the trace could not be written).
    log::debug!("snapshot {}: {}", job.number, path.display());
    let files = write_trace(output, keep_raw, job, path);
    Ok(SnapshotFiles {
        trigger_to_freeze_ns: job.snap.meta.trigger_to_freeze_ns,
        ..files
    })
}

/// Writes the trace of `job` (the `.lbsnap` at `raw` is already on disk) and removes `raw`
/// unless it is to be kept or no trace could be written.
fn write_trace(output: &Path, keep_raw: bool, job: &WriteJob, raw: PathBuf) -> SnapshotFiles {
    let files = |trace, raw| SnapshotFiles {
        trace,
        raw,
        trigger_to_freeze_ns: None,
        symbols: Vec::new(),
        verdict: None,
    };
    if raw_only(output) {
        log::info!("snapshot {}: {}", job.number, raw.display());
        return files(None, Some(raw));
    }
    let trace = numbered_trace(output, job.number);
    let started = std::time::Instant::now();
    match writer::write_trace(&job.snap, &trace) {
        Ok(summary) => {
            log::info!(
                "trace {}: {} threads, {} samples, {} branches, {} slices, {} unknown frames, {} stacks cut at a non-code address, written in {:.1?}",
                trace.display(),
                summary.threads,
                summary.samples,
                summary.branches,
                summary.slices,
                summary.unknown_frames,
                summary.truncated_stacks,
                started.elapsed()
            );
            for warning in writer::symbol_warnings(&summary) {
                log::warn!("trace {}: {warning}", trace.display());
            }
            let verdict = summary.report.map(|r| r.verdict);
            if let Some(v) = &verdict {
                log::info!("trace {}: {v}", trace.display());
            }
            let kept = if keep_raw {
                log::info!("snapshot {}: {}", job.number, raw.display());
                Some(raw)
            } else {
                if let Err(e) = std::fs::remove_file(&raw) {
                    log::warn!("removing {}: {e}", raw.display());
                }
                None
            };
            SnapshotFiles {
                symbols: summary.symbols,
                verdict,
                ..files(Some(trace), kept)
            }
        }
        Err(e) => {
            log::error!(
                "{:#}; the raw snapshot {} is kept",
                anyhow::Error::new(e),
                raw.display()
            );
            files(None, Some(raw))
        }
    }
}

/// The stem and the extension (with its dot, possibly empty) of a trace path's name.
fn split_name(output: &Path) -> (String, &'static str) {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (stem, ext) = [
        ".fxt.gz",
        ".speedscope.json",
        ".json.gz",
        ".json",
        ".fxt",
        ".lbsnap",
    ]
    .iter()
    .find_map(|ext| name.strip_suffix(ext).map(|s| (s.to_owned(), *ext)))
    .unwrap_or_else(|| (name.clone(), ""));
    let stem = if stem.is_empty() {
        "trace".to_owned()
    } else {
        stem
    };
    (stem, ext)
}

/// `trace.fxt.gz` → `trace.lbsnap`; the n-th (n ≥ 2) → `trace-n.lbsnap`.
pub fn numbered(output: &Path, n: u32) -> PathBuf {
    let (stem, _) = split_name(output);
    let file = if n <= 1 {
        format!("{stem}.lbsnap")
    } else {
        format!("{stem}-{n}.lbsnap")
    };
    output.with_file_name(file)
}

/// `-o x.lbsnap`: raw snapshots only, no trace files.
fn raw_only(output: &Path) -> bool {
    output
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("lbsnap"))
}

/// The n-th trace file: `trace.fxt.gz` itself, then `trace-2.fxt.gz`, ...
pub fn numbered_trace(output: &Path, n: u32) -> PathBuf {
    if n <= 1 {
        return output.to_owned();
    }
    let (stem, ext) = split_name(output);
    output.with_file_name(format!("{stem}-{n}{ext}"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{numbered, numbered_trace, raw_only};

    #[test]
    fn an_lbsnap_output_means_snapshots_only() {
        assert!(raw_only(Path::new("/d/run.lbsnap")));
        assert!(!raw_only(Path::new("trace.fxt.gz")));
        assert!(!raw_only(Path::new("trace.json")));
    }

    #[test]
    fn trace_names_are_numbered_before_the_extension() {
        let p = Path::new("/d/trace.fxt.gz");
        assert_eq!(numbered_trace(p, 1), p);
        assert_eq!(numbered_trace(p, 2), Path::new("/d/trace-2.fxt.gz"));
        assert_eq!(
            numbered_trace(Path::new("x.json"), 3),
            Path::new("x-3.json")
        );
        assert_eq!(numbered_trace(Path::new("plain"), 2), Path::new("plain-2"));
    }

    #[test]
    fn snapshot_names_follow_the_output_path() {
        assert_eq!(
            numbered(Path::new("trace.fxt.gz"), 1),
            Path::new("trace.lbsnap")
        );
        assert_eq!(
            numbered(Path::new("/tmp/x/run.json"), 2),
            Path::new("/tmp/x/run-2.lbsnap")
        );
        assert_eq!(
            numbered(Path::new("out.lbsnap"), 3),
            Path::new("out-3.lbsnap")
        );
        assert_eq!(numbered(Path::new("plain"), 1), Path::new("plain.lbsnap"));
    }
}
