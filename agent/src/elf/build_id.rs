//! GNU build-ids (`NT_GNU_BUILD_ID`): what names a binary across machines. The recorder
//! keeps the build-id of every mapped file, the debug-file search looks debug files up by
//! it, and the decode side matches local binaries and imported captures' files by it.
//!
//! In: an ELF file (a path, or parsed with `object`). Out: its build-id in hex, or `None`.
use std::{fs::File, path::Path};

use object::{Object as _, read::ReadCache};

/// The GNU build-id of the ELF file at `path`, hex; `None` if it has none or is not ELF.
pub fn build_id_of(path: &Path) -> Option<String> {
    let file = File::open(path).ok()?;
    let cache = ReadCache::new(file);
    let object = object::File::parse(&cache).ok()?;
    build_id_hex(&object)
}

/// The GNU build-id of a parsed ELF file, hex.
pub fn build_id_hex<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
) -> Option<String> {
    let id = file.build_id().ok()??;
    Some(id.iter().fold(String::new(), |mut hex, b| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{b:02x}");
        hex
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_elf_has_no_build_id() {
        assert_eq!(build_id_of(Path::new("/proc/self/status")), None);
        assert_eq!(build_id_of(Path::new("/nonexistent")), None);
    }
}
