//! `lookback check`: runs the real binary on this machine and checks the JSON contract
//! (keys and types), the exit code, and what this kind of machine must report. The
//! machine-specific expectations follow sysfs (`intel_pt` present or not), not a hard-coded
//! host; the privileged ones need root and say so when skipped.

use std::{path::Path, process::Command};

use lookback_tests::{is_root, lookback_bin};
use serde_json::Value;

fn run_check(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(lookback_bin())
        .arg("check")
        .args(args)
        .output()
        .expect("running lookback check");
    (
        output.status.code(),
        String::from_utf8(output.stdout).expect("UTF-8 stdout"),
    )
}

/// An item with the common probe shape: `ok` plus nullable strings.
fn assert_probe(json: &Value, key: &str) {
    let item = &json[key];
    assert!(item["ok"].is_boolean(), "{key}.ok: {item}");
    for field in ["detail", "reason", "errno", "fix"] {
        assert!(
            item[field].is_null() || item[field].is_string(),
            "{key}.{field}: {item}"
        );
    }
    if item["ok"] == false {
        assert!(
            item["reason"].is_string(),
            "{key} failed without a reason: {item}"
        );
    }
}

#[test]
fn check_json_keys_and_types() {
    let (code, stdout) = run_check(&["--json"]);
    let json: Value = serde_json::from_str(&stdout).expect("check --json prints one JSON object");
    assert!(json.is_object());

    for key in [
        "kernel",
        "bpf",
        "btf",
        "ringbuf",
        "raw_tracepoints",
        "tracefs",
        "uprobes",
        "intel_pt",
        "aux_pause",
        "hardware_pmu",
        "software_clock",
    ] {
        assert_probe(&json, key);
    }
    assert!(json["kernel"]["release"].is_string());
    assert!(json["kernel"]["version"]["major"].is_u64());
    assert!(json["tracefs"]["raw_syscalls"].is_boolean());
    assert!(json["uprobes"]["uretprobe"].is_boolean());
    assert!(json["perf_event_paranoid"].is_null() || json["perf_event_paranoid"].is_i64());
    for cap in [
        "root",
        "cap_sys_admin",
        "cap_bpf",
        "cap_perfmon",
        "cap_sys_ptrace",
    ] {
        assert!(json["capabilities"][cap].is_boolean(), "capabilities.{cap}");
    }
    assert!(json["pmus"].is_array());
    assert!(json["intel_pt"]["present"].is_boolean());
    assert!(json["intel_pt"]["caps"].is_object());
    assert!(json["intel_pt"]["format"].is_object());
    assert!(
        json["aux_pause"]["kernel_supports"].is_null()
            || json["aux_pause"]["kernel_supports"].is_boolean()
    );
    let backend = &json["auto_backend"];
    assert!(
        backend.is_null() || backend == "intel-pt" || backend == "sampling",
        "{backend}"
    );
    assert!(json["auto_backend_reason"].is_string());
    for flag in ["bpf_triggers_usable", "backend_usable", "ok"] {
        assert!(json[flag].is_boolean(), "{flag}");
    }
    assert_eq!(json["backend_usable"], !backend.is_null());
    assert_eq!(
        json["ok"],
        json["bpf_triggers_usable"].as_bool() == Some(true) && !backend.is_null()
    );
    // Exit 0 exactly when a backend and the BPF triggers are usable.
    // The contract: 0 ok, 1 runtime error.
    let expected_code = match json["ok"].as_bool() {
        Some(true) => 0,
        _ => 1,
    };
    assert_eq!(code, Some(expected_code), "exit code vs ok={}", json["ok"]);
}

#[test]
fn check_json_matches_this_machine() {
    if !is_root() {
        eprintln!("skipped: needs root (BPF and uprobes are privileged)");
        return;
    }
    let (_, stdout) = run_check(&["--json"]);
    let json: Value = serde_json::from_str(&stdout).expect("JSON");

    for key in [
        "bpf",
        "ringbuf",
        "raw_tracepoints",
        "uprobes",
        "software_clock",
    ] {
        assert_eq!(
            json[key]["ok"], true,
            "{key} must work as root here: {}",
            json[key]
        );
    }
    assert_eq!(json["capabilities"]["root"], true);
    assert_eq!(json["bpf_triggers_usable"], true);
    assert_eq!(json["uprobes"]["hits"], 1, "the uprobe fires once per call");

    let pt_dir = Path::new("/sys/bus/event_source/devices/intel_pt");
    assert_eq!(json["intel_pt"]["present"], pt_dir.is_dir());
    if pt_dir.is_dir() {
        assert!(json["intel_pt"]["pmu_type"].is_u64());
    } else {
        assert_eq!(json["intel_pt"]["ok"], false);
        assert_eq!(json["auto_backend"], "sampling");
        let reason = json["auto_backend_reason"].as_str().expect("reason");
        assert!(reason.contains("intel_pt PMU not found"), "{reason}");
        assert!(reason.contains("sampling backend"), "{reason}");
        assert_eq!(json["ok"], true);
    }

    let events = Path::new("/sys/kernel/tracing/events");
    if events.is_dir() {
        assert_eq!(json["tracefs"]["ok"], true, "{}", json["tracefs"]);
    } else if !Path::new("/sys/kernel/debug/tracing/events").is_dir() {
        assert_eq!(json["tracefs"]["ok"], false);
        assert_eq!(
            json["tracefs"]["fix"],
            "mount -t tracefs nodev /sys/kernel/tracing"
        );
    }
}

#[test]
fn check_human_output() {
    let (code, stdout) = run_check(&[]);
    assert!(matches!(code, Some(0 | 1)), "{code:?}");
    for row in [
        "bpf",
        "btf",
        "ringbuf",
        "tracefs",
        "uprobes",
        "intel_pt",
        "hardware PMU",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| (l.contains('✓') || l.contains('✗')) && l.contains(row)),
            "no ✓/✗ row for {row}:\n{stdout}"
        );
    }
    let last = stdout.lines().last().expect("output");
    assert!(last.starts_with("backend auto → "), "{last}");
}
