//! `cargo xtask bench` (and `--startup-only`): how long a command waits before its first
//! instruction under `lookback run`, beside `perf record` and bpftrace starting the same
//! command, in one run. The command is the test workload's `started` mode, which prints
//! the wall-clock time its `main` began; the delay is that minus the time just before the
//! tool was spawned, the median of [`REPS`] runs, with the workload started directly as
//! the baseline row. Also the whole run (spawn to exit), which includes detaching.
//! Informative only: nothing here asserts a time.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};

use crate::bench::which;

/// Runs of each row; the median is reported (a 2-core VM varies run to run).
const REPS: usize = 11;

/// One row: a tool starting the workload.
struct Row {
    tool: &'static str,
    what: String,
    cmd: Command,
}

pub fn startup(lookback: &Path, workload: &Path, bpftrace: Option<&Path>) -> Result<()> {
    let scratch = tempfile_dir()?;
    let rows = rows(lookback, workload, bpftrace, &scratch);
    let printed = print_table(rows);
    let _ = std::fs::remove_dir_all(&scratch);
    printed
}

/// The rows: the workload alone, `lookback run` with each kind of rule (and recording),
/// `perf record`, `bpftrace -c` (each where installed).
fn rows(lookback: &Path, workload: &Path, bpftrace: Option<&Path>, scratch: &Path) -> Vec<Row> {
    let w = workload.display().to_string();
    let mut rows = vec![Row {
        tool: "none",
        what: "the workload alone".into(),
        cmd: {
            let mut cmd = Command::new(workload);
            cmd.arg("started");
            cmd
        },
    }];
    for (what, args) in [
        (
            "syscall rule (dry run)",
            &["--dry-run", "--trigger", "syscall:fsync>1s"][..],
        ),
        (
            "signal rule (dry run)",
            &["--dry-run", "--trigger", "signal:SIGSEGV"],
        ),
        (
            "function latency rule (dry run)",
            &["--dry-run", "--trigger", "func:lb_work>1s"],
        ),
        (
            "sampling recorder + syscall rule",
            &["--backend", "sampling", "--trigger", "syscall:fsync>1s"],
        ),
    ] {
        let mut cmd = Command::new(lookback);
        cmd.args(["-q", "run"]).args(args);
        if !args.contains(&"--dry-run") {
            cmd.arg("-o").arg(scratch.join("trace.fxt.gz"));
        }
        cmd.arg("--").args([w.as_str(), "started"]);
        rows.push(Row {
            tool: "lookback run",
            what: what.into(),
            cmd,
        });
    }
    if let Some(perf) = which("perf") {
        let mut cmd = Command::new(perf);
        cmd.args(["record", "-q", "-e", "cpu-clock", "-F", "10000", "-g", "-o"])
            .arg(scratch.join("perf.data"))
            .arg("--")
            .args([w.as_str(), "started"]);
        rows.push(Row {
            tool: "perf record",
            what: "cpu-clock 10 kHz, callchains".into(),
            cmd,
        });
    } else {
        eprintln!("xtask bench: perf not found (Debian linux-perf): its row is left out");
    }
    if let Some(bt) = bpftrace {
        for (what, script) in [
            (
                "syscall check",
                "tracepoint:raw_syscalls:sys_exit /pid == cpid/ { @n = count(); }".to_owned(),
            ),
            (
                "function latency check",
                format!(
                    "uprobe:{w}:lb_work {{ @s[tid] = nsecs; }} \
                     uretprobe:{w}:lb_work /@s[tid]/ {{ delete(@s[tid]); }}"
                ),
            ),
        ] {
            let mut cmd = Command::new(bt);
            cmd.args(["-q", "-e", &script, "-c"])
                .arg(format!("{w} started"));
            rows.push(Row {
                tool: "bpftrace -c",
                what: what.into(),
                cmd,
            });
        }
    } else {
        eprintln!(
            "xtask bench: bpftrace not found (apt-get install bpftrace): its rows are left out"
        );
    }
    rows
}

/// Runs each row [`REPS`] times and prints its medians.
fn print_table(rows: Vec<Row>) -> Result<()> {
    println!();
    println!(
        "| start-up: `TOOL -- workload started` | runs | command start delay p50 | min | whole run p50 |"
    );
    println!("|---|---|---|---|---|");
    for mut row in rows {
        let (mut delays, mut totals) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            let (delay, total) = once(&mut row.cmd)?;
            delays.push(delay);
            totals.push(total);
        }
        delays.sort_unstable();
        totals.sort_unstable();
        println!(
            "| {} — {} | {REPS} | {:.1} ms | {:.1} ms | {:.1} ms |",
            row.tool,
            row.what,
            ms(delays[REPS / 2]),
            ms(delays[0]),
            ms(totals[REPS / 2])
        );
    }
    Ok(())
}

/// One run: (delay until the workload's `main`, spawn to exit).
fn once(cmd: &mut Command) -> Result<(Duration, Duration)> {
    let wall_before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("clock")?;
    let started = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    let total = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let main_ns: u128 = text
        .lines()
        .find_map(|l| l.strip_prefix("started_ns=")?.trim().parse().ok())
        .with_context(|| format!("{cmd:?} printed no started_ns (status {})", out.status))?;
    let delay_ns = main_ns.saturating_sub(wall_before.as_nanos());
    Ok((
        Duration::from_nanos(u64::try_from(delay_ns).unwrap_or(u64::MAX)),
        total,
    ))
}

#[expect(clippy::cast_precision_loss, reason = "display only")]
fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("lookback-bench-startup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
