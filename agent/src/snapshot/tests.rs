//! Round trips, atomic writes, and corrupt input: truncation at every byte, random bytes,
//! bit flips, foreign files and newer versions are errors with useful messages, never
//! panics.

use std::{collections::BTreeMap, os::unix::fs::PermissionsExt as _};

use super::*;
use crate::capture::{MapEntry, RingKind, WalkStop, perf_map::PerfMapEntry};

/// A JIT runtime's names (section kind 5), with the counts of what was left out.
fn sample_perf_map() -> PerfMap {
    PerfMap {
        pid: 42,
        path: "/tmp/perf-1.map".to_owned(),
        malformed: 2,
        superseded: 1,
        dropped: 3,
        truncated: false,
        entries: vec![
            PerfMapEntry {
                start: 0x7f00_0000_1000,
                size: 0x180,
                name: "JS:~handleRequest /app.js:3:23".to_owned(),
            },
            PerfMapEntry {
                start: 0x7f00_0000_2000,
                size: 0x40,
                name: "void Jit.slow(int)".to_owned(),
            },
        ],
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one literal of every section kind and metadata field"
)]
fn sample_snapshot() -> Snapshot {
    let data = CapturedData {
        backend: Backend::Sampling,
        params: RecorderParams {
            event: "cpu-clock".to_owned(),
            perf_type: 1,
            config: 0,
            config_fields: BTreeMap::from([("tsc".to_owned(), 1)]),
            sample_type: 0x1a7,
            sample_regs_user: 0,
            sample_stack_user: 0,
            switch_ids: Vec::new(),
            sample_id_all: true,
            sample_frequency: Some(10_000),
            buffer_size: 1 << 20,
            include_kernel: false,
            clockid: Some(1),
            cpus: vec![0, 1],
            aux_pause: false,
            address_filter: None,
            pt_timing: None,
            cpu_wide: false,
        },
        freeze_time_ns: 5_000_000,
        pause_duration_ns: 1_200,
        rings: vec![
            RingData {
                kind: RingKind::PerfRecords,
                cpu: Some(0),
                tid: None,
                wrapped: true,
                records: 2,
                stop: Some(WalkStop::Wrapped),
                data: (0..=255).collect(),
            },
            RingData {
                kind: RingKind::Aux,
                cpu: Some(1),
                tid: None,
                wrapped: false,
                records: 0,
                stop: None,
                data: vec![],
            },
        ],
        sideband: vec![SidebandData {
            cpu: Some(1),
            dropped_bytes: 0,
            data: vec![1, 2, 3],
        }],
        clock: Some(ClockConversion {
            time_zero: 7,
            time_mult: 3,
            time_shift: 10,
            valid: true,
            tsc_at_freeze: Some(99),
            monotonic_ns_at_freeze: 5_000_000,
            tsc_earlier: None,
            monotonic_ns_earlier: 0,
        }),
        processes: vec![ProcessMaps {
            pid: 42,
            comm: "workload".to_owned(),
            exe: Some("/bin/workload".to_owned()),
            read_at_ns: 4_999_000,
            at_freeze: true,
            maps: vec![MapEntry {
                start: 0x1000,
                end: 0x2000,
                perms: "r-xp".to_owned(),
                offset: 0,
                dev: "fd:01".to_owned(),
                inode: 12,
                path: "/bin/workload".to_owned(),
                build_id: Some("abcd".to_owned()),
            }],
            origin: crate::capture::origin::ProcessOrigin::default(),
        }],
        code: vec![CodeRegion {
            pid: 42,
            start: 0x7000,
            path: "[vdso]".to_owned(),
            data: b"\x7fELF code".to_vec(),
        }],
        perf_maps: vec![sample_perf_map()],
        window: Some((1_000_000, 4_900_000)),
        kernel_symbols: Vec::new(),
    };
    let trigger = TriggerMeta {
        rule: "func:lb_work>5ms".to_owned(),
        kind: "function".to_owned(),
        detail: "return, duration 8.29ms".to_owned(),
        pid: 42,
        tid: 43,
        comm: "workload".to_owned(),
        trigger_time_ns: 4_990_000,
        duration_ns: Some(8_290_000),
        stack: Vec::new(),
        kernel_stack: Vec::new(),
        call: None,
    };
    Snapshot::from_captured(data, Some(trigger))
}

#[test]
fn round_trip_keeps_everything() {
    let snap = sample_snapshot();
    assert_eq!(snap.meta.trigger_to_freeze_ns, Some(10_000));
    assert_eq!(snap.meta.window_start_ns, Some(1_000_000));
    assert_eq!(snap.raw_bytes(), 259);
    let bytes = to_bytes(&snap);
    assert_eq!(&bytes[..8], &MAGIC);
    let back = parse(&bytes).expect("parse");
    assert_eq!(back, snap);
}

#[test]
fn atomic_write_is_private_and_leaves_no_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snap.lbsnap");
    let snap = sample_snapshot();
    write_atomic(&path, &snap).expect("write");
    write_atomic(&path, &snap).expect("overwrite");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("snap.lbsnap")]);
    assert_eq!(read(&path).expect("read"), snap);
    let err = write_atomic(&dir.path().join("missing/x.lbsnap"), &snap).unwrap_err();
    assert!(err.to_string().starts_with("cannot write"), "{err}");
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = to_bytes(&sample_snapshot());
    for len in 0..bytes.len() {
        let err = parse(&bytes[..len]).expect_err("truncated parses");
        let text = err.to_string();
        assert!(
            text.contains("truncated") || text.contains("not a lookback snapshot"),
            "at {len}: {text}"
        );
    }
}

#[test]
fn foreign_newer_and_trailing_data_are_explained() {
    let err = parse(b"\x7fELF\x02\x01\x01\0 not a snapshot").unwrap_err();
    assert!(
        err.to_string().starts_with("not a lookback snapshot"),
        "{err}"
    );
    let mut bytes = to_bytes(&sample_snapshot());
    bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
    let err = parse(&bytes).unwrap_err();
    assert_eq!(
        err.to_string(),
        "snapshot format version 7 is newer than this lookback reads (up to 1): upgrade lookback"
    );
    bytes[8..12].copy_from_slice(&0u32.to_le_bytes());
    assert!(matches!(parse(&bytes), Err(SnapshotError::ZeroVersion)));
    let mut bytes = to_bytes(&sample_snapshot());
    bytes.push(0);
    assert!(matches!(
        parse(&bytes),
        Err(SnapshotError::TrailingBytes { extra: 1 })
    ));
    let err = read(std::path::Path::new("/nonexistent/x.lbsnap")).unwrap_err();
    assert!(
        err.to_string().starts_with("cannot read /nonexistent"),
        "{err}"
    );
}

#[test]
fn a_corrupt_sample_type_is_refused_with_the_reason() {
    // It decoded to an empty trace, with exit 0, that looked like an idle process.
    for (sample_type, problem) in [(0x1a0, "lacks IP, TID or TIME"), (1 << 40 | 0x1a7, "bits")] {
        let mut snap = sample_snapshot();
        snap.meta.recorder.sample_type = sample_type;
        let err = parse(&to_bytes(&snap)).unwrap_err();
        assert!(
            matches!(err, SnapshotError::SampleType { .. })
                && err.to_string().contains(problem)
                && err.to_string().ends_with("corrupt snapshot"),
            "{err}"
        );
    }
}

#[test]
fn unknown_sections_are_skipped() {
    let snap = sample_snapshot();
    let mut bytes = to_bytes(&snap);
    // Insert a kind-99 section before the end marker and bump the count.
    let end = bytes.len() - 24;
    let mut extra = 99u32.to_le_bytes().to_vec();
    extra.extend(2u32.to_le_bytes());
    extra.extend(3u64.to_le_bytes());
    extra.extend(b"{}abc");
    bytes.splice(end..end, extra);
    let count_at = bytes.len() - 8;
    let count = u64::from_le_bytes(bytes[count_at..].try_into().unwrap());
    bytes[count_at..].copy_from_slice(&(count + 1).to_le_bytes());
    assert_eq!(parse(&bytes).expect("skips kind 99"), snap);
}

/// xorshift64: deterministic noise without a dependency.
fn noise(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn random_bytes_and_bit_flips_never_panic() {
    let good = to_bytes(&sample_snapshot());
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2_000 {
        let len = usize::try_from(noise(&mut seed) % 512).unwrap();
        let mut bytes: Vec<u8> = (0..len)
            .map(|_| noise(&mut seed).to_le_bytes()[0])
            .collect();
        // Half the time, start like a real snapshot to get past the magic.
        if noise(&mut seed).is_multiple_of(2) {
            let keep = good.len().min(24 + len);
            bytes.splice(0..0, good[..keep].iter().copied());
        }
        let _ = parse(&bytes);
    }
    for i in 0..good.len() * 8 {
        let mut bytes = good.clone();
        bytes[i / 8] ^= 1 << (i % 8);
        let _ = parse(&bytes);
    }
    // Huge lengths must not allocate: a ring section claiming 2^63 data bytes.
    let mut bytes = good[..good.len() - 24].to_vec();
    bytes.extend(1u32.to_le_bytes());
    bytes.extend(2u32.to_le_bytes());
    bytes.extend((1u64 << 63).to_le_bytes());
    bytes.extend(b"{}");
    assert!(parse(&bytes).is_err());
}
