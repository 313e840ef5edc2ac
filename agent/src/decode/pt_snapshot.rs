//! Decode, Intel PT half over a snapshot: each CPU's AUX bytes → branch events, put on the
//! threads that ran them.
//!
//! In: a [`Snapshot`] of the `intel-pt` backend (AUX rings, per-CPU sideband, maps and
//! embedded code) and a [`CodeSource`] for the code the bundle does not embed (the caller
//! reads files; this module stays sans-IO). Out: per [`Track`] the [`Branch`]es in time
//! order, into a [`BranchSink`] as they are decoded ([`decode`]: a track seen on one CPU
//! is never held in memory) or all at once ([`decode_all`]), with the names the
//! sideband gave, and counts.
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
//! - A per-CPU recorder's rings (`cpu_wide`) hold every process that ran: only the tracks
//!   of the processes whose maps the snapshot holds are kept; the rest (other processes'
//!   branches and the errors of decoding them without their code) are counted and dropped.
//! - Time: TSC → `CLOCK_MONOTONIC` ns with the bundle's clock (the trigger's clock), else
//!   perf time, else TSC ticks. A branch before the ring's first timing packet takes the
//!   first timed branch's time; a ring without any timing gets 1 ns per branch, so order
//!   and nesting still show.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::pt::flow::branches::{
    BranchEvent, BranchKind, Branches, ParallelStats, Split, decode_parallel_with,
};
use super::pt::sideband::pevent::{PeventConfig, read_record};
use super::pt::{FlowConfig, Image};
use crate::capture::procmaps::ALL_PROCESSES;
use crate::capture::{MapEntry, RingKind, SidebandData};
use crate::snapshot::Snapshot;

const PERF_RECORD_COMM: u32 = 3;
const PERF_RECORD_ITRACE_START: u32 = 12;
const PERF_RECORD_SWITCH: u32 = 14;
const PERF_RECORD_SWITCH_CPU_WIDE: u32 = 15;
const PERF_RECORD_MISC_SWITCH_OUT: u16 = 1 << 13;

/// One branch of a thread, in time order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    pub kind: BranchKind,
    pub time_ns: u64,
    /// The branch instruction (0 when not known).
    pub from: u64,
    /// The target (0 when not known).
    pub to: u64,
    /// For [`BranchKind::Error`]: what went wrong.
    pub error: Option<String>,
}

impl Branch {
    /// A decoder's branch event, with its time already converted to `time_ns`.
    #[must_use]
    pub fn from_event(event: &BranchEvent, time_ns: u64) -> Self {
        Self {
            kind: event.kind,
            time_ns,
            from: event.from,
            to: event.to,
            error: event.error.as_ref().map(ToString::to_string),
        }
    }
}

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
    pub branches: BranchList,
}

/// Branches in chunks: a list of millions grows without copying itself (a `Vec` doubling
/// holds both copies at its peak), and is freed chunk by chunk as it is consumed.
#[derive(Debug, Clone, Default)]
pub struct BranchList {
    chunks: Vec<Vec<Branch>>,
    /// A branch came earlier than the one before it.
    unsorted: bool,
}

impl BranchList {
    const CHUNK: usize = 1 << 16;

    pub fn push(&mut self, branch: Branch) {
        let last = self.chunks.last().and_then(|c| c.last());
        self.unsorted |= last.is_some_and(|l| l.time_ns > branch.time_ns);
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < Self::CHUNK => chunk.push(branch),
            _ => {
                let mut chunk = Vec::with_capacity(Self::CHUNK);
                chunk.push(branch);
                self.chunks.push(chunk);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.iter().all(Vec::is_empty)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Branch> {
        self.chunks.iter().flatten()
    }

    /// Puts the branches in time order (stable), when they are not.
    fn sort_by_time(&mut self) {
        if !std::mem::take(&mut self.unsorted) {
            return;
        }
        let mut all: Vec<Branch> = std::mem::take(&mut self.chunks)
            .into_iter()
            .flatten()
            .collect();
        all.sort_by_key(|b| b.time_ns);
        for branch in all {
            self.push(branch);
        }
    }
}

impl IntoIterator for BranchList {
    type Item = Branch;
    type IntoIter = BranchListIter;

    fn into_iter(self) -> BranchListIter {
        BranchListIter {
            left: self.len(),
            chunks: self.chunks.into_iter(),
            current: Vec::new().into_iter(),
        }
    }
}

/// The branches of a [`BranchList`] by value; each chunk is freed once passed. Knows its
/// length, so a consumer can size what it builds from them once.
pub struct BranchListIter {
    chunks: std::vec::IntoIter<Vec<Branch>>,
    current: std::vec::IntoIter<Branch>,
    left: usize,
}

impl Iterator for BranchListIter {
    type Item = Branch;

    fn next(&mut self) -> Option<Branch> {
        loop {
            if let Some(branch) = self.current.next() {
                self.left -= 1;
                return Some(branch);
            }
            self.current = self.chunks.next()?.into_iter();
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for BranchListIter {}

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
    /// Branch events of processes the snapshot does not hold, dropped
    /// ([`DecodeSummary::other_processes`]).
    pub other_processes: u64,
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
        line.outs.sort_by_key(|e| e.0);
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
    #[cfg(test)]
    fn at(&self, tsc: u64) -> Option<Thread> {
        self.span(tsc).2
    }

    /// The thread that ran at `tsc`, and the TSC range `[lo, hi)` where the same thread ran
    /// (so a run of branches needs one search).
    fn span(&self, tsc: u64) -> (u64, u64, Option<Thread>) {
        let index = self.entries.partition_point(|e| e.0 <= tsc);
        let lo = index.checked_sub(1).map_or(0, |i| self.entries[i].0);
        let hi = self.entries.get(index).map_or(u64::MAX, |e| e.0);
        let thread = match index.checked_sub(1).map(|i| self.entries[i]) {
            None => self.initial,
            Some((_, Some(thread))) => Some(thread),
            Some((_, None)) => self.entries[index..]
                .iter()
                .find_map(|e| e.1)
                .or(self.initial),
        };
        (lo, hi, thread)
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
        // Code of every process (the kernel's): one copy for all of them.
        let everyone = snap
            .code
            .iter()
            .any(|c| c.pid == ALL_PROCESSES && c.start == entry.start && c.path == entry.path);
        let key = (if everyone { ALL_PROCESSES } else { pid }, entry.start);
        self.bytes
            .entry(key)
            .or_insert_with(|| {
                let len = usize::try_from(entry.end.saturating_sub(entry.start)).ok()?;
                let embedded = snap
                    .code
                    .iter()
                    .find(|c| c.pid == key.0 && c.start == entry.start)
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
    perf: Option<crate::capture::tsc::TscConversion>,
}

impl Clock {
    fn ns(&self, tsc: u64) -> u64 {
        self.monotonic
            .and_then(|c| c.tsc_to_monotonic_ns(tsc))
            .or_else(|| self.perf.map(|c| c.tsc_to_ns(tsc)))
            .unwrap_or(tsc)
    }
}

/// The flow configuration a snapshot's recorder implies: the MTC period it set, and the
/// recording CPU's timing parameters and errata
/// ([`crate::capture::pt_timing::PtTiming`]) where the snapshot kept
/// them (older snapshots did not: their MTCs cannot be timed).
fn flow_config(snap: &Snapshot) -> FlowConfig {
    let mut config = FlowConfig::default();
    let timing = &mut config.events.timing;
    if let Some(&period) = snap.meta.recorder.config_fields.get("mtc_period") {
        timing.mtc_freq = u8::try_from(period).unwrap_or(0);
    }
    if let Some(t) = &snap.meta.recorder.pt_timing {
        if let Some((num, den)) = t.tsc_art_ratio {
            timing.cpuid_0x15_ebx = num;
            timing.cpuid_0x15_eax = den;
        }
        timing.nom_freq = t.max_nonturbo_ratio.unwrap_or(0);
        if let Some(errata) = t
            .cpu
            .as_deref()
            .and_then(|c| c.parse::<super::pt::Cpu>().ok())
            .and_then(|c| super::pt::Errata::for_cpu(c).ok())
        {
            timing.errata = errata;
        }
    }
    config
}

/// Where decoded branches go, track by track.
pub trait BranchSink {
    /// Whether `event` of `track` is wanted (asked before it is timed and stored: drop
    /// here what the consumer ignores, e.g. jumps inside a function).
    fn keep(&mut self, _track: Track, _event: &BranchEvent) -> bool {
        true
    }

    /// The next branch of `track`. A track's branches come in time order; tracks fed by
    /// one ring come as that ring is decoded (nothing is held), tracks seen on several
    /// CPUs are merged at the end.
    fn branch(&mut self, track: Track, branch: Branch);
}

/// What a decode saw, besides the branches.
#[derive(Debug, Default)]
pub struct DecodeSummary {
    /// Branch events the decoder produced (kept or not).
    pub branches: u64,
    /// Decode errors (each is also a [`BranchKind::Error`] branch).
    pub errors: u64,
    /// Bytes of AUX data decoded.
    pub aux_bytes: u64,
    /// Thread names from COMM records.
    pub comms: BTreeMap<Track, String>,
    /// How the rings' pieces went (with more than one thread).
    pub parallel: ParallelStats,
    /// Branch events (errors included) of processes the snapshot does not hold, dropped:
    /// a per-CPU recorder's rings hold every process's trace.
    pub other_processes: u64,
}

/// Collects every branch: [`decode_all`]'s sink.
#[derive(Default)]
struct Collect(BTreeMap<Track, BranchList>);

impl BranchSink for Collect {
    fn branch(&mut self, track: Track, branch: Branch) {
        self.0.entry(track).or_default().push(branch);
    }
}

/// [`decode`] into memory: every track's branches (each ring decoded on `threads`).
pub fn decode_all(snap: &Snapshot, source: &impl CodeSource, threads: usize) -> PtThreads {
    let mut collect = Collect::default();
    let summary = decode(snap, source, &mut collect, threads);
    let tracks: BTreeMap<Track, TrackBranches> = collect
        .0
        .into_iter()
        .map(|(track, branches)| {
            let comm = summary.comms.get(&track).cloned();
            (track, TrackBranches { comm, branches })
        })
        .collect();
    PtThreads {
        tracks,
        branches: summary.branches,
        errors: summary.errors,
        aux_bytes: summary.aux_bytes,
        other_processes: summary.other_processes,
    }
}

fn thread_track((pid, tid): Thread) -> Track {
    Track::Thread { pid, tid }
}

/// The AUX rings with their CPU and the timeline of their sideband (trusted for times
/// only with a TSC conversion).
fn rings<'s>(
    snap: &'s Snapshot,
    pevent: &PeventConfig,
    timed: bool,
) -> Vec<(u32, &'s crate::capture::RingData, Timeline)> {
    snap.rings
        .iter()
        .filter(|r| r.kind == RingKind::Aux)
        .enumerate()
        .map(|(index, ring)| {
            let cpu = ring
                .cpu
                .unwrap_or_else(|| u32::try_from(index).unwrap_or(u32::MAX));
            let timeline = snap
                .sideband
                .iter()
                .find(|s| s.cpu == ring.cpu)
                .map(|s| Timeline::read(s, pevent))
                .map(|t| if timed { t } else { t.without_times() })
                .unwrap_or_default();
            (cpu, ring, timeline)
        })
        .collect()
}

/// Threads that ran on several CPUs: their branches are held and merged by time.
fn merged_tracks(rings: &[(u32, &crate::capture::RingData, Timeline)]) -> BTreeSet<Track> {
    let mut rings_of: HashMap<Thread, usize> = HashMap::new();
    for (_, _, timeline) in rings {
        for thread in timeline.threads() {
            *rings_of.entry(thread).or_default() += 1;
        }
    }
    rings_of
        .into_iter()
        .filter(|&(_, n)| n > 1)
        .map(|(thread, _)| thread_track(thread))
        .collect()
}

/// Decodes every AUX ring of `snap` into `sink`, each on `threads` threads (the same
/// branches in the same order: [`decode_parallel_with`]).
pub fn decode(
    snap: &Snapshot,
    source: &impl CodeSource,
    sink: &mut impl BranchSink,
    threads: usize,
) -> DecodeSummary {
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
    let rings = rings(snap, &pevent, perf.is_some());
    let merged = merged_tracks(&rings);
    // A per-CPU recorder's rings: only the tracks of the processes whose maps came along.
    let kept: Option<BTreeSet<u32>> = snap
        .meta
        .recorder
        .cpu_wide
        .then(|| snap.maps.iter().map(|p| p.pid).collect());
    let mut summary = DecodeSummary::default();
    let mut held: BTreeMap<Track, BranchList> = BTreeMap::new();
    for (cpu, ring, timeline) in &rings {
        let pids: BTreeSet<u32> = timeline.threads().iter().map(|t| t.0).collect();
        let image = images.image(&pids);
        summary.aux_bytes += ring.data.len() as u64;
        let mut ring_out = RingDecode {
            timeline,
            cpu: *cpu,
            clock: &clock,
            sink: &mut *sink,
            merged: &merged,
            held: &mut held,
            seen: BTreeSet::new(),
            outs: 0,
            pending: Vec::new(),
            last: None,
            untimed: 0,
            span: (0, 0, None),
            seen_last: None,
        };
        let mut take = |batch: &[BranchEvent]| {
            for event in batch {
                let track = ring_out.track(event);
                if let Some(kept) = &kept
                    && !matches!(track, Track::Thread { pid, .. } if kept.contains(&pid))
                {
                    summary.other_processes += 1;
                    continue;
                }
                summary.branches += 1;
                if event.kind == BranchKind::Error {
                    summary.errors += 1;
                }
                if ring_out.sink.keep(track, event) {
                    ring_out.push(track, event);
                }
            }
        };
        if threads > 1 {
            let split = Split::streaming(threads);
            let (_, stats) =
                decode_parallel_with(&ring.data, image.as_ref(), config, split, &mut take);
            summary.parallel.add(&stats);
        } else {
            let mut branches = Branches::new(&ring.data, image.as_ref(), config);
            loop {
                let batch = branches.next_batch();
                if batch.is_empty() {
                    break;
                }
                take(batch);
            }
        }
        ring_out.finish();
        for (thread, comm) in &timeline.comms {
            summary.comms.insert(thread_track(*thread), comm.clone());
        }
    }
    for (track, mut branches) in held {
        branches.sort_by_time();
        for branch in branches {
            sink.branch(track, branch);
        }
    }
    summary
}

/// One ring's branches on their way to the tracks.
struct RingDecode<'a, S> {
    timeline: &'a Timeline,
    cpu: u32,
    clock: &'a Clock,
    sink: &'a mut S,
    /// Tracks of several rings: held in `held` until every ring is decoded.
    merged: &'a BTreeSet<Track>,
    held: &'a mut BTreeMap<Track, BranchList>,
    /// Tracks that got branches from this ring.
    seen: BTreeSet<Track>,
    /// The switch-outs before this index of `timeline.outs` are delivered.
    outs: usize,
    /// Branches before the first timed one.
    pending: Vec<(Track, BranchEvent)>,
    /// The thread and time of the last timed branch.
    last: Option<(Option<Thread>, u64)>,
    untimed: u64,
    /// The last [`Timeline::span`]: the thread of every TSC in `[.0, .1)`.
    span: (u64, u64, Option<Thread>),
    /// The track last added to `seen`.
    seen_last: Option<Track>,
}

impl<S: BranchSink> RingDecode<'_, S> {
    fn track(&mut self, event: &BranchEvent) -> Track {
        let thread = if event.has_tsc {
            let (lo, hi, thread) = self.span;
            if (lo..hi).contains(&event.tsc) {
                thread
            } else {
                self.span = self.timeline.span(event.tsc);
                self.span.2
            }
        } else {
            self.last.map_or(self.timeline.initial, |l| l.0)
        };
        thread.map_or(Track::Cpu(self.cpu), thread_track)
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
            self.store(track, Branch::from_event(&pending, time_ns));
        }
        self.store(track, Branch::from_event(event, time_ns));
    }

    /// The rest: a ring without any timing gets 1 ns per branch; switch-outs after the
    /// last branch.
    fn finish(&mut self) {
        for (track, pending) in std::mem::take(&mut self.pending) {
            self.untimed += 1;
            let time_ns = self.untimed;
            self.store(track, Branch::from_event(&pending, time_ns));
        }
        self.switch_outs(u64::MAX);
    }

    /// A switch-out (up to `until`) is a trace stop on its thread, when the thread has
    /// branches here: its time off the CPU shows as `[untraced]`.
    fn switch_outs(&mut self, until: u64) {
        while let Some(&(tsc, thread)) = self.timeline.outs.get(self.outs) {
            let time_ns = self.clock.ns(tsc);
            if time_ns > until {
                break;
            }
            self.outs += 1;
            let track = thread_track(thread);
            if self.seen.contains(&track) {
                let stop = Branch {
                    kind: BranchKind::TraceStop,
                    time_ns,
                    from: 0,
                    to: 0,
                    error: None,
                };
                self.deliver(track, stop);
            }
        }
    }

    fn store(&mut self, track: Track, branch: Branch) {
        self.switch_outs(branch.time_ns);
        if self.seen_last != Some(track) {
            self.seen.insert(track);
            self.seen_last = Some(track);
        }
        self.deliver(track, branch);
    }

    fn deliver(&mut self, track: Track, branch: Branch) {
        if self.merged.contains(&track) {
            self.held.entry(track).or_default().push(branch);
        } else {
            self.sink.branch(track, branch);
        }
    }
}

#[cfg(test)]
#[path = "pt_snapshot_tests.rs"]
mod tests;
