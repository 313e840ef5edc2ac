//! `cargo xtask bench-sampling`: what the sampling recorder costs the traced program, and
//! what its snapshots cost to decode, side by side with `perf record` (frame pointers and
//! dwarf) on the same workload in the same run. Informative only: nothing here asserts a
//! time.
//!
//! The workload is `tests/workloads/deep.c` built with `cc -O2` (no frame pointers), all
//! calls fast (`deep 1500 -1`), which prints its own `elapsed_ns=`: the slowdown is the
//! program's own measurement, not the tracer's start-up. lookback runs without a trigger,
//! so only the recorder costs; at exit it writes the "manual" snapshot, whose decode is
//! timed. perf writes to a file beside it
//! (`target/bench/sampling/`) and `perf script` of it is timed the same way.
#![expect(clippy::cast_precision_loss, reason = "display only")]
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::util::{BuildEnv, run};

const CALLS: &str = "1500";
const REPS: usize = 3;

/// One recorder configuration.
struct Tracer {
    name: String,
    /// The command line before the workload (empty: untraced).
    prefix: Vec<String>,
    hz: u64,
}

pub fn bench_sampling(env: &BuildEnv) -> Result<()> {
    if !env.is_root {
        bail!("the benchmark opens perf events and loads BPF programs: run as root");
    }
    run(env.cargo().args(["build", "--release", "-p", "lookback"]))?;
    let out = env.root.join("target/bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let deep = out.join("deep");
    run(Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&deep)
        .arg(env.root.join("tests/workloads/deep.c")))?;
    let tmp = out.join("sampling");
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let lookback = env.release_bin().display().to_string();
    let perf_ok = Command::new("perf").arg("--version").output().is_ok();
    if !perf_ok {
        eprintln!(
            "xtask bench-sampling: perf not found (apt-get install linux-perf): no perf rows"
        );
    }
    let none = median_elapsed(&[], &deep)?;
    println!(
        "workload: {} {CALLS} -1 (cc -O2, no frame pointers), untraced {:.0} ms",
        deep.display(),
        ms(none)
    );
    println!();
    println!(
        "| recorder | Hz | target ms | slowdown | cost per sample | samples per MiB | decode per sample |"
    );
    println!("|---|---|---|---|---|---|---|");
    for hz in [1000u64, 10_000] {
        let snap = tmp.as_path().join(format!("lb-{hz}.lbsnap"));
        let data = tmp.as_path().join(format!("perf-{hz}.data"));
        let tracers = tracers(&lookback, hz, &snap, &data, perf_ok);
        for tracer in &tracers {
            let prefix: Vec<&str> = tracer.prefix.iter().map(String::as_str).collect();
            let elapsed = median_elapsed(&prefix, &deep)?;
            let samples = elapsed * tracer.hz as f64 / 1e9;
            let per_sample_us = (elapsed - none) / samples.max(1.0) / 1e3;
            let (per_mib, decode) = if tracer.name.starts_with("lookback") {
                decoded(&lookback, &snap, tmp.as_path())?
            } else {
                perf_script(&data)?
            };
            println!(
                "| {} | {} | {:.0} | {:+.1}% | {per_sample_us:.1} µs | {per_mib} | {decode} |",
                tracer.name,
                tracer.hz,
                ms(elapsed),
                (elapsed / none - 1.0) * 100.0,
            );
        }
    }
    Ok(())
}

/// The recorders compared at `hz`: lookback with and without stack copies (writing the
/// snapshot to `snap`), perf with frame pointers and dwarf (to `data`) when it exists.
fn tracers(lookback: &str, hz: u64, snap: &Path, data: &Path, perf_ok: bool) -> Vec<Tracer> {
    let mut tracers = Vec::new();
    for (label, stack) in [
        ("lookback, 8 KiB stack copies (default)", "8KiB"),
        ("lookback --stack-size 0 (frame pointers)", "0"),
    ] {
        tracers.push(Tracer {
            name: label.to_owned(),
            prefix: [
                lookback,
                "-q",
                "run",
                "--backend",
                "sampling",
                "--sample-frequency",
                &hz.to_string(),
                "--stack-size",
                stack,
                "-o",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .chain([snap.display().to_string(), "--".to_owned()])
            .collect(),
            hz,
        });
    }
    if perf_ok {
        for (label, graph) in [
            ("perf record --call-graph fp", "fp"),
            ("perf record --call-graph dwarf", "dwarf,8192"),
        ] {
            tracers.push(Tracer {
                name: label.to_owned(),
                prefix: [
                    "perf",
                    "record",
                    "-q",
                    "-e",
                    "cpu-clock:u",
                    "-F",
                    &hz.to_string(),
                    "--call-graph",
                    graph,
                    "-o",
                ]
                .iter()
                .map(|s| (*s).to_owned())
                .chain([data.display().to_string(), "--".to_owned()])
                .collect(),
                hz,
            });
        }
    }
    tracers
}

fn ms(ns: f64) -> f64 {
    ns / 1e6
}

/// The workload's own `elapsed_ns=` under `prefix` (none: untraced), median of [`REPS`].
fn median_elapsed(prefix: &[&str], deep: &Path) -> Result<f64> {
    let mut runs = Vec::new();
    for _ in 0..REPS {
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest);
                cmd.arg(deep);
                cmd
            }
            None => Command::new(deep),
        };
        let out = cmd
            .args([CALLS, "-1"])
            .stderr(Stdio::null())
            .output()
            .with_context(|| format!("running {cmd:?}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let ns: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("elapsed_ns=")?.trim().parse().ok())
            .with_context(|| format!("{cmd:?} printed no elapsed_ns (status {})", out.status))?;
        runs.push(ns);
    }
    runs.sort_by(f64::total_cmp);
    Ok(runs[REPS / 2])
}

/// Samples per MiB of ring and decode time (decode, unwind, symbols, writer) per sample
/// of lookback's last snapshot, from `lookback decode --stats`.
fn decoded(lookback: &str, snap: &Path, dir: &Path) -> Result<(String, String)> {
    let trace: PathBuf = dir.join("decoded.fxt");
    let out = Command::new(lookback)
        .args(["-q", "decode", "--stats"])
        .arg(snap)
        .arg("-o")
        .arg(&trace)
        .output()
        .context("lookback decode")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "snapshot: sampling (N bytes of raw data), ...", "trace: T threads, S samples, ...",
    // "write: W s (...)".
    let number_before = |line: &str, unit: &str| -> Option<f64> {
        let end = line.find(unit)?;
        line[..end]
            .split_whitespace()
            .last()?
            .trim_start_matches('(')
            .parse()
            .ok()
    };
    let find = |prefix: &str, unit: &str| {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .find_map(|l| number_before(l, unit))
            .with_context(|| format!("lookback decode --stats printed no {prefix}{unit}: {text}"))
    };
    let raw = find("snapshot:", " bytes of raw data")?;
    let samples = find("trace:", " samples")?;
    let write = find("write:", " s (")?;
    Ok((
        format!("{:.0}", samples * f64::from(1 << 20) / raw.max(1.0)),
        format!("{:.1} µs", write * 1e6 / samples.max(1.0)),
    ))
}

/// Samples per MiB of `perf.data` and `perf script` time per sample.
fn perf_script(data: &Path) -> Result<(String, String)> {
    let start = Instant::now();
    let out = Command::new("perf")
        .args(["script", "-F", "ip,sym", "-i"])
        .arg(data)
        .stderr(Stdio::null())
        .output()
        .context("perf script")?;
    let took = start.elapsed();
    let samples = String::from_utf8_lossy(&out.stdout)
        .split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .count();
    let bytes = std::fs::metadata(data).map_or(0, |m| m.len());
    let per_mib = (samples as f64 * f64::from(1 << 20) / bytes.max(1) as f64).round();
    Ok((
        format!("{per_mib:.0}"),
        format!("{:.1} µs", took.as_secs_f64() * 1e6 / samples.max(1) as f64),
    ))
}
