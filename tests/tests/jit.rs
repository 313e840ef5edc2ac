//! JIT code named by its runtime's perf map (`/tmp/perf-PID.map`) or jitdump (`jit-PID.dump`,
//! Node.js `--perf-prof`), with the real runtimes:
//! Debian's Node.js (`--perf-basic-prof --interpreted-frames-native-stack`) and `OpenJDK` 17
//! (`-XX:+PreserveFramePointer`, the map written by `jcmd PID Compiler.perfmap`). A syscall
//! trigger inside a JS function (Java method) two calls deep: both functions are named in
//! the trigger's stack and open in the trace's slices at the trigger. The map is captured
//! at the freeze: a process that exits right after its trigger, its map deleted, still has
//! its names when the kept `.lbsnap` is decoded. Needs root (run by `cargo xtask test`
//! with --test-threads=1); `cargo xtask setup` installs `nodejs` and
//! `openjdk-17-jdk-headless`.
use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use lookback_tests::{can_run, chrome_events, lookback_bin, open_at_instant, succeeded};

/// A JS function (`handleRequest`) called by another (`outer`) blocks in `read(2)` of a
/// FIFO (opened read-write, so that the open does not block) until the test writes to it;
/// the program writes its pid to `ready` first, and stays `linger_ms` after the read.
const NODE_APP: &str = r"'use strict';
const fs = require('fs');
const [fifo, ready, linger] = process.argv.slice(2);
function handleRequest(fd) {
  const buf = Buffer.alloc(16);
  return fs.readSync(fd, buf, 0, 16, null);
}
function outer(fd) {
  return handleRequest(fd) + 1;
}
const fd = fs.openSync(fifo, 'r+');
fs.writeFileSync(ready, `${process.pid}\n`);
outer(fd);
if (Number(linger) > 0) setTimeout(() => {}, Number(linger));
";

/// `outer` and `handleRequest` made hot (50,000 calls, each reading a byte it wrote to
/// the FIFO: the same path as the slow call, so the compiled code is not thrown away when
/// it blocks), not inlined (`-XX:CompileCommand=dontinline`), then the call that blocks.
const JAVA_APP: &str = r#"import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.Path;

public class JitApp {
    static int handleRequest(RandomAccessFile fifo) throws Exception {
        return fifo.read();
    }

    static int outer(RandomAccessFile fifo) throws Exception {
        return handleRequest(fifo) + 1;
    }

    public static void main(String[] args) throws Exception {
        RandomAccessFile fifo = new RandomAccessFile(args[0], "rw");
        long sum = 0;
        for (int i = 0; i < 50_000; i++) {
            fifo.write(1);
            sum += outer(fifo);
        }
        Thread.sleep(1000);
        Files.writeString(Path.of(args[1]), ProcessHandle.current().pid() + "\n");
        sum += outer(fifo);
        System.exit(sum > 0 ? 0 : 1);
    }
}
"#;

/// The path of `program`, which must be installed.
fn installed(program: &str, package: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .expect("sh");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && !path.is_empty(),
        "{program} is missing: install the Debian package {package} (cargo xtask setup does, as root)"
    );
    PathBuf::from(path)
}

/// A FIFO at `dir/fifo`.
fn fifo_in(dir: &Path) -> PathBuf {
    let fifo = dir.join("fifo");
    succeeded(Command::new("mkfifo").arg(&fifo));
    fifo
}

/// A `lookback run --json` with `trigger` of `command` (a program that writes its pid to
/// `ready`, then blocks reading `fifo`), Chrome JSON to `trace` and the raw snapshot kept
/// beside it, in `ready`'s directory (V8 writes its logs to its working directory);
/// `before_wake` runs once the pid is known, then a byte goes to the FIFO 400 ms later.
/// Returns the run's output and the target's pid.
fn run_until_woken(
    trigger: &str,
    trace: &Path,
    command: &mut Vec<String>,
    ready: &Path,
    fifo: &Path,
    before_wake: impl FnOnce(u32),
) -> (Output, u32) {
    let mut child = Command::new(lookback_bin())
        .args(["run", "--backend", "sampling", "--json", "--keep-raw"])
        .args(["--trigger", trigger])
        .arg("-o")
        .arg(trace)
        .arg("--")
        .args(command.drain(..))
        .current_dir(ready.parent().unwrap_or(Path::new("/tmp")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lookback");
    let started = Instant::now();
    let pid = loop {
        if let Some(pid) = fs::read_to_string(ready)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        {
            break pid;
        }
        if started.elapsed() > Duration::from_mins(1) || child.try_wait().ok().flatten().is_some() {
            let _ = child.kill();
            let out = child.wait_with_output().expect("lookback");
            panic!(
                "the program never got to its slow call:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    before_wake(pid);
    std::thread::sleep(Duration::from_millis(400));
    fs::OpenOptions::new()
        .write(true)
        .open(fifo)
        .and_then(|mut f| f.write_all(b"x"))
        .expect("waking the program");
    let out = child.wait_with_output().expect("lookback");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out, pid)
}

/// The trigger instant's stack (outermost first) and the functions open at it in the
/// Chrome JSON trace at `trace`.
fn trigger_frames(trace: &Path, rule: &str) -> (Vec<String>, Vec<String>) {
    let doc: Value = serde_json::from_slice(&fs::read(trace).expect("trace")).expect("JSON");
    let events = chrome_events(&doc);
    let instant = format!("trigger: {rule}");
    let stack = events
        .iter()
        .find(|e| e["ph"] == "i" && e["name"] == instant.as_str())
        .and_then(|e| e["args"]["stack"].as_str())
        .unwrap_or_else(|| panic!("no stack at the instant {instant}"))
        .split(" → ")
        .map(str::to_owned)
        .collect();
    (stack, open_at_instant(events, &instant))
}

/// The position of the first frame of `frames` that names `function`.
fn position(frames: &[String], function: &str) -> Option<usize> {
    frames.iter().position(|f| f.contains(function))
}

/// A frame naming `outer` encloses one naming `inner` in `frames` (outermost first): the
/// names as the runtime's perf map gives them (V8's `JS:~outer /path/app.js:8:15`,
/// the JVM's `int JitApp.outer(java.io.RandomAccessFile)`).
fn assert_nested(frames: &[String], outer: &str, inner: &str, what: &str, stderr: &str) {
    let (o, i) = (position(frames, outer), position(frames, inner));
    assert!(
        o.is_some() && i.is_some() && o < i,
        "{what}: {outer} should enclose {inner}: {frames:#?}\n{stderr}"
    );
}

/// Node.js runs `NODE_APP` in `dir` with `flag` (`--perf-basic-prof`: a perf map;
/// `--perf-prof`: a jitdump in `dir`) under `lookback run --trigger syscall:read>200ms`,
/// staying `linger_ms` after the slow read: (the run's output, node's pid, the trace, the
/// rule).
fn node_run_with(dir: &Path, flag: &str, linger_ms: u32) -> (Output, u32, PathBuf, String) {
    let node = installed("node", "nodejs");
    let app = dir.join("app.js");
    fs::write(&app, NODE_APP).expect("app.js");
    let (fifo, ready, trace) = (fifo_in(dir), dir.join("ready"), dir.join("trace.json"));
    let rule = "syscall:read>200ms".to_owned();
    let mut command = vec![
        node.to_string_lossy().into_owned(),
        flag.to_owned(),
        "--interpreted-frames-native-stack".to_owned(),
        app.to_string_lossy().into_owned(),
        fifo.to_string_lossy().into_owned(),
        ready.to_string_lossy().into_owned(),
        linger_ms.to_string(),
    ];
    let (out, pid) = run_until_woken(&rule, &trace, &mut command, &ready, &fifo, |_| {});
    (out, pid, trace, rule)
}

/// `JS:~outer` encloses `JS:~handleRequest` in the trigger stack and the slices open at
/// the trigger of the Chrome JSON trace at `trace`; returns the trigger stack.
fn node_functions_nested(trace: &Path, rule: &str, stderr: &str) -> Vec<String> {
    let (stack, open) = trigger_frames(trace, rule);
    assert_nested(
        &stack,
        "JS:~outer",
        "JS:~handleRequest",
        "trigger stack",
        stderr,
    );
    assert_nested(&open, "JS:~outer", "JS:~handleRequest", "slices", stderr);
    stack
}

fn node_run(dir: &Path, linger_ms: u32) -> (Output, u32, PathBuf, String) {
    node_run_with(dir, "--perf-basic-prof", linger_ms)
}

#[test]
fn node_functions_are_named_in_the_trigger_stack_and_the_slices() {
    if !can_run("node_functions_are_named_in_the_trigger_stack_and_the_slices") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, pid, trace, rule) = node_run(dir.path(), 500);
    let _ = fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stack = node_functions_nested(&trace, &rule, &stderr);
    // Named with the script's place, as V8 wrote them.
    assert!(
        stack
            .iter()
            .any(|f| f.contains("handleRequest") && f.contains("app.js:4")),
        "{stack:#?}"
    );
}

#[test]
fn node_functions_are_named_from_its_jitdump_without_a_perf_map() {
    if !can_run("node_functions_are_named_from_its_jitdump_without_a_perf_map") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, pid, trace, rule) = node_run_with(dir.path(), "--perf-prof", 500);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let dump = dir.path().join(format!("jit-{pid}.dump"));
    assert!(dump.is_file(), "node wrote no {}", dump.display());
    let map = format!("/tmp/perf-{pid}.map");
    assert!(!Path::new(&map).exists(), "--perf-prof wrote {map} too");
    node_functions_nested(&trace, &rule, &stderr);
}

#[test]
fn a_node_process_gone_after_its_trigger_keeps_its_names_in_the_snapshot() {
    if !can_run("a_node_process_gone_after_its_trigger_keeps_its_names_in_the_snapshot") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // Node exits as soon as the slow read returns.
    let (out, pid, trace, rule) = node_run(dir.path(), 0);
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    assert!(map.exists(), "node wrote no {}", map.display());
    fs::remove_file(&map).expect("removing the perf map");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "node {pid} should be gone"
    );
    let snapshot = trace.with_extension("lbsnap");
    let again = dir.path().join("again.json");
    succeeded(
        Command::new(lookback_bin())
            .arg("decode")
            .arg(&snapshot)
            .arg("-o")
            .arg(&again),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for trace in [&trace, &again] {
        node_functions_nested(trace, &rule, &stderr);
    }
}

#[test]
fn a_jit_compiled_java_method_is_named_after_jcmd_compiler_perfmap() {
    if !can_run("a_jit_compiled_java_method_is_named_after_jcmd_compiler_perfmap") {
        return;
    }
    let java = installed("java", "openjdk-17-jdk-headless");
    let javac = installed("javac", "openjdk-17-jdk-headless");
    let jcmd = installed("jcmd", "openjdk-17-jdk-headless");
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("JitApp.java");
    fs::write(&source, JAVA_APP).expect("JitApp.java");
    succeeded(Command::new(javac).arg("-d").arg(dir.path()).arg(&source));
    let (fifo, ready, trace) = (
        fifo_in(dir.path()),
        dir.path().join("ready"),
        dir.path().join("trace.json"),
    );
    let rule = "syscall:read>200ms";
    let mut command = vec![
        java.to_string_lossy().into_owned(),
        "-XX:+PreserveFramePointer".to_owned(),
        "-XX:CompileCommand=quiet".to_owned(),
        "-XX:CompileCommand=dontinline,JitApp::*".to_owned(),
        "-cp".to_owned(),
        dir.path().to_string_lossy().into_owned(),
        "JitApp".to_owned(),
        fifo.to_string_lossy().into_owned(),
        ready.to_string_lossy().into_owned(),
    ];
    let (out, pid) = run_until_woken(rule, &trace, &mut command, &ready, &fifo, |pid| {
        succeeded(
            Command::new(&jcmd)
                .arg(pid.to_string())
                .arg("Compiler.perfmap"),
        );
    });
    let _ = fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (stack, open) = trigger_frames(&trace, rule);
    let (outer, inner) = (
        "int JitApp.outer(java.io.RandomAccessFile)",
        "int JitApp.handleRequest(java.io.RandomAccessFile)",
    );
    assert_nested(&stack, outer, inner, "trigger stack", &stderr);
    assert_nested(&open, outer, inner, "slices", &stderr);
}
