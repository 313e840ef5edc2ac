//! Raw system calls: the only module that calls `bpf`, `perf_event_open`, `ioctl`, `mmap`
//! and friends directly. Everything here is a thin, safe wrapper over one call, returning
//! an owned file descriptor or a [`SyscallError`] that names the call and keeps the errno.
//! Higher stages decide what a failure means; nothing here prints or logs. Beside the
//! calls, the few facts of the machine every stage shares: the page size, the clocks, and
//! where kernel addresses begin ([`is_kernel_address`]).

use std::{ffi::CStr, io};

pub mod bpf;
pub mod mmap;
pub mod perf;
pub mod process;
pub mod rlimit;
pub mod signals;
pub mod thread;

/// A failed system call: which call, and the OS error it returned.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed")]
pub struct SyscallError {
    /// The call that failed, e.g. `"perf_event_open"` or `"bpf(BPF_PROG_LOAD)"`.
    pub call: &'static str,
    #[source]
    pub source: io::Error,
}

impl SyscallError {
    /// Wraps `errno` as left by the call that just failed.
    pub(crate) fn last(call: &'static str) -> Self {
        Self {
            call,
            source: io::Error::last_os_error(),
        }
    }

    /// The raw errno, when the error came from the OS.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    /// The symbolic errno (`"ENOENT"`), for the errnos these calls commonly return.
    pub fn errno_name(&self) -> Option<&'static str> {
        self.errno().and_then(errno_name)
    }
}

/// An error and its sources, joined with `": "` (what `anyhow` prints with `{:#}`), for
/// the stages that report a whole chain on one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The symbolic name of the errnos that `bpf`, `perf_event_open` and `ioctl` return.
pub fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        libc::ENOSPC => "ENOSPC",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EOVERFLOW => "EOVERFLOW",
        _ => return None,
    })
}

/// What `uname(2)` says about the running kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uname {
    pub sysname: String,
    /// The host name (of this UTS namespace: a container's own unless `hostNetwork`).
    pub nodename: String,
    pub release: String,
    pub version: String,
    pub machine: String,
}

/// Calls `uname(2)`.
pub fn uname() -> Result<Uname, SyscallError> {
    // SAFETY: `utsname` is plain old data (arrays of c_char); all-zero is a valid value.
    let mut buf: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `buf` is a valid, writable `utsname` for the duration of the call.
    if unsafe { libc::uname(&raw mut buf) } != 0 {
        return Err(SyscallError::last("uname"));
    }
    Ok(Uname {
        sysname: c_chars_to_string(&buf.sysname),
        nodename: c_chars_to_string(&buf.nodename),
        release: c_chars_to_string(&buf.release),
        version: c_chars_to_string(&buf.version),
        machine: c_chars_to_string(&buf.machine),
    })
}

/// `OVERLAYFS_SUPER_MAGIC`: the file system of container root file systems (Docker's
/// and containerd's `overlay2` / `overlayfs` snapshotters).
const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;

/// Whether `path` is on an overlay file system (`statfs(2)`); `false` when it cannot be
/// asked.
pub fn is_overlayfs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `statfs` is plain old data; all-zero is a valid value.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is NUL-terminated and `buf` is a valid, writable `statfs` for the
    // duration of the call.
    if unsafe { libc::statfs(c_path.as_ptr(), &raw mut buf) } != 0 {
        return false;
    }
    buf.f_type == OVERLAYFS_SUPER_MAGIC
}

/// The system page size (`sysconf(_SC_PAGESIZE)`); `None` if the call fails.
pub fn page_size() -> Option<usize> {
    // SAFETY: `sysconf` only reads a configuration value; no memory is passed.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|&s| s > 0)
}

/// `CLOCK_MONOTONIC` in nanoseconds (the clock of `bpf_ktime_get_ns`); 0 if the call fails.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) } != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// The time stamp counter (`rdtsc`); `None` off x86-64.
pub fn read_tsc() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` exists on every x86-64 CPU, reads a counter, touches no memory.
        Some(unsafe { core::arch::x86_64::_rdtsc() })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Whether `addr` is a kernel address (the upper half of x86-64's address space).
#[must_use]
pub const fn is_kernel_address(addr: u64) -> bool {
    addr >= 0xffff_8000_0000_0000
}

/// A `c_char` array (NUL-terminated or not) as a lossily decoded string.
fn c_chars_to_string(chars: &[libc::c_char]) -> String {
    // SAFETY: `c_char` is `i8` or `u8`, with the size and alignment of `u8`, and every bit
    // pattern is a valid `u8`; the slice covers exactly the memory of `chars`.
    let bytes = unsafe { std::slice::from_raw_parts(chars.as_ptr().cast::<u8>(), chars.len()) };
    match CStr::from_bytes_until_nul(bytes) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uname_reports_linux() {
        let u = uname().expect("uname");
        assert_eq!(u.sysname, "Linux");
        assert!(!u.release.is_empty());
    }

    #[test]
    fn page_size_is_a_power_of_two() {
        assert!(page_size().expect("page size").is_power_of_two());
    }

    #[test]
    fn kernel_addresses_are_the_upper_half() {
        assert!(is_kernel_address(0xffff_ffff_8100_0000));
        assert!(!is_kernel_address(0x7fff_ffff_f000));
    }

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(libc::ENOENT), Some("ENOENT"));
        assert_eq!(errno_name(100_000), None);
        let err = SyscallError {
            call: "x",
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        };
        assert_eq!(err.errno_name(), Some("EOPNOTSUPP"));
        assert_eq!(err.to_string(), "x failed");
    }

    #[test]
    fn c_chars_without_nul() {
        let chars: [libc::c_char; 2] = [97, 98]; // "ab", no NUL
        assert_eq!(c_chars_to_string(&chars), "ab");
    }
}
