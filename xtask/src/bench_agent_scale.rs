//! `cargo xtask bench --agent-scale`: the agent with one sampling rule matching N idle
//! processes (each with T threads that sleep 1 s at a time, as an idle server's threads
//! wait), for the rows of issue 16's
//! table: how long until all are traced, the memory of the perf rings the agent maps, its
//! fds, resident memory and CPU while nothing triggers. Informative only. Twice in one
//! run: the per-CPU rings all targets share (the default), then rings per process
//! (`capture.isolate: true`, the agent's only way before), the reference.
//!
//! The processes are a copy of the test workload named `lbscale`, selected by exe, so
//! nothing else on the machine (tests running meanwhile) is traced or traces them.
use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::soak::{Guard, get, metric_sum, sample, start_agent, terminate};

/// (targets, threads per target) rows.
const ROWS: [(usize, usize); 6] = [(10, 1), (100, 1), (500, 1), (10, 20), (100, 20), (500, 20)];
/// The rows of the per-process reference (100 × 20 threads took over 2 minutes to attach).
const ISOLATED_ROWS: [(usize, usize); 4] = [(10, 1), (100, 1), (500, 1), (10, 20)];
/// How long the agent's idle CPU is measured.
const IDLE: Duration = Duration::from_secs(10);

pub fn agent_scale(root: &Path, lookback: &Path, workload: &Path) -> Result<()> {
    let dir = root.join("target/bench/agent-scale");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let target = dir.join("lbscale");
    fs::copy(workload, &target).context("copying the workload")?;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    for (isolate, rows) in [(false, &ROWS[..]), (true, &ISOLATED_ROWS[..])] {
        let rules = format!(
            "version: 1\nrules:\n  - name: idle\n    target: {{ exe: {} }}\n    \
             capture: {{ backend: sampling, isolate: {isolate} }}\n    \
             trigger: {{ signal: {{ signals: [SIGUSR2] }} }}\n",
            target.canonicalize()?.display()
        );
        let config = dir.join("rules.yaml");
        fs::write(&config, rules)?;
        let kind = if isolate {
            "rings per process (isolate)"
        } else {
            "per-CPU rings shared"
        };
        println!();
        println!(
            "| agent, one sampling rule (4 MiB rings, {kind}), {cpus} CPUs | all started after | all traced after | agent waiting for a CPU meanwhile | perf ring memory | agent fds | agent RSS | agent CPU, idle |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for &(n, threads) in rows {
            let row = measure(lookback, &config, &dir, &target, n, threads)?;
            println!(
                "| {n} targets × {threads} thread(s) | {:.2} s | {:.2} s | {:.2} s | {} MiB | {} | {} MiB | {:.2} % |",
                row.spawned.as_secs_f64(),
                row.attach.as_secs_f64(),
                row.waited.as_secs_f64(),
                row.ring_bytes >> 20,
                row.fds,
                row.rss_kib >> 10,
                row.idle_cpu_pct
            );
        }
    }
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}

struct Row {
    spawned: Duration,
    attach: Duration,
    /// How long the agent was runnable but not running until all were traced.
    waited: Duration,
    ring_bytes: u64,
    fds: usize,
    rss_kib: u64,
    idle_cpu_pct: f64,
}

fn measure(
    lookback: &Path,
    config: &Path,
    dir: &Path,
    target: &Path,
    n: usize,
    threads: usize,
) -> Result<Row> {
    let agent = start_agent(lookback, config, dir)?;
    let waited_before = run_queue_wait(agent.0.id());
    let started = Instant::now();
    let mut targets = Vec::with_capacity(n);
    for _ in 0..n {
        // 1 s sleeps for ~17 minutes per thread: idle, never exiting during the row (10 ms
        // sleeps, as before 2026-12-04, made 500 × 20 threads 1,000,000 wake-ups a
        // second: more than 2 vCPUs run, so that row could not be measured).
        targets.push(Guard(
            Command::new(target)
                .args([
                    "calls",
                    "1000",
                    "1",
                    "1000000",
                    "1000000",
                    &threads.to_string(),
                ])
                .stdout(Stdio::null())
                .spawn()
                .context("starting a target")?,
        ));
    }
    // Starting them is itself slow when they have many threads: the time the last one was
    // started is reported apart.
    let spawned = started.elapsed();
    let deadline = started + Duration::from_mins(5);
    loop {
        let body = get("/metrics").map(|x| x.1).unwrap_or_default();
        #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        if metric_sum(&body, "lookback_targets", "rule=\"idle\"") >= n as f64 {
            break;
        }
        if Instant::now() > deadline {
            bail!("{n} targets not all traced after 5 minutes");
        }
        sleep(Duration::from_millis(20));
    }
    let attach = started.elapsed();
    let waited = run_queue_wait(agent.0.id()).saturating_sub(waited_before);
    sleep(Duration::from_secs(2));
    let pid = agent.0.id();
    // CPU time from the scheduler (ns), not the tick-sampled utime/stime (10 ms steps;
    // a thread that ends within the 10 s takes its time with it: idle, the agent starts none).
    let before = schedstat(pid, 0);
    sleep(IDLE);
    let idle_cpu = schedstat(pid, 0).saturating_sub(before);
    let after = sample(pid, IDLE)?;
    let row = Row {
        spawned,
        attach,
        waited,
        ring_bytes: perf_ring_bytes(pid)?,
        fds: after.fds,
        rss_kib: after.rss_kib,
        idle_cpu_pct: idle_cpu.as_secs_f64() / IDLE.as_secs_f64() * 100.0,
    };
    terminate(pid);
    drop(targets);
    drop(agent);
    Ok(row)
}

/// The time process `pid` spent runnable but waiting for a CPU (`/proc/PID/schedstat`'s
/// second field); zero where the kernel does not say.
fn run_queue_wait(pid: u32) -> Duration {
    schedstat(pid, 1)
}

/// Field `index` of `/proc/PID/task/*/schedstat` summed over the threads alive now (0: time
/// on a CPU, 1: time waiting for one; nanoseconds), zero where the kernel does not say.
fn schedstat(pid: u32, index: usize) -> Duration {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(index)?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// Bytes of `pid`'s perf event mappings (the rings: locked, unswappable kernel memory).
fn perf_ring_bytes(pid: u32) -> Result<u64> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(maps
        .lines()
        .filter(|l| l.ends_with("[perf_event]"))
        .filter_map(|l| {
            let (start, end) = l.split_whitespace().next()?.split_once('-')?;
            Some(u64::from_str_radix(end, 16).ok()? - u64::from_str_radix(start, 16).ok()?)
        })
        .sum())
}
