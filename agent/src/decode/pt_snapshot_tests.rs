//! PT snapshots to per-thread branches: thread attribution from sideband records, time,
//! and the encoder's programs decoded through a bundle.

use super::*;
use crate::capture::intel_pt::SIDEBAND_SAMPLE_TYPE;
use crate::capture::{
    Backend, CapturedData, ClockConversion, CodeRegion, ProcessMaps, RecorderParams, RingData,
};
use crate::decode::pt::encode::{CODE_BASE, SynthProgram, encode};
use crate::test_support::{sideband_record, thread_start_records};

/// perf time = TSC (`time_mult` 1, shift 0).
const IDENTITY: ClockConversion = ClockConversion {
    time_zero: 0,
    time_mult: 1,
    time_shift: 0,
    valid: true,
    tsc_at_freeze: None,
    monotonic_ns_at_freeze: 0,
};

fn identity_config() -> PeventConfig {
    PeventConfig {
        sample_type: SIDEBAND_SAMPLE_TYPE,
        ..PeventConfig::default()
    }
}

#[test]
fn threads_follow_itrace_start_and_switches() {
    let mut data = thread_start_records(10, 11, "worker", 100, 0);
    data.extend(sideband_record(14, 1 << 13, &[], (10, 11), 200, 0));
    data.extend(sideband_record(14, 0, &[], (10, 12), 300, 0));
    let line = Timeline::read(
        &SidebandData {
            cpu: Some(0),
            dropped_bytes: 0,
            data,
        },
        &identity_config(),
    );
    assert_eq!(line.at(50), Some((10, 11)), "before the first record");
    assert_eq!(line.at(150), Some((10, 11)));
    assert_eq!(
        line.at(250),
        Some((10, 12)),
        "switched out: the next one in"
    );
    assert_eq!(line.at(350), Some((10, 12)));
    // Every TSC's span holds it, and the whole span has the thread of that TSC.
    for tsc in 0..400 {
        let (lo, hi, thread) = line.span(tsc);
        assert!((lo..hi).contains(&tsc), "{tsc} in [{lo}, {hi})");
        for other in [lo, hi.min(400) - 1] {
            assert_eq!(
                line.span(other),
                (lo, hi, thread),
                "{other} in the span of {tsc}"
            );
        }
    }
    assert_eq!(
        line.comms.get(&(10, 11)).map(String::as_str),
        Some("worker")
    );
    assert_eq!(line.outs, [(200, (10, 11))]);
    let untimed = line.without_times();
    assert_eq!(
        (untimed.initial, untimed.entries.len()),
        (None, 0),
        "two threads"
    );
}

#[test]
fn a_switch_out_first_names_the_thread_before_it() {
    let data = sideband_record(14, 1 << 13, &[], (7, 8), 200, 1);
    let line = Timeline::read(
        &SidebandData {
            cpu: Some(1),
            dropped_bytes: 0,
            data,
        },
        &identity_config(),
    );
    assert_eq!(line.at(100), Some((7, 8)));
    assert_eq!(line.without_times().initial, Some((7, 8)));
}

/// A PT snapshot of a synthetic program: one ring on CPU 0, the code embedded.
fn synth_snapshot(
    sideband: Vec<u8>,
    clock: Option<ClockConversion>,
) -> (Snapshot, Vec<(BranchKind, u64, u64)>) {
    let program = SynthProgram::generate(3, 8);
    let encoded = encode(&program, 3, 16 << 10, true);
    let len = program.code.len() as u64;
    let maps = ProcessMaps {
        pid: 10,
        comm: "synth".to_owned(),
        exe: None,
        read_at_ns: 0,
        at_freeze: true,
        maps: vec![MapEntry {
            start: CODE_BASE,
            end: CODE_BASE + len,
            perms: "r-xp".to_owned(),
            offset: 0,
            dev: "00:00".to_owned(),
            inode: 0,
            path: "/nonexistent/synth".to_owned(),
            build_id: None,
        }],
    };
    let captured = CapturedData {
        backend: Backend::IntelPt,
        params: RecorderParams {
            event: "intel_pt".to_owned(),
            sample_type: SIDEBAND_SAMPLE_TYPE,
            sample_id_all: true,
            cpus: vec![0],
            ..RecorderParams::default()
        },
        freeze_time_ns: 0,
        pause_duration_ns: 0,
        rings: vec![RingData {
            kind: RingKind::Aux,
            cpu: Some(0),
            tid: None,
            wrapped: false,
            records: 0,
            stop: None,
            data: encoded.trace,
        }],
        sideband: vec![SidebandData {
            cpu: Some(0),
            dropped_bytes: 0,
            data: sideband,
        }],
        clock,
        processes: vec![maps],
        code: vec![CodeRegion {
            pid: 10,
            start: CODE_BASE,
            path: "/nonexistent/synth".to_owned(),
            data: program.code,
        }],
        window: None,
        kernel_symbols: Vec::new(),
    };
    (Snapshot::from_captured(captured, None), encoded.branches)
}

#[test]
fn a_synthetic_bundle_decodes_to_the_encoders_branches_on_its_thread() {
    let (snap, expected) =
        synth_snapshot(thread_start_records(10, 11, "synth", 1, 0), Some(IDENTITY));
    let out = decode_all(&snap, &EmbeddedOnly);
    assert_eq!(out.errors, 0);
    let track = Track::Thread { pid: 10, tid: 11 };
    assert_eq!(out.tracks.keys().copied().collect::<Vec<_>>(), [track]);
    let got = &out.tracks[&track];
    assert_eq!(got.comm.as_deref(), Some("synth"));
    let flow: Vec<(BranchKind, u64, u64)> = got
        .branches
        .iter()
        .filter(|b| {
            matches!(
                b.kind,
                BranchKind::Call | BranchKind::Return | BranchKind::Jump
            )
        })
        .map(|b| (b.kind, b.from, b.to))
        .collect();
    assert_eq!(flow.len(), expected.len());
    assert!(flow == expected, "branches differ from the encoder's");
    assert!(got.branches.iter().is_sorted_by_key(|b| b.time_ns));
    // TSC 0x1000 at the first PSB, perf time = TSC.
    assert_eq!(got.branches.iter().next().map(|b| b.time_ns), Some(0x1000));
}

#[test]
fn without_sideband_or_code_a_ring_is_a_cpu_track_with_decode_errors() {
    let (mut snap, _) = synth_snapshot(Vec::new(), None);
    snap.code.clear();
    let out = decode_all(&snap, &EmbeddedOnly);
    assert_eq!(
        out.tracks.keys().copied().collect::<Vec<_>>(),
        [Track::Cpu(0)]
    );
    assert!(out.errors > 0);
    let errors = out.tracks[&Track::Cpu(0)]
        .branches
        .iter()
        .filter(|b| b.kind == BranchKind::Error)
        .count() as u64;
    assert_eq!(errors, out.errors);
    assert!(
        out.tracks[&Track::Cpu(0)]
            .branches
            .iter()
            .all(|b| b.error.is_some() || b.kind != BranchKind::Error)
    );
}

#[test]
fn branch_lists_grow_in_chunks_and_sort_by_time() {
    let mut list = BranchList::default();
    let n = BranchList::CHUNK * 2 + 3;
    for i in 0..n {
        list.push(Branch {
            kind: BranchKind::Call,
            time_ns: (n - i) as u64,
            from: 0,
            to: 0,
            error: None,
        });
    }
    assert_eq!((list.len(), list.chunks.len()), (n, 3));
    list.sort_by_time();
    assert!(list.iter().is_sorted_by_key(|b| b.time_ns));
    assert_eq!(list.into_iter().count(), n);
}
