//! `run` and `attach` as a user of perf, strace and bpftrace expects them to treat processes
//! and output (issue 17), on Debian's nginx (a master and its workers; a server that
//! daemonizes) and small commands: existing children traced by `attach`, a daemonizing
//! server followed by `run`, `--json` lines never mixed with the program's own stdout,
//! `--duration`. Every outcome is decided by the programs (requests answered, processes
//! exited), never by the clock.
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use lookback_tests::{DryRun, can_run, lookback_bin};

/// A throwaway nginx: its prefix directory, config and port. `daemon` says whether the
/// master forks into the background (nginx's default) or stays in the foreground.
struct Nginx {
    dir: tempfile::TempDir,
    port: u16,
}

impl Nginx {
    fn new(daemon: bool) -> Self {
        let nginx = Path::new("/usr/sbin/nginx");
        assert!(
            nginx.exists(),
            "nginx is missing: install the Debian package nginx (cargo xtask setup does, as root)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        // The workers run as nobody: they must reach the document root.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        std::fs::create_dir(dir.path().join("www")).expect("www");
        std::fs::write(dir.path().join("www/index.html"), "hello\n").expect("index");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let d = dir.path().display();
        let conf = format!(
            "daemon {daemon};\nmaster_process on;\nworker_processes 2;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log;\nevents {{ worker_connections 64; }}\nhttp {{\n  \
             access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  \
             scgi_temp_path {d}/scgi;\n  server {{ listen 127.0.0.1:{port}; root {d}/www; }}\n}}\n",
            daemon = if daemon { "on" } else { "off" }
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).expect("nginx.conf");
        Self { dir, port }
    }

    /// `nginx -p DIR -c DIR/nginx.conf` as arguments.
    fn command(&self) -> Vec<String> {
        vec![
            "/usr/sbin/nginx".into(),
            "-p".into(),
            self.dir.path().display().to_string(),
            "-c".into(),
            self.dir.path().join("nginx.conf").display().to_string(),
        ]
    }

    /// Waits until the master has written its pid and a worker answers; returns the
    /// master's pid.
    fn wait_ready(&self) -> u32 {
        let started = Instant::now();
        loop {
            let pid = std::fs::read_to_string(self.dir.path().join("nginx.pid"))
                .ok()
                .and_then(|t| t.trim().parse().ok());
            if let Some(pid) = pid
                && self.get("/index.html").starts_with("HTTP/1.1 200")
            {
                return pid;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "nginx did not start: {}",
                std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One HTTP/1.0 request; the response (empty when nothing answers).
    fn get(&self, path: &str) -> String {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return String::new();
        };
        let mut response = String::new();
        let _ = stream
            .write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .and_then(|()| stream.read_to_string(&mut response));
        response
    }

    /// Ten requests for files that do not exist: each makes a worker's `openat` fail
    /// with ENOENT (the trigger the tests count).
    fn ten_misses(&self) {
        for i in 0..10 {
            let response = self.get(&format!("/missing-{i}.html"));
            assert!(response.starts_with("HTTP/1.1 404"), "{response}");
        }
    }

    /// Graceful stop (SIGQUIT to the master): workers finish, then the master exits.
    fn stop(pid: u32) {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(i32::try_from(pid).expect("pid"), libc::SIGQUIT) };
    }
}

impl Drop for Nginx {
    /// A test that failed midway must not leave nginx behind: its processes would hold the
    /// test runner's pipes open (and the suite would wait on them forever). Kills the
    /// master named by the pid file and its workers; nothing when they are gone.
    fn drop(&mut self) {
        let Some(master) = std::fs::read_to_string(self.dir.path().join("nginx.pid"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        else {
            return;
        };
        let comm = std::fs::read_to_string(format!("/proc/{master}/comm")).unwrap_or_default();
        if comm.trim() != "nginx" {
            return; // gone (and the pid perhaps reused)
        }
        let workers = workers(master)
            .into_iter()
            .filter_map(|p| i32::try_from(p).ok());
        for pid in std::iter::once(i32::try_from(master).unwrap_or(0)).chain(workers) {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// `lookback` started with `args`, stderr read on a thread: [`Self::wait_for`] blocks until
/// a log line contains a text (the attach done, the command gone), whatever the speed.
struct Lookback {
    child: Child,
    lines: mpsc::Receiver<String>,
    log: String,
}

impl Lookback {
    fn start(args: &[String]) -> Self {
        let mut child = Command::new(lookback_bin())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lookback");
        let stderr = child.stderr.take().expect("stderr");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            log: String::new(),
        }
    }

    /// Blocks until a stderr line contains `text`; panics if lookback exits first, or
    /// says nothing for two minutes (a hang, not a slow machine).
    fn wait_for(&mut self, text: &str) {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_mins(2))
                .unwrap_or_else(|e| panic!("{e}: no {text:?} from lookback:\n{}", self.log));
            self.log.push_str(&line);
            self.log.push('\n');
            if line.contains(text) {
                return;
            }
        }
    }

    /// Waits for lookback to exit; its exit code and its whole stderr.
    fn finish(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().expect("lookback exits");
        self.log.extend(self.lines.iter().map(|l| l + "\n"));
        (status.code(), std::mem::take(&mut self.log))
    }

    fn interrupt(&self) {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(i32::try_from(self.child.id()).expect("pid"), libc::SIGINT) };
    }
}

impl Drop for Lookback {
    /// A failed test does not leave lookback running.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

/// The events of a `--json FILE` dry run, by pid.
fn events_by_pid(json: &Path) -> Vec<(u64, serde_json::Value)> {
    std::fs::read_to_string(json)
        .expect("the --json file")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .filter(|v| v.get("summary").is_none())
        .map(|v| (v["pid"].as_u64().expect("pid"), v))
        .collect()
}

/// The pids of the workers of nginx `master` (its children; none when it is gone).
fn workers(master: u32) -> Vec<u64> {
    let text = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
        .unwrap_or_default();
    text.split_whitespace()
        .map(|p| p.parse().expect("pid"))
        .collect()
}

#[test]
fn attach_traces_the_existing_workers_of_a_server_unless_told_not_to() {
    if !can_run("attach_traces_the_existing_workers_of_a_server_unless_told_not_to") {
        return;
    }
    let nginx = Nginx::new(false);
    let args = nginx.command();
    let mut server = Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx");
    let master = nginx.wait_ready();
    let workers = workers(master);
    assert_eq!(workers.len(), 2, "worker_processes 2");
    let trace = |extra: &[&str]| {
        let json = nginx.dir.path().join(format!("events{}.json", extra.len()));
        let mut args: Vec<String> = ["attach", "-p", &master.to_string(), "--dry-run"]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect();
        args.extend([
            "--json".into(),
            path_arg(&json),
            "--trigger".into(),
            "syscall:openat=ENOENT".into(),
        ]);
        let mut lookback = Lookback::start(&args);
        lookback.wait_for("waiting for triggers");
        nginx.ten_misses();
        lookback.interrupt();
        let (code, log) = lookback.finish();
        assert_eq!(code, Some(0), "{log}");
        (events_by_pid(&json), log)
    };
    // By default the workers, where the requests are served, are traced too.
    let (events, log) = trace(&[]);
    assert!(log.contains("tracing 3 process(es)"), "{log}");
    let in_workers = events.iter().filter(|(p, _)| workers.contains(p)).count();
    assert!(in_workers >= 10, "{in_workers} of 10 misses seen:\n{log}");
    assert!(
        events.iter().all(|(p, _)| workers.contains(p)),
        "{events:?}"
    );
    // --no-children: the master alone, and the log says what is left out.
    let (events, log) = trace(&["--no-children"]);
    assert!(log.contains("tracing 1 process(es)"), "{log}");
    assert!(
        log.contains("2 existing descendant process(es)") && log.contains("--no-children"),
        "{log}"
    );
    assert!(events.is_empty(), "the master opens nothing: {events:?}");
    Nginx::stop(master);
    assert!(server.wait().expect("nginx exits").success());
}

#[test]
fn run_follows_a_server_that_daemonizes_until_its_last_process_exits() {
    if !can_run("run_follows_a_server_that_daemonizes_until_its_last_process_exits") {
        return;
    }
    let nginx = Nginx::new(true);
    let json = nginx.dir.path().join("events.json");
    let mut args: Vec<String> = [
        "run",
        "--dry-run",
        "--trigger",
        "syscall:openat=ENOENT",
        "--json",
    ]
    .map(str::to_owned)
    .into();
    args.push(path_arg(&json));
    args.push("--".into());
    args.extend(nginx.command());
    let mut lookback = Lookback::start(&args);
    // The command (nginx's first process) exits at once, leaving the master behind.
    lookback.wait_for("still tracing the processes it started");
    let master = nginx.wait_ready();
    let workers = workers(master);
    nginx.ten_misses();
    assert!(
        lookback.child.try_wait().expect("try_wait").is_none(),
        "lookback must trace the server until it exits"
    );
    Nginx::stop(master);
    let (code, log) = lookback.finish();
    assert_eq!(code, Some(0), "the command's status: {log}");
    assert!(
        log.contains("the last process the command started exited"),
        "{log}"
    );
    let events = events_by_pid(&json);
    let in_workers = events.iter().filter(|(p, _)| workers.contains(p)).count();
    assert!(in_workers >= 10, "{in_workers} of 10 misses seen:\n{log}");
}

#[test]
fn json_lines_are_never_mixed_with_the_programs_stdout() {
    if !can_run("json_lines_are_never_mixed_with_the_programs_stdout") {
        return;
    }
    let script = "echo program-output; cat /nonexistent-lookback-file; exit 3";
    let run = |json: &[&str]| {
        Command::new(lookback_bin())
            .args(["run", "--dry-run", "--trigger", "syscall:openat=ENOENT"])
            .args(json)
            .args(["--", "sh", "-c", script])
            .output()
            .expect("lookback")
    };
    // `--json` (stdout): every stdout line is ours; the program's went to stderr.
    for flag in [&["--json"][..], &["--json", "-"]] {
        let out = run(flag);
        assert_eq!(out.status.code(), Some(3));
        let stdout = String::from_utf8_lossy(&out.stdout);
        for line in stdout.lines() {
            serde_json::from_str::<serde_json::Value>(line)
                .unwrap_or_else(|e| panic!("{flag:?}: not JSON ({e}): {line}"));
        }
        let run = DryRun::parse(&out);
        assert!(!run.events.is_empty() && run.summary["exit"]["code"] == 3);
        assert!(run.stderr.contains("program-output"), "{}", run.stderr);
    }
    // `--json FILE`: the program's stdout is left where it was.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("events.json");
    let out = run(&["--json", file.to_str().expect("UTF-8")]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "program-output\n");
    let text = std::fs::read_to_string(&file).expect("events file");
    let run = DryRun::parse_lines(&text, &out);
    assert!(!run.events.is_empty(), "{text}");
    assert_eq!(run.summary["exit"]["code"], 3);
    // An unwritable destination is refused before the command starts.
    let marker: PathBuf = dir.path().join("started");
    let out = Command::new(lookback_bin())
        .args(["run", "--dry-run", "--json", "/nonexistent-dir/events.json"])
        .args(["--trigger", "signal:SIGUSR2", "--", "touch"])
        .arg(&marker)
        .output()
        .expect("lookback");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent-dir/events.json"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!marker.exists(), "the command must not have run");
}

#[test]
fn duration_ends_the_tracing_and_leaves_the_target_running() {
    if !can_run("duration_ends_the_tracing_and_leaves_the_target_running") {
        return;
    }
    let mut target = Command::new("sleep").arg("600").spawn().expect("sleep");
    let mut lookback = Lookback::start(&[
        "attach".into(),
        "-p".into(),
        target.id().to_string(),
        "--dry-run".into(),
        "--duration".into(),
        "300ms".into(),
        "--trigger".into(),
        "signal:SIGUSR2".into(),
    ]);
    lookback.wait_for("--duration reached");
    let (code, log) = lookback.finish();
    assert_eq!(code, Some(0), "{log}");
    assert!(
        target.try_wait().expect("try_wait").is_none(),
        "the target keeps running"
    );
    target.kill().expect("kill");
    target.wait().expect("reap");
}
