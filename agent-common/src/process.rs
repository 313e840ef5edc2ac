//! The record the process programs send through the `PROC_EVENTS` ring buffer, so that the
//! agent learns about new and finished processes without polling `/proc`.

/// A process called `execve` (sent for every exec on the machine while enabled).
pub const PROC_EXEC: u32 = 1;
/// The main thread of a traced process exited (its `TARGET_TGIDS` entry is gone).
pub const PROC_EXIT: u32 = 2;

/// One process event. Plain integers: any bytes form a valid value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessRecord {
    /// `bpf_ktime_get_ns()` at the event.
    pub timestamp_ns: u64,
    /// `PROC_*`.
    pub kind: u32,
    /// The process (thread group id).
    pub tgid: u32,
    /// `PROC_EXEC`: the rules (bitmask) whose comm pre-selected the process into the
    /// kernel's target set at this exec, 0 when none; so the agent can account for every
    /// process the kernel selected (`lookback_exec_selected_outcomes_total`).
    pub selected: u64,
}

/// Entries of the kernel's target set (`TARGET_TGIDS`) unless the agent sizes it
/// otherwise: processes selected at once (threads do not count).
pub const DEFAULT_MAX_TARGETS: u32 = 16384;

/// `EXEC_SELECTED` index: processes the kernel's target set took at exec by their comm.
pub const EXEC_SELECTED_ALL: u32 = 0;
/// `EXEC_SELECTED` index: of those, the ones whose exec record the full ring dropped.
pub const EXEC_SELECTED_LOST: u32 = 1;

/// Size of a [`ProcessRecord`] on the ring.
pub const PROCESS_RECORD_SIZE: usize = size_of::<ProcessRecord>();
