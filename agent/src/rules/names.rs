//! Name tables of x86-64 Linux: syscalls (in `syscalls`), errno values and signals, with
//! lookups both ways and the "unknown name" messages (with a did-you-mean suggestion) that
//! the rules file and `--trigger` parsers report.

use super::error::snippet;
use super::syscalls::SYSCALLS;

/// `(number, name)` of every Linux errno on x86-64 (asm-generic), sorted by number; 41 and
/// 58 are unused.
static ERRNOS: &[(u32, &str)] = &[
    (1, "EPERM"),
    (2, "ENOENT"),
    (3, "ESRCH"),
    (4, "EINTR"),
    (5, "EIO"),
    (6, "ENXIO"),
    (7, "E2BIG"),
    (8, "ENOEXEC"),
    (9, "EBADF"),
    (10, "ECHILD"),
    (11, "EAGAIN"),
    (12, "ENOMEM"),
    (13, "EACCES"),
    (14, "EFAULT"),
    (15, "ENOTBLK"),
    (16, "EBUSY"),
    (17, "EEXIST"),
    (18, "EXDEV"),
    (19, "ENODEV"),
    (20, "ENOTDIR"),
    (21, "EISDIR"),
    (22, "EINVAL"),
    (23, "ENFILE"),
    (24, "EMFILE"),
    (25, "ENOTTY"),
    (26, "ETXTBSY"),
    (27, "EFBIG"),
    (28, "ENOSPC"),
    (29, "ESPIPE"),
    (30, "EROFS"),
    (31, "EMLINK"),
    (32, "EPIPE"),
    (33, "EDOM"),
    (34, "ERANGE"),
    (35, "EDEADLK"),
    (36, "ENAMETOOLONG"),
    (37, "ENOLCK"),
    (38, "ENOSYS"),
    (39, "ENOTEMPTY"),
    (40, "ELOOP"),
    (42, "ENOMSG"),
    (43, "EIDRM"),
    (44, "ECHRNG"),
    (45, "EL2NSYNC"),
    (46, "EL3HLT"),
    (47, "EL3RST"),
    (48, "ELNRNG"),
    (49, "EUNATCH"),
    (50, "ENOCSI"),
    (51, "EL2HLT"),
    (52, "EBADE"),
    (53, "EBADR"),
    (54, "EXFULL"),
    (55, "ENOANO"),
    (56, "EBADRQC"),
    (57, "EBADSLT"),
    (59, "EBFONT"),
    (60, "ENOSTR"),
    (61, "ENODATA"),
    (62, "ETIME"),
    (63, "ENOSR"),
    (64, "ENONET"),
    (65, "ENOPKG"),
    (66, "EREMOTE"),
    (67, "ENOLINK"),
    (68, "EADV"),
    (69, "ESRMNT"),
    (70, "ECOMM"),
    (71, "EPROTO"),
    (72, "EMULTIHOP"),
    (73, "EDOTDOT"),
    (74, "EBADMSG"),
    (75, "EOVERFLOW"),
    (76, "ENOTUNIQ"),
    (77, "EBADFD"),
    (78, "EREMCHG"),
    (79, "ELIBACC"),
    (80, "ELIBBAD"),
    (81, "ELIBSCN"),
    (82, "ELIBMAX"),
    (83, "ELIBEXEC"),
    (84, "EILSEQ"),
    (85, "ERESTART"),
    (86, "ESTRPIPE"),
    (87, "EUSERS"),
    (88, "ENOTSOCK"),
    (89, "EDESTADDRREQ"),
    (90, "EMSGSIZE"),
    (91, "EPROTOTYPE"),
    (92, "ENOPROTOOPT"),
    (93, "EPROTONOSUPPORT"),
    (94, "ESOCKTNOSUPPORT"),
    (95, "EOPNOTSUPP"),
    (96, "EPFNOSUPPORT"),
    (97, "EAFNOSUPPORT"),
    (98, "EADDRINUSE"),
    (99, "EADDRNOTAVAIL"),
    (100, "ENETDOWN"),
    (101, "ENETUNREACH"),
    (102, "ENETRESET"),
    (103, "ECONNABORTED"),
    (104, "ECONNRESET"),
    (105, "ENOBUFS"),
    (106, "EISCONN"),
    (107, "ENOTCONN"),
    (108, "ESHUTDOWN"),
    (109, "ETOOMANYREFS"),
    (110, "ETIMEDOUT"),
    (111, "ECONNREFUSED"),
    (112, "EHOSTDOWN"),
    (113, "EHOSTUNREACH"),
    (114, "EALREADY"),
    (115, "EINPROGRESS"),
    (116, "ESTALE"),
    (117, "EUCLEAN"),
    (118, "ENOTNAM"),
    (119, "ENAVAIL"),
    (120, "EISNAM"),
    (121, "EREMOTEIO"),
    (122, "EDQUOT"),
    (123, "ENOMEDIUM"),
    (124, "EMEDIUMTYPE"),
    (125, "ECANCELED"),
    (126, "ENOKEY"),
    (127, "EKEYEXPIRED"),
    (128, "EKEYREVOKED"),
    (129, "EKEYREJECTED"),
    (130, "EOWNERDEAD"),
    (131, "ENOTRECOVERABLE"),
    (132, "ERFKILL"),
    (133, "EHWPOISON"),
];

/// Other spellings of errno values: `(alias, number)`.
static ERRNO_ALIASES: &[(&str, u32)] = &[("EWOULDBLOCK", 11), ("EDEADLOCK", 35), ("ENOTSUP", 95)];

/// `(number, name)` of the standard signals on x86-64.
static SIGNALS: &[(u32, &str)] = &[
    (1, "SIGHUP"),
    (2, "SIGINT"),
    (3, "SIGQUIT"),
    (4, "SIGILL"),
    (5, "SIGTRAP"),
    (6, "SIGABRT"),
    (7, "SIGBUS"),
    (8, "SIGFPE"),
    (9, "SIGKILL"),
    (10, "SIGUSR1"),
    (11, "SIGSEGV"),
    (12, "SIGUSR2"),
    (13, "SIGPIPE"),
    (14, "SIGALRM"),
    (15, "SIGTERM"),
    (16, "SIGSTKFLT"),
    (17, "SIGCHLD"),
    (18, "SIGCONT"),
    (19, "SIGSTOP"),
    (20, "SIGTSTP"),
    (21, "SIGTTIN"),
    (22, "SIGTTOU"),
    (23, "SIGURG"),
    (24, "SIGXCPU"),
    (25, "SIGXFSZ"),
    (26, "SIGVTALRM"),
    (27, "SIGPROF"),
    (28, "SIGWINCH"),
    (29, "SIGIO"),
    (30, "SIGPWR"),
    (31, "SIGSYS"),
];

/// Other spellings of signals: `(alias, number)`.
static SIGNAL_ALIASES: &[(&str, u32)] = &[("SIGIOT", 6), ("SIGCLD", 17), ("SIGPOLL", 29)];

/// glibc's `SIGRTMIN` (the kernel's 32 and 33 are taken by the C library's threads).
const SIGRTMIN: u32 = 34;
/// `SIGRTMAX` on x86-64.
const SIGRTMAX: u32 = 64;

/// Names of signals 34–64 as `kill -l` prints them.
static RT_SIGNALS: [&str; 31] = [
    "SIGRTMIN",
    "SIGRTMIN+1",
    "SIGRTMIN+2",
    "SIGRTMIN+3",
    "SIGRTMIN+4",
    "SIGRTMIN+5",
    "SIGRTMIN+6",
    "SIGRTMIN+7",
    "SIGRTMIN+8",
    "SIGRTMIN+9",
    "SIGRTMIN+10",
    "SIGRTMIN+11",
    "SIGRTMIN+12",
    "SIGRTMIN+13",
    "SIGRTMIN+14",
    "SIGRTMIN+15",
    "SIGRTMAX-14",
    "SIGRTMAX-13",
    "SIGRTMAX-12",
    "SIGRTMAX-11",
    "SIGRTMAX-10",
    "SIGRTMAX-9",
    "SIGRTMAX-8",
    "SIGRTMAX-7",
    "SIGRTMAX-6",
    "SIGRTMAX-5",
    "SIGRTMAX-4",
    "SIGRTMAX-3",
    "SIGRTMAX-2",
    "SIGRTMAX-1",
    "SIGRTMAX",
];

fn name_of(table: &'static [(u32, &'static str)], number: u32) -> Option<&'static str> {
    let index = table.binary_search_by_key(&number, |&(n, _)| n).ok()?;
    table.get(index).map(|&(_, name)| name)
}

/// The x86-64 number of syscall `name` (`fsync` → 74); ASCII case is ignored.
pub fn syscall_number(name: &str) -> Option<u32> {
    SYSCALLS
        .iter()
        .find(|(_, known)| known.eq_ignore_ascii_case(name))
        .map(|&(number, _)| number)
}

/// The name of x86-64 syscall `number` (74 → `fsync`).
pub fn syscall_name(number: u32) -> Option<&'static str> {
    name_of(SYSCALLS, number)
}

/// The number of errno `name` (`EIO` → 5), including the aliases `EWOULDBLOCK`, `EDEADLOCK`
/// and `ENOTSUP`; ASCII case is ignored.
pub fn errno_number(name: &str) -> Option<u32> {
    let name = name.trim();
    ERRNOS
        .iter()
        .map(|&(number, known)| (known, number))
        .chain(ERRNO_ALIASES.iter().copied())
        .find(|(known, _)| known.eq_ignore_ascii_case(name))
        .map(|(_, number)| number)
}

/// The canonical name of errno `number` (11 → `EAGAIN`).
pub fn errno_name(number: u32) -> Option<&'static str> {
    name_of(ERRNOS, number)
}

/// The number of signal `name`, with or without the `SIG` prefix and in any ASCII case
/// (`SIGSEGV`, `segv` → 11); also `SIGIOT`, `SIGCLD`, `SIGPOLL`, and the real-time signals
/// `SIGRTMIN`, `SIGRTMIN+N`, `SIGRTMAX-N`, `SIGRTMAX` (34–64).
pub fn signal_number(name: &str) -> Option<u32> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    let known = SIGNALS
        .iter()
        .map(|&(number, known)| (known, number))
        .chain(SIGNAL_ALIASES.iter().copied())
        .find(|(known, _)| known.strip_prefix("SIG") == Some(bare))
        .map(|(_, number)| number);
    known.or_else(|| realtime_signal(bare))
}

/// `RTMIN`, `RTMIN+N`, `RTMAX-N`, `RTMAX` → 34–64.
fn realtime_signal(bare: &str) -> Option<u32> {
    let offset = |rest: &str, sign: char| -> Option<u32> {
        if rest.is_empty() {
            return Some(0);
        }
        let digits = rest.strip_prefix(sign)?;
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok().filter(|&n| n <= SIGRTMAX - SIGRTMIN)
    };
    if let Some(rest) = bare.strip_prefix("RTMIN") {
        return offset(rest, '+').map(|n| SIGRTMIN + n);
    }
    let rest = bare.strip_prefix("RTMAX")?;
    offset(rest, '-').map(|n| SIGRTMAX - n)
}

/// The name of signal `number` (11 → `SIGSEGV`, 34 → `SIGRTMIN`, 50 → `SIGRTMAX-14`).
pub fn signal_name(number: u32) -> Option<&'static str> {
    if (SIGRTMIN..=SIGRTMAX).contains(&number) {
        let index = usize::try_from(number - SIGRTMIN).ok()?;
        return RT_SIGNALS.get(index).copied();
    }
    name_of(SIGNALS, number)
}

/// The message for a syscall name that is not in the table.
pub(crate) fn unknown_syscall(name: &str) -> String {
    let names = SYSCALLS.iter().map(|&(_, known)| known);
    format!(
        "unknown syscall `{}`{}; expected an x86-64 syscall name such as read, fsync or openat, \
         or `any`",
        snippet(name),
        did_you_mean(&name.to_ascii_lowercase(), names)
    )
}

/// The message for an errno name that is not in the table.
pub(crate) fn unknown_errno(name: &str) -> String {
    let names = ERRNOS.iter().map(|&(_, known)| known);
    format!(
        "unknown errno `{}`{}; expected a Linux errno name such as EIO, ENOENT or EAGAIN",
        snippet(name),
        did_you_mean(&name.to_ascii_uppercase(), names)
    )
}

/// The message for a signal name that is not in the table.
pub(crate) fn unknown_signal(name: &str) -> String {
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    let names = SIGNALS.iter().map(|&(_, known)| known);
    format!(
        "unknown signal `{}`{}; expected a signal name such as SIGSEGV, SIGABRT or SEGV, \
         or SIGRTMIN+N",
        snippet(name),
        did_you_mean(&full, names)
    )
}

/// ` (did you mean `X`?)` for the closest of `names` within a small edit distance.
fn did_you_mean<'a>(wrong: &str, names: impl Iterator<Item = &'a str>) -> String {
    let wrong_len = wrong.chars().count();
    if wrong_len > 64 {
        return String::new();
    }
    let limit = (wrong_len / 3).clamp(1, 3);
    names
        .map(|name| (edit_distance(wrong, name), name))
        .filter(|&(distance, _)| distance <= limit)
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, name)| format!(" (did you mean `{name}`?)"))
        .unwrap_or_default()
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = Vec::with_capacity(b.len() + 1);
        current.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            let delete = previous[j + 1] + 1;
            let insert = current[j] + 1;
            current.push(substitute.min(delete).min(insert));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_sorted_and_unique(table: &[(u32, &str)], what: &str) {
        for pair in table.windows(2) {
            assert!(
                pair[0].0 < pair[1].0,
                "{what} table not sorted at {:?}",
                pair[1]
            );
        }
        let mut names: Vec<&str> = table.iter().map(|&(_, name)| name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names.len(),
            table.len(),
            "{what} table has a duplicate name"
        );
    }

    #[test]
    fn tables_are_sorted_and_unique() {
        assert_sorted_and_unique(SYSCALLS, "syscall");
        assert_sorted_and_unique(ERRNOS, "errno");
        assert_sorted_and_unique(SIGNALS, "signal");
        assert!(SYSCALLS.len() > 360, "only {} syscalls", SYSCALLS.len());
        assert_eq!(ERRNOS.len(), 131);
    }

    #[test]
    fn well_known_syscalls() {
        let known = [
            ("read", 0),
            ("write", 1),
            ("nanosleep", 35),
            ("getpid", 39),
            ("fsync", 74),
            ("fdatasync", 75),
            ("clock_nanosleep", 230),
            ("exit_group", 231),
            ("openat", 257),
            ("io_uring_enter", 426),
            ("futex_waitv", 449),
        ];
        for (name, number) in known {
            assert_eq!(syscall_number(name), Some(number), "{name}");
            assert_eq!(syscall_name(number), Some(name), "{number}");
        }
        assert_eq!(syscall_number("FSYNC"), Some(74));
        assert_eq!(syscall_number("fsyn"), None);
        assert_eq!(syscall_number(""), None);
        assert_eq!(syscall_name(400), None);
        assert_eq!(syscall_name(u32::MAX), None);
        for &(number, name) in SYSCALLS {
            assert_eq!(syscall_number(name), Some(number), "{name}");
        }
    }

    #[test]
    fn errnos_and_aliases() {
        for (name, number) in [("EPERM", 1), ("EIO", 5), ("EAGAIN", 11), ("ENOENT", 2)] {
            assert_eq!(errno_number(name), Some(number));
            assert_eq!(errno_name(number), Some(name));
        }
        assert_eq!(errno_number("EHWPOISON"), Some(133));
        assert_eq!(errno_number("EWOULDBLOCK"), Some(11));
        assert_eq!(errno_number("EDEADLOCK"), Some(35));
        assert_eq!(errno_number("ENOTSUP"), Some(95));
        assert_eq!(errno_number("eio"), Some(5));
        assert_eq!(errno_name(35), Some("EDEADLK"));
        assert_eq!(errno_name(41), None);
        assert_eq!(errno_name(0), None);
        assert_eq!(errno_number("EFOO"), None);
    }

    #[test]
    fn signals_with_and_without_prefix() {
        for name in ["SIGSEGV", "SEGV", "segv", "sigsegv", "SigSegv"] {
            assert_eq!(signal_number(name), Some(11), "{name}");
        }
        assert_eq!(signal_number("SIGHUP"), Some(1));
        assert_eq!(signal_number("SIGSYS"), Some(31));
        assert_eq!(signal_number("SIGIOT"), Some(6));
        assert_eq!(signal_name(6), Some("SIGABRT"));
        assert_eq!(signal_number("SIG"), None);
        assert_eq!(signal_number("SIGSIGSEGV"), None);
        assert_eq!(signal_number("SIGFOO"), None);
        assert_eq!(signal_name(0), None);
        assert_eq!(signal_name(32), None);
        assert_eq!(signal_name(65), None);
    }

    #[test]
    fn realtime_signals() {
        assert_eq!(signal_number("SIGRTMIN"), Some(34));
        assert_eq!(signal_number("rtmin+3"), Some(37));
        assert_eq!(signal_number("SIGRTMAX"), Some(64));
        assert_eq!(signal_number("SIGRTMAX-1"), Some(63));
        assert_eq!(signal_number("SIGRTMIN+31"), None);
        assert_eq!(signal_number("SIGRTMIN-1"), None);
        assert_eq!(signal_number("SIGRTMIN+"), None);
        assert_eq!(signal_number("SIGRTMIN++1"), None);
        for number in 34..=64 {
            let name = signal_name(number).expect("a real-time signal name");
            assert_eq!(signal_number(name), Some(number), "{name}");
        }
    }

    #[test]
    fn unknown_names_suggest_the_closest() {
        assert!(unknown_syscall("fsyn").contains("did you mean `fsync`?"));
        assert!(unknown_errno("EIOO").contains("did you mean `EIO`?"));
        assert!(unknown_signal("SEGVV").contains("did you mean `SIGSEGV`?"));
        assert!(!unknown_syscall("zzzzzzzzzzzz").contains("did you mean"));
        assert!(unknown_syscall(&"x".repeat(10_000)).len() < 300);
    }
}
