//! Per-thread scheduling and wakeup primitives: `SCHED_FIFO` for the trigger pump, a
//! higher nice value for background writers, an `eventfd` to wake a thread blocked in
//! `poll`, and that `poll`.

use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

use super::SyscallError;

/// Puts the calling thread in `SCHED_FIFO` at `priority` (1–99): it then runs as soon as
/// it is woken, ahead of every normal (CFS) task. The kernel's RT throttling
/// (`sched_rt_runtime_us`, 95% by default) still leaves normal tasks CPU time should it
/// ever spin. Needs `CAP_SYS_NICE` (root).
pub fn set_fifo_priority(priority: i32) -> Result<(), SyscallError> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `pthread_self` is always valid for the calling thread; `param` is a valid
    // `sched_param` read by the call.
    let ret = unsafe {
        libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &raw const param)
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(SyscallError {
            call: "pthread_setschedparam(SCHED_FIFO)",
            source: std::io::Error::from_raw_os_error(ret),
        })
    }
}

/// Sets the calling thread's nice value (Linux: per thread); `nice` > 0 lowers its share of
/// the CPU against normal threads. Raising it needs no privilege.
pub fn set_nice(nice: i32) -> Result<(), SyscallError> {
    // SAFETY: plain syscalls with integer arguments; `gettid` cannot fail.
    let ret = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid.cast_unsigned(), nice)
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(SyscallError::last("setpriority"))
    }
}

/// A non-blocking, close-on-exec `eventfd` (counter 0).
pub fn eventfd() -> Result<OwnedFd, SyscallError> {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(SyscallError::last("eventfd"));
    }
    // SAFETY: a non-negative return is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to an eventfd's counter (wakes its pollers). A full counter already wakes
/// them, so a failed write is ignored.
pub fn eventfd_signal(fd: BorrowedFd<'_>) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer to a live descriptor.
    let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
}

/// Resets an eventfd's counter (non-blocking read; nothing to read is fine).
pub fn eventfd_clear(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live buffer from a live descriptor.
    let _ = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
}

/// Blocks until one of `fds` is readable (or a signal interrupts); returns which are.
pub fn poll_readable<const N: usize>(fds: [BorrowedFd<'_>; N]) -> Result<[bool; N], SyscallError> {
    let mut polls = fds.map(|fd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    let count = libc::nfds_t::try_from(N).unwrap_or(libc::nfds_t::MAX);
    // SAFETY: `polls` is a live array of `N` pollfds; the kernel writes only `revents`.
    let ret = unsafe { libc::poll(polls.as_mut_ptr(), count, -1) };
    if ret < 0 {
        let err = SyscallError::last("poll");
        if err.errno() == Some(libc::EINTR) {
            return Ok([false; N]);
        }
        return Err(err);
    }
    Ok(polls.map(|p| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0))
}
