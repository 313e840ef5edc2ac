//! `lookback agent` freezing sampling recorders in the kernel at the trigger (`FROZEN`,
//! `sample_filter`), as root: real BPF programs and uprobes, real workloads.
#![allow(
    clippy::float_cmp,
    reason = "metric values are integer counts, exactly representable"
)]

use lookback_tests::agent::{Agent, files, read_snapshots, sample_times};

/// What both tests record with: the sampling backend, every trigger a snapshot.
const SAMPLING: &str = "
version: 1
defaults:
  capture: { backend: sampling, buffer_size: 1MiB }
  snapshot: { cooldown: 0s, max_per_hour: 1000 }
rules:";

/// A sampling rule without `post_trigger` freezes in the kernel, as `run` does: the
/// trigger's BPF program stops the process's samples (`FROZEN`, `sample_filter` on the
/// agent's recorder) and the snapshot records that moment. Each snapshot found its
/// process's mark (the debug log says so) and holds no sample of the process after it; the
/// agent removed the mark after the copy, so the second snapshot has samples between the
/// first freeze and the second trigger.
#[test]
fn a_sampling_rule_freezes_in_the_kernel_and_sampling_resumes() {
    let rules = [
        SAMPLING,
        r"
  - name: spin
    target: { comm: workload }
    trigger: { function: { symbol: lb_spin, binary: @WORKLOAD@, min_duration: 20ms } }
",
    ]
    .concat();
    let mut agent = Agent::start_with_env(
        &rules,
        &[],
        &[("RUST_LOG", "info,lookback::daemon::targets=debug")],
    );
    // lb_spin(300 ms) twice on the main thread, a second thread busy meanwhile.
    agent.run_workload(&["spinbg", "300", "2", "900"]);
    agent.expect_metric(
        "lookback_snapshots_total",
        &[("rule", "spin"), ("backend", "sampling"), ("result", "ok")],
        2.0,
    );
    let snaps = read_snapshots(&agent.out().join("spin"));
    assert_eq!(snaps.len(), 2, "{:?}", files(&agent.out().join("spin")));
    let log = agent.log();
    assert_eq!(
        log.matches("frozen in the kernel at Some(").count(),
        2,
        "each snapshot found its kernel mark:\n{log}"
    );
    let mut freezes = Vec::new();
    for snap in &snaps {
        let trigger = snap.meta.trigger.clone().expect("trigger");
        let frozen = trigger.trigger_time_ns + snap.meta.trigger_to_freeze_ns.expect("latency");
        let times = sample_times(snap, trigger.pid);
        let last = times.iter().copied().max().expect("samples");
        assert!(
            last <= frozen,
            "a sample {} ns after the kernel's freeze",
            last - frozen
        );
        freezes.push((frozen, trigger.trigger_time_ns, times));
    }
    let (first_freeze, (_, second_trigger, second_times)) = (freezes[0].0, &freezes[1]);
    let resumed = second_times
        .iter()
        .filter(|&&t| t > first_freeze && t < *second_trigger)
        .count();
    assert!(
        resumed >= 20,
        "{resumed} samples between the first freeze and the second trigger"
    );
    agent.stop_ok();
}

/// A trigger that froze its process in the kernel and is then dropped (busy: a snapshot of
/// the same process waits out its `post_trigger`) unfreezes it: the waiting snapshot holds
/// the process's samples after the dropped triggers.
#[test]
fn a_trigger_dropped_as_busy_unfreezes_its_process() {
    let rules = [
        SAMPLING,
        r"
  - name: waits
    target: { comm: workload }
    trigger: { function: { symbol: lb_spin, binary: @WORKLOAD@ } }
    snapshot: { post_trigger: 400ms }
  - name: freezes
    target: { comm: workload }
    trigger: { function: { symbol: lb_spin, binary: @WORKLOAD@, min_duration: 20ms } }
",
    ]
    .concat();
    let mut agent = Agent::start(&rules, &[]);
    // Entries of lb_spin at 0, 40 and 80 ms (`waits`: the first pending for 400 ms),
    // returns at 40, 80, 120 ms (`freezes`: frozen in the kernel, then busy); the second
    // thread spins until 900 ms.
    agent.run_workload(&["spinbg", "40", "3", "900"]);
    agent.expect_metric(
        "lookback_triggers_suppressed_total",
        &[("rule", "freezes"), ("reason", "busy")],
        3.0,
    );
    agent.expect_metric(
        "lookback_snapshots_total",
        &[("rule", "waits"), ("backend", "sampling"), ("result", "ok")],
        1.0,
    );
    let snaps = read_snapshots(&agent.out().join("waits"));
    assert_eq!(snaps.len(), 1, "{:?}", files(&agent.out().join("waits")));
    let trigger = snaps[0].meta.trigger.clone().expect("trigger");
    let late = sample_times(&snaps[0], trigger.pid)
        .into_iter()
        .filter(|&t| t > trigger.trigger_time_ns + 200_000_000)
        .count();
    assert!(
        late >= 20,
        "{late} samples of the process from 200 ms after the first trigger (the dropped ones \
         came by 130 ms)"
    );
    agent.stop_ok();
}
