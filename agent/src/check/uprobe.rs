//! uprobes: the `uprobe` PMU in sysfs (Linux 4.17), then a real uprobe and uretprobe on
//! `getpid` in the libc this process has mapped (or in the executable itself when it is
//! static), enabled around one call to `getpid` to see it fire; and a BPF `uprobe_multi`
//! link on the same function (Linux 6.6), the path function rules take when a uprobe perf
//! event is refused (it needs `CAP_SYS_ADMIN` since Linux 6.16; the link needs only
//! `CAP_BPF` and `CAP_PERFMON`).

use std::{
    ffi::CString,
    os::{fd::AsFd as _, unix::ffi::OsStrExt as _},
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::{Paths, Probe, error_chain, pmu};
use crate::sys::{
    SyscallError,
    bpf::{self, ATTACH_TRACE_UPROBE_MULTI, ProgType, RETURN_ZERO},
    perf::{self, Target, UprobeSpec},
};

/// The function probed: present in every libc, and cheap to call.
const SYMBOL: &str = "getpid";

/// What the uprobe probe found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UprobesReport {
    #[serde(flatten)]
    pub status: Probe,
    /// `/sys/bus/event_source/devices/uprobe/type`.
    pub pmu_type: Option<u32>,
    /// The `config` bit that makes a uretprobe (`format/retprobe`).
    pub retprobe_bit: Option<u32>,
    /// `PATH:SYMBOL+OFFSET` probed.
    pub target: Option<String>,
    /// A uretprobe on the same function opened too.
    pub uretprobe: bool,
    /// How often the uprobe fired around one call (expected: 1).
    pub hits: Option<u64>,
}

/// Why no probe target was found.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path} as an object file")]
    Parse {
        path: PathBuf,
        #[source]
        source: object::Error,
    },
    #[error("no function symbol {symbol} in {path}")]
    SymbolNotFound { symbol: String, path: PathBuf },
    #[error("{symbol} at {address:#x} lies in no loadable segment")]
    NotInSegment { symbol: String, address: u64 },
}

/// The libc mapped into a process, from the text of `/proc/PID/maps`.
pub fn libc_from_maps(maps: &str) -> Option<PathBuf> {
    maps.lines().find_map(|line| {
        // address perms offset dev inode pathname (the path may contain spaces)
        let path = line.splitn(6, char::is_whitespace).nth(5)?.trim_start();
        let name = Path::new(path).file_name()?.to_str()?;
        let is_libc = name.starts_with("libc.so")
            || (name.starts_with("libc-")
                && Path::new(name).extension().is_some_and(|e| e == "so"));
        (path.starts_with('/') && is_libc).then(|| PathBuf::from(path))
    })
}

/// The file offset of function `symbol` in the ELF image `data` (dynamic symbols first,
/// then the full symbol table): the offset a uprobe takes.
pub fn symbol_file_offset(data: &[u8], path: &Path, symbol: &str) -> Result<u64, TargetError> {
    let file = object::File::parse(data).map_err(|source| TargetError::Parse {
        path: path.to_owned(),
        source,
    })?;
    let address = crate::elf::index::symbol_address(&file, symbol).ok_or_else(|| {
        TargetError::SymbolNotFound {
            symbol: symbol.to_owned(),
            path: path.to_owned(),
        }
    })?;
    crate::elf::segments::file_offset_of(&file, address).ok_or_else(|| TargetError::NotInSegment {
        symbol: symbol.to_owned(),
        address,
    })
}

/// The library (or executable) and offset to probe.
fn find_target(paths: &Paths) -> Result<(PathBuf, u64), TargetError> {
    let maps_path = paths.proc.join("self/maps");
    let maps = std::fs::read_to_string(&maps_path).map_err(|source| TargetError::Read {
        path: maps_path,
        source,
    })?;
    let exe = paths.proc.join("self/exe");
    let exe = std::fs::read_link(&exe).unwrap_or(exe);
    let candidates = libc_from_maps(&maps).into_iter().chain([exe]);
    let mut last_err = None;
    for path in candidates {
        let result = std::fs::read(&path)
            .map_err(|source| TargetError::Read {
                path: path.clone(),
                source,
            })
            .and_then(|data| symbol_file_offset(&data, &path, SYMBOL));
        match result {
            Ok(offset) => return Ok((path, offset)),
            Err(err) => last_err = Some(err),
        }
    }
    Err(last_err.unwrap_or_else(|| TargetError::SymbolNotFound {
        symbol: SYMBOL.to_owned(),
        path: PathBuf::from("/proc/self/exe"),
    }))
}

/// Opens the uprobe, enables it around one `getpid` call, returns the hit count.
fn fire_once(spec: &UprobeSpec<'_>) -> Result<u64, SyscallError> {
    let fd = perf::open_uprobe(spec, Target::CurrentThread, None)?;
    perf::enable(fd.as_fd())?;
    std::hint::black_box(std::process::id()); // libc getpid()
    perf::disable(fd.as_fd())?;
    perf::read_count(fd.as_fd())
}

pub(super) fn probe(paths: &Paths) -> UprobesReport {
    let pmu_dir = paths.event_sources().join("uprobe");
    let pmu_type = match pmu::read_u32(&pmu_dir.join("type")) {
        Ok(t) => t,
        Err(reason) => {
            return UprobesReport {
                status: Probe::fail(format!(
                    "uprobe PMU missing ({reason}): kernel without CONFIG_UPROBE_EVENTS or older than 4.17"
                )),
                ..UprobesReport::default()
            };
        }
    };
    let retprobe_bit = std::fs::read_to_string(pmu_dir.join("format/retprobe"))
        .ok()
        .and_then(|spec| pmu::FormatField::parse(&spec))
        .and_then(|field| field.single_config_bit());
    let mut report = UprobesReport {
        pmu_type: Some(pmu_type),
        retprobe_bit,
        ..UprobesReport::default()
    };
    let (path, offset) = match find_target(paths) {
        Ok(target) => target,
        Err(err) => {
            report.status = Probe::fail(format!("no function to probe: {}", error_chain(&err)));
            return report;
        }
    };
    let target = format!("{}:{SYMBOL}+{offset:#x}", path.display());
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        report.status = Probe::fail(format!("path contains a NUL byte: {}", path.display()));
        return report;
    };
    report.target = Some(target.clone());
    let spec = UprobeSpec {
        pmu_type,
        path: &c_path,
        offset,
        retprobe_bit: None,
    };
    let hits = match fire_once(&spec) {
        Ok(hits) => hits,
        Err(err) => {
            report.status = Probe::syscall_failed(&format!("uprobe on {target}"), &err);
            if matches!(err.errno(), Some(libc::EPERM | libc::EACCES)) {
                report.status = report.status.with_detail(
                    "a uprobe perf event needs CAP_SYS_ADMIN since Linux 6.16 (CAP_PERFMON \
                     before); function rules use uprobe_multi links instead where they work",
                );
            }
            return report;
        }
    };
    report.hits = Some(hits);
    report.uretprobe = retprobe_bit.is_some_and(|bit| {
        let spec = UprobeSpec {
            retprobe_bit: Some(bit),
            ..spec
        };
        perf::open_uprobe(&spec, Target::CurrentThread, None).is_ok()
    });
    let ret = if report.uretprobe {
        "uprobe+uretprobe"
    } else {
        "uprobe (uretprobe failed)"
    };
    report.status = Probe::pass(format!(
        "uprobe PMU type {pmu_type}; {ret} on {target} opened; fired {hits}× on one call"
    ));
    report
}

/// A `uprobe_multi` link of `r0 = 0; exit` on `getpid` in this process's libc, for this
/// process only, removed at once: whether function probes can be placed the way that
/// needs only `CAP_BPF` and `CAP_PERFMON`.
pub(super) fn probe_multi(paths: &Paths) -> Probe {
    let (path, offset) = match find_target(paths) {
        Ok(target) => target,
        Err(err) => return Probe::fail(format!("no function to probe: {}", error_chain(&err))),
    };
    let target = format!("{}:{SYMBOL}+{offset:#x}", path.display());
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return Probe::fail(format!("path contains a NUL byte: {}", path.display()));
    };
    let prog = match bpf::load_program_for(
        ProgType::Kprobe,
        ATTACH_TRACE_UPROBE_MULTI,
        &RETURN_ZERO,
        c"GPL",
        "lb_check_umulti",
        None,
    ) {
        Ok(prog) => prog,
        Err(err) => {
            let probe = Probe::syscall_failed("a uprobe_multi program", &err);
            return if err.errno() == Some(libc::EINVAL) {
                probe.with_detail("uprobe_multi links need Linux 6.6 or newer")
            } else {
                probe
            };
        }
    };
    match bpf::uprobe_multi_link(
        prog.as_fd(),
        &c_path,
        &[offset],
        &[0],
        0,
        Some(std::process::id()),
    ) {
        Ok(_link) => Probe::pass(format!(
            "uprobe_multi link on {target} created (needs CAP_BPF + CAP_PERFMON)"
        )),
        Err(err) => {
            let probe = Probe::syscall_failed(&format!("uprobe_multi link on {target}"), &err);
            // Before 6.6 the program loads (its attach type is not checked) and the link
            // is refused.
            if matches!(err.errno(), Some(libc::EINVAL | libc::EOPNOTSUPP)) {
                probe.with_detail("uprobe_multi links need Linux 6.6 or newer")
            } else {
                probe
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libc_in_maps() {
        let maps = "\
55d0c0a00000-55d0c0a20000 r--p 00000000 fe:00 123 /usr/bin/lookback\n\
7f0c1b883000-7f0c1b8a9000 r--p 00000000 fe:00 326279                     /usr/lib/x86_64-linux-gnu/libc.so.6\n\
7f0c1b8a9000-7f0c1b9ff000 r-xp 00026000 fe:00 326279                     /usr/lib/x86_64-linux-gnu/libc.so.6\n";
        assert_eq!(
            libc_from_maps(maps),
            Some(PathBuf::from("/usr/lib/x86_64-linux-gnu/libc.so.6"))
        );
        let old = "7f00-7f01 r-xp 00000000 08:01 1 /lib/libc-2.17.so\n";
        assert_eq!(
            libc_from_maps(old),
            Some(PathBuf::from("/lib/libc-2.17.so"))
        );
    }

    #[test]
    fn no_libc_in_maps() {
        let maps = "7f00-7f01 r-xp 00000000 08:01 1 /lib/libcrypto.so.3\n\
            7f00-7f01 rw-p 00000000 00:00 0 \n7ffc-7ffd r--p 00000000 00:00 0 [vvar]\ngarbage\n";
        assert_eq!(libc_from_maps(maps), None);
    }

    #[test]
    fn garbage_elf_is_an_error() {
        let err =
            symbol_file_offset(b"\x7fELF not really", Path::new("x"), SYMBOL).expect_err("garbage");
        assert!(matches!(err, TargetError::Parse { .. }), "{err:?}");
        let err = symbol_file_offset(&[], Path::new("x"), SYMBOL).expect_err("empty");
        assert!(matches!(err, TargetError::Parse { .. }), "{err:?}");
    }

    /// The live libc: `getpid` resolves to an offset inside the file, in an executable
    /// segment.
    #[test]
    fn getpid_in_the_live_libc() {
        let paths = Paths::default();
        let (path, offset) = find_target(&paths).expect("getpid in libc or the executable");
        let len = std::fs::metadata(&path).expect("stat").len();
        assert!(
            offset > 0 && offset < len,
            "{}: {offset:#x} of {len}",
            path.display()
        );
    }

    #[test]
    fn missing_uprobe_pmu_is_reported() {
        let root = tempfile::tempdir().expect("tempdir");
        let report = probe(&Paths::under(root.path()));
        assert!(!report.status.ok);
        assert!(
            report
                .status
                .reason
                .expect("reason")
                .contains("uprobe PMU missing")
        );
    }
}
