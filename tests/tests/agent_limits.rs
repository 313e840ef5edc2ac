//! `lookback agent` at its resource limits, as root: the open-files limit raised at start,
//! and a recorder that cannot be opened (`EMFILE`) counted, reported by `/readyz` with the
//! reason, and opened on a retry once the limit is raised — without a restart; a full
//! disk where the oldest snapshots make room for the newest.
#![allow(
    clippy::float_cmp,
    reason = "metric values are integer counts, exactly representable"
)]

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use lookback_tests::agent::{Agent, files, waiting_workload};

const RULES: &str = "
version: 1
defaults:
  capture: { backend: sampling, buffer_size: 256KiB }
rules:
  - name: sleeps
    target: { comm: workload }
    trigger: { syscall: { names: [nanosleep, clock_nanosleep], min_duration: 1s } }
";

/// The soft and hard `Max open files` of process `pid`.
fn open_files_limit(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files")
        .to_owned();
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_owned(), fields[4].to_owned())
}

/// The open-files limit under which process `pid` has exactly `free` fd numbers left (the
/// kernel hands out the lowest free number, so holes below the highest open fd count).
fn limit_leaving_free(pid: u32, free: usize) -> u64 {
    let open: std::collections::BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    (0..)
        .filter(|n| !open.contains(n))
        .nth(free)
        .expect("a free fd number")
}

/// Sets the soft open-files limit of `pid` (raising a hard limit needs `CAP_SYS_RESOURCE`,
/// which a container's root may lack).
fn set_open_files_limit(pid: u32, soft: &str) {
    let status = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={soft}:"))
        .status()
        .expect("prlimit (util-linux)");
    assert!(status.success(), "prlimit: {status}");
}

#[test]
fn emfile_makes_the_agent_not_ready_and_a_raised_limit_brings_the_recorder_back() {
    // Rings per process: the shared per-CPU rings are opened with the rules, at start,
    // and a new target needs no fd of its own.
    let rules = RULES.replace("256KiB }", "256KiB, isolate: true }");
    let mut agent = Agent::start(&rules, &[]);
    let pid = agent.child.id();
    // Raised to the hard limit at start.
    let (soft, hard) = open_files_limit(pid);
    assert_eq!(soft, hard, "{}", agent.log());
    assert!(agent.log().contains("open files limit"), "{}", agent.log());
    agent.wait_readyz(200, Duration::from_secs(20));
    // Now only a few fds to spare: enough for a metrics request, not for a recorder
    // (two perf events per CPU and their rings).
    let used = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .count();
    set_open_files_limit(pid, &(used + 2).to_string());
    let mut target = waiting_workload(&["nanosleep", "1", "1000"], Stdio::null());
    agent.wait_log(
        &format!("tracing process {} ", target.id()),
        Duration::from_secs(10),
    );
    let body = agent.wait_readyz(503, Duration::from_secs(20));
    assert!(
        body.contains("EMFILE") && body.contains("RLIMIT_NOFILE"),
        "{body}"
    );
    let emfile = [("op", "recorder"), ("errno", "EMFILE")];
    assert!(agent.metric("lookback_errors_total", &emfile) >= 1.0);
    assert!(
        agent.log().contains("no flight recorder"),
        "the failure is logged: {}",
        agent.log()
    );
    // The limit rises: the recorder is opened on a retry, the agent is ready again.
    set_open_files_limit(pid, &hard);
    agent.wait_log("flight recorder opened on a retry", Duration::from_secs(10));
    agent.wait_readyz(200, Duration::from_secs(20));
    let _ = target.stdin.take().expect("stdin").write_all(b"go\n");
    assert!(target.wait().expect("wait").success());
    agent.stop_ok();
}

#[test]
fn per_cpu_rings_that_cannot_open_make_the_agent_not_ready_until_they_do() {
    let mut agent = Agent::start(RULES, &[]);
    let pid = agent.child.id();
    assert_eq!(
        agent
            .log()
            .matches("per-CPU flight recorder opened")
            .count(),
        1
    );
    let (_, hard) = open_files_limit(pid);
    agent.wait_readyz(200, Duration::from_secs(20));
    // Not one fd to spare: the endpoint must still answer, from the fd it keeps in
    // reserve, or nobody learns why nothing is recorded.
    set_open_files_limit(pid, &limit_leaving_free(pid, 0).to_string());
    agent.wait_readyz(200, Duration::from_secs(20));
    agent.wait_log("answering from a reserved fd", Duration::from_secs(5));
    // Three to spare: enough to read the rules file while the discovery scan holds two,
    // not for the rings (three fds per CPU).
    set_open_files_limit(pid, &limit_leaving_free(pid, 3).to_string());
    // A reload adds a rule with other capture options: its own per-CPU rings, which the
    // limit leaves no fds for. Its trigger is of the kind already attached (syscalls), so
    // that no program attach takes one of the three fds first (CI: a signal rule's
    // `signal_generate` attach failed with EMFILE instead, the rule was not installed and
    // nothing asked for rings).
    let more = format!(
        "{RULES}  - name: other-rings\n    target: {{ comm: lbnothing }}\n    \
         capture: {{ buffer_size: 512KiB }}\n    \
         trigger: {{ syscall: {{ names: [nanosleep], min_duration: 1s }} }}\n"
    );
    lookback_tests::agent::write_rules(&agent.config(), &more);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(i32::try_from(pid).expect("pid"), libc::SIGHUP) };
    let body = agent.wait_readyz(503, Duration::from_secs(20));
    assert!(
        body.contains("the per-CPU rings: EMFILE") && body.contains("RLIMIT_NOFILE"),
        "{body}"
    );
    agent.wait_log("no per-CPU flight recorder yet", Duration::from_secs(5));
    let emfile = [("op", "recorder"), ("errno", "EMFILE")];
    assert!(agent.metric("lookback_errors_total", &emfile) >= 1.0);
    // The limit rises: the rings open on a retry, without a restart.
    set_open_files_limit(pid, &hard);
    agent.wait_readyz(200, Duration::from_secs(20));
    // The agent logs the open before `/readyz` turns, but its stderr reaches this test
    // through a reader thread that may not have taken the line yet (CI, under load: the
    // count read 1 right after the 200).
    agent.poll(Duration::from_secs(10), |agent| {
        match agent
            .log()
            .matches("per-CPU flight recorder opened")
            .count()
        {
            2 => Ok(()),
            n => Err(format!("{n} opens logged")),
        }
    });
    agent.stop_ok();
}

/// The agent's resident memory in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

#[test]
fn a_parent_forking_50000_children_leaves_the_agent_memory_flat() {
    // A pre-fork server's churn without exec: each child lives a second, up to ~2,000 at
    // a time. The recorder keeps the maps of the children it saw for snapshots of them;
    // kept for every child it ever saw, the agent grew with every storm (by hand: 30,000
    // children, +30 MB). What the live children take depends on how many live at once
    // (and so on the machine's speed); what must not happen is growth with the number
    // of children: a second storm as large as the first leaves the agent where the first
    // did. The children's 1 s sleeps stay below the rule's threshold: this is about
    // the recorder's caches, not about snapshots of triggering children.
    let rules = RULES.replace("min_duration: 1s", "min_duration: 1h");
    let mut agent = Agent::start(&rules, &[]);
    let pid = agent.child.id();
    // 50,000 children in all: a first storm that fills what a storm fills, then two
    // larger ones that must not take the agent any further.
    let storms = [10_000, 20_000, 20_000];
    let mut after = Vec::new();
    for n in storms {
        let count = n.to_string();
        let mut parent = waiting_workload(&["forks", &count, "1000000"], Stdio::piped());
        agent.release_when_traced(&mut parent);
        let out = parent.wait_with_output().expect("wait");
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("forked={n}")
        );
        std::thread::sleep(Duration::from_millis(600)); // two polls after the last exit
        after.push(rss_kib(pid));
    }
    assert_eq!(storms.iter().sum::<i32>(), 50_000);
    assert!(
        after[1] < after[0] + 8 * 1024 && after[2] < after[0] + 8 * 1024,
        "agent RSS (KiB) after storms of {storms:?} children: {after:?}"
    );
    agent.stop_ok();
}

/// A small tmpfs mounted at a directory for the test's length.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Self {
        std::fs::create_dir_all(at).expect("mount point");
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("mount");
        assert!(status.success(), "mount tmpfs at {}", at.display());
        Self(at.to_owned())
    }

    /// Bytes still free.
    fn free(&self) -> u64 {
        let out = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&self.0)
            .output()
            .expect("df");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df's avail")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn on_a_full_disk_the_oldest_snapshots_make_room_for_the_newest() {
    let rules = RULES.replace("name: sleeps", "name: usr1").replace(
        "{ syscall: { names: [nanosleep, clock_nanosleep], min_duration: 1s } }",
        "{ signal: { signals: [SIGUSR1] } }",
    );
    let mut agent = Agent::start(&rules, &[]);
    // The rule's directory is a 4 MiB filesystem that two earlier snapshots fill.
    let disk = Tmpfs::mount(&agent.out().join("usr1"), "4m");
    let oldest = "20200101T000000.000000Z-1-1";
    let older = "20200101T000001.000000Z-1-1";
    std::fs::write(disk.0.join(format!("{oldest}.fxt.gz")), vec![0u8; 1 << 20]).expect("fill");
    std::fs::write(disk.0.join(format!("{oldest}.json")), b"{}").expect("fill");
    let rest = usize::try_from(disk.free()).expect("size");
    std::fs::write(disk.0.join(format!("{older}.fxt.gz")), vec![0u8; rest]).expect("fill");
    assert_eq!(disk.free(), 0, "not full");
    agent.run_workload(&["usr1"]);
    agent.expect_metric(
        "lookback_snapshots_total",
        &[("rule", "usr1"), ("backend", "sampling"), ("result", "ok")],
        1.0,
    );
    let names = files(&disk.0);
    assert!(
        !names.iter().any(|n| n.starts_with(oldest)),
        "the oldest snapshot stays: {names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with(older)),
        "more than the oldest removed: {names:?}"
    );
    let new: Vec<&String> = names
        .iter()
        .filter(|n| !n.starts_with("2020") && n.ends_with(".fxt.gz"))
        .collect();
    assert_eq!(new.len(), 1, "{names:?}\n{}", agent.log());
    agent.wait_log("disk full for rule usr1", Duration::from_secs(5));
    agent.stop_ok();
    drop(disk);
}

#[test]
fn exec_events_the_kernel_dropped_are_counted_and_the_kernel_target_set_exported() {
    // A second rule selects `/bin/true` at exec (by comm): each of its 5,000 processes
    // below must be accounted for, traced, gone or lost.
    let rules = format!(
        "{RULES}  - name: trues\n    target: {{ comm: \"true\" }}\n    trigger: {{ signal: {{ signals: [SIGUSR2] }} }}\n"
    );
    let mut agent = Agent::start(&rules, &[]);
    // A traced process: the kernel's target set holds it.
    let mut held = waiting_workload(&["nanosleep", "1", "1"], Stdio::null());
    agent.wait_log(
        &format!("tracing process {} ", held.id()),
        Duration::from_secs(10),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while agent.metric("lookback_kernel_targets", &[]) < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "lookback_kernel_targets: {:?}",
            agent.metric_opt("lookback_kernel_targets", &[])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = held.stdin.take().expect("stdin").write_all(b"go\n");
    assert!(held.wait().expect("workload").success());
    assert_eq!(
        agent.metric("lookback_events_lost_total", &[("source", "ringbuf")]),
        0.0
    );
    // Stopped, the agent reads no exec events: 5,000 execs overflow their 64 KiB ring
    // (about 2,700 records) whatever the machine's speed, and each drop is counted.
    let pid = i32::try_from(agent.child.id()).expect("pid");
    // SAFETY: kill has no memory preconditions; the agent is our child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let status = Command::new("sh")
        .args([
            "-c",
            "i=0; while [ $i -lt 5000 ]; do /bin/true; i=$((i+1)); done",
        ])
        .status()
        .expect("sh");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let lost = agent.metric("lookback_events_lost_total", &[("source", "ringbuf")]);
        if lost >= 1000.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{lost} dropped exec events counted\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    agent.wait_log(
        "exec/exit event(s) dropped from a full ring",
        Duration::from_secs(5),
    );
    // Every process the kernel selected is accounted for, exactly: selected in the kernel
    // = what the agent made of the records it read + the records dropped.
    // The held workload and the 5,000 `true`s.
    let (selected, outcomes) = agent.exec_selection_reconciled(5001.0);
    assert_eq!(selected, 5001.0, "{outcomes:?}\n{}", agent.log());
    let outcome = |o: &str| {
        outcomes
            .iter()
            .find(|(k, _)| *k == o)
            .map_or(0.0, |(_, v)| *v)
    };
    // Most were dropped (the ring holds 2,048 records, an exec and an exit for each of
    // these processes); those the agent read were of processes long gone.
    let lost = outcome("lost");
    assert!((1000.0..5000.0).contains(&lost), "{outcomes:?}");
    assert!(outcome("gone") >= 500.0, "{outcomes:?}");
    agent.stop_ok();
}

#[test]
fn a_full_kernel_target_set_is_counted_and_said_and_room_comes_back() {
    // The kernel's target set sized for 4 processes: 6 matching processes alive at once,
    // so 2 cannot be selected, at exec in the kernel nor by the agent. That is counted
    // (`lookback_errors_total{op="target_set",errno="E2BIG"}`) and logged, not a silent
    // miss; once the 6 are gone a new process is traced again.
    let mut agent = Agent::start(RULES, &["--max-targets", "4"]);
    let mut waiting: Vec<_> = (0..6)
        .map(|_| waiting_workload(&["nanosleep", "1", "1"], Stdio::null()))
        .collect();
    let labels = [("op", "target_set"), ("errno", "E2BIG")];
    // Each of the 2 is refused twice, once each: by the kernel at its exec, and by the
    // agent when it reads the exec event (never again at a rescan).
    agent.expect_metric("lookback_errors_total", &labels, 4.0);
    let refused = 4.0;
    agent.expect_metric("lookback_targets", &[("rule", "sleeps")], 4.0);
    let line = agent.wait_log(
        "target set: it is full (4 processes",
        Duration::from_secs(10),
    );
    assert!(line.contains("--max-targets"), "{line}");
    let said = agent.wait_log(
        "not traced: the kernel's target set is full",
        Duration::from_secs(10),
    );
    assert!(said.contains("(workload)"), "{said}");
    for child in &mut waiting {
        let _ = child.stdin.take().expect("stdin").write_all(b"go\n");
    }
    for mut child in waiting {
        assert!(child.wait().expect("wait").success());
    }
    agent.expect_metric("lookback_targets", &[("rule", "sleeps")], 0.0);
    // Room again: the next process is traced (the helper waits for `tracing process`).
    agent.run_workload(&["nanosleep", "1", "1"]);
    assert_eq!(
        agent.metric("lookback_errors_total", &labels),
        refused,
        "nothing refused with room in the set\n{}",
        agent.log()
    );
    agent.stop_ok();
}

#[test]
fn a_probe_the_open_files_limit_refuses_makes_the_agent_not_ready_until_a_retry_places_it() {
    // A function rule whose probe is placed when its first process shows up (the rule
    // does not name the binary); the per-CPU rings are open already, so the probe's
    // perf events and links are the only fds the new target needs.
    let rules = r"
version: 1
defaults:
  capture: { backend: sampling, buffer_size: 256KiB }
  snapshot: { cooldown: 0s, max_per_hour: 1000 }
rules:
  - name: work
    target: { comm: workload }
    trigger: { function: { symbol: lb_work, min_duration: 1ns } }
";
    // Probes through uprobe perf events: each takes two fds at once (the event and its
    // link), where a uprobe_multi link takes one, and an fd freed meanwhile would let it
    // through.
    let mut agent = Agent::start_with_env(rules, &[], &[("LOOKBACK_UPROBE_ATTACH", "perf-event")]);
    let pid = agent.child.id();
    let (_, hard) = open_files_limit(pid);
    agent.wait_readyz(200, Duration::from_secs(20));
    // One fd to spare: enough to read the process's /proc files and its binary one at a
    // time, not for a probe (a uprobe event and its link at once): the attach fails and
    // is undone. (Three to spare let the probes through when an fd was freed meanwhile.)
    set_open_files_limit(pid, &limit_leaving_free(pid, 1).to_string());
    let mut target = waiting_workload(&["started"], Stdio::null());
    let body = agent.wait_readyz(503, Duration::from_secs(20));
    assert!(
        body.contains("probe(s) not attached: EMFILE") && body.contains("RLIMIT_NOFILE"),
        "{body}"
    );
    let emfile = [("op", "probe"), ("errno", "EMFILE")];
    assert!(agent.metric("lookback_errors_total", &emfile) >= 1.0);
    let line = agent.wait_log("attaching the uprobe in", Duration::from_secs(5));
    assert!(line.contains("tried again each second"), "{line}");
    // The limit rises: the probe is placed on a retry, for the process still there,
    // without a restart, and it measures that process's call.
    set_open_files_limit(pid, &hard);
    agent.wait_log("attached on a retry", Duration::from_secs(10));
    agent.wait_readyz(200, Duration::from_secs(20));
    let _ = target.stdin.take().expect("stdin").write_all(b"go\n");
    assert!(target.wait().expect("wait").success());
    agent.expect_metric("lookback_triggers_total", &[("rule", "work")], 1.0);
    agent.stop_ok();
}

#[test]
fn temporary_files_a_killed_write_left_are_removed_at_start() {
    // `kill -9` during a write leaves `.NAME.tmp-PID-N` beside the snapshots; the next
    // agent removes those of writers that are gone, and nothing else.
    let out = tempfile::tempdir().expect("tempdir");
    let rule_dir = out.path().join("sleeps");
    std::fs::create_dir_all(&rule_dir).expect("mkdir");
    // No process has pid 4194304 (above the largest pid_max).
    let dead = ".20261201T100000.000000Z-1-1.fxt.gz.tmp-4194304-3";
    let live = format!(
        ".20261201T100001.000000Z-1-1.lbsnap.tmp-{}-1",
        std::process::id()
    );
    let kept = "20261201T100000.000000Z-1-1.json";
    for name in [dead, live.as_str(), kept] {
        std::fs::write(rule_dir.join(name), b"x").expect("write");
    }
    let dir = out.path().to_str().expect("utf-8 path");
    let mut agent = Agent::start(RULES, &["--output-dir", dir]);
    let said = agent.wait_log(
        "temporary file(s) an interrupted write left",
        Duration::from_secs(5),
    );
    assert!(said.contains("removed 1 ") && said.contains(dir), "{said}");
    assert!(!rule_dir.join(dead).exists());
    assert!(rule_dir.join(&live).exists(), "a live writer's file stays");
    assert!(rule_dir.join(kept).exists());
    agent.stop_ok();
}
