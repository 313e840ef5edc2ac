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
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use lookback::snapshot::{self, Snapshot};
use lookback_tests::{lookback_bin, lookback_programs, ring_samples, workload};

/// A running `lookback agent` with its log and metrics address.
struct Agent {
    child: Child,
    log: Arc<Mutex<String>>,
    addr: String,
    dir: tempfile::TempDir,
}

impl Agent {
    /// Starts an agent on `rules` (YAML; `@WORKLOAD@` is replaced by the workload's path)
    /// with `--output-dir DIR/out` unless `extra` gives one, and waits until it is ready.
    fn start(rules: &str, extra: &[&str]) -> Self {
        Self::start_with_env(rules, extra, &[])
    }

    /// [`start`](Self::start) with extra environment variables.
    fn start_with_env(rules: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut agent = Self::launch(rules, extra, env);
        let deadline = Instant::now() + Duration::from_secs(30);
        while agent.get("/readyz").0 != 200 {
            assert!(
                Instant::now() < deadline,
                "agent never ready:\n{}",
                agent.log()
            );
            agent.assert_running();
            std::thread::sleep(Duration::from_millis(100));
        }
        agent
    }

    /// Starts the agent and waits for its metrics address, not for readiness.
    fn launch(rules: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("rules.yaml");
        write_rules(&config, rules);
        let out = dir.path().join("out");
        let mut cmd = Command::new(lookback_bin());
        cmd.args(["agent", "--config"]).arg(&config).args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--max-queued",
            "64",
        ]);
        if !extra.contains(&"--output-dir") {
            cmd.arg("--output-dir").arg(&out);
        }
        let mut child = cmd
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting lookback agent");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().expect("log");
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut agent = Self {
            child,
            log,
            addr: String::new(),
            dir,
        };
        agent.addr = agent.wait_log("metrics on http://", Duration::from_secs(30));
        agent.addr = agent
            .addr
            .split("metrics on http://")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .expect("metrics address in the log")
            .to_owned();
        agent
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("rules.yaml")
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    fn log(&self) -> String {
        self.log.lock().expect("log").clone()
    }

    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("agent exited ({status}):\n{}", self.log());
        }
    }

    /// Waits for a log line containing `needle`; returns that line.
    fn wait_log(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.log().lines().find(|l| l.contains(needle)) {
                return line.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?}:\n{}",
                self.log()
            );
            self.assert_running();
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET path` → (status, body).
    fn get(&self, path: &str) -> (u16, String) {
        let Ok(mut s) = TcpStream::connect(&self.addr) else {
            return (0, String::new());
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map_or("", |b| b.1).to_owned();
        (status, body)
    }

    /// Every sample of `/metrics`, keyed `name{labels}` as exposed.
    fn metrics(&self) -> BTreeMap<String, f64> {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "{body}");
        body.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (key, value) = l.rsplit_once(' ')?;
                Some((key.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// The value of `name` with exactly `labels` (as `k="v"` pairs, any order); 0 when absent.
    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.metric_opt(name, labels).unwrap_or(0.0)
    }

    /// The value of `name` with exactly `labels`; `None` when the series is not exposed.
    fn metric_opt(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        self.metrics()
            .iter()
            .find(|(key, _)| {
                let Some(rest) = key.strip_prefix(name) else {
                    return false;
                };
                let inner = rest.trim_start_matches('{').trim_end_matches('}');
                let mut have: Vec<&str> = if inner.is_empty() {
                    Vec::new()
                } else {
                    inner.split(',').collect()
                };
                have.sort_unstable();
                let mut want: Vec<&str> = want.iter().map(String::as_str).collect();
                want.sort_unstable();
                (rest.is_empty() || rest.starts_with('{')) && have == want
            })
            .map(|(_, v)| *v)
    }

    /// Waits until `name{labels}` equals `value` (metrics are refreshed from the kernel
    /// every 250 ms), then checks it stays there for a moment.
    fn expect_metric(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.metric(name, labels);
            if got == value {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}{labels:?} = {got}, expected {value}\n--- metrics\n{}\n--- log\n{}",
                self.get("/metrics").1,
                self.log()
            );
            self.assert_running();
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(600));
        let later = self.metric(name, labels);
        assert_eq!(
            later,
            value,
            "{name}{labels:?} moved on from {value} to {later}\n{}",
            self.log()
        );
    }

    /// SIGTERM, and the agent must exit 0.
    fn stop_ok(&mut self) {
        let (status, log) = self.stop();
        assert!(status.success(), "{status}\n{log}");
    }

    /// SIGTERM; returns the exit status.
    fn stop(&mut self) -> (std::process::ExitStatus, String) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(i32::try_from(self.child.id()).expect("pid"), libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "agent ignores SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        std::thread::sleep(Duration::from_millis(100));
        (status, self.log())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_rules(path: &Path, rules: &str) {
    let exe = workload().canonicalize().expect("workload path");
    let text = rules.replace("@WORKLOAD@", &exe.display().to_string());
    // Write and rename, as a ConfigMap update does, so the agent never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("writing rules");
    std::fs::rename(&tmp, path).expect("renaming rules");
}

impl Agent {
    /// Runs the workload to completion, started after the agent: it waits (`--wait`) until
    /// the agent reports tracing it, so that its recorder runs before the workload does its
    /// work (a process that lives less than the few milliseconds opening a recorder takes
    /// is counted, but cannot be recorded).
    fn run_workload(&mut self, args: &[&str]) {
        let mut child = Command::new(workload())
            .arg("--wait")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("workload");
        self.wait_log(
            &format!("tracing process {} ", child.id()),
            Duration::from_secs(10),
        );
        let _ = child.stdin.take().expect("stdin").write_all(b"go\n");
        let status = child.wait().expect("wait");
        assert!(status.success(), "workload {args:?}: {status}");
    }
}

/// The files of directory `dir`, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

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
    snapshot: { cooldown: 1h }
    output: { keep_raw: false }
  - name: usr1
    target: { comm: workload }
    trigger:
      signal: { signals: [SIGUSR1] }
";

#[test]
fn several_rules_and_workloads_give_exact_counts() {
    // One workload runs before the agent starts: the /proc scan must find it.
    let mut early = Command::new(workload())
        .args(["--wait", "calls", "6", "2", "25000", "100", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("workload");
    let mut agent = Agent::start(RULES, &[]);
    agent.wait_log(
        &format!("tracing process {} ", early.id()),
        Duration::from_secs(10),
    );
    let _ = early.stdin.take().expect("stdin").write_all(b"go\n");
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
    snapshot: { cooldown: 1h }
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

/// The `.lbsnap` files of `dir`, oldest first (the names start with the UTC time).
fn read_snapshots(dir: &Path) -> Vec<Snapshot> {
    files(dir)
        .iter()
        .filter(|n| n.ends_with(".lbsnap"))
        .map(|n| snapshot::read(&dir.join(n)).expect("a readable snapshot"))
        .collect()
}

/// Sample times of process `pid` in `snap`.
fn sample_times(snap: &Snapshot, pid: u32) -> Vec<u64> {
    ring_samples(&snap.rings, snap.meta.recorder.sample_type)
        .iter()
        .filter(|s| s.pid == Some(pid))
        .filter_map(|s| s.time)
        .collect()
}

/// A sampling rule without `post_trigger` freezes in the kernel, as `run` does: the
/// trigger's BPF program stops the process's samples (`FROZEN`, `sample_filter` on the
/// agent's recorder) and the snapshot records that moment. Each snapshot found its
/// process's mark (the debug log says so) and holds no sample of the process after it; the
/// agent removed the mark after the copy, so the second snapshot has samples between the
/// first freeze and the second trigger.
#[test]
fn a_sampling_rule_freezes_in_the_kernel_and_sampling_resumes() {
    let rules = r"
version: 1
defaults:
  capture: { backend: sampling, buffer_size: 1MiB }
  snapshot: { cooldown: 0s, max_per_hour: 1000 }
rules:
  - name: spin
    target: { comm: workload }
    trigger: { function: { symbol: lb_spin, binary: @WORKLOAD@, min_duration: 20ms } }
";
    let mut agent = Agent::start_with_env(
        rules,
        &[],
        &[("RUST_LOG", "info,lookback::daemon::targets=debug")],
    );
    // lb_spin(300 ms) twice on the main thread, a second thread busy meanwhile.
    agent.run_workload(&["spinbg", "300", "2", "900"]);
    agent.expect_metric(
        "lookback_snapshots_total",
        &[("rule", "spin"), ("backend", "sampling"), ("result", "ok")],
        2.0,
    );
    let snaps = read_snapshots(&agent.out().join("spin"));
    assert_eq!(snaps.len(), 2, "{:?}", files(&agent.out().join("spin")));
    let log = agent.log();
    assert_eq!(
        log.matches("frozen in the kernel at Some(").count(),
        2,
        "each snapshot found its kernel mark:\n{log}"
    );
    let mut freezes = Vec::new();
    for snap in &snaps {
        let trigger = snap.meta.trigger.clone().expect("trigger");
        let frozen = trigger.trigger_time_ns + snap.meta.trigger_to_freeze_ns.expect("latency");
        let times = sample_times(snap, trigger.pid);
        let last = times.iter().copied().max().expect("samples");
        assert!(
            last <= frozen,
            "a sample {} ns after the kernel's freeze",
            last - frozen
        );
        freezes.push((frozen, trigger.trigger_time_ns, times));
    }
    let (first_freeze, (_, second_trigger, second_times)) = (freezes[0].0, &freezes[1]);
    let resumed = second_times
        .iter()
        .filter(|&&t| t > first_freeze && t < *second_trigger)
        .count();
    assert!(
        resumed >= 20,
        "{resumed} samples between the first freeze and the second trigger"
    );
    agent.stop_ok();
}

/// A trigger that froze its process in the kernel and is then dropped (busy: a snapshot of
/// the same process waits out its `post_trigger`) unfreezes it: the waiting snapshot holds
/// the process's samples after the dropped triggers.
#[test]
fn a_trigger_dropped_as_busy_unfreezes_its_process() {
    let rules = r"
version: 1
defaults:
  capture: { backend: sampling, buffer_size: 1MiB }
  snapshot: { cooldown: 0s, max_per_hour: 1000 }
rules:
  - name: waits
    target: { comm: workload }
    trigger: { function: { symbol: lb_spin, binary: @WORKLOAD@ } }
    snapshot: { post_trigger: 400ms }
  - name: freezes
    target: { comm: workload }
    trigger: { function: { symbol: lb_spin, binary: @WORKLOAD@, min_duration: 20ms } }
";
    let mut agent = Agent::start(rules, &[]);
    // Entries of lb_spin at 0, 40 and 80 ms (`waits`: the first pending for 400 ms),
    // returns at 40, 80, 120 ms (`freezes`: frozen in the kernel, then busy); the second
    // thread spins until 900 ms.
    agent.run_workload(&["spinbg", "40", "3", "900"]);
    agent.expect_metric(
        "lookback_triggers_suppressed_total",
        &[("rule", "freezes"), ("reason", "busy")],
        3.0,
    );
    agent.expect_metric(
        "lookback_snapshots_total",
        &[("rule", "waits"), ("backend", "sampling"), ("result", "ok")],
        1.0,
    );
    let snaps = read_snapshots(&agent.out().join("waits"));
    assert_eq!(snaps.len(), 1, "{:?}", files(&agent.out().join("waits")));
    let trigger = snaps[0].meta.trigger.clone().expect("trigger");
    let late = sample_times(&snaps[0], trigger.pid)
        .into_iter()
        .filter(|&t| t > trigger.trigger_time_ns + 200_000_000)
        .count();
    assert!(
        late >= 20,
        "{late} samples of the process from 200 ms after the first trigger (the dropped ones \
         came by 130 ms)"
    );
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
    let mut child = Command::new(workload())
        .args(["--wait", "nanosleep", "100", "100000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("workload");
    let stdin = child.stdin.take();
    let workload = Running(child);
    agent.wait_log(
        &format!("tracing process {} ", workload.0.id()),
        Duration::from_secs(10),
    );
    let _ = stdin.expect("stdin").write_all(b"go\n");
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
        "{usr1}  - name: missing\n    target: {{ comm: workload }}\n    trigger: {{ function: {{ symbol: lb_no_such_function, binary: @WORKLOAD@ }} }}\n"
    );
    let mut agent = Agent::launch(&rules, &[], &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (status, body) = agent.get("/readyz");
        if body.contains("rule missing") {
            assert_eq!(status, 503, "{body}");
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never names the rule: {status} {body}\n{}",
            agent.log()
        );
        agent.assert_running();
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        body.contains("no probe attached") && body.contains("lb_no_such_function"),
        "{body}"
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

/// A cgroup v2 directory named like a containerd container of a Kubernetes pod, removed
/// (with its processes gone) on drop.
struct ContainerCgroup(PathBuf);

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Where the unified (v2) cgroup hierarchy is mounted: `/sys/fs/cgroup` on v2 hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones (like this project's CI machine).
fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .expect("a cgroup2 mount")
}

/// Serves `GET /api/v1/pods` with the recorded pod list and holds watch requests open
/// (no events), like an API server with nothing new to say.
fn fake_api_server(pods: String) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        let mut watches = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                request.push(byte[0]);
            }
            if String::from_utf8_lossy(&request).contains("watch=") {
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                );
                watches.push(stream);
            } else {
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{pods}",
                    pods.len()
                );
            }
        }
    });
    format!("http://{addr}")
}

#[test]
fn kubernetes_selectors_pick_the_processes_of_the_selected_container() {
    // The recorded pod list: pod api-...-x2k4q on node-a, its container `server` runs as
    // containerd container 571d86...
    let fixtures = lookback_tests::workspace_root().join("agent/src/daemon/kubernetes/testdata");
    let pods = std::fs::read_to_string(fixtures.join("podlist-two-nodes.json")).expect("fixture");
    let id = "571d86cad1a9dd89d096771fc32a0ba99ad5c80a6546d4ad5b7381050a1cb138";
    assert!(pods.contains(id));
    let api = fake_api_server(pods);
    // A real cgroup named as containerd names it under the systemd driver.
    let slice = cgroup2_mount().join(format!("lookback-test-{}.slice", std::process::id()));
    let cgroup = ContainerCgroup(slice.join(format!("cri-containerd-{id}.scope")));
    std::fs::create_dir_all(&cgroup.0).expect("creating a cgroup (cgroup v2, root)");
    let rules = r"
version: 1
defaults: { capture: { backend: sampling, buffer_size: 256KiB } }
rules:
  - name: pod-sleeps
    target: { kubernetes: { namespace: prod, pod_labels: { app: api }, container: server } }
    trigger: { syscall: { names: [nanosleep, clock_nanosleep], min_duration: 1ms } }
    snapshot: { cooldown: 0s, max_per_hour: 1000 }
";
    let mut agent = Agent::start_with_env(
        rules,
        &[],
        &[
            ("LOOKBACK_KUBE_API", api.as_str()),
            ("NODE_NAME", "node-a"),
            ("LOOKBACK_RESCAN_SECS", "1"),
        ],
    );
    agent.wait_log("1 container(s) selected", Duration::from_secs(20));
    // In the container: started inside the cgroup (as the runtime does), then exec'd.
    let procs = cgroup.0.join("cgroup.procs");
    let mut inside = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && exec {} --wait nanosleep 3 2000",
            procs.display(),
            workload().display()
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("sh");
    agent.wait_log(
        &format!("tracing process {} ", inside.id()),
        Duration::from_secs(10),
    );
    // Outside: the same program, not selected.
    let bystander = Command::new(workload())
        .args(["nanosleep", "3", "2000"])
        .status()
        .expect("bystander");
    assert!(bystander.success());
    let _ = inside.stdin.take().expect("stdin").write_all(b"go\n");
    assert!(inside.wait().expect("wait").success());
    agent.expect_metric("lookback_triggers_total", &[("rule", "pod-sleeps")], 3.0);
    let ok = [
        ("rule", "pod-sleeps"),
        ("backend", "sampling"),
        ("result", "ok"),
    ];
    agent.expect_metric("lookback_snapshots_total", &ok, 3.0);
    // Once the container has had a process, a rescan (1 s here) puts its cgroup into the
    // kernel's target set: a process started there later is a target from its first
    // instruction, even one that sleeps right away (no --wait: nothing waits for the agent).
    let mut quick = Command::new("sh");
    quick.arg("-c").arg(format!(
        "echo $$ > {} && exec {} nanosleep 2 2000",
        procs.display(),
        workload().display()
    ));
    std::thread::sleep(Duration::from_millis(2500));
    assert!(quick.status().expect("sh").success());
    agent.expect_metric("lookback_triggers_total", &[("rule", "pod-sleeps")], 5.0);
    agent.stop_ok();
}
