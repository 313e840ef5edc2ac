//! The trigger engine against real processes: real BPF programs, real uprobes and raw
//! tracepoints, the C workload in tests/workloads. Needs root (run by `cargo xtask test`
//! with --test-threads=1: uprobes and BPF state are shared).
use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
};

use lookback_tests::{DryRun, dry_run, lookback_bin, lookback_programs, workload};

fn durations_ms(events: &[&serde_json::Value]) -> Vec<f64> {
    events
        .iter()
        .map(|e| e["duration_ns"].as_f64().expect("duration") / 1e6)
        .collect()
}

#[test]
fn latency_trigger_fires_exactly_for_slow_calls_on_every_thread() {
    // 4 threads × 20 calls; every 5th call sleeps 8 ms, the others 100 µs.
    let run = dry_run(
        &["--trigger", "func:lb_work>5ms"],
        &["calls", "20", "5", "8000", "100", "4"],
    );
    let events = run.of_rule(0);
    // The 16 slow calls fire; a fast one fires too when it took over 5 ms after all (a
    // busy machine): never more than the calls the program itself measured at 5 ms or
    // more (the kernel times entry to return, inside the program's measurement).
    let slow_by_the_program = run
        .program_stdout
        .lines()
        .filter_map(|l| l.strip_prefix("call_ns=")?.parse::<u64>().ok())
        .filter(|&ns| ns >= 5_000_000)
        .count();
    assert!(
        (16..=slow_by_the_program).contains(&events.len()),
        "{} triggers, {slow_by_the_program} calls of 5 ms or more: {events:#?}",
        events.len()
    );
    assert!(
        durations_ms(&events).iter().all(|&d| d >= 5.0),
        "{events:#?}"
    );
    let tids: BTreeSet<_> = events.iter().map(|e| e["tid"].as_u64()).collect();
    assert_eq!(tids.len(), 4, "one set of triggers per thread: {tids:?}");
    let pids: BTreeSet<_> = events.iter().map(|e| e["pid"].as_u64()).collect();
    assert_eq!(pids.len(), 1);
    assert_eq!(run.counter(0, "met"), events.len() as u64);
    assert_eq!(run.counter(0, "emitted"), events.len() as u64);
}

#[test]
fn entry_trigger_fires_on_every_call() {
    let run = dry_run(
        &["--trigger", "func:lb_work"],
        &["calls", "7", "0", "0", "10", "1"],
    );
    let events = run.of_rule(0);
    assert_eq!(events.len(), 7);
    assert!(
        events
            .iter()
            .all(|e| e["on_entry"] == true && e.get("duration_ns").is_none())
    );
}

#[test]
fn recursion_measures_each_level_against_its_own_entry() {
    // lb_recurse(3): levels take 2, 4, 6, 8 ms; only the outer two exceed 5 ms.
    let run = dry_run(
        &["--trigger", "func:lb_recurse>5ms"],
        &["recurse", "3", "2000"],
    );
    let events = run.of_rule(0);
    // The program's own measurement of each level decides which fire (on a loaded
    // machine a 4 ms level can take more than 5 ms): outermost is depth 0.
    let slow: Vec<u64> = run
        .program_stdout
        .lines()
        .filter_map(|l| {
            let (level, ns) = l.strip_prefix("level_ns=")?.split_once(':')?;
            let (level, ns) = (level.parse::<u64>().ok()?, ns.parse::<u64>().ok()?);
            (ns > 5_000_000).then_some(3 - level)
        })
        .collect();
    assert!(
        slow.len() >= 2,
        "the outer two take 6 and 8 ms: {}",
        run.program_stdout
    );
    let depths: Vec<u64> = events.iter().filter_map(|e| e["depth"].as_u64()).collect();
    assert_eq!(depths, slow, "{events:#?}");
    assert!(durations_ms(&events).iter().all(|&d| d >= 5.0));
}

#[test]
fn symbol_in_a_shared_library() {
    let run = dry_run(&["--trigger", "func:lib_slow>1ms"], &["lib", "3", "2000"]);
    assert_eq!(run.of_rule(0).len(), 3);
    let probe = &run.summary["rules"][0]["probes"][0]["path"];
    assert!(
        probe
            .as_str()
            .is_some_and(|p| p.ends_with("libworkload.so")),
        "{probe}"
    );
}

#[test]
fn children_are_followed() {
    let run = dry_run(&["--trigger", "func:lb_work>5ms"], &["fork", "3", "6000"]);
    assert_eq!(run.of_rule(0).len(), 3);
    let run = dry_run(
        &["--no-follow-forks", "--trigger", "func:lb_work>5ms"],
        &["fork", "3", "6000"],
    );
    assert_eq!(run.of_rule(0).len(), 0, "the child is not a target");
}

#[test]
fn slow_syscalls() {
    // 3 sleeps of 8 ms and 3 of 1 ms: only the slow ones.
    let slow = dry_run(
        &["--trigger", "syscall:nanosleep,clock_nanosleep>5ms"],
        &["nanosleep", "3", "8000"],
    );
    assert_eq!(slow.of_rule(0).len(), 3);
    let fast = dry_run(
        &["--trigger", "syscall:nanosleep,clock_nanosleep>5ms"],
        &["nanosleep", "3", "1000"],
    );
    assert_eq!(fast.of_rule(0).len(), 0);
    // Every fsync takes more than a nanosecond: exactly one trigger per call.
    let fsync = dry_run(
        &["--trigger", "syscall:fsync,fdatasync>1ns"],
        &["fsync", "4"],
    );
    let events = fsync.of_rule(0);
    assert_eq!(events.len(), 4);
    assert!(events.iter().all(|e| e["syscall"] == 74 && e["ret"] == 0));
}

#[test]
fn failing_syscalls_by_errno() {
    // The dynamic loader also probes missing files; measure that baseline first.
    let spec = ["--trigger", "syscall:openat=ENOENT"];
    let base = dry_run(&spec, &["enoent", "0"]).of_rule(0).len();
    let run = dry_run(&spec, &["enoent", "5"]);
    let events = run.of_rule(0);
    assert_eq!(events.len(), base + 5, "baseline {base}");
    assert!(
        events
            .iter()
            .all(|e| e["errno"] == 2 && e["ret"] == -2 && e["syscall"] == 257)
    );
    // Only ENOENT: an EACCES-only rule sees none of these.
    let other = dry_run(&["--trigger", "syscall:openat=EACCES"], &["enoent", "5"]);
    assert_eq!(other.of_rule(0).len(), 0);
}

#[test]
fn rules_met_by_the_same_syscall_each_fire() {
    // One ring entry per event carries the mask of the rules it met; each gets its event
    // and its counters, with the same stack.
    let spec = [
        "--trigger",
        "syscall:openat=ENOENT",
        "--trigger",
        "syscall:openat,open=ENOENT,EACCES",
        "--trigger",
        "syscall:openat=EACCES",
    ];
    let base = dry_run(&spec, &["enoent", "0"]);
    let run = dry_run(&spec, &["enoent", "7"]);
    let (enoent, either) = (run.of_rule(0), run.of_rule(1));
    let base_enoent = base.of_rule(0).len();
    assert_eq!(enoent.len(), base_enoent + 7, "baseline {base_enoent}");
    assert_eq!(either.len(), enoent.len());
    assert!(run.of_rule(2).is_empty(), "EACCES never met");
    for (id, events) in [(0, &enoent), (1, &either)] {
        assert_eq!(run.counter(id, "met"), events.len() as u64, "rule {id}");
        assert_eq!(run.counter(id, "emitted"), events.len() as u64, "rule {id}");
    }
    // The same failing opens: same time, thread and stack.
    for (e, o) in enoent.iter().zip(&either) {
        for field in ["timestamp_ns", "tid", "stack", "ret"] {
            assert_eq!(e[field], o[field], "{field}: {e} vs {o}");
        }
    }
}

#[test]
fn the_last_rule_slot_fires_too() {
    // Rule id 63, the mask's top bit: 63 rules that never fire, then a failing open.
    let mut spec: Vec<&str> = Vec::new();
    for _ in 0..63 {
        spec.extend(["--trigger", "signal:SIGUSR2"]);
    }
    spec.extend(["--trigger", "syscall:openat=ENOENT"]);
    let run = dry_run(&spec, &["enoent", "3"]);
    let events = run.of_rule(63);
    assert!(events.len() >= 3, "{}", run.stderr);
    assert_eq!(run.counter(63, "emitted"), events.len() as u64);
}

#[test]
fn fatal_signals() {
    for (mode, signal) in [("segv", 11), ("abort", 6)] {
        let run = dry_run(&["--trigger", "signal:SIGSEGV,SIGABRT"], &[mode]);
        let events = run.of_rule(0);
        assert_eq!(events.len(), 1, "{mode}: {events:#?}");
        assert_eq!(events[0]["signal"], signal);
        assert_eq!(
            run.summary["exit"]["signal"], signal,
            "{mode}: the workload died by it"
        );
    }
    let handled = dry_run(&["--trigger", "signal:SIGSEGV"], &["usr1"]);
    assert_eq!(handled.of_rule(0).len(), 0, "SIGUSR1 is not in the set");
}

#[test]
fn other_processes_never_trigger() {
    // A bystander runs the same slow calls at the same time, from the same binary.
    let mut bystander = Command::new(workload())
        .args(["calls", "6", "1", "8000", "0", "1"])
        .spawn()
        .expect("bystander");
    let run = dry_run(
        &[
            "--trigger",
            "func:lb_work>5ms",
            "--trigger",
            "syscall:nanosleep,clock_nanosleep>5ms",
        ],
        &["calls", "2", "1", "8000", "0", "1"],
    );
    bystander.wait().expect("bystander exits");
    let pids: BTreeSet<_> = run.events.iter().map(|e| e["pid"].as_u64()).collect();
    assert_eq!(pids.len(), 1, "{pids:?}");
    assert!(!pids.contains(&Some(u64::from(bystander.id()))));
    assert_eq!(run.of_rule(0).len(), 2);
    assert_eq!(run.of_rule(1).len(), 2);
}

#[test]
fn cooldown_and_rate_limit_are_counted_exactly() {
    let run = dry_run(
        &["--cooldown", "10s", "--trigger", "func:lb_work>5ms"],
        &["calls", "5", "1", "6000", "0", "1"],
    );
    assert_eq!(run.of_rule(0).len(), 1);
    assert_eq!(
        (
            run.counter(0, "met"),
            run.counter(0, "emitted"),
            run.counter(0, "suppressed_cooldown")
        ),
        (5, 1, 4)
    );
    let run = dry_run(
        &["--max-per-hour", "2", "--trigger", "func:lb_work>5ms"],
        &["calls", "6", "1", "6000", "0", "1"],
    );
    assert_eq!(run.of_rule(0).len(), 2);
    assert_eq!(
        (
            run.counter(0, "met"),
            run.counter(0, "emitted"),
            run.counter(0, "suppressed_rate_limit")
        ),
        (6, 2, 4)
    );
}

#[test]
fn a_storm_of_a_million_matches_does_not_reach_userspace() {
    let run = dry_run(
        &["--cooldown", "1h", "--trigger", "syscall:getpid"],
        &["getpid", "1000000"],
    );
    assert_eq!(run.of_rule(0).len(), 1);
    assert_eq!(run.counter(0, "met"), 1_000_000);
    assert_eq!(run.counter(0, "suppressed_cooldown"), 999_999);
    assert_eq!(run.counter(0, "lost_ringbuf_full"), 0);
}

fn uprobe_events() -> String {
    std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default()
}

#[test]
fn nothing_is_left_behind_after_exit() {
    // Programs of an earlier lookback may still be on their way out (the kernel frees them
    // after an RCU grace period once their last fd is closed): each check allows a moment.
    let settle = |done: &dyn Fn(&[String]) -> bool| {
        let mut programs = lookback_programs();
        for _ in 0..50 {
            if done(&programs) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            programs = lookback_programs();
        }
        programs
    };
    let before = settle(&|p| p.is_empty());
    let uprobes_before = uprobe_events();
    let run = dry_run(
        &[
            "--trigger",
            "func:lb_work>1ms",
            "--trigger",
            "syscall:any>1s",
            "--trigger",
            "signal:SIGUSR1",
        ],
        &["calls", "2", "1", "2000", "0", "1"],
    );
    assert_eq!(run.of_rule(0).len(), 2);
    // Whatever was loaded before (another lookback on this machine) may stay; ours must go.
    let after = settle(&|p| p.iter().all(|name| before.contains(name)));
    assert!(
        after.iter().all(|name| before.contains(name)),
        "programs left behind: {after:?} (before: {before:?})"
    );
    assert_eq!(uprobe_events(), uprobes_before, "uprobe_events changed");
}

#[test]
fn attach_to_a_running_multithreaded_process() {
    let mut target = Command::new(workload())
        .args(["--wait", "calls", "10", "2", "7000", "100", "3"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("workload");
    let pid = target.id().to_string();
    let mut lookback = Command::new(lookback_bin())
        .args([
            "attach",
            "--dry-run",
            "--json",
            "--max-snapshots",
            "0",
            "-p",
            &pid,
        ])
        .args(["--trigger", "func:lb_work>5ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lookback attach");
    let stderr = lookback.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        let line = line.expect("stderr line");
        if line.contains("waiting for triggers") {
            break;
        }
        assert!(!line.contains("error"), "{line}");
    }
    target
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("release the workload");
    target.wait().expect("workload exits");
    let output = lookback
        .wait_with_output()
        .expect("lookback exits when the target does");
    let run = DryRun::parse(&output);
    assert!(run.status.success());
    let events = run.of_rule(0);
    assert_eq!(events.len(), 15, "3 threads × 5 slow calls: {events:#?}");
    assert!(
        events
            .iter()
            .all(|e| e["pid"].as_u64() == Some(u64::from(target.id())))
    );
}

#[test]
fn bad_input_is_reported_and_the_other_rules_run() {
    let run = dry_run(
        &[
            "--trigger",
            "func:no_such_function>1ms",
            "--trigger",
            "func:lb_work>5ms",
        ],
        &["calls", "2", "1", "6000", "0", "1"],
    );
    assert!(run.stderr.contains("no_such_function"), "{}", run.stderr);
    assert_eq!(run.of_rule(1).len(), 2);
    // Nothing usable at all, because no rule names a function there: a usage error.
    let out = Command::new(lookback_bin())
        .args([
            "run",
            "--dry-run",
            "--trigger",
            "func:no_such_function",
            "--",
        ])
        .arg(workload())
        .output()
        .expect("lookback");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("symbol no_such_function not found"), "{err}");
    // Usage errors: missing command, missing process.
    let out = Command::new(lookback_bin())
        .args([
            "run",
            "--dry-run",
            "--trigger",
            "func:f",
            "--",
            "/nonexistent/cmd",
        ])
        .output()
        .expect("lookback");
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(lookback_bin())
        .args([
            "attach",
            "--dry-run",
            "-p",
            "999999999",
            "--trigger",
            "func:f",
        ])
        .output()
        .expect("lookback");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("process 999999999 not found"));
}

#[test]
fn a_target_that_exits_during_attach_is_reported() {
    let mut short = Command::new("true").spawn().expect("true");
    let pid = short.id().to_string();
    short.wait().expect("exits");
    let out = Command::new(lookback_bin())
        .args([
            "attach",
            "--dry-run",
            "-p",
            &pid,
            "--trigger",
            "syscall:getpid",
        ])
        .output()
        .expect("lookback");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `perf stat -e EVENTS -- workload --wait ARGS`, optionally with `lookback attach`
/// attached to the workload (with `triggers`) before it starts; returns perf's counts and
/// lookback's trigger events.
fn perf_counts(
    events: &str,
    args: &[&str],
    triggers: Option<&[&str]>,
) -> (Vec<u64>, Vec<serde_json::Value>) {
    let out = tempfile::NamedTempFile::new().expect("temp file");
    let mut perf = Command::new("perf")
        .args(["stat", "-x", ",", "-e", events, "-o"])
        .arg(out.path())
        .arg("--")
        .arg(workload())
        .arg("--wait")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("perf (apt-get install linux-perf)");
    // The workload is perf's child; wait until it exists and is blocked on stdin.
    let children = format!("/proc/{0}/task/{0}/children", perf.id());
    let pid = (0..200)
        .find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            std::fs::read_to_string(&children)
                .ok()?
                .split_whitespace()
                .next()
                .map(str::to_owned)
        })
        .expect("workload started under perf");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let lookback = triggers.map(|triggers| {
        let mut cmd = Command::new(lookback_bin());
        cmd.args([
            "attach",
            "--dry-run",
            "--json",
            "--max-snapshots",
            "0",
            "-p",
            &pid,
        ]);
        for t in triggers {
            cmd.args(["--trigger", t]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lookback");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        assert!(
            lines
                .by_ref()
                .map_while(Result::ok)
                .any(|l| l.contains("waiting for triggers")),
            "lookback did not attach"
        );
        child
    });
    perf.stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("release");
    assert!(perf.wait().expect("perf").success());
    let events = lookback.map_or_else(Vec::new, |child| {
        DryRun::parse(
            &child
                .wait_with_output()
                .expect("lookback exits with its target"),
        )
        .events
    });
    let text = std::fs::read_to_string(out.path()).expect("perf output");
    let counts = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.split(',')
                .next()
                .and_then(|c| c.trim().parse().ok())
                .unwrap_or_else(|| panic!("perf line {l}"))
        })
        .collect();
    (counts, events)
}

#[test]
fn other_perf_users_see_the_same_counts() {
    if Command::new("perf").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "perf is missing on CI (apt-get install linux-perf)"
        );
        eprintln!("skipped: perf not installed");
        return;
    }
    let events = "raw_syscalls:sys_enter,raw_syscalls:sys_exit,signal:signal_generate";
    let (without, _) = perf_counts(events, &["usr1"], None);
    let (with, triggered) = perf_counts(
        events,
        &["usr1"],
        Some(&["syscall:any>1s", "syscall:getpid", "signal:SIGUSR1"]),
    );
    assert!(
        triggered.iter().any(|e| e["signal"] == 10),
        "lookback saw the signal: {triggered:?}"
    );
    assert_eq!(
        with, without,
        "perf's counts changed while lookback was attached"
    );
    assert!(without[0] > 10 && without[2] == 1, "{without:?}");

    // A perf-probe uprobe on the function lookback also probes.
    let bin = workload();
    let added = Command::new("perf")
        .args(["probe", "-q", "-x"])
        .arg(&bin)
        .args(["--add", "lb_work"])
        .status()
        .expect("perf probe");
    assert!(added.success(), "perf probe --add failed");
    let probe = "probe_workload:lb_work";
    let (without, _) = perf_counts(probe, &["calls", "5", "0", "0", "10", "1"], None);
    let (with, triggered) = perf_counts(
        probe,
        &["calls", "5", "0", "0", "10", "1"],
        Some(&["func:lb_work"]),
    );
    let _ = Command::new("perf")
        .args(["probe", "-q", "--del", probe])
        .status();
    assert_eq!(triggered.len(), 5, "lookback saw every call");
    assert_eq!((without.clone(), with), (vec![5], vec![5]), "{without:?}");
}

#[test]
fn rules_file_drives_the_triggers() {
    let mut file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("temp file");
    write!(
        file,
        "version: 1\n\
         rules:\n\
         \x20 - name: slow-work\n\
         \x20   target: {{ comm: workload }}\n\
         \x20   trigger: {{ function: {{ symbol: lb_work, min_duration: 5ms }} }}\n\
         \x20   snapshot: {{ cooldown: 0s, max_per_hour: 2 }}\n\
         \x20 - name: missing-files\n\
         \x20   target: {{ comm: workload }}\n\
         \x20   trigger: {{ syscall: {{ names: [openat], errno: [ENOENT] }} }}\n\
         \x20   snapshot: {{ cooldown: 1h }}\n"
    )
    .expect("write rules");
    let rules = file.path().to_str().expect("utf-8 path");
    let run = dry_run(&["--rules", rules], &["calls", "4", "1", "6000", "0", "1"]);
    let slow = run.of_rule(0);
    assert_eq!(slow.len(), 2, "max_per_hour 2 from the file: {slow:#?}");
    assert!(slow.iter().all(|e| e["rule"] == "slow-work"));
    assert_eq!(run.counter(0, "suppressed_rate_limit"), 2);
    assert_eq!(
        run.of_rule(1).len(),
        1,
        "cooldown 1h: only the loader's first ENOENT"
    );
    // A broken file is a usage error with its position.
    let mut bad = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("temp file");
    write!(
        bad,
        "version: 1\nrules:\n  - name: x\n    trigger: {{ signal: {{ signals: [SIGNOPE] }} }}\n"
    )
    .expect("write");
    let out = Command::new(lookback_bin())
        .args(["run", "--dry-run", "--rules"])
        .arg(bad.path())
        .arg("--")
        .arg(workload())
        .output()
        .expect("lookback");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(":4:") && err.contains("SIGNOPE"), "{err}");
}

#[test]
fn run_exits_as_its_command_and_keeps_its_name() {
    // The command's own status, or 128 + the signal that killed it, as a shell reports it.
    let status = |args: &[&str]| {
        Command::new(lookback_bin())
            .args(["run", "--dry-run", "--trigger", "signal:SIGUSR2", "--"])
            .args(args)
            .output()
            .expect("lookback")
            .status
            .code()
    };
    assert_eq!(status(&["sh", "-c", "exit 7"]), Some(7));
    assert_eq!(status(&["true"]), Some(0));
    let workload = workload();
    let workload = workload.to_str().expect("utf-8");
    assert_eq!(status(&[workload, "segv"]), Some(128 + 11));
    assert_eq!(status(&[workload, "abort"]), Some(128 + 6));
    // Executed as given: a symlink's name is the process's name (Debian's redis-server is
    // a symlink to redis-check-rdb), so comm-based rules and pidof keep working.
    let dir = tempfile::tempdir().expect("tempdir");
    let link = dir.path().join("myserver");
    std::os::unix::fs::symlink(workload, &link).expect("symlink");
    let run = lookback_tests::dry_run_of(
        &link,
        &["--trigger", "func:lb_work"],
        &["calls", "1", "1", "1", "1", "1"],
    );
    let events = run.of_rule(0);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["comm"], "myserver");
}

#[test]
fn a_dry_run_counts_every_trigger_without_a_limit() {
    let out = Command::new(lookback_bin())
        .args([
            "run",
            "--dry-run",
            "--json",
            "--trigger",
            "func:lb_work",
            "--",
        ])
        .arg(workload())
        .args(["calls", "5", "1", "1", "1", "1"])
        .output()
        .expect("lookback");
    let run = DryRun::parse(&out);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.of_rule(0).len(), 5, "every call, not the first only");
}
