//! Decode, input side: a raw Intel PT capture (AUX bytes, oldest first) and the code it
//! ran as a [`Snapshot`], so that `lookback decode --pt FILE ... -o OUT` writes the same
//! timeline as a snapshot does.
//!
//! In: the traces (one per CPU), the code, as `--elf FILE[:BASE]` (each loadable,
//! executable segment of an ELF file, relocated as Intel's ptxed does: with BASE, the
//! lowest loadable segment at BASE; without, at the addresses the file gives) and `--raw
//! FILE[:OFFSET[-END]]:ADDR` (bytes without a format), and optionally perf sideband files
//! (perf's kernel records as libipt's `perf-read-sideband.bash` cuts them out of a
//! perf.data, or as a tool of one's own wrote them). Out: a snapshot of one AUX ring per
//! trace, one process (pid 0, named after the first trace) whose maps are the code given,
//! ELF segments named by their file (so the symbol stage names their functions), raw
//! bytes embedded as `[raw] FILE` (no symbols). Without sideband each ring is one
//! track; with it ([`add_sideband`]) its records are each CPU's thread timeline and the
//! processes' maps, as in a perf.data (`super::sideband`), the code given being in every
//! process.
#![forbid(unsafe_code)]

use object::{Object as _, ObjectSegment as _, SegmentFlags};

use super::sideband::{self, SIDEBAND_SAMPLE_TYPE, Trailer};
use crate::capture::procmaps::{CodeRegion, MapEntry, ProcessMaps};
use crate::capture::{ClockConversion, RecorderParams, RingData, RingKind};
use crate::decode::pt::flow::image::RawSpec;
use crate::decode::pt::sideband::pevent::{PeventConfig, PeventError, has_trailer, read_record};
use crate::decode::pt::sideband::sb_context::Abi;
use crate::snapshot::{Metadata, Snapshot};

/// `PF_X`.
const PF_X: u32 = 1;

/// An `--elf FILE[:BASE]` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfSpec {
    pub path: String,
    pub base: Option<u64>,
}

/// Why code given for a raw trace cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RawCodeError {
    #[error("{path}: not an ELF file ({reason})")]
    NotElf { path: String, reason: String },
    #[error("{path}: no loadable, executable segment")]
    NoCode { path: String },
}

impl ElfSpec {
    /// `FILE` or `FILE:BASE` (BASE in C notation: `0x400000`, `4194304`); a suffix that is
    /// not a number is part of the name.
    pub fn parse(arg: &str) -> Self {
        if let Some((path, base)) = arg.rsplit_once(':')
            && let Some(base) = crate::decode::pt::packets::cpu::parse_c_uint(base)
            && !path.is_empty()
        {
            return Self {
                path: path.to_owned(),
                base: Some(base),
            };
        }
        Self {
            path: arg.to_owned(),
            base: None,
        }
    }

    /// The executable segments of `file` (this spec's file, read by the caller) as maps
    /// and their bytes.
    pub fn segments(&self, file: &[u8]) -> Result<Vec<(MapEntry, Vec<u8>)>, RawCodeError> {
        let elf = object::File::parse(file).map_err(|err| RawCodeError::NotElf {
            path: self.path.clone(),
            reason: err.to_string(),
        })?;
        let lowest = elf.segments().map(|s| s.address()).min().unwrap_or(0);
        let bias = self.base.map_or(0, |base| base.wrapping_sub(lowest));
        let build_id = crate::elf::build_id::build_id_hex(&elf);
        let mut out = Vec::new();
        for segment in elf.segments() {
            let executable =
                matches!(segment.flags(), SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0);
            let (offset, size) = segment.file_range();
            let bytes = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(size).ok())
                .and_then(|(from, len)| file.get(from..from.checked_add(len)?));
            let Some(bytes) = bytes.filter(|b| executable && !b.is_empty()) else {
                continue;
            };
            let start = segment.address().wrapping_add(bias);
            out.push((
                MapEntry {
                    start,
                    end: start.saturating_add(size),
                    perms: "r-xp".to_owned(),
                    offset,
                    dev: "00:00".to_owned(),
                    inode: 0,
                    path: self.path.clone(),
                    build_id: build_id.clone(),
                },
                bytes.to_vec(),
            ));
        }
        if out.is_empty() {
            return Err(RawCodeError::NoCode {
                path: self.path.clone(),
            });
        }
        Ok(out)
    }
}

/// The map and bytes of a `--raw` spec over `file` (its bytes).
pub fn raw_segment(spec: &RawSpec, file: &[u8]) -> (MapEntry, Vec<u8>) {
    let bytes = spec.slice(file).to_vec();
    (
        MapEntry {
            start: spec.addr,
            end: spec.addr.saturating_add(bytes.len() as u64),
            perms: "r-xp".to_owned(),
            offset: spec.offset,
            dev: "00:00".to_owned(),
            inode: 0,
            path: format!("[raw] {}", spec.path),
            build_id: None,
        },
        bytes,
    )
}

/// Raw traces (each with the CPU it was recorded on) over `code` (maps and bytes, later
/// ones over earlier ones where they overlap), for a process named `name`.
pub fn snapshot(
    traces: Vec<(u32, Vec<u8>)>,
    code: Vec<(MapEntry, Vec<u8>)>,
    name: &str,
) -> Snapshot {
    let mut maps = Vec::new();
    let mut regions = Vec::new();
    for (entry, bytes) in code {
        regions.push(CodeRegion {
            pid: 0,
            start: entry.start,
            path: entry.path.clone(),
            data: bytes,
        });
        crate::capture::mmap_records::overlay(&mut maps, [&entry]);
    }
    // The embedded bytes of a map that a later one cut are found by its start; a map cut
    // at its start keeps no bytes (the later code shadows it there anyway).
    regions.retain(|r| maps.iter().any(|m| m.start == r.start && m.path == r.path));
    let recorder = RecorderParams {
        event: "intel_pt".to_owned(),
        buffer_size: traces
            .iter()
            .map(|(_, t)| t.len() as u64)
            .max()
            .unwrap_or(0),
        cpus: traces.iter().map(|(cpu, _)| *cpu).collect(),
        ..RecorderParams::default()
    };
    Snapshot {
        meta: Metadata {
            lookback_version: env!("CARGO_PKG_VERSION").to_owned(),
            kernel: String::new(),
            backend: crate::capture::Backend::IntelPt,
            recorder,
            trigger: None,
            trigger_to_freeze_ns: None,
            freeze_time_ns: 0,
            pause_duration_ns: 0,
            clock: None,
            window_start_ns: None,
            window_end_ns: None,
            debug_dirs: Vec::new(),
            debuginfod: crate::elf::debuginfod::Servers::FromEnv,
            kernel_symbols: Vec::new(),
            origin: None,
        },
        rings: traces
            .into_iter()
            .map(|(cpu, data)| RingData {
                kind: RingKind::Aux,
                cpu: Some(cpu),
                tid: None,
                wrapped: false,
                records: 0,
                stop: None,
                data,
            })
            .collect(),
        sideband: Vec::new(),
        maps: vec![ProcessMaps {
            pid: 0,
            comm: name.to_owned(),
            exe: None,
            read_at_ns: 0,
            at_freeze: false,
            maps,
            origin: crate::capture::origin::ProcessOrigin::default(),
        }],
        code: regions,
        perf_maps: Vec::new(),
    }
}

/// A perf sideband file: its bytes, how its records are laid out and timed, and the CPU
/// its records belong to when they do not say (no `SAMPLE_CPU`; `None`: their maps count,
/// they are no CPU's timeline).
#[derive(Debug, Clone)]
pub struct SidebandFile<'a> {
    pub name: &'a str,
    pub data: &'a [u8],
    pub config: &'a PeventConfig,
    pub cpu: Option<u32>,
}

/// What [`add_sideband`] took, and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SidebandSummary {
    /// Records taken.
    pub records: u64,
    /// Records of kinds without a known layout, passed over.
    pub skipped: u64,
    /// Per file that could not be read to its end: why, and where it stopped.
    pub problems: Vec<String>,
}

/// Adds the records of `files` to `snap` (made by [`snapshot`]): each record goes to the
/// sideband of its CPU (its `SAMPLE_CPU`, else its file's CPU), and all of them make the
/// processes' maps, over which the code given for the trace is laid (in every process:
/// the user said the trace ran it). The perf-time conversion of the first file becomes
/// the snapshot's clock. A file that stops being readable (a record whose size or layout
/// does not fit) keeps the records before it, and the summary says where it stopped.
pub fn add_sideband(snap: &mut Snapshot, files: &[SidebandFile]) -> SidebandSummary {
    let mut builder = sideband::Builder::default();
    let mut summary = SidebandSummary::default();
    for file in files {
        let mut at = 0;
        while let Some(rest) = file.data.get(at..).filter(|r| !r.is_empty()) {
            let (record, size) = match read_record(rest, file.config) {
                Ok(read) => read,
                Err(PeventError::End) if rest.iter().all(|&b| b == 0) => break,
                Err(err) => {
                    let why = if err == PeventError::End {
                        "the file ends inside it".to_owned()
                    } else {
                        err.to_string()
                    };
                    summary.problems.push(format!(
                        "{}: the record at byte {at} cannot be read ({why}): the {} bytes from there on are not read",
                        file.name,
                        rest.len()
                    ));
                    break;
                }
            };
            at += size;
            if !has_trailer(record.kind) {
                summary.skipped += 1;
                continue;
            }
            let record = sideband::Record {
                kind: record.kind,
                misc: record.misc,
                own: record.body,
                trailer: Trailer {
                    pid_tid: record.samples.pid_tid,
                    time: record.samples.time,
                    cpu: record.samples.cpu,
                },
            };
            match record.trailer.cpu.or(file.cpu) {
                Some(cpu) => builder.add(&record, Some(cpu)),
                None => builder.learn(&record),
            }
        }
    }
    summary.records = builder.records;
    snap.meta.freeze_time_ns = builder.last_time;
    let (streams, processes) = builder.finish(&std::collections::HashMap::new());
    let given = snap
        .maps
        .iter()
        .find(|p| p.pid == 0)
        .map(|p| p.maps.clone())
        .unwrap_or_default();
    let given_code: Vec<CodeRegion> = snap.code.iter().filter(|c| c.pid == 0).cloned().collect();
    for mut process in processes.into_iter().filter(|p| p.pid != 0) {
        crate::capture::mmap_records::overlay(&mut process.maps, &given);
        snap.code.extend(given_code.iter().map(|c| CodeRegion {
            pid: process.pid,
            ..c.clone()
        }));
        snap.maps.push(process);
    }
    snap.sideband = streams;
    snap.meta.recorder.sample_type = SIDEBAND_SAMPLE_TYPE;
    snap.meta.recorder.sample_id_all = true;
    if let Some(config) = files.first().map(|f| f.config) {
        snap.meta.clock = Some(ClockConversion {
            time_zero: config.time_zero,
            time_mult: config.time_mult,
            time_shift: config.time_shift,
            valid: true,
            tsc_at_freeze: None,
            monotonic_ns_at_freeze: 0,
            tsc_earlier: None,
            monotonic_ns_earlier: 0,
        });
    }
    summary
}

/// The vDSO images given for the processes' `[vdso]` mappings (`--pevent:vdso-x64`,
/// `-x32`, `-ia32`: the kernel's `vdso64.so` ..., as ptxed takes them), by ABI.
#[derive(Debug, Clone, Default)]
pub struct VdsoImages {
    pub x64: Option<Vec<u8>>,
    pub x32: Option<Vec<u8>>,
    pub ia32: Option<Vec<u8>>,
}

impl VdsoImages {
    /// The image for a process of `abi`; for a process whose ABI is unknown, the one image
    /// given when only one is.
    fn for_abi(&self, abi: Abi) -> Option<&[u8]> {
        let given = [&self.x64, &self.x32, &self.ia32];
        match abi {
            Abi::X64 => self.x64.as_deref(),
            Abi::X32 => self.x32.as_deref(),
            Abi::Ia32 => self.ia32.as_deref(),
            Abi::Unknown => match given.iter().filter(|g| g.is_some()).count() {
                1 => given.iter().find_map(|g| g.as_deref()),
                _ => None,
            },
        }
    }

    pub fn is_empty(&self) -> bool {
        self.x64.is_none() && self.x32.is_none() && self.ia32.is_none()
    }
}

/// Embeds the code of every `[vdso]` mapping of `snap`'s processes from the vDSO image of
/// the process's ABI (`abi_of`, e.g. from the ELF header of its first mapped file): the
/// mapping's bytes from its page offset, as the kernel mapped the image. Why: the vDSO is
/// no file, so without its image every call into it (`clock_gettime`, `gettimeofday`) is
/// a decode error and the flow after it is lost until the trace resynchronizes. Out: the
/// number of `[vdso]` mappings left without code (no image for their ABI).
pub fn embed_vdso(
    snap: &mut Snapshot,
    images: &VdsoImages,
    abi_of: impl Fn(&ProcessMaps) -> Abi,
) -> usize {
    let mut missing = 0;
    let mut embedded = Vec::new();
    for process in &snap.maps {
        for entry in process.maps.iter().filter(|m| m.path == "[vdso]") {
            if snap
                .code
                .iter()
                .any(|c| c.pid == process.pid && c.start == entry.start)
            {
                continue;
            }
            let bytes = images.for_abi(abi_of(process)).and_then(|image| {
                let from = usize::try_from(entry.offset).ok()?;
                let len = usize::try_from(entry.end.saturating_sub(entry.start)).ok()?;
                image.get(from..from.saturating_add(len).min(image.len()))
            });
            match bytes {
                Some(bytes) if !bytes.is_empty() => embedded.push(CodeRegion {
                    pid: process.pid,
                    start: entry.start,
                    path: entry.path.clone(),
                    data: bytes.to_vec(),
                }),
                _ => missing += 1,
            }
        }
    }
    snap.code.extend(embedded);
    missing
}

#[cfg(test)]
#[path = "raw_tests.rs"]
mod tests;
