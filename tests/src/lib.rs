//! Shared helpers for the integration tests: where the workspace is, and the `lookback`
//! binary (built once per test process with `cargo build -p lookback`, or taken from
//! `LOOKBACK_BIN`).

pub mod agent;
pub mod browser;
pub mod containers;
pub mod debuginfod;
pub mod inputs;
pub mod s3;
pub mod toolchains;

use std::{
    ffi::OsString,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

/// Whether this process runs as root (the effective uid that `/proc/self` belongs to):
/// tests that load BPF programs or open perf events skip with a note otherwise.
#[must_use]
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Whether `test` can run here (root); `false` with a note on stderr when not.
#[must_use]
#[expect(clippy::print_stderr, reason = "a skipped test says why")]
pub fn can_run(test: &str) -> bool {
    let root = is_root();
    if !root {
        eprintln!("skipped {test}: needs root");
    }
    root
}

/// Runs `cmd` to completion and returns its output, which must say success.
///
/// # Panics
/// When it cannot be started or fails (with its stderr).
pub fn succeeded(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The workspace root: the parent of this crate's directory.
///
/// # Panics
/// If this crate has no parent directory (it always has: `tests/` in the workspace).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives inside the workspace")
        .to_owned()
}

/// The `lookback` binary to test. `LOOKBACK_BIN` names a prebuilt one (CI, release
/// builds); otherwise the first call runs `cargo build -p lookback --bin lookback` in the
/// workspace (a no-op when it is fresh) and returns the path cargo reports, whatever the
/// target directory.
///
/// # Panics
/// When cargo cannot be run, the build fails, or cargo reports no `lookback` executable.
pub fn lookback_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("LOOKBACK_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => build_lookback(),
    })
    .clone()
}

fn build_lookback() -> PathBuf {
    // `CARGO` is set when the tests run under cargo; fall back to the one on PATH.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut build = Command::new(cargo);
    // What cargo set for this test binary is not the build's: ring's build script reruns
    // when CARGO_MANIFEST_DIR changes, and with it every crate above ring, each time a
    // test binary starts. The build gets the environment a shell's `cargo build` has.
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&key_text.as_ref())
        {
            build.env_remove(&key);
        }
    }
    let output = build
        .current_dir(workspace_root())
        .args([
            "build",
            "-p",
            "lookback",
            "--bin",
            "lookback",
            "--message-format=json",
        ])
        .stderr(Stdio::inherit())
        .output()
        .expect("running cargo build -p lookback");
    assert!(
        output.status.success(),
        "cargo build -p lookback failed: {}",
        output.status
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "lookback")
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .expect("cargo build reported no lookback executable")
}

/// The C test workload (tests/workloads/workload.c) and its shared library, compiled once
/// per test process into `target/test-workloads/`, with `-fno-omit-frame-pointer -g`.
///
/// # Panics
/// When the C compiler is missing or fails.
pub fn workload() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads");
        let out = workspace_root().join("target/test-workloads");
        std::fs::create_dir_all(&out).expect("creating target/test-workloads");
        let cc = |args: &[&str]| {
            let status = Command::new("cc")
                .args(args)
                .status()
                .expect("running cc (install gcc)");
            assert!(status.success(), "cc {args:?} failed");
        };
        let lib = out.join("libworkload.so");
        cc(&[
            "-O1",
            "-g",
            "-fPIC",
            "-shared",
            "-o",
            path_str(&lib),
            path_str(&src.join("libworkload.c")),
        ]);
        let bin = out.join("workload");
        let rpath = format!("-Wl,-rpath,{}", out.display());
        let libdir = format!("-L{}", out.display());
        cc(&[
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-pthread",
            "-o",
            path_str(&bin),
            path_str(&src.join("workload.c")),
            &libdir,
            "-lworkload",
            &rpath,
        ]);
        bin
    })
    .clone()
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test paths")
}

/// What a `lookback run|attach --dry-run --json` wrote: the trigger events and the
/// closing summary.
#[derive(Debug)]
pub struct DryRun {
    pub events: Vec<serde_json::Value>,
    /// The traced program's own stdout (`--json FILE` leaves it alone).
    pub program_stdout: String,
    pub summary: serde_json::Value,
    pub status: std::process::ExitStatus,
    pub stderr: String,
}

impl DryRun {
    /// Parses the JSON lines a dry run wrote to stdout (`--json`, `--json -`: the
    /// program's own stdout went to stderr, so every line must be JSON).
    ///
    /// # Panics
    /// On a line that is not JSON.
    pub fn parse(output: &std::process::Output) -> Self {
        let mut run = Self::parse_lines(&String::from_utf8_lossy(&output.stdout), output);
        run.program_stdout = String::new();
        run
    }

    /// Parses the JSON lines of `json` (a `--json FILE`'s contents); `output` is the run's,
    /// its stdout the program's own.
    ///
    /// # Panics
    /// On a line that is not JSON.
    pub fn parse_lines(json: &str, output: &std::process::Output) -> Self {
        let mut events = Vec::new();
        let mut summary = serde_json::Value::Null;
        let program_stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        for line in json.lines() {
            let value: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON line {line}: {e}"));
            if value.get("summary").is_some() {
                summary = value["summary"].clone();
            } else {
                events.push(value);
            }
        }
        Self {
            events,
            program_stdout,
            summary,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// The counters of rule `id` from the summary.
    ///
    /// # Panics
    /// When the summary lacks the rule.
    pub fn counter(&self, id: u64, name: &str) -> u64 {
        self.summary["rules"]
            .as_array()
            .and_then(|rules| rules.iter().find(|r| r["id"] == id))
            .and_then(|r| r["counters"][name].as_u64())
            .unwrap_or_else(|| panic!("no counter {name} for rule {id} in {}", self.summary))
    }

    /// Events of rule `id`.
    pub fn of_rule(&self, id: u64) -> Vec<&serde_json::Value> {
        self.events.iter().filter(|e| e["rule_id"] == id).collect()
    }
}

/// Runs `lookback run --dry-run --json --max-snapshots 0 EXTRA... -- workload ARGS...`.
///
/// # Panics
/// When lookback cannot be started or fails.
pub fn dry_run(extra: &[&str], workload_args: &[&str]) -> DryRun {
    dry_run_of(&workload(), extra, workload_args)
}

/// Runs `lookback run --dry-run --json FILE --max-snapshots 0 EXTRA... -- PROGRAM ARGS...`
/// (the JSON in a file of its own, the program's stdout on stdout).
///
/// # Panics
/// When lookback cannot be started or fails, or does not exit as the program did.
pub fn dry_run_of(program: &Path, extra: &[&str], args: &[&str]) -> DryRun {
    dry_run_with_env(program, extra, args, &[])
}

/// [`dry_run_of`] with these environment variables set for lookback.
///
/// # Panics
/// As [`dry_run_of`].
pub fn dry_run_with_env(
    program: &Path,
    extra: &[&str],
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> DryRun {
    let json = tempfile::NamedTempFile::new().expect("temp file");
    let output = Command::new(lookback_bin())
        .envs(env.iter().copied())
        .args(["run", "--dry-run", "--max-snapshots", "0", "--json"])
        .arg(json.path())
        .args(extra)
        .arg("--")
        .arg(program)
        .args(args)
        .output()
        .expect("running lookback");
    let text = std::fs::read_to_string(json.path()).expect("reading the --json file");
    let run = DryRun::parse_lines(&text, &output);
    // `run` exits as its command did (128 + signal when killed, as a shell reports it).
    let exit = &run.summary["exit"];
    let expected = exit["code"]
        .as_i64()
        .or_else(|| exit["signal"].as_i64().map(|sig| 128 + sig))
        .unwrap_or(0);
    assert_eq!(
        run.status.code().map(i64::from),
        Some(expected),
        "lookback failed, or did not exit as its command: {}\n{}\n{}",
        run.status,
        run.summary,
        run.stderr
    );
    run
}

/// The `PERF_RECORD_SAMPLE`s of perf-record rings (sampling backend), parsed with
/// `layout` (the recorder's `sample_layout()`, or a bare `sample_type`).
///
/// # Panics
/// On a malformed sample.
pub fn ring_samples(
    rings: &[lookback::capture::RingData],
    layout: impl Into<lookback::capture::records::Layout>,
) -> Vec<lookback::capture::records::Sample> {
    use lookback::capture::{RingKind, records};
    let layout: records::Layout = layout.into();
    rings
        .iter()
        .filter(|r| r.kind == RingKind::PerfRecords)
        .flat_map(|r| records::records(&r.data).collect::<Vec<_>>())
        .filter(|r| r.kind == records::PERF_RECORD_SAMPLE)
        .map(|r| records::parse_sample(layout, r.body).expect("a well-formed sample"))
        .collect()
}

/// The runtime address range of `symbol` of the ELF file `bin` in the process whose maps
/// are given (through the executable mapping of `bin` that holds it).
pub fn symbol_range(
    bin: &Path,
    maps: &lookback::capture::ProcessMaps,
    symbol: &str,
) -> Option<(u64, u64)> {
    use lookback::triggers::resolve::{file_offset_of, symbol_address};
    use object::{Object as _, ObjectSymbol as _};
    let data = std::fs::read(bin).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let address = symbol_address(&file, symbol)?;
    let size = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok(symbol))
        .map_or(1, |s| s.size().max(1));
    let file_offset = file_offset_of(&file, address)?;
    let path = bin.to_string_lossy();
    let entry = maps.maps.iter().find(|e| {
        e.path == path
            && e.executable()
            && e.offset <= file_offset
            && file_offset < e.offset + (e.end - e.start)
    })?;
    let start = entry.start + (file_offset - entry.offset);
    Some((start, start + size))
}

/// Names of loaded BPF programs that belong to lookback (the kernel keeps 15 bytes of a
/// name), from aya's listing of every program on the machine.
pub fn lookback_programs() -> Vec<String> {
    const OURS: [&str; 9] = [
        "function_entry",
        "function_return",
        "sys_enter",
        "sys_exit",
        "signal_generate",
        "process_fork",
        "process_exec",
        "process_exit",
        "sample_filter",
    ];
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| p.name_as_str().map(str::to_owned))
        .filter(|n| !n.is_empty() && OURS.iter().any(|o| o.starts_with(n.as_str())))
        .collect()
}

/// The `traceEvents` of a Chrome JSON trace.
///
/// # Panics
/// When the document has none.
#[must_use]
pub fn chrome_events(doc: &serde_json::Value) -> &Vec<serde_json::Value> {
    doc["traceEvents"].as_array().expect("traceEvents")
}

/// The functions open on the thread of the instant named `instant` at that instant (its
/// B/E events replayed up to it), outermost first.
///
/// # Panics
/// When there is no such instant.
#[must_use]
pub fn open_at_instant(events: &[serde_json::Value], instant: &str) -> Vec<String> {
    let at = events
        .iter()
        .position(|e| e["ph"] == "i" && e["name"] == instant)
        .unwrap_or_else(|| panic!("no instant {instant}"));
    let tid = &events[at]["tid"];
    let mut open = Vec::new();
    for e in events[..at].iter().filter(|e| &e["tid"] == tid) {
        match e["ph"].as_str() {
            Some("B") => open.push(e["name"].as_str().unwrap_or("?").to_owned()),
            Some("E") => {
                open.pop();
            }
            _ => {}
        }
    }
    open
}

/// `python3 tests/scripts/check_fxt.py TRACE` → its JSON, or `None` (skip) without python3.
///
/// # Panics
/// When the script fails or prints no JSON, or python3 is missing on CI.
pub fn read_fxt(trace: &Path) -> Option<serde_json::Value> {
    if Command::new("python3").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 is missing on CI: the FXT trace cannot be checked"
        );
        #[expect(clippy::print_stderr, reason = "a skipped test says why")]
        {
            eprintln!("skipped: python3 is missing, the FXT trace cannot be checked");
        }
        return None;
    }
    let script = workspace_root().join("tests/scripts/check_fxt.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(trace)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "check_fxt.py failed (exit 3: run `cargo xtask setup` to install the fxt package): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("check_fxt.py prints JSON"))
}

/// `GET path` over plain HTTP/1.1 → (status, body); (0, "") when nothing answers.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
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

/// A TCP port on 127.0.0.1 nothing listens on now.
///
/// # Panics
/// When no port can be bound.
#[must_use]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Debian's `redis-server` (a stripped distro binary without frame pointers).
///
/// # Panics
/// When it is not installed (`cargo xtask setup` installs it, as root).
#[must_use]
pub fn debian_redis_server() -> &'static Path {
    let redis = Path::new("/usr/bin/redis-server");
    assert!(
        redis.exists(),
        "redis-server is missing: install the Debian package redis-server (cargo xtask setup does, as root)"
    );
    redis
}
