//! Helpers shared by the tasks: the workspace root, running commands with the build
//! environment, root detection.
use std::{
    env,
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// What `setup` established and every later step needs.
#[derive(Debug, Clone)]
pub struct BuildEnv {
    /// Workspace root.
    pub root: PathBuf,
    /// The toolchain that builds the eBPF crate (`nightly`, or `stable` + `RUSTC_BOOTSTRAP`).
    pub ebpf_toolchain: String,
    /// PATH with `.tools/bin` first.
    pub path: OsString,
    /// Whether we run as root (privileged tests and the demo need it).
    pub is_root: bool,
}

impl BuildEnv {
    /// A `cargo` command in the workspace with this environment.
    pub fn cargo(&self) -> Command {
        let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.current_dir(&self.root)
            .env("PATH", &self.path)
            .env("LOOKBACK_EBPF_TOOLCHAIN", &self.ebpf_toolchain);
        cmd
    }

    /// The release `lookback` binary.
    pub fn release_bin(&self) -> PathBuf {
        self.root.join("target/release/lookback")
    }

    /// The release `lookback-pt` binary (the decoder's developer views).
    pub fn pt_tool_bin(&self) -> PathBuf {
        self.root.join("target/release/lookback-pt")
    }
}

/// The workspace root (parent of the xtask crate). Where the xtask binary was built is
/// the answer under cargo; a binary carried to another machine (`pt-smoke` where no
/// cargo is) finds the checkout from the current directory up instead.
pub fn workspace_root() -> Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if manifest.join("Cargo.toml").is_file() {
        return manifest
            .parent()
            .map(Path::to_path_buf)
            .context("xtask has no parent directory");
    }
    let cwd = env::current_dir().context("reading the current directory")?;
    cwd.ancestors()
        .find(|dir| dir.join("xtask/Cargo.toml").is_file())
        .map(Path::to_path_buf)
        .with_context(|| {
            format!(
                "no lookback checkout at or above {} (and {} is gone)",
                cwd.display(),
                manifest.display()
            )
        })
}

/// Runs a command, failing with its command line when it does not exit 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs a command and returns its trimmed stdout, or None when it fails.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Effective uid 0, read from /proc (no libc dependency).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Builds the workspace (debug, all targets) and, with `release`, the release binary.
pub fn build(env: &BuildEnv, release: bool) -> Result<()> {
    // The eBPF crate builds only for the BPF target (agent/build.rs does that).
    run(env.cargo().args([
        "build",
        "--workspace",
        "--exclude",
        "lookback-ebpf",
        "--all-targets",
    ]))?;
    if release {
        run(env.cargo().args(["build", "--release", "-p", "lookback"]))?;
    }
    Ok(())
}

/// `cargo xtask pt ARGS`: builds the release `lookback-pt` and runs it with `args`; its
/// exit code is ours.
pub fn pt_tool(env: &BuildEnv, args: &[String]) -> Result<std::process::ExitCode> {
    run(env.cargo().args([
        "build",
        "--release",
        "-p",
        "lookback",
        "--bin",
        "lookback-pt",
    ]))?;
    let status = Command::new(env.pt_tool_bin())
        .args(args)
        .status()
        .context("running lookback-pt")?;
    Ok(std::process::ExitCode::from(
        status
            .code()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(1),
    ))
}
