//! `perf_event_open(2)` and the perf `ioctl`s, over the `perf-event-open-sys` bindings.
//! Callers build a [`perf_event_attr`] (plain data, safe to fill in); this module only
//! opens, enables, disables and reads, always with `PERF_FLAG_FD_CLOEXEC`.

use std::{
    ffi::CStr,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

use perf_event_open_sys::bindings::PERF_FLAG_FD_CLOEXEC;
pub use perf_event_open_sys::bindings::perf_event_attr;

use super::SyscallError;

/// Which task a perf event follows (`pid` argument of `perf_event_open`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The calling thread (`pid = 0`).
    CurrentThread,
    /// A thread or process id.
    Pid(libc::pid_t),
    /// Every task on the CPU (`pid = -1`; `cpu` must then be given).
    AllTasks,
}

impl Target {
    fn raw(self) -> libc::pid_t {
        match self {
            Self::CurrentThread => 0,
            Self::Pid(pid) => pid,
            Self::AllTasks => -1,
        }
    }
}

/// Opens a perf event. `attr.size` is set here; `cpu` `None` means any CPU (`-1`).
pub fn perf_event_open(
    attr: &perf_event_attr,
    target: Target,
    cpu: Option<u32>,
    group: Option<BorrowedFd<'_>>,
    flags: u32,
) -> Result<OwnedFd, SyscallError> {
    let mut attr = *attr;
    attr.size = u32::try_from(size_of::<perf_event_attr>()).unwrap_or(u32::MAX);
    let cpu = match cpu {
        None => -1,
        Some(cpu) => libc::c_int::try_from(cpu).map_err(|_| SyscallError {
            call: "perf_event_open",
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })?,
    };
    let group_fd = group.map_or(-1, |fd| fd.as_raw_fd());
    // SAFETY: `attr` is a fully initialised `perf_event_attr` whose `size` matches the
    // struct; any pointers in it (e.g. a uprobe path) are kept alive by the caller for this
    // call; the kernel validates every field and only reads `attr`.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &raw mut attr,
            target.raw(),
            cpu,
            group_fd,
            libc::c_ulong::from(flags | PERF_FLAG_FD_CLOEXEC),
        )
    };
    if fd < 0 {
        return Err(SyscallError::last("perf_event_open"));
    }
    // SAFETY: a non-negative return is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A uprobe (or uretprobe) on `path` at file offset `offset`, through the `uprobe` PMU
/// (Linux 4.17: type from `/sys/bus/event_source/devices/uprobe/type`, the retprobe flag bit
/// from its `format/retprobe`). Counting mode, created disabled.
#[derive(Debug, Clone, Copy)]
pub struct UprobeSpec<'a> {
    pub pmu_type: u32,
    pub path: &'a CStr,
    pub offset: u64,
    /// `Some(bit)` for a uretprobe: the `config` bit named by `format/retprobe`.
    pub retprobe_bit: Option<u32>,
}

/// Opens the uprobe described by `spec` for `target`; the path pointer stays valid for the
/// call because `spec` borrows it.
pub fn open_uprobe(
    spec: &UprobeSpec<'_>,
    target: Target,
    cpu: Option<u32>,
) -> Result<OwnedFd, SyscallError> {
    let mut attr = perf_event_attr {
        type_: spec.pmu_type,
        ..perf_event_attr::default()
    };
    if let Some(bit) = spec.retprobe_bit {
        attr.config = 1u64.checked_shl(bit).unwrap_or(0);
    }
    attr.__bindgen_anon_3.uprobe_path = spec.path.as_ptr() as u64;
    attr.__bindgen_anon_4.probe_offset = spec.offset;
    attr.set_disabled(1);
    perf_event_open(&attr, target, cpu, None, 0)
}

/// `PERF_EVENT_IOC_ENABLE`.
pub fn enable(fd: BorrowedFd<'_>) -> Result<(), SyscallError> {
    // SAFETY: `fd` is a live descriptor; ENABLE takes no pointer argument.
    let ret = unsafe { perf_event_open_sys::ioctls::ENABLE(fd.as_raw_fd(), 0) };
    if ret < 0 {
        Err(SyscallError::last("ioctl(PERF_EVENT_IOC_ENABLE)"))
    } else {
        Ok(())
    }
}

/// `PERF_EVENT_IOC_DISABLE`.
pub fn disable(fd: BorrowedFd<'_>) -> Result<(), SyscallError> {
    // SAFETY: `fd` is a live descriptor; DISABLE takes no pointer argument.
    let ret = unsafe { perf_event_open_sys::ioctls::DISABLE(fd.as_raw_fd(), 0) };
    if ret < 0 {
        Err(SyscallError::last("ioctl(PERF_EVENT_IOC_DISABLE)"))
    } else {
        Ok(())
    }
}

/// `PERF_EVENT_IOC_PAUSE_OUTPUT` (Linux 4.7): stop (`true`) or restart (`false`) writing
/// into the event's ring buffer, and every event that shares it. The events keep counting;
/// records that would have been written are dropped (counted as lost).
pub fn pause_output(fd: BorrowedFd<'_>, paused: bool) -> Result<(), SyscallError> {
    // SAFETY: `fd` is a live descriptor; PAUSE_OUTPUT takes an integer, no pointer.
    let ret =
        unsafe { perf_event_open_sys::ioctls::PAUSE_OUTPUT(fd.as_raw_fd(), u32::from(paused)) };
    if ret < 0 {
        Err(SyscallError::last("ioctl(PERF_EVENT_IOC_PAUSE_OUTPUT)"))
    } else {
        Ok(())
    }
}

/// `PERF_EVENT_IOC_ID`: the id the event's records carry (`PERF_SAMPLE_IDENTIFIER`); the
/// events a traced task's children inherit report it too.
pub fn event_id(fd: BorrowedFd<'_>) -> Result<u64, SyscallError> {
    let mut id = 0u64;
    // SAFETY: `fd` is a live descriptor; ID writes one u64 into `id`, which outlives the call.
    let ret = unsafe { perf_event_open_sys::ioctls::ID(fd.as_raw_fd(), &raw mut id) };
    if ret < 0 {
        Err(SyscallError::last("ioctl(PERF_EVENT_IOC_ID)"))
    } else {
        Ok(id)
    }
}

/// `PERF_EVENT_IOC_SET_FILTER`: an address filter (AUX PMUs such as Intel PT) or a
/// tracepoint filter, in the kernel's text syntax.
pub fn set_filter(fd: BorrowedFd<'_>, filter: &CStr) -> Result<(), SyscallError> {
    // SAFETY: `fd` is a live descriptor; the kernel copies the NUL-terminated string that
    // `filter` keeps alive for the call, and never writes to it.
    let ret = unsafe {
        perf_event_open_sys::ioctls::SET_FILTER(fd.as_raw_fd(), filter.as_ptr().cast_mut())
    };
    if ret < 0 {
        Err(SyscallError::last("ioctl(PERF_EVENT_IOC_SET_FILTER)"))
    } else {
        Ok(())
    }
}

/// `PERF_EVENT_IOC_SET_BPF`: run BPF program `prog` (type `perf_event`) at each overflow
/// of `fd`; the sample is kept only when it returns nonzero. Inherited events (threads and
/// children of the traced task) run it too.
pub fn set_bpf(fd: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> Result<(), SyscallError> {
    // SAFETY: both descriptors are live; SET_BPF takes an fd number, no pointer.
    let ret = unsafe {
        perf_event_open_sys::ioctls::SET_BPF(fd.as_raw_fd(), prog.as_raw_fd().cast_unsigned())
    };
    if ret < 0 {
        Err(SyscallError::last("ioctl(PERF_EVENT_IOC_SET_BPF)"))
    } else {
        Ok(())
    }
}

/// `PERF_EVENT_IOC_SET_OUTPUT`: `fd` writes its records into `target`'s ring buffer (same
/// CPU, same clock, same `write_backward`).
pub fn set_output(fd: BorrowedFd<'_>, target: BorrowedFd<'_>) -> Result<(), SyscallError> {
    // SAFETY: both descriptors are live; SET_OUTPUT takes an fd number, no pointer.
    let ret =
        unsafe { perf_event_open_sys::ioctls::SET_OUTPUT(fd.as_raw_fd(), target.as_raw_fd()) };
    if ret < 0 {
        Err(SyscallError::last("ioctl(PERF_EVENT_IOC_SET_OUTPUT)"))
    } else {
        Ok(())
    }
}

/// Reads the counter value of an event opened with `read_format = 0`.
pub fn read_count(fd: BorrowedFd<'_>) -> Result<u64, SyscallError> {
    let mut value = [0u8; 8];
    // SAFETY: `value` is writable for its 8 bytes, which is all we ask the kernel to write.
    let n = unsafe { libc::read(fd.as_raw_fd(), value.as_mut_ptr().cast(), value.len()) };
    if n < 0 {
        return Err(SyscallError::last("read(perf event)"));
    }
    if n != 8 {
        return Err(SyscallError {
            call: "read(perf event)",
            source: std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
        });
    }
    Ok(u64::from_ne_bytes(value))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd as _;

    use perf_event_open_sys::bindings::{PERF_COUNT_SW_CPU_CLOCK, PERF_TYPE_SOFTWARE};

    use super::*;

    #[test]
    fn software_clock_opens_enables_and_counts() {
        let mut attr = perf_event_attr {
            type_: PERF_TYPE_SOFTWARE,
            config: u64::from(PERF_COUNT_SW_CPU_CLOCK),
            ..perf_event_attr::default()
        };
        attr.set_disabled(1);
        attr.set_exclude_kernel(1);
        attr.set_exclude_hv(1);
        let fd = match perf_event_open(&attr, Target::CurrentThread, None, None, 0) {
            Ok(fd) => fd,
            // perf_event_paranoid 3+ or a seccomp filter: nothing to test here.
            Err(err) if matches!(err.errno(), Some(libc::EACCES | libc::EPERM | libc::ENOSYS)) => {
                eprintln!("skipped: {err}: {}", err.source);
                return;
            }
            Err(err) => panic!("cpu-clock: {err}: {}", err.source),
        };
        enable(fd.as_fd()).expect("enable");
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        disable(fd.as_fd()).expect("disable");
        assert!(read_count(fd.as_fd()).expect("read") > 0);
    }

    #[test]
    fn bad_pmu_type_is_an_error() {
        let attr = perf_event_attr {
            type_: 0x7fff_fff0,
            ..perf_event_attr::default()
        };
        let err = perf_event_open(&attr, Target::CurrentThread, None, None, 0).expect_err("bogus");
        assert_eq!(err.call, "perf_event_open");
    }
}
