//! Capture: the flight recorders. A [`Recorder`] keeps the last moments of what the traced
//! processes did in perf ring buffers that overwrite themselves, and on a trigger
//! [`freeze`](Recorder::freeze)s them and copies them out as [`CapturedData`].
//!
//! In: [`CaptureOptions`] (backend, buffer size, frequency, kernel or not, PT options) and
//! process ids; new threads and children are followed by `inherit`. Out: [`CapturedData`]:
//! the raw bytes of every ring (per CPU), sideband records, the clock conversion, the freeze
//! time, and the traced processes' memory maps (with build-ids and, where needed, code
//! bytes). The snapshot stage turns that into an `.lbsnap` bundle.
//!
//! Backends:
//! - [`sampling`]: cpu-clock (or cycles) samples with callchains into `write_backward`
//!   rings (Linux 4.7); freeze = `PERF_EVENT_IOC_PAUSE_OUTPUT`. Works on any machine.
//! - [`intel_pt`]: Intel PT into read-only (overwrite) AUX areas plus a sideband ring;
//!   freeze = disable the PT events, copy oldest first, re-enable.
//!
//! Event topology (both backends): perf refuses `mmap` on inherited per-task events with
//! `cpu = -1`, so each traced thread gets one event per online CPU with `inherit = 1`, and
//! all events of one CPU write into one ring (`PERF_EVENT_IOC_SET_OUTPUT`), as `perf
//! record -p` does. Children and threads created later inherit the events.

pub mod aux;
pub mod aux_pause;
pub mod clock_history;
mod events;
pub mod freeze;
pub mod held_files;
pub mod intel_pt;
pub mod jitdump;
pub mod kallsyms;
pub mod mmap_records;
pub mod origin;
pub mod perf_map;
pub mod procmaps;
pub mod pt_config;
pub mod pt_filter;
#[cfg(test)]
mod pt_filter_model;
pub mod pt_timing;
pub mod records;
pub mod ring;
pub mod sampling;
pub mod tsc;

use std::{collections::BTreeMap, os::fd::BorrowedFd, path::PathBuf, sync::Arc};

use serde::{Deserialize, Serialize};

pub use crate::check::{Backend, SamplingEvent};
use crate::{
    check::{self, Paths},
    sys::SyscallError,
};
pub use procmaps::{CodeRegion, MapEntry, ProcessMaps};
pub use pt_config::{PtConfigError, PtOptions};
pub use ring::WalkStop;
use tsc::TscConversion;

/// `--backend`: which recorder to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendRequest {
    /// Intel PT when it works here, else sampling (with a log line saying why).
    #[default]
    Auto,
    IntelPt,
    Sampling,
}

/// Which executable mappings get their bytes embedded in the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EmbedCode {
    /// Anonymous (JIT), deleted and `[vdso]` mappings: code no other machine can find.
    #[default]
    Auto,
    /// Every executable mapping (`--embed-code`; for PT decoding elsewhere).
    All,
    None,
}

/// What to record and how (the domain form of `--backend`, `--buffer-size`,
/// `--sample-frequency`, `--include-kernel` and the rule's `capture` section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureOptions {
    pub backend: BackendRequest,
    /// Bytes per ring (per CPU): the sampling data ring, or the PT AUX area. Rounded up to
    /// a power of two of pages.
    pub buffer_size: usize,
    /// Samples per second per thread (sampling backend).
    pub sample_frequency: u64,
    /// Sampling backend: bytes of user stack (and the registers to unwind from) copied
    /// with each sample, unwound at decode time with the files' CFI; 0: the kernel's
    /// frame-pointer callchain only.
    pub stack_size: u32,
    /// Record kernel code too (PT kernel trace, kernel callchains).
    pub include_kernel: bool,
    pub pt: PtOptions,
    pub embed_code: EmbedCode,
    /// Where the PMUs are described (`/sys/bus/event_source/devices`; fixtures in tests).
    pub event_sources: PathBuf,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        Self {
            backend: BackendRequest::Auto,
            buffer_size: 4 << 20,
            sample_frequency: 10_000,
            stack_size: crate::rules::DEFAULT_STACK_SIZE,
            include_kernel: false,
            pt: PtOptions::default(),
            embed_code: EmbedCode::Auto,
            event_sources: Paths::default().event_sources(),
        }
    }
}

/// How a recorder was set up: everything a decoder needs to read the raw bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "the recorder's perf_event_attr flags as the .lbsnap's JSON names them"
)]
pub struct RecorderParams {
    /// `cpu-clock`, `cycles` or `intel_pt`.
    pub event: String,
    /// `perf_event_attr.type` and `.config` of the recording event.
    pub perf_type: u32,
    pub config: u64,
    /// The named config fields that were set (PT: `branch`, `tsc`, `mtc_period`, ...).
    pub config_fields: BTreeMap<String, u64>,
    /// `perf_event_attr.sample_type` of the records in the rings (and, with
    /// `sample_id_all`, of the id trailer of non-sample records).
    pub sample_type: u64,
    /// `perf_event_attr.sample_regs_user`: which user registers each sample carries
    /// (`SAMPLE_REGS_USER`), one `u64` per bit set.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sample_regs_user: u64,
    /// `perf_event_attr.sample_stack_user`: bytes of user stack each sample copies.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sample_stack_user: u64,
    /// Sampling: the ids (`SAMPLE_IDENTIFIER`) of the context-switch events, whose samples
    /// are the stacks of threads leaving the CPU (the other samples are the timer's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub switch_ids: Vec<u64>,
    pub sample_id_all: bool,
    /// Samples per second (sampling backend).
    pub sample_frequency: Option<u64>,
    /// Bytes per ring (data ring for sampling, AUX area for PT).
    pub buffer_size: u64,
    pub include_kernel: bool,
    /// `perf_event_attr.clockid` of the record timestamps (`None`: perf's default clock).
    pub clockid: Option<i32>,
    /// The online CPUs, one ring each.
    pub cpus: Vec<u32>,
    /// PT: the kernel can pause the trace from another event (`aux_pause`, Linux 6.13).
    pub aux_pause: bool,
    /// PT: the address filter set on every PT event (`filter OFFSET/SIZE@PATH,...`, one
    /// per code segment), when the trace was limited to some binaries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_filter: Option<String>,
    /// PT: the timing parameters of the recording CPU (MTC/CYC to time; errata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pt_timing: Option<pt_timing::PtTiming>,
    /// PT: one event per CPU for every process (the agent's per-CPU recorder): the rings
    /// hold other processes' trace too, and a decode keeps only the tracks of the
    /// processes whose maps the snapshot has.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cpu_wide: bool,
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_zero(value: &u64) -> bool {
    *value == 0
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_false(value: &bool) -> bool {
    !*value
}

impl RecorderParams {
    /// How the sample records of the rings are laid out.
    #[must_use]
    pub fn sample_layout(&self) -> records::Layout {
        records::Layout {
            sample_type: self.sample_type,
            regs_user: self.sample_regs_user,
        }
    }
}

/// What a ring held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RingKind {
    /// perf records (`perf_event_header` + body), oldest first.
    PerfRecords,
    /// Intel PT trace bytes (the AUX area), oldest first.
    Aux,
}

/// The bytes of one ring, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingData {
    pub kind: RingKind,
    pub cpu: Option<u32>,
    pub tid: Option<u32>,
    /// The ring had wrapped: older data was overwritten (the window is full).
    pub wrapped: bool,
    /// perf records: how many; AUX: 0.
    pub records: u64,
    /// perf records: why the walk stopped.
    pub stop: Option<WalkStop>,
    #[serde(skip)]
    pub data: Vec<u8>,
}

/// Sideband records (MMAP2, COMM, `ITRACE_START`, SWITCH, AUX, LOST, ...) of one CPU's
/// data ring, in ring order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidebandData {
    pub cpu: Option<u32>,
    /// Records dropped because the retained sideband exceeded its limit.
    pub dropped_bytes: u64,
    #[serde(skip)]
    pub data: Vec<u8>,
}

/// perf time ↔ TSC, from the perf mmap page, plus a TSC ↔ `CLOCK_MONOTONIC` pair read
/// at freeze time (the trigger timestamps are `CLOCK_MONOTONIC`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ClockConversion {
    pub time_zero: u64,
    pub time_mult: u32,
    pub time_shift: u16,
    /// `cap_user_time_zero` was set: the three values above are valid.
    pub valid: bool,
    /// `rdtsc` and `CLOCK_MONOTONIC` read back to back at freeze time (x86-64 only).
    pub tsc_at_freeze: Option<u64>,
    pub monotonic_ns_at_freeze: u64,
    /// An earlier pair ([`clock_history`]): with it, times before the freeze follow the
    /// rate between the clocks (NTP's steering), not a rate of 1. Absent in snapshots
    /// written before it existed.
    #[serde(default)]
    pub tsc_earlier: Option<u64>,
    #[serde(default)]
    pub monotonic_ns_earlier: u64,
}

impl ClockConversion {
    /// The conversion of a ring's mmap page `page`, anchored at `pair` (read with
    /// [`ClockPair::now`]). The anchor is its own moment, not the freeze time: the pump
    /// may have stopped the rings at the trigger, 50–300 µs before the recorder copies
    /// them, and a TSC read now beside that earlier time shifted every PT timestamp early
    /// by the gap (the trace ended before its own trigger).
    #[must_use]
    pub fn anchored(page: ring::PageClock, pair: ClockPair) -> Self {
        Self {
            time_zero: page.time_zero,
            time_mult: page.time_mult,
            time_shift: page.time_shift,
            valid: page.valid,
            tsc_at_freeze: pair.tsc,
            monotonic_ns_at_freeze: pair.monotonic_ns,
            tsc_earlier: None,
            monotonic_ns_earlier: 0,
        }
    }

    /// The same conversion with an `earlier` pair to measure the clocks' rate by.
    #[must_use]
    pub fn with_earlier(self, earlier: Option<ClockPair>) -> Self {
        match earlier {
            Some(pair) => Self {
                tsc_earlier: pair.tsc,
                monotonic_ns_earlier: pair.monotonic_ns,
                ..self
            },
            None => self,
        }
    }

    /// `CLOCK_MONOTONIC` ns per perf-clock ns between the earlier pair and the freeze's,
    /// as (numerator, denominator); `None` (a rate of 1) without an earlier pair, over
    /// less than [`clock_history::MIN_SPAN_NS`], or off by more than the kernel lets NTP
    /// steer (±10 %: `ADJ_TICK`'s range; a suspend in between, say).
    fn rate(&self, conv: TscConversion) -> Option<(i128, i128)> {
        let perf = i128::from(conv.tsc_to_ns(self.tsc_at_freeze?))
            - i128::from(conv.tsc_to_ns(self.tsc_earlier?));
        let mono = i128::from(self.monotonic_ns_at_freeze) - i128::from(self.monotonic_ns_earlier);
        let span = i128::from(clock_history::MIN_SPAN_NS);
        (perf >= span && (mono - perf).abs() * 10 <= perf).then_some((mono, perf))
    }

    /// The perf-clock conversion, when the mmap page published one.
    pub fn tsc_conversion(&self) -> Option<TscConversion> {
        (self.valid && self.time_mult != 0).then_some(TscConversion {
            time_zero: self.time_zero,
            time_mult: self.time_mult,
            time_shift: self.time_shift,
        })
    }

    /// A TSC value as `CLOCK_MONOTONIC` ns (the trigger clock): the TSC distance to the
    /// freeze-time pair, scaled with the perf conversion and by the clocks' measured rate
    /// where there is an earlier pair ([`Self::rate`]). `None` without both.
    pub fn tsc_to_monotonic_ns(&self, tsc: u64) -> Option<u64> {
        let conv = self.tsc_conversion()?;
        let at_freeze = conv.tsc_to_ns(self.tsc_at_freeze?);
        let then = conv.tsc_to_ns(tsc);
        let mut delta = i128::from(then) - i128::from(at_freeze);
        if let Some((mono, perf)) = self.rate(conv) {
            delta = delta * mono / perf;
        }
        u64::try_from(i128::from(self.monotonic_ns_at_freeze) + delta).ok()
    }
}

/// A TSC value and `CLOCK_MONOTONIC` read at one moment: of three tries, the one whose
/// two TSC reads around the clock read are closest, with the TSC at their middle (a
/// preemption between the reads, which this VM's hypervisor does dozens of times a
/// second for 100 µs, would otherwise offset every converted time by its length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockPair {
    /// `None` off x86-64.
    pub tsc: Option<u64>,
    pub monotonic_ns: u64,
}

impl ClockPair {
    /// The pair now.
    #[must_use]
    pub fn now() -> Self {
        Self::read_with(crate::sys::read_tsc, monotonic_ns)
    }

    /// The tightest of three `tsc`, `monotonic`, `tsc` brackets.
    fn read_with(mut tsc: impl FnMut() -> Option<u64>, mut monotonic: impl FnMut() -> u64) -> Self {
        // A bracket's width and pair, or the clock alone without a TSC.
        let mut bracket = || {
            let (t0, ns, t1) = (tsc(), monotonic(), tsc());
            match t0.zip(t1) {
                Some((t0, t1)) => {
                    let width = t1.saturating_sub(t0);
                    let tsc = Some(t0 + width / 2);
                    Ok((
                        width,
                        Self {
                            tsc,
                            monotonic_ns: ns,
                        },
                    ))
                }
                None => Err(Self {
                    tsc: None,
                    monotonic_ns: ns,
                }),
            }
        };
        let mut best = match bracket() {
            Ok(first) => first,
            Err(no_tsc) => return no_tsc,
        };
        for _ in 1..3 {
            if let Ok(next) = bracket()
                && next.0 < best.0
            {
                best = next;
            }
        }
        best.1
    }
}

/// What a freeze copied out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedData {
    pub backend: Backend,
    pub params: RecorderParams,
    /// `CLOCK_MONOTONIC` right after the rings stopped.
    pub freeze_time_ns: u64,
    /// How long stopping the rings took (ns).
    pub pause_duration_ns: u64,
    pub rings: Vec<RingData>,
    pub sideband: Vec<SidebandData>,
    pub clock: Option<ClockConversion>,
    /// Memory maps of the traced processes at freeze time (or when last seen alive).
    pub processes: Vec<ProcessMaps>,
    pub code: Vec<CodeRegion>,
    /// The perf maps of the processes that write one (JIT runtimes), read at the freeze.
    pub perf_maps: Vec<perf_map::PerfMap>,
    /// First and last sample time in the rings (`CLOCK_MONOTONIC` ns), when known.
    pub window: Option<(u64, u64)>,
    /// The kernel functions the samples' kernel frames are in (`include_kernel`).
    pub kernel_symbols: Vec<kallsyms::KernelSymbol>,
}

impl CapturedData {
    /// Raw recorder bytes (rings + sideband).
    pub fn raw_bytes(&self) -> u64 {
        let rings: usize = self.rings.iter().map(|r| r.data.len()).sum();
        let sb: usize = self.sideband.iter().map(|s| s.data.len()).sum();
        (rings + sb) as u64
    }
}

/// A flight recorder over a set of processes.
/// Whose records a snapshot of the per-CPU rings keeps besides the triggering process's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PeerSet {
    /// No one else's.
    #[default]
    None,
    /// Those of these processes and of the children the rings show them fork (a child
    /// gone before the agent learnt of it is known by its `FORK` record).
    Of(std::collections::BTreeSet<u32>),
    /// Those of every process with samples in the rings (every target of any rule).
    All,
}

pub trait Recorder: Send {
    fn backend(&self) -> Backend;
    /// How the recorder was set up.
    fn params(&self) -> &RecorderParams;
    /// Starts recording `pid` (all its threads, and later its new threads and children).
    fn add_process(&mut self, pid: u32) -> Result<(), CaptureError>;
    /// Consumes what must be consumed continuously (PT sideband); call it now and then.
    fn poll(&mut self) -> Result<(), CaptureError> {
        Ok(())
    }
    /// Stops the rings and copies them out. Recording stays stopped until
    /// [`resume`](Self::resume).
    fn freeze(&mut self) -> Result<CapturedData, CaptureError>;
    /// [`freeze`](Self::freeze) for a snapshot of process `pid`: a recorder of its own
    /// (and its children's) gives everything; the per-CPU recorder shared by all targets
    /// only `pid`'s records and maps, and those of the `peers`.
    fn freeze_for(&mut self, _pid: u32, _peers: &PeerSet) -> Result<CapturedData, CaptureError> {
        self.freeze()
    }
    /// Process `pid` is no longer a target (exited, or its rules went): a shared recorder
    /// lets go of what it kept for it. A recorder of its own is dropped instead.
    fn remove_process(&mut self, _pid: u32) {}
    /// Restarts recording after a freeze.
    fn resume(&mut self) -> Result<(), CaptureError>;
    /// A handle that stops the rings from another thread at the trigger itself; the next
    /// [`freeze`](Self::freeze) then keeps that moment. [`resume`](Self::resume) undoes it.
    fn freeze_switch(&self) -> Option<Arc<freeze::FreezeSwitch>> {
        None
    }
    /// Runs BPF program `prog` (the trigger engine's `sample_filter`) on every sample, so
    /// that a trigger stops its process's samples in the kernel. Call before
    /// [`add_process`](Self::add_process). `Ok(false)`: this recorder cannot (Intel PT).
    fn set_sample_filter(&mut self, _prog: BorrowedFd<'_>) -> Result<bool, CaptureError> {
        Ok(false)
    }
}

/// Why a recorder could not be set up or frozen.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("intel_pt PMU not found: {} missing (a VM or a non-Intel CPU); use --backend sampling", dir.display())]
    IntelPtNotFound { dir: PathBuf },
    #[error("intel_pt PMU unusable: {reason}")]
    IntelPtUnusable { reason: String },
    #[error("Intel PT configuration")]
    PtConfig(#[from] PtConfigError),
    #[error("Intel PT address filters")]
    PtFilter(#[from] pt_filter::PtFilterError),
    #[error("no backend can record here: {reason}")]
    NoBackend { reason: String },
    #[error("opening the {event} event for thread {tid} on CPU {cpu}")]
    Open {
        event: &'static str,
        tid: u32,
        cpu: u32,
        #[source]
        source: SyscallError,
    },
    #[error("{what}")]
    Syscall {
        what: &'static str,
        #[source]
        source: SyscallError,
    },
    #[error("process {pid} not found")]
    NoProcess { pid: u32 },
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("buffer size {bytes} bytes: must be a power of two number of pages")]
    BadBufferSize { bytes: usize },
    #[error("cannot determine the page size")]
    PageSize,
    #[error(
        "Intel PT rings: not even {min_bytes} bytes per CPU fit the {budget} bytes this process may lock \
         (perf_event_mlock_kb × CPUs + RLIMIT_MEMLOCK): grant CAP_IPC_LOCK, raise \
         RLIMIT_MEMLOCK or kernel.perf_event_mlock_kb"
    )]
    LockBudget { min_bytes: usize, budget: u64 },
    #[error(
        "trace_binaries cannot limit the per-CPU Intel PT recorder (the kernel takes no file \
         address filter on an event that follows a CPU): set capture.isolate: true for rings \
         per process"
    )]
    CpuWideFilter,
}

/// Opens the recorder `opts` asks for and starts it on `pids`.
pub fn open_recorder(
    opts: &CaptureOptions,
    pids: &[u32],
) -> Result<Box<dyn Recorder>, CaptureError> {
    open_recorder_filtered(opts, pids, None).map(|(recorder, _)| recorder)
}

/// [`open_recorder`], with `sample_filter` set on the recorder when it takes one (see
/// [`Recorder::set_sample_filter`]); the flag says whether it did.
pub fn open_recorder_filtered(
    opts: &CaptureOptions,
    pids: &[u32],
    sample_filter: Option<BorrowedFd<'_>>,
) -> Result<(Box<dyn Recorder>, bool), CaptureError> {
    let mut recorder: Box<dyn Recorder> = match opts.backend {
        BackendRequest::IntelPt => Box::new(intel_pt::PtRecorder::open(opts)?),
        BackendRequest::Sampling => {
            let event = check::probe_sampling_event().ok_or_else(|| CaptureError::NoBackend {
                reason: "neither cycles nor cpu-clock events open".to_owned(),
            })?;
            Box::new(sampling::SamplingRecorder::open(opts, event)?)
        }
        BackendRequest::Auto => {
            let choice = check::probe_backend(&Paths::default());
            match choice.backend {
                Some(Backend::IntelPt) => {
                    log::info!("backend auto: intel-pt ({})", choice.reason);
                    Box::new(intel_pt::PtRecorder::open(opts)?)
                }
                Some(Backend::Sampling) => {
                    log::info!("backend auto: sampling, because {}", choice.reason);
                    let event = choice.sampling_event.unwrap_or(SamplingEvent::CpuClock);
                    Box::new(sampling::SamplingRecorder::open(opts, event)?)
                }
                None => {
                    return Err(CaptureError::NoBackend {
                        reason: choice.reason,
                    });
                }
            }
        }
    };
    if recorder.backend() == Backend::Sampling && !opts.pt.trace_binaries.is_empty() {
        log::info!(
            "trace_binaries limits Intel PT only: the sampling backend samples every binary"
        );
    }
    let filtered = match sample_filter {
        Some(prog) => recorder.set_sample_filter(prog)?,
        None => false,
    };
    add_processes(recorder.as_mut(), pids)?;
    Ok((recorder, filtered))
}

/// Starts `recorder` on each of `pids`. One that exited since it was listed (a child of an
/// attached process that lived a moment) is skipped and logged; only when none is left is
/// it an error (the first one's).
fn add_processes(recorder: &mut dyn Recorder, pids: &[u32]) -> Result<(), CaptureError> {
    let mut vanished = None;
    let mut added = 0_usize;
    for &pid in pids {
        match recorder.add_process(pid) {
            Ok(()) => added += 1,
            Err(CaptureError::NoProcess { pid }) => {
                log::info!("process {pid} exited before its recorder started: not recorded");
                vanished.get_or_insert(pid);
            }
            Err(e) => return Err(e),
        }
    }
    match vanished {
        Some(pid) if added == 0 => Err(CaptureError::NoProcess { pid }),
        _ => Ok(()),
    }
}

/// The per-CPU recorder shared by all targets of the agent's rules that record with
/// `opts`: sampling ([`sampling::SamplingRecorder::open_cpu_wide`]), with `target_filter`
/// deciding in the kernel which samples are kept; Intel PT
/// ([`intel_pt::PtRecorder::open_cpu_wide`]: every process, cut down at the snapshot and
/// the decode).
pub fn open_cpu_wide_recorder(
    opts: &CaptureOptions,
    target_filter: Option<BorrowedFd<'_>>,
) -> Result<Box<dyn Recorder>, CaptureError> {
    if opts.backend == BackendRequest::IntelPt {
        return Ok(Box::new(intel_pt::PtRecorder::open_cpu_wide(opts)?));
    }
    let target_filter = target_filter.ok_or_else(|| CaptureError::NoBackend {
        reason: "the per-CPU sampling recorder needs the target filter".to_owned(),
    })?;
    let event = check::probe_sampling_event().ok_or_else(|| CaptureError::NoBackend {
        reason: "neither cycles nor cpu-clock events open".to_owned(),
    })?;
    Ok(Box::new(sampling::SamplingRecorder::open_cpu_wide(
        opts,
        event,
        target_filter,
    )?))
}

/// `CLOCK_MONOTONIC` in ns (the clock of BPF trigger timestamps and of sampling records).
pub fn monotonic_ns() -> u64 {
    crate::sys::monotonic_ns()
}

/// The buffer size rounded up to a power of two number of pages, as a page count.
fn pages_for(bytes: usize) -> Result<usize, CaptureError> {
    let page = crate::sys::page_size().ok_or(CaptureError::PageSize)?;
    bytes
        .max(page)
        .div_ceil(page)
        .checked_next_power_of_two()
        .filter(|pages| pages.checked_mul(page).is_some())
        .ok_or(CaptureError::BadBufferSize { bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsc_maps_to_the_trigger_clock() {
        // 3 GHz: mult / 2^shift = 1/3 ns per tick.
        let clock = ClockConversion {
            time_zero: 1_000,
            time_mult: 0x5555_5555,
            time_shift: 32,
            valid: true,
            tsc_at_freeze: Some(30_000_000_000),
            monotonic_ns_at_freeze: 50_000_000_000,
            tsc_earlier: None,
            monotonic_ns_earlier: 0,
        };
        // 3 million ticks (1 ms) before the freeze.
        let ns = clock.tsc_to_monotonic_ns(29_997_000_000).unwrap();
        assert!((49_998_999_990..=49_999_000_010).contains(&ns), "{ns}");
        assert_eq!(
            clock.tsc_to_monotonic_ns(30_000_000_000),
            Some(50_000_000_000)
        );
        let perf_ns = clock.tsc_conversion().unwrap().tsc_to_ns(3_000);
        assert!((1_999..=2_001).contains(&perf_ns), "{perf_ns}");
        let invalid = ClockConversion {
            valid: false,
            ..clock
        };
        assert_eq!(invalid.tsc_to_monotonic_ns(1), None);
        let no_pair = ClockConversion {
            tsc_at_freeze: None,
            ..clock
        };
        assert_eq!(no_pair.tsc_to_monotonic_ns(1), None);
    }

    #[test]
    fn times_before_the_freeze_follow_the_clocks_measured_rate() {
        // 1 GHz TSC (1 ns per tick); CLOCK_MONOTONIC slewed 5 % fast (chrony after a
        // step): 300 ms of TSC before the freeze were 315 ms of CLOCK_MONOTONIC.
        let plain = ClockConversion {
            time_zero: 0,
            time_mult: 1,
            time_shift: 0,
            valid: true,
            tsc_at_freeze: Some(1_000_000_000),
            monotonic_ns_at_freeze: 9_000_000_000,
            tsc_earlier: None,
            monotonic_ns_earlier: 0,
        };
        let slewed = plain.with_earlier(Some(ClockPair {
            tsc: Some(700_000_000),
            monotonic_ns: 8_685_000_000,
        }));
        // A branch 10 ms of TSC before the freeze: 10.5 ms of the trigger clock.
        assert_eq!(slewed.tsc_to_monotonic_ns(990_000_000), Some(8_989_500_000));
        assert_eq!(plain.tsc_to_monotonic_ns(990_000_000), Some(8_990_000_000));
        // The freeze itself and times after it keep the anchor.
        assert_eq!(
            slewed.tsc_to_monotonic_ns(1_000_000_000),
            Some(9_000_000_000)
        );
        assert_eq!(plain.with_earlier(None), plain);
        // Too close to measure a rate by, or beyond what NTP can steer (a suspend): 1.
        let close = plain.with_earlier(Some(ClockPair {
            tsc: Some(950_000_000),
            monotonic_ns: 8_940_000_000,
        }));
        assert_eq!(close.tsc_to_monotonic_ns(990_000_000), Some(8_990_000_000));
        let suspended = plain.with_earlier(Some(ClockPair {
            tsc: Some(700_000_000),
            monotonic_ns: 8_000_000_000,
        }));
        assert_eq!(
            suspended.tsc_to_monotonic_ns(990_000_000),
            Some(8_990_000_000)
        );
    }

    #[test]
    fn a_snapshot_clock_without_an_earlier_pair_reads_as_before() {
        // The metadata of a snapshot written before the earlier pair existed.
        let json = r#"{"time_zero":1,"time_mult":2,"time_shift":3,"valid":true,
            "tsc_at_freeze":4,"monotonic_ns_at_freeze":5}"#;
        let clock: ClockConversion = serde_json::from_str(json).unwrap();
        assert_eq!((clock.tsc_earlier, clock.monotonic_ns_earlier), (None, 0));
        assert_eq!(clock.tsc_at_freeze, Some(4));
    }

    #[test]
    fn the_clock_pair_is_the_tightest_bracket_and_anchors_the_conversion() {
        // Three tries: 200 ticks wide (a preemption), 10, 100.
        let mut tscs = [100, 300, 500, 510, 600, 700].into_iter();
        let mut clocks = [1_000, 2_000, 3_000].into_iter();
        let pair = ClockPair::read_with(|| tscs.next(), || clocks.next().unwrap_or(0));
        assert_eq!(
            pair,
            ClockPair {
                tsc: Some(505),
                monotonic_ns: 2_000
            }
        );
        let none = ClockPair::read_with(|| None, || 7);
        assert_eq!(none.tsc, None);
        // The anchor is the pair's own moment, whatever the freeze time was.
        let page = ring::PageClock {
            time_zero: 0,
            time_mult: 1 << 10,
            time_shift: 10, // 1 ns per tick
            valid: true,
        };
        let clock = ClockConversion::anchored(page, pair);
        assert_eq!(clock.tsc_to_monotonic_ns(505), Some(2_000));
        assert_eq!(clock.tsc_to_monotonic_ns(1_505), Some(3_000));
    }

    #[test]
    fn buffer_sizes_round_to_power_of_two_pages() {
        let page = crate::sys::page_size().unwrap();
        assert_eq!(pages_for(1).unwrap(), 1);
        assert_eq!(pages_for(3 * page).unwrap(), 4);
        assert_eq!(pages_for(4 << 20).unwrap(), (4 << 20) / page);
        assert!(pages_for(usize::MAX).is_err());
    }

    #[test]
    fn intel_pt_request_without_the_pmu_is_a_clear_error() {
        let root = tempfile::tempdir().unwrap();
        let opts = CaptureOptions {
            backend: BackendRequest::IntelPt,
            event_sources: root.path().to_owned(),
            ..CaptureOptions::default()
        };
        let err = open_recorder(&opts, &[])
            .err()
            .expect("no intel_pt in a tempdir");
        let text = err.to_string();
        assert!(text.starts_with("intel_pt PMU not found: "), "{text}");
        assert!(text.contains("use --backend sampling"), "{text}");
    }

    #[test]
    fn a_process_gone_before_its_recorder_started_is_skipped_unless_none_is_left() {
        // A pid that existed and is gone: a child reaped.
        let gone = std::process::Command::new("true")
            .spawn()
            .and_then(|mut child| child.wait().map(|_| child.id()))
            .expect("true");
        let opts = CaptureOptions {
            backend: BackendRequest::Sampling,
            buffer_size: 64 << 10,
            ..CaptureOptions::default()
        };
        let recorder = match open_recorder(&opts, &[std::process::id(), gone]) {
            Ok(recorder) => recorder,
            // Without perf events here (not root, paranoid): nothing to show.
            Err(CaptureError::Syscall { .. } | CaptureError::NoBackend { .. }) => return,
            Err(e) => panic!("a vanished pid beside a live one: {e}"),
        };
        drop(recorder);
        match open_recorder(&opts, &[gone]) {
            Err(CaptureError::NoProcess { pid }) => assert_eq!(pid, gone),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a recorder with no process"),
        }
    }
}
