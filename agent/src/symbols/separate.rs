//! Separate symbols of a mapped file, for the addresses the file itself cannot name: its
//! debug file (found by build-id or `.gnu_debuglink`, [`crate::elf::debug_file`]) and its
//! `MiniDebugInfo`.
//!
//! In: a file the symbolizer reads and the debug search of its process. Out: the ELF
//! virtual address of a file offset (the debug file is read by address: its program
//! headers are the binary's, its file offsets are not), the debug file's path for
//! blazesym (which reads its symbols and DWARF lines), and the `MiniDebugInfo` functions by
//! address (a `.symtab` only, no DWARF).
use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::elf::{
    debug_file::{self, DebugSearch, SymbolFiles},
    index::{FunctionSymbol, SymbolIndex},
    segments::Segments,
};

/// What the symbolizer knows of one file's separate symbols.
#[derive(Debug, Default)]
pub struct Separate {
    /// The file's symbol sources (the `MiniDebugInfo` image dropped once indexed).
    pub files: SymbolFiles,
    segments: Segments,
    /// `MiniDebugInfo` functions with a size, by address.
    mini: Vec<FunctionSymbol>,
}

impl Separate {
    /// Reads what `path` has beside its own symbols (its debug link looked for beside
    /// `seen`, where the process saw it); nothing when it cannot be parsed.
    #[must_use]
    pub fn read(path: &Path, seen: &Path, search: &DebugSearch) -> Self {
        let Ok(data) = fs::read(path) else {
            return Self::default();
        };
        let Ok(file) = object::File::parse(&*data) else {
            return Self::default();
        };
        let segments = Segments::of(&file);
        let mut files = debug_file::locate(seen, &file, search);
        let mut mini = Vec::new();
        if let Some(image) = files.mini_debug_info.take()
            && let Ok(elf) = object::File::parse(&*image)
        {
            let index = SymbolIndex::read(path, &elf, &DebugSearch::default());
            mini = index.functions.into_iter().filter(|f| f.size > 0).collect();
            mini.sort_by_key(|f| f.address);
            // Kept as a marker that the file had symbols there.
            files.mini_debug_info = Some(Vec::new());
        }
        Self {
            files,
            segments,
            mini,
        }
    }

    /// The ELF virtual address at file `offset`.
    #[must_use]
    pub fn virtual_address(&self, offset: u64) -> Option<u64> {
        self.segments.address_of(offset)
    }

    /// The separate debug file, when one was found.
    #[must_use]
    pub fn debug_file(&self) -> Option<&PathBuf> {
        self.files.debug_file.as_ref().map(|(path, _)| path)
    }

    /// The `MiniDebugInfo` function covering virtual `address`, and how far into it.
    #[must_use]
    pub fn mini_function(&self, address: u64) -> Option<(&FunctionSymbol, u64)> {
        let at = self.mini.partition_point(|f| f.address <= address);
        // Nested or overlapping symbols are rare; look back a little for the innermost.
        self.mini[..at]
            .iter()
            .rev()
            .take(8)
            .filter(|f| address - f.address < f.size)
            .min_by_key(|f| f.size)
            .map(|f| (f, address - f.address))
    }
}
