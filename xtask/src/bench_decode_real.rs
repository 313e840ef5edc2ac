//! `cargo xtask bench-decode --real-traces DIR`: Intel PT decode throughput on real
//! captures, side by side with Intel's libipt block decoder (what `ptxed
//! --block-decoder --quiet` runs) in the same run. Informative only: nothing here
//! asserts a time.
//!
//! DIR holds public captures kept outside the repository (never committed): the
//! `test_data` of nyx-fuzz/libxdc_experiments (KVM-PT traces of real programs, each
//! with the pages of code it ran as a page cache: `PREFIX.addr`, one little-endian u64
//! address per page, and `PREFIX.dump`, the pages in that order), under `DIR/libxdc/` or
//! `DIR` itself. The bench names every case it skipped and why. Each page becomes a
//! `--raw DUMP:OFFSET-END:ADDR` of `lookback decode --pt` and a section of
//! `benches/libipt_ref.c`, so both decode over the same code.
//!
//! Rows: bytes, instructions (lookback's and libipt's: they must agree), libipt's block
//! decoder, lookback's branch-event pass on one core (`decode --stats`, the product
//! path's own time, not its separate packet pass), MB/s and the ratio; and the same on
//! every core (`--threads` left to its default: the parallel decode, which must count
//! what one core counts; the bench fails if not), with how many of its pieces were
//! taken from their thread.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result};

use crate::bench_decode::{Stats, best_run, libipt, libipt_ref, output};
use crate::util::{BuildEnv, run};

/// Repetitions of each decoder (libipt's and lookback's alike); the fastest run is
/// reported. Eleven, not five: this VM's vCPU stalls left lookback's two-thread time
/// on qemu's trace anywhere from 13 to 21 ms in runs of five.
const REPS: usize = 11;
/// The cases of libxdc's regression tests (`run_regression_tests.sh`): name, trace file,
/// page-cache prefix, and the traced address range libxdc is given.
const CASES: [(&str, &str, &str, &str, &str); 10] = [
    ("Unzip", "trace", "data", "0x400000", "0x427000"),
    ("foo", "trace", "data", "7ffff7819000", "7ffff79ca000"),
    (
        "Kernel",
        "trace",
        "data",
        "0xffffffff81000000",
        "ffffffff81e53ba0",
    ),
    ("mruby", "trace", "data", "00400000", "4b6000"),
    (
        "kafl_eval",
        "sample1_1x",
        "data.pagecache",
        "0xffffffff83a00000",
        "0xffffffff83a26160",
    ),
    (
        "qemu",
        "trace1",
        "page_cache",
        "0x000555555554000",
        "0x00555555d60000",
    ),
    (
        "infinite_loop_linux",
        "loop_trace_26023_0",
        "page_cache",
        "0xffffffff81000000",
        "0xffffffff81e53ba0",
    ),
    (
        "dyn_test",
        "sample_raw_0",
        "page_cache",
        "0x1000",
        "0x7ffffffff000",
    ),
    (
        "avscript_32",
        "failed_trace_12709_1",
        "page_cache",
        "0x1000",
        "0x7ffffffff000",
    ),
    (
        "icelake_tip",
        "ptlog",
        "pagecache",
        "0x1000",
        "0xfffffffffffff000",
    ),
];
const PAGE: u64 = 4096;

/// One page of a page cache: (offset in the dump, address).
fn pages(prefix: &Path) -> Result<Vec<(u64, u64)>> {
    let addr_file = with_suffix(prefix, ".addr");
    let addrs = std::fs::read(&addr_file).with_context(|| format!("{}", addr_file.display()))?;
    Ok(addrs
        .chunks_exact(8)
        .enumerate()
        .filter_map(|(i, c)| {
            let addr = u64::from_le_bytes(c.try_into().ok()?);
            Some((i as u64 * PAGE, addr))
        })
        .collect())
}

fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Why a case cannot run: a missing or empty file (large files of the repository are
/// often absent from a checkout).
fn missing(files: &[&Path]) -> Option<String> {
    files
        .iter()
        .find(|f| std::fs::metadata(f).map_or(true, |m| m.len() == 0))
        .map(|f| format!("{} missing or empty", f.display()))
}

struct Row {
    name: String,
    bytes: u64,
    ours: Stats,
    /// The decode on every core, and its `threads:` line.
    all: Stats,
    all_threads: String,
    /// Instructions of `lookback-pt ptxed` (libipt's rules for errors).
    ptxed_insns: u64,
    reference: Option<crate::bench_decode::Reference>,
    /// libxdc's best MB/s (edges only, repeated decodes of the same trace).
    xdc_mb: Option<f64>,
}

pub fn bench_real(
    env: &BuildEnv,
    dir: &Path,
    libxdc: Option<&Path>,
    libipt_src: Option<&Path>,
) -> Result<()> {
    run(env.cargo().args([
        "build",
        "--release",
        "-p",
        "lookback",
        "--bin",
        "lookback",
        "--bin",
        "lookback-pt",
    ]))?;
    let base = if dir.join("libxdc").is_dir() {
        dir.join("libxdc")
    } else {
        dir.to_owned()
    };
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let xdc = libxdc.map(|src| build_libxdc(env, src)).transpose()?;
    let ipt = libipt_ref(env, libipt_src)?;
    for (name, trace, cache, start, end) in CASES {
        let trace = base.join(name).join(trace);
        let prefix = base.join(name).join(cache);
        let dump = with_suffix(&prefix, ".dump");
        let addr = with_suffix(&prefix, ".addr");
        if let Some(why) = missing(&[&trace, &dump, &addr]) {
            skipped.push(format!("{name}: {why}"));
            continue;
        }
        let pages = pages(&prefix)?;
        let mut raw = Vec::new();
        let mut sections = Vec::new();
        for (offset, address) in &pages {
            raw.push("--raw".to_owned());
            raw.push(format!(
                "{}:{offset:#x}-{:#x}:{address:#x}",
                dump.display(),
                offset + PAGE
            ));
            sections.push(format!(
                "{}:{offset:#x}:{PAGE:#x}:{address:#x}",
                dump.display()
            ));
        }
        let (ours, _) = best_run(env, &trace, &raw, Some("1"), REPS)?;
        let (all, all_threads) = best_run(env, &trace, &raw, None, REPS)?;
        if (all.insns, all.branches, all.errors) != (ours.insns, ours.branches, ours.errors) {
            anyhow::bail!(
                "{name}: the parallel decode counted {} insns, {} branches, {} errors; one core {}, {}, {}",
                all.insns,
                all.branches,
                all.errors,
                ours.insns,
                ours.branches,
                ours.errors
            );
        }
        let reference = match &ipt {
            Some(bin) => Some(libipt(bin, &trace, &sections, REPS)?),
            None => None,
        };
        let ptxed_insns = ptxed_mode_insns(env, &trace, &raw)?;
        let xdc_mb = match &xdc {
            Some(tester) => libxdc_rate(tester, [start, end], &prefix, &trace)?,
            None => None,
        };
        rows.push(Row {
            name: name.to_owned(),
            bytes: std::fs::metadata(&trace)?.len(),
            ours,
            all,
            all_threads,
            ptxed_insns,
            reference,
            xdc_mb,
        });
    }
    println!("{}", table(&rows));
    for s in &skipped {
        println!("skipped: {s}");
    }
    if xdc.is_none() {
        println!("libxdc: not run (give its source with --libxdc DIR: nyx-fuzz/libxdc)");
    }
    Ok(())
}

/// The instructions `lookback-pt ptxed -- --quiet --stat --stat:insn` counts.
fn ptxed_mode_insns(env: &BuildEnv, trace: &Path, raw: &[String]) -> Result<u64> {
    let text = output(
        Command::new(env.pt_tool_bin())
            .args(["ptxed", "--pt"])
            .arg(trace)
            .args(raw)
            .args(["--", "--quiet", "--stat", "--stat:insn"]),
    )?;
    text.lines()
        .find_map(|l| l.strip_prefix("insn: ")?.trim_end_matches('.').parse().ok())
        .with_context(|| format!("no insn count from lookback-pt ptxed:\n{text}"))
}

/// libxdc's `tester_static`, built from the source at `src` (copied under target/, with
/// Debian's libcapstone-dev installed when missing).
fn build_libxdc(env: &BuildEnv, src: &Path) -> Result<PathBuf> {
    if !Path::new("/usr/include/capstone/capstone.h").exists() && env.is_root {
        run(Command::new("apt-get")
            .args([
                "install",
                "-y",
                "--no-install-recommends",
                "libcapstone-dev",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    let dir = env.root.join("target/bench/libxdc");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(env.root.join("target/bench"))?;
    run(Command::new("cp").arg("-r").arg(src).arg(&dir))?;
    run(Command::new("make")
        .arg("-C")
        .arg(&dir)
        .args(["libxdc.a", "tester_static"]))?;
    Ok(dir.join("tester_static"))
}

/// libxdc's best of its five `performance` rounds, in MB/s (it prints MiB/s).
fn libxdc_rate(
    tester: &Path,
    range: [&str; 2],
    prefix: &Path,
    trace: &Path,
) -> Result<Option<f64>> {
    let out = Command::new(tester)
        .args(range)
        .arg(prefix)
        .arg(trace)
        .args(["0x0", "performance"])
        .output()
        .with_context(|| format!("running {}", tester.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let best = text
        .lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "MB/sec")?;
            words.get(at.checked_sub(1)?)?.parse::<f64>().ok()
        })
        .fold(None, |best: Option<f64>, r| {
            Some(best.map_or(r, |b| b.max(r)))
        });
    if best.is_none() {
        eprintln!("libxdc on {}: {}", trace.display(), text.trim());
    }
    Ok(best.map(|mib| mib * 1.048_576))
}

#[expect(
    clippy::cast_precision_loss,
    reason = "throughput figures are approximate by nature"
)]
fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| real trace | bytes | insns (lookback / `lookback-pt ptxed` / libipt) | errors (lookback / libipt) | libipt block decoder s | MB/s | libxdc MB/s (edges only) | lookback 1 core s | MB/s | lookback ÷ libipt speed | lookback all cores s | MB/s | ÷ libipt | threads, pieces |"
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for row in rows {
        let mb = row.bytes as f64 / 1e6;
        let ours = &row.ours;
        let all_ratio = row.reference.as_ref().map_or_else(
            || "-".to_owned(),
            |r| format!("{:.2}×", r.block_secs / row.all.decode_secs),
        );
        let (insns, errors, secs, rate, ratio) = match &row.reference {
            Some(r) => (
                format!("{:.0} / {} / {:.0}", ours.insns, row.ptxed_insns, r.insns),
                format!("{} / {:.0}", ours.errors, r.errors),
                format!("{:.4}", r.block_secs),
                format!("{:.1}", mb / r.block_secs),
                format!("{:.2}×", r.block_secs / ours.decode_secs),
            ),
            None => (
                format!("{:.0} / {} / -", ours.insns, row.ptxed_insns),
                format!("{} / -", ours.errors),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
            ),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {insns} | {errors} | {secs} | {rate} | {} | {:.4} | {:.1} | {ratio} | {:.4} | {:.1} | {all_ratio} | {} |",
            row.name,
            row.bytes,
            row.xdc_mb
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.1}")),
            ours.decode_secs,
            mb / ours.decode_secs,
            row.all.decode_secs,
            mb / row.all.decode_secs,
            row.all_threads
        );
    }
    out
}
