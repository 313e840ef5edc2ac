//! Helpers of the tests of recordings lookback did not make (`decode_inputs.rs`,
//! `decode_sideband.rs`): libipt's corpus, code linked into ELF files by gcc, the
//! public real recordings, perf, and reading the traces written.
//!
//! # Panics
//! The helpers panic (failing the test) where a tool they run fails.
#![expect(
    clippy::missing_panics_doc,
    reason = "test helpers: a panic fails the test"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use object::{Object as _, ObjectSegment as _};
use serde_json::Value;

use crate::workspace_root;

/// libipt's conformance corpus of core traces (`../shared/corpus/libipt/core`).
#[must_use]
pub fn corpus() -> PathBuf {
    workspace_root().join("../shared/corpus/libipt/core")
}

/// A command's stdout and stderr, for messages.
#[must_use]
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Per thread name: the (name, depth) of its slices.
#[must_use]
pub fn slices(doc: &Value) -> BTreeMap<String, Vec<(String, u64)>> {
    doc["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .map(|t| {
            let slices = t["slices"]
                .as_array()
                .expect("slices")
                .iter()
                .map(|s| {
                    (
                        s["name"].as_str().unwrap_or_default().to_owned(),
                        s["depth"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            (t["name"].as_str().unwrap_or_default().to_owned(), slices)
        })
        .collect()
}

/// An ELF file with the code of a libipt case, its bytes `[0, 8)` function `outer` and
/// `[8, 10)` function `callee`, its text linked at `text_at`.
#[must_use]
pub fn call_elf(dir: &Path, text_at: u64) -> PathBuf {
    let bin = corpus().join("call_direct-ret_compressed.bin");
    let source = dir.join("call.s");
    std::fs::write(
        &source,
        format!(
            ".text\n.globl outer\n.type outer,@function\nouter:\n.incbin \"{bin}\", 0, 8\n.size outer, 8\n\
             .globl callee\n.type callee,@function\ncallee:\n.incbin \"{bin}\", 8, 2\n.size callee, 2\n",
            bin = bin.display()
        ),
    )
    .expect("write call.s");
    let elf = dir.join(format!("call-{text_at:x}.elf"));
    let out = Command::new("gcc")
        .args([
            "-nostdlib",
            "-static",
            "-no-pie",
            "-Wl,--build-id",
            "-Wl,-e,outer",
        ])
        .arg(format!("-Wl,-Ttext={text_at:#x}"))
        .arg("-o")
        .arg(&elf)
        .arg(&source)
        .output()
        .expect("gcc");
    assert!(out.status.success(), "gcc: {}", text(&out));
    elf
}

/// The lowest address of `elf`'s loadable segments (where ptxed's BASE puts it).
#[must_use]
pub fn lowest_segment(elf: &Path) -> u64 {
    let bytes = std::fs::read(elf).expect("read elf");
    let file = object::File::parse(&*bytes).expect("parse elf");
    file.segments()
        .map(|s| s.address())
        .min()
        .expect("segments")
}

/// Whether `perf` runs here; on CI it must (`cargo xtask setup` installs linux-perf).
#[must_use]
pub fn have_perf() -> bool {
    let ok = Command::new("perf")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "perf is missing on CI"
    );
    ok
}

/// A skipped test says why.
pub fn skipped(why: &str) {
    #[expect(clippy::print_stderr, reason = "a skipped test says why")]
    {
        eprintln!("skipped: {why}");
    }
}

/// The directory of public real Intel PT recordings, when there is one.
#[must_use]
pub fn real_traces() -> Option<PathBuf> {
    let dir = std::env::var_os("LOOKBACK_REAL_TRACES")
        .map_or_else(|| workspace_root().join("../real-traces"), PathBuf::from);
    if dir.is_dir() {
        return Some(dir);
    }
    skipped(&format!(
        "no real Intel PT recordings in {} (LOOKBACK_REAL_TRACES)",
        dir.display()
    ));
    None
}
