//! The recording half of `run`/`attach`: a recorder on the targets, frozen on each trigger
//! (after `post_trigger`), its snapshot written next to `-o`, then resumed.
//!
//! Each snapshot is first written as the raw `.lbsnap` bundle, then turned into the trace
//! file at `-o` (decode → stacks → symbols → writer; numbered `trace.fxt.gz`,
//! `trace-2.fxt.gz`, ...); the `.lbsnap` stays only with `--keep-raw`, or when no trace
//! could be written, so `lookback decode` can retry later.
use std::{
    os::fd::BorrowedFd,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    capture::{CaptureOptions, Recorder, monotonic_ns, open_recorder_filtered},
    snapshot::{self, Snapshot, TriggerMeta},
    triggers::{TriggerEvent, engine::FrozenProcesses, event::format_ns},
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
}

/// A live recorder and the snapshots written so far.
pub struct Recording {
    recorder: Box<dyn Recorder>,
    opts: RecordOptions,
    written: u32,
    /// Whether the recorder runs the engine's `sample_filter` on its samples.
    filtered: bool,
    /// The processes the kernel froze at their trigger, when the rules do that.
    frozen: Option<FrozenProcesses>,
}

impl Recording {
    /// Starts recording `pids` (threads and children follow). `sample_filter`: the trigger
    /// engine's program, set on the recorder's samples when it takes it (sampling backend)
    /// and the snapshots are taken at once (no `post_trigger`).
    pub fn start(
        opts: RecordOptions,
        pids: &[u32],
        sample_filter: Option<BorrowedFd<'_>>,
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
        Ok(Self {
            recorder,
            opts,
            written: 0,
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

    /// Freezes, writes the snapshot for `trigger` (`None`: at exit or on Ctrl-C), resumes.
    /// Returns the files written.
    pub fn snapshot(
        &mut self,
        trigger: Option<(&str, &TriggerEvent)>,
    ) -> anyhow::Result<SnapshotFiles> {
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
            },
        };
        let snap = Snapshot::from_captured(data, Some(meta));
        let resumed = self.recorder.resume();
        self.written += 1;
        let path = numbered(&self.opts.output, self.written);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        snapshot::write_atomic(&path, &snap)
            .with_context(|| format!("writing {}", path.display()))?;
        log::info!(
            "snapshot {}: {} bytes of {} data, trigger to freeze {}",
            path.display(),
            snap.raw_bytes(),
            snap.meta.backend.as_str(),
            snap.meta
                .trigger_to_freeze_ns
                .map_or_else(|| "-".to_owned(), format_ns)
        );
        let files = self.write_trace(&snap, path);
        resumed.context("resuming the recorder")?;
        Ok(SnapshotFiles {
            trigger_to_freeze_ns: snap.meta.trigger_to_freeze_ns,
            ..files
        })
    }

    /// Writes the trace of `snap` (the `.lbsnap` at `raw` is already on disk) and removes
    /// `raw` unless it is to be kept or no trace could be written.
    fn write_trace(&self, snap: &Snapshot, raw: PathBuf) -> SnapshotFiles {
        if raw_only(&self.opts.output) {
            return SnapshotFiles {
                trace: None,
                raw: Some(raw),
                trigger_to_freeze_ns: None,
            };
        }
        let trace = numbered_trace(&self.opts.output, self.written);
        let started = std::time::Instant::now();
        match writer::write_trace(snap, &trace) {
            Ok(summary) => {
                log::info!(
                    "trace {}: {} threads, {} samples, {} branches, {} slices, {} unknown frames, written in {:.1?}",
                    trace.display(),
                    summary.threads,
                    summary.samples,
                    summary.branches,
                    summary.slices,
                    summary.unknown_frames,
                    started.elapsed()
                );
                if self.opts.keep_raw {
                    return SnapshotFiles {
                        trace: Some(trace),
                        raw: Some(raw),
                        trigger_to_freeze_ns: None,
                    };
                }
                if let Err(e) = std::fs::remove_file(&raw) {
                    log::warn!("removing {}: {e}", raw.display());
                }
                SnapshotFiles {
                    trace: Some(trace),
                    raw: None,
                    trigger_to_freeze_ns: None,
                }
            }
            Err(e) => {
                log::error!(
                    "{:#}; the raw snapshot {} is kept",
                    anyhow::Error::new(e),
                    raw.display()
                );
                SnapshotFiles {
                    trace: None,
                    raw: Some(raw),
                    trigger_to_freeze_ns: None,
                }
            }
        }
    }
}

/// The stem and the extension (with its dot, possibly empty) of a trace path's name.
/// When the triggering process stopped being recorded: the kernel's freeze time of the
/// process (`FROZEN`) when it belongs to this trigger — not before it (a stale entry) and
/// not after the rings were paused (a later trigger of the same process overwrote it).
fn kernel_freeze(trigger_ns: u64, kernel_ns: Option<u64>, paused_ns: u64) -> Option<u64> {
    kernel_ns.filter(|&k| k >= trigger_ns && k <= paused_ns)
}

fn split_name(output: &Path) -> (String, &'static str) {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (stem, ext) = [".fxt.gz", ".json.gz", ".json", ".fxt", ".lbsnap"]
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

    use super::{kernel_freeze, numbered, numbered_trace, raw_only};

    #[test]
    fn the_kernel_freeze_counts_only_between_trigger_and_pause() {
        assert_eq!(kernel_freeze(1_000, Some(1_002), 90_000), Some(1_002));
        assert_eq!(kernel_freeze(1_000, Some(1_000), 1_000), Some(1_000));
        assert_eq!(kernel_freeze(1_000, None, 90_000), None, "not frozen");
        assert_eq!(kernel_freeze(1_000, Some(999), 90_000), None, "stale entry");
        assert_eq!(
            kernel_freeze(1_000, Some(90_001), 90_000),
            None,
            "a later trigger"
        );
    }

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
