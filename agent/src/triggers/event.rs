//! The trigger events the engine delivers: a checked, owned view of the kernel's
//! `TriggerRecord`, with a one-line human form and a JSON form, and the stack copy that
//! comes with it ([`StackCopy`]: the [`UserRegs`] that unwinding starts from, also the
//! registers of perf samples, and the stack bytes).
use std::fmt;

use lookback_common::trigger::{
    PHASE_ENTRY, PHASE_RUNNING, RecordKind, TRIGGER_ENTRY_SIZE, TRIGGER_KERNEL_FRAMES,
    TRIGGER_RECORD_SIZE, TRIGGER_STACK_COPY, TRIGGER_STACK_FRAMES, TriggerRecord, TriggerStack,
};

use serde::Serialize;

use crate::rules::{errno_name, signal_name, syscall_name};

/// What fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerKind {
    Function,
    Syscall,
    Signal,
}

/// One trigger met in the kernel and not suppressed there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TriggerEvent {
    pub rule_id: u32,
    pub kind: TriggerKind,
    /// Fired on entry (function/syscall entry, signal) rather than on return.
    pub on_entry: bool,
    /// Fired while the call was still running (`detect: running`): `duration_ns` is how
    /// long it had run at `timestamp_ns`, and it has no return value.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub running: bool,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`).
    pub timestamp_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ret: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender_pid: Option<u32>,
    /// Function entry: probed address; function return: the return address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// The triggering thread's user stack at the trigger, leaf first (a frame-pointer walk
    /// in the kernel; see [`TriggerStack`]); empty when the kernel gave none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<u64>,
    /// The thread's kernel stack at the trigger, leaf first (syscall and signal triggers;
    /// kept in snapshots recorded with `include_kernel`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernel_stack: Vec<u64>,
    /// The thread's registers and user stack bytes at the trigger, for unwinding code
    /// without frame pointers (`stack` is then 1–2 frames deep); unwound into the
    /// snapshot's trigger stack ([`crate::unwind::complete_trigger_stack`]).
    #[serde(skip)]
    pub stack_copy: Option<StackCopy>,
}

/// Bytes from the ring buffer that do not form a trigger record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("trigger record of {len} bytes, expected at least {TRIGGER_RECORD_SIZE}")]
    Short { len: usize },
    #[error("trigger record with unknown kind {kind}")]
    Kind { kind: u32 },
}

/// The kernel's record in `bytes`, copied out as is (no allocation: the freeze path reads
/// the rule and process from it before anything else happens).
pub fn record_from_bytes(bytes: &[u8]) -> Result<TriggerRecord, EventError> {
    if bytes.len() < TRIGGER_RECORD_SIZE {
        return Err(EventError::Short { len: bytes.len() });
    }
    // SAFETY: length checked above; TriggerRecord is repr(C) plain integers, valid for
    // every bit pattern; read_unaligned makes no alignment assumption on ring memory.
    Ok(unsafe { bytes.as_ptr().cast::<TriggerRecord>().read_unaligned() })
}

/// The stack after the record in `bytes`, copied out as is (no allocation, as the record);
/// empty when the entry is too short to hold one.
#[must_use]
pub fn stack_from_bytes(bytes: &[u8]) -> TriggerStack {
    let mut stack = TriggerStack {
        bytes: 0,
        frames: [0; TRIGGER_STACK_FRAMES],
        kernel_bytes: 0,
        kernel_frames: [0; TRIGGER_KERNEL_FRAMES],
    };
    if bytes.len() >= TRIGGER_RECORD_SIZE + size_of::<TriggerStack>() {
        // SAFETY: length checked; TriggerStack is repr(C) plain integers, valid for every
        // bit pattern; it starts right after the record (both are 8-byte aligned).
        stack = unsafe {
            bytes
                .as_ptr()
                .add(TRIGGER_RECORD_SIZE)
                .cast::<TriggerStack>()
                .read_unaligned()
        };
    }
    stack
}

/// The user registers that unwinding needs: of the trigger's [`StackCopy`] here, and of
/// perf samples (`capture::records::Sample`, which re-exports this type).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// The triggering thread's registers and stack bytes (from SP upwards), for unwinding in
/// userspace with the binaries' CFI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackCopy {
    pub regs: UserRegs,
    pub bytes: Vec<u8>,
}

/// The stack copy after the record and stack in `bytes` (`TriggerStackCopy`: ip, sp, bp,
/// len, then the bytes); `None` when the entry has none, or no registers.
#[must_use]
pub fn stack_copy_from_bytes(bytes: &[u8]) -> Option<StackCopy> {
    if bytes.len() < TRIGGER_ENTRY_SIZE {
        return None;
    }
    let at = TRIGGER_RECORD_SIZE + size_of::<TriggerStack>();
    let word = |i: usize| {
        let start = at + 8 * i;
        bytes
            .get(start..start + 8)
            .and_then(|w| w.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let (ip, sp, bp, len) = (word(0)?, word(1)?, word(2)?, word(3)?);
    let len = usize::try_from(len).ok()?.min(TRIGGER_STACK_COPY);
    (ip != 0 && sp != 0).then(|| StackCopy {
        regs: UserRegs { ip, sp, bp },
        bytes: bytes
            .get(at + 32..at + 32 + len)
            .map(<[u8]>::to_vec)
            .unwrap_or_default(),
    })
}

/// The user frames of `stack`, leaf first (at most [`TRIGGER_STACK_FRAMES`]; trailing
/// zeros, where the walk ended, dropped).
#[must_use]
pub fn stack_frames(stack: &TriggerStack) -> Vec<u64> {
    frames_written(&stack.frames, stack.bytes)
}

/// The kernel frames of `stack`, leaf first; only kernel addresses (a helper that wrote
/// anything else wrote no kernel stack).
#[must_use]
pub fn kernel_stack_frames(stack: &TriggerStack) -> Vec<u64> {
    let mut frames = frames_written(&stack.kernel_frames, stack.kernel_bytes);
    if !frames.iter().all(|&a| crate::sys::is_kernel_address(a)) {
        frames.clear();
    }
    frames
}

/// The first `bytes / 8` of `frames` (at most all), without trailing zeros.
fn frames_written(frames: &[u64], bytes: u64) -> Vec<u64> {
    let n = usize::try_from(bytes / 8).unwrap_or(0).min(frames.len());
    let mut out = frames[..n].to_vec();
    while out.last() == Some(&0) {
        out.pop();
    }
    out
}

impl TriggerEvent {
    /// Decodes one ring-buffer entry (the record, and the stack after it).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EventError> {
        let mut event = Self::from_record(&record_from_bytes(bytes)?)?;
        let stack = stack_from_bytes(bytes);
        event.stack = stack_frames(&stack);
        event.kernel_stack = kernel_stack_frames(&stack);
        event.stack_copy = stack_copy_from_bytes(bytes);
        Ok(event)
    }

    /// Converts a record, checking its kind.
    pub fn from_record(r: &TriggerRecord) -> Result<Self, EventError> {
        let kind = match RecordKind::try_from(r.kind) {
            Ok(RecordKind::Function) => TriggerKind::Function,
            Ok(RecordKind::Syscall) => TriggerKind::Syscall,
            Ok(RecordKind::Signal) => TriggerKind::Signal,
            Err(kind) => return Err(EventError::Kind { kind }),
        };
        let on_entry = r.phase == PHASE_ENTRY;
        let running = r.phase == PHASE_RUNNING;
        let comm_len = r.comm.iter().position(|&b| b == 0).unwrap_or(r.comm.len());
        let is = |k| (kind == k).then_some(());
        Ok(Self {
            rule_id: r.rule_id,
            kind,
            on_entry,
            running,
            pid: r.pid,
            tid: r.tid,
            comm: String::from_utf8_lossy(&r.comm[..comm_len]).into_owned(),
            timestamp_ns: r.timestamp_ns,
            duration_ns: (!on_entry && kind != TriggerKind::Signal).then_some(r.duration_ns),
            syscall: is(TriggerKind::Syscall).map(|()| r.syscall_nr),
            ret: (kind != TriggerKind::Signal && !on_entry && !running).then_some(r.ret),
            errno: (kind == TriggerKind::Syscall && !on_entry && !running && r.ret < 0)
                .then(|| u32::try_from(r.ret.unsigned_abs()).unwrap_or(u32::MAX)),
            signal: is(TriggerKind::Signal).map(|()| r.signal),
            sender_pid: is(TriggerKind::Signal).map(|()| r.sender_pid),
            ip: is(TriggerKind::Function).map(|()| r.ip),
            depth: is(TriggerKind::Function).map(|()| r.depth),
            stack: Vec::new(),
            kernel_stack: Vec::new(),
            stack_copy: None,
        })
    }

    /// The trigger details for humans: `duration=8.1ms`, `fsync=-5 (EIO)`, `SIGSEGV from 12`.
    pub fn detail(&self) -> String {
        let mut parts = Vec::new();
        match self.kind {
            TriggerKind::Function => {
                if !self.running {
                    parts.push(if self.on_entry { "entry" } else { "return" }.to_owned());
                }
            }
            TriggerKind::Syscall => {
                let nr = self.syscall.unwrap_or(u32::MAX);
                let name = syscall_name(nr).map_or_else(|| format!("syscall {nr}"), str::to_owned);
                match (self.ret, self.errno) {
                    (Some(_), Some(e)) => {
                        parts.push(format!("{name} = -{e} ({})", errno_name(e).unwrap_or("?")));
                    }
                    (Some(r), None) => parts.push(format!("{name} = {r}")),
                    _ => parts.push(name),
                }
            }
            TriggerKind::Signal => {
                let sig = self.signal.unwrap_or(0);
                let name = signal_name(sig).map_or_else(|| format!("signal {sig}"), str::to_owned);
                parts.push(format!("{name} from pid {}", self.sender_pid.unwrap_or(0)));
            }
        }
        match self.duration_ns {
            Some(d) if self.running => {
                parts.push(format!("running for {} (still inside)", format_ns(d)));
            }
            Some(d) => parts.push(format!("duration {}", format_ns(d))),
            None => {}
        }
        parts.join(", ")
    }
}

/// `1.234ms`, `56.0us`, `2.000s`.
pub fn format_ns(ns: u64) -> String {
    #[expect(clippy::cast_precision_loss, reason = "display only")]
    let v = ns as f64;
    if ns >= 1_000_000_000 {
        format!("{:.3}s", v / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.3}ms", v / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1}us", v / 1e3)
    } else {
        format!("{ns}ns")
    }
}

impl fmt::Display for TriggerEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} [{}] [{}] {:?}: {}",
            self.comm,
            self.pid,
            self.tid,
            self.kind,
            self.detail()
        )
    }
}

#[cfg(test)]
mod tests {
    use lookback_common::{
        rule::{KIND_SIGNAL, KIND_SYSCALL},
        trigger::PHASE_RETURN,
    };

    use super::*;

    fn bytes(r: &TriggerRecord) -> Vec<u8> {
        // SAFETY: TriggerRecord is repr(C) plain data; we view it as bytes for the test.
        unsafe {
            std::slice::from_raw_parts((&raw const *r).cast::<u8>(), TRIGGER_RECORD_SIZE).to_vec()
        }
    }

    #[test]
    fn the_stack_after_the_record_is_read_up_to_what_the_kernel_wrote() {
        let r = TriggerRecord {
            kind: KIND_SYSCALL,
            phase: PHASE_RETURN,
            ..TriggerRecord::default()
        };
        let mut entry = bytes(&r);
        // Without a stack (a short entry): none.
        assert!(
            TriggerEvent::from_bytes(&entry)
                .expect("valid")
                .stack
                .is_empty()
        );
        let mut frames = [0u64; TRIGGER_STACK_FRAMES];
        frames[..4].copy_from_slice(&[0x1000, 0x2000, 0x3000, 0]);
        frames[4] = 0xdead; // past what was written: never read
        entry.extend(32u64.to_le_bytes());
        for f in frames {
            entry.extend(f.to_le_bytes());
        }
        let user_only = entry.len();
        // The kernel's part: two frames written.
        let mut kernel = [0u64; TRIGGER_KERNEL_FRAMES];
        kernel[..3].copy_from_slice(&[0xffff_ffff_8100_0010, 0xffff_ffff_8100_0310, 0xdead]);
        entry.extend(16u64.to_le_bytes());
        for f in kernel {
            entry.extend(f.to_le_bytes());
        }
        let e = TriggerEvent::from_bytes(&entry).expect("valid");
        assert_eq!(e.stack, [0x1000, 0x2000, 0x3000]);
        assert_eq!(
            e.kernel_stack,
            [0xffff_ffff_8100_0010, 0xffff_ffff_8100_0310]
        );
        // A kernel part with a user address in it is not a kernel stack.
        let mut bogus = entry.clone();
        bogus[user_only + 16..user_only + 24].copy_from_slice(&0x4000u64.to_le_bytes());
        assert!(
            TriggerEvent::from_bytes(&bogus)
                .expect("valid")
                .kernel_stack
                .is_empty()
        );
        assert_eq!(e.stack_copy, None, "an entry without the copy");
        // The copy: registers, the length, the bytes (only `len` of them are read).
        for w in [0x40_1000u64, 0x7ff0, 0x7ff8, 3] {
            entry.extend(w.to_le_bytes());
        }
        entry.extend([7, 8, 9, 10]);
        entry.resize(TRIGGER_ENTRY_SIZE, 0);
        let e = TriggerEvent::from_bytes(&entry).expect("valid");
        let copy = e.stack_copy.expect("a copy");
        assert_eq!(
            copy.regs,
            UserRegs {
                ip: 0x40_1000,
                sp: 0x7ff0,
                bp: 0x7ff8
            }
        );
        assert_eq!(copy.bytes, [7, 8, 9]);
        // A byte count beyond the array is capped.
        let mut full = bytes(&r);
        full.extend(u64::MAX.to_le_bytes());
        for _ in 0..TRIGGER_STACK_FRAMES {
            full.extend(0x4000u64.to_le_bytes());
        }
        full.resize(TRIGGER_RECORD_SIZE + size_of::<TriggerStack>(), 0);
        assert_eq!(
            TriggerEvent::from_bytes(&full).expect("valid").stack.len(),
            TRIGGER_STACK_FRAMES
        );
    }

    #[test]
    fn decodes_a_failing_syscall() {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"work");
        let r = TriggerRecord {
            kind: KIND_SYSCALL,
            phase: PHASE_RETURN,
            syscall_nr: 257,
            ret: -2,
            duration_ns: 1500,
            pid: 7,
            tid: 8,
            comm,
            ..TriggerRecord::default()
        };
        let e = TriggerEvent::from_bytes(&bytes(&r)).expect("valid");
        assert_eq!(
            (e.syscall, e.errno, e.comm.as_str()),
            (Some(257), Some(2), "work")
        );
        assert_eq!(e.duration_ns, Some(1500));
        assert!(e.detail().contains("= -2"), "{}", e.detail());
    }

    #[test]
    fn rejects_short_and_unknown_records() {
        assert_eq!(
            TriggerEvent::from_bytes(&[0; 8]),
            Err(EventError::Short { len: 8 })
        );
        let r = TriggerRecord {
            kind: 99,
            ..TriggerRecord::default()
        };
        assert_eq!(
            TriggerEvent::from_bytes(&bytes(&r)),
            Err(EventError::Kind { kind: 99 })
        );
    }

    #[test]
    fn signal_has_no_duration() {
        let r = TriggerRecord {
            kind: KIND_SIGNAL,
            phase: PHASE_ENTRY,
            signal: 11,
            sender_pid: 3,
            ..TriggerRecord::default()
        };
        let e = TriggerEvent::from_record(&r).expect("valid");
        assert_eq!(
            (e.signal, e.sender_pid, e.duration_ns),
            (Some(11), Some(3), None)
        );
    }

    #[test]
    fn formats_durations() {
        assert_eq!(format_ns(999), "999ns");
        assert_eq!(format_ns(8_100_000), "8.100ms");
        assert_eq!(format_ns(2_000_000_000), "2.000s");
    }
}
