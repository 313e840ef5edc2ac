//! Reading the perf record streams the rings are copied into: enough to know which
//! processes and threads were sampled, over which time window, and what was lost; and a
//! sample parser the sampling decoder and the tests use.
//!
//! In: a linear stream of `perf_event_header` records (oldest first, as
//! [`super::ring::walk_backward`] returns them) and the `sample_type` they were written
//! with. Out: [`RawRecord`]s, [`Sample`]s and a [`StreamSummary`]. Never panics: a bad
//! header ends the stream, a short body yields `None`.

use std::collections::BTreeSet;
use std::ops::Range;

use super::ring::{HEADER_SIZE, valid_record_size};

pub const PERF_RECORD_LOST: u32 = 2;
pub const PERF_RECORD_COMM: u32 = 3;
pub const PERF_RECORD_EXIT: u32 = 4;
pub const PERF_RECORD_FORK: u32 = 7;
pub const PERF_RECORD_SAMPLE: u32 = 9;
pub const PERF_RECORD_MMAP2: u32 = 10;
pub const PERF_RECORD_AUX: u32 = 11;
pub const PERF_RECORD_LOST_SAMPLES: u32 = 13;
pub const PERF_RECORD_SWITCH: u32 = 14;
/// A context switch seen by a CPU-wide event (body: the other task's pid, tid).
pub const PERF_RECORD_SWITCH_CPU_WIDE: u32 = 15;

/// `PERF_RECORD_COMM` header flag: the name changed because the process exec'd.
pub const PERF_RECORD_MISC_COMM_EXEC: u16 = 1 << 13;

/// `PERF_RECORD_SWITCH` header flags: a switch out (else in), and out while runnable.
pub const PERF_RECORD_MISC_SWITCH_OUT: u16 = 1 << 13;
pub const PERF_RECORD_MISC_SWITCH_OUT_PREEMPT: u16 = 1 << 14;

/// `PERF_RECORD_AUX` flags: the kernel cut the AUX data short (no room), the PMU stopped
/// part-way (a partial record), or a collision in the PMU's buffer.
pub const PERF_AUX_FLAG_TRUNCATED: u64 = 0x01;
pub const PERF_AUX_FLAG_PARTIAL: u64 = 0x04;
pub const PERF_AUX_FLAG_COLLISION: u64 = 0x08;

pub const SAMPLE_IP: u64 = 1 << 0;
pub const SAMPLE_TID: u64 = 1 << 1;
pub const SAMPLE_TIME: u64 = 1 << 2;
pub const SAMPLE_ADDR: u64 = 1 << 3;
pub const SAMPLE_READ: u64 = 1 << 4;
pub const SAMPLE_CALLCHAIN: u64 = 1 << 5;
pub const SAMPLE_ID: u64 = 1 << 6;
pub const SAMPLE_CPU: u64 = 1 << 7;
pub const SAMPLE_PERIOD: u64 = 1 << 8;
pub const SAMPLE_STREAM_ID: u64 = 1 << 9;
pub const SAMPLE_RAW: u64 = 1 << 10;
pub const SAMPLE_BRANCH_STACK: u64 = 1 << 11;
pub const SAMPLE_REGS_USER: u64 = 1 << 12;
pub const SAMPLE_STACK_USER: u64 = 1 << 13;
pub const SAMPLE_IDENTIFIER: u64 = 1 << 16;

/// x86-64 `perf_event_x86_regs` indices of the registers an unwinder starts from.
pub const REG_BP: u32 = 6;
pub const REG_SP: u32 = 7;
pub const REG_IP: u32 = 8;
/// The `sample_regs_user` mask of exactly those.
pub const UNWIND_REGS: u64 = 1 << REG_BP | 1 << REG_SP | 1 << REG_IP;

/// How sample bodies are laid out: the `sample_type`, and for `SAMPLE_REGS_USER` the
/// `sample_regs_user` mask (each sample carries one value per bit set, in bit order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout {
    pub sample_type: u64,
    pub regs_user: u64,
}

impl From<u64> for Layout {
    /// A layout without user registers.
    fn from(sample_type: u64) -> Self {
        Self {
            sample_type,
            regs_user: 0,
        }
    }
}

/// Callchain entries at or above this are context markers (`PERF_CONTEXT_*`), not
/// addresses.
pub const PERF_CONTEXT_MAX: u64 = (-4095i64).cast_unsigned();
/// `PERF_CONTEXT_USER`: the user part of a callchain follows.
pub const PERF_CONTEXT_USER: u64 = (-512i64).cast_unsigned();
/// `PERF_CONTEXT_KERNEL`: the kernel part of a callchain follows.
pub const PERF_CONTEXT_KERNEL: u64 = (-128i64).cast_unsigned();

/// One record of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRecord<'a> {
    pub kind: u32,
    pub misc: u16,
    /// The bytes after the header.
    pub body: &'a [u8],
}

/// The records of `stream`, in order; a bad header ends the iteration.
pub fn records(stream: &[u8]) -> impl Iterator<Item = RawRecord<'_>> {
    let mut rest = stream;
    std::iter::from_fn(move || {
        let h = rest.get(..HEADER_SIZE)?;
        let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let misc = u16::from_le_bytes([h[4], h[5]]);
        let size = u16::from_le_bytes([h[6], h[7]]);
        if !valid_record_size(size, rest.len()) {
            rest = &[];
            return None;
        }
        let (record, tail) = rest.split_at(usize::from(size));
        rest = tail;
        Some(RawRecord {
            kind,
            misc,
            body: &record[HEADER_SIZE..],
        })
    })
}

/// A `PERF_RECORD_COMM` body: pid, tid, NUL-terminated name.
#[must_use]
pub fn comm_record(body: &[u8]) -> Option<(u32, u32, String)> {
    let pid = u32::from_le_bytes(body.get(0..4)?.try_into().ok()?);
    let tid = u32::from_le_bytes(body.get(4..8)?.try_into().ok()?);
    let name = body.get(8..)?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some((pid, tid, String::from_utf8_lossy(&name[..end]).into_owned()))
}

/// A `PERF_RECORD_SAMPLE`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sample {
    /// The recording event's id (`SAMPLE_IDENTIFIER`), to tell events sharing a ring apart.
    pub id: Option<u64>,
    pub ip: Option<u64>,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub time: Option<u64>,
    pub cpu: Option<u32>,
    pub period: Option<u64>,
    /// Callchain entries as recorded (addresses and `PERF_CONTEXT_*` markers).
    pub callchain: Vec<u64>,
    /// The user registers an unwinder starts from (`SAMPLE_REGS_USER` with at least
    /// [`UNWIND_REGS`]); `None` for a kernel thread or without them.
    pub user_regs: Option<UserRegs>,
    /// Where in the body the copy of the user stack from SP upwards is
    /// (`SAMPLE_STACK_USER`; the `dyn_size` bytes the kernel could copy).
    pub user_stack: Option<Range<usize>>,
}

/// The user registers of a sample that unwinding needs (defined with the trigger's stack
/// copy, which carries them too).
pub use crate::triggers::event::UserRegs;

impl Sample {
    /// The kernel addresses of the callchain (after `PERF_CONTEXT_KERNEL`, up to the user
    /// part), leaf first.
    pub fn kernel_callchain(&self) -> impl Iterator<Item = u64> + '_ {
        self.callchain
            .iter()
            .skip_while(|&&a| a != PERF_CONTEXT_KERNEL)
            .skip(1)
            .take_while(|&&a| a != PERF_CONTEXT_USER)
            .copied()
            .filter(|&a| a < PERF_CONTEXT_MAX)
    }

    /// The user-space addresses of the callchain (after `PERF_CONTEXT_USER`).
    pub fn user_callchain(&self) -> impl Iterator<Item = u64> + '_ {
        self.callchain
            .iter()
            .skip_while(|&&a| a != PERF_CONTEXT_USER)
            .copied()
            .filter(|&a| a < PERF_CONTEXT_MAX)
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn u64(&mut self) -> Option<u64> {
        let b = self.bytes.get(self.at..self.at.checked_add(8)?)?;
        self.at += 8;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }

    /// Two u32 in one u64 slot (pid/tid, cpu/reserved).
    fn pair(&mut self) -> Option<(u32, u32)> {
        let v = self.u64()?;
        Some(((v & 0xffff_ffff) as u32, (v >> 32) as u32))
    }
}

/// Parses a sample body written with `layout` (a `sample_type` alone: no user
/// registers). `None` when the body is too short or the sample type has fields this
/// parser does not know before the callchain (READ). Fields after a branch stack, or
/// registers of an unknown mask, are left out.
pub fn parse_sample(layout: impl Into<Layout>, body: &[u8]) -> Option<Sample> {
    let layout = layout.into();
    let sample_type = layout.sample_type;
    if sample_type & SAMPLE_READ != 0 {
        return None;
    }
    let mut c = Cursor { bytes: body, at: 0 };
    let mut s = Sample::default();
    let has = |bit: u64| sample_type & bit != 0;
    if has(SAMPLE_IDENTIFIER) {
        s.id = Some(c.u64()?);
    }
    if has(SAMPLE_IP) {
        s.ip = Some(c.u64()?);
    }
    if has(SAMPLE_TID) {
        let (pid, tid) = c.pair()?;
        (s.pid, s.tid) = (Some(pid), Some(tid));
    }
    if has(SAMPLE_TIME) {
        s.time = Some(c.u64()?);
    }
    for bit in [SAMPLE_ADDR, SAMPLE_ID, SAMPLE_STREAM_ID] {
        if has(bit) {
            c.u64()?;
        }
    }
    if has(SAMPLE_CPU) {
        s.cpu = Some(c.pair()?.0);
    }
    if has(SAMPLE_PERIOD) {
        s.period = Some(c.u64()?);
    }
    if has(SAMPLE_CALLCHAIN) {
        let nr = usize::try_from(c.u64()?).ok()?;
        if nr > body.len() / 8 {
            return None;
        }
        s.callchain = (0..nr).map(|_| c.u64()).collect::<Option<_>>()?;
    }
    if has(SAMPLE_RAW) {
        // u32 size, then size bytes (the kernel pads them to keep the record aligned).
        let size = u32::from_le_bytes(body.get(c.at..c.at + 4)?.try_into().ok()?);
        c.at = c.at.checked_add(4 + usize::try_from(size).ok()?)?;
    }
    if has(SAMPLE_BRANCH_STACK) {
        // Its entries' layout depends on `branch_sample_type`, not recorded here.
        return Some(s);
    }
    if has(SAMPLE_REGS_USER) {
        if layout.regs_user == 0 {
            return Some(s);
        }
        let abi = c.u64()?;
        if abi != 0 {
            let n = layout.regs_user.count_ones() as usize;
            let values: Vec<u64> = (0..n).map(|_| c.u64()).collect::<Option<_>>()?;
            s.user_regs = user_regs(layout.regs_user, &values);
        }
    }
    if has(SAMPLE_STACK_USER) {
        let size = usize::try_from(c.u64()?).ok()?;
        if size > 0 {
            let start = c.at;
            c.at = c.at.checked_add(size)?;
            let dyn_size = usize::try_from(c.u64()?).ok()?;
            s.user_stack = Some(start..start + dyn_size.min(size));
        }
    }
    Some(s)
}

/// IP, SP and BP out of the register values of `mask` (one per bit, in bit order).
fn user_regs(mask: u64, values: &[u64]) -> Option<UserRegs> {
    let value = |reg: u32| {
        (mask & 1 << reg != 0)
            .then(|| values.get((mask & ((1 << reg) - 1)).count_ones() as usize))
            .flatten()
            .copied()
    };
    Some(UserRegs {
        ip: value(REG_IP)?,
        sp: value(REG_SP)?,
        bp: value(REG_BP)?,
    })
}

/// The (pid, tid) and time of a `sample_id_all` trailer, each when present.
pub type IdTrailer = (Option<(u32, u32)>, Option<u64>);

/// The fields a `sample_id_all` trailer can have, in their order, 8 bytes each.
pub const TRAILER_FIELDS: [u64; 6] = [
    SAMPLE_TID,
    SAMPLE_TIME,
    SAMPLE_ID,
    SAMPLE_STREAM_ID,
    SAMPLE_CPU,
    SAMPLE_IDENTIFIER,
];

/// Bytes of the `sample_id_all` trailer of `sample_type`.
pub fn trailer_len(sample_type: u64) -> usize {
    TRAILER_FIELDS
        .iter()
        .filter(|&&f| sample_type & f != 0)
        .count()
        * 8
}

/// The `sample_id_all` trailer of a non-sample record.
pub fn id_trailer(sample_type: u64, body: &[u8]) -> Option<IdTrailer> {
    let start = body.len().checked_sub(trailer_len(sample_type))?;
    let mut c = Cursor {
        bytes: body,
        at: start,
    };
    let pid_tid = if sample_type & SAMPLE_TID != 0 {
        Some(c.pair()?)
    } else {
        None
    };
    let time = if sample_type & SAMPLE_TIME != 0 {
        Some(c.u64()?)
    } else {
        None
    };
    Some((pid_tid, time))
}

/// The process a record belongs to: a sample's `TID` field, another record's
/// `sample_id_all` trailer (`SWITCH_CPU_WIDE` out: the task leaving; in: the task coming
/// in); `None` for records of no process (LOST, `LOST_SAMPLES`) or without the fields.
#[must_use]
pub fn record_pid(sample_type: u64, record: &RawRecord<'_>) -> Option<u32> {
    match record.kind {
        PERF_RECORD_SAMPLE => parse_sample(sample_type, record.body)?.pid,
        PERF_RECORD_LOST | PERF_RECORD_LOST_SAMPLES => None,
        _ => id_trailer(sample_type, record.body)?.0.map(|(pid, _)| pid),
    }
}

/// The records of `stream` that belong to a process `keep` accepts, plus those of no
/// process (losses), in order, and how many: a per-CPU ring shared by every target cut
/// down to one snapshot's processes. Records of other processes are dropped unread.
#[must_use]
pub fn retain_processes(
    sample_type: u64,
    stream: &[u8],
    keep: impl Fn(u32) -> bool,
) -> (Vec<u8>, u64) {
    retain_records(stream, |record| {
        record_pid(sample_type, record).is_none_or(&keep)
    })
}

/// The records of `stream` that `keep` accepts, in order, and how many.
#[must_use]
pub fn retain_records(stream: &[u8], keep: impl Fn(&RawRecord<'_>) -> bool) -> (Vec<u8>, u64) {
    let mut out = Vec::new();
    let mut count = 0;
    let mut at = 0usize;
    for record in records(stream) {
        let size = HEADER_SIZE + record.body.len();
        let bytes = stream.get(at..at + size);
        at += size;
        if keep(&record)
            && let Some(bytes) = bytes
        {
            out.extend_from_slice(bytes);
            count += 1;
        }
    }
    (out, count)
}

/// What a record stream holds, at a glance.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamSummary {
    pub records: u64,
    pub samples: u64,
    pub pids: BTreeSet<u32>,
    pub tids: BTreeSet<u32>,
    /// Earliest and latest sample time.
    pub first_time: Option<u64>,
    pub last_time: Option<u64>,
    /// Records the kernel reported lost (LOST, `LOST_SAMPLES`).
    pub lost: u64,
}

impl StreamSummary {
    /// Adds the records of `stream`, written with `sample_type`.
    pub fn add(&mut self, sample_type: u64, stream: &[u8]) {
        // Pid, tid and time come before the registers: the mask is not needed.
        for rec in records(stream) {
            self.records += 1;
            match rec.kind {
                PERF_RECORD_SAMPLE => {
                    let Some(s) = parse_sample(sample_type, rec.body) else {
                        continue;
                    };
                    self.samples += 1;
                    self.pids.extend(s.pid);
                    self.tids.extend(s.tid);
                    if let Some(t) = s.time {
                        self.first_time = Some(self.first_time.map_or(t, |f| f.min(t)));
                        self.last_time = Some(self.last_time.map_or(t, |l| l.max(t)));
                    }
                }
                PERF_RECORD_FORK => {
                    // pid, ppid, tid, ptid: the new task's process.
                    if let Some(b) = rec.body.get(..4) {
                        self.pids
                            .insert(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    }
                }
                PERF_RECORD_LOST | PERF_RECORD_LOST_SAMPLES => self.lost += lost_count(&rec),
                _ => {}
            }
        }
    }
}

/// How many records a `LOST` (id, lost) or `LOST_SAMPLES` (lost) record reports; 0 for
/// any other record or a short body.
fn lost_count(rec: &RawRecord<'_>) -> u64 {
    let at = match rec.kind {
        PERF_RECORD_LOST => 8,
        PERF_RECORD_LOST_SAMPLES => 0,
        _ => return 0,
    };
    rec.body
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// What a PT recorder's sideband says was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PtLosses {
    /// `PERF_RECORD_AUX` records flagged truncated, partial or collided: trace data the
    /// kernel or the PMU dropped (an overwrite-mode record is no loss: that is the ring).
    pub aux: u64,
    /// Sideband records dropped (`LOST`, `LOST_SAMPLES` counts).
    pub perf: u64,
}

impl PtLosses {
    /// Adds the losses reported in the sideband `stream`.
    pub fn add(&mut self, stream: &[u8]) {
        const LOSS: u64 = PERF_AUX_FLAG_TRUNCATED | PERF_AUX_FLAG_PARTIAL | PERF_AUX_FLAG_COLLISION;
        for rec in records(stream) {
            // aux_offset, aux_size, flags
            let flags = rec.body.get(16..24).and_then(|b| b.try_into().ok());
            match rec.kind {
                PERF_RECORD_AUX if flags.map_or(0, u64::from_le_bytes) & LOSS != 0 => {
                    self.aux += 1;
                }
                _ => self.perf += lost_count(&rec),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: u32, body: &[u8]) -> Vec<u8> {
        let mut r = kind.to_le_bytes().to_vec();
        r.extend(0u16.to_le_bytes());
        r.extend(u16::try_from(8 + body.len()).unwrap().to_le_bytes());
        r.extend(body);
        r
    }

    fn words(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    const ST: u64 =
        SAMPLE_IP | SAMPLE_TID | SAMPLE_TIME | SAMPLE_CALLCHAIN | SAMPLE_CPU | SAMPLE_PERIOD;

    #[test]
    fn a_shared_ring_is_cut_down_to_one_process() {
        // Samples by their TID field; other records by their `sample_id_all` trailer
        // (pid/tid, time); losses belong to nobody and are kept.
        let st = SAMPLE_IP | SAMPLE_TID | SAMPLE_TIME;
        let sample = |pid: u64| {
            rec(
                PERF_RECORD_SAMPLE,
                &words(&[0x40_1000, (pid << 32) | pid, 5]),
            )
        };
        let switch = |pid: u64| {
            rec(
                PERF_RECORD_SWITCH_CPU_WIDE,
                &words(&[(9 << 32) | 9, (pid << 32) | pid, 6]),
            )
        };
        let lost = rec(PERF_RECORD_LOST, &words(&[1, 3, (1 << 32) | 1, 7]));
        let stream = [
            sample(5),
            switch(6),
            sample(6),
            lost.clone(),
            switch(5),
            sample(5),
        ]
        .concat();
        let (kept, count) = retain_processes(st, &stream, |p| p == 5);
        assert_eq!(count, 4);
        assert_eq!(kept, [sample(5), lost, switch(5), sample(5)].concat());
        let pids: Vec<Option<u32>> = records(&stream).map(|r| record_pid(st, &r)).collect();
        assert_eq!(
            pids,
            vec![Some(5), Some(6), Some(6), None, Some(5), Some(5)]
        );
        // A torn stream keeps what came before the bad header.
        let mut torn = stream.clone();
        torn.extend([0xff; 8]);
        assert_eq!(retain_processes(st, &torn, |p| p == 5).1, 4);
    }

    #[test]
    fn samples_parse_with_callchains() {
        let body = words(&[
            0x0040_1000,
            (7u64 << 32) | 0x5,
            1000,
            1,
            10_000,
            3,
            PERF_CONTEXT_USER,
            0x0040_1000,
            0x0040_1234,
        ]);
        let s = parse_sample(ST, &body).unwrap();
        assert_eq!(
            (s.ip, s.pid, s.tid, s.time),
            (Some(0x0040_1000), Some(5), Some(7), Some(1000))
        );
        assert_eq!((s.cpu, s.period), (Some(1), Some(10_000)));
        assert_eq!(
            s.user_callchain().collect::<Vec<_>>(),
            vec![0x0040_1000, 0x0040_1234]
        );
        // Truncated bodies and absurd callchain lengths are None, not panics.
        for cut in 0..body.len() {
            let _ = parse_sample(ST, &body[..cut]);
        }
        let mut huge = body.clone();
        huge[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(parse_sample(ST, &huge), None);
        assert_eq!(parse_sample(SAMPLE_READ, &body), None);
    }

    #[test]
    fn user_registers_and_stacks_parse_with_their_mask() {
        let layout = Layout {
            sample_type: SAMPLE_TID | SAMPLE_TIME | SAMPLE_REGS_USER | SAMPLE_STACK_USER,
            // AX too: the values are in bit order, BP/SP/IP after it.
            regs_user: UNWIND_REGS | 1,
        };
        let mut body = words(&[(7u64 << 32) | 5, 1000, 2, 0xaa, 0xb0, 0x7ff0, 0x40_1000, 16]);
        body.extend([1u8; 16]);
        body.extend(words(&[12]));
        let s = parse_sample(layout, &body).unwrap();
        assert_eq!(
            s.user_regs,
            Some(UserRegs {
                ip: 0x40_1000,
                sp: 0x7ff0,
                bp: 0xb0
            })
        );
        assert_eq!(
            s.user_stack,
            Some(64..76),
            "the dyn_size bytes the kernel copied"
        );
        // A kernel thread's sample: ABI 0, no registers; an empty stack copy.
        let none = words(&[(7u64 << 32) | 5, 1000, 0, 0]);
        let s = parse_sample(layout, &none).unwrap();
        assert_eq!((s.user_regs, s.user_stack), (None, None));
        // Short bodies are None; without the mask the registers are left out.
        for cut in 0..body.len() {
            assert!(parse_sample(layout, &body[..cut]).is_none_or(|s| s.user_stack.is_none()));
        }
        let s = parse_sample(layout.sample_type, &body).unwrap();
        assert_eq!((s.time, s.user_regs), (Some(1000), None));
    }

    #[test]
    fn summary_counts_samples_forks_and_losses() {
        let mut stream = rec(
            PERF_RECORD_SAMPLE,
            &words(&[1, (11u64 << 32) | 0xa, 500, 0, 1, 0]),
        );
        stream.extend(rec(
            PERF_RECORD_SAMPLE,
            &words(&[2, (12u64 << 32) | 0xa, 900, 0, 1, 0]),
        ));
        stream.extend(rec(
            PERF_RECORD_FORK,
            &words(&[(0xau64 << 32) | 0x14, (0xau64 << 32) | 0x14, 700]),
        ));
        stream.extend(rec(PERF_RECORD_LOST, &words(&[1, 4])));
        stream.extend(rec(PERF_RECORD_LOST_SAMPLES, &words(&[3])));
        stream.extend([0xff; 5]); // trailing garbage ends the stream
        let mut sum = StreamSummary::default();
        sum.add(ST, &stream);
        assert_eq!((sum.records, sum.samples, sum.lost), (5, 2, 7));
        assert_eq!(sum.pids.into_iter().collect::<Vec<_>>(), vec![10, 20]);
        assert_eq!(sum.tids.into_iter().collect::<Vec<_>>(), vec![11, 12]);
        assert_eq!((sum.first_time, sum.last_time), (Some(500), Some(900)));
    }

    #[test]
    fn pt_losses_count_flagged_aux_records_and_lost_records() {
        const OVERWRITE: u64 = 0x02;
        let mut stream = Vec::new();
        for flags in [
            OVERWRITE,
            OVERWRITE | PERF_AUX_FLAG_TRUNCATED,
            PERF_AUX_FLAG_PARTIAL,
            PERF_AUX_FLAG_COLLISION,
            0,
        ] {
            stream.extend(rec(PERF_RECORD_AUX, &words(&[0, 4096, flags, 7])));
        }
        stream.extend(rec(PERF_RECORD_LOST, &words(&[1, 5])));
        stream.extend(rec(PERF_RECORD_LOST_SAMPLES, &words(&[2])));
        // A record too short for its flags is no loss.
        stream.extend(rec(PERF_RECORD_AUX, &words(&[0])));
        let mut losses = PtLosses::default();
        losses.add(&stream);
        losses.add(&rec(
            PERF_RECORD_AUX,
            &words(&[0, 1, PERF_AUX_FLAG_TRUNCATED]),
        ));
        assert_eq!(losses, PtLosses { aux: 4, perf: 7 });
    }

    #[test]
    fn id_trailers_read_from_the_end() {
        let st = SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU;
        let mut body = b"comm\0\0\0\0".to_vec();
        body.extend(words(&[(3u64 << 32) | 0x2, 99, 1]));
        assert_eq!(id_trailer(st, &body), Some((Some((2, 3)), Some(99))));
        assert_eq!(id_trailer(st, &body[..8]), None);
    }
}
