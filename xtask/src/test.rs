//! `cargo xtask test` and `cargo xtask lint`.
//!
//! Tests run in two passes: unit tests of every crate (parallel), then the privileged
//! integration tests of `lookback-tests` one at a time (they share kernel state: BPF maps,
//! uprobes, tracefs). Output streams through; the pass/fail counts of every test binary are
//! summed into one closing line.
use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::util::{BuildEnv, run};

/// The external-corpus conformance tests; they print their counts (`libipt ... corpus: N
/// passed, ...`, `magic-trace fixtures: N matched, ...`, `libipt corpus → PT snapshot →
/// trace: N cases matched ...`), so they run with `--nocapture`.
const CORPUS_TESTS: [&str; 3] = [
    "decode::pt::tools::conformance",
    "stacks::branches::tests::magic_trace_fixtures",
    "writer::pt_tests::libipt_corpus_flows",
];

#[derive(Debug, Default)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

pub fn test(env: &BuildEnv, extra: &[String]) -> Result<()> {
    if !env.is_root {
        bail!(
            "the integration tests load BPF programs and attach uprobes: run as root \
             (sudo -E cargo xtask test)"
        );
    }
    let mut totals = Totals::default();
    let mut failures = Vec::new();
    let mut unit = env.cargo();
    unit.args([
        "test",
        "--workspace",
        "--exclude",
        "lookback-tests",
        "--exclude",
        "lookback-ebpf",
    ])
    .arg("--")
    .args(CORPUS_TESTS.iter().flat_map(|t| ["--skip", t]))
    .args(extra);
    if let Err(e) = run_counted(&mut unit, &mut totals) {
        failures.push(format!("unit tests: {e:#}"));
    }
    // The corpus conformance tests print their pass counts: show them.
    let mut corpus = env.cargo();
    corpus
        .args(["test", "-p", "lookback", "--lib", "--"])
        .args(CORPUS_TESTS)
        .arg("--nocapture")
        .args(extra);
    if let Err(e) = run_counted(&mut corpus, &mut totals) {
        failures.push(format!("corpus tests: {e:#}"));
    }
    let mut integration = env.cargo();
    integration
        // Every test binary runs even after one fails: one run shows every failure.
        .args([
            "test",
            "--no-fail-fast",
            "-p",
            "lookback-tests",
            "--",
            "--test-threads=1",
        ])
        .args(extra);
    if let Err(e) = run_counted(&mut integration, &mut totals) {
        failures.push(format!("integration tests: {e:#}"));
    }
    println!();
    println!("xtask test summary:");
    println!(
        "{} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    if failures.is_empty() && totals.failed == 0 {
        Ok(())
    } else {
        bail!("{}", failures.join("; "))
    }
}

/// Runs `cargo test`, echoing its output and adding up its `test result:` lines.
fn run_counted(cmd: &mut Command, totals: &mut Totals) -> Result<()> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let stdout = child.stdout.take().context("no stdout pipe")?;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading test output")?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            add_counts(rest, totals);
        }
    }
    let status = child.wait().context("waiting for cargo test")?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Parses `ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in ..`.
fn add_counts(rest: &str, totals: &mut Totals) {
    for part in rest.split(';') {
        let mut words = part.split_whitespace().rev();
        let (Some(kind), Some(n)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match kind {
            "passed" => totals.passed += n,
            "failed" => totals.failed += n,
            "ignored" => totals.ignored += n,
            _ => {}
        }
    }
}

pub fn lint(env: &BuildEnv) -> Result<()> {
    run(env.cargo().args(["fmt", "--all", "--check"]))?;
    run(env.cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "lookback-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The eBPF crate is linted on its own: feature unification would pull std into it.
    let mut ebpf = Command::new("rustup");
    ebpf.current_dir(env.root.join("agent-ebpf"))
        .env("PATH", &env.path)
        .args(["run", &env.ebpf_toolchain, "cargo"])
        .args([
            "clippy",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])
        .args(["--", "-D", "warnings"]);
    if env.ebpf_toolchain != "nightly" {
        ebpf.env("RUSTC_BOOTSTRAP", "1");
    }
    run(&mut ebpf)
}

#[cfg(test)]
mod tests {
    use super::{Totals, add_counts};

    #[test]
    fn sums_libtest_result_lines() {
        let mut t = Totals::default();
        add_counts(
            "ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            &mut t,
        );
        add_counts(
            "FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out",
            &mut t,
        );
        assert_eq!((t.passed, t.failed, t.ignored), (4, 2, 1));
    }
}
