//! The sampling recorder against real processes: real perf events (cpu-clock, or cycles
//! where a hardware PMU exists), real overwrite rings, the C workload's `spin` modes.
//! Needs root (or `perf_event_paranoid` ≤ 1 with ptrace rights over the workload); run by
//! `cargo xtask test` with --test-threads=1.

use std::{
    collections::BTreeSet,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::Duration,
};

use lookback::capture::{
    self, BackendRequest, CaptureOptions, CapturedData, ProcessMaps,
    records::{self, PERF_RECORD_SAMPLE, Sample},
};
use lookback::snapshot;
use lookback_tests::{can_run, ring_samples, workload};

/// The frame-pointer recorder (no stack copies): these tests read the kernel's callchains.
fn opts() -> CaptureOptions {
    CaptureOptions {
        backend: BackendRequest::Sampling,
        buffer_size: 1 << 20,
        sample_frequency: 10_000,
        stack_size: 0,
        ..CaptureOptions::default()
    }
}

fn spawn(args: &[&str]) -> Child {
    Command::new(workload())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the workload")
}

/// Lets a `--wait` workload start.
fn release(child: &mut Child) {
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(b"go\n").expect("releasing the workload");
}

fn samples(data: &CapturedData) -> Vec<Sample> {
    ring_samples(&data.rings, data.params.sample_layout())
}

/// The runtime address range of `symbol` of `bin` in the process whose maps are given.
fn symbol_range(bin: &Path, maps: &ProcessMaps, symbol: &str) -> (u64, u64) {
    lookback_tests::symbol_range(bin, maps, symbol).unwrap_or_else(|| {
        panic!(
            "no executable mapping of {symbol} of {} in {maps:#?}",
            bin.display()
        )
    })
}

fn workload_path() -> PathBuf {
    workload().canonicalize().expect("canonical workload path")
}

fn record(child: &mut Child, run_for: Duration) -> CapturedData {
    let mut recorder = capture::open_recorder(&opts(), &[child.id()]).expect("recorder");
    sleep(run_for);
    let data = recorder.freeze().expect("freeze");
    recorder.resume().expect("resume");
    data
}

#[test]
fn samples_carry_workload_threads_and_callchains_into_lb_spin() {
    if !can_run("samples_carry_workload_threads_and_callchains_into_lb_spin") {
        return;
    }
    let mut child = spawn(&["spin", "1500", "3"]);
    sleep(Duration::from_millis(100)); // let the three threads start
    let pid = child.id();
    let data = record(&mut child, Duration::from_millis(400));
    let tids_now: BTreeSet<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("task dir")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    child.kill().ok();
    child.wait().ok();

    let samples = samples(&data);
    assert!(samples.len() > 100, "only {} samples", samples.len());
    assert!(
        samples.iter().all(|s| s.pid == Some(pid)),
        "foreign samples"
    );
    let tids: BTreeSet<u32> = samples.iter().filter_map(|s| s.tid).collect();
    let spinning: BTreeSet<u32> = tids_now.iter().copied().filter(|&t| t != pid).collect();
    assert_eq!(spinning.len(), 3, "{tids_now:?}");
    assert!(
        spinning.is_subset(&tids),
        "sampled {tids:?}, spinning {spinning:?}"
    );

    let maps = data.processes.iter().find(|p| p.pid == pid).expect("maps");
    assert!(maps.at_freeze);
    // lb_noop is a leaf without a frame pointer: a sample there shows lb_noop's address
    // and then lb_spin's caller. Samples in lb_spin or in what it calls through a frame
    // (now_ns) show lb_spin itself.
    let spin = symbol_range(&workload_path(), maps, "lb_spin");
    let noop = symbol_range(&workload_path(), maps, "lb_noop");
    let inside =
        |(lo, hi): (u64, u64), s: &Sample| s.user_callchain().any(|a| (lo..hi).contains(&a));
    let in_loop = samples
        .iter()
        .filter(|s| inside(spin, s) || inside(noop, s))
        .count();
    assert!(
        in_loop * 2 > samples.len(),
        "{in_loop} of {} callchains in the spin loop ({spin:x?}, {noop:x?})",
        samples.len()
    );
    let through_spin = samples
        .iter()
        .filter(|s| {
            s.user_callchain()
                .skip(1)
                .any(|a| (spin.0..spin.1).contains(&a))
        })
        .count();
    assert!(
        through_spin > 0,
        "no callchain has lb_spin as a caller frame"
    );
    let (first, last) = data.window.expect("sample times");
    assert!(
        first < last && last <= data.freeze_time_ns,
        "{first} {last} {}",
        data.freeze_time_ns
    );
    assert!(data.clock.is_some());
    let workload_map = maps
        .maps
        .iter()
        .find(|e| e.path == workload_path().to_string_lossy() && e.executable())
        .expect("workload text mapping");
    assert!(
        workload_map.build_id.is_some(),
        "gcc links a build-id by default"
    );
}

#[test]
fn threads_created_after_attach_are_followed() {
    if !can_run("threads_created_after_attach_are_followed") {
        return;
    }
    let mut child = spawn(&["--wait", "spin", "500", "4"]);
    sleep(Duration::from_millis(50));
    let pid = child.id();
    let mut recorder = capture::open_recorder(&opts(), &[pid]).expect("recorder");
    release(&mut child);
    sleep(Duration::from_millis(400));
    let data = recorder.freeze().expect("freeze");
    child.wait().ok();
    let tids: BTreeSet<u32> = samples(&data)
        .iter()
        .filter(|s| s.pid == Some(pid))
        .filter_map(|s| s.tid)
        .filter(|&t| t != pid)
        .collect();
    assert_eq!(tids.len(), 4, "inherited threads sampled: {tids:?}");
}

#[test]
fn forked_children_are_followed_with_their_maps() {
    if !can_run("forked_children_are_followed_with_their_maps") {
        return;
    }
    let mut child = spawn(&["--wait", "forkspin", "600"]);
    sleep(Duration::from_millis(50));
    let pid = child.id();
    let mut recorder = capture::open_recorder(&opts(), &[pid]).expect("recorder");
    release(&mut child);
    sleep(Duration::from_millis(400));
    let data = recorder.freeze().expect("freeze");
    child.wait().ok();
    let samples = samples(&data);
    let pids: BTreeSet<u32> = samples.iter().filter_map(|s| s.pid).collect();
    let forked: Vec<u32> = pids.iter().copied().filter(|&p| p != pid).collect();
    assert_eq!(forked.len(), 1, "one forked child sampled: {pids:?}");
    let kid = forked[0];
    let maps = data
        .processes
        .iter()
        .find(|p| p.pid == kid)
        .expect("maps of the forked child (seen in the samples)");
    let (lo, hi) = symbol_range(&workload_path(), maps, "lb_spin");
    assert!(
        samples
            .iter()
            .filter(|s| s.pid == Some(kid))
            .any(|s| s.user_callchain().any(|a| (lo..hi).contains(&a))),
        "child callchains through lb_spin"
    );
}

#[test]
fn freeze_after_the_target_exited_returns_what_was_captured() {
    if !can_run("freeze_after_the_target_exited_returns_what_was_captured") {
        return;
    }
    let mut child = spawn(&["spin", "300", "2"]);
    sleep(Duration::from_millis(30));
    let pid = child.id();
    let mut recorder = capture::open_recorder(&opts(), &[pid]).expect("recorder");
    child.wait().expect("workload exits");
    let data = recorder.freeze().expect("freeze after exit");
    let samples = samples(&data);
    assert!(samples.len() > 50, "{} samples", samples.len());
    let maps = data
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .expect("cached maps");
    assert!(!maps.at_freeze, "the process was gone at freeze");
    assert!(!maps.maps.is_empty());
    recorder.resume().expect("resume after exit");
    assert!(recorder.freeze().is_ok(), "a second freeze works too");
}

#[test]
fn a_missing_process_is_an_error_and_intel_pt_is_refused_here() {
    let err = capture::open_recorder(&opts(), &[u32::MAX - 1])
        .err()
        .expect("no such process");
    assert!(err.to_string().contains("not found"), "{err}");
    let pt = CaptureOptions {
        backend: BackendRequest::IntelPt,
        ..opts()
    };
    if !Path::new("/sys/bus/event_source/devices/intel_pt").exists() {
        let err = capture::open_recorder(&pt, &[])
            .err()
            .expect("no intel_pt here");
        assert!(
            err.to_string().starts_with("intel_pt PMU not found"),
            "{err}"
        );
    }
}

#[test]
fn a_real_capture_round_trips_through_an_lbsnap_file() {
    if !can_run("a_real_capture_round_trips_through_an_lbsnap_file") {
        return;
    }
    let mut child = spawn(&["spin", "600", "1"]);
    sleep(Duration::from_millis(30));
    let pid = child.id();
    let trigger_time_ns = capture::monotonic_ns();
    let data = record(&mut child, Duration::from_millis(200));
    child.kill().ok();
    child.wait().ok();
    let trigger = snapshot::TriggerMeta {
        rule: "manual".to_owned(),
        kind: "manual".to_owned(),
        detail: "test".to_owned(),
        pid,
        tid: pid,
        comm: "workload".to_owned(),
        trigger_time_ns,
        duration_ns: None,
        stack: Vec::new(),
        kernel_stack: Vec::new(),
        call: None,
    };
    let snap = snapshot::Snapshot::from_captured(data, Some(trigger));
    assert!(
        snap.meta
            .trigger_to_freeze_ns
            .is_some_and(|ns| ns >= 200_000_000)
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("real.lbsnap");
    snapshot::write_atomic(&path, &snap).expect("write");
    let back = snapshot::read(&path).expect("read back");
    assert_eq!(back, snap);
    let samples = back
        .rings
        .iter()
        .flat_map(|r| records::records(&r.data).collect::<Vec<_>>())
        .filter(|r| r.kind == PERF_RECORD_SAMPLE)
        .count();
    assert!(samples > 50, "{samples} samples after the round trip");
    assert!(back.maps.iter().any(|m| m.pid == pid && !m.maps.is_empty()));
    assert!(
        back.code.iter().any(|c| c.path == "[vdso]"),
        "vdso code embedded"
    );
}
