//! Running out of the machine's resources, told apart from other failures: the open-files
//! limit raised at start, and every recorder or probe that fails on a resource limit
//! (`EMFILE`, `ENFILE`, `ENOMEM`, `EPERM`, `ENOSPC`) counted by operation and errno
//! (`lookback_errors_total{op,errno}`) and reported by `/readyz`, so an agent that ran out
//! of fds does not look healthy while it records nothing.
use std::{collections::BTreeMap, error::Error, io};

use crate::sys::{SyscallError, errno_name, rlimit};

/// Raises the open-files soft limit to the hard limit (a node's targets need thousands of
/// fds; the usual soft limit is 1024), and logs what it is.
pub fn raise_open_files() {
    match rlimit::raise_open_files() {
        Ok((before, after)) if before < after => {
            log::info!("open files limit raised from {before} to {after}");
        }
        Ok((_, after)) => log::info!("open files limit {after}"),
        Err(e) => log::warn!("open files limit: {}", super::ErrorChain(&e)),
    }
}

/// The held-file limit to use: `wanted`, at most a quarter of the open-files limit (the
/// recorders' perf events and the probes need the rest), logged when cut.
pub fn held_files_limit(wanted: usize) -> usize {
    let Ok((soft, _)) = rlimit::open_files() else {
        return wanted;
    };
    let cap = usize::try_from(soft / 4).unwrap_or(usize::MAX);
    if wanted > cap {
        log::info!(
            "holding at most {cap} files of traced processes open (--max-held-files \
             {wanted} is more than a quarter of the open-files limit {soft})"
        );
        cap
    } else {
        wanted
    }
}

/// The errnos that mean a limit of the machine or of the agent, not a bad request.
const RESOURCE_ERRNOS: [i32; 5] = [
    libc::EMFILE,
    libc::ENFILE,
    libc::ENOMEM,
    libc::EPERM,
    libc::ENOSPC,
];

/// The OS errno anywhere in `err`'s source chain.
pub fn errno_of(err: &(dyn Error + 'static)) -> Option<i32> {
    let mut at = Some(err);
    while let Some(e) = at {
        if let Some(s) = e.downcast_ref::<SyscallError>() {
            return s.errno();
        }
        if let Some(io) = e.downcast_ref::<io::Error>()
            && let Some(n) = io.raw_os_error()
        {
            return Some(n);
        }
        at = e.source();
    }
    None
}

/// The symbolic errno of `err` when it is a resource limit (`EMFILE`, ...).
pub fn resource_errno(err: &(dyn Error + 'static)) -> Option<&'static str> {
    errno_of(err)
        .filter(|n| RESOURCE_ERRNOS.contains(n))
        .and_then(errno_name)
}

/// Failures by (operation, errno or `other`): what `lookback_errors_total` exports.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ErrorTally {
    counts: BTreeMap<(&'static str, &'static str), u64>,
}

impl ErrorTally {
    /// Counts one failure of `op` (`recorder`, `probe`); returns its resource errno.
    pub fn record(
        &mut self,
        op: &'static str,
        err: &(dyn Error + 'static),
    ) -> Option<&'static str> {
        let errno = resource_errno(err);
        *self
            .counts
            .entry((op, errno.unwrap_or("other")))
            .or_default() += 1;
        errno
    }

    /// Every (operation, errno) with its count.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> + '_ {
        self.counts.iter().map(|(&(op, errno), &n)| (op, errno, n))
    }
}

/// What `/readyz` says about `missing` processes without a flight recorder because of a
/// resource limit, by errno; `None` when there are none.
pub fn recorders_missing(missing: &BTreeMap<&'static str, usize>) -> Option<String> {
    out_of_resources("without a flight recorder", missing)
}

/// What `/readyz` says about `missing` function-rule probes (one per rule and binary) a
/// resource limit refused, by errno; `None` when there are none.
pub fn probes_missing(missing: &BTreeMap<&'static str, usize>) -> Option<String> {
    out_of_resources("probe(s) not attached", missing)
}

/// `out of resources: N WHAT: ERRNO (hint); ...`, or `None` for no count.
fn out_of_resources(what: &str, missing: &BTreeMap<&'static str, usize>) -> Option<String> {
    if missing.is_empty() {
        return None;
    }
    let parts: Vec<String> = missing
        .iter()
        .map(|(errno, n)| format!("{n} {what}: {errno}{}", hint(errno)))
        .collect();
    Some(format!("out of resources: {}", parts.join("; ")))
}

/// What `/readyz` says while the per-CPU rings of a rule could not be opened because of
/// resource limit `errno`; `None` when they are open.
pub fn shared_rings_missing(errno: Option<&'static str>) -> Option<String> {
    errno.map(|errno| {
        format!(
            "out of resources: the per-CPU rings: {errno}{}",
            hint(errno)
        )
    })
}

/// What to do about `errno`.
fn hint(errno: &str) -> String {
    match errno {
        "EMFILE" => {
            let limit = rlimit::open_files().map_or_else(|_| "?".to_owned(), |(s, _)| s.to_string());
            format!(" (the agent's open-files limit, {limit}, is reached: raise its RLIMIT_NOFILE)")
        }
        "ENFILE" => " (the system's open-files limit, fs.file-max, is reached)".to_owned(),
        "ENOMEM" => " (locked memory for the rings: perf_event_mlock_kb, RLIMIT_MEMLOCK, or the memory limit)".to_owned(),
        "EPERM" => " (needs CAP_PERFMON or CAP_SYS_ADMIN, or perf_event_paranoid forbids it)".to_owned(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_errnos_are_found_through_the_source_chain() {
        let emfile = crate::capture::CaptureError::Syscall {
            what: "opening a ring",
            source: SyscallError {
                call: "perf_event_open",
                source: io::Error::from_raw_os_error(libc::EMFILE),
            },
        };
        assert_eq!(resource_errno(&emfile), Some("EMFILE"));
        let einval = io::Error::from_raw_os_error(libc::EINVAL);
        assert_eq!(errno_of(&einval), Some(libc::EINVAL));
        assert_eq!(resource_errno(&einval), None, "a bad request, not a limit");
        let mut tally = ErrorTally::default();
        assert_eq!(tally.record("recorder", &emfile), Some("EMFILE"));
        tally.record("recorder", &emfile);
        tally.record("probe", &einval);
        let all: Vec<_> = tally.iter().collect();
        assert_eq!(all, [("probe", "other", 1), ("recorder", "EMFILE", 2)]);
    }

    #[test]
    fn readiness_names_the_errno_and_what_to_raise() {
        assert_eq!(recorders_missing(&BTreeMap::new()), None);
        assert_eq!(shared_rings_missing(None), None);
        assert!(
            shared_rings_missing(Some("ENOMEM")).is_some_and(
                |r| r.starts_with("out of resources: the per-CPU rings: ENOMEM (locked")
            )
        );
        let reason = recorders_missing(&BTreeMap::from([("EMFILE", 3)])).expect("not ready");
        assert!(
            reason.starts_with("out of resources: 3 without a flight recorder: EMFILE")
                && reason.contains("RLIMIT_NOFILE"),
            "{reason}"
        );
    }
}
