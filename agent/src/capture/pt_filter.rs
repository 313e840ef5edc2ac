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
//! A whole binary is `filter 0/FILE_SIZE@PATH`: file offsets 0 to its size cover every
//! mapping of it (what perf's `filter * @ PATH` resolves to). Each binary takes one of the
//! PMU's `nr_addr_filters` ranges (2 to 4 on most CPUs); more is refused here, with the
//! limit in the message, rather than by an `EOPNOTSUPP` from the ioctl.
#![forbid(unsafe_code)]

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

/// Why the address filters cannot be built or used.
#[derive(Debug, thiserror::Error)]
pub enum PtFilterError {
    #[error(
        "Intel PT address filters: {asked} binaries given, this CPU filters at most {max} \
         address range(s) (intel_pt nr_addr_filters); trace fewer binaries"
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
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One binary to trace: its resolved path and size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterBinary {
    pub path: PathBuf,
    pub size: u64,
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
        Ok(Self {
            path: resolved,
            size: meta.len(),
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

/// The filter string for `binaries`: `filter 0/SIZE@PATH`, comma-separated. `None` for
/// no binaries (trace everything).
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
        if b.size == 0 {
            return Err(PtFilterError::Empty {
                path: b.path.clone(),
            });
        }
        parts.push(format!("filter 0/{}@{}", b.size, b.path.display()));
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
    check_count(binaries.len(), nr_addr_filters, ip_filtering)?;
    filter_string(&binaries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(path: &str, size: u64) -> FilterBinary {
        FilterBinary {
            path: PathBuf::from(path),
            size,
        }
    }

    #[test]
    fn one_whole_binary_per_filter_in_kernel_syntax() {
        assert_eq!(filter_string(&[]).unwrap(), None);
        let one = filter_string(&[bin("/usr/bin/myserver", 123_456)]).unwrap();
        assert_eq!(
            one.unwrap().to_str().unwrap(),
            "filter 0/123456@/usr/bin/myserver"
        );
        let two = filter_string(&[
            bin("/usr/bin/myserver", 4096),
            bin("/usr/lib/x86_64-linux-gnu/libssl.so.3", 700_000),
        ])
        .unwrap();
        assert_eq!(
            two.unwrap().to_str().unwrap(),
            "filter 0/4096@/usr/bin/myserver,filter 0/700000@/usr/lib/x86_64-linux-gnu/libssl.so.3"
        );
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
            let err = filter_string(&[bin(bad, 10)]).unwrap_err();
            assert!(matches!(err, PtFilterError::BadPath { .. }), "{bad}: {err}");
        }
        assert!(matches!(
            filter_string(&[bin("/bin/x", 0)]),
            Err(PtFilterError::Empty { .. })
        ));
    }

    #[test]
    fn the_pmu_limits_how_many_binaries() {
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
    fn binaries_resolve_to_real_files_with_their_size() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("prog");
        std::fs::write(&file, vec![0u8; 5000]).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let filter = build(&[file.clone(), link], Some(2), Some(true))
            .unwrap()
            .unwrap();
        let resolved = std::fs::canonicalize(&file).unwrap();
        // The symlink is the same file: one range.
        assert_eq!(
            filter.to_str().unwrap(),
            format!("filter 0/5000@{}", resolved.display())
        );
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
