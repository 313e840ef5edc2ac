//! Debug files: a binary → the other files that hold its symbols, where distributions
//! and build systems put them.
//!
//! In: the binary (a path this process can open, possibly through `/proc/PID/root`), the
//! root of the process's mount namespace, and extra debug directories given by the user.
//! Out: [`SymbolFiles`]: the separate debug file, found like GDB finds it, and the
//! `MiniDebugInfo` ELF decompressed, plus every place looked at (for errors that say where
//! to put the debug file).
//!
//! Lookup order (GDB's "Separate Debug Files"):
//! 1. build-id: `DIR/.build-id/xx/yyyy.debug` in each debug directory, the file's own
//!    build-id checked (Debian `-dbgsym`, Fedora `-debuginfo`);
//! 2. `.gnu_debuglink` `NAME` with its CRC-32 checked: beside the binary, in `.debug/` beside
//!    it, then `DIR/<binary's directory>/NAME` and `DIR/NAME` in each debug directory.
//!
//! Debug directories: the user's (`--debug-dir`, `debug_dirs:`; host paths) first, then
//! `ROOT/usr/lib/debug` and `ROOT/lib/debug` of the target's root, so a container's debug
//! files are read from the container, not from the host. Last, when the search has
//! servers, debuginfod by build-id ([`super::debuginfod`]; its cache on disk first).
//!
//! `MiniDebugInfo` (`.gnu_debugdata`, Fedora/RHEL): an xz-compressed ELF that holds the
//! `.symtab` of the functions the stripped `.dynsym` lacks; decoded with `lzma-rs`.
//! Parsing uses `object`; nothing here panics on malformed input (a bad file is skipped).
use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSection as _};

use super::{
    build_id::{build_id_hex, build_id_of},
    debuginfod,
};

/// Where to look for the debug files of a binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugSearch {
    /// The root of the target's mount namespace as this process reaches it (`/` or
    /// `/proc/PID/root`); the binary's path is under it.
    pub root: PathBuf,
    /// Extra debug directories (host paths), searched first.
    pub extra_dirs: Vec<PathBuf>,
    /// debuginfod servers asked by build-id when no directory has the file; `None`: none.
    pub debuginfod: Option<debuginfod::Config>,
}

impl Default for DebugSearch {
    fn default() -> Self {
        Self::in_root("/", Vec::new())
    }
}

impl DebugSearch {
    /// A search in the mount namespace whose root this process reaches at `root`.
    pub fn in_root(root: impl Into<PathBuf>, extra_dirs: Vec<PathBuf>) -> Self {
        Self {
            root: root.into(),
            extra_dirs,
            debuginfod: None,
        }
    }

    /// The search with debuginfod servers (`None`: none asked).
    #[must_use]
    pub fn with_debuginfod(mut self, config: Option<debuginfod::Config>) -> Self {
        self.debuginfod = config;
        self
    }

    /// The search for a binary at `path`: in `/proc/PID/root` when the path goes through
    /// it, else in `/`.
    pub fn for_path(path: &Path, extra_dirs: Vec<PathBuf>) -> Self {
        let mut parts = path.components().skip(1);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(proc), Some(pid), Some(root))
                if proc.as_os_str() == "proc"
                    && pid.as_os_str().to_str().is_some_and(is_pid)
                    && root.as_os_str() == "root" =>
            {
                let root = Path::new("/proc").join(pid).join("root");
                Self::in_root(root, extra_dirs)
            }
            _ => Self::in_root("/", extra_dirs),
        }
    }

    /// The debug directories, in search order.
    fn dirs(&self) -> Vec<PathBuf> {
        let mut dirs = self.extra_dirs.clone();
        dirs.push(self.root.join("usr/lib/debug"));
        dirs.push(self.root.join("lib/debug"));
        dirs
    }

    /// `path` as the target sees it, relative (`usr/bin` for `/proc/PID/root/usr/bin`).
    fn in_target<'p>(&self, path: &'p Path) -> &'p Path {
        let inside = path.strip_prefix(&self.root).unwrap_or(path);
        inside.strip_prefix("/").unwrap_or(inside)
    }
}

fn is_pid(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// How a debug file was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FoundBy {
    BuildId,
    DebugLink,
    /// From a debuginfod server (or its cache), by build-id.
    Debuginfod,
}

/// The separate symbol sources of a binary.
#[derive(Debug, Clone, Default)]
pub struct SymbolFiles {
    /// The binary's GNU build-id (hex).
    pub build_id: Option<String>,
    /// The binary has a `.symtab` of its own.
    pub has_symtab: bool,
    /// The separate debug file, and how it was found.
    pub debug_file: Option<(PathBuf, FoundBy)>,
    /// The ELF image `MiniDebugInfo` holds, decompressed.
    pub mini_debug_info: Option<Vec<u8>>,
    /// Every debug file path looked at (for the "no debug file at ..." hint).
    pub tried: Vec<PathBuf>,
    /// Why a candidate or the `MiniDebugInfo` was not used (wrong CRC, corrupt xz).
    pub rejected: Vec<String>,
}

impl SymbolFiles {
    /// Whether the binary has any symbol table beyond `.dynsym`.
    #[must_use]
    pub fn has_full_symbols(&self) -> bool {
        self.has_symtab || self.debug_file.is_some() || self.mini_debug_info.is_some()
    }

    /// What a user should do about a binary without full symbols: `stripped; no debug
    /// file at A, B; install its debug symbols package (build-id X)`; empty when it has
    /// them.
    #[must_use]
    pub fn missing_hint(&self) -> String {
        if self.has_full_symbols() {
            return String::new();
        }
        let mut text = "stripped".to_owned();
        if !self.tried.is_empty() {
            // The first places (the build-id ones, where packages put them) and a count: a
            // log line, not a directory listing.
            let mut tried: Vec<String> = self
                .tried
                .iter()
                .take(SHOWN_PLACES)
                .map(|p| p.display().to_string())
                .collect();
            if self.tried.len() > SHOWN_PLACES {
                tried.push(format!("{} more places", self.tried.len() - SHOWN_PLACES));
            }
            text.push_str("; no debug file at ");
            text.push_str(&tried.join(", "));
        }
        for why in &self.rejected {
            text.push_str("; ");
            text.push_str(why);
        }
        text.push_str("; install its debug symbols package");
        if let Some(id) = &self.build_id {
            text.push_str(" (build-id ");
            text.push_str(id);
            text.push(')');
        }
        text.push_str(" or pass --debug-dir");
        text
    }
}

/// How many of the places looked at a hint names.
const SHOWN_PLACES: usize = 3;

/// The largest `MiniDebugInfo` image decoded (real ones are a few MB).
const MAX_MINI_DEBUG_INFO: usize = 256 << 20;

/// Finds the symbol sources of the binary `file` (parsed from `path`).
#[must_use]
pub fn locate(path: &Path, file: &object::File<'_>, search: &DebugSearch) -> SymbolFiles {
    let mut out = SymbolFiles {
        build_id: build_id_hex(file),
        has_symtab: file.section_by_name(".symtab").is_some(),
        ..SymbolFiles::default()
    };
    if let Some(section) = file.section_by_name(".gnu_debugdata") {
        match section
            .data()
            .map_err(|e| e.to_string())
            .and_then(decompress_xz)
        {
            Ok(image) if object::File::parse(&*image).is_ok() => out.mini_debug_info = Some(image),
            Ok(_) => out
                .rejected
                .push("its .gnu_debugdata is not an ELF image".to_owned()),
            Err(e) => out
                .rejected
                .push(format!("its .gnu_debugdata does not decompress: {e}")),
        }
    }
    if out.has_symtab {
        // Only `.dynsym`-less or stripped binaries need a debug file for their names;
        // one with `.symtab` may still have DWARF elsewhere, which blazesym follows itself.
        return out;
    }
    out.debug_file = debug_file_of(path, file, search, &mut out);
    out
}

/// The separate debug file of the binary `file` (parsed from `path`), whether or not it
/// has `.symtab` (the unwinder wants its `.debug_frame`): the debug directories, then
/// debuginfod.
#[must_use]
pub fn locate_debug_file(
    path: &Path,
    file: &object::File<'_>,
    search: &DebugSearch,
) -> Option<PathBuf> {
    let mut out = SymbolFiles {
        build_id: build_id_hex(file),
        ..SymbolFiles::default()
    };
    debug_file_of(path, file, search, &mut out).map(|(found, _)| found)
}

/// [`find_debug_file`], then the debuginfod servers of `search`; what was tried and
/// rejected goes to `out`.
fn debug_file_of(
    path: &Path,
    file: &object::File<'_>,
    search: &DebugSearch,
    out: &mut SymbolFiles,
) -> Option<(PathBuf, FoundBy)> {
    let found = find_debug_file(path, file, search, out);
    if found.is_some() {
        return found;
    }
    let (Some(config), Some(id)) = (&search.debuginfod, &out.build_id) else {
        return None;
    };
    match debuginfod::fetch(id, config) {
        Ok(found) => Some((found, FoundBy::Debuginfod)),
        Err(e) => {
            out.rejected.push(e.to_string());
            None
        }
    }
}

fn find_debug_file(
    path: &Path,
    file: &object::File<'_>,
    search: &DebugSearch,
    out: &mut SymbolFiles,
) -> Option<(PathBuf, FoundBy)> {
    let dirs = search.dirs();
    if let Some(id) = out.build_id.clone().filter(|id| id.len() > 2) {
        for dir in &dirs {
            let candidate = dir
                .join(".build-id")
                .join(&id[..2])
                .join(format!("{}.debug", &id[2..]));
            out.tried.push(candidate.clone());
            match build_id_of(&candidate) {
                Some(found) if found == id => return Some((candidate, FoundBy::BuildId)),
                Some(_) => out
                    .rejected
                    .push(format!("{} has another build-id", candidate.display())),
                None => {}
            }
        }
    }
    let (name, crc) = debug_link(file)?;
    let beside = path.parent().unwrap_or(Path::new("/"));
    let target_dir = search.in_target(beside);
    let mut candidates = vec![beside.join(&name), beside.join(".debug").join(&name)];
    for dir in &dirs {
        candidates.push(dir.join(target_dir).join(&name));
        candidates.push(dir.join(&name));
    }
    for candidate in candidates {
        if candidate == path || out.tried.contains(&candidate) {
            continue;
        }
        out.tried.push(candidate.clone());
        let Ok(data) = fs::read(&candidate) else {
            continue;
        };
        if crc32fast::hash(&data) == crc {
            return Some((candidate, FoundBy::DebugLink));
        }
        out.rejected.push(format!(
            "{} does not match the binary's .gnu_debuglink CRC",
            candidate.display()
        ));
    }
    None
}

/// `.gnu_debuglink`: a NUL-terminated file name, padded to 4 bytes, then a CRC-32.
fn debug_link(file: &object::File<'_>) -> Option<(String, u32)> {
    let data = file.section_by_name(".gnu_debuglink")?.data().ok()?;
    let end = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..end]).ok()?;
    // A link names a file, never a path: refuse anything that would leave the directory.
    if name.is_empty() || name.contains('/') || name == ".." {
        return None;
    }
    let crc_at = (end + 1).next_multiple_of(4);
    let crc = data.get(crc_at..crc_at + 4)?;
    let crc = u32::from_le_bytes(crc.try_into().ok()?);
    Some((name.to_owned(), crc))
}

/// Decodes an xz stream, refusing images over [`MAX_MINI_DEBUG_INFO`].
fn decompress_xz(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Capped(Vec::new());
    lzma_rs::xz_decompress(&mut io::BufReader::new(data), &mut out).map_err(|e| e.to_string())?;
    Ok(out.0)
}

/// A `Vec` writer that fails past [`MAX_MINI_DEBUG_INFO`] bytes.
struct Capped(Vec<u8>);

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.len() + buf.len() > MAX_MINI_DEBUG_INFO {
            return Err(io::Error::other("MiniDebugInfo larger than 256 MiB"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_roots_are_recognized() {
        let s = DebugSearch::for_path(Path::new("/proc/42/root/usr/bin/x"), Vec::new());
        assert_eq!(s.root, PathBuf::from("/proc/42/root"));
        assert_eq!(
            s.in_target(Path::new("/proc/42/root/usr/bin")),
            Path::new("usr/bin")
        );
        assert_eq!(s.dirs()[0], PathBuf::from("/proc/42/root/usr/lib/debug"));
        let s = DebugSearch::for_path(Path::new("/proc/self/root/x"), vec!["/d".into()]);
        assert_eq!(s.root, PathBuf::from("/"));
        assert_eq!(s.dirs()[0], PathBuf::from("/d"));
        assert_eq!(s.in_target(Path::new("/usr/bin")), Path::new("usr/bin"));
    }

    #[test]
    fn corrupt_xz_is_an_error_not_a_panic() {
        assert!(decompress_xz(b"\xfd7zXZ\0garbage").is_err());
        assert!(decompress_xz(b"").is_err());
    }

    #[test]
    fn hints_name_the_places_and_the_build_id() {
        let files = SymbolFiles {
            build_id: Some("abcd".into()),
            tried: vec!["/usr/lib/debug/.build-id/ab/cd.debug".into()],
            ..SymbolFiles::default()
        };
        let hint = files.missing_hint();
        assert!(
            hint.starts_with("stripped; no debug file at /usr/lib/debug/.build-id/ab/cd.debug"),
            "{hint}"
        );
        assert!(hint.contains("(build-id abcd)"), "{hint}");
        let many = SymbolFiles {
            tried: (0..8).map(|i| PathBuf::from(format!("/d{i}"))).collect(),
            ..SymbolFiles::default()
        };
        assert!(
            many.missing_hint()
                .contains("no debug file at /d0, /d1, /d2, 5 more places;"),
            "{}",
            many.missing_hint()
        );
        let full = SymbolFiles {
            has_symtab: true,
            ..SymbolFiles::default()
        };
        assert_eq!(full.missing_hint(), "");
    }
}
