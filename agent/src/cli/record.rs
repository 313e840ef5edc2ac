//! The recording half of `run`/`attach`: a recorder on the targets, frozen on each trigger
//! (after `post_trigger`), its snapshot written next to `-o`, then resumed.
//!
//! Each snapshot is first written as the raw `.lbsnap` bundle, then turned into the trace
//! file at `-o` (decode → stacks → symbols → writer; numbered `trace.fxt.gz`,
//! `trace-2.fxt.gz`, ...); the `.lbsnap` stays only with `--keep-raw`, or when no trace
//! could be written, so `lookback decode` can retry later.
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    capture::{CaptureOptions, Recorder, monotonic_ns, open_recorder},
    snapshot::{self, Snapshot, TriggerMeta},
    triggers::{TriggerEvent, event::format_ns},
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
}

impl Recording {
    /// Starts recording `pids` (threads and children follow).
    pub fn start(opts: RecordOptions, pids: &[u32]) -> anyhow::Result<Self> {
        let recorder = open_recorder(&opts.capture, pids).context("starting the recorder")?;
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
        })
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
        let data = self.recorder.freeze().context("freezing the recorder")?;
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
