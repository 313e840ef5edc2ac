//! Perf maps of JIT runtimes (`/tmp/perf-PID.map`), captured at the freeze: the names of
//! code that no file holds — V8's with `--perf-basic-prof`, the JVM's after
//! `jcmd PID Compiler.perfmap`, and any runtime that writes the format perf reads.
//!
//! In: a traced process (its pid and its maps). Out: a [`PerfMap`]: the entries outside
//! the process's mapped files, each a start, a size and a name, sorted by start, for the
//! snapshot and the symbolizer.
//!
//! The file is read through the process's own root (`/proc/PID/root/tmp/perf-NSPID.map`,
//! NSPID the pid the process sees itself as: its container's pid namespace), at the freeze
//! and not later: the runtime rewrites it, and it (or the whole container) may be gone by
//! the time the trace is written. A process that exits right after its trigger can be
//! gone (or have unmapped its JIT code: Node.js does within 3 ms) before the freeze reads
//! it, so a recorder that follows its processes ([`PerfMapWatch`]) also re-reads the file
//! whenever it changed while the process lived, and the freeze takes that copy when the
//! process cannot be read any more. The reader never blocks and never follows a link at
//! the last component (a FIFO or a symbolic link planted at that path is refused), reads
//! at most [`MAX_FILE_BYTES`], and keeps at most [`MAX_ENTRIES`] entries.
//!
//! Each line is `START SIZE NAME` (hex start and size, with or without `0x`, the name to
//! the end of the line). Lines that are not are skipped and counted ([`PerfMap::malformed`]).
//! A runtime appends a line when it places code, and reuses the memory of code it freed:
//! a later line supersedes the earlier ones it overlaps (counted in
//! [`PerfMap::superseded`]). Entries inside a mapped file are left out: the file's own
//! symbols name that code. Entries in anonymous memory are kept whatever its protection
//! at the freeze (an exiting runtime's code space may already be inaccessible, V8 also
//! names bytecode on its heap).
#![forbid(unsafe_code)]

use std::{
    collections::{BTreeMap, HashMap},
    fs::{File, OpenOptions},
    io::{self, Read as _, Seek as _},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    sync::Mutex,
};

use serde::{Deserialize, Serialize};

use super::jitdump::JitdumpReader;
use super::procmaps::ProcessMaps;

/// At most this many bytes of a perf map are read (a long-running Node service writes a
/// few MiB; the rest of a bigger file is left, and [`PerfMap::truncated`] says so).
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// At most this many entries are kept per process (those at the lowest addresses).
pub const MAX_ENTRIES: usize = 1 << 18;

/// A name longer than this is cut (at a character boundary).
pub const MAX_NAME_BYTES: usize = 1024;

/// One line of a perf map: `[start, start + size)` is the code of `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfMapEntry {
    pub start: u64,
    pub size: u64,
    pub name: String,
}

impl PerfMapEntry {
    fn end(&self) -> u64 {
        self.start.saturating_add(self.size)
    }
}

/// The perf map of one process as captured at the freeze.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerfMap {
    pub pid: u32,
    /// The file as the process named it (`/tmp/perf-NSPID.map`).
    pub path: String,
    /// Lines that were not `START SIZE NAME`, skipped.
    #[serde(default)]
    pub malformed: u64,
    /// Entries left out because a later line named the same memory.
    #[serde(default)]
    pub superseded: u64,
    /// Entries left out because a mapped file holds them, or past [`MAX_ENTRIES`].
    #[serde(default)]
    pub dropped: u64,
    /// The file was longer than [`MAX_FILE_BYTES`]: its end was not read.
    #[serde(default)]
    pub truncated: bool,
    /// The entries, sorted by start, not overlapping (in the `.lbsnap`: the section's data,
    /// one `START SIZE NAME` line each).
    #[serde(skip)]
    pub entries: Vec<PerfMapEntry>,
}

/// What a perf map's text holds: the entries in file order, and the malformed lines.
#[derive(Debug, Default)]
pub struct ParsedLines {
    pub entries: Vec<PerfMapEntry>,
    pub malformed: u64,
}

/// Parses one line; `None` when it is not `START SIZE NAME` with hex numbers, a nonzero
/// size and a name, or when the range passes the end of the address space.
pub fn parse_line(line: &str) -> Option<PerfMapEntry> {
    let hex = |s: &str| {
        let s = s.strip_prefix("0x").unwrap_or(s);
        u64::from_str_radix(s, 16).ok()
    };
    let line = line.trim_end_matches(['\r', '\n']);
    let mut parts = line.splitn(3, ' ');
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?.trim();
    if size == 0 || name.is_empty() || start.checked_add(size).is_none() {
        return None;
    }
    let mut cut = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    Some(PerfMapEntry {
        start,
        size,
        name: name[..cut].to_owned(),
    })
}

/// Parses a perf map's text (bytes that are not UTF-8 are replaced), skipping and
/// counting malformed lines.
pub fn parse(bytes: &[u8]) -> ParsedLines {
    let text = String::from_utf8_lossy(bytes);
    let mut out = ParsedLines::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match parse_line(line) {
            Some(entry) => out.entries.push(entry),
            None => out.malformed += 1,
        }
    }
    out
}

/// The entries of `lines` (file order) with each one superseded by any later one it
/// overlaps, sorted by start: (kept, superseded).
fn newest_first(lines: Vec<PerfMapEntry>) -> (Vec<PerfMapEntry>, u64) {
    let mut kept: BTreeMap<u64, PerfMapEntry> = BTreeMap::new();
    let mut superseded = 0;
    for entry in lines.into_iter().rev() {
        let below = kept
            .range(..entry.end())
            .next_back()
            .is_some_and(|(_, k)| k.end() > entry.start);
        if below {
            superseded += 1;
        } else {
            kept.insert(entry.start, entry);
        }
    }
    (kept.into_values().collect(), superseded)
}

impl PerfMap {
    /// The perf map of `maps`'s process from the text of its file `path`: entries outside
    /// its mapped files, newest over older, at most [`MAX_ENTRIES`].
    #[must_use]
    pub fn from_text(maps: &ProcessMaps, path: String, bytes: &[u8], truncated: bool) -> Self {
        Self::from_parsed(maps, path, parse(bytes), truncated)
    }

    /// [`Self::from_text`] of entries already read (a perf map's lines, then a jitdump's
    /// records: later entries supersede earlier ones).
    #[must_use]
    pub fn from_parsed(
        maps: &ProcessMaps,
        path: String,
        parsed: ParsedLines,
        truncated: bool,
    ) -> Self {
        let total = parsed.entries.len() as u64;
        let (entries, superseded) = newest_first(parsed.entries);
        let files: Vec<(u64, u64)> = maps
            .maps
            .iter()
            .filter(|m| m.is_file())
            .map(|m| (m.start, m.end))
            .collect();
        let mut entries: Vec<PerfMapEntry> = entries
            .into_iter()
            .filter(|e| !files.iter().any(|&(lo, hi)| lo <= e.start && e.start < hi))
            .collect();
        entries.truncate(MAX_ENTRIES);
        let dropped = total - superseded - entries.len() as u64;
        Self {
            pid: maps.pid,
            path,
            malformed: parsed.malformed,
            superseded,
            dropped,
            truncated,
            entries,
        }
    }

    /// The entry holding `addr`, if any.
    #[must_use]
    pub fn lookup(&self, addr: u64) -> Option<&PerfMapEntry> {
        let at = self.entries.partition_point(|e| e.start <= addr);
        let entry = self.entries.get(at.checked_sub(1)?)?;
        (addr < entry.end()).then_some(entry)
    }

    /// The entries as perf map text (the `.lbsnap` section's data).
    #[must_use]
    pub fn to_text(&self) -> Vec<u8> {
        use std::fmt::Write as _;
        let mut out = String::new();
        for e in &self.entries {
            // Writing into a String cannot fail.
            let _ = writeln!(out, "{:x} {:x} {}", e.start, e.size, e.name);
        }
        out.into_bytes()
    }

    /// Sets the entries from a `.lbsnap` section's data (what [`Self::to_text`] wrote;
    /// malformed lines are skipped and counted as in a live file).
    pub fn set_text(&mut self, bytes: &[u8]) {
        let parsed = parse(bytes);
        self.malformed += parsed.malformed;
        let (entries, superseded) = newest_first(parsed.entries);
        self.superseded += superseded;
        self.entries = entries;
    }
}

/// The pid `pid` has in its own pid namespace (the last field of `NSpid:` in
/// `/proc/PID/status`, Linux 4.1); `pid` itself where the line is missing.
fn namespace_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let Some(line) = status.lines().find(|l| l.starts_with("NSpid:")) else {
        return Some(pid);
    };
    line.split_whitespace().last()?.parse().ok()
}

/// Opens the regular file at `path` without blocking and without following a link at
/// its last component (a FIFO or a symbolic link planted there is refused).
fn open_regular(path: &str) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Reads a regular file at `path` without blocking and without following a link at its
/// last component: at most [`MAX_FILE_BYTES`], and whether there was more.
fn read_bounded(path: &str) -> io::Result<(Vec<u8>, bool)> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    let truncated = bytes.len() as u64 > MAX_FILE_BYTES;
    if truncated {
        // Up to the last whole line within the bound.
        let end = bytes[..usize::try_from(MAX_FILE_BYTES).unwrap_or(usize::MAX)]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        bytes.truncate(end);
    }
    Ok((bytes, truncated))
}

/// Where `pid`'s perf map is, seen from here: (the path in its root, the path it names).
fn paths_of(pid: u32) -> Option<(String, String)> {
    let own = format!("/tmp/perf-{}.map", namespace_pid(pid)?);
    Some((format!("/proc/{pid}/root{own}"), own))
}

/// Whether the process of `maps` has JIT code: an anonymous executable mapping.
fn has_jit_code(maps: &ProcessMaps) -> bool {
    maps.maps
        .iter()
        .any(|m| m.executable() && (m.path.is_empty() || m.path.starts_with("[anon:")))
}

/// The jitdump file the process of `maps` writes, as it names it: the mapping of a file
/// named `jit-N.dump` (the runtime maps it so that perf finds it), when there is one.
fn jitdump_of(maps: &ProcessMaps) -> Option<String> {
    maps.maps
        .iter()
        .filter(|m| m.is_file())
        .map(|m| m.path.as_str())
        .find(|path| {
            let name = path.rsplit('/').next().unwrap_or_default();
            name.strip_prefix("jit-")
                .and_then(|n| n.strip_suffix(".dump"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
}

/// Reads `path` (through `/proc/PID/root`) with [`read_bounded`]; `None` when it is not
/// there, logging other errors.
fn read_in_root(pid: u32, path: &str) -> Option<(Vec<u8>, bool)> {
    let seen = format!("/proc/{pid}/root{path}");
    match read_bounded(&seen) {
        Ok(read) => Some(read),
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                log::debug!("pid {pid}: {path}: {e}");
            }
            None
        }
    }
}

/// A process's jitdump as read so far: the file (its inode), and the reader.
#[derive(Debug)]
struct JitWatch {
    /// The file as the process names it.
    path: String,
    inode: u64,
    reader: JitdumpReader,
    /// The file passed [`MAX_FILE_BYTES`]: the rest is not read.
    truncated: bool,
}

impl JitWatch {
    /// Reads what the jitdump of `maps`'s process gained since `watch` last read it (all
    /// of it when it is a new file): each byte once, whole records, at most
    /// [`MAX_FILE_BYTES`]. `watch` is cleared when the process maps none.
    fn read_more(watch: &mut Option<Self>, maps: &ProcessMaps) {
        let Some(path) = jitdump_of(maps) else {
            *watch = None;
            return;
        };
        let seen = format!("/proc/{}/root{path}", maps.pid);
        let Ok(mut file) = open_regular(&seen) else {
            return;
        };
        let Ok(meta) = file.metadata() else {
            return;
        };
        if watch
            .as_ref()
            .is_none_or(|w| w.inode != meta.ino() || w.path != path || meta.len() < w.reader.offset)
        {
            *watch = Some(Self {
                path,
                inode: meta.ino(),
                reader: JitdumpReader::default(),
                truncated: false,
            });
        }
        let Some(w) = watch.as_mut() else {
            return;
        };
        let budget = MAX_FILE_BYTES.saturating_sub(w.reader.offset);
        if w.reader.ended || meta.len() <= w.reader.offset || budget == 0 {
            w.truncated |= budget == 0 && meta.len() > w.reader.offset;
            return;
        }
        let mut bytes = Vec::new();
        let read = file
            .seek(io::SeekFrom::Start(w.reader.offset))
            .and_then(|_| (&mut file).take(budget).read_to_end(&mut bytes));
        if let Err(e) = read {
            log::debug!("pid {}: {}: {e}", maps.pid, w.path);
            return;
        }
        if let Err(e) = w.reader.feed(&bytes) {
            log::debug!("pid {}: {}: {e}", maps.pid, w.path);
            w.reader.ended = true;
        }
        w.truncated |= meta.len() > MAX_FILE_BYTES;
    }
}

/// The perf map of `maps`'s process from its perf map file (read now) and its jitdump as
/// `jit` has read it: the jitdump's entries over the map's where they overlap. `None`
/// when neither names any of its code.
fn combined(maps: &ProcessMaps, jit: Option<&JitWatch>) -> Option<PerfMap> {
    let (_, own) = paths_of(maps.pid)?;
    let mut parsed = ParsedLines::default();
    let mut paths = Vec::new();
    let mut truncated = false;
    if let Some((bytes, cut)) = read_in_root(maps.pid, &own) {
        parsed = parse(&bytes);
        truncated |= cut;
        paths.push(own);
    }
    if let Some(jit) = jit.filter(|j| j.reader.offset > 0) {
        parsed
            .entries
            .extend(jit.reader.entries.iter().map(|c| PerfMapEntry {
                start: c.start,
                size: c.size,
                name: c.name.clone(),
            }));
        parsed.malformed += jit.reader.malformed;
        truncated |= jit.truncated;
        paths.push(jit.path.clone());
    }
    if paths.is_empty() {
        return None;
    }
    let map = PerfMap::from_parsed(maps, paths.join(" "), parsed, truncated);
    log::debug!(
        "pid {}: perf map {}: {} entries kept, {} malformed, {} superseded, {} in mapped files{}",
        map.pid,
        map.path,
        map.entries.len(),
        map.malformed,
        map.superseded,
        map.dropped,
        if map.truncated { ", truncated" } else { "" }
    );
    (!map.entries.is_empty()).then_some(map)
}

/// The perf map of the living process of `maps`, read now — its `/tmp/perf-NSPID.map`
/// and the jitdump it maps — when they name some of its code. `None` when it writes
/// neither, has exited, or the files are not regular files.
#[must_use]
pub fn capture(maps: &ProcessMaps) -> Option<PerfMap> {
    let mut jit = None;
    JitWatch::read_more(&mut jit, maps);
    combined(maps, jit.as_ref())
}

/// A file's identity and version: inode, size, modification time.
type Stamp = (u64, u64, i64, i64);

/// The [`Stamp`] of the file at `path` seen from here, `None` when it is not there.
fn stamp_of(path: &str) -> Option<Stamp> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    Some((meta.ino(), meta.len(), meta.mtime(), meta.mtime_nsec()))
}

/// What [`PerfMapWatch`] last read of one process.
#[derive(Debug)]
struct Seen {
    /// The perf map's and the jitdump's.
    stamp: (Option<Stamp>, Option<Stamp>),
    map: Option<PerfMap>,
}

/// The perf maps of a recorder's processes as last read while they lived, for the
/// snapshot of a process that is gone (or has unmapped its code) by the freeze.
///
/// Cost: one `stat` of each file per process with JIT code per [`Self::refresh`]; a
/// changed perf map is read again whole, a jitdump only from where it was last read.
#[derive(Debug, Default)]
pub struct PerfMapWatch {
    seen: HashMap<u32, Seen>,
    /// Each process's jitdump as read so far (the freeze reads on from there too).
    jit: Mutex<HashMap<u32, JitWatch>>,
}

impl PerfMapWatch {
    /// Re-reads the perf map of `maps`'s process when its file changed since the last
    /// look, and what its jitdump gained; a process without JIT code or without either
    /// file costs one look at its maps.
    pub fn refresh(&mut self, maps: &ProcessMaps) {
        if !has_jit_code(maps) {
            return;
        }
        let Some((path, _)) = paths_of(maps.pid) else {
            return;
        };
        let dump = jitdump_of(maps).map(|d| format!("/proc/{}/root{d}", maps.pid));
        let stamp = (stamp_of(&path), dump.as_deref().and_then(stamp_of));
        if stamp == (None, None) {
            return;
        }
        if self.seen.get(&maps.pid).is_some_and(|s| s.stamp == stamp) {
            return;
        }
        let map = self.read_now(maps);
        self.seen.insert(maps.pid, Seen { stamp, map });
    }

    /// The perf map of `maps`'s process read now: its perf map file whole, its jitdump
    /// from where it was last read.
    fn read_now(&self, maps: &ProcessMaps) -> Option<PerfMap> {
        let mut jits = self
            .jit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut jit = jits.remove(&maps.pid);
        JitWatch::read_more(&mut jit, maps);
        let map = combined(maps, jit.as_ref());
        if let Some(jit) = jit {
            jits.insert(maps.pid, jit);
        }
        map
    }

    /// The perf map for a snapshot of `maps`'s process: read now while it can be, else as
    /// last read by [`Self::refresh`] (it may lack the lines written since).
    pub fn at_freeze(&self, maps: &ProcessMaps) -> Option<PerfMap> {
        self.read_now(maps)
            .or_else(|| self.seen.get(&maps.pid).and_then(|s| s.map.clone()))
    }

    /// Forgets process `pid` (gone, and its snapshot's time past).
    pub fn forget(&mut self, pid: u32) {
        self.seen.remove(&pid);
        self.jit
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::MapEntry;

    fn maps_with_jit(start: u64, end: u64) -> ProcessMaps {
        let entry = |start, end, perms: &str, path: &str| MapEntry {
            start,
            end,
            perms: perms.to_owned(),
            offset: 0,
            dev: "00:00".to_owned(),
            inode: 0,
            path: path.to_owned(),
            build_id: None,
        };
        ProcessMaps {
            pid: 7,
            comm: "node".to_owned(),
            exe: None,
            read_at_ns: 0,
            at_freeze: true,
            maps: vec![
                entry(0x40_0000, 0x50_0000, "r-xp", "/usr/bin/node"),
                entry(start, end, "r-xp", ""),
                entry(0x9000_0000, 0x9100_0000, "rw-p", ""),
            ],
            origin: super::super::origin::ProcessOrigin::default(),
        }
    }

    /// V8's lines (`--perf-basic-prof`) and the JVM's (`Compiler.perfmap`) parse; junk,
    /// a zero size and a range past the address space are skipped and counted.
    #[test]
    fn lines_of_v8_and_hotspot_parse_and_bad_lines_are_counted() {
        let text = b"3ec0095cbb5e 66 JS:~handleRequest /app.js:3:23\n\
            0x00007f3c2d000000 0x0000000000000180 void Jit.handleRequest(int)\n\
            zz 10 bad\n\
            1000 0 empty\n\
            1000 10\n\
            ffffffffffffffff 2 wraps\n\
            \n\
            2000 8 na\xffme\n";
        let parsed = parse(text);
        assert_eq!(parsed.malformed, 4);
        assert_eq!(parsed.entries.len(), 3);
        assert_eq!(parsed.entries[0].start, 0x3ec0_095c_bb5e);
        assert_eq!(parsed.entries[0].name, "JS:~handleRequest /app.js:3:23");
        assert_eq!(parsed.entries[1].size, 0x180);
        assert_eq!(parsed.entries[1].name, "void Jit.handleRequest(int)");
        assert_eq!(
            parsed.entries[2].name, "na\u{fffd}me",
            "bytes that are not UTF-8"
        );
    }

    /// A later line over memory an earlier one named wins: the runtime reused it. Lines
    /// in a mapped file are left to its symbols; those in anonymous memory stay, whatever
    /// its protection now.
    #[test]
    fn a_later_line_supersedes_the_earlier_ones_it_overlaps() {
        let maps = maps_with_jit(0x7000, 0x9000);
        let text = b"7000 100 old\n7080 100 newer\n7400 10 other\n90000000 10 on the heap\n\
            400100 10 in node's text\n";
        let map = PerfMap::from_text(&maps, "/tmp/perf-7.map".to_owned(), text, false);
        let names: Vec<&str> = map.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["newer", "other", "on the heap"]);
        assert_eq!((map.superseded, map.dropped), (1, 1));
        assert_eq!(map.lookup(0x7080).map(|e| e.name.as_str()), Some("newer"));
        assert_eq!(map.lookup(0x717f).map(|e| e.name.as_str()), Some("newer"));
        assert!(map.lookup(0x7180).is_none());
        assert!(map.lookup(0x7000).is_none(), "the old entry is gone");
        assert_eq!(map.lookup(0x7405).map(|e| e.name.as_str()), Some("other"));
        assert!(map.lookup(0).is_none());
    }

    /// What the snapshot keeps reads back the same.
    #[test]
    fn the_text_written_to_the_snapshot_reads_back() {
        let maps = maps_with_jit(0x7000, 0x9000);
        let text = b"7000 100 JS:*outer /app.js:8:15\n7400 10 Interpreter\n";
        let map = PerfMap::from_text(&maps, "/tmp/perf-7.map".to_owned(), text, false);
        let mut back = PerfMap {
            entries: Vec::new(),
            ..map.clone()
        };
        back.set_text(&map.to_text());
        assert_eq!(back, map);
    }

    /// This process's own perf map, written where the runtime would, is captured through
    /// its root; the watch's copy outlives the file; a FIFO in its place is refused
    /// without blocking.
    #[test]
    fn a_live_process_map_is_read_through_its_root_and_a_fifo_is_refused() {
        let me = std::process::id();
        let Ok(mut maps) = crate::capture::procmaps::read_process(me, 0) else {
            return;
        };
        maps.maps.push(MapEntry::anonymous_code(0x1000, 0x2000));
        let nspid = namespace_pid(me).expect("own NSpid");
        let path = format!("/tmp/perf-{nspid}.map");
        std::fs::write(&path, "1000 20 JS:~mine /t.js:1:1\nbad line\n").expect("write");
        let map = capture(&maps);
        let mut watch = PerfMapWatch::default();
        watch.refresh(&maps);
        let _ = std::fs::remove_file(&path);
        let map = map.expect("own perf map");
        assert_eq!(
            watch.at_freeze(&maps),
            Some(map.clone()),
            "the copy read while it lived"
        );
        watch.forget(me);
        assert_eq!(watch.at_freeze(&maps), None);
        assert_eq!(map.path, path);
        assert_eq!(map.malformed, 1);
        assert_eq!(
            map.lookup(0x1010).map(|e| e.name.as_str()),
            Some("JS:~mine /t.js:1:1")
        );
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        if made.is_ok_and(|s| s.success()) {
            assert!(capture(&maps).is_none(), "a FIFO is no perf map");
            let _ = std::fs::remove_file(&path);
        }
    }
}
