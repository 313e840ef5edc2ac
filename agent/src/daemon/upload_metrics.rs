//! The upload metrics of the agent (`lookback_upload*`), and the uploader's reports turned
//! into them.
//!
//! In: what [`crate::upload::Uploader`] tells its [`Observer`], and the snapshots retention
//! dropped before they were uploaded. Out: `lookback_uploads_total{rule,result}`,
//! `lookback_upload_queue_files{rule}`, `lookback_upload_queue_bytes{rule}`,
//! `lookback_upload_duration_seconds`, `lookback_upload_dropped_total{rule}`, and
//! `lookback_errors_total{op="upload",errno=<the store's code>}`.
use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Registry};

use super::metrics::{MetricsError, counter_vec, gauge_vec, register};
use crate::upload::{ErrorCode, Observer};

/// Buckets of `lookback_upload_duration_seconds`: 10 ms to 5 min (a snapshot is KB to MB).
const UPLOAD_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The upload series.
pub struct UploadMetrics {
    uploads: IntCounterVec,
    queue_files: IntGaugeVec,
    queue_bytes: IntGaugeVec,
    duration: Histogram,
    dropped: IntCounterVec,
    /// `lookback_errors_total`, shared with the rest of the agent.
    errors: IntCounterVec,
    /// Rules with queue gauges, so that a rule that stops uploading loses them.
    queued: Mutex<BTreeSet<String>>,
}

impl UploadMetrics {
    /// Registers the series in `r`; `errors` is the agent's `lookback_errors_total`.
    pub fn new(r: &Registry, errors: IntCounterVec) -> Result<Self, MetricsError> {
        const DURATION: &str = "lookback_upload_duration_seconds";
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                DURATION,
                "Time to upload one snapshot's objects, from the first request to the store's \
                 confirmation of the last.",
            )
            .buckets(UPLOAD_BUCKETS.to_vec()),
        )
        .map_err(|source| MetricsError::Register {
            name: DURATION,
            source,
        })?;
        Ok(Self {
            uploads: counter_vec(
                r,
                "lookback_uploads_total",
                "Snapshot uploads to object storage, by result (error: one failed attempt, \
                 or a failed check of the bucket; it is retried).",
                &["rule", "result"],
            )?,
            queue_files: gauge_vec(
                r,
                "lookback_upload_queue_files",
                "Files in the rule's spool not yet uploaded.",
                &["rule"],
            )?,
            queue_bytes: gauge_vec(
                r,
                "lookback_upload_queue_bytes",
                "Bytes in the rule's spool not yet uploaded.",
                &["rule"],
            )?,
            duration: register(r, DURATION, duration)?,
            dropped: counter_vec(
                r,
                "lookback_upload_dropped_total",
                "Snapshots removed before they were uploaded: the rule's pending bytes \
                 exceeded output.upload.max_pending.",
                &["rule"],
            )?,
            errors,
            queued: Mutex::new(BTreeSet::new()),
        })
    }

    /// Drops the queue gauges of rules not in `uploading` (removed, or no longer uploading):
    /// a stale queue would look like a store that never takes them.
    pub fn retain_rules(&self, uploading: &[String]) {
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        queued.retain(|rule| {
            let keep = uploading.contains(rule);
            if !keep {
                let _ = self.queue_files.remove_label_values(&[rule]);
                let _ = self.queue_bytes.remove_label_values(&[rule]);
            }
            keep
        });
    }

    /// `n` snapshots of `rule` dropped from the spool before their upload.
    pub fn dropped(&self, rule: &str, n: u64) {
        self.dropped.with_label_values(&[rule]).inc_by(n);
    }

    /// The series of a rule that uploads, at 0 before its first upload.
    pub fn init_rule(&self, rule: &str) {
        for result in ["ok", "error"] {
            self.uploads.with_label_values(&[rule, result]).inc_by(0);
        }
        self.dropped.with_label_values(&[rule]).inc_by(0);
    }
}

impl Observer for UploadMetrics {
    fn uploaded(&self, rule: &str, took: Duration) {
        self.uploads.with_label_values(&[rule, "ok"]).inc();
        self.duration.observe(took.as_secs_f64());
    }

    fn failed(&self, rule: &str, code: &ErrorCode) {
        self.uploads.with_label_values(&[rule, "error"]).inc();
        self.errors.with_label_values(&["upload", &code.code]).inc();
    }

    fn queue(&self, rule: &str, files: u64, bytes: u64) {
        self.queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(rule.to_owned());
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.queue_files
            .with_label_values(&[rule])
            .set(clamp(files));
        self.queue_bytes
            .with_label_values(&[rule])
            .set(clamp(bytes));
    }
}
