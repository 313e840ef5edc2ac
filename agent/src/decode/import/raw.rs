//! Decode, input side: a raw Intel PT capture (AUX bytes, oldest first) and the code it
//! ran as a [`Snapshot`], so that `lookback decode --pt FILE ... -o OUT` writes the same
//! timeline as a snapshot does.
//!
//! In: the trace and the code, as `--elf FILE[:BASE]` (each loadable, executable segment
//! of an ELF file, relocated as Intel's ptxed does: with BASE, the lowest loadable segment
//! at BASE; without, at the addresses the file gives) and `--raw FILE[:OFFSET[-END]]:ADDR`
//! (bytes without a format). Out: a snapshot of one AUX ring (CPU 0, no sideband: one
//! track), one process (pid 0, named after the trace) whose maps are the code given,
//! ELF segments named by their file (so the symbol stage names their functions), raw
//! bytes embedded as `[raw] FILE` (no symbols).
#![forbid(unsafe_code)]

use object::{Object as _, ObjectSegment as _, SegmentFlags};

use crate::capture::procmaps::{CodeRegion, MapEntry, ProcessMaps};
use crate::capture::{RecorderParams, RingData, RingKind};
use crate::decode::pt::flow::image::RawSpec;
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
        let build_id = crate::capture::procmaps::build_id_hex(&elf);
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

/// A raw trace over `code` (maps and bytes, later ones over earlier ones where they
/// overlap), for a process named `name`.
pub fn snapshot(trace: Vec<u8>, code: Vec<(MapEntry, Vec<u8>)>, name: &str) -> Snapshot {
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
        buffer_size: trace.len() as u64,
        cpus: vec![0],
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
            kernel_symbols: Vec::new(),
        },
        rings: vec![RingData {
            kind: RingKind::Aux,
            cpu: Some(0),
            tid: None,
            wrapped: false,
            records: 0,
            stop: None,
            data: trace,
        }],
        sideband: Vec::new(),
        maps: vec![ProcessMaps {
            pid: 0,
            comm: name.to_owned(),
            exe: None,
            read_at_ns: 0,
            at_freeze: false,
            maps,
        }],
        code: regions,
    }
}

#[cfg(test)]
#[path = "raw_tests.rs"]
mod tests;
