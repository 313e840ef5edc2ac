//! Trigger → snapshot → trace file, end to end through the `lookback` binary with the
//! sampling backend (needs root), and the trace read back by parsers that share no code
//! with the writer: the `PyPI` `fxt` package (`tests/scripts/check_fxt.py`, installed into
//! `.tools/python` by `cargo xtask setup`) for FXT, `serde_json` for Chrome JSON.
use std::{
    path::Path,
    process::{Command, Output},
};

use lookback_tests::{chrome_events, lookback_bin, open_at_instant, read_fxt, workload};
use serde_json::Value;

const RULE: &str = "func:lb_spin>20ms";

fn run_lookback(out: &Path, extra: &[&str]) -> Output {
    let output = Command::new(lookback_bin())
        .args([
            "run",
            "--backend",
            "sampling",
            "--json",
            "--trigger",
            RULE,
            "-o",
        ])
        .arg(out)
        .args(extra)
        .arg("--")
        .arg(workload())
        .args(["spin", "40", "2"])
        .output()
        .expect("lookback");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The `{"snapshot": ..., "trace": ...}` line `--json` printed.
fn snapshot_line(out: &Output) -> Value {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("trace").is_some())
        .expect("a JSON line for the snapshot")
}

fn is_spin(name: &str) -> bool {
    name == "lb_spin" || name == "lb_noop"
}

#[test]
fn fxt_trace_has_the_workload_functions_and_the_trigger() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.fxt.gz");
    let out = run_lookback(&trace, &[]);
    let line = snapshot_line(&out);
    assert_eq!(line["trace"].as_str(), trace.to_str());
    assert!(line["snapshot"].is_null(), "no .lbsnap without --keep-raw");
    assert!(!dir.path().join("trace.lbsnap").exists());
    let Some(doc) = read_fxt(&trace) else { return };

    let instants = doc["instants"].as_array().expect("instants");
    let trigger = instants
        .iter()
        .find(|i| i["name"] == format!("trigger: {RULE}").as_str())
        .unwrap_or_else(|| panic!("no trigger instant in {instants:?}"));
    assert_eq!(trigger["args"]["rule"], RULE);
    assert_eq!(trigger["args"]["kind"], "function");
    assert!(trigger["args"]["duration_ns"].as_u64() > Some(20_000_000));

    let threads = doc["threads"].as_array().expect("threads");
    let bin = workload().canonicalize().expect("workload");
    let bin = bin.to_string_lossy();
    let mut spinning = 0;
    // The trigger's call on a track of its own: thread id with bit 30, named after the
    // thread, one slice from the kernel's entry timestamp to its return.
    let (calls, threads): (Vec<&Value>, Vec<&Value>) = threads.iter().partition(|t| {
        t["name"]
            .as_str()
            .is_some_and(|n| n.ends_with(" trigger call"))
    });
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0]["slices"][0];
    // Its length as the independent parser reads it from the FXT timestamps: the kernel's.
    assert_eq!(
        call["duration_ns"], trigger["args"]["duration_ns"],
        "{call}"
    );
    assert_eq!(call["name"], "lb_spin", "{call}");
    assert_eq!(
        calls[0]["tid"].as_u64(),
        trigger["args"]["tid"].as_u64().map(|t| t | 1 << 30)
    );
    for thread in &threads {
        let name = thread["name"].as_str().expect("thread name");
        let (pid, tid) = (&thread["pid"], &thread["tid"]);
        assert_eq!(name, format!("workload [{pid}] [{tid}]"));
        let slices = thread["slices"].as_array().expect("slices");
        if slices
            .iter()
            .any(|s| is_spin(s["name"].as_str().unwrap_or("")) && s["parent"] == "spin_thread")
        {
            spinning += 1;
        }
        for s in slices {
            let name = s["name"].as_str().unwrap_or("");
            // PLT stubs (`clock_gettime@plt`, sampled now and then) have no source line, nor
            // has the C runtime's start code linked into the binary (`_start`, from crt1.o:
            // the outermost frame of a stack unwound all the way).
            let crt = [
                "_start",
                "_init",
                "_fini",
                "frame_dummy",
                "register_tm_clones",
            ];
            if s["args"]["module"].as_str() == Some(&*bin)
                && !name.ends_with("@plt")
                && !crt.contains(&name)
            {
                assert!(
                    !name.starts_with("[unknown]"),
                    "unresolved workload address: {s}"
                );
                // workload.c's lines, or a header's inlined into it (`atol` in main).
                assert!(
                    s["args"]["location"]
                        .as_str()
                        .is_some_and(|l| l.contains("workload.c:") || l.contains(".h:")),
                    "no file:line: {s}"
                );
            }
        }
    }
    assert!(
        spinning >= 2,
        "lb_spin/lb_noop under spin_thread on {spinning} threads: {threads:#?}"
    );
}

/// B/E balance per thread, and the names of the slices directly under `parent`.
fn children_of(events: &[Value], parent: &str) -> Vec<String> {
    let mut stacks: std::collections::HashMap<(u64, u64), Vec<String>> =
        std::collections::HashMap::new();
    let mut children = Vec::new();
    for e in events {
        let key = (
            e["pid"].as_u64().unwrap_or(0),
            e["tid"].as_u64().unwrap_or(0),
        );
        let name = e["name"].as_str().unwrap_or("").to_owned();
        let stack = stacks.entry(key).or_default();
        match e["ph"].as_str() {
            Some("B") => {
                if stack.last().map(String::as_str) == Some(parent) {
                    children.push(name.clone());
                }
                stack.push(name);
            }
            Some("E") => assert_eq!(stack.pop().as_deref(), Some(name.as_str()), "E matches B"),
            _ => {}
        }
    }
    assert!(stacks.values().all(Vec::is_empty), "every B has its E");
    children
}

#[test]
fn chrome_json_trace_and_decode_of_the_kept_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.json");
    let out = run_lookback(&trace, &["--keep-raw"]);
    let raw = dir.path().join("trace.lbsnap");
    assert_eq!(snapshot_line(&out)["snapshot"].as_str(), raw.to_str());
    for doc in [
        serde_json::from_slice::<Value>(&std::fs::read(&trace).expect("trace.json"))
            .expect("one JSON document"),
        {
            // The same snapshot, decoded offline into gzipped JSON.
            let again = dir.path().join("again.json.gz");
            let status = Command::new(lookback_bin())
                .arg("decode")
                .arg(&raw)
                .arg("-o")
                .arg(&again)
                .status()
                .expect("lookback decode");
            assert!(status.success());
            let file = std::fs::File::open(&again).expect("again.json.gz");
            serde_json::from_reader(flate2::read::GzDecoder::new(file)).expect("gzipped JSON")
        },
    ] {
        let events = chrome_events(&doc);
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "M" && e["name"] == "thread_name")
        );
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "i" && e["name"] == format!("trigger: {RULE}").as_str())
        );
        let under = children_of(events, "spin_thread");
        assert!(
            under.iter().any(|n| is_spin(n)),
            "under spin_thread: {under:?}"
        );
    }
    // Default output of decode: the stem + .fxt.gz.
    let status = Command::new(lookback_bin())
        .arg("decode")
        .arg(&raw)
        .status()
        .expect("lookback decode");
    assert!(status.success());
    assert!(dir.path().join("trace.fxt.gz").is_file());

    // A PT snapshot without AUX data (the same file relabelled: its rings hold perf
    // records, not PT) decodes to a trace with no slices but the trigger's own track.
    let mut snap = lookback::snapshot::read(&raw).expect("readable snapshot");
    snap.meta.backend = lookback::capture::Backend::IntelPt;
    let pt = dir.path().join("pt.lbsnap");
    lookback::snapshot::write_atomic(&pt, &snap).expect("write");
    let pt_json = dir.path().join("pt.json");
    let out = Command::new(lookback_bin())
        .arg("decode")
        .arg(&pt)
        .arg("-o")
        .arg(&pt_json)
        .output()
        .expect("lookback decode");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value =
        serde_json::from_slice(&std::fs::read(&pt_json).expect("pt.json")).expect("JSON");
    let events = chrome_events(&doc);
    // No slice decoded; only the trigger's call, timed by the kernel, on its own track.
    let call_track = |e: &Value| e["tid"].as_u64().is_some_and(|t| t & 1 << 30 != 0);
    assert!(events.iter().all(|e| e["ph"] != "B" || call_track(e)));
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "i" && e["name"] == format!("trigger: {RULE}").as_str())
    );
}

#[test]
fn a_syscall_trigger_shows_its_callers_at_the_trigger() {
    // lb_recurse(3) sleeps at each of its 4 levels: a sleeping thread is never sampled,
    // so only the stack the kernel takes at the trigger (the slow syscall's exit) can show
    // who made the call.
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.json");
    let rule = "syscall:clock_nanosleep>20ms";
    let out = Command::new(lookback_bin())
        .args(["run", "--backend", "sampling", "--json", "--trigger", rule])
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(workload())
        .args(["recurse", "3", "30000"])
        .output()
        .expect("lookback");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        snapshot_line(&out)["trigger"]["stack"]
            .as_array()
            .is_some_and(|s| s.len() >= 4),
        "the trigger event carries the stack: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&trace).expect("trace")).expect("JSON");
    let open = open_at_instant(chrome_events(&doc), &format!("trigger: {rule}"));
    let recursing = open.iter().filter(|n| *n == "lb_recurse").count();
    assert!(
        open.iter().any(|n| n == "main") && recursing >= 3,
        "open at the trigger: {open:?}\n{stderr}"
    );
    // Outermost first: main encloses the recursion.
    let main = open.iter().position(|n| n == "main");
    let first = open.iter().position(|n| n == "lb_recurse");
    assert!(main < first, "{open:?}");
}

#[test]
fn a_sigsegv_trace_shows_the_faulting_function_and_its_caller() {
    // The process dies at once: its maps come from the rings' mmap records, its stack
    // from the trigger's copy of the faulting thread's registers and stack.
    sigsegv_trace_keeps_main(None);
}

#[test]
fn a_sigsegv_with_the_stack_ending_5_kib_above_the_fault_keeps_main() {
    // Without address randomization and with an empty environment the stack's mapping
    // ends 5,080 bytes above the faulting SP: an 8 KiB copy does not fit, and main's frame
    // (above its 4 KiB buffer) lies beyond a 4 KiB one. The copy must reach the mapping's
    // end (before: 4 KiB, and the trace went from `__libc_start_call_main` to `lb_fault` in
    // about 4 runs of 10 with randomization, as the stack's end fell).
    sigsegv_trace_keeps_main(Some(&["setarch", "x86_64", "-R"]));
}

/// Runs `workload segv` under `lookback run` (behind `wrapper`, with an empty environment
/// when there is one) and asserts that `main` and `lb_fault` are open at the SIGSEGV.
fn sigsegv_trace_keeps_main(wrapper: Option<&[&str]>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.json");
    let rule = "signal:SIGSEGV";
    let mut cmd = match wrapper {
        Some(w) => {
            let mut c = Command::new(w[0]);
            c.args(&w[1..]).arg(lookback_bin()).env_clear();
            c
        }
        None => Command::new(lookback_bin()),
    };
    let out = cmd
        .args(["run", "--backend", "sampling", "--trigger", rule, "-o"])
        .arg(&trace)
        .arg("--")
        .arg(workload())
        .arg("segv")
        .output()
        .expect("lookback");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(139),
        "exits as the command did: {stderr}"
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&trace).expect("trace")).expect("JSON");
    let open = open_at_instant(chrome_events(&doc), &format!("trigger: {rule}"));
    let main = open.iter().position(|n| n == "main");
    let fault = open.iter().position(|n| n == "lb_fault");
    assert!(
        main.is_some() && fault.is_some() && main < fault,
        "open at the SIGSEGV: {open:?}\n{stderr}"
    );
}
