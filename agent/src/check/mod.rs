//! What this machine supports, found by trying rather than guessing: loads a BPF program,
//! creates a ring buffer, attaches raw tracepoints, opens a real uprobe, opens the perf
//! events each capture backend needs, and reads the PMU descriptions in sysfs.
//!
//! In: the sysfs/procfs roots ([`Paths`], fixture trees in tests). Out: a
//! [`MachineReport`] (serde-serialisable, stable `snake_case` keys) including the backend
//! `auto` picks and why. Probing never fails as a whole: every item carries its own
//! ✓/✗ and a one-line reason. Nothing here prints.
//!
//! Also here, under the capture stage that uses them too, the machine's limits both this
//! report and the recorders size rings by: the online CPUs ([`cpus`]), the ring memory an
//! unprivileged process may lock ([`lock_budget`]), and the AUX area a PT PMU without
//! multi-entry `ToPA` can take ([`topa`]).
#![forbid(unsafe_code)] // the system calls are in `crate::sys`

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::sys::SyscallError;

mod bpf;
pub mod cpus;
mod kernel;
pub mod lock_budget;
mod pmu;
mod privileges;
pub mod topa;
mod tracefs;
mod uprobe;

pub use kernel::{AUX_PAUSE_VERSION, KernelInfo, KernelVersion, MIN_VERSION};
pub use pmu::{
    AuxPauseReport, ConfigWord, FormatField, IntelPtCaps, IntelPtReport, PmuInfo, PmuReadError,
    read_pmu,
};
#[cfg(test)]
pub(crate) use pmu::{INTEL_PT_FORMAT, write_intel_pt_fixture};
pub use privileges::{Capabilities, own_capabilities};
pub use tracefs::{MOUNT_FIX, TracefsReport};
pub use uprobe::{TargetError, UprobesReport, libc_from_maps, symbol_file_offset};

/// Where the kernel's pseudo file systems are. `Paths::default()` is the live machine;
/// tests point it at fixture trees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// sysfs root, normally `/sys`.
    pub sys: PathBuf,
    /// procfs root, normally `/proc`.
    pub proc: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Self {
            sys: PathBuf::from("/sys"),
            proc: PathBuf::from("/proc"),
        }
    }
}

impl Paths {
    /// `ROOT/sys` and `ROOT/proc`.
    pub fn under(root: &Path) -> Self {
        Self {
            sys: root.join("sys"),
            proc: root.join("proc"),
        }
    }

    /// `/sys/bus/event_source/devices`: one directory per perf PMU.
    pub fn event_sources(&self) -> PathBuf {
        self.sys.join("bus/event_source/devices")
    }
}

/// The outcome of one probe: ✓ with what was found, or ✗ with a one-line reason, the errno
/// when a system call failed, and a command that fixes it when one is known.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Probe {
    pub ok: bool,
    /// What was tried or found (also set on failure when there is context to give).
    pub detail: Option<String>,
    /// Why not, one line; `None` when `ok`.
    pub reason: Option<String>,
    /// Symbolic errno (`"ENOENT"`) when a system call failed.
    pub errno: Option<String>,
    /// A command that fixes the failure, when there is one.
    pub fix: Option<String>,
}

impl Probe {
    pub(crate) fn pass(detail: impl Into<String>) -> Self {
        Self {
            ok: true,
            detail: Some(detail.into()),
            ..Self::default()
        }
    }

    pub(crate) fn fail(reason: impl Into<String>) -> Self {
        Self {
            ok: false,
            reason: Some(reason.into()),
            ..Self::default()
        }
    }

    /// A failed system call: `"{what}: {call} failed: {os error}"`, plus the errno name.
    pub(crate) fn syscall_failed(what: &str, err: &SyscallError) -> Self {
        Self {
            ok: false,
            reason: Some(format!("{what}: {}", error_chain(err))),
            errno: err.errno_name().map(str::to_owned),
            ..Self::default()
        }
    }

    pub(crate) fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    pub(crate) fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// [`Self::with_detail`], after the detail already there (`"; "` between).
    pub(crate) fn with_more_detail(self, detail: impl Into<String>) -> Self {
        let detail = detail.into();
        let joined = match &self.detail {
            Some(before) => format!("{before}; {detail}"),
            None => detail,
        };
        self.with_detail(joined)
    }
}

pub(crate) use crate::sys::error_chain;

/// A capture backend, as named on the command line and in rules files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    IntelPt,
    Sampling,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IntelPt => "intel-pt",
            Self::Sampling => "sampling",
        }
    }
}

/// The perf event the sampling backend samples on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SamplingEvent {
    /// `PERF_COUNT_HW_CPU_CYCLES`, where a hardware PMU exists.
    Cycles,
    /// `PERF_COUNT_SW_CPU_CLOCK`, a software timer: works everywhere, VMs included.
    CpuClock,
}

impl SamplingEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cycles => "cycles",
            Self::CpuClock => "cpu-clock",
        }
    }
}

/// What `lookback check` found. Field names are the JSON keys (a stable contract).
#[derive(Debug, Clone, Serialize)]
pub struct MachineReport {
    pub kernel: KernelInfo,
    /// `BPF_PROG_LOAD` of `r0 = 0; exit` as a socket filter.
    pub bpf: Probe,
    /// `/sys/kernel/btf/vmlinux` present, readable, with the BTF magic.
    pub btf: Probe,
    /// A `BPF_MAP_TYPE_RINGBUF` map created (the trigger → agent channel; Linux 5.8).
    pub ringbuf: Probe,
    /// A raw-tracepoint program attached to `sys_enter`, `sys_exit` and `signal_generate`
    /// (how syscall and signal triggers hook in; needs no tracefs).
    pub raw_tracepoints: Probe,
    pub tracefs: TracefsReport,
    /// A uprobe perf event (the `uprobe` PMU): `CAP_SYS_ADMIN` since Linux 6.16.
    pub uprobes: UprobesReport,
    /// A BPF `uprobe_multi` link (Linux 6.6): `CAP_BPF` + `CAP_PERFMON`. Function rules
    /// take this path when it works.
    pub uprobe_multi: Probe,
    /// Whether this kernel turns a uprobe on a 5-byte NOP into a call (x86-64, Linux ≥ 6.18):
    /// ~0.35 µs per hit instead of a ~7 µs trap. Decided from the version and architecture;
    /// each attached probe's kind is reported by `run`/`attach` (`probe_kind`).
    pub uprobe_nop5_optimization: Probe,
    /// `/proc/sys/kernel/perf_event_paranoid`; `None` when unreadable.
    pub perf_event_paranoid: Option<i32>,
    pub capabilities: Capabilities,
    /// The perf PMUs in `/sys/bus/event_source/devices`, sorted.
    pub pmus: Vec<String>,
    pub intel_pt: IntelPtReport,
    pub aux_pause: AuxPauseReport,
    /// `PERF_TYPE_HARDWARE`/`PERF_COUNT_HW_CPU_CYCLES` opened for this thread.
    pub hardware_pmu: Probe,
    /// `PERF_TYPE_SOFTWARE`/`PERF_COUNT_SW_CPU_CLOCK` opened for this thread.
    pub software_clock: Probe,
    /// What `--backend auto` picks; `None` when no backend can record.
    pub auto_backend: Option<Backend>,
    pub auto_backend_reason: String,
    /// The event the sampling backend would use (also set when `auto` picks intel-pt).
    pub sampling_event: Option<SamplingEvent>,
    /// Which rule kinds this process, with its own capabilities, can install.
    pub rule_kinds: RuleKinds,
    /// Every rule kind (function, syscall, signal) can be installed.
    pub bpf_triggers_usable: bool,
    /// `auto_backend` is set.
    pub backend_usable: bool,
    /// `bpf_triggers_usable && backend_usable`: `lookback check` exits 0.
    pub ok: bool,
}

/// Whether each kind of rule can be installed by this process, as it runs now (its
/// capabilities, this kernel): ✓ with the way it is installed, or ✗ with why not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RuleKinds {
    /// `trigger.function`: uprobes through a `uprobe_multi` link, else a perf event.
    pub function: Probe,
    /// `trigger.syscall`: raw tracepoints `sys_enter`/`sys_exit`.
    pub syscall: Probe,
    /// `trigger.signal`: raw tracepoint `signal_generate`.
    pub signal: Probe,
}

impl RuleKinds {
    /// From the probes of the pieces each kind needs.
    pub fn judge(
        bpf: &Probe,
        ringbuf: &Probe,
        raw_tracepoints: &Probe,
        uprobes: &Probe,
        uprobe_multi: &Probe,
    ) -> Self {
        let base = [("BPF program load", bpf), ("ring buffer", ringbuf)]
            .into_iter()
            .find(|(_, p)| !p.ok)
            .map(|(what, p)| {
                Probe::fail(format!(
                    "{what}: {}",
                    p.reason.as_deref().unwrap_or("failed")
                ))
            });
        let tracepoint = |detail: &str| {
            base.clone().unwrap_or_else(|| {
                if raw_tracepoints.ok {
                    Probe::pass(detail)
                } else {
                    Probe::fail(format!(
                        "raw tracepoints: {}",
                        raw_tracepoints.reason.as_deref().unwrap_or("failed")
                    ))
                }
            })
        };
        let function = base.clone().unwrap_or_else(|| {
            if uprobe_multi.ok {
                Probe::pass("uprobes through uprobe_multi links (CAP_BPF + CAP_PERFMON)")
            } else if uprobes.ok {
                Probe::pass("uprobes through perf events")
            } else {
                Probe::fail(format!(
                    "no uprobe can be placed: uprobe_multi link: {}; uprobe perf event: {}",
                    uprobe_multi.reason.as_deref().unwrap_or("failed"),
                    uprobes.reason.as_deref().unwrap_or("failed"),
                ))
                .with_fix(
                    "Linux 6.6+ with CAP_BPF and CAP_PERFMON (uprobe_multi links), or \
                     CAP_SYS_ADMIN (uprobe perf events)",
                )
            }
        });
        Self {
            function,
            syscall: tracepoint("raw tracepoints sys_enter, sys_exit"),
            signal: tracepoint("raw tracepoint signal_generate"),
        }
    }

    /// All three kinds can be installed.
    pub fn all(&self) -> bool {
        self.function.ok && self.syscall.ok && self.signal.ok
    }
}

/// Probes the live machine.
pub fn probe() -> MachineReport {
    probe_at(&Paths::default())
}

/// Probes with the pseudo file systems at `paths`. The system calls (BPF, perf) always
/// go to the running kernel; only the files read come from `paths`.
pub fn probe_at(paths: &Paths) -> MachineReport {
    let kernel = kernel::probe();
    let bpf = bpf::probe_prog_load();
    let btf = bpf::probe_btf(paths);
    let ringbuf = bpf::probe_ringbuf();
    let raw_tracepoints = bpf::probe_raw_tracepoints();
    let tracefs = tracefs::probe(paths);
    let uprobes = uprobe::probe(paths);
    let uprobe_multi = uprobe::probe_multi(paths);
    let rule_kinds = RuleKinds::judge(
        &bpf,
        &ringbuf,
        &raw_tracepoints,
        &uprobes.status,
        &uprobe_multi,
    );
    let uprobe_nop5_optimization = nop5_optimization(&kernel);
    let perf_event_paranoid = privileges::read_perf_event_paranoid(paths);
    let capabilities = privileges::read_capabilities(paths);
    let pmus = pmu::list_pmus(paths);
    let intel_pt = pmu::probe_intel_pt(paths);
    let aux_pause = pmu::probe_aux_pause(&kernel, &intel_pt);
    let hardware_pmu = pmu::probe_hardware_cycles();
    let software_clock = pmu::probe_cpu_clock();
    let choice = choose_backend(&intel_pt, &hardware_pmu, &software_clock);
    let bpf_triggers_usable = rule_kinds.all();
    let backend_usable = choice.backend.is_some();
    MachineReport {
        kernel,
        bpf,
        btf,
        ringbuf,
        raw_tracepoints,
        tracefs,
        uprobes,
        uprobe_multi,
        uprobe_nop5_optimization,
        perf_event_paranoid,
        capabilities,
        pmus,
        intel_pt,
        aux_pause,
        hardware_pmu,
        software_clock,
        auto_backend: choice.backend,
        auto_backend_reason: choice.reason,
        sampling_event: choice.sampling_event,
        rule_kinds,
        bpf_triggers_usable,
        backend_usable,
        ok: bpf_triggers_usable && backend_usable,
    }
}

/// First kernel that optimizes uprobes on 5-byte NOPs into calls (x86-64).
pub const UPROBE_NOP5_VERSION: KernelVersion = KernelVersion {
    major: 6,
    minor: 18,
    patch: 0,
};

/// Whether uprobes on NOP5 function entries will be optimized on this kernel.
pub fn nop5_optimization(kernel: &KernelInfo) -> Probe {
    let x86_64 = kernel.machine.as_deref() == Some("x86_64");
    match kernel.version {
        Some(v) if x86_64 && v >= UPROBE_NOP5_VERSION => Probe::pass(
            "uprobes on 5-byte NOP entries become calls (~0.35 µs/hit instead of a ~7 µs trap); \
             build hot code with -pg -mfentry -mnop-mcount (see docs/usage.md)",
        ),
        Some(_) if !x86_64 => {
            Probe::fail("uprobe optimization exists only on x86-64: every uprobe is a trap")
        }
        _ => Probe::fail(format!(
            "kernel older than {UPROBE_NOP5_VERSION}: every uprobe is a trap (~7 µs per hit)"
        )),
    }
}

/// A uprobe perf event on `getpid` in this process's libc (what `uprobes` reports).
pub fn probe_uprobe_perf_event() -> Probe {
    uprobe::probe(&Paths::default()).status
}

/// Only the capture-backend probes (`intel_pt`, cycles, cpu-clock; no BPF): what
/// `--backend auto` picks and why. The capture stage calls this when it opens a recorder.
pub fn probe_backend(paths: &Paths) -> BackendChoice {
    let intel_pt = pmu::probe_intel_pt(paths);
    choose_backend(
        &intel_pt,
        &pmu::probe_hardware_cycles(),
        &pmu::probe_cpu_clock(),
    )
}

/// The event the sampling backend uses here: cycles with a hardware PMU, else cpu-clock;
/// `None` when neither opens.
pub fn probe_sampling_event() -> Option<SamplingEvent> {
    // Found once per process: the PMU does not change, and every recorder the agent opens
    // asks (a probe event per recorder, and under EMFILE a misleading "no event opens").
    static FOUND: std::sync::OnceLock<SamplingEvent> = std::sync::OnceLock::new();
    if let Some(&event) = FOUND.get() {
        return Some(event);
    }
    let event = if pmu::probe_hardware_cycles().ok {
        SamplingEvent::Cycles
    } else if pmu::probe_cpu_clock().ok {
        SamplingEvent::CpuClock
    } else {
        return None;
    };
    Some(*FOUND.get_or_init(|| event))
}

/// The outcome of [`choose_backend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendChoice {
    pub backend: Option<Backend>,
    pub sampling_event: Option<SamplingEvent>,
    pub reason: String,
}

/// `auto`: Intel PT when its event opens, else sampling on cycles (hardware PMU) or
/// cpu-clock, else nothing.
pub fn choose_backend(
    intel_pt: &IntelPtReport,
    hardware: &Probe,
    software: &Probe,
) -> BackendChoice {
    let sampling_event = if hardware.ok {
        Some(SamplingEvent::Cycles)
    } else if software.ok {
        Some(SamplingEvent::CpuClock)
    } else {
        None
    };
    if intel_pt.status.ok {
        return BackendChoice {
            backend: Some(Backend::IntelPt),
            sampling_event,
            reason: "intel_pt PMU present and a trace event opens for this process".to_owned(),
        };
    }
    let why_not_pt = intel_pt
        .status
        .reason
        .as_deref()
        .unwrap_or("intel_pt unusable");
    match sampling_event {
        Some(event) => BackendChoice {
            backend: Some(Backend::Sampling),
            sampling_event,
            reason: format!(
                "{why_not_pt}; using the sampling backend ({})",
                event.as_str()
            ),
        },
        None => BackendChoice {
            backend: None,
            sampling_event: None,
            reason: format!(
                "{why_not_pt}; and no sampling event opens (cycles: {}; cpu-clock: {})",
                hardware.reason.as_deref().unwrap_or("failed"),
                software.reason.as_deref().unwrap_or("failed"),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intel_pt(ok: bool, reason: &str) -> IntelPtReport {
        IntelPtReport {
            status: if ok {
                Probe::pass("opened")
            } else {
                Probe::fail(reason)
            },
            present: ok,
            ..IntelPtReport::default()
        }
    }

    #[test]
    fn auto_prefers_intel_pt() {
        let choice = choose_backend(&intel_pt(true, ""), &Probe::fail("x"), &Probe::pass("y"));
        assert_eq!(choice.backend, Some(Backend::IntelPt));
        assert_eq!(choice.sampling_event, Some(SamplingEvent::CpuClock));
    }

    #[test]
    fn auto_falls_back_to_cpu_clock_in_a_vm() {
        let choice = choose_backend(
            &intel_pt(false, "intel_pt PMU not found"),
            &Probe::fail("ENOENT"),
            &Probe::pass("opened"),
        );
        assert_eq!(choice.backend, Some(Backend::Sampling));
        assert_eq!(choice.sampling_event, Some(SamplingEvent::CpuClock));
        assert_eq!(
            choice.reason,
            "intel_pt PMU not found; using the sampling backend (cpu-clock)"
        );
    }

    #[test]
    fn auto_samples_cycles_when_the_hardware_pmu_works() {
        let choice = choose_backend(
            &intel_pt(false, "no"),
            &Probe::pass("cycles"),
            &Probe::pass("clock"),
        );
        assert_eq!(choice.sampling_event, Some(SamplingEvent::Cycles));
    }

    #[test]
    fn auto_gives_up_when_nothing_opens() {
        let choice = choose_backend(&intel_pt(false, "no"), &Probe::fail("a"), &Probe::fail("b"));
        assert_eq!(choice.backend, None);
        assert!(
            choice.reason.contains("cycles: a; cpu-clock: b"),
            "{}",
            choice.reason
        );
    }

    #[test]
    fn backend_names_match_the_cli() {
        assert_eq!(
            serde_json::to_value(Backend::IntelPt).expect("json"),
            "intel-pt"
        );
        assert_eq!(
            serde_json::to_value(SamplingEvent::CpuClock).expect("json"),
            "cpu-clock"
        );
        assert_eq!(Backend::Sampling.as_str(), "sampling");
    }

    #[test]
    fn paths_under_a_root() {
        let paths = Paths::under(Path::new("/tmp/x"));
        assert_eq!(
            paths.event_sources(),
            Path::new("/tmp/x/sys/bus/event_source/devices")
        );
    }

    /// On any machine: probing never panics and the report serialises with the contract's
    /// keys. (The machine-specific expectations live in tests/tests/check.rs.)
    #[test]
    fn live_probe_serialises_with_the_contract_keys() {
        let report = probe();
        let json = serde_json::to_value(&report).expect("json");
        for key in [
            "kernel",
            "bpf",
            "btf",
            "ringbuf",
            "tracefs",
            "uprobes",
            "uprobe_multi",
            "rule_kinds",
            "perf_event_paranoid",
            "capabilities",
            "intel_pt",
            "aux_pause",
            "hardware_pmu",
            "auto_backend",
            "auto_backend_reason",
            "bpf_triggers_usable",
            "ok",
        ] {
            assert!(json.get(key).is_some(), "missing key {key}");
        }
        assert_eq!(
            report.ok,
            report.bpf_triggers_usable && report.backend_usable
        );
    }
}

#[cfg(test)]
mod rule_kind_tests {
    use super::{Probe, RuleKinds};

    #[test]
    fn function_rules_take_a_multi_link_when_the_perf_uprobe_is_refused() {
        let ok = Probe::pass("ok");
        let refused = Probe::fail("uprobe: perf_event_open failed: Permission denied");
        let kinds = RuleKinds::judge(&ok, &ok, &ok, &refused, &ok);
        assert!(kinds.all());
        assert!(
            kinds
                .function
                .detail
                .as_deref()
                .is_some_and(|d| d.contains("uprobe_multi")),
            "{kinds:?}"
        );
    }

    #[test]
    fn function_rules_fail_when_neither_path_works_and_say_what_would() {
        let ok = Probe::pass("ok");
        let kinds = RuleKinds::judge(&ok, &ok, &ok, &Probe::fail("EACCES"), &Probe::fail("EPERM"));
        assert!(!kinds.function.ok && kinds.syscall.ok && kinds.signal.ok);
        let reason = kinds.function.reason.expect("reason");
        assert!(
            reason.contains("EACCES") && reason.contains("EPERM"),
            "{reason}"
        );
        assert!(
            kinds
                .function
                .fix
                .is_some_and(|f| f.contains("CAP_SYS_ADMIN"))
        );
    }

    #[test]
    fn nothing_works_without_bpf() {
        let ok = Probe::pass("ok");
        let kinds = RuleKinds::judge(&Probe::fail("EPERM"), &ok, &ok, &ok, &ok);
        for kind in [&kinds.function, &kinds.syscall, &kinds.signal] {
            assert!(!kind.ok);
            assert!(
                kind.reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("BPF program load"))
            );
        }
        let kinds = RuleKinds::judge(&ok, &ok, &Probe::fail("no"), &ok, &ok);
        assert!(kinds.function.ok && !kinds.syscall.ok && !kinds.signal.ok);
    }
}

#[cfg(test)]
mod nop5_tests {
    use super::{KernelInfo, nop5_optimization};

    #[test]
    fn nop5_optimization_needs_x86_64_and_6_18() {
        assert!(nop5_optimization(&KernelInfo::from_release("6.18.44-fc", "x86_64")).ok);
        assert!(!nop5_optimization(&KernelInfo::from_release("6.17.1", "x86_64")).ok);
        assert!(!nop5_optimization(&KernelInfo::from_release("6.18.0", "aarch64")).ok);
        assert!(!nop5_optimization(&KernelInfo::from_release("garbage", "x86_64")).ok);
    }
}
