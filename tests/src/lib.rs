//! Shared helpers for the integration tests: where the workspace is, and the `lookback`
//! binary (built once per test process with `cargo build -p lookback`, or taken from
//! `LOOKBACK_BIN`).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
};

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
    let output = Command::new(cargo)
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
