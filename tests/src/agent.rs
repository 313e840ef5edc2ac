//! `lookback agent` under test: start it on a rules file, run workloads it traces, scrape
//! its metrics, read what it wrote. Shared by the `agent*` integration tests.
#![expect(
    clippy::missing_panics_doc,
    reason = "test helpers: every failure is a test failure"
)]
#![expect(
    clippy::float_cmp,
    reason = "metric values are integer counts, exactly representable"
)]

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use lookback::snapshot::{self, Snapshot};

use crate::{lookback_bin, ring_samples, workload};

/// A running `lookback agent` with its log and metrics address.
pub struct Agent {
    pub child: Child,
    log: Arc<Mutex<String>>,
    addr: String,
    dir: tempfile::TempDir,
}

impl Agent {
    /// Starts an agent on `rules` (YAML; `@WORKLOAD@` is replaced by the workload's path)
    /// with `--output-dir DIR/out` unless `extra` gives one, and waits until it is ready.
    pub fn start(rules: &str, extra: &[&str]) -> Self {
        Self::start_with_env(rules, extra, &[])
    }

    /// [`start`](Self::start) with extra environment variables.
    pub fn start_with_env(rules: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut agent = Self::launch(rules, extra, env);
        agent.wait_readyz(200, Duration::from_secs(30));
        agent
    }

    /// Calls `step` every 100 ms until it gives `Ok` (returned), for at most `timeout`;
    /// then fails with the last `Err` (what was seen instead) and the agent's log. Fails
    /// at once when the agent exited.
    pub fn poll<T>(
        &mut self,
        timeout: Duration,
        mut step: impl FnMut(&mut Self) -> Result<T, String>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            match step(self) {
                Ok(done) => return done,
                Err(seen) => assert!(Instant::now() < deadline, "{seen}\n{}", self.log()),
            }
            self.assert_running();
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `/readyz` answers `status`; returns its body.
    pub fn wait_readyz(&mut self, status: u16, timeout: Duration) -> String {
        self.poll(timeout, |agent| match agent.get("/readyz") {
            (got, body) if got == status => Ok(body),
            (got, body) => Err(format!("/readyz {got} {body}, expected {status}:")),
        })
    }

    /// Starts the agent and waits for its metrics address, not for readiness.
    pub fn launch(rules: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::launch_under(&[], rules, extra, env)
    }

    /// [`launch`](Self::launch) as `PREFIX... lookback agent ...` (e.g. `setpriv
    /// --bounding-set ...`: the agent with exactly the manifest's capabilities).
    pub fn launch_under(
        prefix: &[&str],
        rules: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("rules.yaml");
        write_rules(&config, rules);
        let out = dir.path().join("out");
        let mut cmd = match prefix.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(lookback_bin());
                cmd
            }
            None => Command::new(lookback_bin()),
        };
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
        agent.addr = agent.wait_log("metrics on http", Duration::from_secs(30));
        agent.addr = agent
            .addr
            .split("://")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .expect("metrics address in the log")
            .to_owned();
        agent
    }

    /// `HOST:PORT` of its HTTP endpoint.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn config(&self) -> PathBuf {
        self.dir.path().join("rules.yaml")
    }

    pub fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    pub fn log(&self) -> String {
        self.log.lock().expect("log").clone()
    }

    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("agent exited ({status}):\n{}", self.log());
        }
    }

    /// Waits for a log line containing `needle`; returns that line.
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) -> String {
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
    pub fn get(&self, path: &str) -> (u16, String) {
        crate::http_get(&self.addr, path)
    }

    /// Every sample of `/metrics`, keyed `name{labels}` as exposed.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "{body}");
        parse_metrics(&body)
    }

    /// The value of `name` with exactly `labels` (as `k="v"` pairs, any order); 0 when absent.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.metric_opt(name, labels).unwrap_or(0.0)
    }

    /// The value of `name` with exactly `labels`; `None` when the series is not exposed.
    pub fn metric_opt(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        series_value(&self.metrics(), name, labels)
    }

    /// Waits until `name{labels}` is at least `at_least` and stopped moving (two reads
    /// 600 ms apart agree); returns it.
    pub fn settled_metric(&mut self, name: &str, labels: &[(&str, &str)], at_least: f64) -> f64 {
        self.poll_moving(name, labels, |agent, got| {
            if got >= at_least {
                std::thread::sleep(Duration::from_millis(600));
                if agent.metric(name, labels) == got {
                    return Ok(got);
                }
            }
            Err(format!(
                "{name}{labels:?} = {got}, expected at least {at_least}"
            ))
        })
    }

    /// Polls `name{labels}` until `step` accepts it, for as long as it keeps moving: the
    /// agent's snapshots are decoded one after the other, and a machine busy elsewhere
    /// writes 40 of them in a minute, not in 20 s (CI). Fails after 20 s without a change.
    fn poll_moving<T>(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        mut step: impl FnMut(&mut Self, f64) -> Result<T, String>,
    ) -> T {
        let idle = Duration::from_secs(20);
        let mut last = f64::NAN;
        let mut moved = Instant::now();
        loop {
            let got = self.metric(name, labels);
            if got.to_bits() != last.to_bits() {
                (last, moved) = (got, Instant::now());
            }
            match step(self, got) {
                Ok(done) => return done,
                Err(seen) => assert!(moved.elapsed() < idle, "{seen}\n{}", self.log()),
            }
            self.assert_running();
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `name{labels}` equals `value` (metrics are refreshed from the kernel
    /// every 250 ms; fails after 20 s without a change), then checks it stays there for a
    /// moment.
    pub fn expect_metric(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.poll_moving(name, labels, |agent, got| {
            if got == value {
                return Ok(());
            }
            Err(format!(
                "{name}{labels:?} = {got}, expected {value}\n--- metrics\n{}\n--- log",
                agent.get("/metrics").1
            ))
        });
        std::thread::sleep(Duration::from_millis(600));
        let later = self.metric(name, labels);
        assert_eq!(
            later,
            value,
            "{name}{labels:?} moved on from {value} to {later}\n{}",
            self.log()
        );
    }

    /// Waits until every process the kernel selected at exec (at least `at_least`) is
    /// accounted for: `lookback_exec_selected_total` equals the sum of
    /// `lookback_exec_selected_outcomes_total` over its outcomes. Returns the selected
    /// count and each outcome's.
    pub fn exec_selection_reconciled(&mut self, at_least: f64) -> (f64, Vec<(&'static str, f64)>) {
        const OUTCOMES: [&str; 5] = ["traced", "gone", "not_matching", "failed", "lost"];
        let selected = self.settled_metric("lookback_exec_selected_total", &[], at_least);
        self.poll_moving("lookback_exec_selected_total", &[], |agent, now| {
            let outcomes: Vec<(&'static str, f64)> = OUTCOMES
                .iter()
                .map(|&o| {
                    let v =
                        agent.metric("lookback_exec_selected_outcomes_total", &[("outcome", o)]);
                    (o, v)
                })
                .collect();
            let sum: f64 = outcomes.iter().map(|(_, v)| v).sum();
            if sum == now && now == selected {
                return Ok((selected, outcomes));
            }
            Err(format!(
                "{now} selected at exec ({selected} when settled), outcomes {outcomes:?}"
            ))
        })
    }

    /// SIGTERM, and the agent must exit 0.
    pub fn stop_ok(&mut self) {
        let (status, log) = self.stop();
        assert!(status.success(), "{status}\n{log}");
    }

    /// SIGTERM; returns the exit status.
    pub fn stop(&mut self) -> (std::process::ExitStatus, String) {
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

pub fn write_rules(path: &Path, rules: &str) {
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
    pub fn run_workload(&mut self, args: &[&str]) {
        let mut child = waiting_workload(args, Stdio::null());
        self.release_when_traced(&mut child);
        let status = child.wait().expect("wait");
        assert!(status.success(), "workload {args:?}: {status}");
    }

    /// Lets `child` (a workload started with `--wait` and a piped stdin) go on once the
    /// agent reports tracing it.
    pub fn release_when_traced(&mut self, child: &mut Child) {
        self.wait_log(
            &format!("tracing process {} ", child.id()),
            Duration::from_secs(10),
        );
        let _ = child.stdin.take().expect("stdin").write_all(b"go\n");
    }
}

/// Starts the workload with `--wait` and `args`: it waits on its piped stdin until
/// [`Agent::release_when_traced`] lets it go; its stdout goes to `stdout`.
///
/// # Panics
/// When the workload cannot be started.
pub fn waiting_workload(args: &[&str], stdout: Stdio) -> Child {
    Command::new(workload())
        .arg("--wait")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(stdout)
        .spawn()
        .expect("workload")
}

/// The files of directory `dir`, sorted.
pub fn files(dir: &Path) -> Vec<String> {
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

/// The `.lbsnap` files of `dir`, oldest first (the names start with the UTC time).
pub fn read_snapshots(dir: &Path) -> Vec<Snapshot> {
    files(dir)
        .iter()
        .filter(|n| n.ends_with(".lbsnap"))
        .map(|n| snapshot::read(&dir.join(n)).expect("a readable snapshot"))
        .collect()
}

/// The metadata (`<stem>.json`) of each snapshot in `dir` (a rule's directory), oldest
/// first.
pub fn snapshot_metadata(dir: &Path) -> Vec<serde_json::Value> {
    files(dir)
        .iter()
        .filter(|n| Path::new(n).extension().is_some_and(|e| e == "json"))
        .map(|n| {
            let bytes = std::fs::read(dir.join(n)).expect("reading snapshot metadata");
            serde_json::from_slice(&bytes).expect("snapshot metadata is JSON")
        })
        .collect()
}

/// Sample times of process `pid` in `snap`.
pub fn sample_times(snap: &Snapshot, pid: u32) -> Vec<u64> {
    ring_samples(&snap.rings, snap.meta.recorder.sample_layout())
        .iter()
        .filter(|s| s.pid == Some(pid))
        .filter_map(|s| s.time)
        .collect()
}

/// Every sample of a Prometheus text exposition, keyed `name{labels}` as exposed.
#[must_use]
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The value of `name` with exactly `labels` (as `k="v"` pairs, any order) among
/// `samples`; `None` when the series is not there.
#[must_use]
pub fn series_value(
    samples: &BTreeMap<String, f64>,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    let want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    samples
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
