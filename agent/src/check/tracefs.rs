//! tracefs: is it mounted (at `/sys/kernel/tracing`, or under debugfs), and does it list
//! the `raw_syscalls` and `signal/signal_generate` events. The triggers themselves attach
//! raw tracepoints and do not need tracefs; it matters for reading event formats and for
//! tools like `perf trace`. `check` reports a missing mount with the fix and never mounts.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Paths, Probe};

/// The command that mounts tracefs at its usual place.
pub const MOUNT_FIX: &str = "mount -t tracefs nodev /sys/kernel/tracing";

/// Where tracefs is, and which of the events lookback uses it lists.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TracefsReport {
    #[serde(flatten)]
    pub status: Probe,
    /// The directory holding `events/`, e.g. `/sys/kernel/tracing`.
    pub mount_point: Option<PathBuf>,
    /// `events/raw_syscalls/sys_enter` and `sys_exit` present.
    pub raw_syscalls: bool,
    /// `events/signal/signal_generate` present.
    pub signal_generate: bool,
}

/// Looks for `events/` under `sys/kernel/tracing`, then `sys/kernel/debug/tracing`. An
/// unmounted tracefs leaves the first an empty directory.
pub(super) fn probe(paths: &Paths) -> TracefsReport {
    let candidates = [
        paths.sys.join("kernel/tracing"),
        paths.sys.join("kernel/debug/tracing"),
    ];
    let Some(dir) = candidates.iter().find(|dir| dir.join("events").is_dir()) else {
        // tracefs is mode 0700: for a non-root user a mounted one looks empty.
        let denied = candidates.iter().find(|dir| {
            std::fs::read_dir(dir)
                .is_err_and(|err| err.kind() == std::io::ErrorKind::PermissionDenied)
        });
        if let Some(dir) = denied {
            return TracefsReport {
                status: Probe::fail(format!(
                    "cannot read {}: permission denied (tracefs is root-only)",
                    dir.display()
                ))
                .with_fix("run as root"),
                ..TracefsReport::default()
            };
        }
        return TracefsReport {
            status: Probe::fail(format!(
                "tracefs not mounted (no events/ in {} or {})",
                candidates[0].display(),
                candidates[1].display()
            ))
            .with_fix(MOUNT_FIX)
            .with_detail(
                "the triggers attach raw tracepoints and work without it; \
                 event formats and tools like perf trace need it",
            ),
            ..TracefsReport::default()
        };
    };
    let raw_syscalls =
        has_event(dir, "raw_syscalls/sys_enter") && has_event(dir, "raw_syscalls/sys_exit");
    let signal_generate = has_event(dir, "signal/signal_generate");
    let missing: Vec<&str> = [
        (!raw_syscalls).then_some("raw_syscalls/sys_enter+sys_exit"),
        (!signal_generate).then_some("signal/signal_generate"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let status = if missing.is_empty() {
        Probe::pass(format!(
            "mounted at {}; raw_syscalls and signal/signal_generate events present",
            dir.display()
        ))
    } else {
        Probe::fail(format!(
            "mounted at {} but missing events: {}",
            dir.display(),
            missing.join(", ")
        ))
    };
    TracefsReport {
        status,
        mount_point: Some(dir.clone()),
        raw_syscalls,
        signal_generate,
    }
}

/// An event directory with its `format` file (what tracefs always creates per event).
fn has_event(tracing: &Path, event: &str) -> bool {
    tracing.join("events").join(event).join("format").is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add_event(dir: &Path, event: &str) {
        let event_dir = dir.join("events").join(event);
        std::fs::create_dir_all(&event_dir).expect("mkdir");
        std::fs::write(event_dir.join("format"), "name: x\nID: 1\n").expect("write");
        std::fs::write(event_dir.join("id"), "1\n").expect("write");
    }

    #[test]
    fn unmounted_tracefs_reports_the_fix() {
        let root = tempfile::tempdir().expect("tempdir");
        // An unmounted tracefs: the mount point exists, empty.
        std::fs::create_dir_all(root.path().join("sys/kernel/tracing")).expect("mkdir");
        let report = probe(&Paths::under(root.path()));
        assert!(!report.status.ok);
        assert_eq!(report.status.fix.as_deref(), Some(MOUNT_FIX));
        assert_eq!(report.mount_point, None);
    }

    #[test]
    fn mounted_tracefs_with_all_events() {
        let root = tempfile::tempdir().expect("tempdir");
        let tracing = root.path().join("sys/kernel/tracing");
        for event in [
            "raw_syscalls/sys_enter",
            "raw_syscalls/sys_exit",
            "signal/signal_generate",
        ] {
            add_event(&tracing, event);
        }
        let report = probe(&Paths::under(root.path()));
        assert!(report.status.ok, "{report:?}");
        assert_eq!(report.mount_point, Some(tracing));
        assert!(report.raw_syscalls && report.signal_generate);
    }

    #[test]
    fn debugfs_tracing_with_missing_events() {
        let root = tempfile::tempdir().expect("tempdir");
        let tracing = root.path().join("sys/kernel/debug/tracing");
        add_event(&tracing, "raw_syscalls/sys_enter");
        let report = probe(&Paths::under(root.path()));
        assert!(!report.status.ok);
        assert_eq!(report.mount_point, Some(tracing));
        assert!(!report.raw_syscalls && !report.signal_generate);
        let reason = report.status.reason.expect("reason");
        assert!(
            reason.contains("raw_syscalls/sys_enter+sys_exit, signal/signal_generate"),
            "{reason}"
        );
    }
}
