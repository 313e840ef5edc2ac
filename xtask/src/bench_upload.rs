//! `cargo xtask bench --upload-only [--triggers N]`: how long a snapshot takes to leave the
//! node. The release agent uploads each snapshot of a signal rule to a real S3 server
//! (`SeaweedFS`'s `weed server -s3`, installed by `cargo xtask setup`, on loopback); one
//! trigger at a time, the bucket is listed (`curl --aws-sigv4`, every ~10 ms) until the
//! snapshot's `.json` metadata, uploaded last, is there. Reported: trigger → visible (the
//! wall time it was seen minus the trigger's UTC time in the object's stem), the agent's
//! own `lookback_upload_duration_seconds`, and, as the reference in the same run, `curl`
//! uploading (PUT) the same two files per snapshot to another prefix; the agent's CPU per
//! snapshot and its resident memory. Informative only: nothing asserts a time.
//!
//! The traced program is a copy of the test workload named `lbupload`, selected by comm,
//! so that tests running meanwhile (`comm: workload`) and this rule never see each other's
//! processes. The agent's metrics listen on a port of its own (`127.0.0.1:0`).
use std::{
    collections::HashSet,
    fs,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};

use crate::soak::{Guard, Sample, metric_sum, sample, terminate};

const ACCESS_KEY: &str = "lookback-bench";
const SECRET_KEY: &str = "lookback-bench-secret";
const BUCKET: &str = "lookback-bench";
/// The agent's prefix; the reference PUTs go under [`REF_PREFIX`].
const PREFIX: &str = "up";
const REF_PREFIX: &str = "ref";
const NODE: &str = "bench-node";
const RULE: &str = "usr1";
/// The workload copy's name (and comm).
const COMM: &str = "lbupload";
/// Pause between two listings while waiting for an object.
const POLL: Duration = Duration::from_millis(10);

pub fn upload(root: &Path, lookback: &Path, workload: &Path, triggers: usize) -> Result<()> {
    if triggers == 0 {
        bail!("--triggers must be at least 1");
    }
    let weed = root.join(".tools/python/bin/weed");
    if !weed.is_file() {
        bail!(
            "{} is missing: cargo xtask setup installs it",
            weed.display()
        );
    }
    let dir = root.join("target/bench/upload");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let target = dir.join(COMM);
    fs::copy(workload, &target).context("copying the workload")?;
    let result = measure(&weed, &dir, lookback, &target, triggers);
    // The guards inside `measure` have stopped the agent and the server by now.
    if result.is_ok() {
        let _ = fs::remove_dir_all(&dir);
    } else {
        eprintln!(
            "xtask bench: the agent's and weed's logs stay in {}",
            dir.display()
        );
    }
    result
}

/// What one run measured.
struct Results {
    n: usize,
    /// Trigger → `.json` visible, ms, sorted.
    visible_ms: Vec<f64>,
    /// The first trigger's, ms.
    first_ms: f64,
    /// Trigger → the local `.json` written (its mtime), ms, sorted.
    local_ms: Vec<f64>,
    /// One listing request, ms, sorted.
    list_ms: Vec<f64>,
    /// curl's two PUTs per snapshot, ms, sorted.
    curl_ms: Vec<f64>,
    /// `.fxt.gz` + `.json` bytes of all snapshots.
    bytes: u64,
    /// `lookback_upload_duration_seconds` sum and count.
    up_sum: f64,
    up_count: f64,
    uploads_ok: f64,
    uploads_err: f64,
    before: Sample,
    after: Sample,
    hwm_kib: u64,
}

fn measure(weed: &Path, dir: &Path, lookback: &Path, target: &Path, n: usize) -> Result<()> {
    let s3 = Weed::start(weed, dir)?;
    s3.create_bucket()?;
    let rules = format!(
        "version: 1\n\
         rules:\n\
         - name: {RULE}\n  target: {{ comm: {COMM} }}\n  \
         capture: {{ backend: sampling, buffer_size: 256KiB }}\n  \
         trigger: {{ signal: {{ signals: [SIGUSR1] }} }}\n  \
         snapshot: {{ cooldown: 0s, max_per_hour: 100000 }}\n  \
         output:\n    retention: {{ max_files: 100000, max_bytes: 16GiB }}\n    \
         upload: {{ url: 's3://{BUCKET}/{PREFIX}', endpoint: '{}', allow_http: true }}\n",
        s3.endpoint()
    );
    let config = dir.join("rules.yaml");
    fs::write(&config, rules)?;
    // The server's first write allocates its volumes (seconds): done here, so that neither
    // the agent's first upload nor curl's pays for it.
    let warm_up = format!("/{BUCKET}/{REF_PREFIX}/warm-up");
    let (code, body) = s3.request("PUT", &warm_up, Some(&config))?;
    if code != 200 {
        bail!("curl PUT {warm_up}: HTTP {code}: {body}");
    }
    // Declared after the server: dropped (SIGTERM) before it on every return.
    let mut agent = Agent::start(lookback, &config, dir, &s3.endpoint())?;
    let pid = agent.child.id();
    let before = sample(pid, Duration::ZERO)?;
    println!("upload bench: {n} triggers, one at a time (agent pid {pid})");
    let (stems, mut visible_ms, mut list_ms) = trigger_all(&s3, &mut agent, target, n)?;
    let after = sample(pid, Duration::ZERO)?;
    let hwm_kib = status_kib(pid, "VmHWM:")?;
    let body = agent.get("/metrics").unwrap_or_default();
    let hist = |suffix: &str| {
        metric_sum(
            &body,
            &format!("lookback_upload_duration_seconds_{suffix}"),
            "",
        )
    };
    let spool = dir.join("out").join(RULE);
    let mut local_ms = local_written(&spool, &stems)?;
    let (mut curl_ms, bytes) = reference_puts(&s3, &spool, &stems)?;
    let stopped = agent.stop();
    drop(s3);
    let first_ms = visible_ms[0];
    visible_ms.sort_by(f64::total_cmp);
    local_ms.sort_by(f64::total_cmp);
    curl_ms.sort_by(f64::total_cmp);
    list_ms.sort_by(f64::total_cmp);
    print_table(&Results {
        n,
        visible_ms,
        first_ms,
        local_ms,
        list_ms,
        curl_ms,
        bytes,
        up_sum: hist("sum"),
        up_count: hist("count"),
        uploads_ok: metric_sum(&body, "lookback_uploads_total", "result=\"ok\""),
        uploads_err: metric_sum(&body, "lookback_uploads_total", "result=\"error\""),
        before,
        after,
        hwm_kib,
    });
    if let Err(err) = stopped {
        eprintln!("xtask bench: {err:#}");
    }
    Ok(())
}

/// `n` triggers, one at a time, each waited for until its `.json` is listed: the stems,
/// trigger → visible (ms) of each, and the time of every listing request (ms).
fn trigger_all(
    s3: &Weed,
    agent: &mut Agent,
    target: &Path,
    n: usize,
) -> Result<(Vec<String>, Vec<f64>, Vec<f64>)> {
    let listing = format!("/{BUCKET}?list-type=2&prefix={PREFIX}%2F{NODE}%2F{RULE}%2F");
    let mut seen = HashSet::new();
    let mut stems = Vec::with_capacity(n);
    let mut visible_ms = Vec::with_capacity(n);
    let mut list_ms = Vec::new();
    for i in 0..n {
        let workload_pid = agent.trigger_once(target)?;
        let needle = format!("Z-{workload_pid}-");
        let deadline = Instant::now() + Duration::from_mins(1);
        let (stem, seen_ns) = loop {
            let asked = Instant::now();
            let (code, body) = s3.request("GET", &listing, None)?;
            let now_ns = unix_ns_now();
            list_ms.push(ms(asked.elapsed()));
            if code != 200 {
                bail!("listing {listing}: HTTP {code}: {body}");
            }
            let found = keys(&body).into_iter().find_map(|key| {
                let name = key.rsplit('/').next()?;
                let stem = name.strip_suffix(".json")?;
                (stem.contains(&needle) && !seen.contains(stem)).then(|| stem.to_owned())
            });
            if let Some(stem) = found {
                break (stem, now_ns);
            }
            if Instant::now() > deadline {
                bail!(
                    "trigger {i}: no {needle}*.json in the bucket after 60 s; the agent's log:\n{}",
                    agent.log()
                );
            }
            agent.check_running()?;
            sleep(POLL);
        };
        let trigger_ns = stem_unix_ns(&stem).with_context(|| format!("stem {stem}"))?;
        visible_ms.push(ns_to_ms(seen_ns.saturating_sub(trigger_ns)));
        seen.insert(stem.clone());
        stems.push(stem);
    }
    Ok((stems, visible_ms, list_ms))
}

/// Trigger → the agent's local `.json` of each stem written (its mtime), ms: the part
/// of trigger → visible before the upload starts.
fn local_written(spool: &Path, stems: &[String]) -> Result<Vec<f64>> {
    stems
        .iter()
        .map(|stem| {
            let file = spool.join(format!("{stem}.json"));
            let modified = fs::metadata(&file)
                .and_then(|m| m.modified())
                .with_context(|| format!("{} (the agent's local copy)", file.display()))?;
            let written_ns = modified
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            let trigger_ns = stem_unix_ns(stem).with_context(|| format!("stem {stem}"))?;
            Ok(ns_to_ms(written_ns.saturating_sub(trigger_ns)))
        })
        .collect()
}

/// The reference: a plain client uploading (PUT) the agent's local copies of the same files
/// (`.fxt.gz`, then `.json`), one snapshot after the other. Per snapshot (ms), and the
/// bytes in all.
fn reference_puts(s3: &Weed, spool: &Path, stems: &[String]) -> Result<(Vec<f64>, u64)> {
    let mut curl_ms = Vec::with_capacity(stems.len());
    let mut bytes = 0u64;
    for stem in stems {
        let mut total = Duration::ZERO;
        for ext in ["fxt.gz", "json"] {
            let file = spool.join(format!("{stem}.{ext}"));
            bytes += fs::metadata(&file)
                .with_context(|| format!("{} (the agent's local copy)", file.display()))?
                .len();
            let key = format!("/{BUCKET}/{REF_PREFIX}/{NODE}/{RULE}/{stem}.{ext}");
            let started = Instant::now();
            let (code, body) = s3.request("PUT", &key, Some(&file))?;
            total += started.elapsed();
            if code != 200 {
                bail!("curl PUT {key}: HTTP {code}: {body}");
            }
        }
        curl_ms.push(ms(total));
    }
    Ok((curl_ms, bytes))
}

fn print_table(r: &Results) {
    let n = r.n;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let kernel = Command::new("uname")
        .arg("-r")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let per = |x: f64| x / count_f64(n);
    let (up_sum, up_count) = (r.up_sum, r.up_count);
    println!();
    println!(
        "| upload of one snapshot to S3 (`SeaweedFS` on loopback), {n} triggers one at a time | value |"
    );
    println!("|---|---|");
    println!(
        "| lookback: trigger → `.json` visible in a listing, p50 / p99 / max | {:.1} / {:.1} / {:.1} ms |",
        pct(&r.visible_ms, 50),
        pct(&r.visible_ms, 99),
        r.visible_ms[r.visible_ms.len() - 1]
    );
    println!(
        "| lookback: the first trigger's (the agent's first connection to the store) | {:.1} ms |",
        r.first_ms
    );
    println!(
        "| lookback: trigger → local `.json` written (its mtime), p50 / p99 | {:.1} / {:.1} ms |",
        pct(&r.local_ms, 50),
        pct(&r.local_ms, 99)
    );
    println!(
        "| lookback: `lookback_upload_duration_seconds`, mean (sum / count) | {:.1} ms ({up_sum:.3} s / {up_count:.0}) |",
        if up_count > 0.0 {
            up_sum / up_count * 1000.0
        } else {
            f64::NAN
        }
    );
    println!(
        "| lookback: uploads ok / failed attempts | {:.0} / {:.0} |",
        r.uploads_ok, r.uploads_err
    );
    println!(
        "| curl `--aws-sigv4 -T`, `.fxt.gz` + `.json` of each snapshot, p50 / p99 | {:.1} / {:.1} ms |",
        pct(&r.curl_ms, 50),
        pct(&r.curl_ms, 99)
    );
    println!(
        "| lookback trigger → visible p50 ÷ curl p50 | {:.1} × |",
        pct(&r.visible_ms, 50) / pct(&r.curl_ms, 50)
    );
    let curl_mean = r.curl_ms.iter().sum::<f64>() / count_f64(r.curl_ms.len());
    println!(
        "| lookback upload duration mean ÷ curl mean ({curl_mean:.1} ms) | {:.2} × |",
        up_sum / up_count * 1000.0 / curl_mean
    );
    println!(
        "| one listing request (the poll's floor, plus ≤ {} ms between polls), p50 / p99 | {:.1} / {:.1} ms |",
        POLL.as_millis(),
        pct(&r.list_ms, 50),
        pct(&r.list_ms, 99)
    );
    #[expect(clippy::cast_precision_loss, reason = "display only")]
    let kib = r.bytes as f64 / 1024.0;
    println!(
        "| snapshot size, `.fxt.gz` + `.json`, mean | {:.1} KiB |",
        per(kib)
    );
    println!(
        "| agent CPU (utime + stime) per snapshot | {:.3} s ({:.2} s → {:.2} s) |",
        per(r.after.cpu_s - r.before.cpu_s),
        r.before.cpu_s,
        r.after.cpu_s
    );
    println!(
        "| agent RSS before / after / high-water mark | {:.1} / {:.1} / {:.1} MiB |",
        mib(r.before.rss_kib),
        mib(r.after.rss_kib),
        mib(r.hwm_kib)
    );
    println!("| machine | {cpus} CPUs, kernel {kernel} |");
}

/// `SeaweedFS` on loopback; killed on drop.
struct Weed {
    _child: Guard,
    s3_port: u16,
}

impl Weed {
    fn start(weed: &Path, dir: &Path) -> Result<Self> {
        let data = dir.join("weed");
        fs::create_dir_all(&data)?;
        let identities = dir.join("identities.json");
        fs::write(
            &identities,
            format!(
                r#"{{"identities":[{{"name":"lookback","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
            ),
        )?;
        let [master, volume, filer, s3] = free_ports()?;
        let log = fs::File::create(dir.join("weed.log"))?;
        let child = Guard(
            Command::new(weed)
                .arg("server")
                .arg(format!("-dir={}", data.display()))
                .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
                .arg(format!("-master.port={master}"))
                .arg(format!("-volume.port={volume}"))
                .arg(format!("-filer.port={filer}"))
                .args([
                    "-s3",
                    "-s3.port.iceberg=0",
                    "-s3.port.lance=0",
                    "-volume.max=0",
                    "-s3.autoCreateBucket=false",
                ])
                .arg(format!("-s3.port={s3}"))
                .arg(format!("-s3.config={}", identities.display()))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting weed server")?,
        );
        let server = Self {
            _child: child,
            s3_port: s3,
        };
        let deadline = Instant::now() + Duration::from_mins(1);
        // A bucket can be made once the filer and a volume server are up, not before.
        while server.request("GET", "/", None).map_or(0, |r| r.0) != 200 {
            if Instant::now() > deadline {
                bail!(
                    "the S3 server did not answer on {} (see {})",
                    server.endpoint(),
                    dir.join("weed.log").display()
                );
            }
            sleep(Duration::from_millis(250));
        }
        Ok(server)
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    fn create_bucket(&self) -> Result<()> {
        let (code, body) = self.request("PUT", &format!("/{BUCKET}"), None)?;
        if code != 200 {
            bail!("creating bucket {BUCKET}: HTTP {code}: {body}");
        }
        Ok(())
    }

    /// `curl --aws-sigv4` of `METHOD path` (uploading `body`): (status, response body).
    fn request(&self, method: &str, path: &str, body: Option<&Path>) -> Result<(u16, String)> {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"])
            .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "-u"])
            .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"));
        match body {
            Some(file) => cmd.arg("-T").arg(file),
            None => cmd.args(["-X", method]),
        };
        let out = cmd
            .arg(format!("{}{path}", self.endpoint()))
            .stdin(Stdio::null())
            .output()
            .context("running curl")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        Ok((code.trim().parse().unwrap_or(0), body.to_owned()))
    }
}

/// Four loopback ports free, whose gRPC twins (+10000) are free too.
fn free_ports() -> Result<[u16; 4]> {
    let mut ports = Vec::new();
    for _ in 0..1000 {
        if ports.len() == 4 {
            break;
        }
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let free = port
            .checked_add(10_000)
            .is_some_and(|t| TcpListener::bind(("127.0.0.1", t)).is_ok());
        if free && port < 55_000 && !ports.contains(&port) {
            ports.push(port);
        }
    }
    match ports[..] {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => bail!("no four free loopback ports with free +10000 twins"),
    }
}

/// The agent, its log file and metrics address; SIGTERM (then SIGKILL after 10 s) on drop.
struct Agent {
    child: Child,
    log: PathBuf,
    addr: String,
}

impl Agent {
    fn start(lookback: &Path, config: &Path, dir: &Path, endpoint: &str) -> Result<Self> {
        let log = dir.join("agent.log");
        let child = Command::new(lookback)
            .args(["agent", "--config"])
            .arg(config)
            .args(["--metrics-addr", "127.0.0.1:0", "--output-dir"])
            .arg(dir.join("out"))
            .envs([
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
                ("AWS_REGION", "us-east-1"),
                ("NODE_NAME", NODE),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?)
            .spawn()
            .context("starting the agent")?;
        let mut agent = Self {
            child,
            log,
            addr: String::new(),
        };
        let line = agent.wait_log("metrics on http://", Duration::from_mins(1))?;
        let addr = line
            .split("://")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .context("no metrics address in the agent's log")?;
        agent.addr = String::from(addr);
        let deadline = Instant::now() + Duration::from_mins(1);
        while agent.get_code("/readyz") != Some(200) {
            if Instant::now() > deadline {
                bail!("the agent did not become ready:\n{}", agent.log());
            }
            agent.check_running()?;
            sleep(Duration::from_millis(100));
        }
        println!("agent ready on {} (S3 at {endpoint})", agent.addr);
        Ok(agent)
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("the agent exited: {status}\n{}", self.log());
        }
        Ok(())
    }

    /// The first log line containing `needle`.
    fn wait_log(&mut self, needle: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.log().lines().find(|l| l.contains(needle)) {
                return Ok(line.to_owned());
            }
            if Instant::now() > deadline {
                bail!("no log line with {needle:?}:\n{}", self.log());
            }
            self.check_running()?;
            sleep(Duration::from_millis(5));
        }
    }

    /// Runs the workload once (`--wait usr1`), let go once the agent traces it, as the
    /// integration tests do: one SIGUSR1, one snapshot. Returns its pid.
    fn trigger_once(&mut self, target: &Path) -> Result<u32> {
        let mut child = Guard(
            Command::new(target)
                .args(["--wait", "usr1"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .context("starting the workload")?,
        );
        let pid = child.0.id();
        self.wait_log(&format!("tracing process {pid} "), Duration::from_secs(10))?;
        child
            .0
            .stdin
            .take()
            .context("the workload's stdin")?
            .write_all(b"go\n")?;
        let status = child.0.wait()?;
        if !status.success() {
            bail!("workload usr1: {status}");
        }
        Ok(pid)
    }

    fn request(&self, path: &str) -> Option<String> {
        let mut s = TcpStream::connect(&self.addr).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        Some(text)
    }

    fn get_code(&self, path: &str) -> Option<u16> {
        self.request(path)?.split_whitespace().nth(1)?.parse().ok()
    }

    fn get(&self, path: &str) -> Option<String> {
        Some(self.request(path)?.split_once("\r\n\r\n")?.1.to_owned())
    }

    /// SIGTERM; waits up to 10 s, then SIGKILL. Says how it ended.
    fn stop(&mut self) -> Result<()> {
        terminate(self.child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                bail!("the agent exited with {status} after SIGTERM");
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the agent ignored SIGTERM for 10 s: killed");
            }
            sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.stop();
        }
    }
}

/// The `<Key>`s of a `ListObjectsV2` answer.
fn keys(body: &str) -> Vec<&str> {
    body.split("<Key>")
        .skip(1)
        .filter_map(|rest| rest.split("</Key>").next())
        .collect()
}

/// The UTC time at the start of a stem (`YYYYmmddTHHMMSS.ffffffZ-PID-TID`), ns since the
/// Unix epoch (as the agent's `upload::layout::stem_unix_ns`).
fn stem_unix_ns(stem: &str) -> Option<u64> {
    let b = stem.as_bytes();
    if b.len() < 23 || b[8] != b'T' || b[15] != b'.' || b[22] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| stem.get(r)?.parse::<u64>().ok();
    let (y, m, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss, us) = (num(9..11)?, num(11..13)?, num(13..15)?, num(16..22)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || y < 1970 {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000_000 + us * 1000)
}

fn unix_ns_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A `/proc/PID/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// The `p`th percentile of sorted `v` (as the freeze table takes it).
fn pct(v: &[f64], p: usize) -> f64 {
    v[(v.len() * p / 100).min(v.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[expect(clippy::cast_precision_loss, reason = "display only")]
fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[expect(clippy::cast_precision_loss, reason = "display only")]
fn count_f64(n: usize) -> f64 {
    n as f64
}

#[expect(clippy::cast_precision_loss, reason = "display only")]
fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::stem_unix_ns;

    #[test]
    fn stems_give_their_utc_time() {
        // 2026-12-06T23:31:26.563004Z, as the agent's layout test has it.
        assert_eq!(
            stem_unix_ns("20261206T233126.563004Z-8045-8045"),
            Some(1_796_599_886_563_004_000)
        );
        assert_eq!(stem_unix_ns("x"), None);
    }
}
