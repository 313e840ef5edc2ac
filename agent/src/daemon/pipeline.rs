//! The snapshot pipeline: trigger → (post-trigger wait) → freeze → decode and write →
//! retention.
//!
//! For sampling rules without `post_trigger` the kernel already stopped the triggering
//! process's samples at the trigger (`FROZEN`, dropped by the recorder's `sample_filter`);
//! every trigger that set that mark removes it here, after the copy or when the trigger is
//! dropped. The copy runs on the event loop, right when the trigger (or its `post_trigger`
//! timer) arrives: for other processes and backends stopping the rings is what decides
//! which moment is kept, so nothing may wait in front of it. Decoding and writing run on tokio's blocking pool, at most `workers` at a
//! time, with at most `max_queued` snapshots frozen and not yet written; a trigger beyond
//! that, or one for a process whose post-trigger freeze is still pending, is suppressed
//! and counted (`reason="busy"`). The kernel already applied cooldown and rate limit.
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{
    sync::{Semaphore, mpsc},
    task::JoinSet,
};

use super::{
    AgentOptions, DEFAULT_OUTPUT_DIR,
    metrics::{LossSource, Metrics},
    output::{self, SnapshotJob},
    retention,
    targets::{ErrorChain, Tracer},
};
use crate::upload::UploadHandle;
use crate::{
    capture::{PeerSet, held_files::HeldFiles},
    rules::Peers,
    snapshot::{Snapshot, TriggerMeta},
    triggers::TriggerEvent,
};

/// A trigger whose freeze is due.
#[derive(Debug)]
pub struct FreezeRequest {
    pub rule: String,
    pub event: TriggerEvent,
}

/// Lets go of a trigger of `pid` that gets no snapshot: removes the process's kernel
/// freeze mark (`FROZEN`), and restarts its recorder if the trigger thread stopped it
/// (`early_freeze`); a recorder that runs is left as it is.
fn resume_early(tracer: &mut Tracer, pid: u32) {
    tracer.thaw(pid);
    if let Some((_, recorder)) = tracer.recorder_for(pid)
        && recorder
            .freeze_switch()
            .is_some_and(|s| s.frozen_at().is_some())
        && let Err(e) = recorder.resume()
    {
        log::warn!("resuming the recorder: {}", ErrorChain(&e));
    }
}

/// Snapshots between trigger and disk.
pub struct Pipeline {
    metrics: Arc<Metrics>,
    output_dir: Option<PathBuf>,
    max_queued: usize,
    workers: Arc<Semaphore>,
    jobs: JoinSet<()>,
    /// Post-trigger freezes not yet due, by process.
    pending: HashMap<u32, FreezeRequest>,
    freeze_tx: mpsc::UnboundedSender<u32>,
    /// Told of each snapshot written for a rule that uploads.
    uploads: Option<UploadHandle>,
}

impl Pipeline {
    /// The pipeline, and the receiver of the pids whose post-trigger freeze is due (the
    /// event loop hands each to [`freeze_pending`](Self::freeze_pending)).
    pub fn new(opts: &AgentOptions, metrics: Arc<Metrics>) -> (Self, mpsc::UnboundedReceiver<u32>) {
        let (freeze_tx, freeze_rx) = mpsc::unbounded_channel();
        let pipeline = Self {
            metrics,
            output_dir: opts.output_dir.clone(),
            max_queued: opts.max_queued.max(1),
            workers: Arc::new(Semaphore::new(opts.workers.max(1))),
            jobs: JoinSet::new(),
            pending: HashMap::new(),
            freeze_tx,
            uploads: None,
        };
        (pipeline, freeze_rx)
    }

    /// The uploader to wake after each snapshot of a rule that uploads.
    pub fn set_uploads(&mut self, uploads: UploadHandle) {
        self.uploads = Some(uploads);
    }

    /// A trigger from the kernel: freeze now, or after the rule's `post_trigger`.
    pub fn on_trigger(&mut self, tracer: &mut Tracer, event: TriggerEvent) {
        let Some(active) = tracer.rule_by_id(event.rule_id) else {
            log::debug!("trigger of a rule removed since: {event}");
            resume_early(tracer, event.pid);
            return;
        };
        let rule = active.rule.name.clone();
        let post = active.rule.snapshot.post_trigger;
        log::info!("trigger {rule}: {event}");
        if tracer.recorder_for(event.pid).is_none() {
            // The kernel targeted this process at exec and its exec event is still queued
            // behind this trigger: start its recorder now (the snapshot then holds what
            // happened since), rather than losing the trigger.
            tracer.consider(event.pid);
        }
        if self.pending.contains_key(&event.pid) || self.jobs.len() >= self.max_queued {
            log::warn!("trigger {rule}: a snapshot is already in flight; suppressed (busy)");
            self.metrics.suppressed_busy(&rule);
            resume_early(tracer, event.pid);
            return;
        }
        let request = FreezeRequest { rule, event };
        if post.is_zero() {
            self.freeze(tracer, request);
            return;
        }
        let pid = request.event.pid;
        self.pending.insert(pid, request);
        let tx = self.freeze_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(post).await;
            let _ = tx.send(pid);
        });
    }

    /// The post-trigger freeze of `pid` is due (its timer fired, or the process exited and
    /// nothing more can be recorded): freeze now. No-op when none is pending.
    pub fn freeze_pending(&mut self, tracer: &mut Tracer, pid: u32) {
        if let Some(request) = self.pending.remove(&pid) {
            self.freeze(tracer, request);
        }
    }

    /// Freezes every snapshot still waiting out its `post_trigger` (shutdown): those
    /// triggers were accepted, so their snapshots are written with what was recorded until
    /// now rather than lost with the recorders.
    pub fn freeze_all_pending(&mut self, tracer: &mut Tracer) {
        if self.pending.is_empty() {
            return;
        }
        log::info!(
            "shutdown: freezing {} snapshot(s) before their post_trigger ends",
            self.pending.len()
        );
        let pids: Vec<u32> = self.pending.keys().copied().collect();
        for pid in pids {
            self.freeze_pending(tracer, pid);
        }
    }

    /// Waits for a written snapshot; `None` at once when none is in flight.
    pub async fn next_done(&mut self) -> Option<()> {
        match self.jobs.join_next().await? {
            Ok(()) => Some(()),
            Err(e) => {
                log::error!("snapshot writer failed: {e}");
                Some(())
            }
        }
    }

    /// Freezes the recorder of the triggering process and queues the snapshot.
    pub fn freeze(&mut self, tracer: &mut Tracer, request: FreezeRequest) {
        let FreezeRequest { rule, event } = request;
        let Some(active) = tracer.rules().find(|r| r.rule.name == rule) else {
            resume_early(tracer, event.pid);
            return;
        };
        let policy = active.rule.output.clone();
        let peers = match active.rule.capture.peers {
            Peers::None => PeerSet::None,
            Peers::Rule => PeerSet::Of(tracer.selected_by(active.id)),
            Peers::All => PeerSet::All,
        };
        let debug_dirs = active.rule.trigger.debug_dirs().to_vec();
        let debuginfod = active.rule.debuginfod.clone();
        let root = self
            .output_dir
            .clone()
            .or_else(|| policy.dir.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_OUTPUT_DIR));
        let Some((owner, recorder)) = tracer.recorder_for_trigger(event.pid, event.rule_id) else {
            tracer.thaw(event.pid);
            log::error!(
                "trigger {rule}: process {} has no flight recorder; no snapshot",
                event.pid
            );
            self.metrics
                .snapshot_done(&rule, "none", false, 0, Duration::ZERO);
            return;
        };
        let backend = recorder.backend().as_str();
        let frozen = recorder.freeze_for(event.pid, &peers);
        if let Err(e) = recorder.resume() {
            log::warn!("resuming the recorder: {}", ErrorChain(&e));
        }
        let mut data = match frozen {
            Ok(data) => data,
            Err(e) => {
                tracer.thaw(event.pid);
                log::error!("trigger {rule}: freezing: {}", ErrorChain(&e));
                self.metrics
                    .snapshot_done(&rule, backend, false, 0, Duration::ZERO);
                return;
            }
        };
        // Copied: the process may be sampled again. Its kernel mark, when it stopped the
        // samples for this trigger, is the freeze time (the rings' pause came later).
        if let Some(at) =
            tracer.thaw_after_copy(owner, event.pid, event.timestamp_ns, data.freeze_time_ns)
        {
            data.freeze_time_ns = at;
        }
        let mut snap = Snapshot::from_captured(data, Some(TriggerMeta::from_event(&rule, &event)));
        snap.meta.debug_dirs = debug_dirs;
        snap.meta.debuginfod = debuginfod;
        snap.meta.origin = Some(tracer.origin_of(event.pid, &mut snap.maps));
        if let Some(ns) = snap.meta.trigger_to_freeze_ns {
            self.metrics
                .trigger_to_freeze(backend, Duration::from_nanos(ns));
        }
        // The files of its processes stay open until it is written: they may be gone by
        // then (a crash, a container removed).
        let maps: Vec<_> = snap
            .maps
            .iter()
            .flat_map(|p| p.maps.iter().cloned())
            .collect();
        let mut held = HeldFiles::global().files_for(&maps);
        held.extend(HeldFiles::global().files_of(event.pid));
        let job = SnapshotJob {
            rule,
            root,
            trigger_unix_ns: output::monotonic_to_unix_ns(event.timestamp_ns),
            policy,
            snap,
            event,
            held,
        };
        let workers = Arc::clone(&self.workers);
        let metrics = Arc::clone(&self.metrics);
        let uploads = self.uploads.clone();
        self.jobs.spawn(async move {
            let Ok(_permit) = workers.acquire_owned().await else {
                return;
            };
            let result = tokio::task::spawn_blocking(move || {
                let mut job = job;
                // Here, off the freeze path: it reads the unwind tables of the process's files.
                crate::unwind::complete_trigger_stack(&mut job.snap, job.event.stack_copy.as_ref());
                write(&job, &metrics, uploads.as_ref());
                drop(job);
                super::release_freed_memory();
            })
            .await;
            if let Err(e) = result {
                log::error!("snapshot writer failed: {e}");
            }
        });
    }

    /// Snapshots frozen but not written yet.
    pub fn in_flight(&self) -> usize {
        self.jobs.len()
    }

    /// Waits up to `timeout` for the snapshots in flight (shutdown).
    pub async fn finish(&mut self, timeout: Duration) {
        if self.jobs.is_empty() {
            return;
        }
        log::info!("waiting for {} snapshot(s) in flight", self.jobs.len());
        let all = async { while self.jobs.join_next().await.is_some() {} };
        if tokio::time::timeout(timeout, all).await.is_err() {
            log::warn!(
                "{} snapshot(s) not written after {timeout:?}; abandoned",
                self.jobs.len()
            );
            self.jobs.abort_all();
        }
    }
}

/// Decodes and writes one snapshot, applies retention, records the outcome. On a full
/// filesystem the rule's oldest snapshots make room first (and once more when the write
/// still fails with `ENOSPC`/`EDQUOT`): the newest moment is the one to keep.
fn write(job: &SnapshotJob, metrics: &Metrics, uploads: Option<&UploadHandle>) {
    let started = Instant::now();
    let backend = job.snap.meta.backend.as_str();
    let raw_bytes = job.snap.raw_bytes();
    let dir = job.root.join(&job.rule);
    // The trace is about as large as the raw snapshot, or smaller (gzip); the raw copy
    // when kept doubles it.
    let needed = raw_bytes.saturating_mul(1 + u64::from(job.policy.keep_raw));
    let keep_pending = job.policy.upload.is_some();
    make_room(&dir, needed, &job.rule, keep_pending);
    let mut result = output::write_snapshot(job);
    if let Err(e) = &result
        && matches!(
            super::limits::errno_of(e),
            Some(libc::ENOSPC | libc::EDQUOT)
        )
        && make_room(&dir, needed.saturating_mul(4), &job.rule, keep_pending) > 0
    {
        log::warn!("snapshot {}: {e}; retrying after making room", job.rule);
        result = output::write_snapshot(job);
    }
    match result {
        Ok(written) => {
            metrics.decode_duration(backend, written.decode);
            // perf: LOST records in the sampling rings or the PT sideband; aux: AUX
            // records flagged truncated, partial or collided (PT).
            if written.lost > 0 {
                metrics.events_lost(LossSource::Perf, written.lost);
            }
            if written.lost_aux > 0 {
                metrics.events_lost(LossSource::Aux, written.lost_aux);
            }
            metrics.snapshot_done(&job.rule, backend, true, raw_bytes, since_trigger(job));
            log::info!(
                "snapshot {}: {}, written in {:.1?}{}",
                job.rule,
                written.trace.display(),
                started.elapsed(),
                written
                    .verdict
                    .as_deref()
                    .map(|v| format!(": {v}"))
                    .unwrap_or_default()
            );
            match retention::enforce(&dir, &job.policy.retention, job.policy.upload.as_ref()) {
                Ok(p) if p.snapshots > 0 => {
                    log::info!(
                        "retention {}: removed {} old snapshot(s), {} files, {} bytes",
                        job.rule,
                        p.snapshots,
                        p.files,
                        p.bytes
                    );
                    if p.dropped_pending > 0 {
                        log::warn!(
                            "upload {}: {} snapshot(s) dropped before their upload: the \
                             spool's pending bytes exceeded output.upload.max_pending",
                            job.rule,
                            p.dropped_pending
                        );
                        metrics
                            .upload()
                            .dropped(&job.rule, p.dropped_pending as u64);
                    }
                }
                Ok(_) => {}
                Err(e) => log::warn!("retention in {}: {e}", dir.display()),
            }
            if let Some(uploads) = uploads.filter(|_| job.policy.upload.is_some()) {
                uploads.wake();
            }
        }
        Err(e) => {
            log::error!("snapshot {}: {}", job.rule, ErrorChain(&e));
            // Like a success, measured from the trigger: the histogram is "trigger to
            // outcome", whatever the outcome.
            metrics.snapshot_done(&job.rule, backend, false, 0, since_trigger(job));
        }
    }
}

/// [`retention::make_room`] for `needed` bytes in `dir`, logged; the snapshots removed.
fn make_room(dir: &std::path::Path, needed: u64, rule: &str, keep_pending: bool) -> usize {
    match retention::make_room(dir, needed, keep_pending) {
        Ok(p) if p.snapshots > 0 => {
            log::warn!(
                "disk full for rule {rule}: removed its {} oldest snapshot(s) ({} files, {} \
                 bytes) to make room for a new one",
                p.snapshots,
                p.files,
                p.bytes
            );
            p.snapshots
        }
        Ok(_) => 0,
        Err(e) => {
            log::warn!("making room in {}: {e}", dir.display());
            0
        }
    }
}

/// Time from the kernel's trigger (`CLOCK_MONOTONIC`) to now.
fn since_trigger(job: &SnapshotJob) -> Duration {
    Duration::from_nanos(crate::sys::monotonic_ns().saturating_sub(job.event.timestamp_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_snapshot_is_timed_from_its_trigger() {
        let blocker = tempfile::NamedTempFile::new().expect("file");
        // Below a regular file: the rule's directory cannot be created.
        let mut job = output::tests::empty_job(&blocker.path().join("out"));
        job.event.timestamp_ns = crate::sys::monotonic_ns().saturating_sub(3_000_000_000);
        let metrics = Metrics::new("sampling").expect("registry");
        write(&job, &metrics, None);
        let text = metrics.encode().expect("encode");
        assert!(
            text.contains(
                "lookback_snapshots_total{backend=\"sampling\",result=\"error\",rule=\"usr1\"} 1"
            ),
            "{text}"
        );
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("lookback_snapshot_duration_seconds_sum{rule=\"usr1\"} "))
            .and_then(|v| v.parse().ok())
            .expect("duration sum");
        // The trigger was 3 s ago; the failed write itself took microseconds.
        assert!((3.0..60.0).contains(&sum), "{sum}");
    }
}
