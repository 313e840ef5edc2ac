//! Daemon stage: accounting for every process the kernel selected at exec, and for the
//! processes that ran a function rule's binary before its probe was placed.
//!
//! In: the kernel's absolute counts ([`ExecSelected`]: selected at exec by comm, and of
//! those the ones whose exec record the full ring dropped), the agent's handling of each
//! selected exec record it read ([`Outcome`]), and late probes. Out: three extension
//! metrics in the daemon's registry:
//! - `lookback_exec_selected_total`: processes the kernel's target set took at exec;
//! - `lookback_exec_selected_outcomes_total{outcome}`: what became of them, so that the
//!   two reconcile as a count (`selected = traced + gone + not_matching + failed + lost`
//!   once the ring is drained), where before a full ring or a short-lived process made
//!   them disappear without a trace;
//! - `lookback_function_probes_late_total{rule}`: processes started after the rule was
//!   installed that ran before the rule's probe was in their binary (the first process
//!   of a binary the rule does not name: its calls until then are not seen; naming the
//!   binary places the probe when the rule loads).
use prometheus::{IntCounter, IntCounterVec, Registry};

use super::metrics::{MetricsError, counter_vec, delta, register};
use crate::triggers::engine::ExecSelected;

/// What the agent made of a process the kernel selected at exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It matches every selector of a rule and is traced.
    Traced,
    /// It was gone before the agent read its `/proc` entry (with per-CPU rings the kernel
    /// recorded it all the same).
    Gone,
    /// Another selector (exe, cgroup, pod) rejected it; it left the target set.
    NotMatching,
    /// It matches, but the kernel refused to take it into the target set.
    Failed,
}

impl Outcome {
    /// Every outcome the agent counts, plus the kernel's `lost`.
    pub const LABELS: [&'static str; 5] = ["traced", "gone", "not_matching", "failed", "lost"];

    /// The `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Traced => "traced",
            Self::Gone => "gone",
            Self::NotMatching => "not_matching",
            Self::Failed => "failed",
        }
    }
}

/// The accounting metrics; the last kernel counts seen turn absolute values into increments.
pub struct ExecAccounting {
    selected: IntCounter,
    outcomes: IntCounterVec,
    late_probes: IntCounterVec,
}

impl ExecAccounting {
    /// Registers the metrics in `r`, every `outcome` series at 0.
    pub fn new(r: &Registry) -> Result<Self, MetricsError> {
        const SELECTED: &str = "lookback_exec_selected_total";
        let selected = IntCounter::new(
            SELECTED,
            "Processes the kernel took into the target set at exec by their comm (extension).",
        )
        .map_err(|source| MetricsError::Register {
            name: SELECTED,
            source,
        })?;
        let selected = register(r, SELECTED, selected)?;
        let outcomes = counter_vec(
            r,
            "lookback_exec_selected_outcomes_total",
            "What became of the processes the kernel selected at exec: traced, gone \
             (exited before the agent read /proc; per-CPU rings recorded it anyway), \
             not_matching (another selector rejected it), failed, lost (its exec record \
             was dropped from a full ring). Sums to lookback_exec_selected_total \
             (extension).",
            &["outcome"],
        )?;
        for label in Outcome::LABELS {
            outcomes.with_label_values(&[label]).inc_by(0);
        }
        let late_probes = counter_vec(
            r,
            "lookback_function_probes_late_total",
            "Processes that started running a function rule's binary before the rule's \
             probe was placed in it (a binary the rule does not name: its first process \
             is probed when the agent hears of it); their calls until then are not seen \
             (extension).",
            &["rule"],
        )?;
        Ok(Self {
            selected,
            outcomes,
            late_probes,
        })
    }

    /// Takes in the kernel's counts (absolute) given the ones seen `last`.
    pub fn observe_kernel(&self, last: ExecSelected, now: ExecSelected) {
        self.selected.inc_by(delta(last.selected, now.selected));
        let dropped = delta(last.lost, now.lost);
        if dropped > 0 {
            self.outcomes.with_label_values(&["lost"]).inc_by(dropped);
        }
    }

    /// Counts one selected exec record the agent handled.
    pub fn count(&self, outcome: Outcome) {
        self.outcomes.with_label_values(&[outcome.label()]).inc();
    }

    /// Counts one process of `rule` that ran before the rule's probe was placed.
    pub fn count_late_probe(&self, rule: &str) {
        self.late_probes.with_label_values(&[rule]).inc();
    }
}
