//! Symbol index: every defined function of a binary, from all the places its symbols live,
//! for function triggers (probing) and for the symbolizer's debug-file fallback; and the
//! address of one function by its raw name ([`symbol_address`]), for a probe's offset.
//!
//! In: a binary parsed with `object`, and where to look for its debug files
//! ([`DebugSearch`]). Out: [`SymbolIndex`]: the functions (raw name, address, size) of the
//! binary's `.symtab` and `.dynsym`, of its separate debug file and of its `MiniDebugInfo`
//! (see [`super::debug_file`]), one entry per raw name, and the [`SymbolFiles`] found, so
//! that an error can say what was missing and where it was looked for.
use std::{collections::HashSet, fs, path::Path};

use object::{Object as _, ObjectSymbol as _};

use super::debug_file::{self, DebugSearch, SymbolFiles};

/// A defined function of a binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSymbol {
    /// The symbol as stored (mangled).
    pub raw: String,
    /// The name people read (demangled; the raw name when it is not mangled).
    pub display: String,
    /// ELF virtual address.
    pub address: u64,
    /// Bytes; 0 when the symbol table does not say.
    pub size: u64,
    /// A global (or weak) symbol: one other objects can bind to. A library's local
    /// function of a common name (ld.so's own `getpid`) is not what a call reaches.
    pub global: bool,
}

/// The functions of one binary, from all its symbol sources.
#[derive(Debug, Clone, Default)]
pub struct SymbolIndex {
    /// `display` is the raw name here; demangling is left to those who hand names out.
    pub functions: Vec<FunctionSymbol>,
    pub files: SymbolFiles,
}

impl SymbolIndex {
    /// Reads the functions of `file` (parsed from `path`) and of its debug files.
    #[must_use]
    pub fn read(path: &Path, file: &object::File<'_>, search: &DebugSearch) -> Self {
        let files = debug_file::locate(path, file, search);
        let mut index = Self {
            functions: Vec::new(),
            files: SymbolFiles::default(),
        };
        let mut seen = HashSet::new();
        index.add(file, &mut seen);
        if let Some((debug, _)) = &files.debug_file {
            match fs::read(debug) {
                Ok(data) => match object::File::parse(&*data) {
                    Ok(debug_file) => index.add(&debug_file, &mut seen),
                    Err(e) => log::warn!("debug file {}: {e}", debug.display()),
                },
                Err(e) => log::warn!("debug file {}: {e}", debug.display()),
            }
        }
        if let Some(image) = &files.mini_debug_info
            && let Ok(mini) = object::File::parse(&**image)
        {
            index.add(&mini, &mut seen);
        }
        index.files = files;
        index
    }

    /// The functions of `file` not seen yet: its static symbol table, then its dynamic one.
    fn add(&mut self, file: &object::File<'_>, seen: &mut HashSet<String>) {
        let symbols = file.symbols().chain(file.dynamic_symbols()).filter(|s| {
            s.kind() == object::SymbolKind::Text && s.is_definition() && s.address() != 0
        });
        for s in symbols {
            let Ok(raw) = s.name() else { continue };
            if seen.insert(raw.to_owned()) {
                self.functions.push(FunctionSymbol {
                    raw: raw.to_owned(),
                    display: raw.to_owned(),
                    address: s.address(),
                    size: s.size(),
                    global: s.is_global() || s.is_weak(),
                });
            }
        }
    }

    /// The compiler-split cold parts of the function `raw` (`raw.cold`, `raw.cold.N`: GCC
    /// moves unlikely paths, exception cleanups among them, there), as (address, size).
    pub fn cold_parts<'s>(&'s self, raw: &str) -> impl Iterator<Item = (u64, u64)> + 's {
        let cold = format!("{raw}.cold");
        self.functions
            .iter()
            .filter(move |f| {
                f.size > 0
                    && (f.raw == cold
                        || f.raw.strip_prefix(cold.as_str()).is_some_and(|rest| {
                            rest.strip_prefix('.').is_some_and(|n| {
                                !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                            })
                        }))
            })
            .map(|f| (f.address, f.size))
    }
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
