//! `cargo xtask bench`: the cost the trigger engine adds to a traced process, side by side
//! with bpftrace doing the equivalent check, in one run. Informative only: nothing here
//! asserts a time.
//!
//! Function probes: a tight loop calling a probed function (`lb_noop`, a trap uprobe,
//! `lb_noop_nop5`, whose entry is a 5-byte NOP the kernel can optimize, and `lb_noop_rets`,
//! with three `ret`s) with a latency trigger that never fires (`>1s`), so the numbers are
//! the probe cost alone: lookback's entry uprobe plus a uprobe on the exit taken (never a
//! uretprobe) or, with `--detect running`, the entry uprobe alone, beside bpftrace's
//! uprobe+uretprobe check. Syscalls: a
//! `getpid()` loop, as the target and as a bystander while another process is traced.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::util::{BuildEnv, run};

const CALLS: &str = "200000";
const SYSCALLS: &str = "1000000";

/// Which single table `cargo xtask bench` prints (none set: all but the agent-scale one,
/// which takes minutes and gigabytes of rings, and the upload one, which needs `weed`).
#[derive(Debug, Clone, Copy)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "one flag per table, as on the command line"
)]
pub struct Only {
    pub freeze: bool,
    pub startup: bool,
    pub agent_scale: bool,
    pub upload: bool,
    pub overhead: bool,
}

pub fn bench(env: &BuildEnv, only: Only, triggers: usize) -> Result<()> {
    if !env.is_root {
        bail!("the benchmarks load BPF programs: run as root");
    }
    // `LOOKBACK_BIN`: measure a prebuilt binary (an earlier commit's, for a before/after).
    let lookback = if let Some(bin) = std::env::var_os("LOOKBACK_BIN") {
        PathBuf::from(bin)
    } else {
        run(env.cargo().args(["build", "--release", "-p", "lookback"]))?;
        env.release_bin()
    };
    let workload = build_workload(env)?;
    if only.freeze {
        return freeze_latency(env, &lookback, &workload, triggers);
    }
    if only.agent_scale {
        return crate::bench_agent_scale::agent_scale(&env.root, &lookback, &workload);
    }
    if only.upload {
        return crate::bench_upload::upload(&env.root, &lookback, &workload, triggers);
    }
    let bpftrace = which("bpftrace");
    if only.startup {
        return crate::bench_startup::startup(&lookback, &workload, bpftrace.as_deref());
    }
    if bpftrace.is_none() {
        eprintln!(
            "xtask bench: bpftrace not found (apt-get install bpftrace): its column stays empty"
        );
    }
    let w = workload.display().to_string();
    println!(
        "| probe | workload | none ns/call | lookback ns/call | bpftrace ns/call | lookback overhead | bpftrace overhead |"
    );
    println!("|---|---|---|---|---|---|---|");
    // `detect`: how lookback judges the call: at its return (entry + exit uprobes), or
    // while it runs (`--detect running`: the entry uprobe alone, and the watcher's scan).
    for (func, mode, detect) in [
        ("lb_noop", "loop", "returned"),
        ("lb_noop_nop5", "loopnop", "returned"),
        ("lb_noop_rets", "looprets", "returned"),
        ("lb_noop", "loop", "running"),
        ("lb_noop_nop5", "loopnop", "running"),
    ] {
        let none = measure(Command::new(&workload).args([mode, CALLS]))?;
        let lb = measure(
            Command::new(&lookback)
                .args([
                    "-q",
                    "run",
                    "--dry-run",
                    "--max-snapshots",
                    "0",
                    "--detect",
                    detect,
                    "--trigger",
                ])
                .arg(format!("func:{func}>1s"))
                .arg("--")
                .arg(&workload)
                .args([mode, CALLS]),
        )?;
        let bt = bpftrace.as_ref().map(|bt| {
            let script = format!(
                "uprobe:{w}:{func} {{ @s[tid] = nsecs; }} \
                 uretprobe:{w}:{func} /@s[tid]/ {{ if (nsecs - @s[tid] > 1000000000) {{ printf(\"slow\\n\"); }} delete(@s[tid]); }}"
            );
            measure(Command::new(bt).args(["-q", "-e", &script, "-c"]).arg(format!("{w} {mode} {CALLS}")))
        });
        let how = if detect == "running" {
            "`--detect running`: entry uprobe only"
        } else {
            "entry + exit uprobes"
        };
        row(
            &format!("latency rule `{func}` (lookback: {how}; bpftrace: uprobe+uretprobe)"),
            mode,
            none,
            lb,
            bt.transpose()?,
        );
    }
    syscall_rows(&lookback, &workload, bpftrace.as_deref())?;
    if only.overhead {
        return Ok(());
    }
    crate::bench_startup::startup(&lookback, &workload, bpftrace.as_deref())?;
    freeze_latency(env, &lookback, &workload, triggers)
}

/// Trigger → freeze latency of the sampling backend over `triggers` triggers: the kernel's
/// trigger timestamp to the moment the process's samples stopped being recorded (in the
/// kernel, by the recorder's `sample_filter`), as recorded in each snapshot.
fn freeze_latency(env: &BuildEnv, lookback: &Path, workload: &Path, triggers: usize) -> Result<()> {
    println!();
    println!("| trigger → freeze (sampling) | pump | triggers | p50 | p90 | p99 | max | ≥ 50 µs |");
    println!("|---|---|---|---|---|---|---|---|");
    for spin in [false, true] {
        let mut lat = freeze_run(env, lookback, workload, triggers, spin)?;
        lat.sort_unstable();
        let pct = |p: usize| lat[(lat.len() * p / 100).min(lat.len() - 1)];
        println!(
            "| `func:lb_work>1ms`, one every 10 ms | {} | {} | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs | {} |",
            if spin {
                "`--freeze-spin`"
            } else {
                "sleeps (default)"
            },
            lat.len(),
            us(pct(50)),
            us(pct(90)),
            us(pct(99)),
            us(lat[lat.len() - 1]),
            lat.iter().filter(|&&ns| ns >= 50_000).count()
        );
    }
    cpu_stalls(env)
}

/// The reference for the freeze table: how often this machine keeps a CPU from a program
/// that never blocks (interrupts, preemption, a host not running the vCPU), per CPU.
/// A trigger's BPF program that meets such a stall carries it into its latency.
fn cpu_stalls(env: &BuildEnv) -> Result<()> {
    const SECS: u64 = 5;
    let bin = env.root.join("target/bench/cpu_stalls");
    run(Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(env.root.join("benches/cpu_stalls.c")))?;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    println!();
    println!(
        "| reference: a loop reading the clock on one CPU, {SECS} s | stalls ≥ 10 µs | ≥ 20 µs | ≥ 50 µs | ≥ 100 µs | longest |"
    );
    println!("|---|---|---|---|---|---|");
    for cpu in 0..cpus {
        let out = Command::new(&bin)
            .arg(SECS.to_string())
            .arg(cpu.to_string())
            .output()
            .context("running cpu_stalls")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let get = |key: &str| -> u64 {
            text.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
                .unwrap_or(0)
        };
        let per_sec = |key: &str| format!("{:.0}/s", per_second(get(key), SECS));
        println!(
            "| CPU {cpu} | {} | {} | {} | {} | {} µs |",
            per_sec("ge10us"),
            per_sec("ge20us"),
            per_sec("ge50us"),
            per_sec("ge100us"),
            get("max_us")
        );
    }
    Ok(())
}

#[expect(clippy::cast_precision_loss, reason = "display only")]
fn per_second(count: u64, secs: u64) -> f64 {
    count as f64 / secs as f64
}

/// The `trigger_to_freeze_ns` of each snapshot of one `lookback run`.
fn freeze_run(
    env: &BuildEnv,
    lookback: &Path,
    workload: &Path,
    triggers: usize,
    spin: bool,
) -> Result<Vec<u64>> {
    let dir = env.root.join("target/bench/freeze");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // One slow call (10 ms) after another: each returns, triggers, and is frozen (and its
    // snapshot written, ~3 ms here) before the next trigger, so queueing in lookback does
    // not inflate the numbers. `-o *.lbsnap` writes raw snapshots only: turning each into a
    // trace (symbolization) would take longer than the 10 ms between triggers.
    let out = Command::new(lookback)
        .args([
            "-q",
            "run",
            "--backend",
            "sampling",
            "--json",
            "--max-snapshots",
            "0",
        ])
        .args(spin.then_some("--freeze-spin"))
        .args(["--trigger", "func:lb_work>1ms", "-o"])
        .arg(dir.join("trace.lbsnap"))
        .arg("--")
        .arg(workload)
        .args(["calls", &triggers.to_string(), "1", "10000", "0", "1"])
        .stderr(Stdio::inherit())
        .output()
        .context("running lookback")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let lat: Vec<u64> = text
        .lines()
        .filter_map(|l| {
            let rest = l.split("\"trigger_to_freeze_ns\":").nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    if lat.is_empty() {
        bail!("no trigger_to_freeze_ns in lookback's output");
    }
    Ok(lat)
}

#[expect(clippy::cast_precision_loss, reason = "display only")]
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn syscall_rows(lookback: &Path, workload: &Path, bpftrace: Option<&Path>) -> Result<()> {
    let w = workload.display().to_string();
    let none = measure(Command::new(workload).args(["getpid", SYSCALLS]))?;
    let trigger = ["--trigger", "syscall:getpid>1s"];
    let lb = measure(
        Command::new(lookback)
            .args(["-q", "run", "--dry-run", "--max-snapshots", "0"])
            .args(trigger)
            .arg("--")
            .arg(workload)
            .args(["getpid", SYSCALLS]),
    )?;
    let bt_script = |filter: String| {
        format!(
            "tracepoint:raw_syscalls:sys_enter /{filter} && args->id == 39/ {{ @s[tid] = nsecs; }} \
             tracepoint:raw_syscalls:sys_exit /@s[tid]/ {{ if (nsecs - @s[tid] > 1000000000) {{ printf(\"slow\\n\"); }} delete(@s[tid]); }}"
        )
    };
    let bt = bpftrace
        .map(|bt| {
            measure(
                Command::new(bt)
                    .args(["-q", "-e", &bt_script("pid == cpid".into()), "-c"])
                    .arg(format!("{w} getpid {SYSCALLS}")),
            )
        })
        .transpose()?;
    row("syscall trigger, target", "getpid", none, lb, bt);

    // A bystander: another process is traced while this one runs.
    let mut idle = Command::new("sleep").arg("600").spawn().context("sleep")?;
    let idle_pid = idle.id().to_string();
    let mut lb_attach = background(
        Command::new(lookback)
            .args([
                "-q",
                "attach",
                "--dry-run",
                "--max-snapshots",
                "0",
                "-p",
                &idle_pid,
            ])
            .args(trigger),
    )?;
    let lb = measure(Command::new(workload).args(["getpid", SYSCALLS]));
    stop(&mut lb_attach);
    let bt = match bpftrace {
        Some(bt) => {
            let mut tracer = background(Command::new(bt).args([
                "-q",
                "-e",
                &bt_script(format!("pid == {idle_pid}")),
            ]))?;
            let r = measure(Command::new(workload).args(["getpid", SYSCALLS]));
            stop(&mut tracer);
            Some(r?)
        }
        None => None,
    };
    // SIGKILL: a `sleep` started from a background shell ignores SIGINT (inherited).
    let _ = idle.kill();
    let _ = idle.wait();
    row("syscall trigger, other process", "getpid", none, lb?, bt);
    Ok(())
}

fn row(probe: &str, mode: &str, none: f64, lb: f64, bt: Option<f64>) {
    let bt_cell = bt.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
    let bt_over = bt.map_or_else(|| "-".to_owned(), |v| format!("+{:.0} ns", v - none));
    println!(
        "| {probe} | {mode} | {none:.0} | {lb:.0} | {bt_cell} | +{:.0} ns | {bt_over} |",
        lb - none
    );
}

/// Repetitions of each measurement; the median is reported (other work on a 2-core VM
/// makes single runs vary by ±30%).
const REPS: usize = 5;

/// Runs a command whose output contains the workload's `ns_per_op=` line, [`REPS`] times,
/// and returns the median.
fn measure(cmd: &mut Command) -> Result<f64> {
    let mut samples = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let out = cmd
            .stderr(Stdio::null())
            .output()
            .with_context(|| format!("running {cmd:?}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let v: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("ns_per_op=")?.trim().parse().ok())
            .with_context(|| format!("{cmd:?} printed no ns_per_op (status {})", out.status))?;
        samples.push(v);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[REPS / 2])
}

/// Starts a tracer and gives it time to attach.
fn background(cmd: &mut Command) -> Result<Child> {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    sleep(Duration::from_secs(3));
    Ok(child)
}

fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub fn build_workload(env: &BuildEnv) -> Result<PathBuf> {
    let src = env.root.join("tests/workloads");
    let out = env.root.join("target/bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let lib = out.join("libworkload.so");
    run(Command::new("cc")
        .args(["-O1", "-g", "-fPIC", "-shared", "-o"])
        .arg(&lib)
        .arg(src.join("libworkload.c")))?;
    let bin = out.join("workload");
    run(Command::new("cc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(&bin)
        .arg(src.join("workload.c"))
        .arg(format!("-L{}", out.display()))
        .arg("-lworkload")
        .arg(format!("-Wl,-rpath,{}", out.display())))?;
    Ok(bin)
}
