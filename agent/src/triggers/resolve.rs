//! Where to put a function probe: symbol → file offset in an ELF binary or shared library,
//! paths of processes in other mount namespaces (through `/proc/PID/root`), and which kind
//! of uprobe the kernel will use there.
use std::{
    fmt, fs, io,
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

use super::{
    exits::{CodePiece, ExitKind, WalkError, function_exits},
    names::{NameError, did_you_mean, find_function, list_candidates},
};

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
        if *stripped { ": the binary is stripped (only a compressed .gnu_debugdata symbol table, \
        which lookback does not read yet); use an unstripped build or give the library with \
        the symbol as `binary`" } else { "" }
    )]
    NoSymbol {
        symbol: String,
        path: PathBuf,
        stripped: bool,
        /// `; did you mean ...?`, or empty.
        hint: String,
    },
    #[error(
        "{symbol} names {count} functions in {}: {list}; give the one meant by its full \
         name (with parameters) or its raw name", path.display()
    )]
    Ambiguous {
        symbol: String,
        path: PathBuf,
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
    /// The symbol as looked up.
    pub symbol: String,
    /// Offset of the probed instruction in the file.
    pub file_offset: u64,
    /// The symbol's virtual address in the ELF file.
    pub address: u64,
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

/// Finds `symbol` in the ELF file at `path` and the probe point for its entry. When the
/// function starts with `endbr64; nopl 0x0(...)`, the probe goes on the NOP (same entry
/// semantics, but the kernel can optimize it).
pub fn resolve_symbol(path: &Path, symbol: &str) -> Result<ProbePoint, ResolveError> {
    let data = fs::read(path).map_err(|source| ResolveError::Read {
        path: path.to_owned(),
        source,
    })?;
    let file = object::File::parse(&*data).map_err(|source| ResolveError::Parse {
        path: path.to_owned(),
        source,
    })?;
    let function = match find_function(&file, symbol) {
        Ok(function) => function,
        Err(NameError::NotFound { nearest }) => {
            return Err(ResolveError::NoSymbol {
                symbol: symbol.to_owned(),
                path: path.to_owned(),
                stripped: file.section_by_name(".gnu_debugdata").is_some(),
                hint: did_you_mean(&nearest),
            });
        }
        Err(NameError::Ambiguous { candidates }) => {
            return Err(ResolveError::Ambiguous {
                symbol: symbol.to_owned(),
                path: path.to_owned(),
                count: candidates.len(),
                list: list_candidates(&candidates),
            });
        }
    };
    let (address, size) = (function.address, function.size);
    // The raw name from here on: it finds the function's `.cold` parts.
    let symbol = function.raw.as_str();
    let file_offset = file_offset_of(&file, address).ok_or_else(|| ResolveError::NotMapped {
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
        file_offset,
        address,
        kind,
        go: is_go_binary(&file),
        exits: exit_probes(&file, &data, symbol, address, size),
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
    symbol: &str,
    address: u64,
    size: u64,
) -> Result<Vec<ExitProbe>, WalkError> {
    if size == 0 {
        return Err(WalkError::NoSize);
    }
    let cold = format!("{symbol}.cold");
    let mut extents = vec![(address, size)];
    extents.extend(
        file.symbols()
            .filter(|s| {
                s.kind() == object::SymbolKind::Text
                    && s.size() > 0
                    && s.name().is_ok_and(|n| {
                        n == cold
                            || n.strip_prefix(cold.as_str()).is_some_and(|rest| {
                                rest.strip_prefix('.')
                                    .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                            })
                    })
            })
            .map(|s| (s.address(), s.size())),
    );
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

/// The address of the defined function whose raw symbol is `symbol` (static symbol table
/// first, then the dynamic one).
pub fn symbol_address(file: &object::File<'_>, symbol: &str) -> Option<u64> {
    file.symbols()
        .chain(file.dynamic_symbols())
        .find(|s| {
            s.kind() == object::SymbolKind::Text
                && s.is_definition()
                && s.address() != 0
                && s.name() == Ok(symbol)
        })
        .map(|s| s.address())
}

/// The file offset of virtual `address`, through the loadable segment that maps it.
pub fn file_offset_of(file: &object::File<'_>, address: u64) -> Option<u64> {
    file.segments().find_map(|seg| {
        let (offset, size) = seg.file_range();
        let delta = address.checked_sub(seg.address())?;
        (delta < size).then(|| offset.checked_add(delta)).flatten()
    })
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

/// Resolves `symbol` for process `pid`: in `binary` when given (relative to the process's
/// root), else in its executable, then in every shared object it has mapped.
pub fn resolve_for_process(
    pid: u32,
    binary: Option<&Path>,
    symbol: &str,
) -> Result<ProbePoint, ResolveError> {
    if let Some(binary) = binary {
        return resolve_symbol(&in_process_root(pid, binary), symbol);
    }
    let exe = process_exe(pid)?;
    let not_in_exe = match resolve_symbol(&exe, symbol) {
        Err(e @ ResolveError::NoSymbol { .. }) => e,
        other => return other,
    };
    let libraries = mapped_objects(pid)?;
    resolve_in_libraries(libraries.iter().filter(|o| **o != exe), symbol, not_in_exe)
}

/// `symbol` in the first of `libraries` that defines it; `not_found` (the executable's
/// error, with its hints) when none does. An ambiguous name in a library is an error.
pub fn resolve_in_libraries<'a>(
    libraries: impl IntoIterator<Item = &'a PathBuf>,
    symbol: &str,
    not_found: ResolveError,
) -> Result<ProbePoint, ResolveError> {
    for object in libraries {
        match resolve_symbol(object, symbol) {
            Ok(point) => return Ok(point),
            Err(e @ ResolveError::Ambiguous { .. }) => return Err(e),
            Err(_) => {}
        }
    }
    Err(not_found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_libc_function_in_this_process() {
        let me = std::process::id();
        let point = resolve_for_process(me, None, "getpid").expect("getpid in libc");
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
        let err = resolve_for_process(me, None, "no_such_symbol_here").expect_err("missing");
        assert!(err.to_string().contains("no_such_symbol_here"), "{err}");
    }

    #[test]
    fn missing_process_and_file() {
        assert!(matches!(
            process_exe(u32::MAX),
            Err(ResolveError::NoProcess { .. })
        ));
        let err = resolve_symbol(Path::new("/nonexistent/bin"), "main").expect_err("no file");
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
