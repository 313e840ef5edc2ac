//! The workloads of the function-latency tests that need a real toolchain (C++, Rust, Go)
//! or hand-written exits (C with top-level asm): each is compiled once per test process
//! into `target/test-workloads/` and prints what it measured itself (`measured_slow=N`,
//! `result=...`), which [`measured`] reads back.
//!
//! Every build writes a temporary file in that directory and renames it into place, so
//! that test processes building at the same time never run a half-written binary (nor
//! hit "text file busy" overwriting one that another process runs).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::workspace_root;

/// `tests/workloads/throw.cpp` built with `g++ -O1 -g` (default flags otherwise: no frame
/// pointers), for C++ exceptions thrown in and through the probed `_Z4worki`.
///
/// Run it as `throw CALLS THRESHOLD_US`; it prints `measured_slow=`, `thrown=`,
/// `slow_calls=` and `result=` lines.
///
/// # Panics
/// When `g++` is missing (install the Debian package `g++`) or the build fails.
pub fn cxx_throw() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/throw.cpp");
        build(
            "throw",
            "g++",
            "the Debian package g++ (cargo xtask setup does, as root)",
            |out| {
                let mut cmd = Command::new("g++");
                cmd.args(["-O1", "-g", "-o"]).arg(out).arg(&src);
                cmd
            },
        )
    })
    .clone()
}

/// `tests/workloads/panic.rs` built with plain `rustc --edition 2021 -C opt-level=1 -g`
/// (no cargo, no dependencies), for Rust panics in and through the probed `lb_panicky`.
/// The `rustc` is `RUSTC` when set, else the one on PATH.
///
/// Run it as `panic CALLS THRESHOLD_US`; it prints `measured_slow=`, `panicked=`,
/// `slow_calls=` and `result=` lines.
///
/// # Panics
/// When `rustc` is missing (install a Rust toolchain with rustup) or the build fails.
pub fn rust_panic() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/panic.rs");
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        build("panic", "rustc", "a Rust toolchain (rustup)", |out| {
            let mut cmd = Command::new(&rustc);
            cmd.args(["--edition", "2021", "-C", "opt-level=1", "-g", "-o"])
                .arg(out)
                .arg(&src);
            cmd
        })
    })
    .clone()
}

/// `tests/workloads/go/main.go` built with `go build` (Go 1.19 of Debian's `golang-go`
/// will do): `CGO_ENABLED=0`, `GO111MODULE=off`, `GOFLAGS` unset, the build cache and
/// GOPATH under `target/test-workloads/`, no network (`GOPROXY=off`). For the probed
/// `main.slow`, on whose goroutine stack the runtime moves while it runs.
///
/// Run it as `slow CALLS_PER_GOROUTINE THRESHOLD_US`; it prints `measured_slow=`,
/// `slow_calls=`, `stack_moves=`, `thread_switches=` and `result=` lines.
///
/// # Panics
/// When `go` is missing (install the Debian package `golang-go`) or the build fails.
pub fn go_program() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = workspace_root().join("tests/workloads/go");
        let out_dir = out_dir();
        build(
            "slow",
            "go",
            "the Debian package golang-go (cargo xtask setup does, as root)",
            |out| {
                let mut cmd = Command::new("go");
                cmd.current_dir(&dir)
                    .args(["build", "-o"])
                    .arg(out)
                    .arg("main.go")
                    .env_remove("GOFLAGS")
                    .env("GOCACHE", out_dir.join("go-cache"))
                    .env("GOPATH", out_dir.join("go-path"))
                    .env("GO111MODULE", "off")
                    .env("CGO_ENABLED", "0")
                    .env("GOPROXY", "off")
                    .env("GOTOOLCHAIN", "local");
                cmd
            },
        )
    })
    .clone()
}

/// `tests/workloads/exits.c` built with `cc -O1 -g -pthread` (no frame-pointer flags): the
/// probed `lb_jumpy` (longjmp out, threads), `lb_tailer` / `lb_tailer_indirect` (tail
/// jumps), `lb_three_rets` (three `ret`s) and `lb_switch` (an in-function jump table),
/// the last four in top-level asm so the compiler cannot change their exits.
///
/// Run it as `exits MODE ARGS...` (modes in the source's header); every mode prints
/// `measured_slow=`, `slow_calls=` and `result=` lines.
///
/// # Panics
/// When `cc` is missing (install the Debian package `gcc`) or the build fails.
pub fn c_exits() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/exits.c");
        build("exits", "cc", "the Debian package gcc", |out| {
            let mut cmd = Command::new("cc");
            cmd.args(["-O1", "-g", "-pthread", "-o"]).arg(out).arg(&src);
            cmd
        })
    })
    .clone()
}

/// `tests/workloads/names.cpp` built with `g++ -O1 -g`: `shop::Cart::add(int)` (3 calls),
/// `shop::Cart::add(double)` (2), `biggest<int>` (3), `biggest<long>` (2), for the tests of
/// names as C++ people write them.
///
/// # Panics
/// When `g++` is missing (install the Debian package `g++`) or the build fails.
pub fn cxx_names() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/names.cpp");
        build("names-cpp", "g++", "the Debian package g++", |out| {
            let mut cmd = Command::new("g++");
            cmd.args(["-O1", "-g", "-o"]).arg(out).arg(&src);
            cmd
        })
    })
    .clone()
}

/// `tests/workloads/stripped.cpp` built with `g++ -O1 -g` (with a GNU build-id, Debian's
/// default): the static `spin_for(long)` (`_ZL8spin_forl`) the debug-file tests strip away
/// and find again. Run it as `stripped MS ROUNDS [wait]`.
///
/// # Panics
/// When `g++` is missing (install the Debian package `g++`) or the build fails.
pub fn cxx_stripped() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/stripped.cpp");
        build("stripped-cpp", "g++", "the Debian package g++", |out| {
            let mut cmd = Command::new("g++");
            cmd.args(["-O1", "-g", "-Wl,--build-id", "-o"])
                .arg(out)
                .arg(&src);
            cmd
        })
    })
    .clone()
}

/// `tests/workloads/names.rs` built with `rustc` (crate `names`): `names::engine::slow_path`
/// (3 calls), `names::widen` for u8 (3) and u32 (2), `<names::Square as names::Shape>::area`
/// (4), for the tests of names as Rust people write them.
///
/// # Panics
/// When `rustc` is missing or the build fails.
pub fn rust_names() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/names.rs");
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        build("names-rs", "rustc", "a Rust toolchain (rustup)", |out| {
            let mut cmd = Command::new(&rustc);
            cmd.args(["--edition", "2021", "-C", "opt-level=1", "-g"])
                .args(["--crate-name", "names", "-o"])
                .arg(out)
                .arg(&src);
            cmd
        })
    })
    .clone()
}

/// `tests/workloads/deep.c` built with plain `cc -O2` (no frame pointers, as distributions
/// build C): `main` → `level1` → `level2` → `level3` → `handle` → `leaf_work`. Run it as
/// `deep CALLS SLOW_INDEX [SLOW_ITERS]`.
///
/// # Panics
/// When `cc` is missing (install the Debian package `gcc`) or the build fails.
pub fn c_deep() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/deep.c");
        build("deep-c", "cc", "the Debian package gcc", |out| {
            let mut cmd = Command::new("cc");
            cmd.args(["-O2", "-o"]).arg(out).arg(&src);
            cmd
        })
    })
    .clone()
}

/// `tests/workloads/deep.c` built with `cc -O2 -g -fno-asynchronous-unwind-tables
/// -fno-unwind-tables`: its CFI is in `.debug_frame` only (its `.eh_frame` holds the C
/// runtime's `_start` and the PLT), as some C projects and embedded builds ship; stripped,
/// it has none. Run it as `deep CALLS SLOW_INDEX [SLOW_ITERS]`.
///
/// # Panics
/// When `cc` is missing (install the Debian package `gcc`) or the build fails.
pub fn c_deep_without_unwind_tables() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/deep.c");
        build(
            "deep-c-debug-frame",
            "cc",
            "the Debian package gcc",
            |out| {
                let mut cmd = Command::new("cc");
                cmd.args(["-O2", "-g", "-fno-asynchronous-unwind-tables"])
                    .args(["-fno-unwind-tables", "-o"])
                    .arg(out)
                    .arg(&src);
                cmd
            },
        )
    })
    .clone()
}

/// `tests/workloads/offcpu.c` built with plain `cc -O2`: `handle()` (0.3 ms; 15 ms once)
/// alternating with 5 ms sleeps. Run it as `offcpu CALLS SLOW_INDEX`; it prints
/// `call=START_NS DURATION_NS` per call.
///
/// # Panics
/// When `cc` is missing (install the Debian package `gcc`) or the build fails.
pub fn c_offcpu() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/offcpu.c");
        build("offcpu-c", "cc", "the Debian package gcc", |out| {
            let mut cmd = Command::new("cc");
            cmd.args(["-O2", "-o"]).arg(out).arg(&src);
            cmd
        })
    })
    .clone()
}

/// `tests/workloads/causes.c` built with `cc -O2 -g -fno-optimize-sibling-calls
/// -pthread`: `handle_request()` slow once, for a cause the caller picks (a sleep, a spin,
/// a held mutex, fsyncs, ...), inside a helper named for it. Run it as `causes MODE CALLS
/// SLOW [DIR]`; it prints `slow=START_NS DURATION_NS`.
///
/// # Panics
/// When `cc` is missing (install the Debian package `gcc`) or the build fails.
pub fn c_causes() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/causes.c");
        build("causes-c", "cc", "the Debian package gcc", |out| {
            let mut cmd = Command::new("cc");
            cmd.args(["-O2", "-g", "-fno-optimize-sibling-calls", "-pthread", "-o"])
                .arg(out)
                .arg(&src);
            cmd
        })
    })
    .clone()
}

/// `tests/workloads/deep.rs` built as a release build (`rustc -C opt-level=3`, crate
/// `deep`; no frame pointers): `deep::main` → `deep::level1` → ... → `deep::handle` →
/// `deep::leaf_work`. Run it as `deep CALLS SLOW_INDEX [SLOW_ITERS]`.
///
/// # Panics
/// When `rustc` is missing or the build fails.
pub fn rust_deep() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = workspace_root().join("tests/workloads/deep.rs");
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        build("deep-rs", "rustc", "a Rust toolchain (rustup)", |out| {
            let mut cmd = Command::new(&rustc);
            cmd.args(["--edition", "2021", "-C", "opt-level=3"])
                .args(["--crate-name", "deep", "-o"])
                .arg(out)
                .arg(&src);
            cmd
        })
    })
    .clone()
}

/// `tests/workloads/inflight.c` built with `cc -O2 -g -pthread` (no frame pointers): the
/// calls of the in-flight latency tests (`--detect running`), one mode per probed function
/// (`lb_transfer` deadlocks, `lb_wait_pipe` reads for ever, `lb_maybe_slow`, `lb_spin`,
/// `lb_rec`, `lb_fast` beside its slow sibling, `lb_jump_through` left by longjmp). Run it
/// as `inflight MODE ARGS...` (modes in the source's header); the modes that end print
/// `call=TID START_NS DURATION_NS` per call, `slow_calls=` and `result=`.
///
/// # Panics
/// When `cc` is missing (install the Debian package `gcc`) or the build fails.
pub fn c_inflight() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| compiled("inflight", "cc", &["-O2", "-g", "-pthread"]))
        .clone()
}

/// `tests/workloads/inflight_throw.cpp` built with `g++ -O2 -g`: the probed `lb_throws`
/// (extern "C") ends in an exception every time, and `lb_slow_after` runs next from the
/// same call instruction. Run it as `inflight_throw ROUNDS`; it prints `thrown=`,
/// `slow_calls=` and `result=`.
///
/// # Panics
/// When `g++` is missing (install the Debian package `g++`) or the build fails.
pub fn cxx_inflight_throw() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| compiled("inflight_throw", "g++", &["-O2", "-g"]))
        .clone()
}

/// `tests/workloads/inflight_panic.rs` built with `rustc --edition 2021 -C opt-level=2 -g`
/// (`RUSTC` when set): the probed `lb_panics` (`#[no_mangle]`) ends in a panic caught by
/// `catch_unwind` every time, and `lb_slow_after` runs next from the same closure. Run it
/// as `inflight_panic ROUNDS`; it prints `panicked=`, `slow_calls=` and `result=`.
///
/// # Panics
/// When `rustc` is missing (install a Rust toolchain with rustup) or the build fails.
pub fn rust_inflight_panic() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let src = workspace_root().join("tests/workloads/inflight_panic.rs");
        build(
            "inflight_panic",
            "rustc",
            "a Rust toolchain (rustup)",
            |out| {
                let mut cmd = Command::new(&rustc);
                cmd.args(["--edition", "2021", "-C", "opt-level=2", "-g", "-o"])
                    .arg(out)
                    .arg(&src);
                cmd
            },
        )
    })
    .clone()
}

/// `tests/workloads/NAME.c` or `NAME.cpp` (by `compiler`: `cc` or `g++`) built with
/// `compiler FLAGS... -o OUT SOURCE` into `target/test-workloads/NAME`.
fn compiled(name: &str, compiler: &str, flags: &[&str]) -> PathBuf {
    let ext = if compiler == "g++" { "cpp" } else { "c" };
    let src = workspace_root().join(format!("tests/workloads/{name}.{ext}"));
    let package = if compiler == "g++" {
        "the Debian package g++"
    } else {
        "the Debian package gcc"
    };
    build(name, compiler, package, |out| {
        let mut cmd = Command::new(compiler);
        cmd.args(flags).arg("-o").arg(out).arg(&src);
        cmd
    })
}

/// Runs `program args` to completion without lookback and returns its stdout: the
/// reference a traced run is compared with.
///
/// # Panics
/// When it cannot be started or does not exit 0.
pub fn run_plain(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect("running");
    assert!(
        out.status.success(),
        "{} {args:?}: {}\n{}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value `N` of the first `KEY=N` line in a workload's stdout: what the workload
/// measured itself, to compare with what lookback reported.
///
/// # Panics
/// When no line is `KEY=` followed by a number (the output is in the message).
pub fn measured(stdout: &str, key: &str) -> u64 {
    stdout
        .lines()
        .find_map(|line| {
            line.strip_prefix(key)?
                .strip_prefix('=')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {key}=N line in the workload's output:\n{stdout}"))
}

fn out_dir() -> PathBuf {
    workspace_root().join("target/test-workloads")
}

/// Builds `target/test-workloads/NAME` with the command `compile(temporary output)`, then
/// renames it into place. `tool` names the compiler and `package` what installs it, for
/// the message when it is missing.
fn build(name: &str, tool: &str, package: &str, compile: impl FnOnce(&Path) -> Command) -> PathBuf {
    let dir = out_dir();
    std::fs::create_dir_all(&dir).expect("creating target/test-workloads");
    let bin = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut cmd = compile(&tmp);
    let status = match cmd.status() {
        Ok(status) => status,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("{tool} not found, needed to build the {name} test workload: install {package}")
        }
        Err(e) => panic!("running {cmd:?}: {e}"),
    };
    assert!(status.success(), "{cmd:?} failed: {status}");
    std::fs::rename(&tmp, &bin)
        .unwrap_or_else(|e| panic!("renaming {} to {}: {e}", tmp.display(), bin.display()));
    bin
}
