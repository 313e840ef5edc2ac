//! `lookback agent` end to end, as root: real BPF programs and uprobes, real workloads (some
//! started before the agent, most after), metrics scraped over HTTP, files on disk, hot
//! reload, retention, an unwritable output directory, SIGTERM.
#![allow(
    clippy::float_cmp,
    reason = "metric values are integer counts, exactly representable"
)]
#![allow(
    clippy::case_sensitive_file_extension_comparisons,
    reason = "the agent writes lowercase names"
)]
#![allow(
    clippy::too_many_lines,
    reason = "each test is one scenario, read top to bottom"
)]
use std::{
    collections::BTreeSet,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use lookback_tests::{
    agent::{Agent, files, waiting_workload, write_rules},
    lookback_bin, lookback_programs, workload,
};

const RULES: &str = r"
version: 1
defaults:
  capture: { backend: sampling, buffer_size: 256KiB }
  snapshot: { cooldown: 0s, max_per_hour: 1000 }
rules:
  - name: slow-work
    target: { exe: @WORKLOAD@ }
    trigger:
      function: { symbol: lb_work, min_duration: 10ms }
  - name: enoent
    target: { comm: workload }
    trigger:
      syscall: { names: [openat], errno: [ENOENT] }
    snapshot: { cooldown: 1h, scope: rule }
    output: { keep_raw: false }
  - name: usr1
    target: { comm: workload }
    trigger:
      signal: { signals: [SIGUSR1] }
";

#[test]
fn several_rules_and_workloads_give_exact_counts() {
    // One workload runs before the agent starts: the /proc scan must find it.
    let mut early = waiting_workload(&["calls", "6", "2", "25000", "100", "1"], Stdio::null());
    let mut agent = Agent::start(RULES, &[]);
    agent.release_when_traced(&mut early);
    assert!(early.wait().expect("wait").success());
    // Started after the agent: found through the kernel's exec events.
    agent.run_workload(&["calls", "4", "2", "25000", "100", "1"]);
    // The dynamic loader's own failed opens count too: two runs so far started after the
    // agent (the early one loaded before it), measure them with no extra.
    agent.run_workload(&["enoent", "0"]);
    agent.expect_metric("lookback_triggers_total", &[("rule", "slow-work")], 5.0);
    let baseline = agent.metric("lookback_triggers_total", &[("rule", "enoent")]);
    let per_run = baseline / 2.0;
    assert!(
        per_run >= 1.0 && per_run.fract() == 0.0,
        "loader opens of 2 workload runs: {baseline}"
    );
    agent.run_workload(&["enoent", "7"]);
    agent.expect_metric(
        "lookback_triggers_total",
        &[("rule", "enoent")],
        baseline + per_run + 7.0,
    );
    agent.run_workload(&["usr1"]);
    agent.run_workload(&["usr1"]);
    agent.expect_metric("lookback_triggers_total", &[("rule", "usr1")], 2.0);
    let enoent_total = baseline + 3.0 * per_run + 7.0;
    agent.expect_metric(
        "lookback_triggers_total",
        &[("rule", "enoent")],
        enoent_total,
    );
    // Every trigger of the rules without cooldown became a snapshot; the failed opens
    // (dozens per run: the loader's library search) only one, the rest in cooldown.
    agent.expect_metric(
        "lookback_triggers_suppressed_total",
        &[("rule", "enoent"), ("reason", "cooldown")],
        enoent_total - 1.0,
    );
    for (rule, n) in [("slow-work", 5.0), ("usr1", 2.0), ("enoent", 1.0)] {
        agent.expect_metric(
            "lookback_snapshots_total",
            &[("rule", rule), ("backend", "sampling"), ("result", "ok")],
            n,
        );
    }
    // The series must exist: a missing one would read as 0 through `metric`.
    assert_eq!(
        agent.metric_opt(
            "lookback_triggers_suppressed_total",
            &[("rule", "enoent"), ("reason", "busy")]
        ),
        Some(0.0)
    );
    assert_eq!(agent.metric("lookback_rules_loaded", &[]), 3.0);
    assert_eq!(
        agent.metric("lookback_probes_attached", &[("rule", "slow-work")]),
        2.0
    );
    // The files of contract.md: trace + metadata (+ raw when kept), mode 0600.
    let slow = files(&agent.out().join("slow-work"));
    assert_eq!(
        slow.iter().filter(|f| f.ends_with(".fxt.gz")).count(),
        5,
        "{slow:?}"
    );
    assert_eq!(
        slow.iter().filter(|f| f.ends_with(".lbsnap")).count(),
        5,
        "{slow:?}"
    );
    let enoent = files(&agent.out().join("enoent"));
    assert!(
        enoent.iter().all(|f| !f.ends_with(".lbsnap")),
        "keep_raw: false: {enoent:?}"
    );
    let meta_name = slow
        .iter()
        .find(|f| f.ends_with(".json"))
        .expect("metadata");
    let meta_path = agent.out().join("slow-work").join(meta_name);
    let mode = std::fs::metadata(&meta_path)
        .expect("stat")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).expect("read")).expect("JSON");
    assert_eq!(meta["rule"], "slow-work");
    assert_eq!(meta["trigger"]["kind"], "function");
    assert!(
        meta["trigger"]["duration_ns"].as_u64().unwrap_or(0) >= 25_000_000,
        "{meta}"
    );
    assert_eq!(meta["backend"], "sampling");
    assert_eq!(meta["comm"], "workload");
    let stem = meta_name.trim_end_matches(".json");
    assert_eq!(meta["trace_file"], format!("{stem}.fxt.gz"));
    assert_eq!(meta["raw_file"], format!("{stem}.lbsnap"));
    assert!(
        stem.ends_with(&format!("-{}-{}", meta["pid"], meta["tid"])),
        "{stem}"
    );
    assert!(meta["trigger_time_ns"].is_u64(), "{meta}");
    // The stack at the trigger: the exit probe is on lb_work's `ret`, its caller below.
    let stack = meta["trigger_stack"].as_array().expect("trigger_stack");
    assert_eq!(
        stack.first().map(|f| &f["function"]),
        Some(&"lb_work".into()),
        "{meta}"
    );
    assert!(stack.len() >= 2, "lb_work's caller: {meta}");
    // Where the call's time went: the verdict names the probed function and the interval
    // is the call's own length; the agent's log announces the snapshot with it.
    let verdict = meta["verdict"].as_str().expect("verdict");
    assert!(verdict.starts_with("lb_work "), "{meta}");
    assert_eq!(
        meta["interval_ns"], meta["trigger"]["duration_ns"],
        "{meta}"
    );
    assert!(
        meta["breakdown"].as_array().is_some_and(|b| !b.is_empty()),
        "{meta}"
    );
    assert!(agent.log().contains(verdict), "{}", agent.log());
    // Per binary, how many frames got a name (every snapshot of the rule); the workload's
    // own files have their symbols: no hint (Debian's libc has none of its own).
    for name in slow.iter().filter(|f| f.ends_with(".json")) {
        let path = agent.out().join("slow-work").join(name);
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
        for module in meta["symbols"].as_array().expect("symbols") {
            let (frames, unknown) = (module["frames"].as_u64(), module["unknown"].as_u64());
            assert!(frames > Some(0) && frames >= unknown, "{meta}");
            let path = module["module"].as_str().expect("module");
            if path.ends_with("/workload") || path.ends_with("/libworkload.so") {
                assert!(module["hint"].is_null(), "symbols are there: {meta}");
            }
        }
    }
    // The window is that of the samples: unknown (null) when the threads never ran on a
    // CPU since recording began (cpu-clock samples running threads only).
    for key in ["window_start_ns", "window_end_ns"] {
        assert!(meta[key].is_u64() || meta[key].is_null(), "{key}: {meta}");
    }
    let signal_meta = files(&agent.out().join("usr1"))
        .into_iter()
        .find(|f| f.ends_with(".json"))
        .expect("usr1 metadata");
    let signal_meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(agent.out().join("usr1").join(signal_meta)).expect("read"),
    )
    .expect("JSON");
    assert_eq!(signal_meta["trigger"]["signal"], "SIGUSR1");
    agent.stop_ok();
}

#[test]
fn suppressed_triggers_are_counted_by_reason() {
    let rules = r"
version: 1
defaults:
  capture: { backend: sampling, buffer_size: 256KiB }
rules:
  - name: cooled
    target: { comm: workload }
    trigger: { syscall: { names: [nanosleep, clock_nanosleep], min_duration: 1ms } }
    snapshot: { cooldown: 1h, scope: rule }
  - name: limited
    target: { comm: workload }
    trigger: { function: { symbol: lb_work, binary: @WORKLOAD@ } }
    snapshot: { cooldown: 0s, max_per_hour: 2 }
  - name: busy
    target: { comm: workload }
    trigger: { function: { symbol: lb_recurse, binary: @WORKLOAD@ } }
    snapshot: { cooldown: 0s, max_per_hour: 1000, post_trigger: 500ms }
";
    let mut agent = Agent::start(rules, &[]);
    agent.run_workload(&["nanosleep", "5", "3000"]);
    agent.expect_metric("lookback_triggers_total", &[("rule", "cooled")], 5.0);
    agent.expect_metric(
        "lookback_triggers_suppressed_total",
        &[("rule", "cooled"), ("reason", "cooldown")],
        4.0,
    );
    agent.run_workload(&["calls", "5", "100", "1000", "20000", "1"]);
    agent.expect_metric("lookback_triggers_total", &[("rule", "limited")], 5.0);
    agent.expect_metric(
        "lookback_triggers_suppressed_total",
        &[("rule", "limited"), ("reason", "rate_limit")],
        3.0,
    );
    // Five entries of lb_recurse within a millisecond, each waiting 500 ms to freeze: the
    // first is pending when the others arrive.
    agent.run_workload(&["recurse", "4", "100"]);
    agent.expect_metric("lookback_triggers_total", &[("rule", "busy")], 5.0);
    agent.expect_metric(
        "lookback_triggers_suppressed_total",
        &[("rule", "busy"), ("reason", "busy")],
        4.0,
    );
    for (rule, n) in [("cooled", 1.0), ("limited", 2.0), ("busy", 1.0)] {
        agent.expect_metric(
            "lookback_snapshots_total",
            &[("rule", rule), ("backend", "sampling"), ("result", "ok")],
            n,
        );
    }
    agent.stop_ok();
}

#[test]
fn hot_reload_adds_and_removes_rules_and_keeps_them_on_a_broken_file() {
    const WORK: &str = "  - name: work\n    target: { comm: workload }\n    trigger: { function: { symbol: lb_work, binary: @WORKLOAD@ } }\n";
    let one = format!(
        r"
version: 1
defaults: {{ capture: {{ backend: sampling, buffer_size: 256KiB }}, snapshot: {{ cooldown: 0s, max_per_hour: 1000 }} }}
rules:
  - name: usr1
    target: {{ comm: workload }}
    trigger: {{ signal: {{ signals: [SIGUSR1] }} }}
{WORK}"
    );
    let two = format!(
        "{one}  - name: sleeps\n    target: {{ comm: workload }}\n    trigger: {{ syscall: {{ names: [nanosleep, clock_nanosleep], min_duration: 1ms }} }}\n"
    );
    let json_files = |dir: &Path| {
        files(dir)
            .into_iter()
            .filter(|f| f.ends_with(".json"))
            .count()
    };
    let mut agent = Agent::start(&one, &[]);
    agent.run_workload(&["usr1"]);
    agent.expect_metric("lookback_triggers_total", &[("rule", "usr1")], 1.0);
    // The function rule: three calls of lb_work, three snapshots on disk.
    agent.run_workload(&["calls", "3", "1", "2000", "2000", "1"]);
    let ok = |rule| [("rule", rule), ("backend", "sampling"), ("result", "ok")];
    agent.expect_metric("lookback_snapshots_total", &ok("work"), 3.0);
    let work_dir = agent.out().join("work");
    assert_eq!(json_files(&work_dir), 3, "{:?}", files(&work_dir));
    let probes = agent.metric_opt("lookback_probes_attached", &[("rule", "work")]);
    assert!(probes.is_some_and(|n| n >= 1.0), "work probes: {probes:?}");
    // Add a rule by changing the file (no signal).
    write_rules(&agent.config(), &two);
    agent.expect_metric("lookback_config_reloads_total", &[("result", "ok")], 1.0);
    agent.expect_metric("lookback_rules_loaded", &[], 3.0);
    agent.run_workload(&["nanosleep", "3", "2000"]);
    agent.run_workload(&["usr1"]);
    agent.expect_metric("lookback_triggers_total", &[("rule", "sleeps")], 3.0);
    // The unchanged rule kept its kernel state: its counter went on from 1.
    agent.expect_metric("lookback_triggers_total", &[("rule", "usr1")], 2.0);
    // A broken file: reported with its position, the old rules keep running.
    let broken = two.replace("signals: [SIGUSR1]", "signals: [SIGUSR1], bogus: 1");
    write_rules(&agent.config(), &broken);
    agent.expect_metric("lookback_config_reloads_total", &[("result", "error")], 1.0);
    let line = agent.wait_log("reload rejected", Duration::from_secs(5));
    assert!(line.contains("rules.yaml:"), "no position: {line}");
    assert_eq!(agent.metric("lookback_rules_loaded", &[]), 3.0);
    agent.run_workload(&["nanosleep", "2", "2000"]);
    agent.expect_metric("lookback_triggers_total", &[("rule", "sleeps")], 5.0);
    // Remove the function rule with SIGHUP after fixing the file: its uprobes go.
    let without_work = two.replace(WORK, "");
    assert_ne!(without_work, two);
    write_rules(&agent.config(), &without_work);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(i32::try_from(agent.child.id()).expect("pid"), libc::SIGHUP) };
    agent.expect_metric("lookback_rules_loaded", &[], 2.0);
    assert_eq!(
        agent.metric_opt("lookback_probes_attached", &[("rule", "work")]),
        None,
        "the removed rule's probe gauge is still exposed"
    );
    agent.run_workload(&["calls", "3", "1", "2000", "2000", "1"]);
    // The rules that stay still fire (and their snapshots are written after any the
    // calls above could have caused): then the removed rule's directory must not grow.
    agent.run_workload(&["usr1"]);
    agent.expect_metric("lookback_snapshots_total", &ok("usr1"), 3.0);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        json_files(&work_dir),
        3,
        "a removed rule fired: {:?}\n{}",
        files(&work_dir),
        agent.log()
    );
    assert!(agent.metric("lookback_config_reloads_total", &[("result", "ok")]) >= 2.0);
    agent.stop_ok();
}

#[test]
fn retention_keeps_the_newest_snapshots() {
    let rules = r"
version: 1
defaults: { capture: { backend: sampling, buffer_size: 256KiB } }
rules:
  - name: sleeps
    target: { comm: workload }
    trigger: { syscall: { names: [nanosleep, clock_nanosleep], min_duration: 1ms } }
    snapshot: { cooldown: 0s, max_per_hour: 1000 }
    output: { keep_raw: false, retention: { max_files: 4, max_bytes: 1GiB } }
";
    let mut agent = Agent::start(rules, &[]);
    agent.run_workload(&["nanosleep", "5", "30000"]);
    agent.expect_metric(
        "lookback_snapshots_total",
        &[
            ("rule", "sleeps"),
            ("backend", "sampling"),
            ("result", "ok"),
        ],
        5.0,
    );
    let left = files(&agent.out().join("sleeps"));
    assert_eq!(left.len(), 4, "two snapshots of trace + metadata: {left:?}");
    // The newest two: their metadata has the latest trigger times of all five.
    let log = agent.log();
    let mut stems: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("snapshot sleeps: ").nth(1))
        .filter_map(|l| l.split(".fxt.gz").next())
        .filter_map(|p| p.rsplit('/').next())
        .collect();
    stems.sort_unstable();
    assert_eq!(stems.len(), 5, "{log}");
    for stem in &stems[3..] {
        assert!(
            left.contains(&format!("{stem}.fxt.gz")),
            "{stem} pruned: {left:?}"
        );
    }
    agent.stop_ok();
}

#[test]
fn an_unwritable_output_dir_is_counted_and_survived() {
    let rules = r"
version: 1
defaults: { capture: { backend: sampling, buffer_size: 256KiB } }
rules:
  - name: sleeps
    target: { comm: workload }
    trigger: { syscall: { names: [nanosleep, clock_nanosleep], min_duration: 1ms } }
    snapshot: { cooldown: 0s, max_per_hour: 1000 }
";
    // A directory below a regular file cannot be created, not even by root.
    let blocker = tempfile::NamedTempFile::new().expect("file");
    let out = blocker.path().join("out");
    let out = out.to_str().expect("UTF-8");
    let mut agent = Agent::start(rules, &["--output-dir", out]);
    agent.run_workload(&["nanosleep", "3", "2000"]);
    agent.expect_metric(
        "lookback_snapshots_total",
        &[
            ("rule", "sleeps"),
            ("backend", "sampling"),
            ("result", "error"),
        ],
        3.0,
    );
    assert_eq!(agent.get("/healthz").0, 200);
    assert!(agent.log().contains("cannot create"), "{}", agent.log());
    // Still working: the next triggers are counted too.
    agent.run_workload(&["nanosleep", "2", "2000"]);
    agent.expect_metric("lookback_triggers_total", &[("rule", "sleeps")], 5.0);
    agent.stop_ok();
}

/// The ids of the BPF programs process `pid` holds (program fds, and links through their
/// program), and how many of its fds are bpf links or perf events (each uprobe is one).
fn bpf_fds(pid: u32) -> (BTreeSet<u32>, usize) {
    let mut programs = BTreeSet::new();
    let mut attachments = 0;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("fd dir");
    for fd in fds.filter_map(Result::ok) {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        if target == "anon_inode:[perf_event]" || target == "anon_inode:bpf_link" {
            attachments += 1;
        }
        if !target.starts_with("anon_inode:bpf") {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        programs.extend(
            info.lines()
                .filter_map(|l| l.strip_prefix("prog_id:"))
                .filter_map(|v| v.trim().parse::<u32>().ok()),
        );
    }
    (programs, attachments)
}

/// Ids of the programs loaded on the machine, and the program ids links point to.
fn loaded_program_and_link_ids() -> (BTreeSet<u32>, BTreeSet<u32>) {
    let programs = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect();
    let linked = aya::programs::loaded_links()
        .filter_map(Result::ok)
        .map(|l| l.program_id())
        .collect();
    (programs, linked)
}

#[test]
fn sigterm_detaches_everything() {
    let mut agent = Agent::start(RULES, &[]);
    let names = lookback_programs();
    assert!(
        names.len() >= 6,
        "the agent's programs are not loaded: {names:?}"
    );
    // What this agent holds, by kernel id (other lookback processes may run meanwhile).
    let pid = agent.child.id();
    let (ours, attachments) = bpf_fds(pid);
    let (loaded, _) = loaded_program_and_link_ids();
    assert!(
        ours.len() >= 6 && ours.is_subset(&loaded),
        "program ids held by the agent: {ours:?}, loaded: {loaded:?}"
    );
    // slow-work's uprobes (entry and return) and the tracepoints, at least.
    assert!(attachments >= 8, "{attachments} links/perf events");
    // A snapshot in flight when SIGTERM arrives is finished, not torn.
    agent.run_workload(&["usr1"]);
    agent.wait_log("trigger usr1", Duration::from_secs(10));
    let out = agent.out();
    let (status, log) = agent.stop();
    assert!(status.success(), "{status}\n{log}");
    assert!(log.contains("every probe detached"), "{log}");
    // The kernel frees a program once its last reference goes (after an RCU grace period).
    let mut left = (BTreeSet::new(), BTreeSet::new());
    for _ in 0..50 {
        let (programs, linked) = loaded_program_and_link_ids();
        left = (
            ours.intersection(&programs).copied().collect(),
            ours.intersection(&linked).copied().collect(),
        );
        if left.0.is_empty() && left.1.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        left.0.is_empty() && left.1.is_empty(),
        "the agent's programs {:?} (linked: {:?}) outlive it",
        left.0,
        left.1
    );
    let usr1 = files(&out.join("usr1"));
    assert!(
        usr1.iter().any(|f| f.ends_with(".json")) && usr1.iter().all(|f| !f.contains(".tmp")),
        "{usr1:?}\n{log}"
    );
}

/// A workload that is killed when the test ends, passed or not.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn sigterm_writes_snapshots_still_waiting_for_post_trigger() {
    // The freeze is due 30 s after the trigger, the shutdown timeout is 10 s: only a freeze
    // at shutdown writes the snapshot, and only a bounded shutdown exits in time.
    let rules = r"
version: 1
defaults: { capture: { backend: sampling, buffer_size: 256KiB } }
rules:
  - name: sleeps
    target: { comm: workload }
    trigger: { syscall: { names: [nanosleep, clock_nanosleep], min_duration: 1ms } }
    snapshot: { cooldown: 1h, post_trigger: 30s }
";
    let mut agent = Agent::start(rules, &[]);
    // A hundred 100 ms sleeps: the process outlives the test (its exit would freeze too).
    let child = waiting_workload(&["nanosleep", "100", "100000"], Stdio::null());
    let mut workload = Running(child);
    agent.release_when_traced(&mut workload.0);
    agent.wait_log("trigger sleeps", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    let out = agent.out();
    let asked = Instant::now();
    let (status, log) = agent.stop();
    let took = asked.elapsed();
    assert!(status.success(), "{status}\n{log}");
    assert!(
        took < Duration::from_secs(4),
        "SIGTERM took {took:?} with a 30 s post_trigger pending\n{log}"
    );
    assert!(log.contains("freezing 1 snapshot(s)"), "{log}");
    let written = files(&out.join("sleeps"));
    assert!(
        written.iter().any(|f| f.ends_with(".json"))
            && written.iter().any(|f| f.ends_with(".fxt.gz"))
            && written.iter().all(|f| !f.contains(".tmp")),
        "{written:?}\n{log}"
    );
    drop(workload);
}

#[test]
fn a_function_rule_without_its_symbol_is_not_ready() {
    let usr1 = r"
version: 1
defaults: { capture: { backend: sampling, buffer_size: 256KiB } }
rules:
  - name: usr1
    target: { comm: workload }
    trigger: { signal: { signals: [SIGUSR1] } }
";
    let rules = format!(
        "{usr1}  - name: missing\n    target: {{ comm: workload }}\n    trigger: {{ function: {{ symbol: lb_spinn, binary: @WORKLOAD@ }} }}\n"
    );
    let mut agent = Agent::launch(&rules, &[], &[]);
    let body = agent.poll(Duration::from_secs(30), |agent| {
        let (status, body) = agent.get("/readyz");
        if body.contains("rule missing") {
            assert_eq!(status, 503, "{body}");
            return Ok(body);
        }
        Err(format!("/readyz never names the rule: {status} {body}"))
    });
    // The error teaches: the nearest name.
    assert!(
        body.contains("no probe attached")
            && body.contains("lb_spinn")
            && body.contains("did you mean `lb_spin`"),
        "{body}"
    );
    // And a metric says which rule and why, for alerts.
    let metrics = agent.get("/metrics").1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lookback_rule_probe_errors{")
                && l.contains("rule=\"missing\"")
                && l.contains("reason=\"symbol_not_found\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    // It stays so (readiness is re-evaluated every tick), and the agent is alive.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(agent.get("/readyz").0, 503);
    assert_eq!(agent.get("/healthz").0, 200);
    assert!(
        agent.log().contains("rule missing: no uprobe in"),
        "{}",
        agent.log()
    );
    // Fixing the rules makes it ready.
    write_rules(&agent.config(), usr1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent.get("/readyz").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "still not ready\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    agent.stop_ok();
}

#[test]
fn a_bad_rules_file_at_start_exits_2_with_its_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("rules.yaml");
    write_rules(
        &config,
        "version: 1\nrules:\n  - name: r\n    target: { comm: workload }\n    trigger: { signal: { signals: [SIGUSR1], bogus: 1 } }\n",
    );
    let out = Command::new(lookback_bin())
        .args(["agent", "--config"])
        .arg(&config)
        .args(["--metrics-addr", "127.0.0.1:0", "--output-dir"])
        .arg(dir.path().join("out"))
        .stdin(Stdio::null())
        .output()
        .expect("lookback agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    // FILE:LINE:COL of the offending key, then what is wrong.
    let want = format!("{}:5:46: ", config.display());
    assert!(
        stderr.contains(&want) && stderr.contains("bogus"),
        "no {want:?} in: {stderr}"
    );
    assert!(!dir.path().join("out").exists(), "it wrote output");
}

/// A function rule that names its binary is probed when it loads, so the binary's first
/// process is met from its first call even when it is gone before the agent hears of it;
/// one that does not name it is probed when the agent reads the first process's exec
/// event: that process ran unprobed for a while, which is counted and logged.
#[test]
fn a_rule_that_names_its_binary_meets_the_first_process_from_its_first_call() {
    let rules = r"
version: 1
defaults:
  capture: { backend: sampling, buffer_size: 256KiB }
  snapshot: { cooldown: 0s, max_per_hour: 1000 }
rules:
  - name: named
    target: { comm: workload }
    trigger: { function: { symbol: lb_work, binary: @WORKLOAD@ } }
  - name: unnamed
    target: { comm: workload }
    trigger: { function: { symbol: lb_work } }
";
    let mut agent = Agent::start(rules, &[]);
    // The first process calls lb_work as soon as its main starts, waiting for nobody.
    let out = Command::new(workload())
        .arg("started")
        .output()
        .expect("workload");
    assert!(out.status.success());
    agent.expect_metric("lookback_triggers_total", &[("rule", "named")], 1.0);
    // The second waits until the agent traces it: by then both rules' probes are there.
    agent.run_workload(&["started"]);
    agent.expect_metric("lookback_triggers_total", &[("rule", "named")], 2.0);
    let unnamed = agent.settled_metric("lookback_triggers_total", &[("rule", "unnamed")], 1.0);
    assert!(unnamed <= 2.0, "{unnamed}");
    // Exactly one process ran before the unnamed rule's probe: the first the agent saw of
    // the binary (the first, or, when it was gone before its exec event was read, the
    // second); never one of the named rule.
    agent.expect_metric(
        "lookback_function_probes_late_total",
        &[("rule", "unnamed")],
        1.0,
    );
    assert_eq!(
        agent.metric_opt("lookback_function_probes_late_total", &[("rule", "named")]),
        None
    );
    let line = agent.wait_log(
        "before the rule's probe was placed in it",
        Duration::from_secs(5),
    );
    assert!(line.contains("rule unnamed:"), "{line}");
    agent.stop_ok();
}

#[test]
fn a_signal_rule_warns_when_its_target_ignores_or_blocks_the_signal() {
    // A shell's `trap '' USR1` is inherited across exec, as `nohup` does for SIGHUP: a
    // SIGUSR1 sent to such a process is dropped before delivery, and the rule would stay
    // silent without a word.
    let rules = "
version: 1
rules:
  - name: usr1
    target: { comm: workload }
    trigger: { signal: { signals: [SIGUSR1, SIGSEGV] } }
";
    let mut agent = Agent::start(rules, &[]);
    let mut ignoring = Command::new("sh")
        .arg("-c")
        .arg("trap '' USR1; exec \"$0\" --wait nanosleep 1 1")
        .arg(workload())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("sh");
    agent.release_when_traced(&mut ignoring);
    let line = agent.wait_log("ignores SIGUSR1", Duration::from_secs(10));
    assert!(
        line.contains("rule usr1")
            && line.contains(&ignoring.id().to_string())
            && !line.contains("SIGSEGV,"),
        "{line}"
    );
    assert!(ignoring.wait().expect("wait").success());
    // A blocked signal mask is inherited across exec too (a `sigwait` server blocks what
    // it takes): the rule fires at the first send, later ones merge into the pending one.
    let mut blocking = Command::new("python3")
        .arg("-c")
        .arg(
            "import os, signal, sys\n\
             signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n\
             os.execv(sys.argv[1], sys.argv[1:])",
        )
        .arg(workload())
        .args(["--wait", "nanosleep", "1", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("python3");
    agent.release_when_traced(&mut blocking);
    let line = agent.wait_log("blocks SIGUSR1", Duration::from_secs(10));
    assert!(
        line.contains("rule usr1")
            && line.contains(&blocking.id().to_string())
            && !line.contains("SIGSEGV"),
        "{line}"
    );
    assert!(blocking.wait().expect("wait").success());
    // A process that neither ignores nor blocks it: no warning.
    agent.run_workload(&["nanosleep", "1", "1"]);
    for said in ["ignores SIGUSR1", "blocks SIGUSR1"] {
        assert_eq!(agent.log().matches(said).count(), 1, "{}", agent.log());
    }
    agent.stop_ok();
}

#[test]
fn the_cooldown_is_per_process_so_a_noisy_process_cannot_starve_another() {
    // Two runs of a workload, three slow sleeps each, under two rules with a 1 h cooldown:
    // kept per process (the default), the second process still gets its snapshot; kept
    // per rule (`scope: rule`), the first process used it up.
    let rules = r"
version: 1
defaults: { capture: { backend: sampling, buffer_size: 256KiB } }
rules:
  - name: per-process
    target: { comm: workload }
    trigger: { syscall: { names: [nanosleep, clock_nanosleep], min_duration: 1ms } }
    snapshot: { cooldown: 1h }
  - name: per-rule
    target: { comm: workload }
    trigger: { syscall: { names: [nanosleep, clock_nanosleep], min_duration: 1ms } }
    snapshot: { cooldown: 1h, scope: rule }
";
    let mut agent = Agent::start(rules, &[]);
    agent.run_workload(&["nanosleep", "3", "3000"]);
    agent.run_workload(&["nanosleep", "3", "3000"]);
    for (rule, sent) in [("per-process", 2.0), ("per-rule", 1.0)] {
        agent.expect_metric("lookback_triggers_total", &[("rule", rule)], 6.0);
        agent.expect_metric(
            "lookback_triggers_suppressed_total",
            &[("rule", rule), ("reason", "cooldown")],
            6.0 - sent,
        );
        agent.expect_metric(
            "lookback_snapshots_total",
            &[("rule", rule), ("backend", "sampling"), ("result", "ok")],
            sent,
        );
    }
    agent.stop_ok();
}

/// `CLOCK_MONOTONIC` now, in ns (the clock of the samples and triggers).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).expect("time") * 1_000_000_000 + u64::try_from(ts.tv_nsec).expect("ns")
}

/// CPU ticks (user) process `pid` has used.
fn user_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the comm's closing parenthesis; utime is the 14th field overall.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(11)?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_reload_that_changes_a_rules_target_swaps_it_without_a_gap() {
    // A rule whose target changes cannot be changed in place: it gets a new rule id and
    // its processes are selected anew. It is swapped: the new version is installed and
    // each process moves to it in one write of the kernel's target map before the old
    // version goes, so no sleep falls between them; the old version's last counts are
    // read as it leaves. Detached first, the sleeps during the install and the /proc
    // rescan were not seen, nor those the old version counted since the last read.
    let rules = |target: &str| {
        format!(
            r"
version: 1
defaults:
  capture: {{ backend: sampling, buffer_size: 256KiB }}
rules:
  - name: sleeps
    target: {target}
    trigger: {{ syscall: {{ names: [nanosleep, clock_nanosleep], min_duration: 1ms }} }}
    snapshot: {{ cooldown: 1h, scope: rule }}
"
        )
    };
    let mut agent = Agent::start(&rules("{ comm: workload }"), &[]);
    // 3,000 sleeps of 2 ms: over 6 s of a steady stream.
    let mut child = waiting_workload(&["nanosleep", "3000", "2000"], Stdio::null());
    agent.release_when_traced(&mut child);
    let sleeps = [("rule", "sleeps")];
    for (n, reloads, after, target) in [
        (1, 1.0, 300.0, "{ comm: workload, exe: @WORKLOAD@ }"),
        (2, 2.0, 1200.0, "{ comm: workload }"),
    ] {
        agent.poll(Duration::from_secs(30), |agent| {
            let seen = agent.metric("lookback_triggers_total", &sleeps);
            if seen >= after {
                Ok(())
            } else {
                Err(format!("{seen} sleeps counted, waiting for {after}"))
            }
        });
        write_rules(&agent.config(), &rules(target));
        agent.expect_metric(
            "lookback_config_reloads_total",
            &[("result", "ok")],
            reloads,
        );
        agent.poll(Duration::from_secs(10), |agent| {
            let swapped = agent.log().matches("rule sleeps: swapped").count();
            if swapped >= n {
                Ok(())
            } else {
                Err(format!("{swapped} swaps logged"))
            }
        });
    }
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the workload was still sleeping at the second swap"
    );
    assert!(child.wait().expect("workload").success());
    agent.expect_metric("lookback_triggers_total", &sleeps, 3000.0);
    assert!(!agent.log().contains("changed in place"), "{}", agent.log());
    agent.stop_ok();
}

#[test]
fn a_reload_that_changes_a_rules_capture_records_its_processes_anew() {
    // A swapped rule whose capture changed: its running processes are recorded as the new
    // version says (new rings of the new size), not kept on the old version's rings.
    let rules = |size: &str| {
        format!(
            r"
version: 1
rules:
  - name: usr1
    target: {{ comm: workload }}
    capture: {{ backend: sampling, buffer_size: {size}, isolate: true }}
    trigger: {{ signal: {{ signals: [SIGUSR1] }} }}
    output: {{ keep_raw: true }}
"
        )
    };
    let mut agent = Agent::start(&rules("256KiB"), &[]);
    let mut child = waiting_workload(&["usr1"], Stdio::null());
    agent.wait_log(
        &format!("tracing process {} ", child.id()),
        Duration::from_secs(10),
    );
    write_rules(&agent.config(), &rules("512KiB"));
    agent.expect_metric("lookback_config_reloads_total", &[("result", "ok")], 1.0);
    agent.wait_log("rule usr1: swapped", Duration::from_secs(10));
    let _ = std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), b"go\n");
    assert!(child.wait().expect("workload").success());
    agent.expect_metric(
        "lookback_snapshots_total",
        &[("rule", "usr1"), ("backend", "sampling"), ("result", "ok")],
        1.0,
    );
    let snaps = lookback_tests::agent::read_snapshots(&agent.out().join("usr1"));
    assert_eq!(snaps.len(), 1);
    assert_eq!(
        snaps[0].meta.recorder.buffer_size,
        512 << 10,
        "{}",
        agent.log()
    );
    agent.stop_ok();
}

#[test]
fn a_reload_that_changes_a_rule_keeps_it_measuring() {
    // A latency rule whose cooldown is changed by a reload while a slow call is in
    // flight: the call's entry, the probes and the process's rings live through the
    // reload, so the call still fires when it returns, and its snapshot holds samples
    // from before the reload. The second slow call meets the new cooldown (1 h).
    let rules = |cooldown: &str| {
        format!(
            r"
version: 1
defaults:
  # 100 Hz without stack copies: the 1 MiB ring holds the whole 3 s call.
  capture: {{ backend: sampling, buffer_size: 1MiB, sample_frequency: 100, stack_size: 0 }}
rules:
  - name: slow-spin
    target: {{ comm: workload }}
    trigger: {{ function: {{ symbol: lb_spin, binary: @WORKLOAD@, min_duration: 1s }} }}
    snapshot: {{ cooldown: {cooldown} }}
"
        )
    };
    let mut agent = Agent::start(&rules("0s"), &[]);
    // Two calls of lb_spin, 3 s each, spinning on the CPU.
    let mut child = waiting_workload(&["spinbg", "3000", "2", "0"], Stdio::null());
    agent.release_when_traced(&mut child);
    // Inside the first call once it has spun for 0.2 s of CPU time (whatever the speed).
    let started = Instant::now();
    while user_ticks(child.id()) < 20 {
        assert!(
            started.elapsed() < Duration::from_mins(1),
            "the workload does not spin"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let reload_ns = monotonic_ns();
    write_rules(&agent.config(), &rules("1h"));
    agent.expect_metric("lookback_config_reloads_total", &[("result", "ok")], 1.0);
    agent.wait_log("rule slow-spin: changed in place", Duration::from_secs(5));
    assert!(child.wait().expect("workload").success());
    agent.expect_metric("lookback_triggers_total", &[("rule", "slow-spin")], 2.0);
    agent.expect_metric(
        "lookback_triggers_suppressed_total",
        &[("rule", "slow-spin"), ("reason", "cooldown")],
        1.0,
    );
    agent.expect_metric(
        "lookback_snapshots_total",
        &[
            ("rule", "slow-spin"),
            ("backend", "sampling"),
            ("result", "ok"),
        ],
        1.0,
    );
    let snaps = lookback_tests::agent::read_snapshots(&agent.out().join("slow-spin"));
    assert_eq!(snaps.len(), 1);
    let first = lookback_tests::agent::sample_times(&snaps[0], child.id())
        .into_iter()
        .min()
        .expect("samples of the workload");
    assert!(
        first < reload_ns,
        "the process's rings were replaced at the reload: first sample {first} ns, reload at \
         {reload_ns} ns\n{}",
        agent.log()
    );
    agent.stop_ok();
}
