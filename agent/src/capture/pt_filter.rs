//! Intel PT address filters: trace only the code of some binaries
//! (`PERF_EVENT_IOC_SET_FILTER` on every PT event).
//!
//! The kernel's syntax (`perf_event_parse_addr_filter` in kernel/events/core.c; perf's
//! `--filter`): filters separated by spaces, commas or newlines, each `ACTION SOURCE` with
//! ACTION `filter` (trace only inside the range), `start` or `stop`, and SOURCE
//! `START/SIZE@PATH` for a file (START a file offset, numbers in C syntax) or `START/SIZE`
//! for a kernel range. A `filter` range must have a non-zero size; file filters work on
//! per-task events only (lookback's are), and PATH must name a regular file. The kernel
//! maps the file range onto every mapping of that file, now and at later `mmap`s, and
//! inherited events copy the filters.
//!
//! A binary is one `filter OFFSET/SIZE@PATH` per executable `PT_LOAD` segment (usually
//! one), not `0/FILE_SIZE`: the kernel binds a file filter to the *first* mapping of the
//! file that overlaps its range (`perf_addr_filter_apply` returns at the first match) and
//! clips it to that mapping, so for a process already running (`attach`, the agent) a
//! whole-file range lands on the read-only header mapping of a separate-code binary and
//! traces none of its code (at later `mmap`s only executable mappings count, which is why
//! `run`, whose filter is set before exec, was not affected). The range starts strictly
//! inside the text mapping: `perf_addr_filter_match` rejects a mapping only when the
//! filter starts *beyond* its end (`>`), so a range starting at a page-aligned segment
//! offset also matches the preceding mapping, which ends there, as a range of size 0.
//! Such a range therefore starts one byte into the segment (its first byte is the start
//! of `_init` in the usual layout, run once at start). The model of the kernel's matching
//! and the VMA layouts of PIE and non-PIE binaries, with and without separate code, are
//! in `pt_filter_model.rs`. Each range takes one of the PMU's `nr_addr_filters` (2 to 4 on
//! most CPUs); more is refused here, with the limit in the message, rather than by an
//! `EOPNOTSUPP` from the ioctl.
#![forbid(unsafe_code)]

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

/// Why the address filters cannot be built or used.
#[derive(Debug, thiserror::Error)]
pub enum PtFilterError {
    #[error(
        "Intel PT address filters: {asked} code ranges asked for (one per executable segment \
         of each binary), this CPU filters at most {max} address range(s) (intel_pt \
         nr_addr_filters); trace fewer binaries"
    )]
    TooMany { asked: usize, max: u32 },
    #[error(
        "Intel PT address filters are not supported here (intel_pt caps/ip_filtering is 0 or \
         nr_addr_filters missing); drop trace_binaries / --trace-binary"
    )]
    Unsupported,
    #[error(
        "{}: the kernel's address-filter syntax cannot carry this path (it must be absolute, \
         without spaces, commas, `@` or control characters)",
        path.display()
    )]
    BadPath { path: PathBuf },
    #[error("{}: not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("{}: empty file", path.display())]
    Empty { path: PathBuf },
    #[error("{}: not an ELF file with an executable segment: nothing to trace", path.display())]
    NoCode { path: PathBuf },
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One binary to trace: its resolved path and the file ranges of its code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterBinary {
    pub path: PathBuf,
    /// `(offset, size)` in the file, one per executable `PT_LOAD` ([`code_ranges`]).
    pub ranges: Vec<(u64, u64)>,
}

/// An ELF program header's part the filter needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub file_size: u64,
    pub executable: bool,
}

/// The file ranges to filter on for `segments` (a binary's `PT_LOAD`s): each executable
/// one with a non-empty file part, starting one byte in when its offset is page-aligned
/// and not 0 (a mapping of the file may end right there; see the module doc).
pub fn code_ranges(segments: &[Segment], page: u64) -> Vec<(u64, u64)> {
    segments
        .iter()
        .filter(|s| s.executable && s.file_size > 0)
        .filter_map(|s| {
            let skip = u64::from(s.offset != 0 && s.offset % page == 0);
            let size = s.file_size.checked_sub(skip).filter(|&n| n > 0)?;
            Some((s.offset + skip, size))
        })
        .collect()
}

/// The `PT_LOAD` segments of the ELF file `data`; `None` when it is not ELF.
fn load_segments(data: &[u8]) -> Option<Vec<Segment>> {
    use object::{Object as _, ObjectSegment as _, SegmentFlags};
    let file = object::File::parse(data).ok()?;
    if !matches!(file.format(), object::BinaryFormat::Elf) {
        return None;
    }
    Some(
        file.segments()
            .map(|seg| {
                let (offset, file_size) = seg.file_range();
                let executable = matches!(
                    seg.flags(),
                    SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0
                );
                Segment {
                    offset,
                    file_size,
                    executable,
                }
            })
            .collect(),
    )
}

impl FilterBinary {
    /// Resolves `path` (symlinks followed: the kernel compares inodes, and `/proc/PID/maps`
    /// shows resolved names) and reads its size.
    pub fn resolve(path: &Path) -> Result<Self, PtFilterError> {
        let io = |source| PtFilterError::Io {
            path: path.to_owned(),
            source,
        };
        let resolved = std::fs::canonicalize(path).map_err(io)?;
        let meta = std::fs::metadata(&resolved).map_err(io)?;
        if !meta.is_file() {
            return Err(PtFilterError::NotAFile { path: resolved });
        }
        if meta.len() == 0 {
            return Err(PtFilterError::Empty { path: resolved });
        }
        let data = std::fs::read(&resolved).map_err(io)?;
        let page = crate::sys::page_size().map_or(4096, |p| p as u64);
        let ranges = load_segments(&data)
            .map(|segs| code_ranges(&segs, page))
            .unwrap_or_default();
        if ranges.is_empty() {
            return Err(PtFilterError::NoCode { path: resolved });
        }
        Ok(Self {
            path: resolved,
            ranges,
        })
    }
}

/// Whether `path` survives the kernel's tokenizer (separators ` ,\n`, `@` splits the
/// source, `%s` stops at nothing else) as one absolute path.
fn path_fits(path: &Path) -> bool {
    let Some(text) = path.to_str() else {
        return false;
    };
    text.starts_with('/')
        && !text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == ',' || c == '@')
}

/// Checks the count against the PMU: `nr_addr_filters` (from sysfs) and `ip_filtering`.
pub fn check_count(
    asked: usize,
    nr_addr_filters: Option<u32>,
    ip_filtering: Option<bool>,
) -> Result<(), PtFilterError> {
    let max = match (nr_addr_filters, ip_filtering) {
        (_, Some(false)) | (None | Some(0), _) => return Err(PtFilterError::Unsupported),
        (Some(max), _) => max,
    };
    if asked > usize::try_from(max).unwrap_or(usize::MAX) {
        return Err(PtFilterError::TooMany { asked, max });
    }
    Ok(())
}

/// The filter string for `binaries`: `filter OFFSET/SIZE@PATH` for each code range,
/// comma-separated. `None` for no binaries (trace everything).
pub fn filter_string(binaries: &[FilterBinary]) -> Result<Option<CString>, PtFilterError> {
    if binaries.is_empty() {
        return Ok(None);
    }
    let mut parts = Vec::with_capacity(binaries.len());
    for b in binaries {
        if !path_fits(&b.path) {
            return Err(PtFilterError::BadPath {
                path: b.path.clone(),
            });
        }
        if b.ranges.is_empty() || b.ranges.iter().any(|&(_, size)| size == 0) {
            return Err(PtFilterError::NoCode {
                path: b.path.clone(),
            });
        }
        for (offset, size) in &b.ranges {
            parts.push(format!("filter {offset:#x}/{size:#x}@{}", b.path.display()));
        }
    }
    // `path_fits` excluded NULs (control characters).
    CString::new(parts.join(","))
        .map(Some)
        .map_err(|_| PtFilterError::BadPath {
            path: binaries[0].path.clone(),
        })
}

/// Resolves `paths`, checks them against the PMU, and builds the filter string.
pub fn build(
    paths: &[PathBuf],
    nr_addr_filters: Option<u32>,
    ip_filtering: Option<bool>,
) -> Result<Option<CString>, PtFilterError> {
    if paths.is_empty() {
        return Ok(None);
    }
    let mut binaries: Vec<FilterBinary> = Vec::with_capacity(paths.len());
    for path in paths {
        let b = FilterBinary::resolve(path)?;
        // Two names of one file are one range.
        if !binaries.iter().any(|seen| seen.path == b.path) {
            binaries.push(b);
        }
    }
    let ranges = binaries.iter().map(|b| b.ranges.len()).sum();
    check_count(ranges, nr_addr_filters, ip_filtering)?;
    filter_string(&binaries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(path: &str, ranges: &[(u64, u64)]) -> FilterBinary {
        FilterBinary {
            path: PathBuf::from(path),
            ranges: ranges.to_vec(),
        }
    }

    #[test]
    fn one_filter_per_code_range_in_kernel_syntax() {
        assert_eq!(filter_string(&[]).unwrap(), None);
        let one = filter_string(&[bin("/usr/bin/myserver", &[(0x1001, 0x138)])]).unwrap();
        assert_eq!(
            one.unwrap().to_str().unwrap(),
            "filter 0x1001/0x138@/usr/bin/myserver"
        );
        let two = filter_string(&[
            bin("/usr/bin/myserver", &[(0, 0x780)]),
            bin(
                "/usr/lib/x86_64-linux-gnu/libssl.so.3",
                &[(0x22001, 0x9_0000)],
            ),
        ])
        .unwrap();
        assert_eq!(
            two.unwrap().to_str().unwrap(),
            "filter 0x0/0x780@/usr/bin/myserver,\
             filter 0x22001/0x90000@/usr/lib/x86_64-linux-gnu/libssl.so.3"
        );
    }

    #[test]
    fn code_ranges_are_the_executable_segments_starting_inside_their_mapping() {
        let seg = |offset, file_size, executable| Segment {
            offset,
            file_size,
            executable,
        };
        // Separate code (Debian's default): the text segment starts on a page boundary,
        // where the header mapping ends: one byte in.
        let sep = [
            seg(0, 0x5e0, false),
            seg(0x1000, 0x139, true),
            seg(0x2000, 0xd0, false),
            seg(0x2e00, 0x210, false),
        ];
        assert_eq!(code_ranges(&sep, 4096), [(0x1001, 0x138)]);
        // No separate code: one R+X segment from offset 0, nothing precedes it.
        let joined = [seg(0, 0x780, true), seg(0xe00, 0x210, false)];
        assert_eq!(code_ranges(&joined, 4096), [(0, 0x780)]);
        // An unaligned text offset stays; an empty or one-byte segment gives nothing.
        assert_eq!(
            code_ranges(&[seg(0x1040, 0x10, true)], 4096),
            [(0x1040, 0x10)]
        );
        assert!(code_ranges(&[seg(0x1000, 1, true), seg(0x3000, 0, true)], 4096).is_empty());
    }

    #[test]
    fn paths_the_tokenizer_would_split_are_refused() {
        for bad in [
            "/opt/my app/bin",
            "/opt/a,b",
            "/opt/x@y",
            "relative/bin",
            "/opt/tab\there",
        ] {
            let err = filter_string(&[bin(bad, &[(0, 10)])]).unwrap_err();
            assert!(matches!(err, PtFilterError::BadPath { .. }), "{bad}: {err}");
        }
        assert!(matches!(
            filter_string(&[bin("/bin/x", &[])]),
            Err(PtFilterError::NoCode { .. })
        ));
    }

    #[test]
    fn the_pmu_limits_how_many_ranges() {
        assert!(check_count(2, Some(2), Some(true)).is_ok());
        assert!(check_count(1, Some(4), None).is_ok());
        let err = check_count(3, Some(2), Some(true)).unwrap_err();
        assert!(matches!(err, PtFilterError::TooMany { asked: 3, max: 2 }));
        assert!(err.to_string().contains("at most 2 address range"), "{err}");
        for (nr, ip) in [
            (Some(0), Some(true)),
            (None, Some(true)),
            (Some(2), Some(false)),
        ] {
            assert!(matches!(
                check_count(1, nr, ip),
                Err(PtFilterError::Unsupported)
            ));
        }
    }

    #[test]
    fn binaries_resolve_to_real_files_with_their_code_ranges() {
        let dir = tempfile::tempdir().unwrap();
        // A real ELF: this test's own executable.
        let file = dir.path().join("prog");
        std::fs::copy(std::env::current_exe().unwrap(), &file).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let filter = build(&[file.clone(), link], Some(2), Some(true))
            .unwrap()
            .unwrap();
        let resolved = std::fs::canonicalize(&file).unwrap();
        let b = FilterBinary::resolve(&file).unwrap();
        assert!(!b.ranges.is_empty());
        // The symlink is the same file: its ranges once.
        let expected: Vec<String> = b
            .ranges
            .iter()
            .map(|(o, n)| format!("filter {o:#x}/{n:#x}@{}", resolved.display()))
            .collect();
        assert_eq!(filter.to_str().unwrap(), expected.join(","));
        let text = std::fs::write(dir.path().join("script"), "#!/bin/sh\n");
        text.unwrap();
        assert!(matches!(
            build(&[dir.path().join("script")], Some(2), Some(true)),
            Err(PtFilterError::NoCode { .. })
        ));
        assert!(matches!(
            build(&[dir.path().to_owned()], Some(2), Some(true)),
            Err(PtFilterError::NotAFile { .. })
        ));
        assert!(matches!(
            build(&[dir.path().join("missing")], Some(2), Some(true)),
            Err(PtFilterError::Io { .. })
        ));
        assert_eq!(build(&[], None, None).unwrap(), None);
    }
}
