//! The recording half of `run`/`attach`: a recorder on the targets, frozen on each trigger
//! (after `post_trigger`), its snapshot written next to `-o`, then resumed.
//!
//! Until the trace writer exists (decode → stacks → symbols → writer), every snapshot is
//! written as the raw `.lbsnap` bundle; `lookback decode` will turn it into a trace.
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    capture::{CaptureOptions, Recorder, monotonic_ns, open_recorder},
    snapshot::{self, Snapshot, TriggerMeta},
    triggers::{TriggerEvent, TriggerKind, event::format_ns},
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

    /// How long to keep recording after a trigger.
    pub fn post_trigger(&self) -> Duration {
        self.opts.post_trigger
    }

    /// Freezes, writes the snapshot for `trigger` (`None`: at exit or on Ctrl-C), resumes.
    pub fn snapshot(&mut self, trigger: Option<(&str, &TriggerEvent)>) -> anyhow::Result<Written> {
        let data = self.recorder.freeze().context("freezing the recorder")?;
        let meta = match trigger {
            Some((rule, event)) => trigger_meta(rule, event),
            None => TriggerMeta {
                rule: "manual".to_owned(),
                kind: "manual".to_owned(),
                detail: "end of recording (exit or interrupt)".to_owned(),
                pid: 0,
                tid: 0,
                comm: String::new(),
                trigger_time_ns: monotonic_ns(),
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
        resumed.context("resuming the recorder")?;
        Ok(Written {
            snapshot: path,
            trigger_to_freeze_ns: snap.meta.trigger_to_freeze_ns,
        })
    }
}

/// What one snapshot produced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Written {
    /// The `.lbsnap` bundle.
    pub snapshot: PathBuf,
    /// Kernel trigger timestamp to the rings stopping.
    pub trigger_to_freeze_ns: Option<u64>,
}

fn trigger_meta(rule: &str, event: &TriggerEvent) -> TriggerMeta {
    let kind = match event.kind {
        TriggerKind::Function => "function",
        TriggerKind::Syscall => "syscall",
        TriggerKind::Signal => "signal",
    };
    TriggerMeta {
        rule: rule.to_owned(),
        kind: kind.to_owned(),
        detail: event.detail(),
        pid: event.pid,
        tid: event.tid,
        comm: event.comm.clone(),
        trigger_time_ns: event.timestamp_ns,
    }
}

/// `trace.fxt.gz` → `trace.lbsnap`; the n-th (n ≥ 2) → `trace-n.lbsnap`.
pub fn numbered(output: &Path, n: u32) -> PathBuf {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = [".fxt.gz", ".json.gz", ".json", ".fxt", ".lbsnap"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext))
        .unwrap_or(&name);
    let stem = if stem.is_empty() { "trace" } else { stem };
    let file = if n <= 1 {
        format!("{stem}.lbsnap")
    } else {
        format!("{stem}-{n}.lbsnap")
    };
    output.with_file_name(file)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::numbered;

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
