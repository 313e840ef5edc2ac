//! Target discovery: which processes a rule's `target` selects.
//!
//! In: a proc root (`/proc`, or a fake tree in tests) and the rules' [`Target`]s. Out: the
//! [`ProcessInfo`] of each process (comm, exe, cgroup v2 path) and whether it matches. The
//! daemon scans once at start and after that reacts to the kernel's exec/exit events
//! (`PROC_EVENTS`), with a slow rescan as a safety net for events a full ring dropped.
use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::capture::origin::ProcessOrigin;
use crate::rules::Target;

/// What the rules can match a process on, read from `/proc/PID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    /// `/proc/PID/comm` without the newline.
    pub comm: String,
    /// `/proc/PID/exe` as the process sees it (inside its own root); `None` for kernel
    /// threads and processes we may not inspect.
    pub exe: Option<PathBuf>,
    /// The cgroup v2 path (`0::/path` line of `/proc/PID/cgroup`); `None` on a v1-only host.
    pub cgroup: Option<String>,
    /// Its cgroup (v2, else v1) and container: the origin of its snapshots.
    pub origin: ProcessOrigin,
}

impl ProcessInfo {
    /// Reads process `pid` under `proc_root`; `None` when it is gone (or never existed).
    pub fn read(proc_root: &Path, pid: u32) -> Option<Self> {
        let dir = proc_root.join(pid.to_string());
        let comm = fs::read_to_string(dir.join("comm")).ok()?;
        let exe = fs::read_link(dir.join("exe")).ok();
        let text = fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
        Some(Self {
            pid,
            comm: comm.trim_end_matches('\n').to_owned(),
            exe,
            cgroup: cgroup_v2_path(&text),
            origin: ProcessOrigin::parse(&text),
        })
    }

    /// The executable path without the ` (deleted)` suffix the kernel appends when the
    /// file was replaced (e.g. by a package upgrade): the rule still means that program.
    pub fn exe_path(&self) -> Option<PathBuf> {
        let exe = self.exe.as_ref()?;
        let text = exe.to_string_lossy();
        Some(match text.strip_suffix(" (deleted)") {
            Some(stripped) => PathBuf::from(stripped),
            None => exe.clone(),
        })
    }
}

/// Whether process `pid` has exited or is exiting (a zombie, dead, gone from `/proc`, or
/// `PF_EXITING`, past the release of its memory and exe): its `/proc/PID/exe` is
/// unreadable then, like a kernel thread's, but it is no target that a selector turned
/// down.
pub fn has_exited(proc_root: &Path, pid: u32) -> bool {
    /// `PF_EXITING` in the flags of `/proc/PID/stat` (include/linux/sched.h).
    const PF_EXITING: u64 = 0x4;
    let Ok(stat) = fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) else {
        return true;
    };
    // `PID (COMM) STATE PPID PGRP SESSION TTY TPGID FLAGS ...`; COMM may hold spaces and
    // parentheses.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return true;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let exiting = fields
        .get(6)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_EXITING != 0);
    exiting || matches!(fields.first(), Some(&("Z" | "X")) | None)
}

/// When process `pid` started, in clock ticks since boot (`starttime`, field 22 of
/// `/proc/PID/stat`); `None` when it is gone or the line is malformed.
pub fn start_ticks(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // Fields from 3 (state) on: starttime is the 20th of them.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The clock ticks per second of [`start_ticks`] (`_SC_CLK_TCK`).
pub fn ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf has no memory preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&h| h > 0)
}

/// Now, in the clock ticks of [`start_ticks`] (`CLOCK_BOOTTIME` at `_SC_CLK_TCK`).
pub fn now_ticks() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid pointer it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts) };
    let hz = ticks_per_second()?;
    if rc != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    Some(secs * hz + nanos * hz / 1_000_000_000)
}

/// What process `pid` does with signals, from `/proc/PID/status` (bit `n - 1` for signal
/// `n`). A signal sent to a process that ignores it is dropped before delivery, so a
/// signal rule for it never fires (a fault's SIGSEGV is still forced through).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalMasks {
    /// `SigIgn`: dropped before delivery.
    pub ignored: u64,
    /// `SigBlk` of the main thread: kept pending until it unblocks them (a `sigwait` or
    /// `signalfd` loop blocks the signals it takes).
    pub blocked: u64,
}

/// [`SignalMasks`] of process `pid`; `None` when it is gone.
pub fn signal_masks(proc_root: &Path, pid: u32) -> Option<SignalMasks> {
    let status = fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok()?;
    Some(SignalMasks {
        ignored: signal_mask(&status, "SigIgn:")?,
        blocked: signal_mask(&status, "SigBlk:").unwrap_or(0),
    })
}

/// The hex mask on the `key` line of a `/proc/PID/status` text.
fn signal_mask(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix(key))?;
    u64::from_str_radix(line.trim(), 16).ok()
}

/// The path of the unified (v2) hierarchy in a `/proc/PID/cgroup` file.
pub fn cgroup_v2_path(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_owned)
}

/// Every process (thread group) id under `proc_root`, ascending.
pub fn scan(proc_root: &Path) -> Vec<u32> {
    let Ok(entries) = fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether `info` satisfies every field `target` gives. The `kubernetes` selector is
/// decided by `in_selected_pod` (the pod watcher knows which cgroups belong to selected
/// containers); processes without an executable (kernel threads) only match by pid.
pub fn matches(
    target: &Target,
    info: &ProcessInfo,
    in_selected_pod: impl FnOnce(&ProcessInfo) -> bool,
) -> bool {
    if target.is_empty() {
        return false;
    }
    if target.pid.is_some_and(|pid| pid != info.pid) {
        return false;
    }
    if target.pid.is_none() && info.exe.is_none() {
        return false;
    }
    if target.comm.as_ref().is_some_and(|comm| *comm != info.comm) {
        return false;
    }
    if let Some(exe) = &target.exe
        && info.exe_path().as_ref() != Some(exe)
    {
        return false;
    }
    if let Some(prefix) = &target.cgroup
        && !info
            .cgroup
            .as_deref()
            .is_some_and(|path| cgroup_has_prefix(path, prefix))
    {
        return false;
    }
    if target.kubernetes.as_ref().is_some_and(|k| !k.is_empty()) {
        return in_selected_pod(info);
    }
    true
}

/// Whether cgroup `path` is `prefix` or below it, component-wise: `/a/b` is under `/a` but
/// `/ab` is not. A prefix ending in `/` is taken as the directory.
pub fn cgroup_has_prefix(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, path::Path};

    use super::*;

    #[test]
    fn the_ignored_and_blocked_signals_are_read_from_the_status_masks() {
        let status = "Name:\tsh\nSigBlk:\t0000000000010000\nSigIgn:\t0000000000000006\n";
        // SIGINT (2) and SIGQUIT (3): what a shell gives its background jobs.
        assert_eq!(signal_mask(status, "SigIgn:"), Some(0b110));
        assert_eq!(signal_mask("Name: x\n", "SigIgn:"), None);
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("7")).unwrap();
        fs::write(dir.path().join("7/status"), status).unwrap();
        // SIGCHLD (17) blocked.
        assert_eq!(
            signal_masks(dir.path(), 7),
            Some(SignalMasks {
                ignored: 0b110,
                blocked: 1 << 16
            })
        );
        assert_eq!(signal_masks(dir.path(), 8), None);
    }
    use crate::rules::KubernetesSelector;

    fn fake_proc(dir: &Path, pid: u32, comm: &str, exe: Option<&str>, cgroup: &str) {
        let p = dir.join(pid.to_string());
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
        fs::write(p.join("cgroup"), cgroup).unwrap();
        if let Some(exe) = exe {
            std::os::unix::fs::symlink(exe, p.join("exe")).unwrap();
        }
    }

    fn info(pid: u32, comm: &str, exe: Option<&str>, cgroup: Option<&str>) -> ProcessInfo {
        ProcessInfo {
            pid,
            comm: comm.into(),
            exe: exe.map(PathBuf::from),
            cgroup: cgroup.map(str::to_owned),
            origin: ProcessOrigin::default(),
        }
    }

    #[test]
    fn a_zombie_or_a_missing_process_has_exited_a_kernel_thread_has_not() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, stat) in [
            (10, "10 (a) b) Z 1 10 10 0 -1 4194316 0"),
            (11, "11 (dead) X 1 11 11 0 -1 4194316 0"),
            (12, "12 (kworker/0:1) I 2 0 0 0 -1 69238880 0"),
            (13, "13 (work load) S 1 13 13 0 -1 4194560 0"),
            (15, "15 (exiting) R 1 15 15 0 -1 4194564 0"),
        ] {
            let p = dir.path().join(pid.to_string());
            fs::create_dir_all(&p).unwrap();
            fs::write(p.join("stat"), stat).unwrap();
        }
        assert!(has_exited(dir.path(), 10));
        assert!(has_exited(dir.path(), 11));
        assert!(!has_exited(dir.path(), 12));
        assert!(!has_exited(dir.path(), 13));
        assert!(has_exited(dir.path(), 14));
        assert!(has_exited(dir.path(), 15));
        // starttime, field 22 (`(a) b)`: the comm's parentheses do not count).
        fs::write(
            dir.path().join("10/stat"),
            "10 (a) b) S 1 10 10 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10",
        )
        .unwrap();
        assert_eq!(start_ticks(dir.path(), 10), Some(123_456));
        assert_eq!(start_ticks(dir.path(), 14), None);
        // Our own process started before now.
        let own = start_ticks(Path::new("/proc"), std::process::id()).unwrap();
        assert!(own <= now_ticks().unwrap());
    }

    #[test]
    fn reads_a_fake_proc_tree() {
        let dir = tempfile::tempdir().unwrap();
        fake_proc(
            dir.path(),
            42,
            "myserver",
            Some("/usr/bin/myserver"),
            "12:pids:/x\n0::/system.slice/my.service\n",
        );
        fake_proc(dir.path(), 2, "kthreadd", None, "0::/\n");
        fs::create_dir_all(dir.path().join("self")).unwrap();
        assert_eq!(scan(dir.path()), vec![2, 42]);
        let got = ProcessInfo::read(dir.path(), 42).unwrap();
        let mut want = info(
            42,
            "myserver",
            Some("/usr/bin/myserver"),
            Some("/system.slice/my.service"),
        );
        want.origin.cgroup = Some("/system.slice/my.service".to_owned());
        assert_eq!(got, want);
        let kthread = ProcessInfo::read(dir.path(), 2).unwrap();
        assert_eq!(kthread.exe, None);
        assert!(ProcessInfo::read(dir.path(), 7).is_none());
        let v1_only = "4:memory:/a\n1:name=systemd:/a\n";
        assert_eq!(cgroup_v2_path(v1_only), None);
    }

    #[test]
    fn every_given_field_must_match() {
        let p = info(
            42,
            "myserver",
            Some("/usr/bin/myserver"),
            Some("/kubepods.slice/kubepods-burstable.slice/x.scope"),
        );
        let yes = |_: &ProcessInfo| true;
        let t = |f: fn(&mut Target)| {
            let mut t = Target::default();
            f(&mut t);
            t
        };
        assert!(matches(&t(|t| t.pid = Some(42)), &p, yes));
        assert!(!matches(&t(|t| t.pid = Some(43)), &p, yes));
        assert!(matches(&t(|t| t.comm = Some("myserver".into())), &p, yes));
        assert!(!matches(&t(|t| t.comm = Some("myserve".into())), &p, yes));
        assert!(matches(
            &t(|t| t.exe = Some("/usr/bin/myserver".into())),
            &p,
            yes
        ));
        assert!(!matches(
            &t(|t| t.exe = Some("/usr/bin/other".into())),
            &p,
            yes
        ));
        assert!(matches(
            &t(|t| t.cgroup = Some("/kubepods.slice".into())),
            &p,
            yes
        ));
        assert!(!matches(&t(|t| t.cgroup = Some("/kube".into())), &p, yes));
        // Two fields: both must hold.
        let both = t(|t| {
            t.comm = Some("myserver".into());
            t.pid = Some(1);
        });
        assert!(!matches(&both, &p, yes));
        // An empty target never matches; a kernel thread only by pid.
        assert!(!matches(&Target::default(), &p, yes));
        let kthread = info(2, "kthreadd", None, Some("/"));
        assert!(!matches(
            &t(|t| t.comm = Some("kthreadd".into())),
            &kthread,
            yes
        ));
        assert!(matches(&t(|t| t.pid = Some(2)), &kthread, yes));
    }

    #[test]
    fn the_kubernetes_selector_is_asked_last() {
        let p = info(42, "api", Some("/app/api"), Some("/kubepods/pod1/c1"));
        let target = Target {
            comm: Some("api".into()),
            kubernetes: Some(KubernetesSelector {
                namespace: Some("prod".into()),
                pod_labels: BTreeMap::new(),
                container: None,
            }),
            ..Target::default()
        };
        assert!(matches(&target, &p, |_| true));
        assert!(!matches(&target, &p, |_| false));
        let wrong_comm = Target {
            comm: Some("db".into()),
            ..target
        };
        assert!(!matches(&wrong_comm, &p, |_| panic!("not asked")));
    }

    #[test]
    fn deleted_executables_keep_their_path() {
        let p = info(1, "x", Some("/usr/bin/x (deleted)"), None);
        assert_eq!(p.exe_path(), Some(PathBuf::from("/usr/bin/x")));
    }

    #[test]
    fn cgroup_prefixes_are_component_wise() {
        assert!(cgroup_has_prefix("/a/b", "/a"));
        assert!(cgroup_has_prefix("/a/b", "/a/"));
        assert!(cgroup_has_prefix("/a", "/a"));
        assert!(!cgroup_has_prefix("/ab", "/a"));
        assert!(cgroup_has_prefix("/anything", "/"));
        assert!(cgroup_has_prefix(
            "/kubepods.slice/kubepods-burstable.slice/x",
            "/kubepods.slice"
        ));
    }
}
