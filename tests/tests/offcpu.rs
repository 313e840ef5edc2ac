//! Off-CPU time, end to end: a program whose `handle()` (0.3 ms, once 15 ms) alternates
//! with 5 ms sleeps, traced by the `lookback` binary with the sampling backend. Its
//! context switches are recorded (a sample with the stack at each switch out, the switch
//! records of each switch in), so `handle()`'s slices last what the program itself
//! measured, and each sleep is an `[off-cpu]` slice of its own under the sleep's caller
//! instead of stretching `handle()` across it. Needs root.
//!
//! Not a test of speed: sleeps may last longer and threads may be preempted on a busy
//! machine; what is checked holds either way.

use std::process::Command;

use lookback_tests::{can_run, chrome_events, lookback_bin, succeeded, toolchains};
use serde_json::Value;

/// A finished slice of the trace: name, start and duration (µs), args.
struct Slice {
    name: String,
    start: f64,
    duration: f64,
    args: Value,
}

/// The slices of a Chrome JSON trace's B/E events (one thread).
fn slices(events: &[Value]) -> Vec<Slice> {
    let mut open: Vec<&Value> = Vec::new();
    let mut out = Vec::new();
    for e in events {
        match e["ph"].as_str() {
            Some("B") => open.push(e),
            Some("E") => {
                let begin = open.pop().expect("E matches a B");
                let start = begin["ts"].as_f64().expect("ts");
                out.push(Slice {
                    name: begin["name"].as_str().unwrap_or("").to_owned(),
                    start,
                    duration: e["ts"].as_f64().expect("ts") - start,
                    args: begin["args"].clone(),
                });
            }
            _ => {}
        }
    }
    out
}

#[test]
fn slices_last_what_the_program_measured_and_sleeps_are_off_cpu() {
    if !can_run("slices_last_what_the_program_measured_and_sleeps_are_off_cpu") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.json");
    let rule = "func:handle>10ms";
    let out = succeeded(
        Command::new(lookback_bin())
            .args(["run", "--backend", "sampling", "--trigger", rule, "-o"])
            .arg(&trace)
            .arg("--")
            .arg(toolchains::c_offcpu())
            .args(["200", "190"]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The program's own measurement of each call: (start, duration) in µs.
    let calls: Vec<(f64, f64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.strip_prefix("call=")?.split_whitespace();
            let start: f64 = it.next()?.parse().ok()?;
            let duration: f64 = it.next()?.parse().ok()?;
            Some((start / 1e3, duration / 1e3))
        })
        .collect();
    assert_eq!(calls.len(), 200, "{stderr}");
    let doc: Value = serde_json::from_slice(&std::fs::read(&trace).expect("trace")).expect("JSON");
    let all = slices(chrome_events(&doc));
    let handles: Vec<&Slice> = all.iter().filter(|s| s.name == "handle").collect();
    assert!(
        handles.len() >= 10,
        "{} handle slices\n{stderr}",
        handles.len()
    );
    // The slow call's return is the trigger: what the program measured of it includes
    // the freeze that follows (on a busy machine lookback's reader takes the CPU from it
    // for a few ms before its clock_gettime), so that call is held to the kernel's own
    // measurement of entry to return, the trigger's `duration_ns`.
    let trigger = chrome_events(&doc)
        .iter()
        .find(|e| e["ph"] == "i" && e["name"] == format!("trigger: {rule}").as_str())
        .expect("the trigger instant");
    let trigger_at = trigger["ts"].as_f64().expect("ts");
    let kernel_measured = trigger["args"]["duration_ns"].as_f64().expect("duration") / 1e3;
    for slice in &handles {
        if slice.start < trigger_at && trigger_at <= slice.start + slice.duration + 1.0 {
            assert!(
                (slice.duration - kernel_measured).abs() < 1000.0,
                "the slow call's slice is {:.0} µs, the kernel measured {kernel_measured:.0} µs",
                slice.duration
            );
            continue;
        }
        // The call it shows: the one it overlaps most.
        let overlap = |&(start, duration): &(f64, f64)| {
            (slice.start + slice.duration).min(start + duration) - slice.start.max(start)
        };
        let call = calls
            .iter()
            .copied()
            .max_by(|a, b| overlap(a).total_cmp(&overlap(b)))
            .expect("calls");
        assert!(
            (slice.duration - call.1).abs() < 1000.0,
            "a handle slice of {:.0} µs at {:.0} for a call the program measured at {:.0} µs",
            slice.duration,
            slice.start,
            call.1
        );
    }
    assert!(
        handles.iter().any(|s| s.duration > 14_000.0),
        "the slow call is in the trace"
    );
    check_sleeps(&all, &handles);
}

/// The sleeps: `[off-cpu]` slices that say why, blocked ones in nanosleep for at least
/// their 5 ms (longer on a busy machine), none inside a `handle` slice.
fn check_sleeps(all: &[Slice], handles: &[&Slice]) {
    // The sleeps: blocked in nanosleep for at least their 5 ms (longer on a busy machine:
    // until the thread ran again). Preemptions may come anywhere on a busy machine.
    // Blocked elsewhere is real too (a write to the stdout pipe that a loaded reader
    // drains late): only the periods blocked in nanosleep are the program's sleeps.
    let off: Vec<&Slice> = all.iter().filter(|s| s.name == "[off-cpu]").collect();
    let sleeps: Vec<&&Slice> = off
        .iter()
        .filter(|s| {
            s.args["reason"] == "blocked"
                && s.args["in"]
                    .as_str()
                    .is_some_and(|f| f.contains("nanosleep"))
        })
        .collect();
    assert!(
        sleeps.len() >= 10,
        "{} blocked [off-cpu] slices",
        sleeps.len()
    );
    assert!(
        sleeps.iter().all(|s| s.duration >= 4_000.0
            && s.args["in"]
                .as_str()
                .is_some_and(|f| f.contains("nanosleep"))),
        "the sleeps: {:?}",
        sleeps
            .iter()
            .map(|s| (s.duration, s.args.to_string()))
            .collect::<Vec<_>>()
    );
    assert!(
        off.iter()
            .all(|s| s.args["reason"] == "blocked" || s.args["reason"] == "preempted"),
        "every [off-cpu] slice says why"
    );
    // No handle slice spans a sleep (a preemption inside handle() is inside it, rightly).
    for s in &sleeps {
        assert!(
            !handles
                .iter()
                .any(|h| h.start < s.start && s.start + s.duration <= h.start + h.duration),
            "a handle slice spans the sleep at {:.0}",
            s.start
        );
    }
}
