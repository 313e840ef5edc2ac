//! Unwind stage: a sample's user registers and copy of its user stack → the return
//! addresses on that stack, for code built without frame pointers (the default of gcc
//! -O2, clang, rustc release and most distro packages), with framehop.
//!
//! In: the snapshot's [`ProcessMaps`] and embedded code, and per sample its pid, IP/SP/BP
//! and the stack bytes from SP upwards (`PERF_SAMPLE_REGS_USER`/`STACK_USER`). Out: the
//! addresses of the stack, leaf first (the IP, then return addresses as they are on the
//! stack), and why the walk stopped.
//!
//! Why at decode time and with framehop: the kernel's callchain walks frame pointers, which
//! such code does not keep, so it stops after 1–2 frames or reads garbage. framehop reads
//! the CFI the files carry anyway for C++ exceptions and Rust panics (`.eh_frame`,
//! `.eh_frame_hdr`, `.debug_frame`), analyses prologues and epilogues where CFI is
//! imprecise, and falls back to frame pointers where a file has no CFI (Go) and for code
//! in no file at all: an address in anonymous executable memory (JIT code: V8 keeps frame
//! pointers, the JVM with `-XX:+PreserveFramePointer`) has no module, and framehop's rule
//! for it is the frame pointer chain (`rbp` → saved `rbp`, return address). The
//! files are the ones the symbolizer reads ([`crate::symbols::locate`]: the mapped inode,
//! else through `/proc/PID/root`), plus `[vdso]` from the snapshot's embedded code; each
//! file's unwind sections are read once, and each process gets its modules once.
#![forbid(unsafe_code)]

mod modules;

use std::collections::HashMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

use framehop::Unwinder as _;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};

use crate::capture::records::UserRegs;
use crate::capture::{CodeRegion, ProcessMaps};
use crate::elf::debug_file;
use crate::snapshot::Snapshot;
use crate::triggers::event::StackCopy;
use modules::UnwindSections;

/// The most frames taken from one stack (perf's `kernel.perf_event_max_stack` default).
pub const MAX_FRAMES: usize = 127;

/// How the unwinding of a snapshot's samples went, for the trace's metadata and benches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// Samples unwound from their stack copy.
    pub stacks: u64,
    /// Frames found, IPs included.
    pub frames: u64,
    /// Walks that stopped at an error (an address without CFI and without a usable frame
    /// pointer, or a read past the end of the copy) rather than at the stack's end.
    pub stopped_early: u64,
}

/// Each file's unwind sections (`None`: not readable), kept between unwinders.
#[derive(Default)]
pub struct UnwindFiles(HashMap<PathBuf, Option<Arc<UnwindSections>>>);

impl UnwindFiles {
    /// How many files it holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it holds none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One frame of [`StackUnwinder::frames_with_cfa`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CfaFrame {
    /// The IP (leaf) or the return address into the frame's code (after its call).
    pub address: u64,
    pub is_return: bool,
    /// The frame's canonical frame address.
    pub cfa: u64,
}

/// Unwinds the samples of one snapshot's processes.
pub struct StackUnwinder<'a> {
    maps: HashMap<u32, &'a ProcessMaps>,
    code: &'a [CodeRegion],
    /// Each process's modules, set up at its first sample.
    processes: HashMap<u32, UnwinderX86_64<Arc<[u8]>>>,
    /// Each file's unwind sections (`None`: not readable, or no CFI), read once for all
    /// processes.
    files: HashMap<PathBuf, Option<Arc<UnwindSections>>>,
    /// Where a binary whose own CFI covers less than half its `.text` may find more: its
    /// separate debug file's `.debug_frame` (debug directories, then debuginfod); `None`:
    /// not looked for.
    separate: Option<DebugSearchFor>,
    cache: CacheX86_64,
    pub stats: UnwindStats,
}

/// The debug directories and debuginfod servers of [`StackUnwinder::with_debug_files`].
struct DebugSearchFor {
    dirs: Vec<PathBuf>,
    debuginfod: Option<crate::elf::debuginfod::Config>,
}

impl DebugSearchFor {
    /// The separate debug file of `file` (read for the map entry at `mapped` of `pid`:
    /// searched where the process saw it), when one is found.
    fn debug_file(&self, pid: u32, mapped: &str, file: &Path) -> Option<PathBuf> {
        let (seen, search) = crate::symbols::debug_search(
            Some(pid),
            mapped,
            file,
            self.dirs.clone(),
            self.debuginfod.clone(),
        );
        // Read whole: only binaries with thin CFI of their own get here (rare).
        let data = std::fs::read(file).ok()?;
        let object = object::File::parse(&*data).ok()?;
        debug_file::locate_debug_file(&seen, &object, &search)
    }
}

impl<'a> StackUnwinder<'a> {
    /// An unwinder for the processes of `processes`, with the snapshot's embedded `code`.
    #[must_use]
    pub fn new(processes: &'a [ProcessMaps], code: &'a [CodeRegion]) -> Self {
        Self::with_files(processes, code, UnwindFiles::default())
    }

    /// [`Self::new`] with the unwind sections an earlier unwinder read
    /// ([`Self::into_files`]): a caller that unwinds a few stacks at a time (the in-flight
    /// watcher) reads each file's CFI once, not at every stack.
    pub fn with_files(
        processes: &'a [ProcessMaps],
        code: &'a [CodeRegion],
        files: UnwindFiles,
    ) -> Self {
        Self {
            maps: processes.iter().map(|p| (p.pid, p)).collect(),
            code,
            processes: HashMap::new(),
            files: files.0,
            separate: None,
            cache: CacheX86_64::new(),
            stats: UnwindStats::default(),
        }
    }

    /// The unwinder of a snapshot's processes as its trace is written: its embedded code,
    /// and the debug files of its `debug_dirs` and `debuginfod` servers
    /// ([`Self::with_debug_files`]).
    #[must_use]
    pub fn for_snapshot(snap: &'a Snapshot) -> Self {
        Self::new(&snap.maps, &snap.code)
            .with_debug_files(snap.meta.debug_dirs.clone(), snap.meta.debuginfod.config())
    }

    /// The unwinder with CFI also from the separate debug files of binaries that have none
    /// of their own (`dirs` first, then the `debuginfod` servers): the snapshot's
    /// `debug_dirs` and `debuginfod`.
    #[must_use]
    pub fn with_debug_files(
        mut self,
        dirs: Vec<PathBuf>,
        debuginfod: Option<crate::elf::debuginfod::Config>,
    ) -> Self {
        self.separate = Some(DebugSearchFor { dirs, debuginfod });
        self
    }

    /// The addresses of the stack of a sample of process `pid`, leaf first: `regs.ip`,
    /// then each return address as found on the stack (pointing after its call). `stack`
    /// is the copy of the user stack from `regs.sp` upwards. Without the process's maps
    /// only frame pointers can be followed.
    pub fn unwind(&mut self, pid: u32, regs: UserRegs, stack: &[u8]) -> Vec<u64> {
        if !self.processes.contains_key(&pid) {
            let unwinder = self.process_unwinder(pid);
            self.processes.insert(pid, unwinder);
        }
        let Some(unwinder) = self.processes.get(&pid) else {
            return vec![regs.ip];
        };
        let sp = regs.sp;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let at = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let word = stack.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(word.try_into().map_err(|_| ())?))
        };
        let mut frames = unwinder.iter_frames(
            regs.ip,
            UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
            &mut self.cache,
            &mut read_stack,
        );
        let mut out = Vec::new();
        loop {
            match frames.next() {
                Ok(Some(frame)) => out.push(frame.address()),
                Ok(None) => break,
                Err(_) => {
                    self.stats.stopped_early += 1;
                    break;
                }
            }
            if out.len() >= MAX_FRAMES {
                break;
            }
        }
        if out.is_empty() {
            out.push(regs.ip);
        }
        self.stats.stacks += 1;
        self.stats.frames += out.len() as u64;
        out
    }

    /// The unwind sections read so far, for [`Self::with_files`].
    #[must_use]
    pub fn into_files(self) -> UnwindFiles {
        UnwindFiles(self.files)
    }

    /// The frames of a stack of process `pid` as [`Self::unwind`] finds them, each with
    /// its canonical frame address (the caller's SP after the frame returns: for a
    /// function entered with SP = `h`, `h + 8`), leaf first; the walk stops at the first
    /// frame it cannot unwind (that frame is left out: its CFA is unknown).
    pub fn frames_with_cfa(&mut self, pid: u32, regs: UserRegs, stack: &[u8]) -> Vec<CfaFrame> {
        if !self.processes.contains_key(&pid) {
            let unwinder = self.process_unwinder(pid);
            self.processes.insert(pid, unwinder);
        }
        let Some(unwinder) = self.processes.get(&pid) else {
            return Vec::new();
        };
        let sp = regs.sp;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let at = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let word = stack.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(word.try_into().map_err(|_| ())?))
        };
        let mut uregs = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp);
        let mut address = framehop::FrameAddress::from_instruction_pointer(regs.ip);
        let mut out = Vec::new();
        while out.len() < MAX_FRAMES {
            let Ok(next) =
                unwinder.unwind_frame(address, &mut uregs, &mut self.cache, &mut read_stack)
            else {
                break;
            };
            out.push(CfaFrame {
                address: address.address(),
                is_return: address.is_return_address(),
                cfa: uregs.sp(),
            });
            let Some(next) = next.and_then(framehop::FrameAddress::from_return_address) else {
                break;
            };
            address = next;
        }
        out
    }

    /// The modules of process `pid`: one per mapped file (or embedded `[vdso]`) with
    /// executable code, at the addresses the process mapped it.
    fn process_unwinder(&mut self, pid: u32) -> UnwinderX86_64<Arc<[u8]>> {
        let mut unwinder = UnwinderX86_64::new();
        let Some(maps) = self.maps.get(&pid).copied() else {
            return unwinder;
        };
        for placed in modules::placements(maps) {
            let sections = if placed.entry.is_file() {
                // The hold keeps a held file open while its sections are read.
                let Some((file, _hold)) = crate::symbols::locate(pid, placed.entry) else {
                    continue;
                };
                let separate = self.separate.as_ref();
                let mapped = placed.entry.path.as_str();
                self.files
                    .entry(file.clone())
                    .or_insert_with(|| {
                        let own = UnwindSections::read_file(&file)?;
                        let debug = separate
                            .filter(|_| own.cfi_is_thin())
                            .and_then(|search| search.debug_file(pid, mapped, &file));
                        let sections = match debug {
                            Some(debug) => own.with_debug_file(&debug),
                            None => own,
                        };
                        sections.has_cfi().then(|| Arc::new(sections))
                    })
                    .clone()
            } else {
                self.code
                    .iter()
                    .find(|c| c.pid == pid && c.start == placed.entry.start)
                    .and_then(|c| UnwindSections::parse(&c.data))
                    .map(Arc::new)
            };
            if let Some(module) = sections.and_then(|s| s.module(&placed)) {
                unwinder.add_module(module);
            }
        }
        unwinder
    }
}

/// Completes the trigger's stack in `snap`: replaces its frame-pointer user stack with the
/// unwinding of the stack `copy` the kernel took at the trigger, when that reaches further
/// (code without frame pointers: the kernel's walk stops after 1–2 frames), and keeps its
/// kernel stack, named, where the recording included the kernel. Done by the snapshot
/// writers before the `.lbsnap` is written (not on the freeze path: reading the files'
/// unwind tables takes milliseconds); the snapshot keeps the addresses, not the copy.
pub fn complete_trigger_stack(snap: &mut Snapshot, copy: Option<&StackCopy>) {
    crate::snapshot::kernel_stack::keep_trigger_kernel_stack(snap);
    let (Some(pid), Some(copy)) = (snap.meta.trigger.as_ref().map(|t| t.pid), copy) else {
        return;
    };
    if pid == 0 {
        return;
    }
    let stack = StackUnwinder::for_snapshot(snap).unwind(pid, copy.regs, &copy.bytes);
    let Some(trigger) = snap.meta.trigger.as_mut() else {
        return;
    };
    log::debug!(
        "trigger stack: {} frames by frame pointers, {} unwound from {} bytes of stack",
        trigger.stack.len(),
        stack.len(),
        copy.bytes.len()
    );
    if stack.len() > trigger.stack.len() {
        trigger.stack = stack;
    }
}

#[cfg(test)]
mod tests;
