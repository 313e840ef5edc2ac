//! The daemon's metrics fed from a real trigger engine: per-rule kernel counters and eBPF
//! program run-time statistics. Needs root (run by `cargo xtask test` with --test-threads=1:
//! BPF stats and tracepoints are shared).
use std::time::Duration;

use lookback::{
    daemon::metrics::{Metrics, enable_bpf_stats},
    rules::{SyscallSet, SyscallTrigger, Trigger},
    triggers::{EngineRule, TriggerEngine},
};
use lookback_tests::is_root;

/// The value of one sample line `name{labels} value` of the exposition text.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .parse()
        .expect("number")
}

#[test]
fn kernel_counters_and_program_stats_reach_the_registry() {
    if !is_root() {
        eprintln!("skipped kernel_counters_and_program_stats_reach_the_registry: needs root");
        return;
    }
    let _stats = enable_bpf_stats().expect("BPF_ENABLE_STATS (kernel 5.8+)");
    let mut engine = TriggerEngine::load().expect("load the engine");
    let names = |engine: &TriggerEngine| -> Vec<String> {
        engine.program_stats().into_iter().map(|s| s.name).collect()
    };
    // The syscall programs are verified when a syscall rule first needs them.
    assert!(
        !names(&engine).iter().any(|n| n == "sys_exit"),
        "{:?}",
        names(&engine)
    );

    // Every syscall return of this process fires (no cooldown, no rate limit).
    let rule = any_syscall(0, "any-syscall");
    engine.add_rule(rule.clone(), &[]).expect("add rule");
    assert!(
        names(&engine).iter().any(|n| n == "sys_exit"),
        "{:?}",
        names(&engine)
    );
    engine
        .add_target(std::process::id(), 1)
        .expect("add target");
    syscalls();

    let metrics = Metrics::new("sampling").expect("registry");
    metrics.refresh_from_engine(&engine);
    let text = metrics.encode().expect("encode");
    let met = sample(&text, r#"lookback_triggers_total{rule="any-syscall"}"#);
    assert!(met >= 100.0, "{met}");
    let runs = sample(
        &text,
        r#"lookback_bpf_program_runs_total{program="sys_exit"}"#,
    );
    assert!(runs >= 100.0, "{runs}");
    let secs = sample(
        &text,
        r#"lookback_bpf_program_run_seconds_total{program="sys_exit"}"#,
    );
    assert!(secs > 0.0, "{secs}");

    // Removing and re-adding the rule clears its kernel slot; the export keeps growing.
    engine.remove_rule(0).expect("remove rule");
    metrics.remove_rule("any-syscall");
    engine.add_rule(rule, &[]).expect("re-add rule");
    engine
        .add_target(std::process::id(), 1)
        .expect("add target");
    syscalls();
    metrics.refresh_from_engine(&engine);
    let after = sample(
        &metrics.encode().expect("encode"),
        r#"lookback_triggers_total{rule="any-syscall"}"#,
    );
    assert!(after >= met + 100.0, "{after} after {met}");
}

/// A rule met by every syscall entry of its targets (no cooldown, no rate limit).
fn any_syscall(id: u32, name: &str) -> EngineRule {
    EngineRule {
        id,
        name: name.into(),
        trigger: Trigger::Syscall(SyscallTrigger {
            syscalls: SyscallSet::Any,
            min_duration: None,
            errnos: Vec::new(),
            detect: lookback::rules::Detect::Returned,
        }),
        cooldown: Duration::ZERO,
        max_per_hour: 0,
        follow_forks: false,
        per_process: true,
    }
}

fn syscalls() {
    for _ in 0..100 {
        let _ = std::fs::metadata("/proc/self");
    }
}

#[test]
fn an_engine_loaded_for_few_rules_fires_its_last_slot_and_refuses_beyond() {
    if !is_root() {
        eprintln!("skipped an_engine_loaded_for_few_rules_...: needs root");
        return;
    }
    // Loaded for 2 rule ids: the programs' rule loops are verified for ids 0 and 1 only
    // (RULE_SLOTS in .rodata). Id 1, the last, must still fire; id 2 is refused.
    let mut engine = TriggerEngine::load_for(2, false).expect("load the engine");
    let rule = |id: u32| any_syscall(id, &format!("slot-{id}"));
    engine.add_rule(rule(1), &[]).expect("rule id 1");
    engine
        .add_target(std::process::id(), 1 << 1)
        .expect("add target");
    syscalls();
    let counters = engine.counters(1).expect("counters");
    assert!(counters.met >= 100, "{counters:?}");
    let refused = engine.add_rule(rule(2), &[]).expect_err("rule id 2");
    assert!(refused.to_string().contains("2 rule slot(s)"), "{refused}");
}
