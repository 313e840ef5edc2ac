//! Snapshot bundles (`.lbsnap`): everything a freeze captured plus what is needed to decode
//! it later on another machine — recorder parameters, raw ring bytes per CPU, sideband
//! records, the traced processes' memory maps with build-ids, embedded code, the clock
//! conversion and the trigger that caused it.
//!
//! In: [`CapturedData`] from a recorder and the trigger's [`TriggerMeta`]
//! ([`Snapshot::from_captured`]), or an `.lbsnap` file ([`read`]). Out: a [`Snapshot`], the
//! seam every later stage (decode, stacks, symbols, writer) consumes, and files written
//! atomically with mode 0600 ([`write_atomic`]). [`kernel_stack`] keeps (and names) the
//! trigger's kernel stack before the snapshot is written.
//!
//! # Format (version 1; docs/snapshot-format.md has the full description)
//!
//! All integers little-endian.
//!
//! ```text
//! header    magic "\x89LBSNAP\n" (8) | version u32 | flags u32 (0) | metadata length u64
//! metadata  UTF-8 JSON (Metadata)
//! section*  kind u32 | descriptor length u32 | data length u64 | descriptor JSON | data
//! end       kind 0xFFFF_FFFF | 0 | 8 | number of sections before it (u64)
//! ```
//!
//! Section kinds: 1 ring (descriptor [`RingData`], data the ring bytes oldest first),
//! 2 sideband ([`SidebandData`], perf records), 3 process maps ([`ProcessMaps`], no data),
//! 4 code ([`CodeRegion`], the bytes), 5 perf map ([`PerfMap`], its entries as
//! `START SIZE NAME` lines). Readers skip unknown kinds; a version they do not know is
//! refused with a message saying to upgrade.
#![forbid(unsafe_code)]

mod format;
pub mod kernel_stack;

use serde::{Deserialize, Serialize};

use crate::capture::perf_map::PerfMap;
use crate::capture::{
    Backend, CapturedData, ClockConversion, CodeRegion, ProcessMaps, RecorderParams, RingData,
    SidebandData,
};
pub use format::{
    FORMAT_VERSION, MAGIC, SnapshotError, parse, read, to_bytes, write_atomic, write_to,
};

/// The trigger a snapshot was taken for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerMeta {
    /// The rule's name (`func:handle_request>5ms` for `--trigger` rules).
    pub rule: String,
    /// `function`, `syscall`, `signal`, or `manual` (Ctrl-C / exit without a trigger).
    pub kind: String,
    /// Human-readable detail (`return, duration 8.29ms`).
    pub detail: String,
    pub pid: u32,
    pub tid: u32,
    #[serde(default)]
    pub comm: String,
    /// Kernel timestamp of the trigger (`CLOCK_MONOTONIC` ns, `bpf_ktime_get_ns`).
    pub trigger_time_ns: u64,
    /// How long the call or syscall took (latency triggers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ns: Option<u64>,
    /// The triggering thread's user stack at the trigger, leaf first (from the kernel;
    /// empty when it gave none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<u64>,
    /// The thread's kernel stack at the trigger, leaf first, above `stack` (syscall and
    /// signal triggers of a recording with `include_kernel`; its functions are in
    /// [`Metadata::kernel_symbols`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_stack: Vec<u64>,
    /// A function trigger fired while the call ran (`detect: running`): the probed
    /// function's entry address. Its frame is inside `stack` (whose leaf is where the call
    /// was at the look: a lock wait, a read), not the leaf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<u64>,
}

impl TriggerMeta {
    /// The whole stack at the trigger, leaf first (the kernel's frames, then the user's),
    /// as pairs of the address recorded and the address to look its function up at: a
    /// return address's call instruction (one byte before it), except for each part's
    /// leaf, the exact instruction the thread was at.
    #[must_use]
    pub fn lookup_stack(&self) -> Vec<(u64, u64)> {
        let part = |frames: &[u64]| {
            frames
                .iter()
                .enumerate()
                .map(|(i, &a)| (a, if i == 0 { a } else { a.saturating_sub(1) }))
                .collect::<Vec<_>>()
        };
        let mut out = part(&self.kernel_stack);
        out.extend(part(&self.stack));
        out
    }

    /// The metadata of a kernel trigger event for rule `rule`.
    pub fn from_event(rule: &str, event: &crate::triggers::TriggerEvent) -> Self {
        use crate::triggers::TriggerKind;
        let kind = match event.kind {
            TriggerKind::Function => "function",
            TriggerKind::Syscall => "syscall",
            TriggerKind::Signal => "signal",
        };
        Self {
            rule: rule.to_owned(),
            kind: kind.to_owned(),
            detail: event.detail(),
            pid: event.pid,
            tid: event.tid,
            comm: event.comm.clone(),
            trigger_time_ns: event.timestamp_ns,
            duration_ns: event.duration_ns,
            stack: event.stack.clone(),
            kernel_stack: event.kernel_stack.clone(),
            call: event.ip.filter(|_| event.running),
        }
    }
}

/// Where a snapshot came from: the node, and the triggering process's cgroup and
/// container (with its pod, namespace and container name when the agent follows the
/// node's pods). Fields not known are absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// `NODE_NAME`, else the host name.
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// The JSON metadata block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// `lookback` version that wrote the file.
    pub lookback_version: String,
    /// Kernel release of the recording machine.
    #[serde(default)]
    pub kernel: String,
    pub backend: Backend,
    pub recorder: RecorderParams,
    #[serde(default)]
    pub trigger: Option<TriggerMeta>,
    /// `freeze_time_ns - trigger_time_ns`, when there was a trigger.
    #[serde(default)]
    pub trigger_to_freeze_ns: Option<u64>,
    /// `CLOCK_MONOTONIC` when recording stopped: when the kernel stopped the triggering
    /// process's samples (sampling `sample_filter`), else when the rings were paused.
    pub freeze_time_ns: u64,
    /// How long stopping the rings took.
    #[serde(default)]
    pub pause_duration_ns: u64,
    #[serde(default)]
    pub clock: Option<ClockConversion>,
    /// The recorded window (`CLOCK_MONOTONIC` ns): first and last sample, when known.
    #[serde(default)]
    pub window_start_ns: Option<u64>,
    #[serde(default)]
    pub window_end_ns: Option<u64>,
    /// Extra directories the traces' symbols are looked for in (the rules'
    /// `debug_dirs:`, `--debug-dir`), before the target's `/usr/lib/debug`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub debug_dirs: Vec<std::path::PathBuf>,
    /// Where the traces' missing debug files may come from (`from_env`: the decoding
    /// machine's `DEBUGINFOD_URLS`; `off`; `{urls: [...]}`).
    #[serde(default, skip_serializing_if = "is_from_env")]
    pub debuginfod: crate::elf::debuginfod::Servers,
    /// The kernel functions the samples' kernel frames are in (`--include-kernel`), from
    /// the recording machine's `/proc/kallsyms`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_symbols: Vec<crate::capture::kallsyms::KernelSymbol>,
    /// Where it came from (the agent's snapshots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
}

/// A snapshot bundle in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub meta: Metadata,
    pub rings: Vec<RingData>,
    pub sideband: Vec<SidebandData>,
    pub maps: Vec<ProcessMaps>,
    pub code: Vec<CodeRegion>,
    /// The JIT runtimes' perf maps, read at the freeze (section kind 5).
    pub perf_maps: Vec<PerfMap>,
}

impl Snapshot {
    /// Bundles what a freeze returned with the trigger it was for.
    pub fn from_captured(data: CapturedData, trigger: Option<TriggerMeta>) -> Self {
        let trigger_to_freeze_ns = trigger
            .as_ref()
            .map(|t| data.freeze_time_ns.saturating_sub(t.trigger_time_ns));
        let kernel = crate::sys::uname().map(|u| u.release).unwrap_or_default();
        Self {
            meta: Metadata {
                lookback_version: env!("CARGO_PKG_VERSION").to_owned(),
                kernel,
                backend: data.backend,
                recorder: data.params,
                trigger,
                trigger_to_freeze_ns,
                freeze_time_ns: data.freeze_time_ns,
                pause_duration_ns: data.pause_duration_ns,
                clock: data.clock,
                window_start_ns: data.window.map(|w| w.0),
                window_end_ns: data.window.map(|w| w.1),
                debug_dirs: Vec::new(),
                debuginfod: crate::elf::debuginfod::Servers::FromEnv,
                kernel_symbols: data.kernel_symbols,
                origin: None,
            },
            rings: data.rings,
            sideband: data.sideband,
            maps: data.processes,
            code: data.code,
            perf_maps: data.perf_maps,
        }
    }

    /// Raw recorder bytes (rings and sideband).
    pub fn raw_bytes(&self) -> u64 {
        let rings: usize = self.rings.iter().map(|r| r.data.len()).sum();
        let sb: usize = self.sideband.iter().map(|s| s.data.len()).sum();
        (rings + sb) as u64
    }
}

#[cfg(test)]
mod tests;

/// Whether a snapshot's servers are the default (left out of its JSON).
fn is_from_env(servers: &crate::elf::debuginfod::Servers) -> bool {
    *servers == crate::elf::debuginfod::Servers::FromEnv
}
