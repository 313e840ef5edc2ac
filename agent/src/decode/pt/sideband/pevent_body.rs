//! The fields of the perf records that change a process's code image.
//!
//! In: a [`PerfRecord`] read by [`super::pevent`]. Out: [`RecordBody`], the few fields
//! ptxed's sideband session ([`super::sb_session`]) acts on (who maps what where, who
//! forks and execs, which process runs next), so the session never indexes raw bytes.

use super::pevent::{
    PERF_AUX_FLAG_TRUNCATED, PERF_RECORD_AUX, PERF_RECORD_COMM, PERF_RECORD_FORK,
    PERF_RECORD_ITRACE_START, PERF_RECORD_LOST, PERF_RECORD_MISC_COMM_EXEC,
    PERF_RECORD_MISC_SWITCH_OUT, PERF_RECORD_MMAP, PERF_RECORD_MMAP2, PERF_RECORD_SWITCH,
    PERF_RECORD_SWITCH_CPU_WIDE, PerfRecord, c_string, u32_at, u64_at,
};

/// `perf_event_header.misc` bits of the CPU mode, and the kernel's mode.
const PERF_RECORD_MISC_CPUMODE_MASK: u16 = 7;
const PERF_RECORD_MISC_KERNEL: u16 = 1;

/// What a record says, as far as process images are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordBody {
    /// MMAP or MMAP2: `len` bytes of `filename` from `pgoff` mapped at `addr` in `pid`.
    Mmap {
        pid: u32,
        addr: u64,
        len: u64,
        pgoff: u64,
        filename: String,
        /// A kernel mapping (libipt leaves those to the kernel core dump).
        kernel: bool,
    },
    /// COMM; `exec` when it comes from an exec (the process gets a new image).
    Comm {
        pid: u32,
        exec: bool,
    },
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
    },
    ItraceStart {
        pid: u32,
    },
    /// A context switch of the traced task; the pid comes from the sample.
    Switch {
        out: bool,
    },
    /// A CPU-wide context switch: to (`out`) or from `next_prev_pid`.
    SwitchCpuWide {
        out: bool,
        next_prev_pid: u32,
    },
    Lost,
    Aux {
        truncated: bool,
    },
    /// Anything else (it does not change images).
    Other,
}

impl RecordBody {
    /// The fields of `rec`; `None` when a field lies outside the record (the reader
    /// checks the sizes of known records, so this only guards against surprises).
    pub fn of(rec: &PerfRecord<'_>) -> Option<Self> {
        let b = rec.body;
        let out = rec.misc & PERF_RECORD_MISC_SWITCH_OUT != 0;
        Some(match rec.kind {
            PERF_RECORD_MMAP | PERF_RECORD_MMAP2 => {
                let name_at = if rec.kind == PERF_RECORD_MMAP { 32 } else { 64 };
                let (name, _) = c_string(b, name_at).ok()?;
                Self::Mmap {
                    pid: u32_at(b, 0)?,
                    addr: u64_at(b, 8)?,
                    len: u64_at(b, 16)?,
                    pgoff: u64_at(b, 24)?,
                    filename: String::from_utf8_lossy(name).into_owned(),
                    kernel: rec.misc & PERF_RECORD_MISC_CPUMODE_MASK == PERF_RECORD_MISC_KERNEL,
                }
            }
            PERF_RECORD_COMM => Self::Comm {
                pid: u32_at(b, 0)?,
                exec: rec.misc & PERF_RECORD_MISC_COMM_EXEC != 0,
            },
            PERF_RECORD_FORK => Self::Fork {
                pid: u32_at(b, 0)?,
                ppid: u32_at(b, 4)?,
                tid: u32_at(b, 8)?,
            },
            PERF_RECORD_ITRACE_START => Self::ItraceStart { pid: u32_at(b, 0)? },
            PERF_RECORD_SWITCH => Self::Switch { out },
            PERF_RECORD_SWITCH_CPU_WIDE => Self::SwitchCpuWide {
                out,
                next_prev_pid: u32_at(b, 0)?,
            },
            PERF_RECORD_LOST => Self::Lost,
            PERF_RECORD_AUX => Self::Aux {
                truncated: u64_at(b, 16)? & PERF_AUX_FLAG_TRUNCATED != 0,
            },
            _ => Self::Other,
        })
    }
}
