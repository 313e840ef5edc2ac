//! `cargo xtask pt-smoke`: the one command to run on the first machine with Intel PT
//! (bare metal, or a VM with PT passed through). It needs no network and no setup: the
//! release `lookback` (`LOOKBACK_BIN`, else `target/release/lookback`, built when cargo is
//! there) and a C compiler for the workload.
//!
//! What it runs, each a real capture of the test workload (`tests/workloads/workload.c`)
//! decoded to a Chrome JSON trace: `lookback check --json`; `run` with a function latency
//! trigger (with and without an address filter); `run` with a syscall trigger and with a
//! signal trigger; `attach` to a running copy (with and without the filter). The
//! function cases know their answer: `workload calls 10 5 3000 100 1` makes its 5th call
//! of `lb_work` the first slow one, so the trace up to the trigger holds exactly 5
//! `lb_work` slices; each slice must last what the workload measured around that call
//! (`call_ns=`, within 20 µs or 5 %: PT's timing, MTC/CYC with the recorded CPU's
//! ratios), and the trigger, taken in the kernel at the exit probe, must sit within 50 µs
//! of the end of the 5th (the TSC/`CLOCK_MONOTONIC` pair of the conversion read at one
//! moment). Every case also reports the time from the trace's last event to its trigger
//! marker (`trigger−end`: negative when the trace goes on past the trigger; more than
//! 1 ms positive fails: the trace must reach its trigger) and fails on decode errors (the
//! snapshot holds every byte of code the workload runs) and when `lookback check` fails.
//!
//! Out: a table on stdout and `target/pt-smoke/report.txt` (with `check.json` and the
//! traces beside it); exit status 1 on any mismatch. On a machine without PT it says so
//! and exits 0. `--backend sampling` runs the same cases with the sampling recorder, to
//! exercise this script where PT is missing (slices are then not counted: sampling does
//! not see every call).
use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// The workload's calls of `lb_work` up to the first slow one (its 5th).
const CALLS_TO_TRIGGER: usize = 5;
/// The function cases' workload: 10 calls, every 5th sleeps 3 ms, the others 100 µs.
const CALLS: [&str; 6] = ["calls", "10", "5", "3000", "100", "1"];
/// How far before its trigger a trace may end and still count as reaching it.
const MAX_GAP_NS: f64 = 1_000_000.0;

/// One capture to make and what its trace must show.
struct Case {
    name: &'static str,
    trigger: &'static str,
    workload: &'static [&'static str],
    filter: bool,
    attach: bool,
    /// `lb_work` slices the trace must hold (PT only).
    calls: Option<usize>,
}

const CASES: [Case; 6] = [
    Case {
        name: "run, function latency",
        trigger: "func:lb_work>1ms",
        workload: &CALLS,
        filter: false,
        attach: false,
        calls: Some(CALLS_TO_TRIGGER),
    },
    Case {
        name: "run, function latency, address filter",
        trigger: "func:lb_work>1ms",
        workload: &CALLS,
        filter: true,
        attach: false,
        calls: Some(CALLS_TO_TRIGGER),
    },
    Case {
        name: "run, syscall",
        trigger: "syscall:openat=ENOENT",
        workload: &["enoent", "3"],
        filter: false,
        attach: false,
        calls: None,
    },
    Case {
        name: "run, signal",
        trigger: "signal:SIGUSR1",
        workload: &["usr1"],
        filter: false,
        attach: false,
        calls: None,
    },
    Case {
        name: "attach, function latency",
        trigger: "func:lb_work>1ms",
        workload: &CALLS,
        filter: false,
        attach: true,
        calls: Some(CALLS_TO_TRIGGER),
    },
    Case {
        name: "attach, function latency, address filter",
        trigger: "func:lb_work>1ms",
        workload: &CALLS,
        filter: true,
        attach: true,
        calls: Some(CALLS_TO_TRIGGER),
    },
];

/// How far a `lb_work` slice may be from the workload's own measure of the call: the
/// larger of this and [`MAX_CALL_SKEW`] of the call.
const MAX_CALL_DIFF_NS: f64 = 20_000.0;
const MAX_CALL_SKEW: f64 = 0.05;
/// How far the trigger may be from the end of the call that fired it.
const MAX_TRIGGER_DIFF_NS: f64 = 50_000.0;

/// What a trace shows, read from its JSON lines.
#[derive(Debug, Default)]
struct TraceFacts {
    events: usize,
    lb_work: usize,
    /// Each `lb_work` slice's start and end, in trace order.
    lb_work_slices: Vec<(f64, f64)>,
    decode_errors: usize,
    trigger_ns: Option<f64>,
    last_ns: Option<f64>,
}

/// Reads a Chrome JSON trace as lookback writes it (one event per line).
fn facts(text: &str) -> TraceFacts {
    let mut f = TraceFacts::default();
    // The workload calls `lb_work` from one thread, never nested.
    let mut open = None;
    for line in text.lines() {
        let ts = field(line, "\"ts\":").and_then(|v| v.parse::<f64>().ok());
        let Some(ts_ns) = ts.map(|us| us * 1000.0) else {
            continue;
        };
        f.events += 1;
        let name = field(line, "\"name\":").unwrap_or_default();
        if name.starts_with("\"trigger: ") {
            f.trigger_ns = Some(ts_ns);
            continue;
        }
        f.last_ns = Some(f.last_ns.map_or(ts_ns, |l: f64| l.max(ts_ns)));
        if line.contains("\"ph\":\"B\"") && name == "\"lb_work\"" {
            f.lb_work += 1;
            open = Some(ts_ns);
        }
        if line.contains("\"ph\":\"E\"")
            && name == "\"lb_work\""
            && let Some(start) = open.take()
        {
            f.lb_work_slices.push((start, ts_ns));
        }
        if name.starts_with("\"[decode error") && line.contains("\"ph\":\"B\"") {
            f.decode_errors += 1;
        }
    }
    f
}

/// The raw JSON value after `key` in `line`, up to the next `,` or `}` outside a string.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = &line[line.find(key)? + key.len()..];
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in rest.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            ',' | '}' if !in_string => return Some(&rest[..i]),
            _ => {}
        }
    }
    Some(rest)
}

pub fn pt_smoke(root: &Path, backend: &str) -> Result<()> {
    let pmu = Path::new("/sys/bus/event_source/devices/intel_pt");
    if backend == "intel-pt" && !pmu.exists() {
        println!(
            "pt-smoke: no Intel PT on this machine ({} missing): nothing to check here.\n\
             On a machine with PT this runs `lookback check`, then {} captures through run and\n\
             attach (function, syscall and signal triggers, with and without an address\n\
             filter), and compares each trace with the workload's own calls.",
            pmu.display(),
            CASES.len()
        );
        return Ok(());
    }
    let out = root.join("target/pt-smoke");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let bin = lookback_bin(root)?;
    let workload = build_workload(root, &out)?;
    let mut report = String::new();
    let check = Command::new(&bin)
        .args(["check", "--json"])
        .output()
        .with_context(|| format!("running {} check", bin.display()))?;
    std::fs::write(out.join("check.json"), &check.stdout)?;
    let _ = writeln!(
        report,
        "lookback check --json: {} ({} bytes in check.json)",
        check.status,
        check.stdout.len()
    );
    let mut failed = 0;
    if !check.status.success() {
        failed += 1;
        let _ = writeln!(
            report,
            "MISMATCH: lookback check failed on a machine with Intel PT: {}",
            String::from_utf8_lossy(&check.stderr).trim()
        );
    }
    let _ = writeln!(
        report,
        "{:<44} {:>9} {:>8} {:>12} {:>7}  result",
        "case", "lb_work", "events", "trigger−end", "errors"
    );
    for (i, case) in CASES.iter().enumerate() {
        let trace = out.join(format!("case{i}.json"));
        let _ = std::fs::remove_file(&trace);
        let outcome = capture(&bin, &workload, case, &trace, backend).and_then(|stdout| {
            let text = std::fs::read_to_string(&trace).context("no trace written")?;
            Ok((text, stdout))
        });
        let line = match outcome {
            Ok((text, stdout)) => {
                let f = facts(&text);
                let problems = judge(case, &f, backend, &call_ns(&stdout));
                if !problems.is_empty() {
                    failed += 1;
                }
                let gap = match (f.trigger_ns, f.last_ns) {
                    (Some(t), Some(l)) => format!("{:.1} µs", (t - l) / 1000.0),
                    _ => "-".to_owned(),
                };
                let expected = case.calls.map_or(String::new(), |n| format!("/{n}"));
                format!(
                    "{:<44} {:>9} {:>8} {:>12} {:>7}  {}\n",
                    case.name,
                    format!("{}{expected}", f.lb_work),
                    f.events,
                    gap,
                    f.decode_errors,
                    if problems.is_empty() {
                        "ok".to_owned()
                    } else {
                        format!("MISMATCH: {}", problems.join("; "))
                    }
                )
            }
            Err(e) => {
                failed += 1;
                format!("{:<44} FAILED: {e:#}\n", case.name)
            }
        };
        print!("{line}");
        report.push_str(&line);
    }
    std::fs::write(out.join("report.txt"), &report)?;
    println!("\n{report}\nreport and traces: {}", out.display());
    if failed > 0 {
        bail!("{failed} of {} PT smoke cases did not match", CASES.len());
    }
    Ok(())
}

/// The workload's own measure of each call (`call_ns=` lines), in call order.
fn call_ns(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("call_ns=")?.trim().parse().ok())
        .collect()
}

/// What is wrong with a case's trace, given what the workload measured (`calls`, its
/// `call_ns=` values); empty when nothing.
fn judge(case: &Case, f: &TraceFacts, backend: &str, calls: &[f64]) -> Vec<String> {
    let mut problems = Vec::new();
    if f.events == 0 {
        problems.push("empty trace".to_owned());
    }
    if f.decode_errors > 0 {
        problems.push(format!("{} decode error(s)", f.decode_errors));
    }
    match (f.trigger_ns, f.last_ns) {
        (None, _) => problems.push("no trigger marker".to_owned()),
        (Some(t), Some(l)) if t - l > MAX_GAP_NS => problems.push(format!(
            "the trace ends {:.0} µs before its trigger",
            (t - l) / 1000.0
        )),
        _ => {}
    }
    if backend == "intel-pt"
        && let Some(n) = case.calls
        && f.lb_work != n
    {
        problems.push(format!(
            "{} lb_work calls in the trace, the workload made {n}",
            f.lb_work
        ));
    }
    if backend == "intel-pt" && case.calls.is_some() {
        problems.extend(timing_problems(f, calls));
    }
    problems
}

/// The PT timing checks of a function case: each `lb_work` slice against the
/// workload's measure of the same call, and the trigger against the end of the last one.
fn timing_problems(f: &TraceFacts, calls: &[f64]) -> Vec<String> {
    let mut problems = Vec::new();
    if calls.len() < f.lb_work_slices.len() {
        problems.push(format!(
            "the workload printed {} call_ns= lines for {} slices",
            calls.len(),
            f.lb_work_slices.len()
        ));
        return problems;
    }
    for (i, (&(start, end), &measured)) in f.lb_work_slices.iter().zip(calls).enumerate() {
        let traced = end - start;
        if (traced - measured).abs() > MAX_CALL_DIFF_NS.max(measured * MAX_CALL_SKEW) {
            problems.push(format!(
                "call {}: {:.1} µs in the trace, {:.1} µs by the workload's clock",
                i + 1,
                traced / 1000.0,
                measured / 1000.0
            ));
        }
    }
    if let (Some(t), Some(&(_, end))) = (f.trigger_ns, f.lb_work_slices.last())
        && (t - end).abs() > MAX_TRIGGER_DIFF_NS
    {
        problems.push(format!(
            "the trigger is {:.1} µs from the end of the call that fired it",
            (t - end) / 1000.0
        ));
    }
    problems
}

/// Records one case into `trace` (`run`, or `attach` to a copy started waiting); returns
/// the workload's stdout.
fn capture(
    bin: &Path,
    workload: &Path,
    case: &Case,
    trace: &Path,
    backend: &str,
) -> Result<String> {
    let mut cmd = Command::new(bin);
    cmd.arg(if case.attach { "attach" } else { "run" })
        .args([
            "--backend",
            backend,
            "--trigger",
            case.trigger,
            "--max-snapshots",
            "1",
        ])
        .arg("-o")
        .arg(trace);
    if case.filter {
        cmd.arg("--trace-binary").arg(workload);
    }
    if !case.attach {
        // `run` hands the command its own stdout: the workload's `call_ns=` lines.
        let out = cmd
            .arg("--")
            .arg(workload)
            .args(case.workload)
            .stderr(Stdio::inherit())
            .output()?;
        if !out.status.success() {
            bail!("lookback run: {}", out.status);
        }
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let mut target = Command::new(workload)
        .arg("--wait")
        .args(case.workload)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the workload")?;
    let mut tracer = cmd
        .arg("-p")
        .arg(target.id().to_string())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting lookback attach")?;
    let stderr = tracer.stderr.take().context("attach's stderr")?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if line.contains("waiting for triggers") {
                let _ = ready_tx.send(());
            }
        }
    });
    let ready = ready_rx.recv_timeout(Duration::from_secs(30)).is_ok();
    if let Some(mut stdin) = target.stdin.take() {
        let _ = stdin.write_all(b"go\n");
    }
    let mut stdout = String::new();
    if let Some(mut pipe) = target.stdout.take() {
        use std::io::Read as _;
        pipe.read_to_string(&mut stdout)?;
    }
    let target_status = target.wait()?;
    let deadline = Instant::now() + Duration::from_mins(1);
    let status = loop {
        if let Some(status) = tracer.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = tracer.kill();
            bail!("lookback attach did not end after its target");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !ready {
        bail!("lookback attach never said `waiting for triggers`");
    }
    if !target_status.success() || !status.success() {
        bail!("workload {target_status}, lookback attach {status}");
    }
    Ok(stdout)
}

/// `LOOKBACK_BIN`, else the release build (built when missing and cargo is there).
fn lookback_bin(root: &Path) -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("LOOKBACK_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let bin = root.join("target/release/lookback");
    if !bin.exists() {
        crate::util::run(
            Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .current_dir(root)
                .args(["build", "--release", "-p", "lookback"]),
        )
        .context("building the release lookback (or set LOOKBACK_BIN)")?;
    }
    Ok(bin)
}

/// Builds the test workload (and its library) into `out`, as the integration tests do.
fn build_workload(root: &Path, out: &Path) -> Result<PathBuf> {
    let src = root.join("tests/workloads");
    let lib = out.join("libworkload.so");
    crate::util::run(
        Command::new("cc")
            .args(["-O1", "-g", "-fPIC", "-shared", "-o"])
            .arg(&lib)
            .arg(src.join("libworkload.c")),
    )
    .context("building the workload's library (needs a C compiler)")?;
    let bin = out.join("workload");
    crate::util::run(
        Command::new("cc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
            .arg(&bin)
            .arg(src.join("workload.c"))
            .arg(format!("-L{}", out.display()))
            .arg("-lworkload")
            .arg(format!("-Wl,-rpath,{}", out.display())),
    )
    .context("building the workload")?;
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_trace_is_read_line_by_line() {
        let text = "{\"traceEvents\":[\n\
            {\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"w\"}},\n\
            {\"ph\":\"B\",\"name\":\"lb_work\",\"cat\":\"lookback\",\"pid\":1,\"tid\":1,\"ts\":10.5},\n\
            {\"ph\":\"E\",\"name\":\"lb_work\",\"cat\":\"lookback\",\"pid\":1,\"tid\":1,\"ts\":20},\n\
            {\"ph\":\"B\",\"name\":\"[decode error: x, y]\",\"pid\":1,\"tid\":1,\"ts\":21},\n\
            {\"ph\":\"i\",\"s\":\"t\",\"name\":\"trigger: func:lb_work>1ms\",\"pid\":1,\"tid\":1,\"ts\":22}]}\n";
        let f = facts(text);
        assert_eq!((f.events, f.lb_work, f.decode_errors), (4, 1, 1));
        assert_eq!(f.trigger_ns, Some(22_000.0));
        assert_eq!(f.last_ns, Some(21_000.0));
        assert_eq!(f.lb_work_slices, [(10_500.0, 20_000.0)]);
        let case = &CASES[0];
        assert_eq!(
            judge(case, &f, "intel-pt", &[9_500.0]),
            [
                "1 decode error(s)",
                "1 lb_work calls in the trace, the workload made 5"
            ]
        );
        assert_eq!(judge(case, &f, "sampling", &[]), ["1 decode error(s)"]);
        assert_eq!(
            field("{\"name\":\"a,b\",\"ts\":1}", "\"name\":"),
            Some("\"a,b\"")
        );
    }

    #[test]
    fn pt_timing_is_held_to_the_workloads_clock_and_the_trigger() {
        let slices = |ends: &[(f64, f64)]| TraceFacts {
            lb_work_slices: ends.to_vec(),
            trigger_ns: ends.last().map(|&(_, e)| e + 5_000.0),
            ..TraceFacts::default()
        };
        // 100 µs calls traced within 20 µs, a 3 ms call within 5 %, the trigger 5 µs
        // after the last call's end: right.
        let good = slices(&[(0.0, 110_000.0), (200_000.0, 3_290_000.0)]);
        assert!(timing_problems(&good, &[100_000.0, 3_100_000.0, 100_000.0]).is_empty());
        // A call 30 µs off, and a trigger 120 µs after its call (the clock pair read at
        // two moments, issue 18 item 1).
        let mut bad = slices(&[(0.0, 130_000.0)]);
        bad.trigger_ns = Some(250_000.0);
        assert_eq!(
            timing_problems(&bad, &[100_000.0]),
            [
                "call 1: 130.0 µs in the trace, 100.0 µs by the workload's clock",
                "the trigger is 120.0 µs from the end of the call that fired it"
            ]
        );
        assert_eq!(
            timing_problems(&good, &[100_000.0]),
            ["the workload printed 1 call_ns= lines for 2 slices"]
        );
        assert_eq!(call_ns("x\ncall_ns=100\ncall_ns=3000\n"), [100.0, 3000.0]);
    }
}
