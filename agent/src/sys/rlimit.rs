//! The process's open-files limit (`RLIMIT_NOFILE`): the agent holds perf, BPF and ring
//! fds for every traced process, far past the common soft limit of 1024. And its
//! locked-memory limit (`RLIMIT_MEMLOCK`), which bounds the perf rings of an unprivileged
//! recorder (`check::lock_budget`).
use super::SyscallError;

/// The soft and hard open-files limits.
pub fn open_files() -> Result<(u64, u64), SyscallError> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return Err(SyscallError::last("getrlimit(RLIMIT_NOFILE)"));
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// The soft locked-memory limit in bytes (`RLIM_INFINITY`: none).
pub fn locked_memory() -> Result<u64, SyscallError> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut limit) } != 0 {
        return Err(SyscallError::last("getrlimit(RLIMIT_MEMLOCK)"));
    }
    Ok(limit.rlim_cur)
}

/// Raises the soft open-files limit to the hard one. Out: (the soft limit before, after).
pub fn raise_open_files() -> Result<(u64, u64), SyscallError> {
    let (soft, hard) = open_files()?;
    if soft >= hard {
        return Ok((soft, soft));
    }
    let limit = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads one rlimit from the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) } != 0 {
        return Err(SyscallError::last("setrlimit(RLIMIT_NOFILE)"));
    }
    Ok((soft, hard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_rises_to_the_hard_one() {
        let (before, after) = raise_open_files().expect("raise");
        let (soft, hard) = open_files().expect("read");
        assert!(before <= after);
        assert_eq!((after, soft), (hard, hard));
    }
}
