//! perf PMUs: the sysfs description of a PMU (`type`, `format/*`, `caps/*`,
//! `nr_addr_filters`), the `intel_pt` PMU and its capabilities, `aux_pause` support
//! (Linux 6.13), and the events the sampling backend needs (hardware cycles, software
//! cpu-clock). Every verdict comes from a real `perf_event_open` of this process.
//!
//! The sysfs reading is public so that the capture stage can reuse it for the Intel PT
//! config bits (`format/`).

use std::{
    collections::BTreeMap,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use perf_event_open_sys::bindings::{
    PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_SW_CPU_CLOCK, PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE,
};
use serde::Serialize;

use super::{KernelInfo, Paths, Probe, kernel::AUX_PAUSE_VERSION};
use crate::sys::{
    SyscallError,
    perf::{self, Target, perf_event_attr},
};

/// `perf_event_attr.aux_action` bit 0: create the AUX event paused (Linux 6.13).
const AUX_START_PAUSED: u32 = 1;

/// Reads a file holding one decimal `u32`; the error is a one-line reason.
pub(crate) fn read_u32(path: &Path) -> Result<u32, String> {
    let text = std::fs::read_to_string(path).map_err(|err| format!("{}: {err}", path.display()))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{}: not a number: {:?}", path.display(), text.trim()))
}

/// Which `perf_event_attr` word a format field lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfigWord {
    Config,
    Config1,
    Config2,
    Config3,
    Config4,
}

/// One `format/NAME` entry of a PMU: `config:14-17`, `config:0,3`, `config1:0-63`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatField {
    pub word: ConfigWord,
    /// Bit ranges (inclusive, low to high as written); the value's bits fill them in order.
    pub ranges: Vec<(u8, u8)>,
}

impl FormatField {
    /// Parses a format file's text. `None` for anything malformed (unknown word, bit > 63,
    /// reversed range, empty).
    pub fn parse(text: &str) -> Option<Self> {
        let (word, bits) = text.trim().split_once(':')?;
        let word = match word {
            "config" => ConfigWord::Config,
            "config1" => ConfigWord::Config1,
            "config2" => ConfigWord::Config2,
            "config3" => ConfigWord::Config3,
            "config4" => ConfigWord::Config4,
            _ => return None,
        };
        let ranges = bits
            .split(',')
            .map(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                let (lo, hi) = (lo.trim().parse::<u8>().ok()?, hi.trim().parse::<u8>().ok()?);
                (lo <= hi && hi < 64).then_some((lo, hi))
            })
            .collect::<Option<Vec<_>>>()?;
        (!ranges.is_empty()).then_some(Self { word, ranges })
    }

    /// Total width in bits.
    pub fn width(&self) -> u32 {
        self.ranges
            .iter()
            .map(|&(lo, hi)| u32::from(hi - lo) + 1)
            .sum()
    }

    /// The bit number when this is a single bit of `config` (like `retprobe`, `pt`, `tsc`).
    pub fn single_config_bit(&self) -> Option<u32> {
        match (self.word, self.ranges.as_slice()) {
            (ConfigWord::Config, &[(lo, hi)]) if lo == hi => Some(u32::from(lo)),
            _ => None,
        }
    }

    /// `value` placed into the field's bits; `None` when it does not fit.
    pub fn encode(&self, value: u64) -> Option<u64> {
        if self.width() < 64 && value >> self.width() != 0 {
            return None;
        }
        let mut rest = value;
        let mut out = 0u64;
        for &(lo, hi) in &self.ranges {
            let width = u32::from(hi - lo) + 1;
            let mask = if width == 64 {
                u64::MAX
            } else {
                (1u64 << width) - 1
            };
            out |= (rest & mask) << lo;
            rest = rest.checked_shr(width).unwrap_or(0);
        }
        Some(out)
    }
}

/// The sysfs description of one PMU (`/sys/bus/event_source/devices/NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmuInfo {
    pub name: String,
    pub dir: PathBuf,
    /// `type`: the `perf_event_attr.type` to use; `Err` with the reason when unreadable.
    pub pmu_type: Result<u32, String>,
    /// `format/*`, trimmed text (`"config:0"`); unreadable entries are skipped.
    pub format: BTreeMap<String, String>,
    /// `caps/*`, trimmed text (`"1"`, `"249"`); unreadable entries are skipped.
    pub caps: BTreeMap<String, String>,
    /// `nr_addr_filters` (PMUs that support address filters).
    pub nr_addr_filters: Option<u32>,
}

/// Why a PMU's sysfs directory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PmuReadError {
    #[error("{} missing", dir.display())]
    NotFound { dir: PathBuf },
    #[error("cannot read {}", dir.display())]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Reads `DEVICES/NAME` (`DEVICES` is `/sys/bus/event_source/devices`).
pub fn read_pmu(devices: &Path, name: &str) -> Result<PmuInfo, PmuReadError> {
    let dir = devices.join(name);
    match std::fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(PmuReadError::NotFound { dir }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(PmuReadError::NotFound { dir });
        }
        Err(source) => return Err(PmuReadError::Io { dir, source }),
    }
    Ok(PmuInfo {
        name: name.to_owned(),
        pmu_type: read_u32(&dir.join("type")),
        format: read_dir_entries(&dir.join("format")),
        caps: read_dir_entries(&dir.join("caps")),
        nr_addr_filters: read_u32(&dir.join("nr_addr_filters")).ok(),
        dir,
    })
}

/// Every regular file of `dir` with its trimmed text; nothing when `dir` is missing.
fn read_dir_entries(dir: &Path) -> BTreeMap<String, String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let text = std::fs::read_to_string(entry.path()).ok()?;
            Some((name, text.trim().to_owned()))
        })
        .collect()
}

/// The PMU names in `/sys/bus/event_source/devices`, sorted.
pub(super) fn list_pmus(paths: &Paths) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(paths.event_sources()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// The Intel PT capabilities lookback cares about, decoded from `caps/*` (`None`: the file
/// is missing or unparsable). `raw` keeps every caps file as read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IntelPtCaps {
    /// Configurable PSB frequency and cycle-accurate mode (CYC packets).
    pub psb_cyc: Option<bool>,
    /// CYC packets usable: `psb_cyc` and a `cyc` format field.
    pub cyc: Option<bool>,
    /// MTC timing packets.
    pub mtc: Option<bool>,
    /// IP filtering (address ranges) and `TraceStop`.
    pub ip_filtering: Option<bool>,
    pub cr3_filtering: Option<bool>,
    pub ptwrite: Option<bool>,
    pub power_event_trace: Option<bool>,
    pub topa_output: Option<bool>,
    pub topa_multiple_entries: Option<bool>,
    pub single_range_output: Option<bool>,
    /// Address ranges the hardware filters on (`caps/num_address_ranges`).
    pub num_address_ranges: Option<u32>,
    /// Address filters perf offers (`nr_addr_filters`).
    pub nr_addr_filters: Option<u32>,
    /// Allowed `mtc_period` values (bitmap `caps/mtc_periods`).
    pub mtc_periods: Option<Vec<u32>>,
    /// Allowed `cyc_thresh` values (bitmap `caps/cycle_thresholds`, after the kernel's
    /// `PT_CAP_cycle_thresholds`; not `cyc_thresholds`).
    pub cycle_thresholds: Option<Vec<u32>>,
    /// Allowed `psb_period` values (bitmap `caps/psb_periods`).
    pub psb_periods: Option<Vec<u32>>,
    pub raw: BTreeMap<String, String>,
}

fn parse_bool(text: &str) -> Option<bool> {
    match text.trim() {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}

/// A hex bitmap (`"249"`, as the kernel prints `%x`) as the list of set bit numbers.
fn parse_bitmap(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    let text = text.strip_prefix("0x").unwrap_or(text);
    let bits = u64::from_str_radix(text, 16).ok()?;
    Some((0..64).filter(|bit| bits & (1u64 << bit) != 0).collect())
}

impl IntelPtCaps {
    pub fn from_pmu(pmu: &PmuInfo) -> Self {
        let flag = |name: &str| pmu.caps.get(name).and_then(|v| parse_bool(v));
        let bitmap = |name: &str| pmu.caps.get(name).and_then(|v| parse_bitmap(v));
        let psb_cyc = flag("psb_cyc");
        Self {
            psb_cyc,
            cyc: psb_cyc.map(|b| b && pmu.format.contains_key("cyc")),
            mtc: flag("mtc"),
            ip_filtering: flag("ip_filtering"),
            cr3_filtering: flag("cr3_filtering"),
            ptwrite: flag("ptwrite"),
            power_event_trace: flag("power_event_trace"),
            topa_output: flag("topa_output"),
            topa_multiple_entries: flag("topa_multiple_entries"),
            single_range_output: flag("single_range_output"),
            num_address_ranges: pmu
                .caps
                .get("num_address_ranges")
                .and_then(|v| v.parse().ok()),
            nr_addr_filters: pmu.nr_addr_filters,
            mtc_periods: bitmap("mtc_periods"),
            cycle_thresholds: bitmap("cycle_thresholds"),
            psb_periods: bitmap("psb_periods"),
            raw: pmu.caps.clone(),
        }
    }
}

/// The `intel_pt` PMU: present in sysfs, what it offers, and whether a trace event for this
/// process really opens (`status.ok`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct IntelPtReport {
    #[serde(flatten)]
    pub status: Probe,
    /// `/sys/bus/event_source/devices/intel_pt` exists.
    pub present: bool,
    pub pmu_type: Option<u32>,
    pub caps: IntelPtCaps,
    /// `format/*` as read (`"tsc": "config:10"`).
    pub format: BTreeMap<String, String>,
    /// An event created with `aux_start_paused` opened (`None` when the plain event does
    /// not open, so the question cannot be asked).
    pub aux_start_paused: Option<bool>,
}

/// The attr of a disabled, user-space-only event of `type_`/`config` for this thread.
fn user_attr(type_: u32, config: u64) -> perf_event_attr {
    let mut attr = perf_event_attr {
        type_,
        config,
        ..perf_event_attr::default()
    };
    attr.set_disabled(1);
    attr.set_exclude_kernel(1);
    attr.set_exclude_hv(1);
    attr
}

/// Opens a user-space Intel PT event for this thread (config 0: the driver's defaults,
/// branch tracing on), optionally created paused.
fn open_intel_pt(pmu_type: u32, start_paused: bool) -> Result<OwnedFd, SyscallError> {
    let mut attr = user_attr(pmu_type, 0);
    if start_paused {
        attr.__bindgen_anon_5.aux_action = AUX_START_PAUSED;
    }
    perf::perf_event_open(&attr, Target::CurrentThread, None, None, 0)
}

pub(super) fn probe_intel_pt(paths: &Paths) -> IntelPtReport {
    intel_pt_report(&paths.event_sources(), open_intel_pt)
}

/// The testable half of [`probe_intel_pt`]: `open(type, start_paused)` makes the event.
pub(super) fn intel_pt_report(
    devices: &Path,
    open: impl Fn(u32, bool) -> Result<OwnedFd, SyscallError>,
) -> IntelPtReport {
    let pmu = match read_pmu(devices, "intel_pt") {
        Ok(pmu) => pmu,
        Err(PmuReadError::NotFound { dir }) => {
            return IntelPtReport {
                status: Probe::fail(format!(
                    "intel_pt PMU not found ({} missing): this is a VM or a non-Intel CPU",
                    dir.display()
                )),
                ..IntelPtReport::default()
            };
        }
        Err(err) => {
            return IntelPtReport {
                status: Probe::fail(super::error_chain(&err)),
                ..IntelPtReport::default()
            };
        }
    };
    let mut report = IntelPtReport {
        present: true,
        pmu_type: pmu.pmu_type.as_ref().ok().copied(),
        caps: IntelPtCaps::from_pmu(&pmu),
        format: pmu.format.clone(),
        ..IntelPtReport::default()
    };
    let pmu_type = match &pmu.pmu_type {
        Ok(t) => *t,
        Err(reason) => {
            report.status = Probe::fail(format!(
                "intel_pt PMU present but its type is unusable: {reason}"
            ));
            return report;
        }
    };
    match open(pmu_type, false) {
        Ok(_fd) => {
            report.status = Probe::pass(format!(
                "intel_pt PMU type {pmu_type}: a user-space trace event for this thread opened"
            ));
            // Opening is not mapping: an unprivileged user's locked-memory limit decides
            // how large the rings can be.
            let cpus = super::cpus::online_cpu_count();
            if let (Some(page), Some(cpus)) = (crate::sys::page_size(), cpus)
                && let Some(note) = super::lock_budget::default_rings_note(
                    super::lock_budget::LockBudget::of_this_process(cpus),
                    cpus,
                    page,
                )
            {
                report.status = report.status.with_detail(note);
            }
            if let Some(note) = topa_note(&report.caps, crate::sys::page_size()) {
                report.status = report.status.with_more_detail(note);
            }
            report.aux_start_paused = Some(open(pmu_type, true).is_ok());
        }
        Err(err) => {
            let mut status =
                Probe::syscall_failed("intel_pt present but the trace event failed", &err);
            status = match err.errno() {
                Some(libc::EPERM | libc::EACCES) => {
                    status.with_fix("run as root (or grant CAP_PERFMON)")
                }
                Some(libc::EBUSY) => status.with_detail("another tool is using Intel PT"),
                _ => status,
            };
            report.status = status;
        }
    }
    report
}

/// What a CPU whose `ToPA` holds one entry means for the rings ([`super::topa`]).
fn topa_note(caps: &IntelPtCaps, page: Option<usize>) -> Option<String> {
    let limit = super::topa::AuxLimit::of_this_kernel(caps.topa_multiple_entries);
    let largest = page? << limit.max_order;
    limit.single_chunk.then(|| {
        format!(
            "this CPU's ToPA holds one entry: the AUX area is one physical block, at most {} \
             KiB per CPU (a larger --buffer-size is capped, and halved when no such block is \
             free)",
            largest >> 10
        )
    })
}

/// `aux_pause`: pausing the PT trace from another event of its group, in the kernel, at the
/// trigger itself (Linux 6.13: `perf_event_attr.aux_action`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuxPauseReport {
    /// `ok`: usable here (the kernel knows `aux_action` and `intel_pt` accepts it).
    #[serde(flatten)]
    pub status: Probe,
    /// The kernel understands `aux_action` (probed: a software event with
    /// `aux_start_paused` fails with `EOPNOTSUPP`, not `EINVAL`); `None`: inconclusive.
    pub kernel_supports: Option<bool>,
    /// `intel_pt` accepts `aux_start_paused`; `None` when `intel_pt` does not open.
    pub pmu_supports: Option<bool>,
    /// The running kernel is at least 6.13.
    pub kernel_version_supports: Option<bool>,
}

/// Whether the kernel parses `aux_action`: older kernels reject the then-reserved field
/// with `EINVAL`; 6.13+ refuses `aux_start_paused` on a PMU without the capability with
/// `EOPNOTSUPP`.
fn kernel_knows_aux_action() -> Option<bool> {
    let mut attr = user_attr(PERF_TYPE_SOFTWARE, u64::from(PERF_COUNT_SW_CPU_CLOCK));
    attr.__bindgen_anon_5.aux_action = AUX_START_PAUSED;
    match perf::perf_event_open(&attr, Target::CurrentThread, None, None, 0) {
        Ok(_) => Some(true),
        Err(err) => match err.errno() {
            Some(libc::EOPNOTSUPP) => Some(true),
            Some(libc::EINVAL | libc::E2BIG) => Some(false),
            _ => None,
        },
    }
}

pub(super) fn probe_aux_pause(kernel: &KernelInfo, intel_pt: &IntelPtReport) -> AuxPauseReport {
    aux_pause_report(kernel, intel_pt, kernel_knows_aux_action())
}

/// The testable half of [`probe_aux_pause`].
pub(super) fn aux_pause_report(
    kernel: &KernelInfo,
    intel_pt: &IntelPtReport,
    kernel_supports: Option<bool>,
) -> AuxPauseReport {
    let kernel_version_supports = kernel.version.map(|v| v >= AUX_PAUSE_VERSION);
    let how = match kernel_supports {
        Some(true) => {
            "probed: a cpu-clock event with aux_start_paused was refused with \
                       EOPNOTSUPP (the field is parsed), not EINVAL (reserved)"
        }
        Some(false) => {
            "probed: a cpu-clock event with aux_start_paused was refused with \
                        EINVAL (the field is still reserved)"
        }
        None => "the probe was inconclusive; judged by the kernel version",
    };
    let kernel_supports = kernel_supports.or(kernel_version_supports);
    let pmu_supports = intel_pt.aux_start_paused;
    let status = match (kernel_supports, pmu_supports) {
        (Some(true), Some(true)) => {
            Probe::pass("kernel and intel_pt accept aux_start_paused/aux_pause/aux_resume")
        }
        (Some(false), _) => Probe::fail(format!(
            "kernel does not know perf_event_attr.aux_action (needs Linux {AUX_PAUSE_VERSION}+); \
             snapshots freeze from userspace instead"
        )),
        (_, Some(false)) => {
            Probe::fail("intel_pt refused aux_start_paused (PMU without the AUX pause capability)")
        }
        (Some(true), None) => Probe::fail(
            "kernel supports aux_pause (perf_event_attr.aux_action) but intel_pt is not usable",
        ),
        (None, _) => Probe::fail("cannot tell whether the kernel supports aux_pause"),
    };
    AuxPauseReport {
        status: status.with_detail(how),
        kernel_supports,
        pmu_supports,
        kernel_version_supports,
    }
}

/// `reason` plus a hint for the errnos that mean "no hardware PMU".
pub(super) fn probe_hardware_cycles() -> Probe {
    let attr = user_attr(PERF_TYPE_HARDWARE, u64::from(PERF_COUNT_HW_CPU_CYCLES));
    match perf::perf_event_open(&attr, Target::CurrentThread, None, None, 0) {
        Ok(_fd) => Probe::pass("PERF_TYPE_HARDWARE cycles opened for this thread"),
        Err(err) => {
            let probe = Probe::syscall_failed("cycles (PERF_TYPE_HARDWARE)", &err);
            match err.errno() {
                Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV) => probe.with_detail(
                    "no hardware PMU: usual in a VM without a virtual PMU; cpu-clock samples instead",
                ),
                Some(libc::EACCES | libc::EPERM) => {
                    probe.with_fix("run as root, or lower kernel.perf_event_paranoid")
                }
                _ => probe,
            }
        }
    }
}

pub(super) fn probe_cpu_clock() -> Probe {
    let attr = user_attr(PERF_TYPE_SOFTWARE, u64::from(PERF_COUNT_SW_CPU_CLOCK));
    match perf::perf_event_open(&attr, Target::CurrentThread, None, None, 0) {
        Ok(_fd) => Probe::pass("PERF_TYPE_SOFTWARE cpu-clock opened for this thread"),
        Err(err) => {
            let probe = Probe::syscall_failed("cpu-clock (PERF_TYPE_SOFTWARE)", &err);
            if matches!(err.errno(), Some(libc::EACCES | libc::EPERM)) {
                probe.with_fix("run as root, or set kernel.perf_event_paranoid to 2 or lower")
            } else {
                probe
            }
        }
    }
}

/// The `intel_pt` format files as Linux 6.x writes them (`arch/x86/events/intel/pt.c`).
#[cfg(test)]
pub(crate) const INTEL_PT_FORMAT: &[(&str, &str)] = &[
    ("pt", "config:0"),
    ("cyc", "config:1"),
    ("pwr_evt", "config:4"),
    ("fup_on_ptw", "config:5"),
    ("mtc", "config:9"),
    ("tsc", "config:10"),
    ("noretcomp", "config:11"),
    ("ptw", "config:12"),
    ("branch", "config:13"),
    ("mtc_period", "config:14-17"),
    ("cyc_thresh", "config:19-22"),
    ("psb_period", "config:24-27"),
    ("event", "config:31"),
    ("notnt", "config:55"),
];

/// A realistic `intel_pt` sysfs tree (Ice Lake-ish values, Linux 6.x names) under
/// `devices`; returns its directory (tests here and of the PT recorder).
#[cfg(test)]
pub(crate) fn write_intel_pt_fixture(devices: &Path) -> PathBuf {
    let dir = devices.join("intel_pt");
    std::fs::create_dir_all(dir.join("format")).expect("mkdir");
    std::fs::create_dir_all(dir.join("caps")).expect("mkdir");
    std::fs::write(dir.join("type"), "9\n").expect("write");
    std::fs::write(dir.join("nr_addr_filters"), "2\n").expect("write");
    std::fs::write(dir.join("max_nonturbo_ratio"), "20\n").expect("write");
    for (name, spec) in INTEL_PT_FORMAT {
        std::fs::write(dir.join("format").join(name), format!("{spec}\n")).expect("write");
    }
    for (name, value) in [
        ("max_subleaf", "1"),
        ("cr3_filtering", "1"),
        ("psb_cyc", "1"),
        ("ip_filtering", "1"),
        ("mtc", "1"),
        ("ptwrite", "1"),
        ("power_event_trace", "0"),
        ("event_trace", "0"),
        ("tnt_disable", "0"),
        ("topa_output", "1"),
        ("topa_multiple_entries", "1"),
        ("single_range_output", "1"),
        ("output_subsys", "0"),
        ("payloads_lip", "0"),
        ("num_address_ranges", "2"),
        ("mtc_periods", "249"),
        ("cycle_thresholds", "3fff"),
        ("psb_periods", "3f"),
    ] {
        std::fs::write(dir.join("caps").join(name), format!("{value}\n")).expect("write");
    }
    dir
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn fake_fd() -> OwnedFd {
        std::fs::File::open("/dev/null").expect("/dev/null").into()
    }

    fn errno(call: &'static str, errno: i32) -> SyscallError {
        SyscallError {
            call,
            source: io::Error::from_raw_os_error(errno),
        }
    }

    #[test]
    fn format_fields_parse() {
        let f = FormatField::parse("config:14-17\n").expect("range");
        assert_eq!(
            f,
            FormatField {
                word: ConfigWord::Config,
                ranges: vec![(14, 17)]
            }
        );
        assert_eq!(f.width(), 4);
        assert_eq!(f.encode(3), Some(3 << 14));
        assert_eq!(f.encode(16), None);
        assert_eq!(f.single_config_bit(), None);
        assert_eq!(
            FormatField::parse("config:10").and_then(|f| f.single_config_bit()),
            Some(10)
        );
        let split = FormatField::parse("config:0-1,8-9").expect("split");
        assert_eq!(split.encode(0b1011), Some(0b10_0000_0011));
        let whole = FormatField::parse("config1:0-63").expect("whole word");
        assert_eq!(whole.word, ConfigWord::Config1);
        assert_eq!(whole.encode(u64::MAX), Some(u64::MAX));
        assert_eq!(
            FormatField::parse("config3:0").map(|f| f.word),
            Some(ConfigWord::Config3)
        );
    }

    #[test]
    fn garbage_format_fields_do_not_parse() {
        for bad in [
            "",
            "config",
            "config:",
            "config:64",
            "config:5-3",
            "config2:a-b",
            "cfg:1",
            "config:1,",
        ] {
            assert_eq!(FormatField::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bitmaps_decode_to_allowed_values() {
        assert_eq!(parse_bitmap("249"), Some(vec![0, 3, 6, 9]));
        assert_eq!(parse_bitmap("3f\n"), Some(vec![0, 1, 2, 3, 4, 5]));
        assert_eq!(parse_bitmap("0"), Some(vec![]));
        assert_eq!(parse_bitmap("zz"), None);
    }

    #[test]
    fn intel_pt_fixture_caps_and_format() {
        let root = tempfile::tempdir().expect("tempdir");
        let devices = root.path().join("sys/bus/event_source/devices");
        write_intel_pt_fixture(&devices);
        let pmu = read_pmu(&devices, "intel_pt").expect("intel_pt");
        assert_eq!(pmu.pmu_type, Ok(9));
        assert_eq!(pmu.nr_addr_filters, Some(2));
        assert_eq!(
            pmu.format.get("psb_period").map(String::as_str),
            Some("config:24-27")
        );
        let caps = IntelPtCaps::from_pmu(&pmu);
        assert_eq!(caps.psb_cyc, Some(true));
        assert_eq!(caps.cyc, Some(true));
        assert_eq!(caps.mtc, Some(true));
        assert_eq!(caps.ip_filtering, Some(true));
        assert_eq!(caps.power_event_trace, Some(false));
        assert_eq!(caps.num_address_ranges, Some(2));
        assert_eq!(caps.nr_addr_filters, Some(2));
        assert_eq!(caps.mtc_periods, Some(vec![0, 3, 6, 9]));
        assert_eq!(caps.cycle_thresholds, Some((0..14).collect()));
        assert_eq!(caps.psb_periods, Some((0..6).collect()));
        assert_eq!(caps.raw.len(), 18);
    }

    #[test]
    fn intel_pt_present_and_opening() {
        let root = tempfile::tempdir().expect("tempdir");
        let devices = root.path().join("sys/bus/event_source/devices");
        write_intel_pt_fixture(&devices);
        let report = intel_pt_report(&devices, |ty, _paused| {
            assert_eq!(ty, 9);
            Ok(fake_fd())
        });
        assert!(report.status.ok && report.present, "{report:?}");
        assert_eq!(report.pmu_type, Some(9));
        assert_eq!(report.aux_start_paused, Some(true));
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["caps"]["psb_cyc"], true);
        assert_eq!(json["format"]["tsc"], "config:10");
        assert_eq!(json["present"], true);
        assert!(json["reason"].is_null());
    }

    #[test]
    fn a_single_entry_topa_is_said_with_the_largest_ring() {
        let root = tempfile::tempdir().expect("tempdir");
        let devices = root.path().join("sys/bus/event_source/devices");
        let dir = write_intel_pt_fixture(&devices);
        let open = |_: u32, _: bool| Ok(fake_fd());
        let multi = intel_pt_report(&devices, open);
        assert!(
            !multi
                .status
                .detail
                .as_deref()
                .unwrap_or("")
                .contains("ToPA"),
            "{multi:?}"
        );
        std::fs::write(dir.join("caps/topa_multiple_entries"), "0\n").expect("write");
        let single = intel_pt_report(&devices, open);
        assert!(single.status.ok, "{single:?}");
        let detail = single.status.detail.unwrap_or_default();
        assert!(
            detail.contains("ToPA holds one entry") && detail.contains("KiB per CPU"),
            "{detail}"
        );
    }

    #[test]
    fn intel_pt_present_but_busy() {
        let root = tempfile::tempdir().expect("tempdir");
        let devices = root.path().join("sys/bus/event_source/devices");
        write_intel_pt_fixture(&devices);
        let report = intel_pt_report(&devices, |_, _| Err(errno("perf_event_open", libc::EBUSY)));
        assert!(report.present && !report.status.ok);
        assert_eq!(report.status.errno.as_deref(), Some("EBUSY"));
        assert_eq!(report.aux_start_paused, None);
    }

    #[test]
    fn intel_pt_absent() {
        let root = tempfile::tempdir().expect("tempdir");
        let devices = root.path().join("sys/bus/event_source/devices");
        std::fs::create_dir_all(devices.join("software")).expect("mkdir");
        let report = intel_pt_report(&devices, |_, _| panic!("must not open a missing PMU"));
        assert!(!report.present && !report.status.ok);
        let reason = report.status.reason.expect("reason");
        assert!(reason.starts_with("intel_pt PMU not found ("), "{reason}");
        assert!(
            reason.ends_with("intel_pt missing): this is a VM or a non-Intel CPU"),
            "{reason}"
        );
    }

    #[test]
    fn intel_pt_with_missing_caps_and_garbage() {
        let root = tempfile::tempdir().expect("tempdir");
        let devices = root.path().join("sys/bus/event_source/devices");
        let dir = write_intel_pt_fixture(&devices);
        std::fs::remove_dir_all(dir.join("caps")).expect("rm caps");
        std::fs::write(dir.join("type"), "nine\n").expect("write");
        std::fs::write(dir.join("nr_addr_filters"), "\u{0}\u{1}").expect("write");
        std::fs::write(dir.join("format/tsc"), "garbage").expect("write");
        let report = intel_pt_report(&devices, |_, _| panic!("type is garbage"));
        assert!(report.present && !report.status.ok);
        assert!(
            report
                .status
                .reason
                .expect("reason")
                .contains("not a number")
        );
        assert_eq!(report.caps, IntelPtCaps::default());

        // Caps with garbage values decode to None, never panic.
        std::fs::create_dir_all(dir.join("caps")).expect("mkdir");
        for (name, value) in [
            ("psb_cyc", "yes"),
            ("mtc_periods", "xyz"),
            ("num_address_ranges", "-1"),
        ] {
            std::fs::write(dir.join("caps").join(name), value).expect("write");
        }
        let caps = IntelPtCaps::from_pmu(&read_pmu(&devices, "intel_pt").expect("read"));
        assert_eq!(
            (
                caps.psb_cyc,
                caps.cyc,
                caps.mtc_periods,
                caps.num_address_ranges
            ),
            (None, None, None, None)
        );
        assert_eq!(caps.raw.len(), 3);
    }

    #[test]
    fn a_file_where_the_pmu_dir_should_be_is_not_found() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(root.path().join("intel_pt"), "").expect("write");
        assert!(matches!(
            read_pmu(root.path(), "intel_pt"),
            Err(PmuReadError::NotFound { .. })
        ));
    }

    #[test]
    fn aux_pause_verdicts() {
        let kernel = KernelInfo::from_release("6.18.44-fc-v669", "x86_64");
        let old = KernelInfo::from_release("6.8.0", "x86_64");
        let no_pt = IntelPtReport::default();
        let pt = |paused| IntelPtReport {
            aux_start_paused: Some(paused),
            ..IntelPtReport::default()
        };

        let r = aux_pause_report(&kernel, &no_pt, Some(true));
        assert!(!r.status.ok);
        assert_eq!(
            (r.kernel_supports, r.pmu_supports, r.kernel_version_supports),
            (Some(true), None, Some(true))
        );
        assert!(
            r.status
                .reason
                .expect("reason")
                .contains("intel_pt is not usable")
        );

        assert!(aux_pause_report(&kernel, &pt(true), Some(true)).status.ok);
        assert!(!aux_pause_report(&kernel, &pt(false), Some(true)).status.ok);
        let r = aux_pause_report(&old, &no_pt, Some(false));
        assert!(r.status.reason.expect("reason").contains("6.13.0+"));
        // Inconclusive probe: fall back to the version.
        assert_eq!(
            aux_pause_report(&old, &no_pt, None).kernel_supports,
            Some(false)
        );
    }

    /// This kernel (≥ 6.13 on the dev VMs) must report the attr field as known.
    #[test]
    fn live_kernel_aux_action_probe_matches_version() {
        let kernel = super::super::kernel::probe();
        let (Some(version), Some(knows)) = (kernel.version, kernel_knows_aux_action()) else {
            eprintln!("skipped: inconclusive aux_action probe");
            return;
        };
        assert_eq!(knows, version >= AUX_PAUSE_VERSION, "{version}");
    }
}
