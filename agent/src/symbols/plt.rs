//! PLT stubs as `name@plt` frames.
//!
//! The stubs in `.plt`, `.plt.sec` and `.plt.got` have no symbols, so a symbol table lookup
//! names them after whatever precedes them (`_init`) — wrong, and with no source line.
//! Like objdump's synthetic symbols, each stub is named from the GOT slot its indirect jump
//! reads (`jmp *slot(%rip)`), looked up in the dynamic relocations; a lazy-binding stub
//! without that jump (`push index; jmp PLT0`) is named from its `.rela.plt` index; PLT0
//! and anything else in those sections is `[plt]`. x86-64 ELF only.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use crate::elf::segments::Segments;
use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic, OpKind};
use object::elf::{R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT};
use object::read::elf::{ElfFile64, SectionHeader as _};
use object::{
    Architecture, Object as _, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _,
    ReadCache, RelocationFlags, RelocationTarget,
};

/// Name of a PLT entry without a resolvable target (PLT0, IRELATIVE stubs).
pub const PLT: &str = "[plt]";

/// One stub: its ELF address range and name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    start: u64,
    end: u64,
    name: String,
}

/// The PLT stubs of one ELF file.
#[derive(Debug, Default)]
pub struct PltTable {
    /// Sorted by `start`, not overlapping.
    entries: Vec<Entry>,
    segments: Segments,
}

impl PltTable {
    /// Reads the stubs of `path`; an empty table when it has none or is not x86-64 ELF.
    pub fn read(path: &Path) -> Self {
        let Ok(file) = File::open(path) else {
            return Self::default();
        };
        let cache = ReadCache::new(file);
        Self::parse(&cache).unwrap_or_default()
    }

    fn parse(data: &ReadCache<File>) -> Option<Self> {
        let elf = ElfFile64::<object::Endianness, _>::parse(data).ok()?;
        if elf.architecture() != Architecture::X86_64 {
            return None;
        }
        let endian = elf.endian();
        // GOT slot → symbol name, and the JUMP_SLOT names in `.rela.plt` order (lazy stubs
        // push that index).
        let dynsyms = elf.dynamic_symbol_table();
        let mut slots = HashMap::new();
        let mut jump_slots = Vec::new();
        for (offset, reloc) in elf.dynamic_relocations().into_iter().flatten() {
            let RelocationFlags::Elf { r_type } = reloc.flags() else {
                continue;
            };
            if r_type != R_X86_64_JUMP_SLOT && r_type != R_X86_64_GLOB_DAT {
                continue;
            }
            let name = match (reloc.target(), &dynsyms) {
                (RelocationTarget::Symbol(index), Some(table)) => table
                    .symbol_by_index(index)
                    .ok()
                    .and_then(|s| s.name().ok().map(str::to_owned)),
                _ => None,
            };
            let Some(name) = name.filter(|n| !n.is_empty()) else {
                continue;
            };
            if r_type == R_X86_64_JUMP_SLOT {
                jump_slots.push(name.clone());
            }
            slots.insert(offset, name);
        }
        let mut entries = Vec::new();
        for section in elf.sections() {
            let Ok(name) = section.name() else { continue };
            if !matches!(name, ".plt" | ".plt.sec" | ".plt.got") {
                continue;
            }
            let Ok(code) = section.data() else { continue };
            let entsize = match section.elf_section_header().sh_entsize(endian) {
                0 => 16,
                n => usize::try_from(n).unwrap_or(16),
            };
            entries.extend(stubs(section.address(), code, entsize, &slots, &jump_slots));
        }
        if entries.is_empty() {
            return None;
        }
        entries.sort_by_key(|e| e.start);
        let segments = Segments::of(&object::File::Elf64(elf));
        Some(Self { entries, segments })
    }

    /// The stub at file offset `offset`: its name, how far `offset` is into it, its size.
    pub fn lookup(&self, offset: u64) -> Option<(&str, u64, u64)> {
        let addr = self.segments.address_of(offset)?;
        let i = self.entries.partition_point(|e| e.start <= addr);
        let entry = self.entries.get(i.checked_sub(1)?)?;
        (addr < entry.end).then(|| {
            (
                entry.name.as_str(),
                addr - entry.start,
                entry.end - entry.start,
            )
        })
    }
}

/// The stubs of one PLT section at `base`, `entsize` bytes each.
fn stubs(
    base: u64,
    code: &[u8],
    entsize: usize,
    slots: &HashMap<u64, String>,
    jump_slots: &[String],
) -> Vec<Entry> {
    let mut names: Vec<Option<String>> = vec![None; code.len().div_ceil(entsize)];
    let mut pushed: Vec<Option<String>> = names.clone();
    let mut decoder = Decoder::with_ip(64, code, base, DecoderOptions::NONE);
    while decoder.can_decode() {
        let insn = decoder.decode();
        let index = usize::try_from(insn.ip() - base).unwrap_or(usize::MAX) / entsize;
        if insn.flow_control() == FlowControl::IndirectBranch && insn.is_ip_rel_memory_operand() {
            if let (Some(name), Some(slot)) = (
                slots.get(&insn.ip_rel_memory_address()),
                names.get_mut(index),
            ) {
                *slot = Some(format!("{name}@plt"));
            }
        } else if insn.mnemonic() == Mnemonic::Push
            && matches!(
                insn.op0_kind(),
                OpKind::Immediate8to64 | OpKind::Immediate32to64
            )
        {
            let target = usize::try_from(insn.immediate64())
                .ok()
                .and_then(|i| jump_slots.get(i));
            if let (Some(name), Some(slot)) = (target, pushed.get_mut(index)) {
                *slot = Some(format!("{name}@plt"));
            }
        }
    }
    names
        .into_iter()
        .zip(pushed)
        .enumerate()
        .map(|(i, (jumped, pushed))| {
            let start = base + (i * entsize) as u64;
            Entry {
                start,
                end: (start + entsize as u64).min(base + code.len() as u64),
                name: jumped.or(pushed).unwrap_or_else(|| PLT.to_owned()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{PLT, PltTable};
    use std::path::Path;
    use std::process::Command;

    /// (address, name) of every `<name@plt>:` objdump prints for `path`, or `None` without
    /// objdump.
    fn objdump_plt(path: &Path) -> Option<Vec<(u64, String)>> {
        let out = Command::new("objdump")
            .args(["-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got"])
            .arg(path)
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        Some(
            text.lines()
                .filter_map(|l| {
                    let (addr, rest) = l.split_once(" <")?;
                    let name = rest.strip_suffix(">:")?;
                    // objdump names PLT0 after the next stub (`raise@plt-0x10`).
                    (!name.contains("@plt-") && !name.contains('+'))
                        .then(|| Some((u64::from_str_radix(addr, 16).ok()?, name.to_owned())))?
                })
                .collect(),
        )
    }

    #[test]
    fn stubs_are_named_as_objdump_names_them() {
        let mut checked = 0;
        for lib in [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
            "/usr/bin/ls",
        ] {
            let path = Path::new(lib);
            let Some(expected) = objdump_plt(path).filter(|e| !e.is_empty()) else {
                continue;
            };
            let table = PltTable::read(path);
            for (addr, name) in &expected {
                // These are position-independent: the first segment maps offset 0 at 0.
                let off = table
                    .segments
                    .offset_of(*addr)
                    .expect("address in a segment");
                assert_eq!(
                    table.lookup(off).map(|(n, o, _)| (n, o)),
                    Some((name.as_str(), 0)),
                    "{lib} {addr:#x}"
                );
                assert_eq!(
                    table.lookup(off + 6).map(|(n, o, _)| (n, o)),
                    Some((name.as_str(), 6))
                );
                checked += 1;
            }
            // PLT0 (the lazy resolver's trampoline) has no callee.
            let plt0 = table.entries.first().expect("entries");
            assert_eq!(plt0.name, PLT, "{lib}");
        }
        if checked == 0 {
            eprintln!("skipped: no objdump or no PLT in the system's libraries");
        }
    }

    #[test]
    fn offsets_outside_the_plt_and_non_elf_files_are_not_stubs() {
        let table = PltTable::read(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(table.lookup(0), None);
        assert_eq!(table.lookup(u64::MAX), None);
        let none = PltTable::read(Path::new("/etc/hostname"));
        assert!(none.entries.is_empty());
        assert_eq!(none.lookup(0), None);
    }
}
