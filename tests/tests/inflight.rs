//! In-flight latency detection (`--detect running`, `detect: running` in a rules file): a
//! `func:SYMBOL>DURATION` or `syscall:NAMES>DURATION` rule fires while the slow call still
//! runs, once it has run longer than the threshold, so calls that never return (a deadlock,
//! a read nobody answers) are caught, each slow call fires once, and a call that ended
//! (returned, or was left by longjmp, an exception or a panic) never fires afterwards, even
//! when a slow sibling then runs at its stack height from the same call instruction.
//!
//! On `tests/workloads/inflight.c`, `inflight_throw.cpp` and `inflight_panic.rs`. The programs
//! time each call themselves (`call=TID START DURATION`, `CLOCK_MONOTONIC` around the call,
//! the clock of the kernel's `timestamp_ns`): each trigger is matched with the call it
//! reports, so what is checked is which calls fired, not how fast anything ran. A call the
//! machine's load stretched just past the threshold may fire or not; one past it by more
//! than the 100 ms a running call may take to fire must. Every traced program exits as it
//! does without lookback and computes the same `result=`; those that never end are left as
//! they were (still deadlocked, still blocked in read) when lookback detaches. Needs root
//! (run by `cargo xtask test` with --test-threads=1: uprobes and BPF state are shared).
use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use lookback_tests::{
    DryRun,
    agent::{Agent, files, snapshot_metadata},
    can_run, chrome_events, dry_run_of, lookback_bin, succeeded,
    toolchains::{
        c_inflight, cxx_inflight_throw, go_program, measured, run_plain, rust_inflight_panic,
    },
};
use serde_json::Value;

/// The threshold of the rules on the programs that end (10 ms).
const THRESHOLD_NS: u64 = 10_000_000;
/// The latest a running call may fire after crossing its threshold: it is noticed within a
/// detection period (the sampling period on the CPU, a 10 ms scan off it), and this leaves
/// a busy machine ten of them. So a call that ran longer than its threshold by more than
/// this has fired; the programs' slow calls take 120 ms, for a 10 ms threshold.
const LATE_NS: u64 = 100_000_000;
/// The threshold of the rules on the programs that never end (50 ms).
const STUCK_THRESHOLD_NS: u64 = 50_000_000;

// ---- the calls the programs timed, and the triggers that report them ----

/// One call as the program timed it: its thread, the clock just before it and its length.
#[derive(Debug, Clone, Copy)]
struct Call {
    tid: u64,
    start: u64,
    ns: u64,
}

impl Call {
    fn end(&self) -> u64 {
        self.start + self.ns
    }
}

/// The `call=TID START_NS DURATION_NS` lines of a program's stdout.
fn calls(stdout: &str) -> Vec<Call> {
    let calls: Vec<Call> = stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("call=")?.split_whitespace();
            let mut next = || words.next()?.parse::<u64>().ok();
            Some(Call {
                tid: next()?,
                start: next()?,
                ns: next()?,
            })
        })
        .collect();
    assert!(!calls.is_empty(), "no call= lines:\n{stdout}");
    calls
}

fn field(t: &Value, key: &str) -> u64 {
    t[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in the trigger {t}"))
}

/// What a running trigger says of itself: `running: true`, a `duration_ns` past the
/// threshold by at most [`LATE_NS`], and `(still inside)` in its human `detail`.
fn assert_running(t: &Value, detail: &str, threshold_ns: u64) {
    assert_eq!(t["running"], true, "not a running trigger: {t}");
    assert_fired_inside(t, detail, threshold_ns);
}

/// What a running trigger `t` says of its call, in the `run --json` line or the agent's
/// metadata alike: a `duration_ns` past the threshold by at most [`LATE_NS`], and `(still
/// inside)` in its human `detail`.
fn assert_fired_inside(t: &Value, detail: &str, threshold_ns: u64) {
    let ran = field(t, "duration_ns");
    assert!(
        (threshold_ns..=threshold_ns + LATE_NS).contains(&ran),
        "a call that had run {ran} ns fired, for a threshold of {threshold_ns} ns (at most \
         {LATE_NS} ns late): {t}"
    );
    assert!(
        detail.contains("(still inside)"),
        "detail {detail:?} of {t}"
    );
}

/// The index in `calls` of the call trigger `t` reports: of its thread's calls, the one
/// whose start (the program's clock just before the call) is the latest at or before the
/// trigger's entry (`timestamp_ns − duration_ns`, the kernel's clock at the entry probe,
/// after that read). That picks the right level of a recursion too: the next level's start
/// is read inside the call, after its entry.
fn reported_call(t: &Value, calls: &[Call]) -> Option<usize> {
    let (tid, at) = (field(t, "tid"), field(t, "timestamp_ns"));
    let entry = at.checked_sub(field(t, "duration_ns"))?;
    calls
        .iter()
        .enumerate()
        .filter(|(_, c)| c.tid == tid && c.start <= entry)
        .max_by_key(|(_, c)| c.start)
        .map(|(i, _)| i)
}

/// Checks `triggers` (of one rule) against the calls the program timed: every trigger is
/// a running one (see [`assert_running`]) of a call that was still running at its
/// `timestamp_ns` and that the program measured above `threshold_ns`, and no call fired
/// twice. With `every_slow_call`, also every call longer than the threshold by more than
/// [`LATE_NS`] fired. Returns the number of triggers of each call that fired.
fn assert_one_trigger_per_slow_call(
    triggers: &[&Value],
    calls: &[Call],
    threshold_ns: u64,
    every_slow_call: bool,
) -> BTreeMap<usize, usize> {
    let mut fired = BTreeMap::new();
    for &t in triggers {
        assert_running(t, t["detail"].as_str().unwrap_or(""), threshold_ns);
        let i = reported_call(t, calls)
            .unwrap_or_else(|| panic!("a trigger before any call of its thread: {t}\n{calls:#?}"));
        let call = calls[i];
        assert!(
            field(t, "timestamp_ns") <= call.end(),
            "a trigger after its call returned ({call:?}): {t}\n{calls:#?}"
        );
        assert!(
            call.ns > threshold_ns,
            "a call the program measured at {} ns fired: {t}",
            call.ns
        );
        *fired.entry(i).or_insert(0) += 1;
    }
    let twice: Vec<_> = fired.iter().filter(|&(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "calls that fired more than once (call index, triggers): {twice:?}\n{calls:#?}"
    );
    if every_slow_call {
        let missed: Vec<&Call> = calls
            .iter()
            .enumerate()
            .filter(|(i, c)| c.ns > threshold_ns + LATE_NS && !fired.contains_key(i))
            .map(|(_, c)| c)
            .collect();
        assert!(
            missed.is_empty(),
            "slow calls that never fired: {missed:#?}\n{triggers:#?}"
        );
    }
    fired
}

/// `lookback run --dry-run --json FILE --max-snapshots 0 EXTRA... -- PROGRAM ARGS...`,
/// checked against a run of the program without lookback (see [`assert_unchanged`]).
fn traced(program: &Path, extra: &[&str], args: &[&str]) -> DryRun {
    let reference = run_plain(program, args);
    let run = dry_run_of(program, extra, args);
    assert_unchanged(&run, &reference);
    run
}

/// `lookback run --backend sampling --json DIR/events.json -o DIR/trace.json EXTRA... --
/// PROGRAM ARGS...`: a snapshot per trigger (Chrome JSON, `trace.json`, `trace-2.json`,
/// ...), checked against a run of the program without lookback (see [`assert_unchanged`]).
fn recorded(program: &Path, extra: &[&str], args: &[&str], dir: &Path) -> DryRun {
    let reference = run_plain(program, args);
    let json = dir.join("events.json");
    let output = Command::new(lookback_bin())
        .args(["run", "--backend", "sampling", "--json"])
        .arg(&json)
        .arg("-o")
        .arg(dir.join("trace.json"))
        .args(extra)
        .arg("--")
        .arg(program)
        .args(args)
        .output()
        .expect("lookback run");
    let text = std::fs::read_to_string(&json).expect("the --json file");
    let run = DryRun::parse_lines(&text, &output);
    assert_unchanged(&run, &reference);
    run
}

/// The program exited 0 under lookback, as without it (`reference`: its stdout then), and
/// printed the same `result=`. (`run` exits with its command's status; a dry run's summary
/// says the same, [`dry_run_of`] checks.)
fn assert_unchanged(run: &DryRun, reference: &str) {
    assert_eq!(
        run.status.code(),
        Some(0),
        "the program did not exit 0 under lookback: {}\n{}",
        run.summary["exit"],
        run.stderr
    );
    assert_eq!(
        measured(&run.program_stdout, "result"),
        measured(reference, "result"),
        "the program computed something else under lookback"
    );
}

/// `--detect running` and a `--trigger` for each of `specs`.
fn running_rules<'a>(specs: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--detect", "running"];
    for spec in specs {
        args.extend(["--trigger", spec]);
    }
    args
}

/// The probed `symbol` of `program ARGS` never fires: each of its calls ended (returned,
/// or was left by longjmp, an exception or a panic), then a slow sibling ran at its stack
/// height from the same call instruction, `rounds` times. A second rule on the sibling's
/// 120 ms sleeps (`nanosleep,clock_nanosleep>10ms`, running too) fires once per round: the
/// in-flight detection was on all along.
fn assert_no_trigger_once_the_call_ended(
    program: &Path,
    symbol: &str,
    args: &[&str],
    rounds: usize,
) {
    let rule = format!("func:{symbol}>10ms");
    let run = traced(
        program,
        &running_rules(&[&rule, "syscall:nanosleep,clock_nanosleep>10ms"]),
        args,
    );
    assert_eq!(
        measured(&run.program_stdout, "slow_calls"),
        rounds as u64,
        "the slow sibling ran every round"
    );
    assert!(
        run.of_rule(0).is_empty(),
        "{symbol} fired after its calls ended: {:#?}\n{}",
        run.of_rule(0),
        run.summary
    );
    let sleeps = run.of_rule(1);
    assert_eq!(sleeps.len(), rounds, "the sibling's sleeps: {sleeps:#?}");
    for t in sleeps {
        assert_running(t, t["detail"].as_str().unwrap_or(""), THRESHOLD_NS);
    }
}

// ---- the programs that never end: attached to, left as they were ----

/// A mode of inflight.c that waits for SIGUSR1 before its calls (`deadlock`, `pipe`), with
/// its stdout lines as they come; killed when dropped, so that a failed test leaves nothing
/// behind.
struct Waiting {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Waiting {
    /// Starts `inflight MODE` and waits for its `ready` line.
    fn start(mode: &str) -> Self {
        let mut child = Command::new(c_inflight())
            .arg(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the inflight workload");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().expect("lines").push(line);
            }
        });
        let target = Self { child, lines };
        target.line("ready");
        target
    }

    fn pid(&self) -> u64 {
        u64::from(self.child.id())
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// The values of the `KEY=VALUE` lines so far.
    fn values(&self, key: &str) -> Vec<String> {
        let prefix = format!("{key}=");
        self.lines()
            .iter()
            .filter_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
            .collect()
    }

    /// Waits (a minute at most) for a line that starts with `prefix`.
    fn line(&self, prefix: &str) -> String {
        let since = Instant::now();
        loop {
            if let Some(line) = self.lines().into_iter().find(|l| l.starts_with(prefix)) {
                return line;
            }
            assert!(
                since.elapsed() < Duration::from_mins(1),
                "no {prefix:?} line from the workload: {:?}",
                self.lines()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `deadlock`: the tids of its two threads (their `thread=K tid=TID` lines).
    fn workers(&self) -> Vec<u64> {
        let workers: Vec<u64> = self
            .values("thread")
            .iter()
            .filter_map(|v| v.split_once(" tid=")?.1.parse().ok())
            .collect();
        assert_eq!(workers.len(), 2, "{:?}", self.lines());
        workers
    }

    /// `pipe`, released: the tid that reads (`reading tid=TID`), the main thread's.
    fn reader(&self) -> u64 {
        let reader: u64 = self
            .line("reading tid=")
            .trim_start_matches("reading tid=")
            .parse()
            .expect("tid");
        assert_eq!(reader, self.pid(), "main reads");
        reader
    }

    /// `deadlock`, released, once lookback is gone: both `workers` still wait for each
    /// other's mutex, after 6 calls each, and make no progress.
    fn assert_still_deadlocked(&mut self, workers: &[u64]) {
        self.assert_blocked(workers, libc::SYS_futex);
        let progress = self.values("progress");
        for tid in workers {
            let last = progress
                .iter()
                .filter_map(|p| p.split_once(' '))
                .filter(|(t, _)| t.parse::<u64>().ok() == Some(*tid))
                .filter_map(|(_, calls)| calls.parse::<u64>().ok())
                .max();
            assert_eq!(last, Some(6), "thread {tid}: {progress:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(self.values("progress"), progress, "no progress since");
        self.assert_blocked(workers, libc::SYS_futex);
    }

    /// `pipe`, released, once lookback is gone: `reader` is still blocked in read, which
    /// never returned.
    fn assert_still_reading(&mut self, reader: u64) {
        self.assert_blocked(&[reader], libc::SYS_read);
        assert!(
            !self.lines().iter().any(|l| l.starts_with("read returned")),
            "{:?}",
            self.lines()
        );
    }

    fn release(&self) {
        let pid = i32::try_from(self.child.id()).expect("pid");
        // SAFETY: kill has no memory preconditions.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0, "SIGUSR1");
    }

    /// The program is alive and each thread of `tids` is asleep (state S) inside syscall
    /// `nr` (`/proc/PID/task/TID/syscall`).
    fn assert_blocked(&mut self, tids: &[u64], nr: i64) {
        assert!(
            self.child.try_wait().expect("try_wait").is_none(),
            "the program is gone"
        );
        for tid in tids {
            let task = format!("/proc/{}/task/{tid}", self.pid());
            let stat = std::fs::read_to_string(format!("{task}/stat")).expect("stat");
            let state = stat.rsplit_once(") ").map_or("", |(_, rest)| &rest[..1]);
            let syscall = std::fs::read_to_string(format!("{task}/syscall")).expect("syscall");
            let in_nr = syscall
                .split_whitespace()
                .next()
                .and_then(|w| w.parse().ok());
            assert_eq!(
                (state, in_nr),
                ("S", Some(nr)),
                "thread {tid}: stat {stat}, syscall {syscall}"
            );
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `lookback attach -p PID --backend sampling --max-snapshots 0 --duration 3s --json FILE
/// -o DIR/stuck.json --detect running --trigger SPEC`, the target released once lookback
/// waits for triggers: the snapshot lines and summary once lookback exited 0 (at the end of
/// `--duration`). Three seconds give a call that stays stuck ample time to fire again if it
/// would.
fn attach_to_stuck(target: &Waiting, spec: &str, dir: &Path) -> DryRun {
    let json = dir.join("events.json");
    let pid = target.pid().to_string();
    let mut lookback = Command::new(lookback_bin())
        .args(["attach", "-p", &pid, "--backend", "sampling"])
        .args(["--max-snapshots", "0", "--duration", "3s", "--json"])
        .arg(&json)
        .arg("-o")
        .arg(dir.join("stuck.json"))
        .args(running_rules(&[spec]))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lookback attach");
    let stderr = lookback.stderr.take().expect("stderr");
    let (send, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = send.send(line);
        }
    });
    let mut log = String::new();
    while !log.contains("waiting for triggers") {
        match lines.recv_timeout(Duration::from_mins(2)) {
            Ok(line) => log.push_str(&(line + "\n")),
            Err(e) => {
                let _ = lookback.kill();
                panic!("{e}: lookback never waited for triggers:\n{log}");
            }
        }
    }
    target.release();
    let status = wait_at_most(&mut lookback, Duration::from_mins(3));
    reader.join().expect("stderr reader");
    log.extend(lines.try_iter().map(|l| l + "\n"));
    assert!(status.success(), "lookback attach: {status}\n{log}");
    let text = std::fs::read_to_string(&json).expect("the --json file");
    let output = Output {
        status,
        stdout: Vec::new(),
        stderr: log.into_bytes(),
    };
    DryRun::parse_lines(&text, &output)
}

/// Waits for `child` to exit, killing it (and failing) after `limit`.
fn wait_at_most(child: &mut Child, limit: Duration) -> ExitStatus {
    let since = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if since.elapsed() > limit {
            let _ = child.kill();
            panic!("lookback still ran after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The triggers of the snapshot lines of `run`, each with the `detail` of its trace's
/// trigger instant, and each trace showing its thread inside `function`, in one of `inner`
/// (see [`assert_inside_in_trace`]).
fn snapshot_triggers(run: &DryRun, function: &str, inner: &[&str]) -> Vec<Value> {
    run.events
        .iter()
        .map(|snapshot| {
            let trace = PathBuf::from(snapshot["trace"].as_str().expect("the trace's path"));
            let mut trigger = snapshot["trigger"].clone();
            trigger["detail"] = assert_inside_in_trace(&trace, function, inner).into();
            trigger
        })
        .collect()
}

/// Checks the snapshots of a stuck run: one per thread of `tids`, each a running trigger
/// of `kind` past [`STUCK_THRESHOLD_NS`] whose trace says the thread was inside `function`,
/// blocked in one of `blocking`. Returns the triggers.
fn assert_one_snapshot_per_stuck_thread(
    run: &DryRun,
    tids: &[u64],
    kind: &str,
    function: &str,
    blocking: &[&str],
) -> Vec<Value> {
    let triggers = snapshot_triggers(run, function, blocking);
    let mut fired: Vec<u64> = triggers.iter().map(|t| field(t, "tid")).collect();
    fired.sort_unstable();
    let mut want = tids.to_vec();
    want.sort_unstable();
    assert_eq!(
        fired, want,
        "one trigger per stuck thread, once: {triggers:#?}\n{}",
        run.stderr
    );
    for trigger in &triggers {
        assert_eq!(trigger["kind"], kind, "{trigger}");
        assert_running(
            trigger,
            trigger["detail"].as_str().unwrap_or(""),
            STUCK_THRESHOLD_NS,
        );
    }
    triggers
}

/// Where the Chrome JSON `trace` says its triggering thread was: the trigger instant's
/// `stack` (outermost first), or an entry of `lookback report --json`'s breakdown, holds
/// `function` and, inside it, a frame whose name contains one of `inner` (where it blocked,
/// or spun). Returns the instant's `detail`.
fn assert_inside_in_trace(trace: &Path, function: &str, inner: &[&str]) -> String {
    let doc: Value = serde_json::from_slice(&std::fs::read(trace).expect("the trace"))
        .expect("a Chrome JSON trace");
    let instant = chrome_events(&doc)
        .iter()
        .find(|e| {
            e["ph"] == "i"
                && e["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("trigger: "))
        })
        .unwrap_or_else(|| panic!("no trigger instant in {}", trace.display()))
        .clone();
    let report: Value = serde_json::from_slice(
        &succeeded(
            Command::new(lookback_bin())
                .arg("report")
                .arg(trace)
                .arg("--json"),
        )
        .stdout,
    )
    .expect("report --json is JSON");
    let stack: Vec<String> = instant["args"]["stack"]
        .as_str()
        .map(|s| s.split(" → ").map(str::to_owned).collect())
        .unwrap_or_default();
    let breakdown = report["breakdown"].as_array().cloned().unwrap_or_default();
    let mut chains = vec![stack];
    chains.extend(breakdown.iter().map(|entry| {
        entry["frames"]
            .as_array()
            .map(|f| {
                f.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }));
    let inside = |chain: &Vec<String>| {
        chain.iter().position(|f| f == function).is_some_and(|at| {
            chain[at + 1..]
                .iter()
                .any(|f| inner.iter().any(|b| f.contains(b)))
        })
    };
    assert!(
        chains.iter().any(inside),
        "{}: neither the trigger's stack nor the report shows {function} in one of \
         {inner:?}:\n{instant:#}\n{report:#}",
        trace.display()
    );
    instant["args"]["detail"].as_str().unwrap_or("").to_owned()
}

// ---- the tests ----

#[test]
fn a_deadlock_fires_once_per_stuck_thread_and_is_left_as_it_was() {
    if !can_run("a_deadlock_fires_once_per_stuck_thread_and_is_left_as_it_was") {
        return;
    }
    let mut target = Waiting::start("deadlock");
    let workers = target.workers();
    let dir = tempfile::tempdir().expect("tempdir");
    let run = attach_to_stuck(&target, "func:lb_transfer>50ms", dir.path());
    assert_one_snapshot_per_stuck_thread(
        &run,
        &workers,
        "function",
        "lb_transfer",
        &["mutex_lock", "lll_lock"],
    );
    // Detached: both threads still wait for each other's mutex, after 6 calls each.
    target.assert_still_deadlocked(&workers);
}

#[test]
fn a_read_nobody_answers_fires_once_and_stays_blocked() {
    if !can_run("a_read_nobody_answers_fires_once_and_stays_blocked") {
        return;
    }
    let mut target = Waiting::start("pipe");
    let dir = tempfile::tempdir().expect("tempdir");
    let run = attach_to_stuck(&target, "syscall:read>50ms", dir.path());
    let reader = target.reader();
    let triggers =
        assert_one_snapshot_per_stuck_thread(&run, &[reader], "syscall", "lb_wait_pipe", &["read"]);
    assert_eq!(triggers[0]["syscall"], libc::SYS_read, "{}", triggers[0]);
    target.assert_still_reading(reader);
}

#[test]
fn each_slow_sleeping_call_fires_once_while_it_runs() {
    if !can_run("each_slow_sleeping_call_fires_once_while_it_runs") {
        return;
    }
    let program = c_inflight();
    let run = traced(
        &program,
        &running_rules(&["func:lb_maybe_slow>10ms"]),
        &["mixed", "30"],
    );
    let calls = calls(&run.program_stdout);
    assert_eq!(calls.len(), 30);
    let fired = assert_one_trigger_per_slow_call(&run.of_rule(0), &calls, THRESHOLD_NS, true);
    // The ten 120 ms sleeps at least; the 20 ms ones and any call the load stretched past
    // 10 ms at most.
    let over = |ns| calls.iter().filter(|c| c.ns > ns).count();
    assert!(
        (10.max(over(THRESHOLD_NS + LATE_NS))..=over(THRESHOLD_NS)).contains(&fired.len()),
        "{} calls fired:\n{}",
        fired.len(),
        run.program_stdout
    );
    assert_eq!(run.counter(0, "met"), fired.len() as u64, "{}", run.summary);
}

/// A dry run of `inflight spin4 THREADS 12` under `func:lb_spin>10ms`, running: each
/// thread's three spins of 120 ms on the CPU fire, once each.
fn assert_every_spin_fires(threads: usize) {
    let program = c_inflight();
    let run = traced(
        &program,
        &running_rules(&["func:lb_spin>10ms"]),
        &["spin4", &threads.to_string(), "12"],
    );
    let calls = calls(&run.program_stdout);
    assert_eq!(calls.len(), 12 * threads);
    let fired = assert_one_trigger_per_slow_call(&run.of_rule(0), &calls, THRESHOLD_NS, true);
    assert!(fired.len() >= 3 * threads, "the spins of 120 ms: {fired:?}");
    let fired_on: BTreeSet<u64> = fired.keys().map(|&i| calls[i].tid).collect();
    assert_eq!(
        fired_on.len(),
        threads,
        "every thread's spins fired: {fired_on:?}"
    );
}

/// A spinning thread that keeps its CPU is seen too, without a recorder (a dry run has no
/// sampling to take its look): not only when it happens to be preempted.
#[test]
fn a_call_spinning_alone_on_a_cpu_fires_in_a_dry_run() {
    if !can_run("a_call_spinning_alone_on_a_cpu_fires_in_a_dry_run") {
        return;
    }
    assert_every_spin_fires(1);
}

#[test]
fn each_slow_spinning_call_fires_once_on_four_threads() {
    if !can_run("each_slow_spinning_call_fires_once_on_four_threads") {
        return;
    }
    assert_every_spin_fires(4);
}

#[test]
fn a_spinning_call_fires_on_the_cpu_and_its_snapshot_shows_the_spin() {
    if !can_run("a_spinning_call_fires_on_the_cpu_and_its_snapshot_shows_the_spin") {
        return;
    }
    let program = c_inflight();
    let dir = tempfile::tempdir().expect("tempdir");
    // One thread: calls 3 and 7 spin 120 ms; the first snapshot ends the tracing.
    let mut extra = vec!["--max-snapshots", "1"];
    extra.extend(running_rules(&["func:lb_spin>10ms"]));
    let run = recorded(&program, &extra, &["spin4", "1", "8"], dir.path());
    let triggers = snapshot_triggers(&run, "lb_spin", &["spin_ms"]);
    assert_eq!(triggers.len(), 1, "{triggers:#?}\n{}", run.stderr);
    let calls = calls(&run.program_stdout);
    let fired = assert_one_trigger_per_slow_call(
        &triggers.iter().collect::<Vec<_>>(),
        &calls,
        THRESHOLD_NS,
        false,
    );
    assert_eq!(fired.len(), 1);
}

#[test]
fn a_recursion_fires_only_for_levels_still_running_past_the_threshold() {
    if !can_run("a_recursion_fires_only_for_levels_still_running_past_the_threshold") {
        return;
    }
    let program = c_inflight();
    // 3 slow rounds of lb_rec(3) (each of the 4 levels 120 ms), 20 fast rounds, then the
    // unprobed twin sleeps 120 ms with its frames where lb_rec's were.
    let run = traced(
        &program,
        &running_rules(&["func:lb_rec>10ms"]),
        &["recurse", "3", "3"],
    );
    let calls = calls(&run.program_stdout);
    assert_eq!(calls.len(), 23 * 4);
    // Every level of a slow round is a slow call; the levels all cross the threshold
    // together, and one trigger per round at least is asked.
    let fired = assert_one_trigger_per_slow_call(&run.of_rule(0), &calls, THRESHOLD_NS, false);
    let outermost: Vec<&Call> = calls
        .iter()
        .filter(|c| {
            !calls
                .iter()
                .any(|o| o.start < c.start && c.end() < o.end() && o.tid == c.tid)
        })
        .collect();
    assert_eq!(outermost.len(), 23);
    for round in outermost.iter().filter(|c| c.ns > THRESHOLD_NS + LATE_NS) {
        let inside = fired
            .keys()
            .filter(|&&i| round.start <= calls[i].start && calls[i].end() <= round.end())
            .count();
        assert!(
            inside >= 1,
            "no trigger in the slow round {round:?}: {fired:?}"
        );
    }
    assert!(
        outermost
            .iter()
            .filter(|c| c.ns > THRESHOLD_NS + LATE_NS)
            .count()
            >= 3,
        "{}",
        run.program_stdout
    );
    let last_slow_end = measured(&run.program_stdout, "last_slow_end");
    for t in run.of_rule(0) {
        assert!(
            field(t, "timestamp_ns") <= last_slow_end,
            "a trigger after the last slow round: {t}"
        );
    }
}

#[test]
fn a_sibling_called_from_the_same_call_site_does_not_fire() {
    if !can_run("a_sibling_called_from_the_same_call_site_does_not_fire") {
        return;
    }
    assert_no_trigger_once_the_call_ended(&c_inflight(), "lb_fast", &["sibling", "10"], 10);
}

#[test]
fn a_call_left_by_longjmp_does_not_fire() {
    if !can_run("a_call_left_by_longjmp_does_not_fire") {
        return;
    }
    assert_no_trigger_once_the_call_ended(&c_inflight(), "lb_jump_through", &["longjmp", "10"], 10);
}

#[test]
fn a_call_left_by_a_cxx_exception_does_not_fire() {
    if !can_run("a_call_left_by_a_cxx_exception_does_not_fire") {
        return;
    }
    let program = cxx_inflight_throw();
    assert_no_trigger_once_the_call_ended(&program, "lb_throws", &["10"], 10);
}

#[test]
fn a_call_left_by_a_rust_panic_does_not_fire() {
    if !can_run("a_call_left_by_a_rust_panic_does_not_fire") {
        return;
    }
    let program = rust_inflight_panic();
    assert_no_trigger_once_the_call_ended(&program, "lb_panics", &["10"], 10);
}

// ---- Go: calls keyed by goroutine, the stack copied while they run ----

/// The threshold of the Go rules (30 ms; the held calls take 150 ms).
const GO_THRESHOLD_NS: u64 = 30_000_000;

/// The index in `calls` (the Go program's `call=GOROUTINE START DURATION` lines) of the
/// call trigger `t` reports: the latest call that started at or before the trigger's entry
/// and had not ended at its `timestamp_ns`. Matched by time: the trigger's thread is the
/// one its goroutine ran on at the look (or the process, when no thread ran it).
fn go_call_of(t: &Value, calls: &[Call]) -> Option<usize> {
    let at = field(t, "timestamp_ns");
    let entry = at.checked_sub(field(t, "duration_ns"))?;
    calls
        .iter()
        .enumerate()
        .filter(|(_, c)| c.start <= entry && at <= c.end())
        .max_by_key(|(_, c)| c.start)
        .map(|(i, _)| i)
}

/// `slow 30 30000 HOW 150` (tests/workloads/go) under `func:main.slow>30ms`, running: each
/// goroutine's one held call of 150 ms recurses 400 levels first (the runtime copies its
/// stack after the entry probe saw it), then holds as `how` says; each held call fires
/// once, while it runs, and nothing else does.
fn assert_every_held_go_call_fires(how: &str) {
    let program = go_program();
    let run = traced(
        &program,
        &running_rules(&["func:main.slow>30ms"]),
        &["30", "30000", how, "150"],
    );
    assert_eq!(
        measured(&run.program_stdout, "held_moved"),
        4,
        "every held call's stack moved after its entry:\n{}",
        run.program_stdout
    );
    let calls = calls(&run.program_stdout);
    assert_eq!(calls.len(), 4 * 30);
    let triggers = run.of_rule(0);
    let mut fired = BTreeSet::new();
    for &t in &triggers {
        assert_running(t, t["detail"].as_str().unwrap_or(""), GO_THRESHOLD_NS);
        let i = go_call_of(t, &calls)
            .unwrap_or_else(|| panic!("a trigger outside every call: {t}\n{calls:#?}"));
        assert!(
            calls[i].ns > GO_THRESHOLD_NS,
            "a call the program measured at {} ns fired: {t}",
            calls[i].ns
        );
        assert!(fired.insert(i), "call {i} fired twice: {triggers:#?}");
    }
    let held: BTreeSet<usize> = (0..calls.len())
        .filter(|&i| calls[i].ns > GO_THRESHOLD_NS + LATE_NS)
        .collect();
    assert_eq!(
        held.len(),
        4,
        "the four held calls:\n{}",
        run.program_stdout
    );
    assert!(
        held.is_subset(&fired),
        "held calls that never fired: {:?} (fired: {fired:?})\n{triggers:#?}\n{}",
        held.difference(&fired).collect::<Vec<_>>(),
        run.stderr
    );
}

#[test]
fn a_go_call_spinning_on_the_cpu_fires_while_its_goroutine_moves() {
    if !can_run("a_go_call_spinning_on_the_cpu_fires_while_its_goroutine_moves") {
        return;
    }
    assert_every_held_go_call_fires("busy");
}

#[test]
fn a_go_call_in_a_syscall_fires_on_its_thread() {
    if !can_run("a_go_call_in_a_syscall_fires_on_its_thread") {
        return;
    }
    assert_every_held_go_call_fires("nanosleep");
}

#[test]
fn a_parked_goroutine_s_call_fires_from_its_saved_state() {
    if !can_run("a_parked_goroutine_s_call_fires_from_its_saved_state") {
        return;
    }
    assert_every_held_go_call_fires("park");
}

/// Go's sibling case: `main.slow` returns at once, then `main.sibling` runs through the
/// same call instruction at the same height (relative to the goroutine stack's top, which
/// moves as sibling recurses) and holds 150 ms: no trigger for slow, each of the four
/// candidates refused by its look; a control rule on the sibling's nanosleep fires once
/// per goroutine.
#[test]
fn a_go_sibling_called_from_the_same_call_instruction_does_not_fire() {
    if !can_run("a_go_sibling_called_from_the_same_call_instruction_does_not_fire") {
        return;
    }
    let program = go_program();
    let run = traced(
        &program,
        &running_rules(&["func:main.slow>30ms", "syscall:nanosleep>30ms"]),
        &["30", "30000", "sibling", "150"],
    );
    assert!(
        run.of_rule(0).is_empty(),
        "main.slow had returned: {:#?}",
        run.of_rule(0)
    );
    assert_eq!(run.counter(0, "met"), 0, "{}", run.summary);
    let control = run.of_rule(1);
    assert_eq!(
        control.len(),
        4,
        "the siblings' sleeps: {control:#?}\n{}",
        run.stderr
    );
    // Each goroutine's slow call was looked at and shown ended (its frame is sibling's).
    assert!(
        run.stderr.contains("4 shown ended by a look"),
        "the four candidates refused:\n{}",
        run.stderr
    );
}

#[test]
fn a_rules_file_asks_for_running_detection_per_function_and_syscall() {
    if !can_run("a_rules_file_asks_for_running_detection_per_function_and_syscall") {
        return;
    }
    let mut file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("temp file");
    std::io::Write::write_all(
        &mut file,
        b"version: 1\n\
          rules:\n\
          \x20 - name: slow-calls\n\
          \x20   target: { comm: inflight }\n\
          \x20   trigger: { function: { symbol: lb_maybe_slow, min_duration: 10ms, detect: running } }\n\
          \x20   snapshot: { cooldown: 0s, max_per_hour: 100000 }\n\
          \x20 - name: slow-sleeps\n\
          \x20   target: { comm: inflight }\n\
          \x20   trigger: { syscall: { names: [nanosleep, clock_nanosleep], min_duration: 15ms, detect: running } }\n\
          \x20   snapshot: { cooldown: 0s, max_per_hour: 100000 }\n",
    )
    .expect("write rules");
    let rules = file.path().to_str().expect("UTF-8 path");
    let program = c_inflight();
    let run = traced(&program, &["--rules", rules], &["mixed", "12"]);
    let calls = calls(&run.program_stdout);
    assert!(run.of_rule(0).iter().all(|t| t["rule"] == "slow-calls"));
    let fired = assert_one_trigger_per_slow_call(&run.of_rule(0), &calls, THRESHOLD_NS, true);
    assert!(fired.len() >= 4, "the four 120 ms sleeps: {fired:?}");
    // A sleep fires inside its call; the four 120 ms sleeps (105 ms past 15 ms) must.
    let sleeps = assert_one_trigger_per_slow_call(&run.of_rule(1), &calls, 15_000_000, false);
    assert!(sleeps.len() >= 4, "the four 120 ms sleeps: {sleeps:?}");
    assert!(
        run.of_rule(1)
            .iter()
            .all(|t| t["kind"] == "syscall" && t["rule"] == "slow-sleeps")
    );
}

/// Checks the snapshots the agent wrote in `dir` for `rule` (their metadata `.json`): one
/// per thread of `tids`, each a running trigger of `kind` past [`STUCK_THRESHOLD_NS`] (of
/// `syscall`, for a syscall rule), whose interval is the call's, whose verdict is about
/// `called` (the probed function, or the syscall) and whose stack at the look holds
/// `on_stack`; its trace is there.
fn assert_agent_snapshots(
    dir: &Path,
    rule: &str,
    (kind, syscall): (&str, Option<&str>),
    tids: &[u64],
    on_stack: &str,
) {
    let metas = snapshot_metadata(dir);
    let mut fired: Vec<u64> = metas.iter().map(|m| field(m, "tid")).collect();
    fired.sort_unstable();
    let mut want = tids.to_vec();
    want.sort_unstable();
    assert_eq!(
        fired, want,
        "{rule}: one snapshot per stuck thread: {metas:#?}"
    );
    let called = syscall.unwrap_or(on_stack);
    for meta in &metas {
        let trigger = &meta["trigger"];
        assert_eq!(meta["rule"], rule, "{meta}");
        assert_eq!(trigger["kind"], kind, "{meta}");
        assert_fired_inside(
            trigger,
            trigger["detail"].as_str().unwrap_or(""),
            STUCK_THRESHOLD_NS,
        );
        if let Some(name) = syscall {
            assert_eq!(trigger["syscall"], name, "{meta}");
        }
        assert_eq!(meta["interval_ns"], trigger["duration_ns"], "{meta}");
        assert!(
            meta["verdict"]
                .as_str()
                .is_some_and(|v| v.starts_with(&format!("{called} "))),
            "{meta:#}"
        );
        let stack = meta["trigger_stack"].as_array().expect("trigger_stack");
        assert!(
            stack.iter().any(|f| f["function"] == on_stack),
            "{rule}: {on_stack} not on the stack at the trigger: {meta:#}"
        );
        let trace = dir.join(meta["trace_file"].as_str().expect("trace_file"));
        assert!(trace.is_file(), "{}: {:?}", trace.display(), files(dir));
    }
}

/// The agent (`lookback agent`, the mode a `DaemonSet` runs) serves `detect: running` rules
/// from its rules file: started before the programs, it catches both threads of the
/// deadlock (a function rule) and the read nobody answers (a syscall rule), one snapshot
/// each, and leaves the programs stuck as they were when it stops. `cooldown: 0s`: the
/// default 10 s per rule and process would suppress the deadlock's second thread, which
/// crosses the threshold in the same scan as the first. (`Agent` queues 64 snapshots, so
/// none is dropped as busy.)
#[test]
#[expect(
    clippy::float_cmp,
    reason = "metric values are integer counts, exactly representable"
)]
fn the_agent_snapshots_a_deadlock_and_a_hung_read_from_its_rules_file() {
    if !can_run("the_agent_snapshots_a_deadlock_and_a_hung_read_from_its_rules_file") {
        return;
    }
    let bin = c_inflight();
    let bin = bin.display();
    let rules = format!(
        "version: 1\n\
         defaults:\n\
         \x20 capture: {{ backend: sampling }}\n\
         \x20 snapshot: {{ cooldown: 0s }}\n\
         \x20 output: {{ keep_raw: false }}\n\
         rules:\n\
         \x20 - name: stuck-transfer\n\
         \x20   target: {{ exe: {bin} }}\n\
         \x20   trigger: {{ function: {{ symbol: lb_transfer, min_duration: 50ms, detect: running }} }}\n\
         \x20 - name: hung-read\n\
         \x20   target: {{ exe: {bin} }}\n\
         \x20   trigger: {{ syscall: {{ names: [read], min_duration: 50ms, detect: running }} }}\n"
    );
    // Loading the in-flight programs for all 64 rule slots takes the verifier seconds: more
    // than `Agent::start`'s 30 s on a busy machine, and a refusal says why on /readyz.
    let mut agent = Agent::launch(&rules, &[], &[]);
    agent.wait_readyz(200, Duration::from_mins(1));
    let mut deadlock = Waiting::start("deadlock");
    let mut pipe = Waiting::start("pipe");
    for target in [&deadlock, &pipe] {
        let traced = agent.wait_log(
            &format!("tracing process {} ", target.pid()),
            Duration::from_secs(10),
        );
        assert!(
            traced.contains("stuck-transfer") && traced.contains("hung-read"),
            "{traced}"
        );
    }
    let workers = deadlock.workers();
    deadlock.release();
    pipe.release();
    let reader = pipe.reader();
    // One trigger per stuck call, each sent (none suppressed) and snapshotted; the in-flight
    // watcher counts the three it fired (two calls, one syscall).
    for (rule, n) in [("stuck-transfer", 2.0), ("hung-read", 1.0)] {
        agent.expect_metric("lookback_triggers_total", &[("rule", rule)], n);
        agent.expect_metric(
            "lookback_snapshots_total",
            &[("rule", rule), ("backend", "sampling"), ("result", "ok")],
            n,
        );
        for reason in ["cooldown", "rate_limit", "busy"] {
            let suppressed = agent.metric(
                "lookback_triggers_suppressed_total",
                &[("rule", rule), ("reason", reason)],
            );
            assert_eq!(suppressed, 0.0, "{rule}: {reason}\n{}", agent.log());
        }
    }
    agent.expect_metric(
        "lookback_inflight_checks_total",
        &[("outcome", "fired")],
        3.0,
    );
    let ended = agent.metric("lookback_inflight_checks_total", &[("outcome", "ended")]);
    assert_eq!(ended, 0.0, "{}", agent.get("/metrics").1);
    assert_agent_snapshots(
        &agent.out().join("stuck-transfer"),
        "stuck-transfer",
        ("function", None),
        &workers,
        "lb_transfer",
    );
    assert_agent_snapshots(
        &agent.out().join("hung-read"),
        "hung-read",
        ("syscall", Some("read")),
        &[reader],
        "lb_wait_pipe",
    );
    // Still stuck: no call fires twice while the agent keeps watching.
    std::thread::sleep(Duration::from_secs(1));
    for (rule, n) in [("stuck-transfer", 2.0), ("hung-read", 1.0)] {
        let triggers = agent.metric("lookback_triggers_total", &[("rule", rule)]);
        assert_eq!(triggers, n, "{rule}\n{}", agent.log());
    }
    agent.stop_ok();
    deadlock.assert_still_deadlocked(&workers);
    pipe.assert_still_reading(reader);
}
