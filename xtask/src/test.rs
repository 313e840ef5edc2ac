//! `cargo xtask test` and `cargo xtask lint`.
//!
//! Tests run in two passes: unit tests of every crate (parallel), then the privileged
//! integration tests of `lookback-tests` one at a time (they share kernel state: BPF maps,
//! uprobes, tracefs). Output streams through; the pass/fail counts of every test binary are
//! summed into one closing line.
//!
//! An integration test that fails is run once more, alone (as cargo-nextest's `--retries`
//! does): these tests drive real processes, probes and rings on a VM whose vCPUs stall,
//! and one that passes alone is reported as **flaky**, by name, in the closing lines, not
//! hidden. More than [`MAX_RERUNS`] failures, or one that fails again, fail the run. Unit
//! tests are never rerun.
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

/// Beyond this many failed integration tests the run is broken, not flaky: none is rerun.
const MAX_RERUNS: usize = 3;

#[derive(Debug, Default)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

/// A failed test: its integration test target (`agent_limits` for
/// `tests/agent_limits.rs`; `None` outside one) and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failed {
    target: Option<String>,
    name: String,
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
    if let Err(e) = run_counted(&mut unit, &mut totals, &mut Vec::new()) {
        failures.push(format!("unit tests: {e:#}"));
    }
    // The corpus conformance tests print their pass counts: show them.
    let mut corpus = env.cargo();
    corpus
        .args(["test", "-p", "lookback", "--lib", "--"])
        .args(CORPUS_TESTS)
        .arg("--nocapture")
        .args(extra);
    if let Err(e) = run_counted(&mut corpus, &mut totals, &mut Vec::new()) {
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
    let (mut failed, mut flaky, mut counts) = (Vec::new(), Vec::new(), Totals::default());
    if let Err(e) = run_counted(&mut integration, &mut counts, &mut failed) {
        flaky = rerun_alone(env, &failed);
        let reran = u64::try_from(flaky.len()).unwrap_or(u64::MAX);
        if flaky.len() == failed.len() && counts.failed == reran {
            // Every failure passed alone: counted as passed, and named below.
            counts.failed = 0;
            counts.passed += reran;
        } else {
            failures.push(format!("integration tests: {e:#}"));
        }
    }
    totals.passed += counts.passed;
    totals.failed += counts.failed;
    totals.ignored += counts.ignored;
    println!();
    println!("xtask test summary:");
    println!(
        "{} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    if !flaky.is_empty() {
        println!(
            "{} flaky (failed, then passed when run again alone; see their output above):",
            flaky.len()
        );
        for f in &flaky {
            println!("  flaky: {}", f.label());
        }
    }
    if failures.is_empty() && totals.failed == 0 {
        Ok(())
    } else {
        bail!("{}", failures.join("; "))
    }
}

/// Runs each of `failed` (integration tests) once more, alone; returns those that passed.
/// None when there are more than [`MAX_RERUNS`], or one is not in a known target: then
/// the run fails as it stands.
fn rerun_alone(env: &BuildEnv, failed: &[Failed]) -> Vec<Failed> {
    if failed.is_empty() || failed.len() > MAX_RERUNS {
        return Vec::new();
    }
    let mut passed = Vec::new();
    for f in failed {
        let Some(target) = &f.target else {
            return Vec::new();
        };
        println!();
        println!("xtask: {} failed; running it again, alone", f.label());
        let mut again = env.cargo();
        again.args([
            "test",
            "-p",
            "lookback-tests",
            "--test",
            target,
            "--",
            "--exact",
            &f.name,
            "--test-threads=1",
        ]);
        let mut totals = Totals::default();
        if run_counted(&mut again, &mut totals, &mut Vec::new()).is_ok()
            && totals.passed == 1
            && totals.failed == 0
        {
            passed.push(f.clone());
        }
    }
    passed
}

impl Failed {
    fn label(&self) -> String {
        match &self.target {
            Some(target) => format!("{target}::{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// Runs `cargo test`, echoing its output, adding up its `test result:` lines and noting
/// the tests that failed (`test NAME ... FAILED`) with the target each ran in.
fn run_counted(cmd: &mut Command, totals: &mut Totals, failed: &mut Vec<Failed>) -> Result<()> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    // cargo names each test binary on stderr (`Running tests/x.rs (...)`), libtest writes
    // results on stdout: both are read in one place, in order, to pair them.
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let (tx, rx) = std::sync::mpsc::channel::<(bool, String)>();
    let err_tx = tx.clone();
    let err_thread = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if err_tx.send((true, line)).is_err() {
                break;
            }
        }
    });
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let out_thread = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((false, line)).is_err() {
                break;
            }
        }
    });
    let mut target = None;
    for (is_err, line) in rx {
        if is_err {
            eprintln!("{line}");
            if let Some(source) = running_source(&line) {
                target = integration_target(source);
            }
            continue;
        }
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            add_counts(rest, totals);
        } else if let Some(name) = failed_test(&line) {
            failed.push(Failed {
                target: target.clone(),
                name: name.to_owned(),
            });
        }
    }
    let _ = (err_thread.join(), out_thread.join());
    let status = child.wait().context("waiting for cargo test")?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// The source of cargo's `Running SOURCE (binary)` line: `tests/agent_limits.rs`,
/// `unittests src/lib.rs`.
fn running_source(line: &str) -> Option<&str> {
    line.trim_start().strip_prefix("Running ")
}

/// The integration test target a `Running` source names (`agent_limits` for
/// `tests/agent_limits.rs …`); `None` for unit tests.
fn integration_target(source: &str) -> Option<String> {
    source
        .split_whitespace()
        .next()?
        .strip_prefix("tests/")?
        .strip_suffix(".rs")
        .filter(|t| !t.contains('/'))
        .map(str::to_owned)
}

/// The test name of libtest's `test NAME ... FAILED`.
fn failed_test(line: &str) -> Option<&str> {
    line.strip_prefix("test ")?.strip_suffix(" ... FAILED")
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
    // Stages import only downward (docs/architecture.md); a circle or an upward import fails.
    run(Command::new("python3")
        .current_dir(&env.root)
        .arg("tests/scripts/stage_imports.py"))?;
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
    use super::{Totals, add_counts, failed_test, integration_target, running_source};

    #[test]
    fn names_the_failed_tests_and_their_targets() {
        let target = |line| running_source(line).map(integration_target);
        assert_eq!(
            target("     Running tests/agent_limits.rs (target/debug/deps/agent_limits-1ca0aa5d)"),
            Some(Some("agent_limits".to_owned()))
        );
        assert_eq!(
            target("     Running unittests src/lib.rs (target/debug/deps/lookback-1)"),
            Some(None)
        );
        assert_eq!(target("test a ... ok"), None);
        assert_eq!(
            failed_test("test per_cpu_rings_that_cannot_open ... FAILED"),
            Some("per_cpu_rings_that_cannot_open")
        );
        assert_eq!(
            failed_test("test per_cpu_rings_that_cannot_open ... ok"),
            None
        );
        assert_eq!(failed_test("test result: FAILED. 7 passed; 1 failed"), None);
    }

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
