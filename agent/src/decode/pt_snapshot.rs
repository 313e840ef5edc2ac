//! Decode, Intel PT half over a snapshot: each CPU's AUX bytes → branch events, put on the
//! threads that ran them.
//!
//! In: a [`Snapshot`] of the `intel-pt` backend (AUX rings, per-CPU sideband, maps and
//! embedded code) and a [`CodeSource`] for the code the bundle does not embed (the caller
//! reads files; this module stays sans-IO). Out: [`PtThreads`]: per [`Track`] the
//! [`Branch`]es in time order, with the names the sideband gave, and counts.
//!
//! - Code: each ring is decoded over one image of the executable mappings of the processes
//!   its sideband names (all the bundle's processes when it names none), embedded code
//!   first. One image per ring means processes whose code overlaps at the same address
//!   with different bytes decode wrongly; per-process images switched at context
//!   switches are not done.
//! - Threads: `ITRACE_START` and SWITCH records (with their `sample_id_all` time) say which
//!   thread ran from when; a branch goes to the thread that ran at its time (a time in a
//!   switched-out stretch goes to the next thread in; before the first record, to the
//!   thread of that record). A switch-out becomes a trace stop on that thread, so its off-CPU
//!   time shows as `[untraced]`. Without a usable sideband a ring is one track per CPU.
//! - Time: TSC → `CLOCK_MONOTONIC` ns with the bundle's clock (the trigger's clock), else
//!   perf time, else TSC ticks. A branch before the ring's first timing packet takes the
//!   first timed branch's time; a ring without any timing gets 1 ns per branch, so order
//!   and nesting still show.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::pt::branches::{BranchEvent, BranchKind, Branches};
use super::pt::pevent::{PeventConfig, read_record};
use super::pt::{FlowConfig, Image};
use crate::capture::{MapEntry, RingKind, SidebandData};
use crate::snapshot::Snapshot;
use crate::stacks::branches::Branch;

const PERF_RECORD_COMM: u32 = 3;
const PERF_RECORD_ITRACE_START: u32 = 12;
const PERF_RECORD_SWITCH: u32 = 14;
const PERF_RECORD_SWITCH_CPU_WIDE: u32 = 15;
const PERF_RECORD_MISC_SWITCH_OUT: u16 = 1 << 13;

/// Where the bytes of a mapping come from when the snapshot does not embed them.
pub trait CodeSource {
    /// The bytes `entry` of process `pid` maps (from `entry.offset`, at most
    /// `entry.end - entry.start` of them), or `None`.
    fn code(&self, pid: u32, entry: &MapEntry) -> Option<Vec<u8>>;
}

/// No code beyond what the snapshot embeds.
pub struct EmbeddedOnly;

impl CodeSource for EmbeddedOnly {
    fn code(&self, _pid: u32, _entry: &MapEntry) -> Option<Vec<u8>> {
        None
    }
}

/// Whose branches a list holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Track {
    Thread {
        pid: u32,
        tid: u32,
    },
    /// A ring whose sideband named no thread.
    Cpu(u32),
}

/// The branches of one track.
#[derive(Debug, Clone, Default)]
pub struct TrackBranches {
    /// From a COMM record.
    pub comm: Option<String>,
    pub branches: Vec<Branch>,
}

/// What a PT snapshot decoded to.
#[derive(Debug, Default)]
pub struct PtThreads {
    pub tracks: BTreeMap<Track, TrackBranches>,
    /// Branch events the decoder produced (before any were dropped by the caller's filter).
    pub branches: u64,
    /// Decode errors (each is also a [`BranchKind::Error`] branch).
    pub errors: u64,
    /// Bytes of AUX data decoded.
    pub aux_bytes: u64,
}

/// A thread, from the sideband.
type Thread = (u32, u32);

/// Which thread ran on one CPU from when (TSC), in time order.
#[derive(Debug, Default)]
struct Timeline {
    /// `None`: a thread switched out and no other came in yet.
    entries: Vec<(u64, Option<Thread>)>,
    /// Before the first entry.
    initial: Option<Thread>,
    comms: HashMap<Thread, String>,
    /// (time, thread) of each switch-out.
    outs: Vec<(u64, Thread)>,
}

impl Timeline {
    fn read(sideband: &SidebandData, config: &PeventConfig) -> Self {
        let mut line = Self::default();
        let mut rest = sideband.data.as_slice();
        while let Ok((record, size)) = read_record(rest, config) {
            rest = rest.get(size..).unwrap_or_default();
            let trailer = record.samples.pid_tid;
            match record.kind {
                PERF_RECORD_ITRACE_START => {
                    if let Some(thread) = pid_tid(record.body).or(trailer) {
                        line.entries.push((record.tsc, Some(thread)));
                    }
                }
                PERF_RECORD_SWITCH | PERF_RECORD_SWITCH_CPU_WIDE => {
                    let Some(thread) = trailer else { continue };
                    let out = record.misc & PERF_RECORD_MISC_SWITCH_OUT != 0;
                    if out {
                        line.outs.push((record.tsc, thread));
                    }
                    line.entries.push((record.tsc, (!out).then_some(thread)));
                    if out && line.initial.is_none() && line.entries.len() == 1 {
                        line.initial = Some(thread);
                    }
                }
                PERF_RECORD_COMM => {
                    if let Some(thread) = pid_tid(record.body) {
                        let name = record.body.get(8..).unwrap_or_default();
                        let name = name.split(|&b| b == 0).next().unwrap_or_default();
                        line.comms
                            .insert(thread, String::from_utf8_lossy(name).into_owned());
                    }
                }
                _ => {}
            }
        }
        line.entries.sort_by_key(|e| e.0);
        if line.initial.is_none() {
            line.initial = line.entries.iter().find_map(|e| e.1);
        }
        line
    }

    /// Without a TSC conversion the records' times mean nothing against PT's: keep one
    /// thread for the whole ring when the sideband names only one, else none.
    fn without_times(mut self) -> Self {
        let threads = self.threads();
        self.entries.clear();
        self.outs.clear();
        self.initial = match threads.len() {
            1 => threads.first().copied(),
            _ => None,
        };
        self
    }

    fn threads(&self) -> BTreeSet<Thread> {
        self.entries
            .iter()
            .filter_map(|e| e.1)
            .chain(self.initial)
            .collect()
    }

    /// The thread that ran at `tsc`.
    fn at(&self, tsc: u64) -> Option<Thread> {
        let index = self.entries.partition_point(|e| e.0 <= tsc);
        match index.checked_sub(1).map(|i| self.entries[i]) {
            None => self.initial,
            Some((_, Some(thread))) => Some(thread),
            Some((_, None)) => self.entries[index..]
                .iter()
                .find_map(|e| e.1)
                .or(self.initial),
        }
    }
}

fn pid_tid(body: &[u8]) -> Option<Thread> {
    let pid = u32::from_le_bytes(body.get(..4)?.try_into().ok()?);
    let tid = u32::from_le_bytes(body.get(4..8)?.try_into().ok()?);
    Some((pid, tid))
}

/// Builds the code images, sharing the bytes of a mapping between them.
struct Images<'a, C: CodeSource> {
    snap: &'a Snapshot,
    source: &'a C,
    bytes: HashMap<(u32, u64), Option<Arc<[u8]>>>,
    /// By the sorted pids they hold.
    built: HashMap<Vec<u32>, Arc<Image>>,
}

impl<C: CodeSource> Images<'_, C> {
    fn code(&mut self, pid: u32, entry: &MapEntry) -> Option<Arc<[u8]>> {
        let snap = self.snap;
        let source = self.source;
        self.bytes
            .entry((pid, entry.start))
            .or_insert_with(|| {
                let len = usize::try_from(entry.end.saturating_sub(entry.start)).ok()?;
                let embedded = snap
                    .code
                    .iter()
                    .find(|c| c.pid == pid && c.start == entry.start)
                    .map(|c| {
                        c.data
                            .get(..len.min(c.data.len()))
                            .unwrap_or_default()
                            .to_vec()
                    });
                let mut bytes = embedded.or_else(|| source.code(pid, entry))?;
                bytes.truncate(len);
                Some(bytes.into())
            })
            .clone()
    }

    /// The image of the executable mappings of `pids` (every process when empty).
    fn image(&mut self, pids: &BTreeSet<u32>) -> Arc<Image> {
        let key: Vec<u32> = pids.iter().copied().collect();
        if let Some(image) = self.built.get(&key) {
            return Arc::clone(image);
        }
        let mut image = Image::new();
        let snap = self.snap;
        for process in snap
            .maps
            .iter()
            .filter(|p| pids.is_empty() || pids.contains(&p.pid))
        {
            for entry in process.maps.iter().filter(|m| m.perms.contains('x')) {
                if let Some(bytes) = self.code(process.pid, entry) {
                    image.add(&entry.path, bytes, entry.start);
                }
            }
        }
        let image = Arc::new(image);
        self.built.insert(key, Arc::clone(&image));
        image
    }
}

/// How branch times become nanoseconds.
struct Clock {
    monotonic: Option<crate::capture::ClockConversion>,
    perf: Option<super::pt::TscConversion>,
}

impl Clock {
    fn ns(&self, tsc: u64) -> u64 {
        self.monotonic
            .and_then(|c| c.tsc_to_monotonic_ns(tsc))
            .or_else(|| self.perf.map(|c| c.tsc_to_ns(tsc)))
            .unwrap_or(tsc)
    }
}

/// The flow configuration a snapshot's recorder implies (MTC period).
fn flow_config(snap: &Snapshot) -> FlowConfig {
    let mut config = FlowConfig::default();
    if let Some(&period) = snap.meta.recorder.config_fields.get("mtc_period") {
        config.events.timing.mtc_freq = u8::try_from(period).unwrap_or(0);
    }
    config
}

/// Decodes every AUX ring of `snap`. `keep` sees each branch with its track before it is
/// stored (to drop what the caller does not need, e.g. jumps inside a function).
pub fn decode(
    snap: &Snapshot,
    source: &impl CodeSource,
    mut keep: impl FnMut(Track, &BranchEvent) -> bool,
) -> PtThreads {
    let clock = snap.meta.clock;
    let perf = clock.and_then(|c| c.tsc_conversion());
    let pevent = PeventConfig {
        sample_type: snap.meta.recorder.sample_type,
        time_zero: perf.map_or(0, |c| c.time_zero),
        time_shift: perf.map_or(0, |c| c.time_shift),
        // Any non-zero multiplier reads the records; their times are dropped without one.
        time_mult: perf.map_or(1, |c| c.time_mult),
        ..PeventConfig::default()
    };
    let clock = Clock {
        monotonic: clock,
        perf,
    };
    let config = flow_config(snap);
    let mut images = Images {
        snap,
        source,
        bytes: HashMap::new(),
        built: HashMap::new(),
    };
    let mut out = PtThreads::default();
    let aux = snap.rings.iter().filter(|r| r.kind == RingKind::Aux);
    for (index, ring) in aux.enumerate() {
        let cpu = ring
            .cpu
            .unwrap_or_else(|| u32::try_from(index).unwrap_or(u32::MAX));
        let sideband = snap.sideband.iter().find(|s| s.cpu == ring.cpu);
        let timeline = sideband
            .map(|s| Timeline::read(s, &pevent))
            .map(|t| if perf.is_some() { t } else { t.without_times() })
            .unwrap_or_default();
        let pids: BTreeSet<u32> = timeline.threads().iter().map(|t| t.0).collect();
        let image = images.image(&pids);
        out.aux_bytes += ring.data.len() as u64;
        let mut ring_out = RingDecode {
            timeline: &timeline,
            cpu,
            clock: &clock,
            out: &mut out,
            pending: Vec::new(),
            last: None,
            untimed: 0,
        };
        for event in Branches::new(&ring.data, image.as_ref(), config) {
            ring_out.out.branches += 1;
            if event.kind == BranchKind::Error {
                ring_out.out.errors += 1;
            }
            let track = ring_out.track(&event);
            if keep(track, &event) {
                ring_out.push(track, &event);
            }
        }
        ring_out.finish();
        add_switch_outs(&timeline, &clock, &mut out);
        for (thread, comm) in timeline.comms {
            let track = Track::Thread {
                pid: thread.0,
                tid: thread.1,
            };
            if let Some(t) = out.tracks.get_mut(&track) {
                t.comm = Some(comm);
            }
        }
    }
    for track in out.tracks.values_mut() {
        if !track.branches.is_sorted_by_key(|b| b.time_ns) {
            track.branches.sort_by_key(|b| b.time_ns);
        }
    }
    out
}

/// A switch-out is a trace stop on the thread (when the thread has branches).
fn add_switch_outs(timeline: &Timeline, clock: &Clock, out: &mut PtThreads) {
    for &(tsc, (pid, tid)) in &timeline.outs {
        if let Some(track) = out.tracks.get_mut(&Track::Thread { pid, tid }) {
            track.branches.push(Branch {
                kind: BranchKind::TraceStop,
                time_ns: clock.ns(tsc),
                from: 0,
                to: 0,
                error: None,
            });
        }
    }
}

/// One ring's branches on their way to the tracks.
struct RingDecode<'a> {
    timeline: &'a Timeline,
    cpu: u32,
    clock: &'a Clock,
    out: &'a mut PtThreads,
    /// Branches before the first timed one.
    pending: Vec<(Track, BranchEvent)>,
    /// The thread and time of the last timed branch.
    last: Option<(Option<Thread>, u64)>,
    untimed: u64,
}

impl RingDecode<'_> {
    fn track(&self, event: &BranchEvent) -> Track {
        let thread = if event.has_tsc {
            self.timeline.at(event.tsc)
        } else {
            self.last.map_or(self.timeline.initial, |l| l.0)
        };
        thread.map_or(Track::Cpu(self.cpu), |(pid, tid)| Track::Thread {
            pid,
            tid,
        })
    }

    fn push(&mut self, track: Track, event: &BranchEvent) {
        if !event.has_tsc && self.last.is_none() {
            self.pending.push((track, *event));
            return;
        }
        let time_ns = if event.has_tsc {
            let ns = self.clock.ns(event.tsc);
            let thread = match track {
                Track::Thread { pid, tid } => Some((pid, tid)),
                Track::Cpu(_) => None,
            };
            self.last = Some((thread, ns));
            ns
        } else {
            self.last.map_or(0, |l| l.1)
        };
        for (track, pending) in std::mem::take(&mut self.pending) {
            self.store(track, &pending, time_ns);
        }
        self.store(track, event, time_ns);
    }

    /// A ring without any timing: 1 ns per branch.
    fn finish(&mut self) {
        for (track, pending) in std::mem::take(&mut self.pending) {
            self.untimed += 1;
            let time_ns = self.untimed;
            self.store(track, &pending, time_ns);
        }
    }

    fn store(&mut self, track: Track, event: &BranchEvent, time_ns: u64) {
        self.out
            .tracks
            .entry(track)
            .or_default()
            .branches
            .push(Branch::from_event(event, time_ns));
    }
}

#[cfg(test)]
#[path = "pt_snapshot_tests.rs"]
mod tests;
