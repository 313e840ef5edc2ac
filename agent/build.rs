//! Builds the eBPF programs (agent-ebpf) for the BPF target with aya-build, the
//! aya-template way, and makes that work from a plain `cargo build`:
//! - `bpf-linker` is looked up in the project-local tools dir that `cargo xtask setup`
//!   fills, so no global install is needed;
//! - the toolchain is `nightly` when installed, else the current one with
//!   `RUSTC_BOOTSTRAP=1` (the BPF target is tier 3 and needs `-Z build-std=core`).
//!   `LOOKBACK_EBPF_TOOLCHAIN` overrides the choice.
use std::{env, path::PathBuf, process::Command};

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir
        .parent()
        .ok_or_else(|| anyhow!("agent crate has no parent directory"))?;
    let tools_bin = workspace.join(".tools").join("bin");
    println!("cargo:rerun-if-env-changed=LOOKBACK_EBPF_TOOLCHAIN");
    println!("cargo:rerun-if-changed={}", tools_bin.display());

    let path = env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![tools_bin];
    paths.extend(env::split_paths(&path));
    let path = env::join_paths(paths).context("PATH")?;

    let toolchain = env::var("LOOKBACK_EBPF_TOOLCHAIN").unwrap_or_else(|_| {
        let nightly = Command::new("rustup")
            .args(["run", "nightly", "rustc", "--version"])
            .output()
            .is_ok_and(|o| o.status.success());
        if nightly {
            "nightly".to_owned()
        } else {
            "stable".to_owned()
        }
    });
    // SAFETY: build scripts are single-threaded; aya-build reads these variables and
    // passes them to the cargo it spawns for the BPF target.
    unsafe {
        env::set_var("PATH", path);
        if toolchain != "nightly" && env::var_os("RUSTC_BOOTSTRAP").is_none() {
            env::set_var("RUSTC_BOOTSTRAP", "1");
        }
    }
    let root_dir = workspace.join("agent-ebpf");
    let root_dir = root_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 workspace path"))?;
    let toolchain = if toolchain == "nightly" {
        Toolchain::Nightly
    } else {
        Toolchain::Custom(&toolchain)
    };
    aya_build::build_ebpf(
        [Package {
            name: "lookback-ebpf",
            root_dir,
            ..Package::default()
        }],
        toolchain,
    )
}
