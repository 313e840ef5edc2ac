//! The agent's output layout (contract.md, "Agent output"): for each snapshot of rule R,
//! `<dir>/R/<YYYYmmddTHHMMSS.ffffffZ>-<pid>-<tid>.fxt.gz` (or `.json.gz`), the raw `.lbsnap`
//! beside it when `keep_raw`, and `<stem>.json` with the trigger metadata.
//!
//! Every file is written to a temporary name, synced, and renamed (mode 0600), the metadata
//! last, so a reader that sees the `.json` sees complete files. When any file fails (disk
//! full, unwritable directory, undecodable data) the files of that snapshot already written
//! are removed again: a snapshot is complete or absent.
use std::{
    fs::{self, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::json;

use crate::{
    capture::held_files::HeldFile,
    rules::{OutputFormat, OutputPolicy},
    snapshot::{self, Snapshot, SnapshotError},
    triggers::{TriggerEvent, TriggerKind},
    writer::{self, WriterError},
};

/// One frozen snapshot on its way to disk.
pub struct SnapshotJob {
    pub rule: String,
    /// The output root; files go to `root/<rule>/`.
    pub root: PathBuf,
    pub policy: OutputPolicy,
    pub snap: Snapshot,
    pub event: TriggerEvent,
    /// The trigger as wall-clock time (ns since the Unix epoch), for the file name.
    pub trigger_unix_ns: u64,
    /// The files of the snapshot's processes, held until it is written (they may have
    /// exited, their containers removed).
    pub held: Vec<Arc<HeldFile>>,
}

/// The files a snapshot left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub trace: PathBuf,
    pub raw: Option<PathBuf>,
    pub metadata: PathBuf,
    /// Time spent decoding and writing the trace.
    pub decode: Duration,
    /// Records the kernel reported lost in the recorder's rings (perf `LOST` records).
    pub lost: u64,
    /// PT: AUX records the kernel flagged truncated, partial or collided.
    pub lost_aux: u64,
    /// The report's one line: where the trigger's interval went.
    pub verdict: Option<String>,
}

/// Why a snapshot could not be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot create {}", path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing the raw snapshot")]
    Raw(#[from] SnapshotError),
    #[error("writing the trace")]
    Trace(#[from] WriterError),
    #[error("writing {}", path.display())]
    Metadata {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Writes the snapshot's files; on error none of them stays.
pub fn write_snapshot(job: &SnapshotJob) -> Result<Written, OutputError> {
    let dir = job.root.join(&job.rule);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|source| OutputError::Dir {
            path: dir.clone(),
            source,
        })?;
    let stem = format!(
        "{}-{}-{}",
        utc_stamp(job.trigger_unix_ns),
        job.event.pid,
        job.event.tid
    );
    let ext = match job.policy.format {
        OutputFormat::Fxt => "fxt.gz",
        OutputFormat::ChromeJson => "json.gz",
    };
    let trace = dir.join(format!("{stem}.{ext}"));
    let raw = job
        .policy
        .keep_raw
        .then(|| dir.join(format!("{stem}.lbsnap")));
    let metadata = dir.join(format!("{stem}.json"));
    let mut done: Vec<PathBuf> = Vec::new();
    let result = (|| {
        if let Some(raw) = &raw {
            snapshot::write_atomic(raw, &job.snap)?;
            done.push(raw.clone());
        }
        let started = Instant::now();
        let summary = writer::write_trace(&job.snap, &trace)?;
        let decode = started.elapsed();
        done.push(trace.clone());
        for warning in writer::symbol_warnings(&summary) {
            log::warn!("rule {}: trace {}: {warning}", job.rule, trace.display());
        }
        let body = metadata_json(job, &trace, raw.as_deref(), &summary);
        write_file_atomic(&metadata, body.as_bytes()).map_err(|source| OutputError::Metadata {
            path: metadata.clone(),
            source,
        })?;
        let verdict = summary.report.map(|r| r.verdict);
        Ok((decode, summary.lost_samples, summary.lost_aux, verdict))
    })();
    match result {
        Ok((decode, lost, lost_aux, verdict)) => Ok(Written {
            trace,
            raw,
            metadata,
            decode,
            lost,
            lost_aux,
            verdict,
        }),
        Err(e) => {
            for path in done {
                let _ = fs::remove_file(path);
            }
            Err(e)
        }
    }
}

/// Breakdown entries in the metadata: the few that explain most of the interval.
const METADATA_BREAKDOWN: usize = 10;

/// The `<stem>.json` beside each trace (contract.md fields, plus a few extras).
fn metadata_json(
    job: &SnapshotJob,
    trace: &Path,
    raw: Option<&Path>,
    summary: &writer::TraceSummary,
) -> String {
    let e = &job.event;
    let meta = &job.snap.meta;
    let kind = match e.kind {
        TriggerKind::Function => "function",
        TriggerKind::Syscall => "syscall",
        TriggerKind::Signal => "signal",
    };
    let mut trigger = json!({ "kind": kind, "detail": e.detail() });
    if let Some(obj) = trigger.as_object_mut() {
        if let Some(d) = e.duration_ns {
            obj.insert("duration_ns".into(), json!(d));
        }
        if e.running {
            // Fired while the call ran (`detect: running`): `duration_ns` is how long it
            // had run (extension).
            obj.insert("running".into(), json!(true));
        }
        if let Some(nr) = e.syscall {
            obj.insert(
                "syscall".into(),
                json!(crate::rules::syscall_name(nr).map_or_else(|| nr.to_string(), str::to_owned)),
            );
        }
        if let Some(errno) = e.errno {
            obj.insert(
                "errno".into(),
                json!(
                    crate::rules::errno_name(errno)
                        .map_or_else(|| errno.to_string(), str::to_owned)
                ),
            );
        }
        if let Some(sig) = e.signal {
            obj.insert(
                "signal".into(),
                json!(
                    crate::rules::signal_name(sig).map_or_else(|| sig.to_string(), str::to_owned)
                ),
            );
        }
    }
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut value = json!({
        "rule": job.rule,
        "trigger": trigger,
        "pid": e.pid,
        "tid": e.tid,
        "comm": e.comm,
        "backend": meta.backend.as_str(),
        "trigger_time_ns": e.timestamp_ns,
        "window_start_ns": meta.window_start_ns,
        "window_end_ns": meta.window_end_ns,
        "trace_file": name(trace),
        "trigger_to_freeze_ns": meta.trigger_to_freeze_ns,
        "lookback_version": meta.lookback_version,
    });
    if let Some(obj) = value.as_object_mut() {
        if let Some(raw) = raw {
            obj.insert("raw_file".into(), json!(name(raw)));
        }
        // Per binary: frames, `[unknown]` frames, and the debug-symbols hint; sampled
        // stacks cut at a non-code address (extensions).
        obj.insert("symbols".into(), json!(summary.symbols));
        obj.insert("truncated_stacks".into(), json!(summary.truncated_stacks));
        // The triggering thread's stack at the trigger, leaf first (extension).
        obj.insert("trigger_stack".into(), json!(summary.trigger_stack));
        // Where the trigger's interval went: the verdict, and the largest entries of the
        // breakdown (`lookback report` has them all).
        if let Some(report) = &summary.report {
            obj.insert("verdict".into(), json!(report.verdict));
            obj.insert("interval_ns".into(), json!(report.interval_ns));
            obj.insert(
                "breakdown".into(),
                json!(&report.breakdown[..report.breakdown.len().min(METADATA_BREAKDOWN)]),
            );
        }
        // Node, container, cgroup (and pod) of the triggering process.
        if let Some(origin) = &meta.origin {
            obj.insert("origin".into(), json!(origin));
        }
    }
    let mut text = value.to_string();
    text.push('\n');
    text
}

/// Writes `bytes` to `path` through a synced temporary file and a rename, mode 0600.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .map_or_else(|| "file".to_owned(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// `YYYYmmddTHHMMSS.ffffffZ` (UTC, microseconds) of `unix_ns`.
pub fn utc_stamp(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let micros = (unix_ns % 1_000_000_000) / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Gregorian date of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// Wall-clock time (Unix ns) of a `CLOCK_MONOTONIC` timestamp from the kernel.
pub fn monotonic_to_unix_ns(monotonic_ns: u64) -> u64 {
    let now_mono = crate::sys::monotonic_ns();
    let now_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    now_unix.saturating_sub(now_mono.saturating_sub(monotonic_ns))
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::capture::{Backend, CapturedData, RecorderParams};
    use crate::rules::OutputPolicy;

    #[test]
    fn stamps_are_utc_with_microseconds() {
        assert_eq!(utc_stamp(0), "19700101T000000.000000Z");
        // 2026-11-29T18:04:00.123456789Z
        assert_eq!(
            utc_stamp(1_795_975_440_123_456_789),
            "20261129T180400.123456Z"
        );
        // A leap day.
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    #[test]
    fn stamps_sort_like_time() {
        let a = utc_stamp(1_700_000_000_000_000_000);
        let b = utc_stamp(1_700_000_000_000_001_000);
        let c = utc_stamp(1_800_000_000_000_000_000);
        assert!(a < b && b < c);
    }

    /// A sampling snapshot with no samples: it decodes to an (almost) empty trace.
    pub(in crate::daemon) fn empty_job(root: &Path) -> SnapshotJob {
        let captured = CapturedData {
            backend: Backend::Sampling,
            params: RecorderParams {
                event: "cpu-clock".to_owned(),
                perf_type: 1,
                config: 0,
                config_fields: BTreeMap::new(),
                sample_type: 0,
                sample_regs_user: 0,
                sample_stack_user: 0,
                switch_ids: Vec::new(),
                sample_id_all: true,
                sample_frequency: Some(1000),
                buffer_size: 1 << 16,
                include_kernel: false,
                clockid: Some(1),
                cpus: vec![0],
                aux_pause: false,
                address_filter: None,
                pt_timing: None,
                cpu_wide: false,
            },
            freeze_time_ns: 2_000,
            pause_duration_ns: 0,
            rings: vec![],
            sideband: vec![],
            clock: None,
            processes: vec![],
            code: vec![],
            perf_maps: Vec::new(),
            window: None,
            kernel_symbols: Vec::new(),
        };
        let event = TriggerEvent {
            rule_id: 0,
            kind: TriggerKind::Signal,
            on_entry: true,
            running: false,
            pid: 42,
            tid: 43,
            comm: "workload".to_owned(),
            timestamp_ns: 1_000,
            duration_ns: None,
            syscall: None,
            ret: None,
            errno: None,
            signal: Some(10),
            sender_pid: Some(42),
            ip: None,
            depth: None,
            stack: Vec::new(),
            kernel_stack: Vec::new(),
            stack_copy: None,
        };
        SnapshotJob {
            rule: "usr1".to_owned(),
            root: root.to_owned(),
            policy: OutputPolicy::default(),
            snap: Snapshot::from_captured(captured, None),
            event,
            trigger_unix_ns: 1_700_000_000_000_000_000,
            held: Vec::new(),
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_snapshot_is_written_whole() {
        let root = tempfile::tempdir().expect("tempdir");
        let job = empty_job(root.path());
        let written = write_snapshot(&job).expect("written");
        let stem = "20231114T221320.000000Z-42-43";
        assert_eq!(
            names(&root.path().join("usr1")),
            [
                format!("{stem}.fxt.gz"),
                format!("{stem}.json"),
                format!("{stem}.lbsnap")
            ]
        );
        assert_eq!(
            written.metadata,
            root.path().join(format!("usr1/{stem}.json"))
        );
    }

    #[test]
    fn a_metadata_write_that_fails_leaves_no_file() {
        let root = tempfile::tempdir().expect("tempdir");
        let job = empty_job(root.path());
        let dir = root.path().join("usr1");
        // A directory where the metadata goes: the raw file and the trace are written,
        // then the rename of the metadata onto it fails.
        let blocker = dir.join("20231114T221320.000000Z-42-43.json");
        fs::create_dir_all(blocker.join("keep")).expect("blocker");
        let err = write_snapshot(&job).expect_err("metadata cannot be written");
        assert!(matches!(err, OutputError::Metadata { .. }), "{err:?}");
        let left = names(&dir);
        assert_eq!(
            left,
            ["20231114T221320.000000Z-42-43.json"],
            "files of a failed snapshot remain"
        );
        assert!(blocker.is_dir());
    }
}
