//! Stacks without frame pointers, end to end: programs built the way users build them
//! (`gcc -O2`, a Rust release build, Debian's `redis-server`) traced by the `lookback`
//! binary with the sampling backend, each sample's stack copy unwound with the binaries'
//! CFI, and the depth compared side by side with `perf record --call-graph dwarf` +
//! `perf script` (Debian `linux-perf`, installed by `cargo xtask setup`) on the same
//! program at the same frequency. Needs root.

use std::{path::Path, process::Command};

use lookback::{
    decode::samples,
    snapshot::{self, Snapshot},
    unwind::StackUnwinder,
};
use lookback_tests::{
    can_run, chrome_events, debian_redis_server, free_port, lookback_bin, open_at_instant,
    succeeded, toolchains,
};
use serde_json::Value;

/// The sampling frequency of both recorders.
const HZ: &str = "4000";

/// A traced run: its trace (Chrome JSON), the kept snapshot, lookback's stderr.
struct Traced {
    doc: Value,
    snap: Snapshot,
    stderr: String,
}

/// `lookback run --trigger RULE` of `program args` with `extra` flags, the trace and the
/// raw snapshot kept in `dir`.
fn traced(dir: &Path, rule: &str, extra: &[&str], program: &Path, args: &[&str]) -> Traced {
    traced_with_env(dir, rule, extra, program, args, &[])
}

/// [`traced`] with `env` set for lookback.
fn traced_with_env(
    dir: &Path,
    rule: &str,
    extra: &[&str],
    program: &Path,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Traced {
    let trace = dir.join("trace.json");
    let out = succeeded(
        Command::new(lookback_bin())
            .envs(env.iter().copied())
            .args(["run", "--backend", "sampling", "--sample-frequency", HZ])
            .args(["--keep-raw", "--trigger", rule])
            .args(extra)
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(program)
            .args(args),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc = serde_json::from_slice(&std::fs::read(&trace).expect("the trace")).expect("JSON");
    let snap = snapshot::read(&dir.join("trace.lbsnap")).expect("the kept snapshot");
    Traced { doc, snap, stderr }
}

/// The stack depth (frames, inlined ones not counted) of every sample of the triggering
/// process in `snap`, unwound as the trace writer does.
fn our_depths(snap: &Snapshot) -> Vec<usize> {
    our_depths_through(snap, None)
}

/// [`our_depths`] of the samples with a frame in `through` (an address range), or all.
fn our_depths_through(snap: &Snapshot, through: Option<(u64, u64)>) -> Vec<usize> {
    depths_with(snap, through, StackUnwinder::new(&snap.maps, &snap.code))
}

/// The depths of the samples of the triggering process in `snap` (of those with a frame
/// in `through`, or all), unwound by `unwinder`.
fn depths_with(
    snap: &Snapshot,
    through: Option<(u64, u64)>,
    mut unwinder: StackUnwinder<'_>,
) -> Vec<usize> {
    let pid = snap.meta.trigger.as_ref().map_or(0, |t| t.pid);
    let sampled = samples::read_with(snap, &mut |pid, regs, stack| {
        unwinder.unwind(pid, regs, stack)
    });
    sampled
        .threads
        .values()
        .filter(|t| t.pid == pid)
        .flat_map(|t| &t.stacks)
        .filter(|s| through.is_none_or(|(lo, hi)| s.addrs.iter().any(|a| (lo..hi).contains(a))))
        .map(|s| s.addrs.len())
        .collect()
}

/// `perf record -e cpu-clock:u --call-graph dwarf` of `program args` at [`HZ`], and the
/// user stack depth of each of its samples in `perf script --no-inline`; samples of
/// processes named other than `comm` (perf's own before the exec) left out.
fn perf_depths(dir: &Path, comm: &str, program: &Path, args: &[&str]) -> Vec<usize> {
    let data = dir.join("perf.data");
    perf_record(&data, program, args, || {});
    perf_script_depths(&data, comm, None)
}

/// Runs `perf record -e cpu-clock:u --call-graph dwarf` at [`HZ`] of `program args` into
/// `data`, calling `during` once the command runs (it must make the command exit).
fn perf_record(data: &Path, program: &Path, args: &[&str], during: impl FnOnce()) {
    let mut child = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock:u", "-F", HZ])
        .args(["--call-graph", "dwarf,8192", "-o"])
        .arg(data)
        .arg("--")
        .arg(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("perf: {e} (install the Debian package linux-perf: cargo xtask setup)")
        });
    during();
    let status = child.wait().expect("perf record");
    assert!(status.success(), "perf record: {status}");
}

/// The user stack depth of each sample of processes named `comm` in `perf script
/// --no-inline` of `data`, of those with a frame named `through` when given.
fn perf_script_depths(data: &Path, comm: &str, through: Option<&str>) -> Vec<usize> {
    let out = Command::new("perf")
        .args(["script", "--no-inline", "-F", "comm,ip,sym", "-i"])
        .arg(data)
        .output()
        .expect("perf script");
    assert!(
        out.status.success(),
        "perf script: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split("\n\n")
        .filter_map(|block| {
            let mut lines = block.lines().filter(|l| !l.trim().is_empty());
            let header = lines.next()?;
            let frames: Vec<&str> = lines.collect();
            let through_it = through.is_none_or(|name| {
                frames
                    .iter()
                    .any(|f| f.split_whitespace().nth(1) == Some(name))
            });
            (header.trim() == comm && through_it).then_some(frames.len())
        })
        .collect()
}

fn median(mut depths: Vec<usize>) -> usize {
    assert!(!depths.is_empty(), "no samples");
    depths.sort_unstable();
    depths[depths.len() / 2]
}

/// Prints a depth comparison for the verification notes.
#[expect(
    clippy::print_stderr,
    reason = "the numbers behind docs/verification.md"
)]
fn report(what: &str, ours: usize, perf: usize) {
    eprintln!("median stack depth, {what}: lookback {ours}, perf --call-graph dwarf {perf}");
}

/// Whether `names` holds `wanted` in this order (other names between them allowed).
fn in_order(names: &[String], wanted: &[&str]) -> bool {
    let mut rest = names.iter();
    wanted.iter().all(|w| rest.any(|n| n == w))
}

/// The file name of `program`, as perf's `comm` shows it.
fn comm_of(program: &Path) -> String {
    program
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(15).collect())
        .unwrap_or_default()
}

/// The C or Rust `deep` workload: at the trigger `handle` and its three callers are open,
/// samples are as deep as perf's, and the frame-pointer recorder (`--stack-size 0`) is
/// not (so the deep stacks come from the unwinding, not from the compiler).
fn deep_program_has_deep_stacks(program: &Path, names: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let probed = names.last().expect("the probed function");
    let rule = format!("func:{probed}>20ms");
    let args = ["200", "180"];
    let run = traced(dir.path(), &rule, &[], program, &args);
    let open = open_at_instant(chrome_events(&run.doc), &format!("trigger: {rule}"));
    assert!(
        in_order(&open, names),
        "open at the trigger: {open:?}, wanted {names:?} in order\n{}",
        run.stderr
    );
    let ours = median(our_depths(&run.snap));
    let perf = median(perf_depths(dir.path(), &comm_of(program), program, &args));
    report(&comm_of(program), ours, perf);
    assert!(
        ours >= perf && ours > names.len(),
        "median stack depth: ours {ours}, perf --call-graph dwarf {perf}"
    );

    let fp_dir = tempfile::tempdir().expect("tempdir");
    let fp = traced(fp_dir.path(), &rule, &["--stack-size", "0"], program, &args);
    let fp_depth = median(our_depths(&fp.snap));
    report(
        &format!("{} with --stack-size 0", comm_of(program)),
        fp_depth,
        perf,
    );
    assert!(
        fp_depth < names.len(),
        "frame-pointer callchains are {fp_depth} deep: the program keeps frame pointers, \
         and this test shows nothing"
    );
}

#[test]
fn gcc_o2_code_without_frame_pointers_unwinds_to_main() {
    if !can_run("gcc_o2_code_without_frame_pointers_unwinds_to_main") {
        return;
    }
    deep_program_has_deep_stacks(
        &toolchains::c_deep(),
        &["main", "level1", "level2", "level3", "handle"],
    );
}

#[test]
fn a_rust_release_build_unwinds_to_main() {
    if !can_run("a_rust_release_build_unwinds_to_main") {
        return;
    }
    deep_program_has_deep_stacks(
        &toolchains::rust_deep(),
        &[
            "deep::main",
            "deep::level1",
            "deep::level2",
            "deep::level3",
            "deep::handle",
        ],
    );
}

/// The CFI sections `path` has: `(.eh_frame bytes, .debug_frame present)`.
fn cfi_of(path: &Path) -> (u64, bool) {
    use object::{Object as _, ObjectSection as _};
    let data = std::fs::read(path).expect("the binary");
    let file = object::File::parse(&*data).expect("ELF");
    (
        file.section_by_name(".eh_frame").map_or(0, |s| s.size()),
        file.section_by_name(".debug_frame").is_some(),
    )
}

/// Prints the depths of the debug-frame test for the verification notes.
#[expect(
    clippy::print_stderr,
    reason = "the numbers behind docs/verification.md"
)]
fn report_debug_frame(strip: &str, deep: usize, own: usize) {
    eprintln!(
        "{strip}: median stack depth with the debug file's .debug_frame {deep}, own CFI {own}"
    );
}

/// `objcopy ARGS`, which must succeed.
fn objcopy(args: &[&std::ffi::OsStr]) {
    succeeded(Command::new("objcopy").args(args));
}

#[test]
fn a_stripped_binary_without_unwind_tables_unwinds_with_the_debug_frame_a_debuginfod_server_has() {
    if !can_run(
        "a_stripped_binary_without_unwind_tables_unwinds_with_the_debug_frame_a_debuginfod_server_has",
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let full = toolchains::c_deep_without_unwind_tables();
    let (eh_frame, debug_frame) = cfi_of(&full);
    assert!(
        debug_frame && eh_frame < 512,
        "{}: .eh_frame {eh_frame} bytes, .debug_frame {debug_frame}: not the build this test \
         needs (CFI in .debug_frame only)",
        full.display()
    );
    // Only the server has the debug file, with the symbols and the .debug_frame,
    // compressed as distributions ship them (Debian's dh_strip).
    let served = dir.path().join("served");
    std::fs::create_dir(&served).expect("mkdir");
    let debug = served.join("deep.debug");
    objcopy(&[
        "--only-keep-debug".as_ref(),
        "--compress-debug-sections=zlib".as_ref(),
        full.as_os_str(),
        debug.as_os_str(),
    ]);
    assert!(
        compressed_debug_frame(&debug),
        "objcopy did not compress .debug_frame"
    );
    let Some(debuginfod) = lookback_tests::debuginfod::DebuginfodServer::serve(&served) else {
        return;
    };
    debuginfod.wait_for(&lookback_tests::debuginfod::build_id(&full));
    let url = debuginfod.url();
    // --strip-all: no symbols, no CFI; --strip-debug (gdb's recipe): .symtab kept, the
    // debug file still asked for its .debug_frame.
    for strip in ["--strip-all", "--strip-debug"] {
        let run_dir = dir.path().join(strip.trim_start_matches('-'));
        std::fs::create_dir(&run_dir).expect("mkdir");
        let bin = run_dir.join("deep");
        objcopy(&[strip.as_ref(), full.as_os_str(), bin.as_os_str()]);
        assert!(!cfi_of(&bin).1, "{strip} kept .debug_frame");
        let cache = run_dir.join("cache");
        let env = [
            ("DEBUGINFOD_URLS", url.as_ref()),
            ("DEBUGINFOD_CACHE_PATH", cache.as_os_str()),
        ];
        let names = ["main", "level1", "level2", "level3", "handle"];
        let rule = "func:handle>20ms";
        let run = traced_with_env(&run_dir, rule, &[], &bin, &["200", "180"], &env);
        // The same samples: deep with the debug file's CFI, shallow with the binary's own.
        let config = lookback::elf::debuginfod::Config {
            urls: vec![url.clone()],
            cache: cache.clone(),
            timeout: std::time::Duration::from_secs(10),
            max_time: std::time::Duration::from_secs(50),
            max_size: 1 << 30,
        };
        let with = StackUnwinder::new(&run.snap.maps, &run.snap.code)
            .with_debug_files(Vec::new(), Some(config));
        let deep = median(depths_with(&run.snap, None, with));
        let own = median(our_depths(&run.snap));
        report_debug_frame(strip, deep, own);
        let open = open_at_instant(chrome_events(&run.doc), &format!("trigger: {rule}"));
        assert!(
            in_order(&open, &names),
            "{strip}: open at the trigger: {open:?}, wanted {names:?} in order\n{}",
            run.stderr
        );
        assert!(
            deep > names.len() && own < names.len(),
            "{strip}: median depth with the debug file's .debug_frame {deep}, with the \
             binary's own CFI {own}"
        );
    }
}

/// Whether the `.debug_frame` of the ELF file at `path` is a compressed section.
fn compressed_debug_frame(path: &Path) -> bool {
    use object::{Object as _, ObjectSection as _};
    let data = std::fs::read(path).expect("the debug file");
    let file = object::File::parse(&*data).expect("ELF");
    file.section_by_name(".debug_frame")
        .and_then(|s| s.compressed_file_range().ok())
        .is_some_and(|r| r.format != object::CompressionFormat::None)
}

/// `redis-cli -p PORT args...`'s stdout.
fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli (Debian redis-tools, with redis-server)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits for the redis on `port` to answer, sends it a Lua script that keeps it busy for
/// tens of milliseconds in `evalGenericCommand`, and shuts it down.
fn busy_redis(port: u16) {
    let ready = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        redis_cli(port, &["ping"]).contains("PONG")
    });
    assert!(ready, "redis on port {port} did not answer");
    let sum = redis_cli(
        port,
        &[
            "eval",
            "local x=0 for i=1,5000000 do x=x+i end return x",
            "0",
        ],
    );
    assert_eq!(sum.trim(), "12500002500000", "the script ran");
    redis_cli(port, &["shutdown", "nosave"]);
}

/// The arguments of a throwaway redis on `port`.
fn redis_args(port: u16) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect()
}

#[test]
fn debian_redis_server_shows_the_callers_of_a_slow_command() {
    if !can_run("debian_redis_server_shows_the_callers_of_a_slow_command") {
        return;
    }
    let redis = debian_redis_server();
    let dir = tempfile::tempdir().expect("tempdir");
    let rule = "func:evalGenericCommand>20ms";
    let port = free_port();
    let trace = dir.path().join("trace.json");
    let lookback = Command::new(lookback_bin())
        .args(["run", "--backend", "sampling", "--sample-frequency", HZ])
        .args(["--keep-raw", "--trigger", rule, "-o"])
        .arg(&trace)
        .arg("--")
        .arg(redis)
        .args(redis_args(port))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("lookback");
    busy_redis(port);
    let out = lookback.wait_with_output().expect("lookback");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let doc: Value = serde_json::from_slice(&std::fs::read(&trace).expect("trace")).expect("JSON");
    let open = open_at_instant(chrome_events(&doc), &format!("trigger: {rule}"));
    // The call path of a command in redis 7: the event loop, the client's input, the
    // command table's `call`, the command.
    assert!(
        in_order(
            &open,
            &[
                "main",
                "aeMain",
                "readQueryFromClient",
                "processCommand",
                "call",
                "evalGenericCommand"
            ]
        ),
        "open at the trigger: {open:?}\n{stderr}"
    );

    // Side by side with perf on another redis: the samples inside the script.
    let snap = snapshot::read(&dir.path().join("trace.lbsnap")).expect("snapshot");
    let real = redis.canonicalize().expect("redis-server's file");
    let maps = snap
        .maps
        .iter()
        .find(|m| Some(m.pid) == snap.meta.trigger.as_ref().map(|t| t.pid));
    let eval = maps
        .and_then(|maps| lookback_tests::symbol_range(&real, maps, "evalGenericCommand"))
        .expect("evalGenericCommand in the snapshot's maps");
    let ours = median(our_depths_through(&snap, Some(eval)));
    let perf_port = free_port();
    let data = dir.path().join("perf.data");
    let args = redis_args(perf_port);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    perf_record(&data, redis, &args, || busy_redis(perf_port));
    let perf = median(perf_script_depths(
        &data,
        "redis-server",
        Some("evalGenericCommand"),
    ));
    report("redis-server in evalGenericCommand", ours, perf);
    assert!(
        ours >= perf,
        "median stack depth inside evalGenericCommand: ours {ours}, perf --call-graph dwarf {perf}"
    );
}
