//! Stripped binaries whose symbols live in separate debug files, as distributions ship
//! them: a `.gnu_debuglink` file beside the binary, a build-id directory (Debian `-dbgsym`,
//! given with `--debug-dir` or inside a container's own `/usr/lib/debug`), and
//! `MiniDebugInfo` (Fedora's xz-compressed `.gnu_debugdata`). Each is made in the test from a
//! g++ build with binutils' `objcopy` and `xz`, the way the distributions make them; a
//! latency rule on the static `spin_for` must then probe the same instruction as in the
//! unstripped build, fire once per call, and the trace must name the function. Without the
//! debug file the error says where it was looked for, and a trace says which binary lacks
//! symbols and what to install. Needs root (run by `cargo xtask test`).
use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::Value;

use lookback_tests::{
    debuginfod::{DebuginfodServer, build_id, requests_in},
    dry_run_with_env, lookback_bin,
    toolchains::cxx_stripped,
};

/// Environment variables set for lookback.
type Env<'a> = &'a [(&'a str, &'a std::ffi::OsStr)];

/// No variable set (lookback inherits the test's environment).
const NO_ENV: Env<'static> = &[];

/// The latency rule every test uses: `spin_for` runs ~30 ms per call (dry runs) or 300 ms.
const SLOW: &str = "func:spin_for>20ms";

fn run(program: &str, args: &[&std::ffi::OsStr]) {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn os(text: &str) -> &std::ffi::OsStr {
    text.as_ref()
}

/// `full` with everything but its dynamic symbols removed (`strip --strip-all`), at `out`.
fn stripped_copy(full: &Path, out: &Path, extra: &[&std::ffi::OsStr]) {
    let mut args = vec![os("--strip-all")];
    args.extend_from_slice(extra);
    args.extend([full.as_os_str(), out.as_os_str()]);
    run("objcopy", &args);
}

/// The debug file of `full` (`objcopy --only-keep-debug`), at `out`.
fn debug_file(full: &Path, out: &Path) {
    run(
        "objcopy",
        &[os("--only-keep-debug"), full.as_os_str(), out.as_os_str()],
    );
}

/// The file offset the entry probe of `name` lands on in `program` (with `extra` flags),
/// and how many times the rule fired for 2 calls.
fn probed(program: &Path, extra: &[&str], env: Env<'_>) -> (u64, usize) {
    let mut flags = vec!["--trigger", SLOW];
    flags.extend_from_slice(extra);
    let run = dry_run_with_env(program, &flags, &["30", "2"], env);
    let probes = run.summary["rules"][0]["probes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let entry = probes
        .iter()
        .find(|p| p["site"] == "entry")
        .unwrap_or_else(|| panic!("no entry probe\n{}\n{}", run.summary, run.stderr));
    assert_eq!(entry["function"], "spin_for(long)", "{entry}");
    (
        entry["file_offset"].as_u64().expect("offset"),
        run.of_rule(0).len(),
    )
}

/// Records one latency trigger of `program` (300 ms per call) into a Chrome JSON trace:
/// the trace text, the `--json` snapshot line, and stderr.
fn recorded(
    program: &Path,
    trigger: &str,
    extra: &[&str],
    env: Env<'_>,
) -> (String, Value, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.json");
    let out = Command::new(lookback_bin())
        .envs(env.iter().copied())
        .args([
            "run",
            "--json",
            "--backend",
            "sampling",
            "--trigger",
            trigger,
        ])
        .args(extra)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(program)
        .args(["300", "1"])
        .output()
        .expect("lookback");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("trace").is_some())
        .unwrap_or_else(|| panic!("no snapshot line\n{stderr}"));
    let text = std::fs::read_to_string(&trace).expect("trace written");
    (text, line, stderr)
}

/// Whether the Chrome JSON trace `text` has a slice named after `spin_for`.
fn names_spin_for(text: &str) -> bool {
    let doc: Value = serde_json::from_str(text).expect("JSON trace");
    let events = doc["traceEvents"]
        .as_array()
        .or_else(|| doc.as_array())
        .cloned()
        .unwrap_or_default();
    events.iter().any(|e| {
        e["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("spin_for"))
    })
}

/// The unstripped build, copied into `dir` (its own probe offset is the reference).
fn full_build(dir: &Path) -> PathBuf {
    let full = dir.join("full");
    std::fs::copy(cxx_stripped(), &full).expect("copy");
    full
}

#[test]
fn a_debuglink_file_beside_the_binary_gives_probes_and_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = full_build(dir.path());
    let (offset, fired) = probed(&full, &[], NO_ENV);
    assert_eq!(fired, 2);
    let bin = dir.path().join("server");
    let debug = dir.path().join("server.debug");
    debug_file(&full, &debug);
    // objcopy records the debug file's name and CRC-32 from the file given.
    let link = format!("--add-gnu-debuglink={}", debug.display());
    stripped_copy(&full, &bin, &[os(&link)]);
    assert_eq!(probed(&bin, &[], NO_ENV), (offset, 2));
    let (trace, _, stderr) = recorded(&bin, "func:spin_for>100ms", &[], NO_ENV);
    assert!(names_spin_for(&trace), "no spin_for slice\n{stderr}");

    // A file of that name with other bytes is not the debug file.
    std::fs::write(&debug, b"not the debug file").expect("write");
    let err = refused(&bin, &[], NO_ENV);
    assert!(
        err.contains("does not match the binary's .gnu_debuglink CRC"),
        "{err}"
    );
    // None at all: where it was looked for, and what to install.
    std::fs::remove_file(&debug).expect("rm");
    let err = refused(&bin, &[], NO_ENV);
    assert!(
        err.contains("stripped; no debug file at")
            && err.contains(&format!("{}", debug.display()))
            && err.contains(&format!("(build-id {})", build_id(&bin)))
            && err.contains("install its debug symbols package"),
        "{err}"
    );
}

/// A dry run expected to be refused (exit 2, the rule names nothing): its stderr.
fn refused(program: &Path, extra: &[&str], env: Env<'_>) -> String {
    let out = Command::new(lookback_bin())
        .envs(env.iter().copied())
        .args(["run", "--dry-run", "--trigger", SLOW])
        .args(extra)
        .arg("--")
        .arg(program)
        .args(["30", "2"])
        .output()
        .expect("lookback");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// `root/.build-id/xx/yyyy.debug` for the build-id of `bin`, holding `full`'s debug file.
fn build_id_tree(root: &Path, full: &Path, bin: &Path) -> PathBuf {
    let id = build_id(bin);
    let sub = root.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&sub).expect("mkdir");
    let path = sub.join(format!("{}.debug", &id[2..]));
    debug_file(full, &path);
    path
}

#[test]
fn a_build_id_directory_given_with_debug_dir_gives_probes_and_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = full_build(dir.path());
    let (offset, _) = probed(&full, &[], NO_ENV);
    let bin = dir.path().join("server");
    stripped_copy(&full, &bin, &[]);
    let root = dir.path().join("debug-root");
    build_id_tree(&root, &full, &bin);
    // Not without the directory: nothing links the binary to it.
    let err = refused(&bin, &[], NO_ENV);
    assert!(
        err.contains("no debug file at /usr/lib/debug/.build-id/"),
        "{err}"
    );
    let flag = ["--debug-dir", root.to_str().expect("utf-8")];
    assert_eq!(probed(&bin, &flag, NO_ENV), (offset, 2));
    let (trace, _, stderr) = recorded(&bin, "func:spin_for>100ms", &flag, NO_ENV);
    assert!(names_spin_for(&trace), "no spin_for slice\n{stderr}");
}

#[test]
fn minidebuginfo_gives_probes_and_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = full_build(dir.path());
    let (offset, _) = probed(&full, &[], NO_ENV);
    // Fedora's recipe (find-debuginfo): the symbol table without DWARF, xz-compressed,
    // added to the stripped binary as .gnu_debugdata.
    let keep = dir.path().join("mini.debug");
    let symtab = dir.path().join("mini");
    debug_file(&full, &keep);
    run(
        "objcopy",
        &[
            os("--strip-debug"),
            os("--remove-section=.comment"),
            keep.as_os_str(),
            symtab.as_os_str(),
        ],
    );
    run("xz", &[os("-f"), symtab.as_os_str()]);
    let section = format!(".gnu_debugdata={}.xz", symtab.display());
    let bin = dir.path().join("server");
    stripped_copy(&full, &bin, &[os("--add-section"), os(&section)]);
    assert_eq!(probed(&bin, &[], NO_ENV), (offset, 2));
    let (trace, _, stderr) = recorded(&bin, "func:spin_for>100ms", &[], NO_ENV);
    assert!(names_spin_for(&trace), "no spin_for slice\n{stderr}");
}

#[test]
fn a_trace_of_a_binary_without_symbols_says_which_and_what_to_install() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = full_build(dir.path());
    let bin = dir.path().join("server");
    stripped_copy(&full, &bin, &[]);
    // libc's getppid, called after the 300 ms spin: the spin's samples have no names.
    let (_, line, stderr) = recorded(&bin, "func:getppid", &[], NO_ENV);
    let module = line["symbols"]
        .as_array()
        .and_then(|m| {
            m.iter()
                .find(|m| m["module"].as_str() == bin.to_str())
                .cloned()
        })
        .unwrap_or_else(|| panic!("no symbols entry for the binary: {line}\n{stderr}"));
    let (frames, unknown) = (
        module["frames"].as_u64().expect("frames"),
        module["unknown"].as_u64().expect("unknown"),
    );
    assert!(frames > 0 && unknown * 2 > frames, "{module}");
    let id = build_id(&bin);
    assert_eq!(module["build_id"], id.as_str(), "{module}");
    let hint = module["hint"].as_str().expect("a hint");
    assert!(
        hint.contains("install its debug symbols package") && hint.contains(&id),
        "{hint}"
    );
    assert!(
        stderr.contains(&format!("of the frames in {}", bin.display()))
            && stderr.contains("have no name"),
        "{stderr}"
    );
}

#[test]
fn inside_another_mount_namespace_the_debug_file_comes_from_its_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = full_build(dir.path());
    let (offset, _) = probed(&full, &[], NO_ENV);
    let bin = dir.path().join("server");
    stripped_copy(&full, &bin, &[]);
    // The debug file only inside the target's namespace: a private tmpfs on
    // /usr/lib/debug there, filled from a staging tree the host can see. The target runs
    // (600 rounds, killed at the end) until the trace is written, however long that takes:
    // its namespace is reachable only through a live process.
    let staging = dir.path().join("staging");
    let staged = build_id_tree(&staging, &full, &bin);
    let inside = Path::new("/usr/lib/debug").join(staged.strip_prefix(&staging).expect("under"));
    std::fs::create_dir_all("/usr/lib/debug").expect("mount point");
    assert!(!inside.exists(), "{} exists on the host", inside.display());
    let script = format!(
        "mount -t tmpfs lookback-test /usr/lib/debug && mkdir -p {dir} && cp {staged} {inside} \
         && exec {bin} 100 600 wait",
        dir = inside.parent().expect("dir").display(),
        staged = staged.display(),
        inside = inside.display(),
        bin = bin.display(),
    );
    let mut target = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux)");
    let pid = target.id();
    // The namespace is set up once the program runs (sh execs it: the pid stays).
    let exe = Path::new("/proc").join(pid.to_string()).join("exe");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::read_link(&exe).ok().as_deref() != Some(bin.as_path()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the target never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!inside.exists(), "the tmpfs leaked to the host");
    let trace = dir.path().join("trace.json");
    let mut lookback = Command::new(lookback_bin())
        .args([
            "attach",
            "--json",
            "--backend",
            "sampling",
            "--max-snapshots",
            "1",
        ])
        .args([
            "-p",
            &pid.to_string(),
            "--trigger",
            "func:spin_for>50ms",
            "-o",
        ])
        .arg(&trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lookback");
    let stderr = lookback.stderr.take().expect("stderr");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    let mut log = String::new();
    for line in lines.by_ref().map_while(Result::ok) {
        log.push_str(&line);
        log.push('\n');
        if line.contains("waiting for triggers") || line.contains("error") {
            break;
        }
    }
    assert!(
        log.contains(&format!("uprobe on spin_for(long) at /proc/{pid}/root")),
        "{log}"
    );
    assert!(log.contains(&format!("+{offset:#x}")), "{log}");
    // The rest of the log, read while lookback runs (a full pipe would block it).
    let rest = std::thread::spawn(move || {
        lines
            .map_while(Result::ok)
            .map(|l| l + "\n")
            .collect::<String>()
    });
    target
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("release");
    let done = lookback.wait_with_output().expect("lookback");
    log.push_str(&rest.join().expect("log reader"));
    assert!(done.status.success(), "{log}");
    let text = std::fs::read_to_string(&trace).expect("trace written");
    assert!(names_spin_for(&text), "no spin_for slice\n{log}");
    let _ = target.kill();
    let _ = target.wait();
}

// ---- debuginfod: Debian's server on loopback, lookback's client ----

/// `DEBUGINFOD_URLS` = `url`, `DEBUGINFOD_CACHE_PATH` = `cache`, and `extra`.
fn servers<'a>(
    url: &'a str,
    cache: &'a Path,
    extra: &[(&'a str, &'a std::ffi::OsStr)],
) -> Vec<(&'a str, &'a std::ffi::OsStr)> {
    let mut env = vec![
        ("DEBUGINFOD_URLS", os(url)),
        ("DEBUGINFOD_CACHE_PATH", cache.as_os_str()),
    ];
    env.extend_from_slice(extra);
    env
}

/// Debian's debuginfod serving `full`'s debug file from `dir/served`, once it has indexed
/// the build-id `id`; `None` (skip) where it is not installed. Nothing beside the stripped
/// binary links to that file: only the server has it.
fn serve_debug_file_of(full: &Path, dir: &Path, id: &str) -> Option<DebuginfodServer> {
    let files = dir.join("served");
    std::fs::create_dir(&files).expect("mkdir");
    debug_file(full, &files.join("server.debug"));
    let server = DebuginfodServer::serve(&files)?;
    server.wait_for(id);
    Some(server)
}

/// The `symbols` entry of `bin` in a `--json` snapshot line.
fn module_of(line: &Value, bin: &Path) -> Value {
    line["symbols"]
        .as_array()
        .and_then(|m| {
            m.iter()
                .find(|m| m["module"].as_str() == bin.to_str())
                .cloned()
        })
        .unwrap_or_else(|| panic!("no symbols entry for {}: {line}", bin.display()))
}

#[test]
fn a_debuginfod_server_gives_probes_and_names_and_its_cache_outlives_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = full_build(dir.path());
    let (offset, _) = probed(&full, &[], NO_ENV);
    let bin = dir.path().join("server");
    stripped_copy(&full, &bin, &[]);
    let id = build_id(&bin);
    let Some(mut server) = serve_debug_file_of(&full, dir.path(), &id) else {
        return;
    };
    let url = server.url();
    let cache = dir.path().join("cache");
    let env = servers(&url, &cache, &[]);

    // --no-debuginfod: not asked.
    let err = refused(&bin, &["--no-debuginfod"], &env);
    assert!(err.contains("stripped; no debug file at"), "{err}");
    assert!(!cache.join(&id).exists(), "asked despite --no-debuginfod");

    // Asked: the probe lands where the unstripped build's does; the trace names it.
    assert_eq!(probed(&bin, &[], &env), (offset, 2));
    let cached = cache.join(&id).join("debuginfo");
    assert!(cached.is_file(), "{} not cached", cached.display());
    let (trace, _, stderr) = recorded(&bin, "func:spin_for>100ms", &[], &env);
    assert!(names_spin_for(&trace), "no spin_for slice\n{stderr}");

    // The server gone: the cache (elfutils' layout) serves both again.
    server.stop();
    assert_eq!(probed(&bin, &[], &env), (offset, 2));
    let (trace, _, stderr) = recorded(&bin, "func:spin_for>100ms", &[], &env);
    assert!(names_spin_for(&trace), "no spin_for slice\n{stderr}");

    // Down and nothing cached: the error and the trace's hint name the build-id and the
    // server; the trace is written all the same.
    let empty = dir.path().join("empty-cache");
    let env = servers(&url, &empty, &[]);
    let err = refused(&bin, &[], &env);
    let missed = format!("no debug file for build-id {id} from {url}");
    assert!(err.contains(&missed), "{err}");
    let (_, line, stderr) = recorded(&bin, "func:getppid", &[], &env);
    let hint = module_of(&line, &bin)["hint"]
        .as_str()
        .map_or_else(|| panic!("no hint: {line}\n{stderr}"), str::to_owned);
    assert!(hint.contains(&missed), "{hint}");
}

#[test]
fn a_debuginfod_server_that_never_answers_costs_its_timeout_once_and_the_trace_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = full_build(dir.path());
    let bin = dir.path().join("server");
    stripped_copy(&full, &bin, &[]);
    let id = build_id(&bin);
    // Connections are accepted (the kernel's backlog) and never answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("addr"));
    let cache = dir.path().join("cache");
    let env = servers(&url, &cache, &[("DEBUGINFOD_TIMEOUT", os("2"))]);
    let started = std::time::Instant::now();
    let (_, line, stderr) = recorded(&bin, "func:getppid", &[], &env);
    let took = started.elapsed();
    let hint = module_of(&line, &bin)["hint"]
        .as_str()
        .map_or_else(|| panic!("no hint: {line}\n{stderr}"), str::to_owned);
    assert!(
        hint.contains(&format!("no debug file for build-id {id} from {url}")),
        "{hint}"
    );
    // Asked once (placing the probe, then naming the frames: remembered), 2 s each time
    // at most: far from elfutils' default 90 s.
    assert!(
        took < std::time::Duration::from_secs(20),
        "took {took:?}\n{stderr}"
    );
    assert_eq!(requests_in(&stderr), 1, "asked more than once:\n{stderr}");
}

#[test]
fn the_agent_asks_a_rule_s_debuginfod_server_for_its_probe_and_its_names() {
    use lookback_tests::agent::{Agent, files};
    let dir = tempfile::tempdir().expect("tempdir");
    let full = full_build(dir.path());
    let bin = dir.path().join("server");
    stripped_copy(&full, &bin, &[]);
    let id = build_id(&bin);
    let Some(server) = serve_debug_file_of(&full, dir.path(), &id) else {
        return;
    };
    let url = server.url();
    let cache = dir.path().join("cache");
    // The rule names the server; the environment names none.
    let rules = format!(
        r"
version: 1
defaults:
  capture: {{ backend: sampling, buffer_size: 256KiB }}
  snapshot: {{ cooldown: 0s, max_per_hour: 1000 }}
rules:
  - name: slow-spin
    target: {{ comm: server }}
    trigger:
      function: {{ symbol: spin_for, binary: {}, min_duration: 20ms, debuginfod: [{url}] }}
",
        bin.display()
    );
    let cache_path = cache.to_str().expect("UTF-8 path");
    let mut agent = Agent::start_with_env(
        &rules,
        &[],
        &[
            ("DEBUGINFOD_URLS", ""),
            ("DEBUGINFOD_CACHE_PATH", cache_path),
        ],
    );
    assert!(
        cache.join(&id).join("debuginfo").is_file(),
        "ready without the debug file in its cache\n{}",
        agent.log()
    );
    let out = Command::new(&bin)
        .args(["30", "2"])
        .output()
        .expect("the stripped program");
    assert!(out.status.success());
    agent.expect_metric("lookback_triggers_total", &[("rule", "slow-spin")], 2.0);
    // Each snapshot's trigger stack starts in spin_for, named from the served debug file.
    let rule_dir = agent.out().join("slow-spin");
    let metas = agent.poll(std::time::Duration::from_secs(30), |_| {
        let metas: Vec<String> = files(&rule_dir)
            .into_iter()
            .filter(|f| Path::new(f).extension().is_some_and(|e| e == "json"))
            .collect();
        if metas.len() == 2 {
            Ok(metas)
        } else {
            Err(format!(
                "snapshot metadata in {}: {metas:?}",
                rule_dir.display()
            ))
        }
    });
    for name in metas {
        let meta: Value =
            serde_json::from_slice(&std::fs::read(rule_dir.join(&name)).expect("read"))
                .expect("JSON");
        let leaf = &meta["trigger_stack"][0]["function"];
        assert!(
            leaf.as_str().is_some_and(|f| f.starts_with("spin_for")),
            "{meta}"
        );
    }
    let log = agent.log();
    assert_eq!(requests_in(&log), 1, "one build-id, asked once:\n{log}");
    agent.stop_ok();
}
