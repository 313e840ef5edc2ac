//! Kernel time in sampled traces, end to end: the workload's `enoent` loop (`open()` of a
//! missing file, most of its time in the kernel) traced by the `lookback` binary with the
//! sampling backend. With `--include-kernel` the kernel's functions, named from the
//! recording machine's `/proc/kallsyms`, are slices above the libc call that entered the
//! kernel; without it that time is one `[kernel]` slice there, not `[untraced]`. Needs root.

use std::process::Command;

use lookback_tests::{can_run, chrome_events, lookback_bin, succeeded, workload};
use serde_json::Value;

/// Each B event of the trace with the names of the slices open around it, outermost first.
fn begins_with_ancestors(events: &[Value]) -> Vec<(&Value, Vec<String>)> {
    let mut open: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for e in events {
        match e["ph"].as_str() {
            Some("B") => {
                out.push((e, open.clone()));
                open.push(e["name"].as_str().unwrap_or("").to_owned());
            }
            Some("E") => {
                open.pop();
            }
            _ => {}
        }
    }
    out
}

/// The trace of the `enoent` loop with `extra` flags.
fn trace_of_the_open_loop(extra: &[&str]) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.json");
    succeeded(
        Command::new(lookback_bin())
            .args(["run", "--backend", "sampling"])
            .args(extra)
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(workload())
            .args(["enoent", "300000"]),
    );
    serde_json::from_slice(&std::fs::read(&trace).expect("trace")).expect("JSON")
}

#[test]
fn include_kernel_names_kernel_functions_above_the_syscall() {
    if !can_run("include_kernel_names_kernel_functions_above_the_syscall") {
        return;
    }
    let doc = trace_of_the_open_loop(&["--include-kernel"]);
    let begins = begins_with_ancestors(chrome_events(&doc));
    let kernel: Vec<&(&Value, Vec<String>)> = begins
        .iter()
        .filter(|(e, _)| e["args"]["module"] == "[kernel.kallsyms]")
        .collect();
    let names: std::collections::BTreeSet<&str> = kernel
        .iter()
        .filter_map(|(e, _)| e["name"].as_str())
        .collect();
    assert!(
        names.iter().any(|n| n.contains("openat")) && names.contains("do_syscall_64"),
        "kernel functions: {names:?}"
    );
    // Above the user frames: main is open around the syscall's kernel functions (a few
    // samples at exec and exit have no user stack at all, and stand alone).
    assert!(
        kernel.iter().any(|(e, up)| {
            e["name"].as_str().is_some_and(|n| n.contains("openat"))
                && up.iter().any(|n| n == "main")
                && up.iter().any(|n| n.contains("open"))
        }),
        "no openat under main and the open() wrapper"
    );
    let under_main = kernel
        .iter()
        .filter(|(_, up)| up.iter().any(|n| n == "main"))
        .count();
    assert!(
        under_main * 2 > kernel.len(),
        "{under_main} of {} kernel slices under main",
        kernel.len()
    );
    assert!(!names.contains("[kernel]"), "{names:?}");
}

#[test]
fn without_include_kernel_kernel_time_is_a_kernel_slice() {
    if !can_run("without_include_kernel_kernel_time_is_a_kernel_slice") {
        return;
    }
    let doc = trace_of_the_open_loop(&[]);
    let begins = begins_with_ancestors(chrome_events(&doc));
    let kernel: Vec<&(&Value, Vec<String>)> = begins
        .iter()
        .filter(|(e, _)| e["name"] == "[kernel]")
        .collect();
    assert!(!kernel.is_empty(), "no [kernel] slice");
    // Under main, directly in the open() wrapper (samples at exec and exit, without a
    // user stack, stand alone).
    let in_main: Vec<&&(&Value, Vec<String>)> = kernel
        .iter()
        .filter(|(_, up)| up.iter().any(|n| n == "main"))
        .collect();
    assert!(
        in_main.len() * 2 > kernel.len(),
        "{} of {} [kernel] slices under main",
        in_main.len(),
        kernel.len()
    );
    assert!(
        in_main
            .iter()
            .all(|(_, up)| up.last().is_some_and(|n| n.contains("open"))),
        "[kernel] in the open() wrapper: {:?}",
        in_main
            .iter()
            .map(|(_, up)| up.clone())
            .take(3)
            .collect::<Vec<_>>()
    );
    assert!(
        begins
            .iter()
            .all(|(e, _)| e["args"]["module"] != "[kernel.kallsyms]" || e["name"] == "[kernel]"),
        "kernel names without --include-kernel"
    );
}
