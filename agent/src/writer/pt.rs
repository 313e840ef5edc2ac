//! Writer, Intel PT half: a PT snapshot → the same trace the sampling half writes.
//!
//! `decode::pt_snapshot` (code from the bundle, else the mapped files on this machine)
//! → per-thread branch events → `stacks::branches` (magic-trace's rules, ties spread) with
//! function names from `symbols` → the sink. One track per thread (`comm [pid] [tid]`;
//! a CPU whose sideband named no thread is a track `[cpu N]`), one slice per call named
//! by the demangled function (args `address` = the function's first byte, `location`,
//! `module`), `[unknown @ ADDR]` for calls into code without symbols, `[untraced]`,
//! `[syscall]`, `[interrupt]`, `[decode error: ...]` as the stacks stage makes them, and
//! the trigger instant. Inlined functions are not split out (a call is one slice).
//!
//! Jumps that stay inside one function change no stack: they are dropped while decoding
//! so the per-thread lists hold calls, returns and the rest, not every loop iteration.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::hash::BuildHasherDefault;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::{Arg, ArgValue, TraceSink, TraceSummary, stack_line, trigger_instant};
use crate::capture::MapEntry;
use crate::capture::records::PtLosses;
use crate::decode::pt::flow::cache::IpHasher;
use crate::decode::pt::{BranchEvent, BranchKind};
use crate::decode::pt_snapshot::{self, BranchSink, CodeSource, Track};
use crate::snapshot::{Snapshot, TriggerMeta};
use crate::stacks::StackEvent;
use crate::stacks::branches::{Branch, Frame, Reconstruction, Symbol};
use crate::symbols::Symbolizer;

/// A function an address is in, with what the slice args show.
struct Func {
    name: Rc<str>,
    start: u64,
    /// One past the last byte, when the symbol has a size.
    end: Option<u64>,
    module: Option<String>,
    location: Option<String>,
}

/// Address → function, cached per (process, address): hot code is looked up once.
struct Lookup<'a> {
    symbols: Symbolizer<'a>,
    snap: &'a Snapshot,
    cache: HashMap<(u32, u64), Option<Rc<Func>>, BuildHasherDefault<IpHasher>>,
    /// The functions found lately, by address range (pid, start, end): every jump needs
    /// the function of both its ends, and nearly all stay in a few hot functions, where a
    /// range check is cheaper than hashing each address.
    recent: [Option<FuncRange>; RECENT_FUNCS],
    next_recent: usize,
}

/// A function of a process and its address range: (pid, start, end, function).
type FuncRange = (u32, u64, u64, Rc<Func>);

/// How many function ranges [`Lookup`] keeps at hand.
const RECENT_FUNCS: usize = 4;

impl Lookup<'_> {
    /// The process a track's addresses belong to: its own, or for a CPU track the one
    /// process whose mappings hold `addr`.
    fn pid_of(&self, pid: Option<u32>, addr: u64) -> Option<u32> {
        pid.or_else(|| {
            self.snap
                .maps
                .iter()
                .find(|p| p.maps.iter().any(|m| (m.start..m.end).contains(&addr)))
                .map(|p| p.pid)
        })
    }

    fn func(&mut self, pid: Option<u32>, addr: u64) -> Option<Rc<Func>> {
        let pid = self.pid_of(pid, addr)?;
        if let Some(hit) = self.cache.get(&(pid, addr)) {
            return hit.clone();
        }
        let frame = self.symbols.frame(pid, addr);
        let func = frame
            .func_offset
            .filter(|_| frame.unknown.is_none())
            .map(|offset| {
                let start = addr.wrapping_sub(offset);
                Rc::new(Func {
                    name: frame.name.as_str().into(),
                    start,
                    end: frame.func_size.map(|size| start.saturating_add(size)),
                    module: frame.module.clone(),
                    location: frame.location.clone(),
                })
            });
        self.cache.insert((pid, addr), func.clone());
        func
    }

    /// The function `addr` is in, as [`Lookup::func`] but from the recent ranges when one
    /// holds `addr`: only its name, start and module are `addr`'s (the location may be of
    /// another address of the function).
    fn func_of(&mut self, pid: Option<u32>, addr: u64) -> Option<Rc<Func>> {
        let pid = self.pid_of(pid, addr)?;
        if let Some((.., func)) = self
            .recent
            .iter()
            .flatten()
            .find(|(p, start, end, _)| *p == pid && (*start..*end).contains(&addr))
        {
            return Some(Rc::clone(func));
        }
        let func = self.func(Some(pid), addr)?;
        if let Some(end) = func.end.filter(|&end| end > func.start) {
            self.recent[self.next_recent] = Some((pid, func.start, end, Rc::clone(&func)));
            self.next_recent = (self.next_recent + 1) % RECENT_FUNCS;
        }
        Some(func)
    }

    fn symbol(&mut self, pid: Option<u32>, addr: u64) -> Option<Symbol> {
        self.func_of(pid, addr).map(|f| Symbol {
            name: Rc::clone(&f.name),
            start: f.start,
        })
    }

    /// A jump that stays in one known function, or goes where no function is known,
    /// changes no frame.
    fn keep(&mut self, track: Track, event: &BranchEvent) -> bool {
        if !matches!(event.kind, BranchKind::Jump | BranchKind::FarJump) {
            return true;
        }
        let pid = track_pid(track);
        let Some(to) = self.func_of(pid, event.to) else {
            return false;
        };
        self.func_of(pid, event.from)
            .is_none_or(|from| from.start != to.start)
    }
}

fn track_pid(track: Track) -> Option<u32> {
    match track {
        Track::Thread { pid, .. } => Some(pid),
        Track::Cpu(_) => None,
    }
}

/// Code from the files the snapshot's maps name, only the mapped range: the recorded
/// path when it is the same inode, else through `/proc/PID/root` (containers), else the
/// path.
struct DiskCode;

impl DiskCode {
    fn read_range(path: &Path, offset: u64, len: u64) -> Option<Vec<u8>> {
        let mut file = fs::File::open(path).ok()?;
        let mut bytes = Vec::new();
        file.seek(SeekFrom::Start(offset)).ok()?;
        file.take(len).read_to_end(&mut bytes).ok()?;
        Some(bytes)
    }
}

impl CodeSource for DiskCode {
    fn code(&self, pid: u32, entry: &MapEntry) -> Option<Vec<u8>> {
        if !entry.is_file() || entry.deleted() {
            return None;
        }
        let len = entry.end.saturating_sub(entry.start);
        let plain = PathBuf::from(&entry.path);
        let same = fs::metadata(&plain).is_ok_and(|m| m.is_file() && m.ino() == entry.inode);
        let in_root = PathBuf::from(format!("/proc/{pid}/root{}", entry.path));
        let candidates = if same {
            vec![plain]
        } else {
            vec![in_root, plain]
        };
        candidates
            .iter()
            .find_map(|p| Self::read_range(p, entry.offset, len))
    }
}

/// The (pid, tid) a track is written as: CPU tracks take the snapshot's only process (else
/// pid 0) and a tid no thread has.
fn track_key(snap: &Snapshot, track: Track) -> (u32, u32) {
    match track {
        Track::Thread { pid, tid } => (pid, tid),
        Track::Cpu(cpu) => {
            let pid = match snap.maps.as_slice() {
                [only] => only.pid,
                _ => 0,
            };
            (pid, u32::MAX - cpu)
        }
    }
}

fn comm_of(snap: &Snapshot, pid: u32) -> Option<String> {
    snap.maps
        .iter()
        .find(|m| m.pid == pid)
        .map(|m| m.comm.clone())
        .filter(|c| !c.is_empty())
}

/// A function lookup for one track's stack reconstruction.
type SymbolFn<'r> = Box<dyn Fn(u64) -> Option<Symbol> + 'r>;

/// The decoder's sink: drops jumps that change no frame, feeds each track's stack
/// reconstruction as its branches come.
struct Stacks<'r, 'l> {
    lookup: &'r RefCell<Lookup<'l>>,
    tracks: BTreeMap<Track, Reconstruction<SymbolFn<'r>>>,
}

impl BranchSink for Stacks<'_, '_> {
    fn keep(&mut self, track: Track, event: &BranchEvent) -> bool {
        self.lookup.borrow_mut().keep(track, event)
    }

    fn branch(&mut self, track: Track, branch: Branch) {
        let lookup = self.lookup;
        self.tracks
            .entry(track)
            .or_insert_with(|| {
                let pid = track_pid(track);
                Reconstruction::new(Box::new(move |addr| lookup.borrow_mut().symbol(pid, addr)))
            })
            .step(&branch);
    }
}

/// Feeds the trace of a PT snapshot to `sink` (without [`TraceSink::finish`]), decoding
/// each ring on `threads` threads.
pub fn emit(
    snap: &Snapshot,
    sink: &mut impl TraceSink,
    threads: usize,
) -> io::Result<TraceSummary> {
    let lookup = RefCell::new(Lookup {
        symbols: Symbolizer::new(&snap.maps, &snap.code, &snap.meta.debug_dirs)
            .with_debuginfod(&snap.meta.debuginfod)
            .with_perf_maps(&snap.perf_maps),
        snap,
        cache: HashMap::default(),
        recent: Default::default(),
        next_recent: 0,
    });
    let mut stacks = Stacks {
        lookup: &lookup,
        tracks: BTreeMap::new(),
    };
    let decoded = pt_snapshot::decode(snap, &DiskCode, &mut stacks, threads);
    let mut losses = PtLosses::default();
    for sideband in &snap.sideband {
        losses.add(&sideband.data);
    }
    let mut summary = TraceSummary {
        threads: stacks.tracks.len(),
        branches: decoded.branches,
        decode_errors: decoded.errors,
        decode_threads: threads,
        decode_pieces: decoded.parallel,
        lost_samples: losses.perf,
        lost_aux: losses.aux,
        ..TraceSummary::default()
    };
    let trigger = snap.meta.trigger.as_ref().filter(|t| t.pid != 0);
    summary.trigger_stack = super::trigger_stack(snap, &mut lookup.borrow_mut().symbols);
    summary.call_name = super::call_name(snap, &mut lookup.borrow_mut().symbols);
    let trigger_stack = stack_line(&summary.trigger_stack);
    let keys: Vec<(u32, u32)> = stacks.tracks.keys().map(|&t| track_key(snap, t)).collect();
    let pids: BTreeSet<u32> = keys.iter().map(|k| k.0).collect();
    for pid in pids {
        let comm = comm_of(snap, pid).unwrap_or_else(|| "?".to_owned());
        sink.process(pid, &super::process_track_name(snap, pid, &comm))?;
    }
    for (track, reconstruction) in stacks.tracks {
        let key = track_key(snap, track);
        let name = match track {
            Track::Thread { pid, tid } => {
                let comm = decoded
                    .comms
                    .get(&track)
                    .cloned()
                    .or_else(|| comm_of(snap, pid))
                    .unwrap_or_else(|| "?".to_owned());
                format!("{comm} [{pid}] [{tid}]")
            }
            Track::Cpu(cpu) => format!("[cpu {cpu}]"),
        };
        sink.thread(key.0, key.1, &name)?;
        let mut writer = TrackWriter {
            sink: &mut *sink,
            lookup: &lookup,
            pid: track_pid(track),
            key,
            open: Vec::new(),
            pending: trigger.filter(|t| (t.pid, t.tid) == key),
            trigger_stack: &trigger_stack,
            slices: 0,
        };
        let mut result = Ok(());
        reconstruction.finish(|event| {
            if result.is_ok() {
                result = writer.event(event);
            }
        });
        result?;
        summary.slices += writer.slices;
        if let Some(t) = writer.pending {
            trigger_instant(writer.sink, t, &trigger_stack)?;
        }
    }
    if let Some(t) = trigger.filter(|t| !keys.contains(&(t.pid, t.tid))) {
        // The trigger thread has no trace: give it its own track.
        let comm = if t.comm.is_empty() { "?" } else { &t.comm };
        sink.thread(t.pid, t.tid, &format!("{comm} [{}] [{}]", t.pid, t.tid))?;
        trigger_instant(sink, t, &trigger_stack)?;
    }
    summary.unknown_frames = lookup.borrow().symbols.misses;
    summary.symbols = lookup.borrow_mut().symbols.module_report();
    Ok(summary)
}

/// Writes one track's slices as they come.
struct TrackWriter<'a, 'l, S> {
    sink: &'a mut S,
    lookup: &'a RefCell<Lookup<'l>>,
    pid: Option<u32>,
    key: (u32, u32),
    /// The names of the open slices, innermost last.
    open: Vec<Rc<str>>,
    /// The trigger, until its instant is written.
    pending: Option<&'a TriggerMeta>,
    /// The trigger's stack, for its instant.
    trigger_stack: &'a str,
    slices: u64,
}

impl<S: TraceSink> TrackWriter<'_, '_, S> {
    fn event(&mut self, event: StackEvent<Frame>) -> io::Result<()> {
        let ts = match &event {
            StackEvent::Begin { ts, .. } | StackEvent::End { ts } => *ts,
            StackEvent::Gap { start, .. } | StackEvent::OffCpu { start, .. } => *start,
        };
        if let Some(t) = self.pending.filter(|t| t.trigger_time_ns < ts) {
            trigger_instant(self.sink, t, self.trigger_stack)?;
            self.pending = None;
        }
        match event {
            StackEvent::Begin { ts, frame } => {
                self.slices += 1;
                let name = slice_name(&frame);
                self.begin(ts, &frame, &name)?;
                self.open.push(name);
            }
            StackEvent::End { ts } => {
                let name = self.open.pop().unwrap_or_else(|| "".into());
                self.sink.end(self.key, ts, &name)?;
            }
            StackEvent::Gap { start, end } => {
                self.sink.begin(self.key, start, super::UNTRACED, &[])?;
                self.sink.end(self.key, end, super::UNTRACED)?;
            }
            StackEvent::OffCpu {
                start,
                end,
                preempted,
            } => super::off_cpu_slice(self.sink, self.key, (start, end), preempted, None)?,
        }
        Ok(())
    }

    fn begin(&mut self, ts: u64, frame: &Frame, name: &str) -> io::Result<()> {
        let Frame::Function { start, .. } = frame else {
            return self.sink.begin(self.key, ts, name, &[]);
        };
        let func = self.lookup.borrow_mut().func(self.pid, *start);
        // No allocation per slice: a PT trace has a slice per call.
        let address = Arg::new("address", ArgValue::Pointer(*start));
        let mut args = [address.clone(), address.clone(), address];
        let mut n = 1;
        if let Some(loc) = func.as_ref().and_then(|f| f.location.as_deref()) {
            args[n] = Arg::new("location", ArgValue::Str(loc));
            n += 1;
        }
        if let Some(module) = func.as_ref().and_then(|f| f.module.as_deref()) {
            args[n] = Arg::new("module", ArgValue::Str(module));
            n += 1;
        }
        self.sink.begin(self.key, ts, name, &args[..n])
    }
}

/// A slice's name; a called function's is its symbol's, shared.
fn slice_name(frame: &Frame) -> Rc<str> {
    match frame {
        Frame::Function {
            name,
            inferred_start: false,
            ..
        } => Rc::clone(name),
        _ => frame.to_string().into(),
    }
}
