//! Decode, input side: a `perf record -e intel_pt//` recording as a [`Snapshot`], so that
//! it goes through the same decode, stacks, symbols and writer stages as lookback's own.
//!
//! In: a parsed [`PerfFile`]. Out: a PT snapshot: one AUX ring per mmap index (the CPU
//! in per-CPU mode, the thread in per-thread mode; a ring's `PERF_RECORD_AUXTRACE`
//! chunks joined in file order), per-CPU sideband (the kernel records with their
//! `sample_id_all` trailer rewritten to one layout, `TID|TIME|CPU`, whatever event wrote
//! them: perf's tracking event, the PT event and others differ), the processes' maps
//! (`super::sideband`, with the build-ids of the file's `HEADER_BUILD_ID`), the TSC ↔ perf-time conversion and the PT configuration of
//! `PERF_RECORD_AUXTRACE_INFO` (TSC, MTC period, CYC, the TSC:CTC ratio, the nominal
//! ratio) and the recording CPU from `HEADER_CPUID` (its errata).
//!
//! The kernel's code of `perf record --kcore` (the recording's `kcore_dir/kcore` and
//! `kallsyms`) comes in with [`add_kcore`].
//!
//! Not done: snapshot-mode recordings (`-S`) are joined like full traces (the decoder
//! resynchronizes at each chunk's PSB, with an error where a chunk starts mid-packet).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};

use super::super::perf_file::{Attr, PerfFile, Record};
pub use super::sideband::SIDEBAND_SAMPLE_TYPE;
use super::sideband::{self, Trailer};
use crate::capture::kallsyms::Kallsyms;
use crate::capture::mmap_records::overlay;
use crate::capture::procmaps::{ALL_PROCESSES, CodeRegion, MapEntry};
use crate::capture::pt_timing::PtTiming;
use crate::capture::records::{
    SAMPLE_CPU, SAMPLE_ID, SAMPLE_IDENTIFIER, SAMPLE_STREAM_ID, SAMPLE_TID, SAMPLE_TIME,
    trailer_len,
};
use crate::capture::{ClockConversion, RecorderParams, RingData, RingKind};
use crate::snapshot::{Metadata, Snapshot};

/// `PERF_AUXTRACE_INTEL_PT`.
const AUXTRACE_INTEL_PT: u32 = 1;

/// Indexes of `PERF_RECORD_AUXTRACE_INFO`'s private words for Intel PT (perf's
/// `intel-pt.h`).
mod info {
    pub const PMU_TYPE: usize = 0;
    pub const TIME_SHIFT: usize = 1;
    pub const TIME_MULT: usize = 2;
    pub const TIME_ZERO: usize = 3;
    pub const CAP_USER_TIME_ZERO: usize = 4;
    pub const TSC_BIT: usize = 5;
    pub const NORETCOMP_BIT: usize = 6;
    pub const MTC_BIT: usize = 10;
    pub const MTC_FREQ_BITS: usize = 11;
    pub const TSC_CTC_N: usize = 12;
    pub const TSC_CTC_D: usize = 13;
    pub const CYC_BIT: usize = 14;
    pub const MAX_NONTURBO_RATIO: usize = 15;
}

/// Why a perf.data file is no Intel PT recording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error(
        "no Intel PT in this perf.data (no PERF_RECORD_AUXTRACE_INFO; {0} events: record with `perf record -e intel_pt//`)"
    )]
    NoIntelPt(usize),
    #[error("the AUX trace is of type {0}, not Intel PT (1)")]
    OtherAuxTrace(u32),
}

/// Splits `body` into the record's own fields and its trailer.
fn split_trailer(body: &[u8], sample_type: u64) -> Option<(&[u8], Trailer)> {
    let at = body.len().checked_sub(trailer_len(sample_type))?;
    let (own, mut rest) = body.split_at(at);
    let mut next = || {
        let (word, tail) = rest.split_first_chunk::<8>()?;
        rest = tail;
        Some(*word)
    };
    let mut trailer = Trailer::default();
    if sample_type & SAMPLE_TID != 0 {
        let w = next()?;
        trailer.pid_tid = Some((
            u32::from_le_bytes([w[0], w[1], w[2], w[3]]),
            u32::from_le_bytes([w[4], w[5], w[6], w[7]]),
        ));
    }
    if sample_type & SAMPLE_TIME != 0 {
        trailer.time = Some(u64::from_le_bytes(next()?));
    }
    for field in [SAMPLE_ID, SAMPLE_STREAM_ID] {
        if sample_type & field != 0 {
            next()?;
        }
    }
    if sample_type & SAMPLE_CPU != 0 {
        let w = next()?;
        trailer.cpu = Some(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    }
    Some((own, trailer))
}

/// The `sample_type` of the event that wrote `record`: by its `SAMPLE_IDENTIFIER` (the
/// last word) where every event has one, else the PT event's.
fn sample_type_of(file: &PerfFile, record: &Record, all_identified: bool, default: &Attr) -> u64 {
    let attr = if all_identified {
        record
            .body
            .len()
            .checked_sub(8)
            .and_then(|at| record.body.get(at..))
            .and_then(|w| w.try_into().ok())
            .map(u64::from_le_bytes)
            .and_then(|id| file.attr_of(id))
            .unwrap_or(default)
    } else {
        default
    };
    if attr.sample_id_all {
        attr.sample_type
    } else {
        0
    }
}

/// The PT event and the words of its `PERF_RECORD_AUXTRACE_INFO`.
fn pt_event<'f>(file: &'f PerfFile) -> Result<(&'f Attr, &'f [u64]), ImportError> {
    let Some((kind, words)) = &file.auxtrace_info else {
        return Err(ImportError::NoIntelPt(file.attrs.len()));
    };
    if *kind != AUXTRACE_INTEL_PT {
        return Err(ImportError::OtherAuxTrace(*kind));
    }
    let pmu = words.get(info::PMU_TYPE).copied().unwrap_or(0);
    let attr = file
        .attrs
        .iter()
        .find(|a| u64::from(a.kind) == pmu)
        .or_else(|| file.attrs.first())
        .ok_or(ImportError::NoIntelPt(0))?;
    Ok((attr, words))
}

/// The PT config fields `attr.config` set, by the bits `AUXTRACE_INFO` gives.
fn config_fields(config: u64, words: &[u64]) -> BTreeMap<String, u64> {
    let word = |i: usize| words.get(i).copied().unwrap_or(0);
    let mut fields = BTreeMap::new();
    for (name, index) in [
        ("tsc", info::TSC_BIT),
        ("noretcomp", info::NORETCOMP_BIT),
        ("mtc", info::MTC_BIT),
        ("cyc", info::CYC_BIT),
    ] {
        let bit = word(index);
        if bit != 0 {
            fields.insert(name.to_owned(), u64::from(config & bit != 0));
        }
    }
    let mtc_bits = word(info::MTC_FREQ_BITS);
    if mtc_bits != 0 {
        fields.insert(
            "mtc_period".to_owned(),
            (config & mtc_bits) >> mtc_bits.trailing_zeros(),
        );
    }
    fields
}

fn pt_timing(words: &[u64], cpuid: Option<&str>) -> PtTiming {
    let word = |i: usize| words.get(i).copied().unwrap_or(0);
    let ratio = u32::try_from(word(info::TSC_CTC_N))
        .ok()
        .zip(u32::try_from(word(info::TSC_CTC_D)).ok())
        .filter(|&(n, d)| n != 0 && d != 0);
    // `GenuineIntel,6,142,10` → `6/142/10`.
    let cpu = cpuid.and_then(|id| {
        let mut parts = id.split(',');
        (parts.next()? == "GenuineIntel").then(|| parts.collect::<Vec<_>>().join("/"))
    });
    PtTiming {
        tsc_art_ratio: ratio,
        max_nonturbo_ratio: u8::try_from(word(info::MAX_NONTURBO_RATIO))
            .ok()
            .filter(|&r| r > 0),
        cpu,
    }
}

/// The AUX rings: one per mmap index, chunks joined in file order.
fn rings(file: &PerfFile) -> Vec<RingData> {
    let mut by_idx: BTreeMap<u32, RingData> = BTreeMap::new();
    for chunk in &file.aux {
        let ring = by_idx.entry(chunk.idx).or_insert_with(|| RingData {
            kind: RingKind::Aux,
            cpu: (chunk.cpu != u32::MAX).then_some(chunk.cpu),
            tid: (chunk.cpu == u32::MAX).then_some(chunk.tid),
            wrapped: false,
            records: 0,
            stop: None,
            data: Vec::new(),
        });
        ring.data.extend_from_slice(chunk.data);
    }
    by_idx.into_values().collect()
}

/// A perf.data recording of Intel PT as a snapshot, or why it is none.
pub fn snapshot(file: &PerfFile) -> Result<Snapshot, ImportError> {
    let (pt, words) = pt_event(file)?;
    let word = |i: usize| words.get(i).copied().unwrap_or(0);
    let all_identified = file
        .attrs
        .iter()
        .all(|a| a.sample_type & SAMPLE_IDENTIFIER != 0);
    let rings = rings(file);
    let per_cpu = rings.iter().any(|r| r.cpu.is_some());
    let mut builder = sideband::Builder::default();
    for record in file.records.iter().filter(|r| !PerfFile::is_sample(r.kind)) {
        let sample_type = sample_type_of(file, record, all_identified, pt);
        let Some((own, trailer)) = split_trailer(record.body, sample_type) else {
            continue;
        };
        let cpu = if per_cpu { trailer.cpu } else { None };
        let record = sideband::Record {
            kind: record.kind,
            misc: record.misc,
            own,
            trailer,
        };
        builder.add(&record, cpu);
    }
    let last_time = builder.last_time;
    let build_ids: HashMap<&str, &str> = file
        .build_ids
        .iter()
        .map(|b| (b.path.as_str(), b.build_id.as_str()))
        .collect();
    let (sideband, maps) = builder.finish(&build_ids);
    let clock = ClockConversion {
        time_zero: word(info::TIME_ZERO),
        time_mult: u32::try_from(word(info::TIME_MULT)).unwrap_or(0),
        time_shift: u16::try_from(word(info::TIME_SHIFT)).unwrap_or(0),
        valid: word(info::CAP_USER_TIME_ZERO) != 0,
        tsc_at_freeze: None,
        monotonic_ns_at_freeze: 0,
        tsc_earlier: None,
        monotonic_ns_earlier: 0,
    };
    let recorder = RecorderParams {
        event: "intel_pt".to_owned(),
        perf_type: pt.kind,
        config: pt.config,
        config_fields: config_fields(pt.config, words),
        sample_type: SIDEBAND_SAMPLE_TYPE,
        sample_id_all: true,
        buffer_size: rings.iter().map(|r| r.data.len() as u64).max().unwrap_or(0),
        include_kernel: !pt.exclude_kernel,
        cpus: rings.iter().filter_map(|r| r.cpu).collect(),
        pt_timing: Some(pt_timing(words, file.cpuid.as_deref())),
        ..RecorderParams::default()
    };
    Ok(Snapshot {
        meta: Metadata {
            lookback_version: env!("CARGO_PKG_VERSION").to_owned(),
            kernel: file.os_release.clone().unwrap_or_default(),
            backend: crate::capture::Backend::IntelPt,
            recorder,
            trigger: None,
            trigger_to_freeze_ns: None,
            freeze_time_ns: last_time,
            pause_duration_ns: 0,
            clock: clock.valid.then_some(clock),
            window_start_ns: None,
            window_end_ns: None,
            debug_dirs: Vec::new(),
            debuginfod: crate::elf::debuginfod::Servers::FromEnv,
            kernel_symbols: Vec::new(),
            origin: None,
        },
        rings,
        sideband,
        maps,
        code: Vec::new(),
        perf_maps: Vec::new(),
    })
}

/// The kernel of a `perf record --kcore` recording in `snap`: the executable segments of
/// `kcore` (its `kcore_dir/kcore`, an ELF core file of the kernel's text, read by the
/// caller; `path` names it) mapped in every process, their bytes kept once
/// ([`ALL_PROCESSES`]), and the text symbols of its `kallsyms` as the snapshot's kernel
/// symbols. Why: without the kernel's code every kernel stretch of a trace that recorded
/// it is a decode error. Out: the number of segments.
pub fn add_kcore(
    snap: &mut Snapshot,
    path: &str,
    kcore: &[u8],
    kallsyms: Option<&str>,
) -> Result<usize, super::raw::RawCodeError> {
    let spec = super::raw::ElfSpec {
        path: path.to_owned(),
        base: None,
    };
    let segments = spec.segments(kcore)?;
    let entries: Vec<MapEntry> = segments.iter().map(|(entry, _)| entry.clone()).collect();
    for process in &mut snap.maps {
        overlay(&mut process.maps, &entries);
    }
    snap.code
        .extend(segments.iter().map(|(entry, bytes)| CodeRegion {
            pid: ALL_PROCESSES,
            start: entry.start,
            path: entry.path.clone(),
            data: bytes.clone(),
        }));
    if let Some(text) = kallsyms {
        snap.meta.kernel_symbols = Kallsyms::parse(text).into_symbols();
    }
    Ok(segments.len())
}

#[cfg(test)]
#[path = "perf_tests.rs"]
mod tests;
