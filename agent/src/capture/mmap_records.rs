//! The maps of a process that died before the freeze, rebuilt from the rings' records.
//!
//! A process killed by a fault right after it started (a crash at start-up, `workload
//! segv`) is gone before `/proc/PID/maps` can be read at the freeze, and the maps read
//! earlier may be from before its exec (lookback's own child waiting to exec the command):
//! its addresses then fall outside them, and its samples and trigger stack come out
//! empty. The kernel wrote a `PERF_RECORD_MMAP2` for every executable mapping the new
//! program made, after the `PERF_RECORD_COMM` of its exec, into the same rings; those
//! are its maps, as perf reconstructs them.
//!
//! The same records complete maps read from `/proc` while the dynamic loader was still
//! mapping the libraries (the recorder's poll between exec and `main`): what was mapped
//! after that read is laid over it ([`overlay`]); without that, a process that faults
//! in `main` a millisecond later had no libc in its maps, and its trigger stack was cut
//! and misnamed.
//!
//! In: the copied record streams, their `sample_type` (for the `sample_id_all` trailer)
//! and a pid. Out: the pid's exec time and the [`MapEntry`]s mapped after it, each with
//! its time.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};

use super::procmaps::MapEntry;
use super::records::{self, PERF_RECORD_COMM, PERF_RECORD_MISC_COMM_EXEC, PERF_RECORD_MMAP2};

/// `PERF_RECORD_MMAP2` flag: the record carries a build-id instead of device and inode.
const MMAP_BUILD_ID: u16 = 1 << 14;

/// What the records say about one process since its last exec.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordedMaps {
    /// When it last exec'd, with the name it got (`None`: no exec in the records).
    pub exec: Option<(u64, String)>,
    /// Executable mappings made since (all of them without an exec), by address.
    pub maps: Vec<Mapped>,
}

/// One mapping of a `PERF_RECORD_MMAP2`, and when it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// The record's time (the recorder's clock, as [`super::procmaps::ProcessMaps::read_at_ns`]).
    pub at_ns: u64,
    pub entry: MapEntry,
}

impl RecordedMaps {
    /// The mappings made at or after `ns`.
    pub fn since(&self, ns: u64) -> impl Iterator<Item = &MapEntry> {
        self.maps
            .iter()
            .filter(move |m| m.at_ns >= ns)
            .map(|m| &m.entry)
    }
}

/// `maps` (sorted by address) with `later` mappings laid over them, as the kernel does: a
/// mapping replaces whatever it overlaps.
pub fn overlay<'a>(maps: &mut Vec<MapEntry>, later: impl IntoIterator<Item = &'a MapEntry>) {
    for entry in later {
        maps.retain(|m| m.end <= entry.start || m.start >= entry.end);
        let at = maps.partition_point(|m| m.start < entry.start);
        maps.insert(at, entry.clone());
    }
}

/// The exec and mappings of `pid` in `streams` (records with a `sample_id_all` trailer
/// of `sample_type`, oldest first within each stream).
pub fn recorded_maps<'a>(
    pid: u32,
    sample_type: u64,
    streams: impl IntoIterator<Item = &'a [u8]>,
) -> RecordedMaps {
    recorded_maps_of(&BTreeSet::from([pid]), sample_type, streams)
        .remove(&pid)
        .unwrap_or_default()
}

/// [`recorded_maps`] of every process in `pids`, in one pass over `streams` (a snapshot
/// of a rule's peers: hundreds of processes gone before the freeze).
pub fn recorded_maps_of<'a>(
    pids: &BTreeSet<u32>,
    sample_type: u64,
    streams: impl IntoIterator<Item = &'a [u8]>,
) -> BTreeMap<u32, RecordedMaps> {
    let mut recorded: BTreeMap<u32, Vec<(u64, MapEntry)>> = BTreeMap::new();
    let mut execs: BTreeMap<u32, (u64, String)> = BTreeMap::new();
    for stream in streams {
        for record in records::records(stream) {
            let time = records::id_trailer(sample_type, record.body).and_then(|(_, t)| t);
            match record.kind {
                PERF_RECORD_COMM if record.misc & PERF_RECORD_MISC_COMM_EXEC != 0 => {
                    let Some((p, _, name)) = records::comm_record(record.body) else {
                        continue;
                    };
                    if let (true, Some(t)) = (pids.contains(&p), time)
                        && execs.get(&p).is_none_or(|(old, _)| t > *old)
                    {
                        execs.insert(p, (t, name));
                    }
                }
                PERF_RECORD_MMAP2 => {
                    if let Some((p, entry)) = mmap2(record.body, record.misc)
                        && pids.contains(&p)
                    {
                        recorded
                            .entry(p)
                            .or_default()
                            .push((time.unwrap_or(0), entry));
                    }
                }
                _ => {}
            }
        }
    }
    let found: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|p| recorded.contains_key(p) || execs.contains_key(p))
        .collect();
    found
        .into_iter()
        .map(|pid| {
            let exec = execs.remove(&pid);
            let since = exec.as_ref().map_or(0, |(t, _)| *t);
            let mut maps: Vec<Mapped> = recorded
                .remove(&pid)
                .unwrap_or_default()
                .into_iter()
                .filter(|(t, _)| *t >= since)
                .map(|(at_ns, entry)| Mapped { at_ns, entry })
                .collect();
            // Of mappings at the same start, the latest stays (the streams are per CPU, so
            // record order is not time order).
            maps.sort_by_key(|m| (m.entry.start, m.at_ns));
            maps.dedup_by(|later, earlier| {
                let same = later.entry.start == earlier.entry.start;
                if same {
                    std::mem::swap(later, earlier);
                }
                same
            });
            (pid, RecordedMaps { exec, maps })
        })
        .collect()
}

/// `PERF_RECORD_MMAP2`: pid, tid, addr, len, pgoff, (maj, min, ino, `ino_generation`) or a
/// build-id, prot, flags, filename.
pub fn mmap2(body: &[u8], misc: u16) -> Option<(u32, MapEntry)> {
    let u32_at = |at: usize| {
        body.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let u64_at = |at: usize| {
        body.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let pid = u32_at(0)?;
    let (start, len, offset) = (u64_at(8)?, u64_at(16)?, u64_at(24)?);
    let (dev, inode) = if misc & MMAP_BUILD_ID == 0 {
        (
            format!("{:02x}:{:02x}", u32_at(32)?, u32_at(36)?),
            u64_at(40)?,
        )
    } else {
        ("00:00".to_owned(), 0)
    };
    let (prot, flags) = (u32_at(56)?, u32_at(60)?);
    let name = body.get(64..)?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let perms = format!(
        "{}{}{}{}",
        if prot & 1 != 0 { 'r' } else { '-' },
        if prot & 2 != 0 { 'w' } else { '-' },
        if prot & 4 != 0 { 'x' } else { '-' },
        // MAP_SHARED is 1.
        if flags & 1 != 0 { 's' } else { 'p' },
    );
    Some((
        pid,
        MapEntry {
            start,
            end: start.checked_add(len)?,
            perms,
            offset,
            dev,
            inode,
            path: String::from_utf8_lossy(&name[..end]).into_owned(),
            build_id: None,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::records::{SAMPLE_TID, SAMPLE_TIME};

    const ST: u64 = SAMPLE_TID | SAMPLE_TIME;

    fn record(kind: u32, misc: u16, body: &[u8], pid: u32, time: u64) -> Vec<u8> {
        let mut body = body.to_vec();
        body.extend((u64::from(pid) << 32 | u64::from(pid)).to_le_bytes());
        body.extend(time.to_le_bytes());
        let mut r = kind.to_le_bytes().to_vec();
        r.extend(misc.to_le_bytes());
        r.extend(u16::try_from(8 + body.len()).unwrap().to_le_bytes());
        r.extend(body);
        r
    }

    fn mmap2_body(pid: u32, start: u64, path: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(pid.to_le_bytes());
        b.extend(pid.to_le_bytes());
        for v in [start, 0x2000, 0x1000] {
            b.extend(v.to_le_bytes());
        }
        b.extend(8u32.to_le_bytes()); // maj
        b.extend(1u32.to_le_bytes()); // min
        b.extend(77u64.to_le_bytes()); // ino
        b.extend(0u64.to_le_bytes()); // ino generation
        b.extend(5u32.to_le_bytes()); // PROT_READ | PROT_EXEC
        b.extend(2u32.to_le_bytes()); // MAP_PRIVATE
        b.extend(path.as_bytes());
        b.resize(b.len().next_multiple_of(8) + 8, 0);
        b
    }

    fn comm_body(pid: u32, name: &str) -> Vec<u8> {
        let mut b = pid.to_le_bytes().to_vec();
        b.extend(pid.to_le_bytes());
        b.extend(name.as_bytes());
        b.resize(16, 0);
        b
    }

    #[test]
    fn one_pass_rebuilds_the_maps_of_several_processes() {
        let mut stream = Vec::new();
        for (pid, name, start) in [(9, "a", 0x5000), (4, "b", 0x9000), (7, "c", 0x3000)] {
            stream.extend(record(
                PERF_RECORD_COMM,
                PERF_RECORD_MISC_COMM_EXEC,
                &comm_body(pid, name),
                pid,
                10,
            ));
            stream.extend(record(
                PERF_RECORD_MMAP2,
                0,
                &mmap2_body(pid, start, "/usr/bin/x"),
                pid,
                20,
            ));
        }
        let all = recorded_maps_of(&BTreeSet::from([4, 9, 11]), ST, [stream.as_slice()]);
        // 7 was not asked for, 11 has no records.
        assert_eq!(all.keys().copied().collect::<Vec<_>>(), vec![4, 9]);
        for (pid, start) in [(4, 0x9000), (9, 0x5000)] {
            assert_eq!(all[&pid], recorded_maps(pid, ST, [stream.as_slice()]));
            assert_eq!(all[&pid].maps[0].entry.start, start);
        }
    }

    #[test]
    fn mappings_after_the_last_exec_are_the_maps() {
        let mut stream = record(
            PERF_RECORD_MMAP2,
            0,
            &mmap2_body(9, 0x1000, "/usr/bin/old"),
            9,
            10,
        );
        stream.extend(record(
            PERF_RECORD_COMM,
            PERF_RECORD_MISC_COMM_EXEC,
            &comm_body(9, "new"),
            9,
            20,
        ));
        stream.extend(record(
            PERF_RECORD_MMAP2,
            0,
            &mmap2_body(9, 0x5000, "/usr/bin/new"),
            9,
            30,
        ));
        stream.extend(record(
            PERF_RECORD_MMAP2,
            0,
            &mmap2_body(4, 0x9000, "/usr/bin/other"),
            4,
            31,
        ));
        let got = recorded_maps(9, ST, [stream.as_slice()]);
        assert_eq!(got.exec, Some((20, "new".to_owned())));
        assert_eq!(got.maps.len(), 1, "{got:?}");
        let m = &got.maps[0].entry;
        assert_eq!(got.maps[0].at_ns, 30);
        assert_eq!((m.start, m.end, m.offset), (0x5000, 0x7000, 0x1000));
        assert_eq!(
            (m.perms.as_str(), m.dev.as_str(), m.inode),
            ("r-xp", "08:01", 77)
        );
        assert_eq!(m.path, "/usr/bin/new");
        assert!(m.executable());
        // Garbage and short records are skipped, never a panic.
        for cut in 0..stream.len() {
            let _ = recorded_maps(9, ST, [&stream[..cut]]);
        }
    }

    fn entry(start: u64, end: u64, path: &str) -> MapEntry {
        MapEntry {
            start,
            end,
            perms: "r-xp".to_owned(),
            offset: 0,
            dev: "08:01".to_owned(),
            inode: 1,
            path: path.to_owned(),
            build_id: None,
        }
    }

    #[test]
    fn later_mappings_are_laid_over_maps_read_earlier() {
        // Read while ld.so was at work: the program and ld.so, not libc yet.
        let mut maps = vec![
            entry(0x1000, 0x2000, "/bin/w"),
            entry(0x7000, 0x9000, "/lib/ld.so"),
        ];
        let libc = entry(0x4000, 0x6000, "/lib/libc.so.6");
        // A later mapping over part of the program replaces what it overlaps.
        let over = entry(0x1800, 0x3000, "/lib/x.so");
        overlay(&mut maps, [&libc, &over]);
        let paths: Vec<&str> = maps.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(paths, ["/lib/x.so", "/lib/libc.so.6", "/lib/ld.so"]);
        assert!(maps.is_sorted_by_key(|m| m.start));
    }

    #[test]
    fn since_gives_the_mappings_after_a_read_and_the_latest_at_one_address_wins() {
        let mut stream = Vec::new();
        for (time, start, path) in [
            (30, 0x5000, "/lib/b.so"),
            (10, 0x5000, "/lib/a.so"),
            (20, 0x9000, "/lib/c.so"),
        ] {
            stream.extend(record(
                PERF_RECORD_MMAP2,
                0,
                &mmap2_body(9, start, path),
                9,
                time,
            ));
        }
        let got = recorded_maps(9, ST, [stream.as_slice()]);
        let paths: Vec<&str> = got.since(0).map(|m| m.path.as_str()).collect();
        assert_eq!(paths, ["/lib/b.so", "/lib/c.so"], "{got:?}");
        let later: Vec<&str> = got.since(25).map(|m| m.path.as_str()).collect();
        assert_eq!(later, ["/lib/b.so"]);
    }
}
