//! `perf_event` sideband records: reading them and printing them between PT packets.
//!
//! In: the bytes of a perf sideband stream (`perf_event_header` records as the kernel
//! writes them into the data ring, e.g. MMAP, COMM, `ITRACE_START`, SWITCH) and the
//! `perf_event_attr`/mmap-page values needed to read them (sample type, time
//! conversion). Out: [`PerfRecord`]s with their time converted to TSC, and the
//! [`SidebandSession`] that `ptdump` uses to print records in time order as the PT trace's
//! own time passes them (libipt's `--pevent` sideband dump).

use std::fmt;

use crate::capture::tsc::TscConversion;

pub(super) const PERF_RECORD_MMAP: u32 = 1;
pub(super) const PERF_RECORD_LOST: u32 = 2;
pub(super) const PERF_RECORD_COMM: u32 = 3;
const PERF_RECORD_EXIT: u32 = 4;
const PERF_RECORD_THROTTLE: u32 = 5;
const PERF_RECORD_UNTHROTTLE: u32 = 6;
pub(super) const PERF_RECORD_FORK: u32 = 7;
pub(super) const PERF_RECORD_MMAP2: u32 = 10;
pub(super) const PERF_RECORD_AUX: u32 = 11;
pub(super) const PERF_RECORD_ITRACE_START: u32 = 12;
const PERF_RECORD_LOST_SAMPLES: u32 = 13;
pub(super) const PERF_RECORD_SWITCH: u32 = 14;
pub(super) const PERF_RECORD_SWITCH_CPU_WIDE: u32 = 15;

pub(super) const PERF_RECORD_MISC_COMM_EXEC: u16 = 1 << 13;
pub(super) const PERF_RECORD_MISC_SWITCH_OUT: u16 = 1 << 13;
pub(super) const PERF_AUX_FLAG_TRUNCATED: u64 = 1;

const PERF_SAMPLE_TID: u64 = 1 << 1;
const PERF_SAMPLE_TIME: u64 = 1 << 2;
const PERF_SAMPLE_ID: u64 = 1 << 6;
const PERF_SAMPLE_CPU: u64 = 1 << 7;
const PERF_SAMPLE_STREAM_ID: u64 = 1 << 9;
const PERF_SAMPLE_IDENTIFIER: u64 = 1 << 16;

/// How to read a sideband stream: `perf_event_attr.sample_type` (with `sample_id_all`)
/// and the perf clock to TSC conversion of the perf mmap page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeventConfig {
    pub sample_type: u64,
    /// `(identifier, sample_type)` pairs (`--pevent:sample-config ID:TYPE`, as libipt's
    /// `perf-get-opts.bash` writes them for a perf.data whose events differ): a record
    /// whose last word (its `SAMPLE_IDENTIFIER`) is `identifier` has that sample type.
    pub sample_config: Vec<(u64, u64)>,
    pub time_zero: u64,
    pub time_shift: u16,
    pub time_mult: u32,
    /// Show records this many TSC ticks earlier.
    pub tsc_offset: u64,
    /// Where the kernel starts: ptxed's sideband session applies context switches at
    /// addresses from here on (`u64::MAX`, libipt's default: all code is user code).
    pub kernel_start: u64,
    /// Prepended to the file names of MMAP records (`--pevent:sysroot`).
    pub sysroot: Option<String>,
    /// The files mapped for `[vdso]` in 64-bit, x32 and 32-bit processes
    /// (`--pevent:vdso-x64`, `--pevent:vdso-x32`, `--pevent:vdso-ia32`).
    pub vdso_x64: Option<String>,
    pub vdso_x32: Option<String>,
    pub vdso_ia32: Option<String>,
}

impl Default for PeventConfig {
    fn default() -> Self {
        Self {
            sample_type: 0,
            sample_config: Vec::new(),
            time_zero: 0,
            time_shift: 0,
            time_mult: 1,
            tsc_offset: 0,
            kernel_start: u64::MAX,
            sysroot: None,
            vdso_x64: None,
            vdso_x32: None,
            vdso_ia32: None,
        }
    }
}

impl PeventConfig {
    /// The sample type of the trailer of `record` (the bytes after its header): by its
    /// identifier where `sample_config` names it (libipt's rule), else `sample_type`.
    pub fn sample_type_of(&self, record: &[u8]) -> u64 {
        if self.sample_config.is_empty() {
            return self.sample_type;
        }
        record
            .len()
            .checked_sub(8)
            .and_then(|at| u64_at(record, at))
            .and_then(|id| self.sample_config.iter().find(|(known, _)| *known == id))
            .map_or(self.sample_type, |&(_, sample_type)| sample_type)
    }

    /// Converts a perf timestamp to TSC (`perf_event_mmap_page` `time_zero`/`time_shift`/`time_mult`).
    /// Time 0 (synthesized records) stays 0.
    pub fn time_to_tsc(&self, time: u64) -> Result<u64, PeventError> {
        if time == 0 {
            return Ok(0);
        }
        self.conversion()
            .ns_to_tsc(time)
            .ok_or(PeventError::BadTimeConfig)
    }

    /// The stream's TSC ↔ perf time conversion.
    pub fn conversion(&self) -> TscConversion {
        TscConversion {
            time_zero: self.time_zero,
            time_mult: self.time_mult,
            time_shift: self.time_shift,
        }
    }
}

/// Why a sideband record could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeventError {
    /// The stream ends (cleanly or inside a record).
    #[error("end of sideband stream")]
    End,
    /// The header's size does not match the record's contents.
    #[error("record size does not match its contents")]
    BadSize,
    /// A file name or command without its terminating NUL.
    #[error("unterminated string in record")]
    BadString,
    /// The time conversion has a zero multiplier.
    #[error("bad perf time conversion (time_mult 0)")]
    BadTimeConfig,
}

/// The `sample_id_all` fields appended to a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Samples {
    pub pid_tid: Option<(u32, u32)>,
    pub time: Option<u64>,
    pub id: Option<u64>,
    pub stream_id: Option<u64>,
    pub cpu: Option<u32>,
    pub identifier: Option<u64>,
}

/// One sideband record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfRecord<'a> {
    /// `perf_event_header.type` and `.misc`.
    pub kind: u32,
    pub misc: u16,
    /// The record body after the header (fields depend on `kind`).
    pub body: &'a [u8],
    pub samples: Samples,
    /// The sample time as TSC (0 without a time sample).
    pub tsc: u64,
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The NUL-terminated string at `at` and the 8-byte aligned space it takes.
pub(super) fn c_string(bytes: &[u8], at: usize) -> Result<(&[u8], usize), PeventError> {
    let tail = bytes.get(at..).ok_or(PeventError::BadString)?;
    let len = tail
        .iter()
        .position(|&b| b == 0)
        .ok_or(PeventError::BadString)?;
    Ok((&tail[..len], (len + 1).next_multiple_of(8)))
}

/// The size of a record's body before its samples.
fn body_len(kind: u32, record: &[u8]) -> Result<usize, PeventError> {
    Ok(match kind {
        PERF_RECORD_MMAP => 32 + c_string(record, 32)?.1,
        PERF_RECORD_COMM => 8 + c_string(record, 8)?.1,
        PERF_RECORD_MMAP2 => 64 + c_string(record, 64)?.1,
        PERF_RECORD_LOST | PERF_RECORD_ITRACE_START | PERF_RECORD_SWITCH_CPU_WIDE => {
            if kind == PERF_RECORD_LOST { 16 } else { 8 }
        }
        PERF_RECORD_EXIT
        | PERF_RECORD_FORK
        | PERF_RECORD_THROTTLE
        | PERF_RECORD_UNTHROTTLE
        | PERF_RECORD_AUX => 24,
        PERF_RECORD_LOST_SAMPLES => 8,
        _ => 0,
    })
}

fn read_samples(bytes: &[u8], mut at: usize, st: u64) -> Result<(Samples, usize), PeventError> {
    let mut s = Samples::default();
    let field = |at: usize| u64_at(bytes, at).ok_or(PeventError::BadSize);
    if st & PERF_SAMPLE_TID != 0 {
        let pid = u32_at(bytes, at).ok_or(PeventError::BadSize)?;
        let tid = u32_at(bytes, at + 4).ok_or(PeventError::BadSize)?;
        s.pid_tid = Some((pid, tid));
        at += 8;
    }
    if st & PERF_SAMPLE_TIME != 0 {
        s.time = Some(field(at)?);
        at += 8;
    }
    if st & PERF_SAMPLE_ID != 0 {
        s.id = Some(field(at)?);
        at += 8;
    }
    if st & PERF_SAMPLE_STREAM_ID != 0 {
        s.stream_id = Some(field(at)?);
        at += 8;
    }
    if st & PERF_SAMPLE_CPU != 0 {
        s.cpu = Some(u32_at(bytes, at).ok_or(PeventError::BadSize)?);
        at += 8;
    }
    if st & PERF_SAMPLE_IDENTIFIER != 0 {
        s.identifier = Some(field(at)?);
        at += 8;
    }
    Ok((s, at))
}

/// Whether records of `kind` are read with their `sample_id_all` trailer (the kinds
/// libipt knows; others are passed over whole).
pub fn has_trailer(kind: u32) -> bool {
    matches!(kind, PERF_RECORD_MMAP..=PERF_RECORD_FORK | PERF_RECORD_MMAP2..=PERF_RECORD_SWITCH_CPU_WIDE)
}

/// Reads the record at the start of `bytes`; returns it and its size.
pub fn read_record<'a>(
    bytes: &'a [u8],
    config: &PeventConfig,
) -> Result<(PerfRecord<'a>, usize), PeventError> {
    let header = bytes.get(..8).ok_or(PeventError::End)?;
    let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let misc = u16::from_le_bytes([header[4], header[5]]);
    let size = usize::from(u16::from_le_bytes([header[6], header[7]]));
    if size < 8 {
        return Err(PeventError::BadSize);
    }
    if kind == 0 || bytes.len() < size {
        return Err(PeventError::End);
    }
    let record = &bytes[8..size];
    let mut out = PerfRecord {
        kind,
        misc,
        body: record,
        samples: Samples::default(),
        tsc: 0,
    };
    if !has_trailer(kind) {
        return Ok((out, size));
    }
    let body = body_len(kind, record)?;
    let (samples, end) = read_samples(record, body, config.sample_type_of(record))?;
    if end != record.len() {
        return Err(PeventError::BadSize);
    }
    out.body = &record[..body.min(record.len())];
    out.samples = samples;
    if let Some(time) = samples.time {
        out.tsc = config.time_to_tsc(time)?;
    }
    Ok((out, size))
}

/// Which parts of sideband records to print (`--sb:*`).
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent output switches, one per ptdump flag"
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SidebandFlags {
    /// One line per record (`--sb:compact`).
    pub compact: bool,
    /// One line per field (`--sb:verbose`).
    pub verbose: bool,
    /// Prefix the sideband file name (`--sb:filename`).
    pub filename: bool,
    /// Prefix the offset in the sideband file (`--sb:offset`).
    pub offset: bool,
    /// Prefix the record's time as TSC (`--sb:time`).
    pub time: bool,
}

impl SidebandFlags {
    /// Whether anything at all is printed for a record.
    pub fn any(&self) -> bool {
        self.compact || self.verbose || self.filename || self.offset || self.time
    }
}

/// Where a record field is in the body and how wide it is.
#[derive(Debug, Clone, Copy)]
enum Field {
    U32(usize),
    U64(usize),
    Str(usize),
}

type Layout = &'static [(&'static str, Field)];

const MMAP: Layout = &[
    ("pid", Field::U32(0)),
    ("tid", Field::U32(4)),
    ("addr", Field::U64(8)),
    ("len", Field::U64(16)),
    ("pgoff", Field::U64(24)),
    ("filename", Field::Str(32)),
];
const LOST: Layout = &[("id", Field::U64(0)), ("lost", Field::U64(8))];
const COMM: Layout = &[
    ("pid", Field::U32(0)),
    ("tid", Field::U32(4)),
    ("comm", Field::Str(8)),
];
const EXIT_FORK: Layout = &[
    ("pid", Field::U32(0)),
    ("ppid", Field::U32(4)),
    ("tid", Field::U32(8)),
    ("ptid", Field::U32(12)),
    ("time", Field::U64(16)),
];
const THROTTLE: Layout = &[
    ("time", Field::U64(0)),
    ("id", Field::U64(8)),
    ("stream_id", Field::U64(16)),
];
const MMAP2: Layout = &[
    ("pid", Field::U32(0)),
    ("tid", Field::U32(4)),
    ("addr", Field::U64(8)),
    ("len", Field::U64(16)),
    ("pgoff", Field::U64(24)),
    ("maj", Field::U32(32)),
    ("min", Field::U32(36)),
    ("ino", Field::U64(40)),
    ("ino_generation", Field::U64(48)),
    ("prot", Field::U32(56)),
    ("flags", Field::U32(60)),
    ("filename", Field::Str(64)),
];
const AUX: Layout = &[
    ("aux offset", Field::U64(0)),
    ("aux size", Field::U64(8)),
    ("flags", Field::U64(16)),
];
const PID_TID: Layout = &[("pid", Field::U32(0)), ("tid", Field::U32(4))];
const LOST_SAMPLES: Layout = &[("lost", Field::U64(0))];
const SWITCH_PREV: Layout = &[("prev pid", Field::U32(0)), ("prev tid", Field::U32(4))];
const SWITCH_NEXT: Layout = &[("next pid", Field::U32(0)), ("next tid", Field::U32(4))];

/// The printed name, its suffix and the fields of a known record type.
fn layout(rec: &PerfRecord<'_>) -> Option<(&'static str, &'static str, Layout)> {
    let exec = rec.misc & PERF_RECORD_MISC_COMM_EXEC != 0;
    let out = rec.misc & PERF_RECORD_MISC_SWITCH_OUT != 0;
    Some(match rec.kind {
        PERF_RECORD_MMAP => ("PERF_RECORD_MMAP", "", MMAP),
        PERF_RECORD_LOST => ("PERF_RECORD_LOST", "", LOST),
        PERF_RECORD_COMM => ("PERF_RECORD_COMM", if exec { ".EXEC" } else { "" }, COMM),
        PERF_RECORD_EXIT => ("PERF_RECORD_EXIT", "", EXIT_FORK),
        PERF_RECORD_FORK => ("PERF_RECORD_FORK", "", EXIT_FORK),
        PERF_RECORD_THROTTLE => ("PERF_RECORD_THROTTLE", "", THROTTLE),
        PERF_RECORD_UNTHROTTLE => ("PERF_RECORD_UNTHROTTLE", "", THROTTLE),
        PERF_RECORD_MMAP2 => ("PERF_RECORD_MMAP2", "", MMAP2),
        PERF_RECORD_AUX => {
            let truncated = u64_at(rec.body, 16).unwrap_or(0) & PERF_AUX_FLAG_TRUNCATED != 0;
            (
                "PERF_RECORD_AUX",
                if truncated { ".TRUNCATED" } else { "" },
                AUX,
            )
        }
        PERF_RECORD_ITRACE_START => ("PERF_RECORD_ITRACE_START", "", PID_TID),
        PERF_RECORD_LOST_SAMPLES => ("PERF_RECORD_LOST_SAMPLES", "", LOST_SAMPLES),
        PERF_RECORD_SWITCH => ("PERF_RECORD_SWITCH", if out { ".OUT" } else { ".IN" }, &[]),
        PERF_RECORD_SWITCH_CPU_WIDE if out => ("PERF_RECORD_SWITCH_CPU_WIDE", ".OUT", SWITCH_NEXT),
        PERF_RECORD_SWITCH_CPU_WIDE => ("PERF_RECORD_SWITCH_CPU_WIDE", ".IN", SWITCH_PREV),
        _ => return None,
    })
}

fn field_text(body: &[u8], field: Field) -> String {
    match field {
        Field::U32(at) => format!("{:x}", u32_at(body, at).unwrap_or(0)),
        Field::U64(at) => format!("{:x}", u64_at(body, at).unwrap_or(0)),
        Field::Str(at) => c_string(body, at).map_or_else(
            |_| String::new(),
            |(s, _)| String::from_utf8_lossy(s).into_owned(),
        ),
    }
}

/// Prints a record's body the way libipt's sideband dump does.
fn print_body(rec: &PerfRecord<'_>, flags: SidebandFlags, out: &mut dyn fmt::Write) -> fmt::Result {
    let Some((name, sfx, layout)) = layout(rec) else {
        if flags.compact {
            write!(out, "UNKNOWN ({:x}, {:x})", rec.kind, rec.misc)?;
        }
        if flags.verbose {
            write!(
                out,
                "UNKNOWN\n  type: {:x}\n  misc: {:x}",
                rec.kind, rec.misc
            )?;
        }
        return Ok(());
    };
    let values: Vec<String> = layout
        .iter()
        .map(|(_, f)| field_text(rec.body, *f))
        .collect();
    if flags.compact {
        write!(out, "{name}{sfx}")?;
        print_compact_fields(rec.kind, &values, out)?;
    }
    if flags.verbose {
        write!(out, "{name}{sfx}")?;
        for ((label, _), value) in layout.iter().zip(&values) {
            write!(out, "\n  {label}: {value}")?;
        }
    }
    Ok(())
}

/// The compact form groups pid/tid pairs as `pid/tid`.
fn print_compact_fields(kind: u32, values: &[String], out: &mut dyn fmt::Write) -> fmt::Result {
    let joined = match (kind, values) {
        // The body order is pid, ppid, tid, ptid, time.
        (PERF_RECORD_EXIT | PERF_RECORD_FORK, [pid, parent, tid, parent_thread, time]) => {
            format!("{pid}/{tid}, {parent}/{parent_thread}, {time}")
        }
        (
            PERF_RECORD_MMAP
            | PERF_RECORD_MMAP2
            | PERF_RECORD_COMM
            | PERF_RECORD_ITRACE_START
            | PERF_RECORD_SWITCH_CPU_WIDE,
            [pid, tid, rest @ ..],
        ) => std::iter::once(format!("{pid}/{tid}"))
            .chain(rest.iter().cloned())
            .collect::<Vec<_>>()
            .join(", "),
        _ => values.join(", "),
    };
    if joined.is_empty() {
        Ok(())
    } else {
        write!(out, "  {joined}")
    }
}

fn print_samples(s: &Samples, flags: SidebandFlags, out: &mut dyn fmt::Write) -> fmt::Result {
    if flags.compact {
        out.write_str("  {")?;
        if let Some((pid, tid)) = s.pid_tid {
            write!(out, " {pid:x}/{tid:x}")?;
        }
        for (value, prefix) in [(s.time, ""), (s.id, "")] {
            if let Some(v) = value {
                write!(out, " {prefix}{v:x}")?;
            }
        }
        if let Some(cpu) = s.cpu {
            write!(out, " cpu-{cpu:x}")?;
        }
        for v in [s.stream_id, s.identifier].into_iter().flatten() {
            write!(out, " {v:x}")?;
        }
        out.write_str(" }")?;
    }
    if flags.verbose {
        if let Some((pid, tid)) = s.pid_tid {
            write!(out, "\n  pid: {pid:x}\n  tid: {tid:x}")?;
        }
        let lines = [
            ("time", s.time),
            ("id", s.id),
            ("cpu", s.cpu.map(u64::from)),
            ("stream id", s.stream_id),
            ("identifier", s.identifier),
        ];
        for (label, value) in lines {
            if let Some(v) = value {
                write!(out, "\n  {label}: {v:x}")?;
            }
        }
    }
    Ok(())
}

/// A sideband stream handed to [`SidebandSession::new`] (already loaded).
#[derive(Debug, Clone)]
pub struct SidebandStream<'a> {
    /// The name printed with `--sb:filename` and in errors.
    pub name: String,
    pub data: &'a [u8],
    pub config: PeventConfig,
    pub primary: bool,
}

/// What reading a stream's next record gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fetched {
    Record,
    /// The stream ended cleanly.
    End,
    /// A read error (reported).
    Failed,
}

/// One stream and the record read from it last; both the ptdump printer and the ptxed
/// sideband session ([`super::sb_session`]) walk streams this way.
pub(super) struct SidebandCursor<'a> {
    pub(super) stream: SidebandStream<'a>,
    /// Offset of the next record to read.
    next: usize,
    /// The record read last and its offset.
    pub(super) current: Option<(PerfRecord<'a>, usize)>,
    /// When the current record is due (its time less the stream's `tsc_offset`).
    pub(super) tsc: u64,
}

impl<'a> SidebandCursor<'a> {
    pub(super) fn new(stream: SidebandStream<'a>) -> Self {
        Self {
            stream,
            next: 0,
            current: None,
            tsc: 0,
        }
    }

    /// Reads the next record; `Err` with the offset when the stream is done.
    fn fetch(&mut self) -> Result<(), (PeventError, usize)> {
        let at = self.next;
        let bytes = self.stream.data.get(at..).unwrap_or_default();
        let (record, size) = read_record(bytes, &self.stream.config).map_err(|e| (e, at))?;
        self.next = at + size;
        let offset = self.stream.config.tsc_offset;
        let tsc = match record.samples.time {
            None => 0,
            Some(_) if offset <= record.tsc => record.tsc - offset,
            // A positive offset does not wrap below zero ...
            Some(_) if offset >> 63 == 0 => 0,
            // ... and a negative one (two's complement) moves records later.
            Some(_) => record.tsc.wrapping_sub(offset),
        };
        self.tsc = tsc;
        self.current = Some((PerfRecord { tsc, ..record }, at));
        Ok(())
    }

    /// Reads the next record; a read error is reported to `out` the way libipt does.
    pub(super) fn fetch_reporting(
        &mut self,
        out: &mut dyn fmt::Write,
    ) -> Result<Fetched, fmt::Error> {
        match self.fetch() {
            Ok(()) => Ok(Fetched::Record),
            Err((PeventError::End, _)) => Ok(Fetched::End),
            Err((err, offset)) => {
                write_diagnostic(out, &self.stream.name, offset, true, errstr(err))?;
                Ok(Fetched::Failed)
            }
        }
    }

    /// Prints the current record (nothing before the first fetch).
    pub(super) fn print_current(
        &self,
        flags: SidebandFlags,
        out: &mut dyn fmt::Write,
    ) -> fmt::Result {
        let Some((rec, offset)) = &self.current else {
            return Ok(());
        };
        match (flags.filename, flags.offset) {
            (true, true) => write!(out, "{}:{offset:016x}  ", self.stream.name)?,
            (true, false) => write!(out, "{}  ", self.stream.name)?,
            (false, true) => write!(out, "{offset:016x}  ")?,
            (false, false) => {}
        }
        if flags.time && rec.samples.time.is_some() {
            write!(out, "{:016x}  ", rec.tsc)?;
        }
        print_body(rec, flags, out)?;
        print_samples(&rec.samples, flags, out)?;
        if flags.any() {
            out.write_char('\n')?;
        }
        Ok(())
    }
}

/// A sideband error or warning as libipt's tools print it.
pub(super) fn write_diagnostic(
    out: &mut dyn fmt::Write,
    stream: &str,
    offset: usize,
    error: bool,
    what: &str,
) -> fmt::Result {
    let severity = if error { "error" } else { "warning" };
    writeln!(out, "[{stream}:{offset:016x} sideband {severity}: {what}]")
}

/// Sideband streams merged in time order, for printing between PT packets.
pub struct SidebandSession<'a> {
    /// Ordered by the time of their next record.
    cursors: Vec<SidebandCursor<'a>>,
    flags: SidebandFlags,
}

/// libipt's name for a sideband read error.
pub(super) fn errstr(err: PeventError) -> &'static str {
    match err {
        PeventError::End => "reached end of trace stream",
        PeventError::BadSize => "decoder out of sync",
        PeventError::BadString => "unknown packet",
        PeventError::BadTimeConfig => "bad configuration",
    }
}

/// Where a cursor goes in a list ordered by time: before others with the same time
/// (libipt's order).
pub(super) fn insert_position<T>(list: &[T], tsc: u64, tsc_of: impl Fn(&T) -> u64) -> usize {
    list.iter()
        .position(|c| tsc <= tsc_of(c))
        .unwrap_or(list.len())
}

impl<'a> SidebandSession<'a> {
    /// Reads the first record of each stream; read errors are printed to `out`.
    pub fn new(
        streams: Vec<SidebandStream<'a>>,
        flags: SidebandFlags,
        out: &mut dyn fmt::Write,
    ) -> Result<Self, fmt::Error> {
        let mut session = Self {
            cursors: Vec::new(),
            flags,
        };
        // libipt starts the streams last-given first.
        for stream in streams.into_iter().rev() {
            let mut cursor = SidebandCursor::new(stream);
            if cursor.fetch_reporting(out)? == Fetched::Record {
                session.insert(cursor);
            }
        }
        Ok(session)
    }

    fn insert(&mut self, cursor: SidebandCursor<'a>) {
        let at = insert_position(&self.cursors, cursor.tsc, |c| c.tsc);
        self.cursors.insert(at, cursor);
    }

    /// Prints every record with a time up to `tsc`.
    pub fn print_until(&mut self, tsc: u64, out: &mut dyn fmt::Write) -> fmt::Result {
        while self.cursors.first().is_some_and(|c| c.tsc <= tsc) {
            let mut cursor = self.cursors.remove(0);
            cursor.print_current(self.flags, out)?;
            if cursor.fetch_reporting(out)? == Fetched::Record {
                self.insert(cursor);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "pevent_tests.rs"]
mod tests;
