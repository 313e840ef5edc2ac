//! Daemon stage: the Prometheus registry of `lookback agent`.
//!
//! In: events from the daemon (rules loaded, snapshots taken, losses) and counter snapshots
//! read from the kernel (per-rule [`RuleCounters`], per-program [`ProgramStats`]). Out: the
//! text exposition format 0.0.4 served on `/metrics` by [`super::http`].
//!
//! The names, types and labels of the metrics are a contract (`docs/contract.md`,
//! "Prometheus metrics"). Two extensions, not in the contract, describe the cost of the
//! eBPF programs themselves: `lookback_bpf_program_runs_total{program}` and
//! `lookback_bpf_program_run_seconds_total{program}`. The kernel only counts them while
//! run-time statistics are enabled ([`enable_bpf_stats`] or `sysctl kernel.bpf_stats_enabled=1`),
//! which costs two clock reads, about 20 ns, per program run. Also extensions:
//! `lookback_function_calls_unmeasured_total{rule,reason}`,
//! `lookback_rule_probe_errors{rule,reason}`, `lookback_errors_total{op,errno}`
//! (recorders and probes that could not be set up; see [`super::limits`]),
//! `lookback_kernel_targets` (processes the kernel's target set holds: selected at exec
//! or fork in the kernel, beside `lookback_targets{rule}`, those the agent traces),
//! `lookback_held_files` and `lookback_held_files_refused_total` (the traced processes'
//! files held open so that their snapshots outlive them: `capture::held_files`),
//! `lookback_http_connections` and `lookback_http_rejected_total{reason}` (the endpoint's
//! connections: `super::http`), and
//! the accounting of processes selected at exec and of late probes
//! ([`super::exec_accounting`]).
//!
//! Kernel counters are absolute values that restart from zero when a rule is removed and
//! re-added (the engine clears its slot) or a program is reloaded. They are exported as
//! monotonic counters by adding the difference from the value seen last; a value below the
//! last one is taken as a reset, so the whole new value counts. An exported counter therefore
//! never goes backwards.
//!
//! When a rule goes away, [`Metrics::remove_rule`] drops its gauge series (`targets`,
//! `probes_attached`) so that a stale rule does not look alive; its counters and histograms
//! stay, because removing a counter series and bringing it back later reads to Prometheus as
//! a reset (and `rate()` handles a series that merely stops growing).
use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use prometheus::{
    CounterVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder, core::Collector,
};

use super::{
    exec_accounting::{ExecAccounting, Outcome},
    limits::ErrorTally,
    upload_metrics::UploadMetrics,
};
use crate::capture::held_files::HeldStats;
use crate::triggers::{
    RuleCounters, TriggerEngine,
    engine::{ExecSelected, ProgramStats},
};

/// Buckets of `lookback_trigger_to_freeze_seconds`: 10 µs to 1 s. Freezing a recorder is a
/// few ioctls; anything past a millisecond means the agent was descheduled.
const FREEZE_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Buckets of the decode and snapshot durations: 1 ms to 60 s. Decoding a full Intel PT
/// buffer and symbolizing it takes seconds.
const SLOW_BUCKETS: &[f64] = &[
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Why a trigger met in the kernel did not lead to a snapshot (`reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suppression {
    /// Within the rule's cooldown (counted in the kernel).
    Cooldown,
    /// Over the rule's `max_per_hour` (counted in the kernel).
    RateLimit,
    /// A snapshot of the same rule and process was still in flight (counted by the daemon).
    Busy,
}

impl Suppression {
    fn label(self) -> &'static str {
        match self {
            Self::Cooldown => "cooldown",
            Self::RateLimit => "rate_limit",
            Self::Busy => "busy",
        }
    }
}

/// Where data was lost (`source` label of `lookback_events_lost_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossSource {
    /// The trigger ring buffer was full in the kernel.
    Ringbuf,
    /// `PERF_RECORD_LOST` in a sampling ring.
    Perf,
    /// AUX area truncated or overwritten (Intel PT).
    Aux,
}

impl LossSource {
    fn label(self) -> &'static str {
        match self {
            Self::Ringbuf => "ringbuf",
            Self::Perf => "perf",
            Self::Aux => "aux",
        }
    }
}

/// A failure to build or encode the registry.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot register metric {name}")]
    Register {
        name: &'static str,
        #[source]
        source: prometheus::Error,
    },
    #[error("cannot encode the metrics")]
    Encode(#[source] prometheus::Error),
    #[error("cannot enable eBPF run-time statistics (kernel 5.8+, CAP_SYS_ADMIN)")]
    EnableStats(#[source] aya::sys::SyscallError),
}

/// Last kernel values seen, to turn absolute kernel counters into increments.
#[derive(Default)]
struct Seen {
    rules: HashMap<String, RuleCounters>,
    /// (operation, errno) → failures already exported.
    errors: HashMap<(&'static str, &'static str), u64>,
    /// Program name → (run count, run time in ns).
    programs: HashMap<String, (u64, u64)>,
    /// Exec/exit records dropped in the kernel, as last read.
    process_events_lost: u64,
    /// Processes the full target set could not take, as last read.
    target_set_full: u64,
    /// Processes selected at exec (and their lost records), as last read.
    exec_selected: ExecSelected,
    /// The in-flight watcher's fired, ended and unproven counts, as last read.
    inflight: [u64; 3],
    /// Files the held-file limit turned away, as last read.
    held_files_refused: u64,
}

/// The operations of `lookback_errors_total`, whose series exist from the start.
const ERROR_OPS: [&str; 2] = ["recorder", "probe"];
/// Its errnos: the resource limits, and `other`.
const ERROR_ERRNOS: [&str; 6] = ["EMFILE", "ENFILE", "ENOMEM", "EPERM", "ENOSPC", "other"];

/// The `lookback_errors_total` series of processes left out of the full target set.
const TARGET_SET_FULL: [&str; 2] = ["target_set", "E2BIG"];

/// The increment from `last` to `now` of a kernel counter that may have been reset.
pub(super) fn delta(last: u64, now: u64) -> u64 {
    if now >= last { now - last } else { now }
}

/// Every metric of the daemon, in one registry.
pub struct Metrics {
    registry: Registry,
    rules_loaded: IntGauge,
    kernel_targets: IntGauge,
    held_files: IntGauge,
    held_files_refused: IntCounter,
    config_reloads: IntCounterVec,
    targets: IntGaugeVec,
    probes_attached: IntGaugeVec,
    probe_errors: IntGaugeVec,
    triggers: IntCounterVec,
    suppressed: IntCounterVec,
    snapshots: IntCounterVec,
    snapshot_bytes: IntCounterVec,
    snapshot_duration: HistogramVec,
    trigger_to_freeze: HistogramVec,
    decode_duration: HistogramVec,
    /// Function calls a latency rule could not measure, by reason (extension).
    unmeasured: IntCounterVec,
    /// `detect: running` candidates judged by the in-flight watcher, by outcome
    /// (extension).
    inflight: IntCounterVec,
    events_lost: IntCounterVec,
    /// Recorder and probe failures by operation and errno.
    errors: IntCounterVec,
    /// The HTTP endpoint's open connections, and the ones it closed unanswered.
    http_connections: IntGauge,
    http_rejected: IntCounterVec,
    bpf: BpfMetrics,
    exec: ExecAccounting,
    upload: Arc<UploadMetrics>,
    seen: Mutex<Seen>,
}

/// A registered gauge without labels.
fn int_gauge(
    registry: &Registry,
    name: &'static str,
    help: &str,
) -> Result<IntGauge, MetricsError> {
    let gauge =
        IntGauge::new(name, help).map_err(|source| MetricsError::Register { name, source })?;
    register(registry, name, gauge)
}

pub(super) fn register<T>(
    registry: &Registry,
    name: &'static str,
    metric: T,
) -> Result<T, MetricsError>
where
    T: Collector + Clone + 'static,
{
    registry
        .register(Box::new(metric.clone()))
        .map_err(|source| MetricsError::Register { name, source })?;
    Ok(metric)
}

pub(super) fn counter_vec(
    registry: &Registry,
    name: &'static str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, MetricsError> {
    let vec = IntCounterVec::new(Opts::new(name, help), labels)
        .map_err(|source| MetricsError::Register { name, source })?;
    register(registry, name, vec)
}

pub(super) fn gauge_vec(
    registry: &Registry,
    name: &'static str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, MetricsError> {
    let vec = IntGaugeVec::new(Opts::new(name, help), labels)
        .map_err(|source| MetricsError::Register { name, source })?;
    register(registry, name, vec)
}

fn histogram_vec(
    registry: &Registry,
    name: &'static str,
    help: &str,
    label: &str,
    buckets: &[f64],
) -> Result<HistogramVec, MetricsError> {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    let vec = HistogramVec::new(opts, &[label])
        .map_err(|source| MetricsError::Register { name, source })?;
    register(registry, name, vec)
}

/// The `reason` values of `lookback_rule_probe_errors`.
pub const PROBE_ERROR_REASONS: [&str; 6] = [
    "symbol_not_found",
    "ambiguous_symbol",
    "too_many_functions",
    "binary_unreadable",
    "attach_failed",
    "capability",
];

/// `lookback_rule_probe_errors` (extension).
fn probe_errors_gauge(r: &Registry) -> Result<IntGaugeVec, MetricsError> {
    gauge_vec(
        r,
        "lookback_rule_probe_errors",
        "1 while a function rule's probe could not be placed, by reason: symbol_not_found, \
         ambiguous_symbol, too_many_functions, binary_unreadable, attach_failed, capability \
         (the agent's privileges cannot place it); the full \
         text (candidates, debug files looked for) is in the log and /readyz (extension).",
        &["rule", "reason"],
    )
}

/// `lookback_http_connections` (extension).
fn http_connections_gauge(r: &Registry) -> Result<IntGauge, MetricsError> {
    int_gauge(
        r,
        "lookback_http_connections",
        "Connections open to the HTTP endpoint (/metrics, /healthz, /readyz) (extension).",
    )
}

/// The `reason` values of `lookback_http_rejected_total`.
pub const HTTP_REJECTED_REASONS: [&str; 4] = ["shed", "header_timeout", "too_large", "bad_request"];

/// `lookback_http_rejected_total{reason}`, every reason at 0 from the start.
fn http_rejected_counter(r: &Registry) -> Result<IntCounterVec, MetricsError> {
    let rejected = counter_vec(
        r,
        "lookback_http_rejected_total",
        "Connections the HTTP endpoint closed without serving a request, by reason: shed \
         (no complete request yet while the connection cap was reached), header_timeout \
         (no complete request head in time), too_large (a request head beyond the size \
         limit), bad_request (not HTTP/1) (extension).",
        &["reason"],
    )?;
    for reason in HTTP_REJECTED_REASONS {
        rejected.with_label_values(&[reason]).inc_by(0);
    }
    Ok(rejected)
}

/// `lookback_held_files` (extension).
fn held_files_gauge(r: &Registry) -> Result<IntGauge, MetricsError> {
    int_gauge(
        r,
        "lookback_held_files",
        "Distinct files of traced processes held open, one fd each, so that a process that \
         exits or whose container is removed still has its frames unwound and named \
         (extension).",
    )
}

/// `lookback_held_files_refused_total` (extension).
fn held_files_refused_counter(r: &Registry) -> Result<IntCounter, MetricsError> {
    const NAME: &str = "lookback_held_files_refused_total";
    let counter = IntCounter::new(
        NAME,
        "Attempts to hold a file of a traced process refused because --max-held-files were \
         held or the open-files limit was near; such a file is read by its path, only while \
         it stays there (extension).",
    )
    .map_err(|source| MetricsError::Register { name: NAME, source })?;
    register(r, NAME, counter)
}

/// `lookback_inflight_checks_total{outcome}`.
fn inflight_counter(r: &Registry) -> Result<IntCounterVec, MetricsError> {
    counter_vec(
        r,
        "lookback_inflight_checks_total",
        "detect: running calls judged by a look at their thread, by outcome: fired (still \
         inside past the threshold), ended (the look showed the call over: a sibling's \
         frame, SP above it), unproven (not unwound to the call).",
        &["outcome"],
    )
}

/// `lookback_function_calls_unmeasured_total` (extension).
fn unmeasured_counter(r: &Registry) -> Result<IntCounterVec, MetricsError> {
    counter_vec(
        r,
        "lookback_function_calls_unmeasured_total",
        "Calls of a latency rule's function that were not measured, by reason: unwound \
         (abandoned by longjmp, an exception or a panic), depth_overflow (nested deeper \
         than the per-thread stack), unmatched_return (an exit without a recorded entry, \
         e.g. a call in flight at attach) (extension).",
        &["rule", "reason"],
    )
}

/// `lookback_errors_total{op,errno}`, every series at 0 from the start (an alert on
/// `increase(...) > 0` needs them before the first failure).
fn errors_counter(r: &Registry) -> Result<IntCounterVec, MetricsError> {
    let errors = counter_vec(
        r,
        "lookback_errors_total",
        "Flight recorders and probes that could not be set up, by operation and errno \
         (EMFILE, ENFILE, ENOMEM, EPERM, ENOSPC: a resource limit; other), and processes \
         the kernel's full target set could not take (op target_set, errno E2BIG) \
         (extension).",
        &["op", "errno"],
    )?;
    for op in ERROR_OPS {
        for errno in ERROR_ERRNOS {
            errors.with_label_values(&[op, errno]).inc_by(0);
        }
    }
    errors.with_label_values(&TARGET_SET_FULL).inc_by(0);
    Ok(errors)
}

/// The extension metrics: cost of the eBPF programs.
struct BpfMetrics {
    runs: IntCounterVec,
    run_seconds: CounterVec,
}

impl BpfMetrics {
    fn new(r: &Registry) -> Result<Self, MetricsError> {
        const SECONDS: &str = "lookback_bpf_program_run_seconds_total";
        let run_seconds = CounterVec::new(
            Opts::new(
                SECONDS,
                "CPU time spent in each eBPF program while run-time statistics were enabled \
                 (extension).",
            ),
            &["program"],
        )
        .map_err(|source| MetricsError::Register {
            name: SECONDS,
            source,
        })?;
        Ok(Self {
            runs: counter_vec(
                r,
                "lookback_bpf_program_runs_total",
                "Runs of each eBPF program while run-time statistics were enabled (extension).",
                &["program"],
            )?,
            run_seconds: register(r, SECONDS, run_seconds)?,
        })
    }
}

/// `lookback_build_info`, set to 1 for this version and `backend`.
fn build_info_gauge(r: &Registry, backend: &str) -> Result<(), MetricsError> {
    let gauge = gauge_vec(
        r,
        "lookback_build_info",
        "Always 1; the agent's version and default capture backend.",
        &["version", "backend"],
    )?;
    gauge
        .with_label_values(&[env!("CARGO_PKG_VERSION"), backend])
        .set(1);
    Ok(())
}

impl Metrics {
    /// Registers every metric. `backend` is the machine's default capture backend
    /// (`intel-pt` or `sampling`), exported in `lookback_build_info`.
    pub fn new(backend: &str) -> Result<Self, MetricsError> {
        let r = Registry::new();
        build_info_gauge(&r, backend)?;
        let errors = errors_counter(&r)?;
        let metrics = Self {
            rules_loaded: int_gauge(&r, "lookback_rules_loaded", "Rules currently installed.")?,
            kernel_targets: int_gauge(
                &r,
                "lookback_kernel_targets",
                "Processes in the kernel's target set (selected at exec or fork in the \
                 kernel, and those the agent added).",
            )?,
            held_files: held_files_gauge(&r)?,
            held_files_refused: held_files_refused_counter(&r)?,
            config_reloads: counter_vec(
                &r,
                "lookback_config_reloads_total",
                "Rules file reloads, by result (a failed one keeps the old rules).",
                &["result"],
            )?,
            targets: gauge_vec(
                &r,
                "lookback_targets",
                "Processes currently traced for a rule.",
                &["rule"],
            )?,
            probes_attached: gauge_vec(
                &r,
                "lookback_probes_attached",
                "Probes currently attached for a rule.",
                &["rule"],
            )?,
            probe_errors: probe_errors_gauge(&r)?,
            triggers: counter_vec(
                &r,
                "lookback_triggers_total",
                "Trigger conditions met in the kernel, before suppression.",
                &["rule"],
            )?,
            suppressed: counter_vec(
                &r,
                "lookback_triggers_suppressed_total",
                "Triggers met but not turned into a snapshot, by reason.",
                &["rule", "reason"],
            )?,
            inflight: inflight_counter(&r)?,
            snapshots: counter_vec(
                &r,
                "lookback_snapshots_total",
                "Snapshots attempted, by result.",
                &["rule", "backend", "result"],
            )?,
            snapshot_bytes: counter_vec(
                &r,
                "lookback_snapshot_bytes_total",
                "Raw recorder bytes captured in snapshots.",
                &["rule"],
            )?,
            snapshot_duration: histogram_vec(
                &r,
                "lookback_snapshot_duration_seconds",
                "Time from trigger to trace file written.",
                "rule",
                SLOW_BUCKETS,
            )?,
            trigger_to_freeze: histogram_vec(
                &r,
                "lookback_trigger_to_freeze_seconds",
                "Time from the trigger in the kernel to the recorder frozen.",
                "backend",
                FREEZE_BUCKETS,
            )?,
            decode_duration: histogram_vec(
                &r,
                "lookback_decode_duration_seconds",
                "Time to decode a snapshot into a trace.",
                "backend",
                SLOW_BUCKETS,
            )?,
            events_lost: counter_vec(
                &r,
                "lookback_events_lost_total",
                "Records lost before reaching the agent, by where.",
                &["source"],
            )?,
            errors: errors.clone(),
            http_connections: http_connections_gauge(&r)?,
            http_rejected: http_rejected_counter(&r)?,
            unmeasured: unmeasured_counter(&r)?,
            bpf: BpfMetrics::new(&r)?,
            exec: ExecAccounting::new(&r)?,
            upload: Arc::new(UploadMetrics::new(&r, errors)?),
            registry: r,
            seen: Mutex::new(Seen::default()),
        };
        metrics.init_loss_sources();
        Ok(metrics)
    }

    /// Every loss source from the start, at 0: an alert on `increase(...) > 0` needs the
    /// series to exist before the first loss.
    fn init_loss_sources(&self) {
        for source in [LossSource::Ringbuf, LossSource::Perf, LossSource::Aux] {
            self.events_lost
                .with_label_values(&[source.label()])
                .inc_by(0);
        }
    }

    /// The registry, for tests and for callers that add their own collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    fn seen(&self) -> MutexGuard<'_, Seen> {
        // The map holds plain numbers; a panic elsewhere cannot leave it inconsistent.
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn set_rules_loaded(&self, n: usize) {
        self.rules_loaded.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts a reload of the rules file (SIGHUP or a change of the file).
    pub fn config_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.config_reloads.with_label_values(&[result]).inc();
    }

    /// Takes in the held files' statistics (the refused count is absolute).
    pub fn observe_held_files(&self, stats: HeldStats) {
        self.held_files
            .set(i64::try_from(stats.files).unwrap_or(i64::MAX));
        let mut seen = self.seen();
        let last = std::mem::replace(&mut seen.held_files_refused, stats.refused);
        self.held_files_refused.inc_by(delta(last, stats.refused));
    }

    pub fn set_kernel_targets(&self, n: usize) {
        self.kernel_targets
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Takes in the kernel's count of dropped exec/exit records (absolute): the increase
    /// goes to `lookback_events_lost_total{source="ringbuf"}`. Returns the increase.
    pub fn observe_process_events_lost(&self, now: u64) -> u64 {
        let last = std::mem::replace(&mut self.seen().process_events_lost, now);
        let d = delta(last, now);
        if d > 0 {
            self.events_lost
                .with_label_values(&[LossSource::Ringbuf.label()])
                .inc_by(d);
        }
        d
    }

    /// Takes in the kernel's count of processes its full target set could not take
    /// (absolute): the increase goes to `lookback_errors_total{op="target_set",
    /// errno="E2BIG"}`. Returns the increase.
    pub fn observe_target_set_full(&self, now: u64) -> u64 {
        let last = std::mem::replace(&mut self.seen().target_set_full, now);
        let d = delta(last, now);
        if d > 0 {
            self.errors.with_label_values(&TARGET_SET_FULL).inc_by(d);
        }
        d
    }

    /// Takes in the kernel's counts of processes selected at exec (absolute).
    pub fn observe_exec_selected(&self, now: ExecSelected) {
        let last = std::mem::replace(&mut self.seen().exec_selected, now);
        self.exec.observe_kernel(last, now);
    }

    /// Counts what the agent made of one process the kernel selected at exec.
    /// The upload series (the uploader's [`crate::upload::Observer`]).
    pub fn upload(&self) -> &Arc<UploadMetrics> {
        &self.upload
    }

    pub fn count_exec_outcome(&self, outcome: Outcome) {
        self.exec.count(outcome);
    }

    /// Counts one process of `rule` that ran its binary before the rule's probe was there.
    pub fn count_late_probe(&self, rule: &str) {
        self.exec.count_late_probe(rule);
    }

    pub fn set_targets(&self, rule: &str, n: usize) {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.targets.with_label_values(&[rule]).set(n);
    }

    pub fn set_probes(&self, rule: &str, n: usize) {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.probes_attached.with_label_values(&[rule]).set(n);
    }

    /// Sets `lookback_rule_probe_errors` of `rule`: 1 for the reason its probe failed,
    /// no series when it did not.
    pub fn set_probe_error(&self, rule: &str, reason: Option<&str>) {
        for known in PROBE_ERROR_REASONS {
            if reason == Some(known) {
                self.probe_errors.with_label_values(&[rule, known]).set(1);
            } else {
                let _ = self.probe_errors.remove_label_values(&[rule, known]);
            }
        }
    }

    /// Forgets a removed rule: drops its gauge series and the last kernel counters seen (the
    /// engine clears the rule's kernel slot, so a re-added rule starts from zero).
    pub fn remove_rule(&self, rule: &str) {
        // Absent series are not an error: the rule may never have had targets.
        let _ = self.targets.remove_label_values(&[rule]);
        let _ = self.probes_attached.remove_label_values(&[rule]);
        self.set_probe_error(rule, None);
        self.seen().rules.remove(rule);
    }

    /// The in-flight watcher's counts (cumulative) since the last call become increments
    /// of `lookback_inflight_checks_total{outcome}`.
    pub fn observe_inflight(&self, stats: &crate::inflight::Stats) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = [
            stats.fired.load(Relaxed),
            stats.refused.load(Relaxed),
            stats.unproven.load(Relaxed),
        ];
        let last = std::mem::replace(&mut self.seen().inflight, now);
        for ((outcome, now), last) in ["fired", "ended", "unproven"].iter().zip(now).zip(last) {
            self.inflight
                .with_label_values(&[outcome])
                .inc_by(delta(last, now));
        }
    }

    /// Takes in the kernel's counters of `rule` (absolute, summed over CPUs): `met`, the
    /// cooldown and rate-limit suppressions and ring buffer drops become increments of
    /// `lookback_triggers_total`, `lookback_triggers_suppressed_total` and
    /// `lookback_events_lost_total{source="ringbuf"}`.
    pub fn observe_rule_counters(&self, rule: &str, now: &RuleCounters) {
        let last = self
            .seen()
            .rules
            .insert(rule.to_owned(), *now)
            .unwrap_or_default();
        let add = |c: &IntCounterVec, labels: &[&str], last: u64, now: u64| {
            let d = delta(last, now);
            if d > 0 {
                c.with_label_values(labels).inc_by(d);
            }
        };
        // Series exist from the first observation on, so a rule that never fires (or is
        // never suppressed, for any reason) reads 0 rather than missing.
        self.triggers.with_label_values(&[rule]).inc_by(0);
        for reason in [
            Suppression::Cooldown,
            Suppression::RateLimit,
            Suppression::Busy,
        ] {
            self.suppressed
                .with_label_values(&[rule, reason.label()])
                .inc_by(0);
        }
        add(&self.triggers, &[rule], last.met, now.met);
        add(
            &self.suppressed,
            &[rule, Suppression::Cooldown.label()],
            last.suppressed_cooldown,
            now.suppressed_cooldown,
        );
        add(
            &self.suppressed,
            &[rule, Suppression::RateLimit.label()],
            last.suppressed_rate_limit,
            now.suppressed_rate_limit,
        );
        add(
            &self.events_lost,
            &[LossSource::Ringbuf.label()],
            last.lost_ringbuf_full,
            now.lost_ringbuf_full,
        );
        for (reason, last, now) in [
            ("unwound", last.unwound, now.unwound),
            ("depth_overflow", last.depth_overflow, now.depth_overflow),
            (
                "unmatched_return",
                last.unmatched_return,
                now.unmatched_return,
            ),
        ] {
            self.unmeasured.with_label_values(&[rule, reason]).inc_by(0);
            add(&self.unmeasured, &[rule, reason], last, now);
        }
        if now.depth_overflow > last.depth_overflow {
            log::warn!(
                "rule {rule}: {} call(s) nested deeper than {} on one thread were not measured \
                 (depth_overflow)",
                now.depth_overflow - last.depth_overflow,
                lookback_common::rule::MAX_CALL_DEPTH
            );
        }
    }

    /// Counts one suppression decided in userspace (normally [`Suppression::Busy`]: a
    /// trigger that arrived while a snapshot for the same rule and process was in flight).
    pub fn suppressed(&self, rule: &str, reason: Suppression) {
        self.suppressed
            .with_label_values(&[rule, reason.label()])
            .inc();
    }

    /// Shorthand for `suppressed(rule, Suppression::Busy)`.
    pub fn suppressed_busy(&self, rule: &str) {
        self.suppressed(rule, Suppression::Busy);
    }

    /// Records a finished snapshot: `raw_bytes` recorder bytes captured, `duration` from
    /// trigger to trace file written (or to the failure).
    pub fn snapshot_done(
        &self,
        rule: &str,
        backend: &str,
        ok: bool,
        raw_bytes: u64,
        duration: Duration,
    ) {
        let result = if ok { "ok" } else { "error" };
        self.snapshots
            .with_label_values(&[rule, backend, result])
            .inc();
        self.snapshot_bytes
            .with_label_values(&[rule])
            .inc_by(raw_bytes);
        self.snapshot_duration
            .with_label_values(&[rule])
            .observe(duration.as_secs_f64());
    }

    pub fn trigger_to_freeze(&self, backend: &str, duration: Duration) {
        self.trigger_to_freeze
            .with_label_values(&[backend])
            .observe(duration.as_secs_f64());
    }

    pub fn decode_duration(&self, backend: &str, duration: Duration) {
        self.decode_duration
            .with_label_values(&[backend])
            .observe(duration.as_secs_f64());
    }

    /// Counts `n` records lost in userspace-visible rings (perf LOST, AUX truncation).
    /// Ring buffer drops in the kernel come in through [`Self::observe_rule_counters`].
    pub fn events_lost(&self, source: LossSource, n: u64) {
        self.events_lost
            .with_label_values(&[source.label()])
            .inc_by(n);
    }

    /// Takes in the tracer's failure counts (absolute) as increments of
    /// `lookback_errors_total`.
    pub fn observe_errors(&self, tally: &ErrorTally) {
        let mut seen = self.seen();
        for (op, errno, n) in tally.iter() {
            let last = seen.errors.insert((op, errno), n).unwrap_or(0);
            let d = delta(last, n);
            if d > 0 {
                self.errors.with_label_values(&[op, errno]).inc_by(d);
            }
        }
    }

    /// Takes in the kernel's run-time statistics of the loaded programs (absolute values).
    pub fn observe_program_stats(&self, stats: &[ProgramStats]) {
        let mut seen = self.seen();
        // A program the kernel never measured (run-time statistics off: `--bpf-stats` or
        // `kernel.bpf_stats_enabled`) has no series: absent, not a zero that reads as free.
        for s in stats
            .iter()
            .filter(|s| s.run_count != 0 || s.run_time_ns != 0)
        {
            let (last_runs, last_ns) = seen
                .programs
                .insert(s.name.clone(), (s.run_count, s.run_time_ns))
                .unwrap_or_default();
            let runs = delta(last_runs, s.run_count);
            // A reset of one is a reset of both (the program was reloaded).
            let ns = if s.run_count < last_runs {
                s.run_time_ns
            } else {
                delta(last_ns, s.run_time_ns)
            };
            self.bpf
                .runs
                .with_label_values(&[s.name.as_str()])
                .inc_by(runs);
            #[expect(
                clippy::cast_precision_loss,
                reason = "seconds as f64; nanosecond precision past 2^53 ns (104 days) is moot"
            )]
            let secs = ns as f64 / 1e9;
            self.bpf
                .run_seconds
                .with_label_values(&[s.name.as_str()])
                .inc_by(secs);
        }
    }

    /// Reads every kernel-side number from the engine: the counters of each installed rule
    /// and the programs' run-time statistics. Meant for the scrape hook of
    /// [`super::http::HttpState`] or a periodic task. A rule whose counters cannot be read is
    /// skipped (logged at debug) so one bad map read does not hide the other rules.
    pub fn refresh_from_engine(&self, engine: &TriggerEngine) {
        for rule in engine.rules() {
            match engine.counters(rule.id) {
                Ok(c) => self.observe_rule_counters(&rule.name, &c),
                Err(e) => log::debug!("counters of rule {}: {e}", rule.name),
            }
        }
        self.observe_program_stats(&engine.program_stats());
    }

    /// The registry in the Prometheus text exposition format 0.0.4.
    /// One more (`true`) or one fewer connection open to the HTTP endpoint.
    pub fn http_connection(&self, opened: bool) {
        if opened {
            self.http_connections.inc();
        } else {
            self.http_connections.dec();
        }
    }

    /// A connection the HTTP endpoint closed unanswered, for `reason` (one of
    /// [`HTTP_REJECTED_REASONS`]).
    pub fn http_rejected(&self, reason: &str) {
        self.http_rejected.with_label_values(&[reason]).inc();
    }

    pub fn encode(&self) -> Result<String, MetricsError> {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .map_err(MetricsError::Encode)
    }
}

/// Keeps the kernel's eBPF run-time statistics on while alive (`BPF_ENABLE_STATS`, kernel
/// 5.8+). Each program run then costs about 20 ns more (two clock reads); without it, or the
/// `kernel.bpf_stats_enabled` sysctl, the `lookback_bpf_program_*` counters stay at zero.
#[derive(Debug)]
pub struct BpfStatsGuard {
    _fd: OwnedFd,
}

/// Turns the kernel's eBPF run-time statistics on until the guard is dropped.
pub fn enable_bpf_stats() -> Result<BpfStatsGuard, MetricsError> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map(|fd| BpfStatsGuard { _fd: fd })
        .map_err(MetricsError::EnableStats)
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
