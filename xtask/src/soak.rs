//! `cargo xtask soak [--minutes N]`: the agent under continuous triggers for a long time,
//! its resident memory, CPU time and open fds sampled every 10 s, so that growth shows.
//! Informative only: nothing asserts a number; the CSV and a summary are the output.
//!
//! Load: a workload whose `lb_work` exceeds the threshold every other call (a function
//! rule, 200 ms cooldown: five snapshots a second, the pipeline never idle), a syscall rule
//! on the same sleeps (1 s cooldown), and a new short-lived process every 2 s (exec/exit
//! churn: discovery, recorder open/close, exit handling). Retention keeps 40 files per rule
//! so the disk stays bounded.
use std::{
    fmt::Write as _,
    fs,
    io::Read as _,
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{bench::build_workload, util::BuildEnv};

const SAMPLE_EVERY: Duration = Duration::from_secs(10);
pub const METRICS_ADDR: &str = "127.0.0.1:9469";

/// One sample of the agent process.
pub struct Sample {
    pub elapsed_s: f64,
    pub rss_kib: u64,
    pub cpu_s: f64,
    pub fds: usize,
    pub triggers: f64,
    pub snapshots: f64,
}

pub fn soak(env: &BuildEnv, minutes: u64) -> Result<()> {
    if !env.is_root {
        bail!("the soak test loads BPF programs: run as root");
    }
    crate::util::run(env.cargo().args(["build", "--release", "-p", "lookback"]))?;
    let dir = env.root.join("target/soak");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    // A name of its own, so that tests running meanwhile (`comm: workload`) and the soak's
    // rules never select each other's processes.
    let workload = dir.join("soakload");
    fs::copy(build_workload(env)?, &workload)?;
    let rules = format!(
        "version: 1\n\
         defaults:\n  capture: {{ backend: sampling, buffer_size: 1MiB }}\n  \
         output: {{ keep_raw: true, retention: {{ max_files: 40, max_bytes: 512MiB }} }}\n\
         rules:\n\
         - name: slow-work\n  target: {{ exe: {w} }}\n  \
         trigger: {{ function: {{ symbol: lb_work, min_duration: 2ms }} }}\n  \
         snapshot: {{ cooldown: 200ms, max_per_hour: 100000 }}\n\
         - name: slow-sleep\n  target: {{ comm: soakload }}\n  \
         trigger: {{ syscall: {{ names: [nanosleep, clock_nanosleep], min_duration: 2ms }} }}\n  \
         snapshot: {{ cooldown: 1s, max_per_hour: 100000 }}\n",
        w = workload.canonicalize()?.display()
    );
    let config = dir.join("rules.yaml");
    fs::write(&config, rules)?;
    let mut agent = start_agent(&env.release_bin(), &config, &dir)?;
    // Every other call 3 ms (slow), the others 100 µs; outlives the soak (killed at the end).
    let calls = (minutes * 60 * 1000).to_string();
    let _steady = Guard(
        Command::new(&workload)
            .args(["calls", &calls, "2", "3000", "100", "1"])
            .stdout(Stdio::null())
            .spawn()?,
    );
    let pid = agent.0.id();
    let started = Instant::now();
    let total = Duration::from_secs(minutes * 60);
    let mut samples = Vec::new();
    let mut next_sample = Duration::ZERO;
    let mut churn = 0u64;
    println!("soak: {minutes} min; sampling the agent (pid {pid}) every {SAMPLE_EVERY:?}");
    while started.elapsed() < total {
        if started.elapsed() >= next_sample {
            let s = sample(pid, started.elapsed())?;
            println!(
                "  {:>6.0} s  rss {:>7} KiB  cpu {:>7.1} s  fds {:>4}  triggers {:>8.0}  snapshots {:>6.0}",
                s.elapsed_s, s.rss_kib, s.cpu_s, s.fds, s.triggers, s.snapshots
            );
            samples.push(s);
            next_sample += SAMPLE_EVERY;
        }
        // Exec/exit churn: a short process that also triggers.
        let _ = Command::new(&workload)
            .args(["calls", "4", "2", "3000", "100", "1"])
            .stdout(Stdio::null())
            .status();
        churn += 1;
        sleep(Duration::from_secs(2));
        if let Ok(Some(status)) = agent.0.try_wait() {
            bail!("the agent exited during the soak: {status} (see target/soak/agent.log)");
        }
    }
    samples.push(sample(pid, started.elapsed())?);
    write_csv(&dir.join("soak.csv"), &samples)?;
    summarize(&samples, churn);
    terminate(pid);
    let status = agent.0.wait()?;
    println!("agent stopped by SIGTERM: {status}");
    Ok(())
}

/// Starts `lookback agent` on `config` with its metrics at [`METRICS_ADDR`], its output
/// and log (`agent.log`) in `dir`, and waits until it is ready.
pub fn start_agent(lookback: &Path, config: &Path, dir: &Path) -> Result<Guard> {
    let log = fs::File::create(dir.join("agent.log"))?;
    let agent = Guard(
        Command::new(lookback)
            .args(["agent", "--config"])
            .arg(config)
            .args(["--metrics-addr", METRICS_ADDR, "--output-dir"])
            .arg(dir.join("out"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting the agent")?,
    );
    wait_ready()?;
    Ok(agent)
}

/// Kills a child on drop (early returns included).
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGTERM through `kill(1)`: xtask has no libc dependency.
pub fn terminate(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

pub fn wait_ready() -> Result<()> {
    let deadline = Instant::now() + Duration::from_mins(1);
    while Instant::now() < deadline {
        if get("/readyz").is_some_and(|(code, _)| code == 200) {
            return Ok(());
        }
        sleep(Duration::from_millis(200));
    }
    bail!("the agent did not become ready (see its log under target/)")
}

pub fn get(path: &str) -> Option<(u16, String)> {
    use std::io::Write as _;
    let mut s = TcpStream::connect(METRICS_ADDR).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text.split_once("\r\n\r\n")?.1.to_owned()))
}

/// Sum of every series of metric `name` whose labels contain `filter`.
pub fn metric_sum(body: &str, name: &str, filter: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

pub fn sample(pid: u32, elapsed: Duration) -> Result<Sample> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the `(comm)`: utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map_or("", |x| x.1);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    let fds = fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    let body = get("/metrics").map(|x| x.1).unwrap_or_default();
    Ok(Sample {
        elapsed_s: elapsed.as_secs_f64(),
        rss_kib,
        cpu_s: ticks / 100.0,
        fds,
        triggers: metric_sum(&body, "lookback_triggers_total", "rule="),
        snapshots: metric_sum(&body, "lookback_snapshots_total", "result=\"ok\""),
    })
}

fn write_csv(path: &Path, samples: &[Sample]) -> Result<()> {
    let mut text = String::from("elapsed_s,rss_kib,cpu_s,fds,triggers,snapshots\n");
    for s in samples {
        let _ = writeln!(
            text,
            "{:.0},{},{:.2},{},{},{}",
            s.elapsed_s, s.rss_kib, s.cpu_s, s.fds, s.triggers, s.snapshots
        );
    }
    fs::write(path, text)?;
    println!("samples: {}", path.display());
    Ok(())
}

/// First/last/max RSS, the RSS slope over the second half (least squares), mean CPU.
fn summarize(samples: &[Sample], churn: u64) {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return;
    };
    let max = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    let half = &samples[samples.len() / 2..];
    #[expect(clippy::cast_precision_loss, reason = "a handful of samples")]
    let n = half.len() as f64;
    #[expect(clippy::cast_precision_loss, reason = "KiB values far below 2^52")]
    let (sx, sy, sxx, sxy) = half.iter().fold((0.0, 0.0, 0.0, 0.0), |(a, b, c, d), s| {
        let y = s.rss_kib as f64;
        (
            a + s.elapsed_s,
            b + y,
            c + s.elapsed_s * s.elapsed_s,
            d + s.elapsed_s * y,
        )
    });
    let slope = if n > 1.0 {
        (n * sxy - sx * sy) / (n * sxx - sx * sx)
    } else {
        0.0
    };
    let cpu = (last.cpu_s - first.cpu_s) / (last.elapsed_s - first.elapsed_s).max(1.0);
    println!(
        "summary: {:.0} min, {} triggers, {} snapshots, {churn} short-lived processes",
        last.elapsed_s / 60.0,
        last.triggers,
        last.snapshots
    );
    println!(
        "  rss first {} KiB, last {} KiB, max {max} KiB; second-half slope {:.1} KiB/min",
        first.rss_kib,
        last.rss_kib,
        slope * 60.0
    );
    println!(
        "  cpu {:.1}% of one core on average; fds {} → {}",
        cpu * 100.0,
        first.fds,
        last.fds
    );
}
