//! Why a thread was off the CPU, from the functions it blocked in; and function names as
//! a person says them (`__GI___clock_nanosleep` → `clock_nanosleep`).
//!
//! In: the frames of an off-CPU stretch, innermost first. Out: a [`Reason`]. Why by name:
//! the recorder sees the stack at the switch, not the kernel's wait queue; the libc or
//! runtime function the thread entered says what it waited for (a sleep, a lock, I/O).

use serde::Serialize;

/// Why a thread was off the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    /// It slept for a time (`nanosleep`, `usleep`, `std::thread::sleep`, `time.Sleep`).
    Sleep,
    /// It waited for a lock, a condition or a futex.
    Lock,
    /// It waited for a file, a socket, a pipe or a poll.
    Io,
    /// It was runnable and lost the CPU (the switch was a preemption).
    Preempted,
    /// It blocked in something else, or the recorder saw no switch.
    Other,
}

impl Reason {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sleep => "sleep",
            Self::Lock => "lock",
            Self::Io => "io",
            Self::Preempted => "preempted",
            Self::Other => "other",
        }
    }

    /// How a verdict says it: `sleeping`, `waiting for a lock`, ...
    #[must_use]
    pub fn phrase(self) -> &'static str {
        match self {
            Self::Sleep => "sleeping",
            Self::Lock => "waiting for a lock",
            Self::Io => "waiting for I/O",
            Self::Preempted => "preempted (runnable, no CPU)",
            Self::Other => "blocked",
        }
    }
}

/// How many frames from the innermost are looked at: the wrapper the thread blocked in
/// and the few calls above it that say what it was for.
const LOOK: usize = 8;

/// Sleeps, by their plain names.
const SLEEP: &[&str] = &[
    "nanosleep",
    "clock_nanosleep",
    "usleep",
    "sleep",
    "thrd_sleep",
    "std::thread::sleep",
    "std::thread::sleep_ms",
    "time.Sleep",
    "runtime.timeSleep",
];

/// Substrings of lock and wait functions.
const LOCK: &[&str] = &[
    "mutex",
    "lll_lock",
    "futex",
    "pthread_cond",
    "rwlock",
    "sem_wait",
    "sem_timedwait",
    "pthread_join",
    "parking_lot",
    "Condvar",
    "semacquire",
    "runtime.lock",
    "std::sync::",
];

/// I/O calls, by their plain names.
const IO: &[&str] = &[
    "fsync",
    "fdatasync",
    "sync_file_range",
    "syncfs",
    "sync",
    "msync",
    "read",
    "pread",
    "readv",
    "preadv",
    "preadv2",
    "write",
    "pwrite",
    "writev",
    "pwritev",
    "pwritev2",
    "recv",
    "recvfrom",
    "recvmsg",
    "recvmmsg",
    "send",
    "sendto",
    "sendmsg",
    "sendmmsg",
    "sendfile",
    "splice",
    "copy_file_range",
    "accept",
    "accept4",
    "connect",
    "poll",
    "ppoll",
    "select",
    "pselect",
    "pselect6",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "io_uring_enter",
    "io_getevents",
    "open",
    "openat",
    "close",
    "fallocate",
    "ftruncate",
    "getdents",
    "fstatat",
    "statx",
    "unlink",
    "rename",
];

/// The reason of an off-CPU stretch whose switch was not a preemption, from its frames
/// (innermost first): the first of the innermost [`LOOK`] frames that is a sleep, a lock
/// or an I/O call decides.
pub fn classify<'a>(frames_innermost_first: impl Iterator<Item = &'a str>) -> Reason {
    for name in frames_innermost_first.take(LOOK) {
        let plain = plain_name(name);
        if SLEEP.contains(&plain) {
            return Reason::Sleep;
        }
        if LOCK.iter().any(|l| plain.contains(l)) {
            return Reason::Lock;
        }
        if IO.contains(&plain) {
            return Reason::Io;
        }
    }
    Reason::Other
}

/// A function's name as a person says it: glibc's internal aliases and leading
/// underscores off (`__GI___libc_write` → `write`, `__libc_open64` → `open`), a trailing
/// `64` or `_nocancel` of a C name off, C++ and Rust names without their arguments.
#[must_use]
pub fn plain_name(name: &str) -> &str {
    // `[unknown] 0x55… (file)`, `[kernel]`, `[off-cpu]`: as they are.
    if name.starts_with('[') {
        return name;
    }
    let mut s = without_parameters(name);
    loop {
        let before = s;
        for prefix in ["__GI_", "__libc_", "libc_", "__"] {
            s = s.strip_prefix(prefix).unwrap_or(s);
        }
        if s == before {
            break;
        }
    }
    if let Some(rest) = s.strip_prefix('_').filter(|r| !r.is_empty()) {
        s = rest;
    }
    let is_c = s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if is_c {
        for suffix in ["_nocancel", "64"] {
            s = s
                .strip_suffix(suffix)
                .filter(|r| !r.is_empty())
                .unwrap_or(s);
        }
    }
    s
}

/// A C++ or Rust name without its parameter list (and the qualifiers after it): only
/// overloads need those told apart. `(anonymous namespace)::run(int) const` →
/// `(anonymous namespace)::run`.
fn without_parameters(name: &str) -> &str {
    let body = name
        .trim_end_matches(" const")
        .trim_end_matches(" &&")
        .trim_end_matches(" &");
    if !body.ends_with(')') {
        return name;
    }
    let mut depth = 0usize;
    for (i, c) in body.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return if i == 0 { name } else { body[..i].trim_end() };
                }
            }
            _ => {}
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_names_read_as_people_say_them() {
        for (raw, plain) in [
            ("__GI___clock_nanosleep", "clock_nanosleep"),
            ("__GI___libc_write", "write"),
            ("__libc_open64", "open"),
            ("__GI_fsync", "fsync"),
            ("__GI___lll_lock_wait", "lll_lock_wait"),
            ("___pthread_mutex_lock", "pthread_mutex_lock"),
            ("__pread64_nocancel", "pread"),
            ("handle_request", "handle_request"),
            ("ns::Server::handle(int)", "ns::Server::handle"),
            ("_start", "start"),
            ("_", "_"),
            (
                "[unknown] 0x55a1b5aaf0a6 (crashy)",
                "[unknown] 0x55a1b5aaf0a6 (crashy)",
            ),
            (
                "(anonymous namespace)::run(int)",
                "(anonymous namespace)::run",
            ),
            (
                "shop::Cart::add(std::pair<int, (char)1>) const",
                "shop::Cart::add",
            ),
        ] {
            assert_eq!(plain_name(raw), plain, "{raw}");
        }
    }

    #[test]
    fn the_innermost_known_call_decides() {
        let reason = |frames: &[&str]| classify(frames.iter().copied());
        assert_eq!(
            reason(&["__GI___clock_nanosleep", "__GI___nanosleep", "wait"]),
            Reason::Sleep
        );
        assert_eq!(
            reason(&[
                "futex_wait",
                "__GI___lll_lock_wait",
                "___pthread_mutex_lock"
            ]),
            Reason::Lock
        );
        assert_eq!(reason(&["__GI_fsync", "flush_journal"]), Reason::Io);
        assert_eq!(reason(&["__GI___libc_read", "get_line"]), Reason::Io);
        assert_eq!(reason(&["[kernel]", "handle_fault", "main"]), Reason::Other);
        // A lock taken around a read: the innermost (the read) decides.
        assert_eq!(reason(&["read", "pthread_mutex_lock"]), Reason::Io);
    }
}
