//! Test model of how the kernel binds a file address filter to a process's mappings
//! (kernel/events/core.c, Linux 6.x), checked against the VMA layouts the ELF loader
//! makes of four real binaries, to show what `pt_filter`'s ranges trace.
//!
//! - `perf_addr_filter_match(filter, file, offset, size)`: same inode, and neither
//!   `filter->offset > offset + size` nor `filter->offset + filter->size < offset`;
//! - `perf_addr_filter_vma_adjust`: when the filter starts before the mapping's file
//!   offset, the range is the mapping's start for `min(vma_size, filter->size - (off -
//!   filter->offset))`; else `vm_start + filter->offset - off` for `min(vm_end - start,
//!   filter->size)`;
//! - `perf_addr_filter_apply` (the ioctl on a running process, and exec): the file-backed
//!   mappings in address order, the first that matches wins;
//! - `__perf_addr_filters_adjust` (each later `mmap`, `VM_EXEC` mappings only): every
//!   match overwrites the range, the last wins.
//!
//! The layouts: `int main(){return 0;}` built by Debian 12's gcc with `-pie` and `-no-pie`,
//! each with `-z separate-code` (the default) and `-z noseparate-code` (`readelf -lW`).

use super::pt_filter::{Segment, code_ranges};

const PAGE: u64 = 4096;

/// A `PT_LOAD`: offset, vaddr, filesz, executable.
type Phdr = (u64, u64, u64, bool);

/// (name, file size, `PT_LOAD`s, load base).
const LAYOUTS: [(&str, u64, &[Phdr], u64); 4] = [
    (
        "pie, separate code",
        15832,
        &[
            (0, 0, 0x5e0, false),
            (0x1000, 0x1000, 0x139, true),
            (0x2000, 0x2000, 0xd0, false),
            (0x2e00, 0x3e00, 0x210, false),
        ],
        0x5555_5555_4000,
    ),
    (
        "pie, no separate code",
        7640,
        &[(0, 0, 0x780, true), (0xe00, 0x1e00, 0x210, false)],
        0x5555_5555_4000,
    ),
    (
        "non-pie, separate code",
        15592,
        &[
            (0, 0x40_0000, 0x498, false),
            (0x1000, 0x40_1000, 0x115, true),
            (0x2000, 0x40_2000, 0x98, false),
            (0x2e38, 0x40_3e38, 0x1d8, false),
        ],
        0,
    ),
    (
        "non-pie, no separate code",
        7400,
        &[
            (0, 0x40_0000, 0x5d0, true),
            (0xe38, 0x40_1e38, 0x1d8, false),
        ],
        0,
    ),
];

#[derive(Debug, Clone, Copy)]
struct Vma {
    start: u64,
    end: u64,
    /// `vm_pgoff << PAGE_SHIFT`.
    off: u64,
    exec: bool,
}

/// The file-backed mappings the ELF loader makes of `phdrs` at `base`, in address order.
fn loader_vmas(phdrs: &[Phdr], base: u64) -> Vec<Vma> {
    let down = |x: u64| x & !(PAGE - 1);
    let up = |x: u64| (x + PAGE - 1) & !(PAGE - 1);
    phdrs
        .iter()
        .map(|&(offset, vaddr, filesz, exec)| Vma {
            start: down(base + vaddr),
            end: up(base + vaddr + filesz),
            off: down(offset),
            exec,
        })
        .collect()
}

/// `perf_addr_filter_vma_adjust`: the range `(start, size)` `filter` gets in `vma`.
fn vma_adjust((f_off, f_size): (u64, u64), vma: &Vma) -> Option<(u64, u64)> {
    let vma_size = vma.end - vma.start;
    // perf_addr_filter_match
    if f_off > vma.off + vma_size || f_off + f_size < vma.off {
        return None;
    }
    Some(if f_off < vma.off {
        (vma.start, vma_size.min(f_size - (vma.off - f_off)))
    } else {
        let start = vma.start + f_off - vma.off;
        (start, (vma.end - start).min(f_size))
    })
}

/// `perf_addr_filter_apply`: the first file-backed mapping that matches.
fn apply(filter: (u64, u64), vmas: &[Vma]) -> Option<(u64, u64)> {
    vmas.iter().find_map(|v| vma_adjust(filter, v))
}

/// `__perf_addr_filters_adjust` at each `mmap` in turn: executable mappings, last wins.
fn at_mmaps(filter: (u64, u64), vmas: &[Vma]) -> Option<(u64, u64)> {
    vmas.iter()
        .filter(|v| v.exec)
        .fold(None, |got, v| vma_adjust(filter, v).or(got))
}

/// The code's addresses: each executable segment's `[base + vaddr, + filesz)`.
fn code(phdrs: &[Phdr], base: u64) -> Vec<(u64, u64)> {
    phdrs
        .iter()
        .filter(|p| p.3)
        .map(|&(_, vaddr, filesz, _)| (base + vaddr, base + vaddr + filesz))
        .collect()
}

fn segments(phdrs: &[Phdr]) -> Vec<Segment> {
    phdrs
        .iter()
        .map(|&(offset, _, file_size, executable)| Segment {
            offset,
            file_size,
            executable,
        })
        .collect()
}

#[test]
fn a_whole_file_filter_on_a_running_separate_code_binary_traces_no_code() {
    for (name, size, phdrs, base) in LAYOUTS {
        let vmas = loader_vmas(phdrs, base);
        let (start, len) = apply((0, size), &vmas).expect(name);
        let covers_code = code(phdrs, base)
            .iter()
            .any(|&(lo, hi)| start < hi && lo < start + len);
        // What the old `0/SIZE` filter did: bound to the header mapping, which holds no
        // code, where the code is in a mapping of its own.
        let separate = !vmas[0].exec;
        assert_eq!(covers_code, !separate, "{name}: {start:#x}+{len:#x}");
        // A range starting at the text segment's page-aligned offset: the header mapping
        // ends there and matches first, with a range of size 0.
        if separate {
            let text = phdrs.iter().find(|p| p.3).expect("text");
            assert_eq!(
                apply((text.0, text.2), &vmas),
                Some((vmas[0].end, 0)),
                "{name}"
            );
        }
    }
}

#[test]
fn one_range_per_code_segment_binds_to_the_code_at_attach_and_at_exec() {
    for (name, _, phdrs, base) in LAYOUTS {
        let vmas = loader_vmas(phdrs, base);
        let ranges = code_ranges(&segments(phdrs), PAGE);
        let code = code(phdrs, base);
        assert_eq!(ranges.len(), code.len(), "{name}");
        for (range, &(lo, hi)) in ranges.iter().zip(&code) {
            // A running process (`attach`, the agent) and a filter set before exec (`run`):
            // both give the code, all of it but the first byte of a page-aligned segment.
            for (how, got) in [
                ("apply", apply(*range, &vmas)),
                ("mmap", at_mmaps(*range, &vmas)),
            ] {
                let (start, len) = got.unwrap_or_else(|| panic!("{name} {how}: no range"));
                let skip = u64::from((lo - base) % PAGE == 0 && lo != base + phdrs[0].1);
                assert_eq!((start, start + len), (lo + skip, hi), "{name} {how}");
            }
        }
    }
}
