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
    let elsewhere: Vec<(Vec<String>, &Value)> = in_main
        .iter()
        .filter(|(_, up)| !up.last().is_some_and(|n| n.contains("open")))
        .map(|(e, up)| (up.clone(), &e["args"]))
        .collect();
    // The loop's kernel time is its open() calls; a page fault elsewhere (found under
    // load: one in `atol`'s first touch of the locale tables, 1 of 31) is kernel time in
    // the function that faulted, and is nested there.
    assert!(
        elsewhere.len() * 4 < in_main.len(),
        "[kernel] under main but not in the open() wrapper ({} of {}): {elsewhere:?}",
        elsewhere.len(),
        in_main.len()
    );
    assert!(
        begins
            .iter()
            .all(|(e, _)| e["args"]["module"] != "[kernel.kallsyms]" || e["name"] == "[kernel]"),
        "kernel names without --include-kernel"
    );
}

/// The `stack` arg of the trigger instant of a run of the workload (`mode`) with `rule`
/// and `extra` flags, split into functions (outermost first), and lookback's exit code.
fn trigger_stack_of(rule: &str, extra: &[&str], mode: &[&str]) -> (Vec<String>, Option<i32>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("trace.json");
    let out = Command::new(lookback_bin())
        .args(["run", "--backend", "sampling", "--trigger", rule])
        .args(extra)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(workload())
        .args(mode)
        .output()
        .expect("lookback");
    let doc: Value = serde_json::from_slice(&std::fs::read(&trace).expect("trace")).expect("JSON");
    let name = format!("trigger: {rule}");
    let instant = chrome_events(&doc)
        .iter()
        .find(|e| e["ph"] == "i" && e["name"] == name.as_str())
        .expect("the trigger instant");
    let stack = instant["args"]["stack"]
        .as_str()
        .unwrap_or_default()
        .split(" → ")
        .map(str::to_owned)
        .collect();
    (stack, out.status.code())
}

#[test]
fn with_include_kernel_a_syscall_trigger_shows_the_kernel_path_above_its_caller() {
    if !can_run("with_include_kernel_a_syscall_trigger_shows_the_kernel_path_above_its_caller") {
        return;
    }
    // The first open of a missing file: the loader's library search or the loop's.
    let rule = "syscall:openat=ENOENT";
    let (stack, code) = trigger_stack_of(rule, &["--include-kernel"], &["enoent", "3000"]);
    assert_eq!(code, Some(0));
    let at = |name: &str| stack.iter().position(|f| f == name);
    let syscall = at("do_syscall_64");
    let user_open = stack
        .iter()
        .rposition(|f| f.contains("open") && !f.contains("openat"));
    assert!(
        syscall.is_some() && user_open.is_some() && user_open < syscall,
        "the kernel's frames above the libc call: {stack:?}"
    );
    assert!(
        !stack
            .iter()
            .any(|f| f.starts_with("bpf_") || f.starts_with("__bpf_trace")),
        "the probe's own path is not the thread's: {stack:?}"
    );
    // Without the flag: the user stack alone.
    let (plain, _) = trigger_stack_of(rule, &[], &["enoent", "3000"]);
    assert!(
        !plain.is_empty() && !plain.iter().any(|f| f == "do_syscall_64"),
        "{plain:?}"
    );
}

#[test]
fn with_include_kernel_a_sigsegv_trigger_shows_the_page_fault_above_the_faulting_function() {
    if !can_run(
        "with_include_kernel_a_sigsegv_trigger_shows_the_page_fault_above_the_faulting_function",
    ) {
        return;
    }
    let (stack, code) = trigger_stack_of("signal:SIGSEGV", &["--include-kernel"], &["segv"]);
    assert_eq!(code, Some(139), "exits as the command did");
    let fault = stack.iter().position(|f| f == "lb_fault");
    let kernel = stack.iter().position(|f| f.contains("exc_page_fault"));
    assert!(
        fault.is_some() && kernel.is_some() && fault < kernel,
        "the page fault above lb_fault: {stack:?}"
    );
}
