//! The record a trigger program sends to userspace through the `EVENTS` ring buffer.
use crate::rule::{KIND_FUNCTION, KIND_SIGNAL, KIND_SYSCALL};

/// How a function trigger fired.
pub const PHASE_ENTRY: u32 = 1;
/// Fired on return (latency condition) — function return or syscall exit.
pub const PHASE_RETURN: u32 = 2;
/// Fired while the call was still running (`detect: running`): `duration_ns` is how long
/// it had run at `timestamp_ns`.
pub const PHASE_RUNNING: u32 = 3;

/// One trigger that was met and not suppressed. Plain integers so that any bytes the kernel
/// hands us form a valid value; `kind`/`phase` are checked with `TryFrom` on the user side.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TriggerRecord {
    /// `bpf_ktime_get_ns()` (`CLOCK_MONOTONIC`) at the trigger.
    pub timestamp_ns: u64,
    /// Function or syscall duration; 0 for entry and signal triggers.
    pub duration_ns: u64,
    /// Syscall return value (function triggers: the return register).
    pub ret: i64,
    /// Function triggers: instruction pointer (entry) or return address (return).
    pub ip: u64,
    pub rule_id: u32,
    /// `rule::KIND_*`.
    pub kind: u32,
    /// `PHASE_*`.
    pub phase: u32,
    /// Thread group (process) id of the traced process.
    pub pid: u32,
    /// Thread id in the traced process (for signals: the thread the signal was sent to).
    pub tid: u32,
    /// Syscall number (syscall triggers).
    pub syscall_nr: u32,
    /// Signal number (signal triggers).
    pub signal: u32,
    /// Process that sent the signal (signal triggers).
    pub sender_pid: u32,
    /// Function call depth on the thread when it fired (function triggers).
    pub depth: u32,
    /// Padding to a multiple of 8 bytes; always 0.
    pub reserved: u32,
    /// `comm` of the current task, NUL-padded.
    pub comm: [u8; 16],
    /// Every rule this record fired for (bit `rule_id`): one entry per event, with its
    /// stacks taken once, however many rules it met; `rule_id` is the lowest of them.
    pub rule_mask: u64,
}

/// The rule ids of `record`, lowest first: the bits of its `rule_mask`, or its `rule_id`
/// alone when the mask is empty.
pub fn record_rules(record: &TriggerRecord) -> impl Iterator<Item = u32> {
    let mask = if record.rule_mask == 0 {
        1u64.checked_shl(record.rule_id).unwrap_or(0)
    } else {
        record.rule_mask
    };
    (0..64).filter(move |bit| mask >> bit & 1 == 1)
}

/// Size of a [`TriggerRecord`] on the ring.
pub const TRIGGER_RECORD_SIZE: usize = size_of::<TriggerRecord>();

/// Frames of the triggering thread's user stack a ring entry carries at most.
pub const TRIGGER_STACK_FRAMES: usize = 32;

/// Frames of the triggering thread's kernel stack a ring entry carries at most.
pub const TRIGGER_KERNEL_FRAMES: usize = 32;

/// The user stack of the triggering thread at the trigger (`bpf_get_stack` with
/// `BPF_F_USER_STACK`: a frame-pointer walk from the thread's user registers), leaf first:
/// at a syscall exit the syscall's caller, at a fault the faulting frames, at a function's
/// return its caller's. Empty for a signal sent by another process (the stack there is the
/// sender's).
///
/// Then the kernel stack there (`bpf_get_stack` without flags), leaf first: at a syscall
/// exit the syscall's path, at a fault the fault's (`exc_page_fault`, `force_sig_fault`).
/// Empty at a uprobe (its registers are the user's: the kernel part would only be the
/// probe's own machinery).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TriggerStack {
    /// Bytes of `frames` the helper wrote (a multiple of 8); 0 when it failed.
    pub bytes: u64,
    pub frames: [u64; TRIGGER_STACK_FRAMES],
    /// Bytes of `kernel_frames` the helper wrote; 0 when there were none.
    pub kernel_bytes: u64,
    pub kernel_frames: [u64; TRIGGER_KERNEL_FRAMES],
}

/// Bytes of the triggering thread's user stack a ring entry copies at most: what the
/// sampling recorder copies by default (`perf record --call-graph dwarf`'s 8 KiB).
pub const TRIGGER_STACK_COPY: usize = 8192;

/// The triggering thread's user registers and a copy of its user stack from SP upwards,
/// for unwinding with the binaries' CFI in userspace: code without frame pointers leaves
/// [`TriggerStack`] 1–2 frames deep. Empty (`len` 0) where `TriggerStack` is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TriggerStackCopy {
    /// User IP, SP and BP at the trigger (`bpf_task_pt_regs`); all 0 when unread.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Bytes of `bytes` copied from SP upwards (8 KiB, else up to the end of the stack's
    /// mapping: the end of SP's page or of the next one); 0: none.
    pub len: u64,
    pub bytes: [u8; TRIGGER_STACK_COPY],
}

/// The triggering thread's stacks: the kernel's walks, then the copy to unwind.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TriggerStacks {
    pub stack: TriggerStack,
    pub copy: TriggerStackCopy,
}

/// One entry of the `EVENTS` ring: the record, then the stack, then the stack copy.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TriggerEntry {
    pub record: TriggerRecord,
    pub stacks: TriggerStacks,
}

/// Size of a [`TriggerEntry`] on the ring.
pub const TRIGGER_ENTRY_SIZE: usize = size_of::<TriggerEntry>();

/// The trigger kinds a record may carry, for exhaustive matching in userspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Function,
    Syscall,
    Signal,
}

impl TryFrom<u32> for RecordKind {
    type Error = u32;

    fn try_from(kind: u32) -> Result<Self, u32> {
        match kind {
            KIND_FUNCTION => Ok(Self::Function),
            KIND_SYSCALL => Ok(Self::Syscall),
            KIND_SIGNAL => Ok(Self::Signal),
            other => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_every_rule_of_its_mask_or_its_rule_id() {
        let mut r = TriggerRecord {
            rule_id: 3,
            ..TriggerRecord::default()
        };
        assert!(record_rules(&r).eq([3]), "no mask: the id");
        r.rule_mask = 1 << 0 | 1 << 5 | 1 << 63;
        assert!(record_rules(&r).eq([0, 5, 63]));
        r.rule_mask = 0;
        r.rule_id = 64;
        assert_eq!(record_rules(&r).count(), 0, "an id past the mask's width");
    }
}
