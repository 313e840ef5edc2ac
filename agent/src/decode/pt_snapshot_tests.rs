//! PT snapshots to per-thread branches: thread attribution from sideband records, time,
//! and the encoder's programs decoded through a bundle.

use super::*;
use crate::capture::intel_pt::SIDEBAND_SAMPLE_TYPE;
use crate::capture::{
    Backend, CapturedData, ClockConversion, CodeRegion, ProcessMaps, RecorderParams, RingData,
};
use crate::decode::pt::tools::encode::{CODE_BASE, SynthProgram, encode};
use crate::test_support::{sideband_record, thread_start_records};

/// perf time = TSC (`time_mult` 1, shift 0).
const IDENTITY: ClockConversion = ClockConversion {
    time_zero: 0,
    time_mult: 1,
    time_shift: 0,
    valid: true,
    tsc_at_freeze: None,
    monotonic_ns_at_freeze: 0,
    tsc_earlier: None,
    monotonic_ns_earlier: 0,
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
    synth_snapshot_of(sideband, clock, 16 << 10)
}

/// [`synth_snapshot`] with `size` bytes of trace.
fn synth_snapshot_of(
    sideband: Vec<u8>,
    clock: Option<ClockConversion>,
    size: usize,
) -> (Snapshot, Vec<(BranchKind, u64, u64)>) {
    let program = SynthProgram::generate(3, 8);
    let encoded = encode(&program, 3, size, true);
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
        origin: crate::capture::origin::ProcessOrigin::default(),
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
        perf_maps: Vec::new(),
        window: None,
        kernel_symbols: Vec::new(),
    };
    (Snapshot::from_captured(captured, None), encoded.branches)
}

/// The calls, returns and taken jumps of `branches`, as the encoder lists them.
fn flow_of(branches: &BranchList) -> Vec<(BranchKind, u64, u64)> {
    branches
        .iter()
        .filter(|b| {
            matches!(
                b.kind,
                BranchKind::Call | BranchKind::Return | BranchKind::Jump
            )
        })
        .map(|b| (b.kind, b.from, b.to))
        .collect()
}

#[test]
fn a_synthetic_bundle_decodes_to_the_encoders_branches_on_its_thread() {
    let (snap, expected) =
        synth_snapshot(thread_start_records(10, 11, "synth", 1, 0), Some(IDENTITY));
    let out = decode_all(&snap, &EmbeddedOnly, 1);
    assert_eq!(out.errors, 0);
    let track = Track::Thread { pid: 10, tid: 11 };
    assert_eq!(out.tracks.keys().copied().collect::<Vec<_>>(), [track]);
    let got = &out.tracks[&track];
    assert_eq!(got.comm.as_deref(), Some("synth"));
    let flow = flow_of(&got.branches);
    assert_eq!(flow.len(), expected.len());
    assert!(flow == expected, "branches differ from the encoder's");
    assert!(got.branches.iter().is_sorted_by_key(|b| b.time_ns));
    // TSC 0x1000 at the first PSB, perf time = TSC.
    assert_eq!(got.branches.iter().next().map(|b| b.time_ns), Some(0x1000));
}

#[test]
fn a_ring_decoded_on_several_threads_gives_every_track_the_same_branches() {
    // 384 KiB: cut into 3 pieces on 3 threads, 4 on 4 (pieces of at least 64 KiB).
    let (snap, expected) = synth_snapshot_of(
        thread_start_records(10, 11, "synth", 1, 0),
        Some(IDENTITY),
        384 << 10,
    );
    let listing = |out: &PtThreads| -> Vec<String> {
        out.tracks
            .iter()
            .flat_map(|(track, t)| t.branches.iter().map(move |b| format!("{track:?} {b:?}")))
            .collect()
    };
    let one = decode_all(&snap, &EmbeddedOnly, 1);
    let calls = one
        .tracks
        .values()
        .flat_map(|t| t.branches.iter())
        .filter(|b| b.kind == BranchKind::Call)
        .count();
    assert_eq!(
        calls,
        expected.iter().filter(|b| b.0 == BranchKind::Call).count()
    );
    // The ring is cut as said, and every piece's worker is taken.
    let program = SynthProgram::generate(3, 8);
    let mut image = Image::new();
    image.add("synth", program.code.clone(), CODE_BASE);
    let trace = encode(&program, 3, 384 << 10, true).trace;
    for threads in [3, 4] {
        let split = Split::streaming(threads);
        let (_, stats) =
            decode_parallel_with(&trace, &image, FlowConfig::default(), split, &mut |_| {});
        assert_eq!((stats.pieces, stats.taken), (threads, threads), "{stats:?}");
    }
    for threads in [3, 4] {
        let many = decode_all(&snap, &EmbeddedOnly, threads);
        assert_eq!((many.branches, many.errors), (one.branches, one.errors));
        assert!(listing(&many) == listing(&one), "{threads} threads");
    }
}

#[test]
fn without_sideband_or_code_a_ring_is_a_cpu_track_with_decode_errors() {
    let (mut snap, _) = synth_snapshot(Vec::new(), None);
    snap.code.clear();
    let out = decode_all(&snap, &EmbeddedOnly, 1);
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

/// Issue 18 item 2: the recording CPU's timing parameters go through the `.lbsnap` and
/// into the decoder's configuration, and with them the libipt corpus's MTC/CYC cases
/// decode to the times libipt expects. The cases' ptdump options stand for what the
/// recorder read (`--mtc-freq` = the `mtc_period` config field, `--cpuid-0x15.*` = the
/// PMU's `tsc_art_ratio`, `--nom-freq` = `max_nonturbo_ratio`); without them (a snapshot
/// of before) the same cases come out different: MTCs cannot be timed.
#[test]
fn timing_parameters_round_trip_through_the_snapshot_and_time_the_corpus_mtc_cyc_cases() {
    use crate::capture::pt_timing::PtTiming;
    use crate::decode::pt::tools::{ptdump::ptdump, ptdump_opts::PtdumpOptions};
    let Some(dir) = crate::test_support::shared_corpus("libipt", "core/MANIFEST.tsv") else {
        println!("skipped: libipt corpus not found (set LOOKBACK_SHARED_DIR)");
        return;
    };
    let manifest = std::fs::read_to_string(dir.join("core/MANIFEST.tsv")).unwrap();
    let (mut checked, mut differ) = (0, 0);
    for line in manifest.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        let (name, opts) = (cols[0], cols.get(3).copied().unwrap_or(""));
        if !opts.contains("--cpuid-0x15.eax") || !opts.contains("--time") {
            continue;
        }
        let args: Vec<&str> = opts.split_whitespace().collect();
        let (mut want, _) = PtdumpOptions::from_args(&args).unwrap();
        let t = want.timing;
        // What the recorder would have stored, through the file format.
        let (mut snap, _) = synth_snapshot(Vec::new(), None);
        let recorder = &mut snap.meta.recorder;
        recorder
            .config_fields
            .insert("mtc_period".to_owned(), u64::from(t.mtc_freq));
        recorder.pt_timing = Some(PtTiming {
            tsc_art_ratio: Some((t.cpuid_0x15_ebx, t.cpuid_0x15_eax)),
            max_nonturbo_ratio: (t.nom_freq > 0).then_some(t.nom_freq),
            cpu: None,
        });
        let back = crate::snapshot::parse(&crate::snapshot::to_bytes(&snap)).expect("round trip");
        assert_eq!(back.meta.recorder.pt_timing, snap.meta.recorder.pt_timing);
        let got = flow_config(&back).events.timing;
        assert_eq!(got, t, "{name}: the decoder's timing from the snapshot");
        let trace = std::fs::read(dir.join(format!("core/{name}.pt"))).unwrap();
        // Cases checked by ptxed only have no ptdump expectation.
        let Ok(expected) = std::fs::read_to_string(dir.join(format!("core/{name}-ptdump.exp")))
        else {
            continue;
        };
        let normalize = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| !l.starts_with('#') && !l.starts_with(';'))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect()
        };
        want.timing = got;
        let mut out = String::new();
        ptdump(&trace, &want, &mut out).unwrap();
        assert_eq!(normalize(&out), normalize(&expected), "{name}");
        // A snapshot without the parameters: the MTCs are not timed as libipt expects
        // (cases whose only timing packets are TSC and CYC come out the same).
        let mut old = back.clone();
        old.meta.recorder.pt_timing = None;
        want.timing = flow_config(&old).events.timing;
        let mut out = String::new();
        ptdump(&trace, &want, &mut out).unwrap();
        if normalize(&out) != normalize(&expected) {
            differ += 1;
        }
        checked += 1;
    }
    println!(
        "{checked} MTC/CYC corpus cases timed from snapshot parameters, {differ} of them \
         wrong without"
    );
    assert!(checked >= 5, "{checked} MTC/CYC cases");
    assert!(
        differ >= checked / 2,
        "{differ} of {checked} depend on the parameters"
    );
}

#[test]
fn the_recording_cpu_selects_the_decoders_errata() {
    use crate::capture::pt_timing::PtTiming;
    let (mut snap, _) = synth_snapshot(Vec::new(), None);
    snap.meta.recorder.pt_timing = Some(PtTiming {
        cpu: Some("6/85/4".to_owned()),
        ..PtTiming::default()
    });
    let errata = flow_config(&snap).events.timing.errata;
    assert_eq!(
        errata,
        crate::decode::pt::Errata::for_cpu("6/85".parse().unwrap()).unwrap()
    );
    assert_ne!(errata, crate::decode::pt::Errata::default());
}

/// A TSC packet.
fn tsc_packet(tsc: u64) -> Vec<u8> {
    let mut out = vec![0x19];
    out.extend_from_slice(&tsc.to_le_bytes()[..7]);
    out
}

/// Where another process's code runs in [`cpu_wide_ring`] (the snapshot has none of it).
const OTHER_CODE: u64 = 0x50_0000;

/// One CPU of a per-CPU recorder: process 10 runs the encoder's program (reshaped with a
/// trace stop and start at every 4th TIP, as at system calls of a user-only trace), and
/// at its first trace stop after its second PSB the CPU switches to process 20 and back,
/// as a user-only CPU-wide trace shows it: `TIP.PGD`, the time of the switch, `TIP.PGE`
/// into process 20's code, its branches, `TIP.PGD`, the time of the switch back, and
/// process 10's own `TIP.PGE`. Out: the trace, the sideband (`ITRACE_START`, COMM, the
/// four `SWITCH_CPU_WIDE` records) and process 10's trace without the switch.
fn cpu_wide_ring() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    use crate::decode::pt::packets::{cpu::Errata, decoder::PacketDecoder, packet::Packet};
    use crate::decode::pt::tools::encode_shape::{Shape, reshape};
    let program = SynthProgram::generate(3, 8);
    let encoded = encode(&program, 3, 16 << 10, true);
    let trace = reshape(&encoded.trace, Shape::DisableEnable).expect("an encoder trace");
    let (mut psbs, mut tscs, mut splice) = (0, Vec::new(), None);
    let mut packets = PacketDecoder::new(&trace, Errata::default()).peekable();
    while let Some(Ok((_, packet))) = packets.next() {
        match packet {
            Packet::Psb => psbs += 1,
            Packet::Tsc { tsc } => tscs.push(tsc),
            Packet::TipPgd(_) if psbs >= 2 && splice.is_none() => {
                let end = packets.peek().and_then(|p| p.as_ref().ok()).map(|p| p.0);
                splice = end.map(|end| (end, *tscs.last().expect("a TSC in PSB+")));
            }
            _ => {}
        }
    }
    let (at, before) = splice.expect("a trace stop after the second PSB");
    assert!(
        tscs.iter().any(|&t| t > before + 2),
        "a later PSB's TSC comes after the switches"
    );
    let (out_at, back_at) = (before + 1, before + 2);
    let mut other = tsc_packet(out_at);
    other.push(0x71); // TIP.PGE, a full 6-byte IP
    other.extend_from_slice(&OTHER_CODE.to_le_bytes()[..6]);
    other.extend_from_slice(&[0b0101_1010, 0x01]); // TNT, then TIP.PGD (IP suppressed)
    other.extend(tsc_packet(back_at));
    let mut spliced = trace[..at].to_vec();
    spliced.extend(other);
    spliced.extend_from_slice(&trace[at..]);
    let switch = |misc: u16, other: (u32, u32), thread: (u32, u32), time: u64| {
        let body = [other.0.to_le_bytes(), other.1.to_le_bytes()].concat();
        sideband_record(15, misc, &body, thread, time, 0)
    };
    let out = 1 << 13;
    let mut sideband = thread_start_records(10, 11, "synth", 1, 0);
    sideband.extend(switch(out, (20, 21), (10, 11), out_at));
    sideband.extend(switch(0, (10, 11), (20, 21), out_at));
    sideband.extend(switch(out, (10, 11), (20, 21), back_at));
    sideband.extend(switch(0, (20, 21), (10, 11), back_at));
    (spliced, sideband, trace)
}

#[test]
fn a_per_cpu_ring_keeps_only_the_snapshots_processes_and_their_flow() {
    let (trace, sideband, alone) = cpu_wide_ring();
    let (mut snap, _) = synth_snapshot(sideband, Some(IDENTITY));
    if let Some(ring) = snap.rings.first_mut() {
        ring.data = alone;
    }
    let reference = decode_all(&snap, &EmbeddedOnly, 1);
    assert_eq!(reference.errors, 0);
    if let Some(ring) = snap.rings.first_mut() {
        ring.data = trace;
    }
    let flow = |out: &PtThreads, track: Track| {
        out.tracks
            .get(&track)
            .map_or_else(Vec::new, |t| flow_of(&t.branches))
    };
    let ours = Track::Thread { pid: 10, tid: 11 };
    let theirs = Track::Thread { pid: 20, tid: 21 };
    // Per process (today's rings): the other process's stretch is a track of its own, an
    // error where its code is missing.
    let per_process = decode_all(&snap, &EmbeddedOnly, 1);
    assert!(
        per_process.tracks.contains_key(&theirs),
        "{:?}",
        per_process.tracks.keys().collect::<Vec<_>>()
    );
    snap.meta.recorder.cpu_wide = true;
    for threads in [1, 4] {
        let out = decode_all(&snap, &EmbeddedOnly, threads);
        assert_eq!(
            out.tracks.keys().copied().collect::<Vec<_>>(),
            [ours],
            "only the snapshot's process ({threads} threads)"
        );
        assert!(
            out.other_processes > 0,
            "the other process's events counted"
        );
        let got = flow(&out, ours);
        // Process 10's flow on both sides of the switch, none of process 20's addresses.
        assert!(
            got.iter().all(|b| b.1 < OTHER_CODE && b.2 < OTHER_CODE),
            "no branch from the other process's code"
        );
        let expected = flow(&reference, ours);
        assert!(expected.len() > 1_000, "{} branches", expected.len());
        assert!(
            got == expected,
            "every branch of process 10 in order, as without the switch: {} of {}",
            got.len(),
            expected.len()
        );
        assert_eq!(out.errors, 0, "no error on the kept track");
    }
}
