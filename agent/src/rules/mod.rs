//! Rules: the first pipeline stage. In: a rules file (YAML, `version: 1`, see contract.md) or
//! `--trigger` specs. Out: validated domain types — a [`RuleSet`] of [`Rule`]s, each a
//! [`Target`], a [`Trigger`] and its capture/snapshot/output policies with defaults merged in.
//!
//! Parsing goes through `Raw*` structs (`raw`) whose leaf values (`leaf`) validate themselves while
//! `serde_yaml` still knows their position; checks across values (`validate`) locate their
//! node afterwards (`locate`). Every content error is reported as `FILE:LINE:COL: message`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

mod error;
mod guard;
mod leaf;
mod locate;
mod names;
mod raw;
mod spec;
mod syscalls;
mod units;
mod upload;
mod validate;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_good;
#[cfg(test)]
mod tests_robust;

pub use error::{RulesError, SpecError};

/// A ring size as `buffer_size:` takes it (a power of two, at least 4 KiB), for the
/// command line's `--buffer-size`: one check for both.
///
/// # Errors
/// The reason, as the rules file gives it.
pub fn parse_buffer_size(text: &str) -> Result<u64, String> {
    use leaf::Scalar as _;
    leaf::BufferSize::parse(text).map(|size| size.0)
}

/// A stack copy size as `stack_size:` takes it (0, or a multiple of 8 up to 60 KiB), for
/// the command line's `--stack-size`.
///
/// # Errors
/// The reason, as the rules file gives it.
pub fn parse_stack_size(text: &str) -> Result<u32, String> {
    use leaf::Scalar as _;
    leaf::StackSize::parse(text).map(|size| size.0)
}

/// A positive integer as the rules file takes one (`sample_frequency:`, `max_per_hour:`),
/// for the command line's numeric options.
///
/// # Errors
/// The reason, as the rules file gives it.
pub fn parse_positive(text: &str) -> Result<u32, String> {
    use leaf::Scalar as _;
    leaf::Positive::parse(text).map(|n| n.0)
}
pub use names::{
    errno_name, errno_number, signal_name, signal_number, syscall_name, syscall_number,
};
pub use spec::parse_trigger_spec;
pub use units::{UnitError, format_duration, format_size, parse_duration, parse_size};
pub use upload::{DEFAULT_MAX_PENDING, ObjectUrl, UploadPolicy};

/// Largest rules file read, in bytes; a bigger file is rejected before parsing.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// The rules of one file, in file order, names unique.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSet {
    pub rules: Vec<Rule>,
}

impl RuleSet {
    /// Reads and validates a rules file. Files over [`MAX_FILE_BYTES`] and files that are
    /// not UTF-8 are rejected with a position like any other content error.
    pub fn from_file(path: &Path) -> Result<RuleSet, RulesError> {
        validate::load_file(path)
    }

    /// Validates rules from `text`; `file_name` is the name used in messages.
    pub fn from_str(text: &str, file_name: &str) -> Result<RuleSet, RulesError> {
        validate::load_str(text, file_name)
    }
}

/// One rule: which processes, what condition, and what to record and keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `[a-z0-9_-]{1,63}`, unique in its file; the `rule` metric label.
    pub name: String,
    pub target: Target,
    pub trigger: Trigger,
    /// Where the debug files of stripped binaries may also come from (`debuginfod:` of the
    /// function trigger, else of `defaults`; default `DEBUGINFOD_URLS`): for placing its
    /// probe and naming its snapshots' frames.
    pub debuginfod: crate::elf::debuginfod::Servers,
    pub capture: Capture,
    pub snapshot: SnapshotPolicy,
    pub output: OutputPolicy,
}

/// Which processes a rule applies to; every field given must match, at least one is given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    pub pid: Option<u32>,
    /// `/proc/PID/comm`, exact (at most 15 bytes, as the kernel truncates).
    pub comm: Option<String>,
    /// `/proc/PID/exe`, resolved absolute path inside the process's root.
    pub exe: Option<PathBuf>,
    /// Prefix of the process's cgroup v2 path, starting with `/`.
    pub cgroup: Option<String>,
    pub kubernetes: Option<KubernetesSelector>,
}

/// Pods and containers a rule applies to; every field given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubernetesSelector {
    pub namespace: Option<String>,
    pub pod_labels: BTreeMap<String, String>,
    pub container: Option<String>,
}

/// The condition, decided in the kernel, that freezes the recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    Function(FunctionTrigger),
    Syscall(SyscallTrigger),
    Signal(SignalTrigger),
}

impl Trigger {
    /// The extra debug directories of a function trigger (none for the others).
    #[must_use]
    pub fn debug_dirs(&self) -> &[PathBuf] {
        match self {
            Self::Function(f) => &f.debug_dirs,
            _ => &[],
        }
    }
}

/// A function entry, or a return after more than `min_duration`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FunctionTrigger {
    pub symbol: String,
    /// The binary defining `symbol`; `None` means the target's `exe` (or, for `--trigger`,
    /// the traced program).
    pub binary: Option<PathBuf>,
    /// `None`: fire on entry.
    pub min_duration: Option<Duration>,
    /// How a latency rule sees the function return.
    pub return_probe: ReturnProbe,
    /// When a latency rule judges a call: at its return, or while it still runs.
    pub detect: Detect,
    /// Probe every function the name selects (overloads, template or generic instances)
    /// instead of refusing an ambiguous name (`all: true`); glob patterns imply it.
    pub all: bool,
    /// Extra directories (host paths) searched first for separate debug files
    /// (`debug_dirs:`, `--debug-dir`).
    pub debug_dirs: Vec<PathBuf>,
}

/// How a function latency rule detects the return (`return_probe:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ReturnProbe {
    /// Uprobes on every instruction that leaves the function (`ret`, tail-call jumps): the
    /// target's stack is never touched. The default.
    #[default]
    Exits,
    /// A uretprobe, which replaces the return address on the target's stack: C++ exceptions
    /// and Rust panics that unwind through the function then abort the program, and Go
    /// crashes (refused there). Only on explicit request.
    Uretprobe,
}

impl ReturnProbe {
    /// The spelling used in files and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exits => "exits",
            Self::Uretprobe => "uretprobe",
        }
    }
}

impl fmt::Display for ReturnProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `exits` or `uretprobe` did not match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown return probe `{0}`: expected exits or uretprobe")]
pub struct ParseReturnProbeError(String);

impl FromStr for ReturnProbe {
    type Err = ParseReturnProbeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [Self::Exits, Self::Uretprobe]
            .into_iter()
            .find(|probe| probe.as_str() == text)
            .ok_or_else(|| ParseReturnProbeError(error::snippet(text)))
    }
}

/// When a latency rule (`min_duration`) judges a call (`detect:`, `--detect`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Detect {
    /// At the return: entry and exit probes measure each call. The default.
    #[default]
    Returned,
    /// While the call still runs, once it has run longer than `min_duration`: calls that
    /// never return fire too. Functions get only the entry probe.
    Running,
}

impl Detect {
    /// The spelling used in files and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Returned => "returned",
            Self::Running => "running",
        }
    }
}

impl fmt::Display for Detect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `returned` or `running` did not match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown detect `{0}`: expected returned or running")]
pub struct ParseDetectError(String);

impl FromStr for Detect {
    type Err = ParseDetectError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [Self::Returned, Self::Running]
            .into_iter()
            .find(|detect| detect.as_str() == text)
            .ok_or_else(|| ParseDetectError(error::snippet(text)))
    }
}

/// Why a trigger's `detect: running` cannot be honoured ([`Trigger::detect_conflict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DetectConflict {
    /// No `min_duration`: nothing says when a running call is slow.
    NoDuration,
    /// A syscall rule with `errno:`: the result exists only at the return.
    Errno,
    /// A function rule with `return_probe: uretprobe`: running places no return probe.
    Uretprobe,
}

impl DetectConflict {
    /// The reason, in the rules file's words.
    pub fn message(self) -> &'static str {
        match self {
            Self::NoDuration => {
                "detect: running needs min_duration (a call is judged slow once it has run \
                 that long)"
            }
            Self::Errno => "an errno is known only at the return: detect: running cannot test it",
            Self::Uretprobe => {
                "detect: running places no return probe: return_probe: uretprobe cannot go \
                 with it"
            }
        }
    }
}

impl Trigger {
    /// The trigger with `detect` set, for a function or syscall trigger (a signal trigger
    /// is returned as it is).
    #[must_use]
    pub fn with_detect(self, detect: Detect) -> Self {
        match self {
            Self::Function(f) => Self::Function(FunctionTrigger { detect, ..f }),
            Self::Syscall(s) => Self::Syscall(SyscallTrigger { detect, ..s }),
            signal @ Self::Signal(_) => signal,
        }
    }

    /// When the trigger judges a call slow: at its return (signal triggers too) or while
    /// it runs.
    #[must_use]
    pub fn detect(&self) -> Detect {
        match self {
            Self::Function(f) => f.detect,
            Self::Syscall(s) => s.detect,
            Self::Signal(_) => Detect::Returned,
        }
    }

    /// Why the trigger's `detect: running` cannot be honoured; `None` when it can, or when
    /// the trigger detects at the return.
    #[must_use]
    pub fn detect_conflict(&self) -> Option<DetectConflict> {
        match self {
            Self::Function(f) if f.detect == Detect::Running => {
                if f.min_duration.is_none() {
                    Some(DetectConflict::NoDuration)
                } else if f.return_probe == ReturnProbe::Uretprobe {
                    Some(DetectConflict::Uretprobe)
                } else {
                    None
                }
            }
            Self::Syscall(s) if s.detect == Detect::Running => {
                if s.min_duration.is_none() {
                    Some(DetectConflict::NoDuration)
                } else if !s.errnos.is_empty() {
                    Some(DetectConflict::Errno)
                } else {
                    None
                }
            }
            _ => None,
        }
    }
}

/// Which syscalls a syscall trigger watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyscallSet {
    Any,
    /// x86-64 syscall numbers, in the order given, without repeats.
    Numbers(Vec<u32>),
}

/// A syscall returning after more than `min_duration` and/or failing with one of `errnos`
/// (both must hold when both are given; neither: every return fires).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallTrigger {
    pub syscalls: SyscallSet,
    pub min_duration: Option<Duration>,
    /// Positive errno values (the syscall returned `-errno`); empty: any result.
    pub errnos: Vec<u32>,
    /// When a latency rule judges a call: at its return, or while it still runs.
    pub detect: Detect,
}

/// Delivery of one of `signals` (numbers, 1–64) to the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalTrigger {
    pub signals: Vec<u32>,
}

/// The recorder backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Intel PT where usable, else sampling (`lookback check` says which and why).
    #[default]
    Auto,
    IntelPt,
    Sampling,
}

impl Backend {
    /// The spelling used in files, flags and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::IntelPt => "intel-pt",
            Self::Sampling => "sampling",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `auto`, `intel-pt` or `sampling` did not match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{0}`: expected auto, intel-pt or sampling")]
pub struct ParseBackendError(String);

impl FromStr for Backend {
    type Err = ParseBackendError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [Self::Auto, Self::IntelPt, Self::Sampling]
            .into_iter()
            .find(|backend| backend.as_str() == text)
            .ok_or_else(|| ParseBackendError(error::snippet(text)))
    }
}

/// The default `stack_size`: what `perf record --call-graph dwarf` copies. A sample is
/// then 8,288 bytes, so the default 4 MiB ring keeps 506 samples: 50 ms at 10 kHz.
pub const DEFAULT_STACK_SIZE: u32 = 8 << 10;

/// What to record. Defaults: `auto`, 4 MiB, 10 000 Hz, 8 KiB stacks, user space only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    pub backend: Backend,
    /// PT AUX buffer per traced thread/CPU, bytes; a power of two, at least 4 KiB.
    pub buffer_size: u64,
    /// Hz, sampling backend; at least 1.
    pub sample_frequency: u32,
    /// Sampling backend: bytes of user stack copied with each sample for unwinding at
    /// decode time (0: frame-pointer callchains only).
    pub stack_size: u32,
    pub include_kernel: bool,
    /// Intel PT only: trace only the code of these binaries (address filters, at most the
    /// CPU's `nr_addr_filters`); empty: all code. The sampling backend ignores it.
    pub trace_binaries: Vec<PathBuf>,
    /// The agent, sampling backend: record this rule's targets in rings of their own per
    /// process (`true`) instead of the per-CPU rings all targets share (the default), so a
    /// busy neighbour cannot shorten their window. `run`/`attach` always record their
    /// processes in rings of their own.
    pub isolate: bool,
    /// The agent, per-CPU rings: whose records a snapshot keeps besides the triggering
    /// process's (a whole service's last moments).
    pub peers: Peers,
}

impl Default for Capture {
    fn default() -> Self {
        Self {
            backend: Backend::Auto,
            buffer_size: 4 << 20,
            sample_frequency: 10_000,
            stack_size: DEFAULT_STACK_SIZE,
            include_kernel: false,
            trace_binaries: Vec::new(),
            isolate: false,
            peers: Peers::None,
        }
    }
}

/// When to take snapshots. Defaults: 10 s cooldown, 60 per hour, per process, no
/// post-trigger recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// Minimum time between two snapshots of one rule (in one process, by `scope`).
    pub cooldown: Duration,
    /// At least 1.
    pub max_per_hour: u32,
    /// Keep recording this long after the trigger.
    pub post_trigger: Duration,
    /// What the cooldown and the hourly limit count over.
    pub scope: SnapshotScope,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        Self {
            cooldown: Duration::from_secs(10),
            max_per_hour: 60,
            post_trigger: Duration::ZERO,
            scope: SnapshotScope::Process,
        }
    }
}

/// `capture.peers`: which other processes' records a snapshot of the agent's per-CPU
/// rings keeps. `true` means the rule's own: a trigger of one service must not put the
/// stacks of another tenant's processes that shared the CPUs into its snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Peers {
    /// Only the triggering process's (`false`, the default).
    #[default]
    None,
    /// Those of every process this rule selects, and of their children (`true`, `rule`).
    Rule,
    /// Those of every target of any rule with samples in the rings (`all`).
    All,
}

impl Peers {
    /// The spelling used in files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "false",
            Self::Rule => "true",
            Self::All => "all",
        }
    }
}

/// Not `false`, `true`, `rule` or `all`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown peers `{0}`: expected false, true (this rule's processes and their children; also `rule`) or all (every target in the rings)"
)]
pub struct ParsePeersError(String);

impl FromStr for Peers {
    type Err = ParsePeersError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "false" => Ok(Self::None),
            "true" | "rule" => Ok(Self::Rule),
            "all" => Ok(Self::All),
            _ => Err(ParsePeersError(error::snippet(text))),
        }
    }
}

/// `snapshot.scope`: whether the cooldown and the hourly limit are kept per rule and
/// process (the default: a noisy process cannot use up another's snapshots) or per rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SnapshotScope {
    #[default]
    Process,
    Rule,
}

impl SnapshotScope {
    /// The spelling used in files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Process => "process",
            Self::Rule => "rule",
        }
    }
}

impl fmt::Display for SnapshotScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `process` or `rule` did not match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scope `{0}`: expected process or rule")]
pub struct ParseScopeError(String);

impl FromStr for SnapshotScope {
    type Err = ParseScopeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [Self::Process, Self::Rule]
            .into_iter()
            .find(|scope| scope.as_str() == text)
            .ok_or_else(|| ParseScopeError(error::snippet(text)))
    }
}

/// The trace file format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum OutputFormat {
    /// Fuchsia trace format (Perfetto, magic-trace), gzipped.
    #[default]
    Fxt,
    /// Chrome trace JSON (`chrome://tracing`, speedscope), gzipped.
    ChromeJson,
}

impl OutputFormat {
    /// The spelling used in files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fxt => "fxt",
            Self::ChromeJson => "chrome-json",
        }
    }
}

impl fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `fxt` or `chrome-json` did not match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown output format `{0}`: expected fxt or chrome-json")]
pub struct ParseOutputFormatError(String);

impl FromStr for OutputFormat {
    type Err = ParseOutputFormatError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [Self::Fxt, Self::ChromeJson]
            .into_iter()
            .find(|format| format.as_str() == text)
            .ok_or_else(|| ParseOutputFormatError(error::snippet(text)))
    }
}

/// Where and how snapshots are written. Defaults: no directory (the agent's
/// `--output-dir` or its own default applies), FXT, raw snapshot kept, 200 files / 2 GiB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPolicy {
    pub dir: Option<PathBuf>,
    pub format: OutputFormat,
    /// Also keep the raw `.lbsnap`.
    pub keep_raw: bool,
    pub retention: Retention,
    /// Where snapshots go once written locally (the rule's directory is then their
    /// spool); `None`: they stay on this machine.
    pub upload: Option<UploadPolicy>,
}

impl Default for OutputPolicy {
    fn default() -> Self {
        Self {
            dir: None,
            format: OutputFormat::Fxt,
            keep_raw: true,
            retention: Retention::default(),
            upload: None,
        }
    }
}

/// How much of a rule's output to keep; the oldest files go first. Defaults: 200 files,
/// 2 GiB. Both at least 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    pub max_files: u32,
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_files: 200,
            max_bytes: 2 << 30,
        }
    }
}

impl Target {
    /// Whether no field is given (such a target is rejected by the rules file).
    pub fn is_empty(&self) -> bool {
        self.pid.is_none()
            && self.comm.is_none()
            && self.exe.is_none()
            && self.cgroup.is_none()
            && self
                .kubernetes
                .as_ref()
                .is_none_or(KubernetesSelector::is_empty)
    }
}

impl KubernetesSelector {
    /// Whether no field is given.
    pub fn is_empty(&self) -> bool {
        self.namespace.is_none() && self.pod_labels.is_empty() && self.container.is_none()
    }
}

/// `pid=1234 comm=myserver exe=/usr/bin/myserver cgroup=/kubepods.slice
/// k8s:namespace=prod,app=api,container=server`.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(pid) = self.pid {
            parts.push(format!("pid={pid}"));
        }
        if let Some(comm) = &self.comm {
            parts.push(format!("comm={comm}"));
        }
        if let Some(exe) = &self.exe {
            parts.push(format!("exe={}", exe.display()));
        }
        if let Some(cgroup) = &self.cgroup {
            parts.push(format!("cgroup={cgroup}"));
        }
        if let Some(k8s) = &self.kubernetes {
            let mut fields = Vec::new();
            if let Some(namespace) = &k8s.namespace {
                fields.push(format!("namespace={namespace}"));
            }
            fields.extend(k8s.pod_labels.iter().map(|(k, v)| format!("{k}={v}")));
            if let Some(container) = &k8s.container {
                fields.push(format!("container={container}"));
            }
            parts.push(format!("k8s:{}", fields.join(",")));
        }
        f.write_str(&parts.join(" "))
    }
}
