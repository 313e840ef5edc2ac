//! ELF files: what the stages read from binaries. A library under the stages, like `sys/`:
//! it imports none of them, and every stage that meets a binary uses it: `check` (the
//! uprobe it opens), the trigger resolver (where to place probes), capture (the build-ids
//! of mapped files), the unwinder and the symbolizer (naming frames).
//!
//! In: files (paths, or parsed with `object`). Out: [`segments::Segments`] (file offsets ↔
//! virtual addresses), [`build_id`]s, the functions of a binary ([`index::SymbolIndex`],
//! [`index::symbol_address`]) and the separate debug files that hold its symbols
//! ([`debug_file::SymbolFiles`]), also from debuginfod servers ([`debuginfod`]).
#![forbid(unsafe_code)]

pub mod build_id;
pub mod debug_file;
pub mod debuginfod;
pub mod index;
pub mod segments;
