//! Decode, input side: the kernel records of a recording made elsewhere (perf.data's, or
//! perf sideband files beside a raw capture) as a snapshot's sideband and process maps.
//!
//! In: records one at a time, each as its kind, misc, own fields (the body before the
//! `sample_id_all` trailer) and the trailer's pid/tid, time and CPU, with the CPU whose
//! sideband it belongs to. Out ([`Builder::finish`]): per-CPU sideband streams whose
//! records all have the [`SIDEBAND_SAMPLE_TYPE`] trailer (one layout, whatever event or
//! file they came from: the snapshot names one `sample_type`), and the processes' maps
//! from `MMAP`/`MMAP2` (inherited at `FORK`, named by `COMM`), applied in time order so
//! that of two mappings at one address the later one wins even when the records come
//! from several CPUs' files or out of order in one file.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};

use crate::capture::SidebandData;
use crate::capture::mmap_records::{mmap2, overlay};
use crate::capture::procmaps::{MapEntry, ProcessMaps};
use crate::capture::records::{
    PERF_RECORD_COMM, PERF_RECORD_FORK, PERF_RECORD_MMAP2, SAMPLE_CPU, SAMPLE_TID, SAMPLE_TIME,
};

pub const PERF_RECORD_MMAP: u32 = 1;
/// `PERF_RECORD_MMAP` flag: a data mapping.
const PERF_RECORD_MISC_MMAP_DATA: u16 = 1 << 13;

/// The trailer every sideband record of an imported snapshot gets.
pub const SIDEBAND_SAMPLE_TYPE: u64 = SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU;

/// The `sample_id_all` trailer of a non-sample record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trailer {
    pub pid_tid: Option<(u32, u32)>,
    pub time: Option<u64>,
    pub cpu: Option<u32>,
}

/// One kernel record: its header's kind and misc, its own fields, its trailer.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub kind: u32,
    pub misc: u16,
    pub own: &'a [u8],
    pub trailer: Trailer,
}

/// `record` with its trailer in the [`SIDEBAND_SAMPLE_TYPE`] layout.
fn rewrite(record: &Record) -> Vec<u8> {
    let size = 8 + record.own.len() + 24;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&record.kind.to_le_bytes());
    out.extend_from_slice(&record.misc.to_le_bytes());
    out.extend_from_slice(&u16::try_from(size).unwrap_or(u16::MAX).to_le_bytes());
    out.extend_from_slice(record.own);
    let (pid, tid) = record.trailer.pid_tid.unwrap_or((u32::MAX, u32::MAX));
    out.extend_from_slice(&pid.to_le_bytes());
    out.extend_from_slice(&tid.to_le_bytes());
    out.extend_from_slice(&record.trailer.time.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&u64::from(record.trailer.cpu.unwrap_or(u32::MAX)).to_le_bytes());
    out
}

/// `PERF_RECORD_MMAP`: pid, tid, addr, len, pgoff, filename.
fn mmap(body: &[u8], misc: u16) -> Option<(u32, MapEntry)> {
    let word = |at: usize| {
        body.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let pid = u32::from_le_bytes(body.get(..4)?.try_into().ok()?);
    let (start, len, offset) = (word(8)?, word(16)?, word(24)?);
    let name = body.get(32..)?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let perms = if misc & PERF_RECORD_MISC_MMAP_DATA == 0 {
        "r-xp"
    } else {
        "rw-p"
    };
    Some((
        pid,
        MapEntry {
            start,
            end: start.checked_add(len)?,
            perms: perms.to_owned(),
            offset,
            dev: "00:00".to_owned(),
            inode: 0,
            path: String::from_utf8_lossy(&name[..end]).into_owned(),
            build_id: None,
        },
    ))
}

/// What a record does to the processes, kept until all are in (see the module doc).
#[derive(Debug, Clone)]
enum Change {
    Map(u32, MapEntry),
    Comm(u32, String),
    Fork { pid: u32, ppid: u32 },
}

impl Change {
    fn of(record: &Record) -> Option<Self> {
        match record.kind {
            PERF_RECORD_MMAP | PERF_RECORD_MMAP2 => {
                let mapped = if record.kind == PERF_RECORD_MMAP {
                    mmap(record.own, record.misc)
                } else {
                    mmap2(record.own, record.misc)
                };
                // pid -1: the kernel and its modules, whose code is not read.
                mapped
                    .filter(|(pid, _)| *pid != u32::MAX)
                    .map(|(pid, entry)| Self::Map(pid, entry))
            }
            PERF_RECORD_COMM => crate::capture::records::comm_record(record.own)
                .map(|(pid, _, name)| Self::Comm(pid, name)),
            PERF_RECORD_FORK => {
                let word = |at: usize| {
                    record
                        .own
                        .get(at..at + 4)
                        .and_then(|b| b.try_into().ok())
                        .map(u32::from_le_bytes)
                };
                let (child, parent) = (word(0)?, word(4)?);
                (child != parent).then_some(Self::Fork {
                    pid: child,
                    ppid: parent,
                })
            }
            _ => None,
        }
    }
}

/// Processes as the records build them.
#[derive(Default)]
struct Processes {
    maps: BTreeMap<u32, Vec<MapEntry>>,
    comms: HashMap<u32, String>,
}

impl Processes {
    fn apply(&mut self, change: Change) {
        match change {
            Change::Map(pid, entry) => overlay(self.maps.entry(pid).or_default(), [&entry]),
            Change::Comm(pid, name) => {
                self.comms.insert(pid, name);
            }
            Change::Fork { pid, ppid } => {
                if let Some(parent) = self.maps.get(&ppid).cloned() {
                    self.maps.insert(pid, parent);
                    if let Some(comm) = self.comms.get(&ppid).cloned() {
                        self.comms.insert(pid, comm);
                    }
                }
            }
        }
    }
}

/// Collects records into sideband streams and process changes.
#[derive(Default)]
pub struct Builder {
    sideband: BTreeMap<Option<u32>, Vec<u8>>,
    changes: Vec<(u64, Change)>,
    /// The latest record time seen.
    pub last_time: u64,
    /// Records taken.
    pub records: u64,
}

impl Builder {
    /// Takes `record` into the sideband of `cpu` (`None`: the one stream of a recording
    /// that is not per CPU) and into the processes.
    pub fn add(&mut self, record: &Record, cpu: Option<u32>) {
        self.learn(record);
        self.sideband
            .entry(cpu)
            .or_default()
            .extend(rewrite(record));
    }

    /// Takes `record` into the processes only (a record of no CPU's timeline).
    pub fn learn(&mut self, record: &Record) {
        let time = record.trailer.time.unwrap_or(0);
        self.last_time = self.last_time.max(time);
        self.records += 1;
        if let Some(change) = Change::of(record) {
            self.changes.push((time, change));
        }
    }

    /// The sideband streams and the processes (their file maps with the build-ids of
    /// `build_ids`, by path).
    pub fn finish(
        mut self,
        build_ids: &HashMap<&str, &str>,
    ) -> (Vec<SidebandData>, Vec<ProcessMaps>) {
        // Stable: records of one time (synthesized ones are all 0) keep their order.
        self.changes.sort_by_key(|(time, _)| *time);
        let mut processes = Processes::default();
        for (_, change) in self.changes {
            processes.apply(change);
        }
        let maps = processes
            .maps
            .into_iter()
            .map(|(pid, mut maps)| {
                for entry in &mut maps {
                    entry.build_id = build_ids.get(entry.path.as_str()).map(|&b| b.to_owned());
                }
                ProcessMaps {
                    pid,
                    comm: processes.comms.get(&pid).cloned().unwrap_or_default(),
                    exe: None,
                    read_at_ns: 0,
                    at_freeze: false,
                    maps,
                    origin: crate::capture::origin::ProcessOrigin::default(),
                }
            })
            .collect();
        let sideband = self
            .sideband
            .into_iter()
            .map(|(cpu, data)| SidebandData {
                cpu,
                dropped_bytes: 0,
                data,
            })
            .collect();
        (sideband, maps)
    }
}
