//! Where to put a function probe: symbol → file offset in an ELF binary or shared library,
//! paths of processes in other mount namespaces (through `/proc/PID/root`), and which kind
//! of uprobe the kernel will use there.
use std::{
    fmt, fs, io,
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSymbol as _};

use super::{
    exits::{CodePiece, ExitKind, WalkError, function_exits},
    names::{
        FunctionSymbol, MAX_FUNCTIONS, NameError, describe, did_you_mean, list_candidates,
        select_functions,
    },
};
pub use crate::elf::{index::symbol_address, segments::file_offset_of};
use crate::{
    elf::{debug_file::DebugSearch, debuginfod::Servers, index::SymbolIndex},
    rules::FunctionTrigger,
};

/// What a function rule asks to be probed: a name (or glob pattern), whether every
/// function it selects is meant, and where else debug files may be.
#[derive(Debug, Clone, Copy)]
pub struct Lookup<'a> {
    pub name: &'a str,
    /// `all: true`: every function the name selects.
    pub all: bool,
    /// Extra debug directories (host paths).
    pub debug_dirs: &'a [PathBuf],
    /// debuginfod servers for a stripped binary's debug file.
    pub debuginfod: &'a Servers,
}

/// The servers of a lookup nobody chose them for: `DEBUGINFOD_URLS`.
static FROM_ENV: Servers = Servers::FromEnv;

impl<'a> Lookup<'a> {
    /// The lookup of one function by its name.
    #[must_use]
    pub fn name(name: &'a str) -> Self {
        Self {
            name,
            all: false,
            debug_dirs: &[],
            debuginfod: &FROM_ENV,
        }
    }

    /// The lookup with its rule's debuginfod servers.
    #[must_use]
    pub fn servers(self, debuginfod: &'a Servers) -> Self {
        Self { debuginfod, ..self }
    }

    /// The lookup a function trigger asks for.
    #[must_use]
    pub fn of(trigger: &'a FunctionTrigger) -> Self {
        Self {
            name: &trigger.symbol,
            all: trigger.all,
            debug_dirs: &trigger.debug_dirs,
            debuginfod: &FROM_ENV,
        }
    }
}

/// Failure to place a function probe.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not an ELF file lookback can read", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: object::Error,
    },
    #[error(
        "symbol {symbol} not found in {}{}{hint}", path.display(),
        if symbols.is_empty() { String::new() } else { format!(" ({symbols})") }
    )]
    NoSymbol {
        symbol: String,
        path: PathBuf,
        /// What the binary lacks and where debug files were looked for
        /// ([`crate::elf::debug_file::SymbolFiles::missing_hint`]), or empty.
        symbols: String,
        /// `; did you mean ...?`, or empty.
        hint: String,
    },
    #[error(
        "{symbol} selects {count} functions in {}, more than the {MAX_FUNCTIONS} one rule \
         probes: {list}; narrow the pattern or name the functions in several rules",
        path.display()
    )]
    TooMany {
        symbol: String,
        path: PathBuf,
        count: usize,
        list: String,
    },
    #[error(
        "{symbol} names {count} functions in {}: {list}; give the one meant by its full \
         name (with parameters) or its raw name, or say `all: true` to probe them all",
        path.display()
    )]
    Ambiguous {
        symbol: String,
        path: PathBuf,
        count: usize,
        list: String,
    },
    #[error(
        "{symbol} is defined in {count} libraries: {list}; give the one meant as `binary`, \
         or say `all: true` to probe them all"
    )]
    InSeveral {
        symbol: String,
        count: usize,
        list: String,
    },
    #[error("symbol {symbol} in {} is at {address:#x}, outside every loadable segment", path.display())]
    NotMapped {
        symbol: String,
        path: PathBuf,
        address: u64,
    },
    #[error("process {pid} not found")]
    NoProcess { pid: u32 },
}

impl ResolveError {
    /// The short reason, for the `lookback_rule_probe_errors` metric.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoSymbol { .. } | Self::NotMapped { .. } | Self::NoProcess { .. } => {
                "symbol_not_found"
            }
            Self::Ambiguous { .. } | Self::InSeveral { .. } => "ambiguous_symbol",
            Self::TooMany { .. } => "too_many_functions",
            Self::Read { .. } | Self::Parse { .. } => "binary_unreadable",
        }
    }
}

/// How the kernel will run a uprobe at a probe point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    /// The probed instruction is a 5-byte NOP: kernels ≥ 6.18 (x86-64) rewrite it into a
    /// call to a trampoline, ~0.35 µs per hit.
    Nop5,
    /// Anything else: int3 trap and single-step/emulation, ~7 µs per hit.
    Trap,
}

impl fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nop5 => "nop5 (optimized)",
            Self::Trap => "trap",
        })
    }
}

/// A resolved probe point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePoint {
    /// The file to attach to (may go through `/proc/PID/root`).
    pub path: PathBuf,
    /// The function's raw (mangled) symbol.
    pub symbol: String,
    /// The function's name as people read it (demangled).
    pub display: String,
    /// Its symbol is global (other objects can bind to it).
    pub global: bool,
    /// Offset of the probed instruction in the file.
    pub file_offset: u64,
    /// The symbol's virtual address in the ELF file.
    pub address: u64,
    /// The symbol's size in bytes (0: unknown), which `detect: running` checks a frame
    /// against.
    pub size: u64,
    pub kind: ProbeKind,
    /// The file is a Go binary (`.go.buildinfo` or `runtime.buildVersion`): latency is
    /// tracked per goroutine, and uretprobes are refused (Go copies goroutine stacks and
    /// checks return addresses).
    pub go: bool,
    /// The instructions that leave the function, where latency rules put their exit
    /// probes; or why they cannot be found safely.
    pub exits: Result<Vec<ExitProbe>, WalkError>,
}

/// An exit probe point of a function (see [`super::exits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitProbe {
    pub file_offset: u64,
    /// ELF virtual address of the instruction.
    pub address: u64,
    pub kind: ExitKind,
}

/// `nopl 0x0(%rax,%rax,1)`: what `-mfentry -mnop-mcount` and `patchable_function_entry`
/// put at function entry.
const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Finds the functions `lookup` names in the ELF file at `path` (with its debug files)
/// and the probe point of each one's entry. When a function starts with
/// `endbr64; nopl 0x0(...)`, the probe goes on the NOP (same entry semantics, but the
/// kernel can optimize it).
///
/// # Errors
/// [`ResolveError`] when the file cannot be read, or the name selects no function, several
/// (without `all`), or too many.
pub fn resolve_symbol(path: &Path, lookup: &Lookup<'_>) -> Result<Vec<ProbePoint>, ResolveError> {
    let data = fs::read(path).map_err(|source| ResolveError::Read {
        path: path.to_owned(),
        source,
    })?;
    let file = object::File::parse(&*data).map_err(|source| ResolveError::Parse {
        path: path.to_owned(),
        source,
    })?;
    let search = DebugSearch::for_path(path, lookup.debug_dirs.to_vec())
        .with_debuginfod(lookup.debuginfod.config());
    let index = SymbolIndex::read(path, &file, &search);
    let symbol = lookup.name;
    let functions =
        select_functions(&index.functions, symbol, lookup.all).map_err(|e| match e {
            NameError::NotFound { nearest } => ResolveError::NoSymbol {
                symbol: symbol.to_owned(),
                path: path.to_owned(),
                symbols: index.files.missing_hint(),
                hint: did_you_mean(&nearest),
            },
            NameError::Ambiguous { candidates } => ResolveError::Ambiguous {
                symbol: symbol.to_owned(),
                path: path.to_owned(),
                count: candidates.len(),
                list: list_candidates(&candidates),
            },
            NameError::TooMany { candidates } => ResolveError::TooMany {
                symbol: symbol.to_owned(),
                path: path.to_owned(),
                count: candidates.len(),
                list: list_candidates(&candidates),
            },
        })?;
    let go = is_go_binary(&file);
    functions
        .iter()
        .map(|function| probe_point(path, &file, &data, &index, function, go))
        .collect()
}

/// The probe point of `function`'s entry, and its exits.
fn probe_point(
    path: &Path,
    file: &object::File<'_>,
    data: &[u8],
    index: &SymbolIndex,
    function: &FunctionSymbol,
    go: bool,
) -> Result<ProbePoint, ResolveError> {
    let (address, size) = (function.address, function.size);
    let symbol = function.raw.as_str();
    let file_offset = file_offset_of(file, address).ok_or_else(|| ResolveError::NotMapped {
        symbol: symbol.to_owned(),
        path: path.to_owned(),
        address,
    })?;
    let code = usize::try_from(file_offset)
        .ok()
        .and_then(|o| data.get(o..o + 9))
        .unwrap_or(&[]);
    let (file_offset, kind) = if code.starts_with(&NOP5) {
        (file_offset, ProbeKind::Nop5)
    } else if code.starts_with(&ENDBR64) && code[4..].starts_with(&NOP5) {
        (file_offset + 4, ProbeKind::Nop5)
    } else {
        (file_offset, ProbeKind::Trap)
    };
    Ok(ProbePoint {
        path: path.to_owned(),
        symbol: symbol.to_owned(),
        display: function.display.clone(),
        global: function.global,
        file_offset,
        address,
        size,
        kind,
        go,
        exits: exit_probes(file, data, index, symbol, address, size),
    })
}

/// Whether `file` was built by the Go toolchain.
pub fn is_go_binary(file: &object::File<'_>) -> bool {
    file.section_by_name(".go.buildinfo").is_some()
        || file
            .symbols()
            .any(|s| s.name() == Ok("runtime.buildVersion"))
}

/// The exits of the function `symbol` at `address` with `size` bytes, and of its
/// compiler-split cold parts (`symbol.cold`, `symbol.cold.N`: GCC moves unlikely paths,
/// exception cleanups among them, there, and jumps between the parts are internal).
fn exit_probes(
    file: &object::File<'_>,
    data: &[u8],
    index: &SymbolIndex,
    symbol: &str,
    address: u64,
    size: u64,
) -> Result<Vec<ExitProbe>, WalkError> {
    if size == 0 {
        return Err(WalkError::NoSize);
    }
    let mut extents = vec![(address, size)];
    extents.extend(index.cold_parts(symbol));
    let mut pieces = Vec::new();
    for &(address, size) in &extents {
        let bytes = file_offset_of(file, address)
            .and_then(|o| usize::try_from(o).ok())
            .zip(usize::try_from(size).ok())
            .and_then(|(o, n)| data.get(o..o.checked_add(n)?))
            .ok_or(WalkError::NoCode { address, size })?;
        pieces.push(CodePiece { address, bytes });
    }
    function_exits(&pieces)?
        .into_iter()
        .map(|site| {
            let file_offset = file_offset_of(file, site.address).ok_or(WalkError::NoCode {
                address: site.address,
                size: 1,
            })?;
            Ok(ExitProbe {
                file_offset,
                address: site.address,
                kind: site.kind,
            })
        })
        .collect()
}

/// The path under which this process can open `path` as seen by process `pid` (which may
/// live in another mount namespace, e.g. a container).
pub fn in_process_root(pid: u32, path: &Path) -> PathBuf {
    let relative = path.strip_prefix("/").unwrap_or(path);
    PathBuf::from(format!("/proc/{pid}/root")).join(relative)
}

/// The executable of process `pid`, as a path this process can open.
pub fn process_exe(pid: u32) -> Result<PathBuf, ResolveError> {
    let link =
        fs::read_link(format!("/proc/{pid}/exe")).map_err(|_| ResolveError::NoProcess { pid })?;
    Ok(in_process_root(pid, &link))
}

/// The files mapped executable by process `pid` (its exe and shared libraries), as paths
/// this process can open, in map order without duplicates.
pub fn mapped_objects(pid: u32) -> Result<Vec<PathBuf>, ResolveError> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|_| ResolveError::NoProcess { pid })?;
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let perms = fields.nth(1).unwrap_or("");
        let Some(path) = fields.nth(3) else { continue };
        if perms.contains('x') && path.starts_with('/') {
            let path = in_process_root(pid, Path::new(path));
            if !out.contains(&path) {
                out.push(path);
            }
        }
    }
    Ok(out)
}

/// Resolves `lookup` for process `pid`: in `binary` when given (relative to the process's
/// root), else in its executable, then in every shared object it has mapped. Debug files
/// are looked up inside the process's mount namespace.
///
/// # Errors
/// See [`resolve_symbol`]; [`ResolveError::NoProcess`] when `pid` is gone.
pub fn resolve_for_process(
    pid: u32,
    binary: Option<&Path>,
    lookup: &Lookup<'_>,
) -> Result<Vec<ProbePoint>, ResolveError> {
    if let Some(binary) = binary {
        return resolve_symbol(&in_process_root(pid, binary), lookup);
    }
    let exe = process_exe(pid)?;
    let not_in_exe = match resolve_symbol(&exe, lookup) {
        Err(e @ ResolveError::NoSymbol { .. }) => e,
        other => return other,
    };
    let libraries = mapped_objects(pid)?;
    resolve_in_libraries(libraries.iter().filter(|o| **o != exe), lookup, not_in_exe)
}

/// `lookup` in `libraries`: the one library that defines it; with `all`, every one that
/// does (a name defined in several libraries names several functions, and only the
/// dynamic linker's order decides which one a call reaches). `not_found` (the
/// executable's error, with its hints) when none does.
///
/// # Errors
/// `not_found`; [`ResolveError::InSeveral`] when several libraries define the name and
/// `all` is not set; a library's [`ResolveError::Ambiguous`] or [`ResolveError::TooMany`].
pub fn resolve_in_libraries<'a>(
    libraries: impl IntoIterator<Item = &'a PathBuf>,
    lookup: &Lookup<'_>,
    not_found: ResolveError,
) -> Result<Vec<ProbePoint>, ResolveError> {
    let mut found: Vec<Vec<ProbePoint>> = Vec::new();
    for object in libraries {
        match resolve_symbol(object, lookup) {
            Ok(points) => found.push(points),
            Err(e @ (ResolveError::Ambiguous { .. } | ResolveError::TooMany { .. })) => {
                return Err(e);
            }
            Err(_) => {}
        }
    }
    if found.len() > 1 && !lookup.all {
        // Calls of a name bind to exported definitions only: a library's local function
        // of the same name (ld.so's own `getpid`) is not a candidate when one library
        // exports it.
        let exported: Vec<Vec<ProbePoint>> = found
            .iter()
            .filter(|points| points.iter().all(|p| p.global))
            .cloned()
            .collect();
        if exported.len() == 1 {
            found = exported;
        }
    }
    if found.len() > 1 && !lookup.all {
        let list: Vec<String> = found
            .iter()
            .flatten()
            .map(|p| {
                let name = describe(&FunctionSymbol {
                    raw: p.symbol.clone(),
                    display: p.display.clone(),
                    address: p.address,
                    size: 0,
                    global: p.global,
                });
                format!("{name} in {}", p.path.display())
            })
            .collect();
        return Err(ResolveError::InSeveral {
            symbol: lookup.name.to_owned(),
            count: found.len(),
            list: list.join(", "),
        });
    }
    let points: Vec<ProbePoint> = found.into_iter().flatten().collect();
    if points.is_empty() {
        return Err(not_found);
    }
    if points.len() > MAX_FUNCTIONS {
        return Err(ResolveError::TooMany {
            symbol: lookup.name.to_owned(),
            path: PathBuf::from("the libraries"),
            count: points.len(),
            list: points
                .iter()
                .take(super::names::LISTED_CANDIDATES)
                .map(|p| format!("`{}` in {}", p.display, p.path.display()))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_libc_function_in_this_process() {
        let me = std::process::id();
        let mut points =
            resolve_for_process(me, None, &Lookup::name("getpid")).expect("getpid in libc");
        assert_eq!(points.len(), 1);
        let point = points.remove(0);
        assert!(point.path.to_string_lossy().contains("libc"), "{point:?}");
        assert!(point.file_offset > 0);
        assert!(!point.go);
        let exits = point.exits.expect("getpid's exits are walkable");
        assert!(exits.iter().any(|e| e.kind == ExitKind::Ret), "{exits:?}");
        assert!(exits.iter().all(|e| e.file_offset + 4 >= point.file_offset));
    }

    #[test]
    fn unknown_symbol_is_a_clear_error() {
        let me = std::process::id();
        let err = resolve_for_process(me, None, &Lookup::name("no_such_symbol_here"))
            .expect_err("missing");
        assert!(err.to_string().contains("no_such_symbol_here"), "{err}");
    }

    #[test]
    fn missing_process_and_file() {
        assert!(matches!(
            process_exe(u32::MAX),
            Err(ResolveError::NoProcess { .. })
        ));
        let err = resolve_symbol(Path::new("/nonexistent/bin"), &Lookup::name("main"))
            .expect_err("no file");
        assert!(matches!(err, ResolveError::Read { .. }));
    }

    #[test]
    fn paths_go_through_the_process_root() {
        assert_eq!(
            in_process_root(42, Path::new("/usr/bin/server")),
            PathBuf::from("/proc/42/root/usr/bin/server")
        );
    }
}
