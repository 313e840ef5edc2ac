//! The memory maps of traced processes at freeze time: `/proc/PID/maps` parsed, the
//! GNU build-id of every mapped ELF file ([`crate::elf::build_id`]), and the bytes of
//! code no other machine could find (anonymous/JIT, deleted files, `[vdso]`; every
//! executable mapping with `--embed-code`), read from `/proc/PID/mem`.
//!
//! In: a pid. Out: [`ProcessMaps`] and [`CodeRegion`]s. A process that has exited cannot
//! be read; recorders keep the maps they read when it was alive as a fallback.
#![forbid(unsafe_code)]

use std::{collections::HashMap, fs::File, io, os::unix::fs::FileExt as _, path::PathBuf};

use serde::{Deserialize, Serialize};

use super::EmbedCode;
use super::origin::ProcessOrigin;
use crate::elf::build_id::build_id_of;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    /// `r-xp` and the like.
    pub perms: String,
    /// File offset of `start`.
    pub offset: u64,
    /// `maj:min` of the device, as printed.
    pub dev: String,
    pub inode: u64,
    /// File path, `[heap]`/`[vdso]`/`[anon:...]`, or empty for anonymous memory. A
    /// deleted file ends in ` (deleted)`.
    pub path: String,
    /// GNU build-id (hex) of the mapped ELF file, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
}

impl MapEntry {
    /// An anonymous executable mapping of `[start, end)`: JIT code, for tests.
    #[cfg(test)]
    #[must_use]
    pub fn anonymous_code(start: u64, end: u64) -> Self {
        Self {
            start,
            end,
            perms: "r-xp".to_owned(),
            offset: 0,
            dev: "00:00".to_owned(),
            inode: 0,
            path: String::new(),
            build_id: None,
        }
    }

    pub fn executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }

    /// A file on disk (not anonymous, not a pseudo mapping like `[vdso]`).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/')
    }

    pub fn deleted(&self) -> bool {
        self.path.ends_with(" (deleted)")
    }

    /// Whether `policy` wants this mapping's bytes in the snapshot.
    pub fn wants_code(&self, policy: EmbedCode) -> bool {
        if !self.executable() || self.path == "[vsyscall]" {
            return false;
        }
        match policy {
            EmbedCode::None => false,
            EmbedCode::All => true,
            EmbedCode::Auto => !self.is_file() || self.deleted(),
        }
    }
}

/// A process's maps at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMaps {
    pub pid: u32,
    /// `/proc/PID/comm`.
    pub comm: String,
    /// `/proc/PID/exe`, resolved.
    pub exe: Option<String>,
    /// `CLOCK_MONOTONIC` when the maps were read.
    pub read_at_ns: u64,
    /// Read at freeze time (`false`: the process had exited; these are older maps).
    pub at_freeze: bool,
    pub maps: Vec<MapEntry>,
    /// Its cgroup and container, read with the maps.
    #[serde(default, skip_serializing_if = "ProcessOrigin::is_empty")]
    pub origin: ProcessOrigin,
}

/// Code bytes of one executable mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeRegion {
    /// Whose code it is; [`ALL_PROCESSES`]: every process's (the kernel's, from a kcore).
    pub pid: u32,
    /// Address of the first byte.
    pub start: u64,
    pub path: String,
    #[serde(skip)]
    pub data: Vec<u8>,
}

/// [`CodeRegion::pid`] of code that is the same in every process (the kernel's): kept
/// once, not once per process.
pub const ALL_PROCESSES: u32 = u32::MAX;

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

/// Parses one `/proc/PID/maps` line; `None` for malformed lines.
pub fn parse_maps_line(line: &str) -> Option<MapEntry> {
    let mut fields = line.splitn(6, ' ');
    let (range, perms, offset, dev, inode) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let path = fields.next().unwrap_or("").trim_start().to_owned();
    let (start, end) = range.split_once('-')?;
    let (start, end) = (parse_hex(start)?, parse_hex(end)?);
    (start <= end && perms.len() == 4).then_some(())?;
    Some(MapEntry {
        start,
        end,
        perms: perms.to_owned(),
        offset: parse_hex(offset)?,
        dev: dev.to_owned(),
        inode: inode.parse().ok()?,
        path,
        build_id: None,
    })
}

/// Parses the text of `/proc/PID/maps`, skipping malformed lines.
pub fn parse_maps(text: &str) -> Vec<MapEntry> {
    text.lines().filter_map(parse_maps_line).collect()
}

/// Where the file of a mapping can be opened from here: `/proc/PID/map_files/` (works
/// for deleted files and other mount namespaces), else the path under the process root.
fn mapped_file(pid: u32, entry: &MapEntry) -> PathBuf {
    let via_map_files = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        entry.start, entry.end
    ));
    if via_map_files.exists() {
        via_map_files
    } else {
        PathBuf::from(format!("/proc/{pid}/root{}", entry.path))
    }
}

/// [`read_process`] now, for a recorder that keeps a target's maps: a process that
/// cannot be read is gone ([`super::CaptureError::NoProcess`]).
pub fn read_target(pid: u32) -> Result<ProcessMaps, super::CaptureError> {
    read_process(pid, super::monotonic_ns()).map_err(|_| super::CaptureError::NoProcess { pid })
}

/// Reads `pid`'s maps, comm and exe, with the build-id of every mapped file.
pub fn read_process(pid: u32, now_ns: u64) -> io::Result<ProcessMaps> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut maps = parse_maps(&text);
    if maps.is_empty() {
        // An exiting process (zombie) still has a maps file, but no address space: keep
        // whatever was read while it was alive instead.
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "process has no address space",
        ));
    }
    let mut ids: HashMap<String, Option<String>> = HashMap::new();
    for entry in maps.iter_mut().filter(|e| e.is_file()) {
        let id = ids
            .entry(entry.path.clone())
            .or_insert_with(|| build_id_of(&mapped_file(pid, entry)));
        entry.build_id.clone_from(id);
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_owned())
        .unwrap_or_default();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    Ok(ProcessMaps {
        pid,
        comm,
        exe,
        read_at_ns: now_ns,
        at_freeze: true,
        maps,
        origin: ProcessOrigin::read(pid),
    })
}

/// The children of every thread of `pid` (`/proc/PID/task/*/children`, Linux 3.5 with
/// `CONFIG_PROC_CHILDREN`); empty when unreadable.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// `roots` and all their living descendants (children of children, through every
/// thread), each once, roots first. A process that exits during the walk is skipped.
pub fn descendants(roots: &[u32]) -> Vec<u32> {
    let mut seen = std::collections::HashSet::new();
    let mut order = Vec::new();
    let mut queue: std::collections::VecDeque<u32> = roots.iter().copied().collect();
    while let Some(pid) = queue.pop_front() {
        if seen.insert(pid) {
            order.push(pid);
            queue.extend(children(pid));
        }
    }
    order
}

/// At most this many bytes of code per mapping are embedded.
pub const MAX_CODE_PER_MAPPING: u64 = 64 << 20;

/// The bytes of the mappings `policy` wants, read from `/proc/PID/mem`. Unreadable
/// mappings are skipped (logged at debug level).
pub fn read_code(maps: &ProcessMaps, policy: EmbedCode) -> Vec<CodeRegion> {
    let wanted: Vec<&MapEntry> = maps.maps.iter().filter(|e| e.wants_code(policy)).collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let Ok(mem) = File::open(format!("/proc/{}/mem", maps.pid)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in wanted {
        let len = (entry.end - entry.start).min(MAX_CODE_PER_MAPPING);
        let Ok(len) = usize::try_from(len) else {
            continue;
        };
        let mut data = vec![0u8; len];
        match mem.read_exact_at(&mut data, entry.start) {
            Ok(()) => out.push(CodeRegion {
                pid: maps.pid,
                start: entry.start,
                path: entry.path.clone(),
                data,
            }),
            Err(err) => log::debug!(
                "pid {}: cannot read code at {:#x} ({}): {err}",
                maps.pid,
                entry.start,
                entry.path
            ),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234    /usr/bin/cat
55d0c0a01000-55d0c0a05000 r-xp 00001000 fd:01 1234    /usr/bin/cat
7f00aa000000-7f00aa021000 rw-p 00000000 00:00 0
7f00ab000000-7f00ab001000 r-xp 00000000 00:00 0       [vdso]
7f00ac000000-7f00ac010000 r-xp 00000000 00:05 99      /memfd:jit (deleted)
garbage line
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 6);
        assert_eq!(maps[1].start, 0x55d0_c0a0_1000);
        assert_eq!(maps[1].offset, 0x1000);
        assert_eq!(maps[1].path, "/usr/bin/cat");
        assert!(maps[1].executable() && maps[1].is_file());
        assert_eq!(maps[2].path, "");
        let auto: Vec<&str> = maps
            .iter()
            .filter(|e| e.wants_code(EmbedCode::Auto))
            .map(|e| e.path.as_str())
            .collect();
        assert_eq!(auto, vec!["[vdso]", "/memfd:jit (deleted)"]);
        assert_eq!(
            maps.iter().filter(|e| e.wants_code(EmbedCode::All)).count(),
            3
        );
        assert_eq!(
            maps.iter()
                .filter(|e| e.wants_code(EmbedCode::None))
                .count(),
            0
        );
    }

    #[test]
    fn own_process_maps_have_build_ids_and_vdso_code() {
        let me = std::process::id();
        let maps = read_process(me, 1).unwrap();
        assert!(!maps.comm.is_empty());
        let exe = maps.exe.clone().unwrap();
        let text = maps
            .maps
            .iter()
            .find(|e| e.path == exe && e.executable())
            .expect("our text mapping");
        // Rust test binaries are linked with a GNU build-id by default on Linux.
        assert!(
            text.build_id.as_ref().is_some_and(|id| id.len() >= 16),
            "{text:?}"
        );
        let code = read_code(&maps, EmbedCode::Auto);
        let vdso = code.iter().find(|c| c.path == "[vdso]").expect("vdso code");
        assert_eq!(&vdso.data[..4], b"\x7fELF");
    }
}
