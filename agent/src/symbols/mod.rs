//! Symbols stage: addresses of a snapshot's processes → function names and source lines,
//! with blazesym.
//!
//! In: the snapshot's [`ProcessMaps`] and embedded code, and (pid, address) pairs. Out: a
//! [`Frame`] per address — the demangled function name, its module, `file:line` when the
//! file has DWARF, and the functions inlined there — or an unknown frame named
//! `[unknown] 0xADDR (module)` (the reason is kept).
//!
//! Only the mapped files are read: the file held open while the process lived
//! ([`HeldFiles`], the agent's), else the recorded path when it is the same inode, else
//! through `/proc/PID/root` while the process lives (containers), else the recorded path;
//! so this works after the process exited and on another machine with the same files.
//! Addresses become file offsets (`address - map.start + map.offset`), which blazesym turns
//! into ELF addresses with the program headers. Code the snapshot embeds because no file
//! holds it (`[vdso]`) is written to a private temporary file, removed on drop, and read
//! from there. Results are cached per (module, file offset); misses are counted.
//!
//! Code outside every mapped file (anonymous executable memory: a JIT's) is named by the
//! process's perf map captured at the freeze ([`PerfMap`], `/tmp/perf-PID.map`), when the
//! snapshot has one ([`Symbolizer::with_perf_maps`]); the frame's module is that map.
#![forbid(unsafe_code)]

mod plt;
mod separate;

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized, Symbolizer as Blaze};

use crate::capture::held_files::{HeldFile, HeldFiles};
use crate::capture::kallsyms::KernelSymbol;
use crate::capture::perf_map::PerfMap;
use crate::capture::{CodeRegion, MapEntry, ProcessMaps};
use crate::sys::is_kernel_address;

/// The name of a kernel frame without kernel symbols (no `--include-kernel`).
pub const KERNEL: &str = "[kernel]";
use crate::elf::debug_file::DebugSearch;
use separate::Separate;

/// How well the frames of one mapped file were named, for the end of a run and the
/// snapshot's metadata.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModuleSymbols {
    /// The mapped file, as recorded.
    pub module: String,
    /// Its GNU build-id, when it has one.
    pub build_id: Option<String>,
    /// Frames (stack entries, counted each time) in the file.
    pub frames: u64,
    /// Of them, frames without a name.
    pub unknown: u64,
    /// When most frames have no name and the file lacks symbols: what it lacks, where
    /// debug files were looked for, and what to install.
    pub hint: Option<String>,
}

impl ModuleSymbols {
    /// `[unknown]` frames in percent.
    #[must_use]
    pub fn unknown_percent(&self) -> u64 {
        (self.unknown * 100).checked_div(self.frames).unwrap_or(0)
    }
}

/// Frames and misses of one module, and the file read for it.
#[derive(Debug, Default)]
struct ModuleCount {
    frames: u64,
    unknown: u64,
    file: Option<PathBuf>,
    build_id: Option<String>,
}

/// A symbolized address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Demangled function name, or `[unknown] 0xADDR (module)`.
    pub name: String,
    /// The mapped file (as recorded in the maps), when the address is in one.
    pub module: Option<String>,
    /// `file:line` of the address, when DWARF has it.
    pub location: Option<String>,
    /// Why the address has no name (`None` when it has one).
    pub unknown: Option<String>,
    /// Functions inlined at the address, outermost first (each called from the previous
    /// one, the first from this function), when DWARF says so.
    pub inlined: Vec<Frame>,
    /// How far the address is past the function's first byte, when the symbol says
    /// (branch-event stacks tell a call of a function from a jump inside it with it).
    pub func_offset: Option<u64>,
    /// The function's size in bytes, when the symbol says: every address of
    /// `[addr - func_offset, + func_size)` is in the same function.
    pub func_size: Option<u64>,
}

/// `file:line` (or just the file) of a code location.
fn location(ci: &CodeInfo<'_>) -> String {
    let path = ci.to_path();
    match ci.line {
        Some(line) => format!("{}:{line}", path.display()),
        None => path.display().to_string(),
    }
}

/// Symbolizes addresses of the processes in a snapshot.
pub struct Symbolizer<'a> {
    blaze: Blaze,
    maps: HashMap<u32, &'a ProcessMaps>,
    code: &'a [CodeRegion],
    /// Embedded code written out for blazesym; removed on drop.
    temp_files: Vec<PathBuf>,
    cache: HashMap<(String, u64), Rc<Frame>>,
    /// The file blazesym reads for each recorded path (`None`: none found).
    files: HashMap<(u32, String), Option<PathBuf>>,
    /// The PLT stubs of each file read.
    plts: HashMap<PathBuf, plt::PltTable>,
    /// Extra debug directories (the snapshot's `debug_dirs`).
    debug_dirs: Vec<PathBuf>,
    /// debuginfod servers asked for a stripped file's debug file (the snapshot's).
    debuginfod: Option<crate::elf::debuginfod::Config>,
    /// The separate symbols of each file read, once its own had no name for an address.
    separate: HashMap<PathBuf, Rc<Separate>>,
    /// Frames per module.
    modules: BTreeMap<String, ModuleCount>,
    /// The kernel functions of the snapshot (`--include-kernel`), sorted by address.
    kernel: Vec<KernelSymbol>,
    /// The perf maps of the snapshot's JIT runtimes, by pid.
    perf_maps: HashMap<u32, &'a PerfMap>,
    /// Addresses that got no name.
    pub misses: u64,
    /// The held files read here, kept open while this symbolizer lives.
    holds: Vec<Arc<HeldFile>>,
}

fn unknown(addr: u64, module: Option<&str>, reason: String) -> Frame {
    let name = match module {
        Some(m) => format!("[unknown] {addr:#x} ({})", short(m)),
        None => format!("[unknown] {addr:#x}"),
    };
    Frame {
        name,
        module: module.map(str::to_owned),
        location: None,
        unknown: Some(reason),
        inlined: Vec::new(),
        func_offset: None,
        func_size: None,
    }
}

/// The file name of a module path.
fn short(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The file to read for `entry` of process `pid`: the one held open while the process
/// lived ([`HeldFiles`]: it outlives the process and its container), with the hold that
/// keeps it open while the caller reads it; else by path (no hold).
pub(crate) fn locate(pid: u32, entry: &MapEntry) -> Option<(PathBuf, Option<Arc<HeldFile>>)> {
    if let Some(held) = HeldFiles::global().find(entry) {
        return Some((held.path(), Some(held)));
    }
    if !entry.is_file() || entry.path.ends_with(" (deleted)") {
        return None;
    }
    let plain = PathBuf::from(&entry.path);
    // The path as recorded, when it is the very file that was mapped (same inode): stable,
    // unlike `/proc/PID/root/...`, which vanishes when the process exits.
    if fs::metadata(&plain).is_ok_and(|m| m.is_file() && m.ino() == entry.inode) {
        return Some((plain, None));
    }
    let in_root = PathBuf::from(format!("/proc/{pid}/root{}", entry.path));
    [in_root, plain]
        .into_iter()
        .find(|p| p.is_file())
        .map(|p| (p, None))
}

/// Where the process saw `file` (read for the map entry at `mapped`): the directory its
/// debug files are looked for beside. A held file's own path (`/proc/self/fd/N`) says
/// nothing of that: its mapped path is used, inside the process's root while it lives.
fn seen_path(pid: Option<u32>, mapped: &str, file: &Path) -> PathBuf {
    if !file.starts_with("/proc/self/fd") {
        return file.to_owned();
    }
    let mapped = mapped.strip_suffix(" (deleted)").unwrap_or(mapped);
    pid.map(|pid| PathBuf::from(format!("/proc/{pid}/root")))
        .filter(|root| root.is_dir())
        .map_or_else(
            || PathBuf::from(mapped),
            |root| root.join(mapped.trim_start_matches('/')),
        )
}

/// Where the separate debug file of `file` (read for the map entry at `mapped` of `pid`)
/// is looked for: the path the process saw it at, and the search — inside the process's
/// root while it lives, `dirs` too, then the `debuginfod` servers.
#[must_use]
pub fn debug_search(
    pid: Option<u32>,
    mapped: &str,
    file: &Path,
    dirs: Vec<PathBuf>,
    debuginfod: Option<crate::elf::debuginfod::Config>,
) -> (PathBuf, DebugSearch) {
    let seen = seen_path(pid, mapped, file);
    let root = pid
        .map(|pid| PathBuf::from(format!("/proc/{pid}/root")))
        .filter(|root| root.is_dir());
    let search = match root {
        Some(root) => DebugSearch::in_root(root, dirs),
        None => DebugSearch::for_path(&seen, dirs),
    }
    .with_debuginfod(debuginfod);
    (seen, search)
}

impl<'a> Symbolizer<'a> {
    /// Symbolizes in the processes of `processes`, with the embedded `code` of the snapshot
    /// and separate debug files also looked for in `debug_dirs`.
    pub fn new(
        processes: &'a [ProcessMaps],
        code: &'a [CodeRegion],
        debug_dirs: &[PathBuf],
    ) -> Self {
        Self {
            blaze: Blaze::new(),
            maps: processes.iter().map(|p| (p.pid, p)).collect(),
            code,
            temp_files: Vec::new(),
            cache: HashMap::new(),
            files: HashMap::new(),
            plts: HashMap::new(),
            debug_dirs: debug_dirs.to_vec(),
            debuginfod: None,
            separate: HashMap::new(),
            modules: BTreeMap::new(),
            kernel: Vec::new(),
            perf_maps: HashMap::new(),
            misses: 0,
            holds: Vec::new(),
        }
    }

    /// The symbolizer asking `servers` (a snapshot's `debuginfod`) for the debug files of
    /// stripped binaries no directory has.
    #[must_use]
    pub fn with_debuginfod(mut self, servers: &crate::elf::debuginfod::Servers) -> Self {
        self.debuginfod = servers.config();
        self
    }

    /// Names kernel addresses from `symbols` (the snapshot's `kernel_symbols`); without
    /// them every kernel address is `[kernel]`.
    #[must_use]
    pub fn with_kernel_symbols(mut self, symbols: &[KernelSymbol]) -> Self {
        self.kernel = symbols.to_vec();
        self.kernel.sort_by_key(|s| s.address);
        self
    }

    /// Names the JIT code of the processes of `perf_maps` (the snapshot's) from them.
    #[must_use]
    pub fn with_perf_maps(mut self, perf_maps: &'a [PerfMap]) -> Self {
        self.perf_maps = perf_maps.iter().map(|m| (m.pid, m)).collect();
        self
    }

    /// The frame of `addr` of process `pid` from its perf map, when one names it.
    fn jit_frame(&self, pid: u32, addr: u64) -> Option<Frame> {
        let map = self.perf_maps.get(&pid)?;
        let entry = map.lookup(addr)?;
        Some(Frame {
            name: entry.name.clone(),
            module: Some(map.path.clone()),
            location: None,
            unknown: None,
            inlined: Vec::new(),
            func_offset: Some(addr - entry.start),
            func_size: Some(entry.size),
        })
    }

    /// The frame of kernel address `addr`: its function, else `[kernel]`.
    fn kernel_frame(&self, addr: u64) -> Frame {
        let symbol = crate::capture::kallsyms::lookup(&self.kernel, addr);
        Frame {
            name: symbol.map_or_else(|| KERNEL.to_owned(), |s| s.name.clone()),
            module: Some(
                symbol
                    .and_then(|s| s.module.clone())
                    .unwrap_or_else(|| "[kernel.kallsyms]".to_owned()),
            ),
            location: None,
            unknown: None,
            inlined: Vec::new(),
            func_offset: symbol.map(|s| addr - s.address),
            func_size: None,
        }
    }

    /// Whether `addr` is in an executable mapping of process `pid` (a file's code,
    /// `[vdso]`, JIT code): where a return address can point. Heap, stack and data
    /// addresses are what a frame-pointer walk reads through a frame without one. An
    /// address the process's perf map names is JIT code even where the maps no longer say
    /// so (a runtime exiting right after its trigger unmaps its code before the freeze
    /// reads them). `None` when the snapshot has no maps of the process (it exited before
    /// they were read): nothing can be judged.
    #[must_use]
    pub fn is_code(&self, pid: u32, addr: u64) -> Option<bool> {
        if is_kernel_address(addr)
            || self
                .perf_maps
                .get(&pid)
                .is_some_and(|m| m.lookup(addr).is_some())
        {
            return Some(true);
        }
        let maps = self.maps.get(&pid).filter(|m| !m.maps.is_empty())?;
        Some(
            maps.maps
                .iter()
                .any(|m| m.executable() && (m.start..m.end).contains(&addr)),
        )
    }

    /// The frame of `addr` in process `pid`.
    pub fn frame(&mut self, pid: u32, addr: u64) -> Rc<Frame> {
        let frame = self.lookup(pid, addr);
        if frame.unknown.is_some() {
            self.misses += 1;
        }
        if let Some(module) = frame.module.as_ref().filter(|m| !m.is_empty()) {
            let count = self.modules.entry(module.clone()).or_default();
            count.frames += 1;
            count.unknown += u64::from(frame.unknown.is_some());
            if count.file.is_none()
                && let Some(Some(file)) = self.files.get(&(pid, module.clone()))
            {
                count.file = Some(file.clone());
                // From any of the file's maps, else from the file read for the names:
                // maps rebuilt from the kernel's MMAP records can lack it (CI once
                // reported a stripped binary's hint with its build-id, and the build-id
                // itself as null).
                count.build_id = self
                    .maps
                    .get(&pid)
                    .and_then(|maps| {
                        maps.maps
                            .iter()
                            .filter(|m| &m.path == module)
                            .find_map(|m| m.build_id.clone())
                    })
                    .or_else(|| crate::elf::build_id::build_id_of(file));
            }
        }
        frame
    }

    /// How well each module's frames were named, by module; the modules where most frames
    /// have no name and the file lacks symbols carry the hint to install them.
    pub fn module_report(&mut self) -> Vec<ModuleSymbols> {
        let mut report = Vec::new();
        let modules = std::mem::take(&mut self.modules);
        for (module, count) in &modules {
            let hint = (count.unknown * 2 > count.frames)
                .then(|| match &count.file {
                    Some(file) => {
                        let separate = self.separate_of(file, module, None);
                        let hint = separate.files.missing_hint();
                        (!hint.is_empty()).then_some(hint)
                    }
                    // `[vdso]`, anonymous JIT code: no file a debug package could fix.
                    None => module
                        .starts_with('/')
                        .then(|| "file not found (gone, or in a container that exited)".to_owned()),
                })
                .flatten();
            report.push(ModuleSymbols {
                module: module.clone(),
                build_id: count.build_id.clone(),
                frames: count.frames,
                unknown: count.unknown,
                hint,
            });
        }
        self.modules = modules;
        report
    }

    /// The separate symbols of `file` (read once; mapped at `mapped`), searched in `pid`'s
    /// root while it lives.
    fn separate_of(&mut self, file: &Path, mapped: &str, pid: Option<u32>) -> Rc<Separate> {
        if let Some(known) = self.separate.get(file) {
            return Rc::clone(known);
        }
        let (seen, search) = debug_search(
            pid,
            mapped,
            file,
            self.debug_dirs.clone(),
            self.debuginfod.clone(),
        );
        let separate = Rc::new(Separate::read(file, &seen, &search));
        self.separate.insert(file.to_owned(), Rc::clone(&separate));
        separate
    }

    /// The frame of `offset` of `file` from its separate symbols: the debug file (names,
    /// lines, inlines, through blazesym), else `MiniDebugInfo` (names).
    fn separate_frame(
        &mut self,
        pid: u32,
        file: &Path,
        entry: &MapEntry,
        addr: u64,
        offset: u64,
    ) -> Option<Frame> {
        let separate = self.separate_of(file, &entry.path, Some(pid));
        let address = separate.virtual_address(offset)?;
        if let Some(debug) = separate.debug_file() {
            let frame = self.symbolize_input(debug, entry, addr, Input::VirtOffset(&[address]));
            if frame.unknown.is_none() {
                return Some(frame);
            }
        }
        let (function, func_offset) = separate.mini_function(address)?;
        Some(Frame {
            name: crate::triggers::names::demangled(&function.raw)
                .unwrap_or_else(|| function.raw.clone()),
            module: Some(entry.path.clone()),
            location: None,
            unknown: None,
            inlined: Vec::new(),
            func_offset: Some(func_offset),
            func_size: Some(function.size),
        })
    }

    fn lookup(&mut self, pid: u32, addr: u64) -> Rc<Frame> {
        if is_kernel_address(addr) {
            return Rc::new(self.kernel_frame(addr));
        }
        let Some(maps) = self.maps.get(&pid).copied() else {
            return Rc::new(unknown(addr, None, format!("no maps of process {pid}")));
        };
        let entry = maps.maps.iter().find(|m| (m.start..m.end).contains(&addr));
        // JIT code: in anonymous memory (or mapped after the maps were read).
        if entry.is_none_or(|e| !e.is_file())
            && let Some(frame) = self.jit_frame(pid, addr)
        {
            return Rc::new(frame);
        }
        let Some(entry) = entry else {
            return Rc::new(unknown(addr, None, "not in a mapping".to_owned()));
        };
        let offset = addr - entry.start + entry.offset;
        let key = (entry.path.clone(), offset);
        if let Some(frame) = self.cache.get(&key) {
            return Rc::clone(frame);
        }
        let file = if let Some(file) = self.files.get(&(pid, entry.path.clone())) {
            file.clone()
        } else {
            let file = locate(pid, entry)
                .map(|(file, hold)| {
                    self.holds.extend(hold);
                    file
                })
                .or_else(|| self.embedded(pid, entry));
            self.files.insert((pid, entry.path.clone()), file.clone());
            file
        };
        let frame = Rc::new(match file {
            Some(file) => self.plt_stub(&file, entry, offset).unwrap_or_else(|| {
                let own = self.symbolize_input(&file, entry, addr, Input::FileOffset(&[offset]));
                if own.unknown.is_none() {
                    return own;
                }
                self.separate_frame(pid, &file, entry, addr, offset)
                    .unwrap_or(own)
            }),
            None => unknown(addr, Some(&entry.path), "file not found".to_owned()),
        });
        if let Some(reason) = &frame.unknown {
            log::debug!("{addr:#x} ({} +{offset:#x}): {reason}", entry.path);
        }
        self.cache.insert(key, Rc::clone(&frame));
        frame
    }

    /// A temporary file holding the snapshot's copy of `entry` (`[vdso]`), when it has one.
    fn embedded(&mut self, pid: u32, entry: &MapEntry) -> Option<PathBuf> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let region = self
            .code
            .iter()
            .find(|c| c.pid == pid && c.start == entry.start && c.path == entry.path)?;
        if !region.data.starts_with(b"\x7fELF") || entry.offset != 0 {
            return None;
        }
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("lookback-code-{}-{seq}.elf", std::process::id()));
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(&region.data));
        if let Err(e) = written {
            log::debug!("writing {}: {e}", path.display());
            let _ = fs::remove_file(&path);
            return None;
        }
        self.temp_files.push(path.clone());
        Some(path)
    }

    /// The frame of a PLT stub at `offset` of `file` (`name@plt`), which no symbol covers.
    fn plt_stub(&mut self, file: &Path, entry: &MapEntry, offset: u64) -> Option<Frame> {
        let table = self
            .plts
            .entry(file.to_owned())
            .or_insert_with(|| plt::PltTable::read(file));
        let (name, func_offset, size) = table.lookup(offset)?;
        Some(Frame {
            name: name.to_owned(),
            module: Some(entry.path.clone()),
            location: None,
            unknown: None,
            inlined: Vec::new(),
            func_offset: Some(func_offset),
            func_size: Some(size),
        })
    }

    /// The frame of `input` (one address) in `file`, with blazesym.
    fn symbolize_input(
        &self,
        file: &Path,
        entry: &MapEntry,
        addr: u64,
        input: Input<&[u64]>,
    ) -> Frame {
        let src = Source::Elf(Elf::new(file));
        let result = self.blaze.symbolize(&src, input).map(|mut v| v.pop());
        match result {
            Ok(Some(Symbolized::Sym(sym))) => {
                let module = Some(entry.path.clone());
                let inlined = sym
                    .inlined
                    .iter()
                    .map(|f| Frame {
                        name: f.name.to_string(),
                        module: module.clone(),
                        location: f.code_info.as_ref().map(location),
                        unknown: None,
                        inlined: Vec::new(),
                        func_offset: None,
                        func_size: None,
                    })
                    .collect();
                Frame {
                    name: sym.name.into_owned(),
                    module,
                    location: sym.code_info.as_deref().map(location),
                    unknown: None,
                    inlined,
                    func_offset: Some(sym.offset as u64),
                    func_size: sym.size.map(|size| size as u64),
                }
            }
            Ok(Some(Symbolized::Unknown(reason))) => {
                unknown(addr, Some(&entry.path), reason.to_string())
            }
            Ok(None) => unknown(addr, Some(&entry.path), "no result".to_owned()),
            Err(e) => unknown(addr, Some(&entry.path), format!("{e:#}")),
        }
    }
}

impl Drop for Symbolizer<'_> {
    fn drop(&mut self) {
        for path in &self.temp_files {
            let _ = fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::{Symbolizer, seen_path, short};
    use crate::capture::{MapEntry, ProcessMaps};

    /// A held file (`/proc/self/fd/N`) has its debug files looked for where the process
    /// saw it: in its root while it lives, else at the mapped path.
    #[test]
    fn debug_files_of_a_held_file_are_looked_for_where_it_was_mapped() {
        let held = Path::new("/proc/self/fd/7");
        let me = std::process::id();
        assert_eq!(
            seen_path(Some(me), "/usr/lib/libx.so (deleted)", held),
            PathBuf::from(format!("/proc/{me}/root/usr/lib/libx.so"))
        );
        assert_eq!(
            seen_path(None, "/usr/lib/libx.so", held),
            PathBuf::from("/usr/lib/libx.so")
        );
        let plain = Path::new("/proc/42/root/usr/bin/app");
        assert_eq!(seen_path(Some(me), "/usr/bin/app", plain), plain);
    }

    /// Maps of this test process, read from /proc/self/maps.
    fn own_maps() -> ProcessMaps {
        let text = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let maps = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let (range, perms, offset, dev, inode) =
                    (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
                let (start, end) = range.split_once('-')?;
                Some(MapEntry {
                    start: u64::from_str_radix(start, 16).ok()?,
                    end: u64::from_str_radix(end, 16).ok()?,
                    perms: perms.to_owned(),
                    offset: u64::from_str_radix(offset, 16).ok()?,
                    dev: dev.to_owned(),
                    inode: inode.parse().ok()?,
                    path: it.collect::<Vec<_>>().join(" "),
                    build_id: None,
                })
            })
            .collect();
        ProcessMaps {
            pid: std::process::id(),
            comm: String::new(),
            exe: None,
            read_at_ns: 0,
            at_freeze: true,
            maps,
            origin: crate::capture::origin::ProcessOrigin::default(),
        }
    }

    #[inline(never)]
    fn lookback_symbols_test_marker() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn a_function_of_this_binary_resolves_by_file_offset() {
        let maps = [own_maps()];
        let mut s = Symbolizer::new(&maps, &[], &[]);
        let addr = lookback_symbols_test_marker as *const () as u64;
        assert_eq!(lookback_symbols_test_marker(), 42);
        let frame = s.frame(std::process::id(), addr);
        assert!(
            frame.name.contains("lookback_symbols_test_marker"),
            "{frame:?}"
        );
        assert!(frame.unknown.is_none());
        // The second lookup is cached: the very same frame.
        let again = s.frame(std::process::id(), addr);
        assert!(std::rc::Rc::ptr_eq(&frame, &again));
        assert_eq!(s.misses, 0);
    }

    #[test]
    fn a_plt_stub_of_this_binary_is_named_after_its_callee() {
        let maps = [own_maps()];
        let exe = std::fs::read_link("/proc/self/exe").expect("exe");
        let exe = exe.to_string_lossy();
        let table = super::plt::PltTable::read(Path::new(&*exe));
        // An executable mapping of this binary and a stub in it.
        let Some((entry, stub)) = maps[0]
            .maps
            .iter()
            .filter(|m| m.path == exe && m.perms.contains('x'))
            .find_map(|m| {
                (m.offset..m.offset + (m.end - m.start))
                    .step_by(4)
                    .find(|off| {
                        table
                            .lookup(*off)
                            .is_some_and(|(n, _, _)| n.ends_with("@plt"))
                    })
                    .map(|off| (m, off))
            })
        else {
            eprintln!("skipped: this test binary has no PLT");
            return;
        };
        let mut s = Symbolizer::new(&maps, &[], &[]);
        let frame = s.frame(std::process::id(), entry.start + stub - entry.offset + 2);
        assert!(frame.name.ends_with("@plt"), "{frame:?}");
        assert_eq!(frame.func_offset, Some(2));
        assert!(frame.unknown.is_none() && frame.location.is_none());
    }

    /// An address in anonymous executable memory is named by the process's perf map; a
    /// perf map line over a mapped file's code does not hide the file's own symbols.
    #[test]
    fn jit_code_is_named_by_the_perf_map_and_mapped_files_by_their_symbols() {
        use crate::capture::perf_map::{PerfMap, PerfMapEntry};
        let me = std::process::id();
        let mut maps = own_maps();
        let jit = 0x1000_0000_0000;
        maps.maps.push(MapEntry::anonymous_code(jit, jit + 0x1000));
        let marker = lookback_symbols_test_marker as *const () as u64;
        let entry = |start, name: &str| PerfMapEntry {
            start,
            size: 0x40,
            name: name.to_owned(),
        };
        let perf_maps = [PerfMap {
            pid: me,
            path: format!("/tmp/perf-{me}.map"),
            malformed: 0,
            superseded: 0,
            dropped: 0,
            truncated: false,
            entries: vec![
                entry(marker, "not this"),
                entry(jit + 0x100, "JS:~handleRequest /app.js:4:23"),
            ],
        }];
        let maps = [maps];
        let mut s = Symbolizer::new(&maps, &[], &[]).with_perf_maps(&perf_maps);
        let frame = s.frame(me, jit + 0x110);
        assert_eq!(frame.name, "JS:~handleRequest /app.js:4:23");
        assert_eq!(
            (frame.func_offset, frame.func_size),
            (Some(0x10), Some(0x40))
        );
        assert_eq!(frame.module.as_deref(), Some(perf_maps[0].path.as_str()));
        assert!(frame.unknown.is_none());
        assert!(
            s.frame(me, jit + 0x200).unknown.is_some(),
            "no line names it"
        );
        assert_eq!(lookback_symbols_test_marker(), 42);
        assert!(
            s.frame(me, marker)
                .name
                .contains("lookback_symbols_test_marker")
        );
    }

    #[test]
    fn unmapped_and_unknown_processes_are_unknown_frames() {
        let maps = [own_maps()];
        let mut s = Symbolizer::new(&maps, &[], &[]);
        let f = s.frame(std::process::id(), 8);
        assert_eq!(f.name, "[unknown] 0x8");
        let f = s.frame(u32::MAX, 0x1000);
        assert!(f.unknown.as_deref().is_some_and(|r| r.contains("no maps")));
        assert_eq!(s.misses, 2);
        assert_eq!(short("/usr/lib/libc.so.6"), "libc.so.6");
    }
}

#[cfg(test)]
mod vdso_tests {
    use super::Symbolizer;
    use crate::capture::procmaps;

    #[test]
    fn the_vdso_resolves_from_the_embedded_copy_and_the_temp_file_goes_away() {
        let pid = std::process::id();
        let Ok(maps) = procmaps::read_process(pid, 0) else {
            return;
        };
        let code = procmaps::read_code(&maps, crate::capture::EmbedCode::Auto);
        let Some(vdso) = code.iter().find(|c| c.path == "[vdso]") else {
            return;
        };
        let maps = [maps];
        let mut s = Symbolizer::new(&maps, &code, &[]);
        // Somewhere in the vDSO's text: any address that resolves to a named function.
        let named = (0..vdso.data.len() as u64)
            .step_by(16)
            .map(|off| s.frame(pid, vdso.start + off))
            .find(|f| f.unknown.is_none());
        let temp = s.temp_files.clone();
        drop(s);
        assert!(named.is_some(), "no vDSO address resolved");
        assert!(temp.iter().all(|p| !p.exists()), "temp files removed");
    }
}
