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
}

/// Size of a [`ProcessRecord`] on the ring.
pub const PROCESS_RECORD_SIZE: usize = size_of::<ProcessRecord>();
