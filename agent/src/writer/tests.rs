//! The whole back half on a hand-made snapshot: samples of this test process (so its own
//! functions symbolize) → trace, read back as Chrome JSON and walked as FXT records.

use std::collections::BTreeMap;

use serde_json::Value;

use super::*;
use crate::capture::records::{
    PERF_CONTEXT_USER, PERF_RECORD_SAMPLE, SAMPLE_CALLCHAIN, SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME,
};
use crate::capture::{CapturedData, MapEntry, ProcessMaps, RecorderParams, RingData, RingKind};

#[inline(never)]
fn lookback_writer_outer() -> u64 {
    std::hint::black_box(1)
}

#[inline(never)]
fn lookback_writer_inner() -> u64 {
    std::hint::black_box(2)
}

fn own_maps() -> ProcessMaps {
    let text = fs::read_to_string("/proc/self/maps").expect("maps");
    let maps = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (start, end) = f.first()?.split_once('-')?;
            Some(MapEntry {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                perms: (*f.get(1)?).to_owned(),
                offset: u64::from_str_radix(f.get(2)?, 16).ok()?,
                dev: (*f.get(3)?).to_owned(),
                inode: f.get(4)?.parse().ok()?,
                path: f.get(5..).map(|p| p.join(" ")).unwrap_or_default(),
                build_id: None,
            })
        })
        .collect();
    ProcessMaps {
        pid: std::process::id(),
        comm: "writer-test".to_owned(),
        exe: None,
        read_at_ns: 0,
        at_freeze: true,
        maps,
        origin: crate::capture::origin::ProcessOrigin::default(),
    }
}

/// A `PERF_RECORD_SAMPLE` with IP, TID, TIME and a user callchain (leaf first).
fn sample_record(pid: u32, tid: u32, time: u64, chain: &[u64]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(chain[0].to_le_bytes());
    body.extend((u64::from(tid) << 32 | u64::from(pid)).to_le_bytes());
    body.extend(time.to_le_bytes());
    body.extend((chain.len() as u64 + 1).to_le_bytes());
    body.extend(PERF_CONTEXT_USER.to_le_bytes());
    for a in chain {
        body.extend(a.to_le_bytes());
    }
    let size = u16::try_from(body.len() + 8).expect("small record");
    let mut rec = Vec::new();
    rec.extend(PERF_RECORD_SAMPLE.to_le_bytes());
    rec.extend(2u16.to_le_bytes());
    rec.extend(size.to_le_bytes());
    rec.extend(body);
    rec
}

fn snapshot() -> Snapshot {
    let pid = std::process::id();
    let outer = lookback_writer_outer as *const () as u64;
    let inner = lookback_writer_inner as *const () as u64;
    assert_eq!(lookback_writer_outer() + lookback_writer_inner(), 3);
    // outer (a return address inside it) → inner, for three samples; then outer alone.
    let mut data = Vec::new();
    for i in 0..3 {
        data.extend(sample_record(
            pid,
            pid,
            1_000_000 + i * 100_000,
            &[inner + 1, outer + 5],
        ));
    }
    data.extend(sample_record(pid, pid, 1_300_000, &[outer + 2]));
    let captured = CapturedData {
        backend: Backend::Sampling,
        params: RecorderParams {
            event: "cpu-clock".to_owned(),
            perf_type: 1,
            config: 0,
            config_fields: BTreeMap::new(),
            sample_type: SAMPLE_IP | SAMPLE_TID | SAMPLE_TIME | SAMPLE_CALLCHAIN,
            sample_regs_user: 0,
            sample_stack_user: 0,
            switch_ids: Vec::new(),
            sample_id_all: true,
            sample_frequency: Some(10_000),
            buffer_size: 1 << 20,
            include_kernel: false,
            clockid: Some(1),
            cpus: vec![0],
            aux_pause: false,
            address_filter: None,
            pt_timing: None,
            cpu_wide: false,
        },
        freeze_time_ns: 2_000_000,
        pause_duration_ns: 0,
        rings: vec![RingData {
            kind: RingKind::PerfRecords,
            cpu: Some(0),
            tid: None,
            wrapped: false,
            records: 4,
            stop: None,
            data,
        }],
        sideband: vec![],
        clock: None,
        processes: vec![own_maps()],
        code: vec![],
        perf_maps: Vec::new(),
        window: Some((1_000_000, 1_300_000)),
        kernel_symbols: Vec::new(),
    };
    let trigger = TriggerMeta {
        rule: "func:lookback_writer_inner>1ms".to_owned(),
        kind: "function".to_owned(),
        detail: "return, duration 1.2ms".to_owned(),
        pid,
        tid: pid,
        comm: "writer-test".to_owned(),
        trigger_time_ns: 1_240_000,
        duration_ns: Some(1_200_000),
        stack: Vec::new(),
        kernel_stack: Vec::new(),
        call: None,
    };
    Snapshot::from_captured(captured, Some(trigger))
}

/// The last path segment of a demangled Rust name.
fn short(name: &str) -> &str {
    if name.starts_with("trigger:") {
        return name;
    }
    name.rsplit("::").next().unwrap_or(name)
}

#[test]
fn chrome_json_has_the_nested_functions_and_the_trigger() {
    let snap = snapshot();
    let mut out = Vec::new();
    let summary = encode(&snap, &mut out, Format::ChromeJson).expect("encode");
    assert_eq!(summary.samples, 4);
    assert_eq!(summary.unknown_frames, 0);
    let doc: Value = serde_json::from_slice(&out).expect("one JSON document");
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    let pid = std::process::id();
    let seq: Vec<String> = events
        .iter()
        .filter(|e| e["ph"] != "M" && e["tid"] == pid)
        .map(|e| {
            format!(
                "{}{}",
                e["ph"].as_str().unwrap_or("?"),
                short(e["name"].as_str().unwrap_or("?"))
            )
        })
        .collect();
    assert_eq!(
        seq,
        [
            "Blookback_writer_outer",
            "Blookback_writer_inner",
            "Itrigger: func:lookback_writer_inner>1ms"
                .replace('I', "i")
                .as_str(),
            "Elookback_writer_inner",
            "Elookback_writer_outer"
        ]
    );
    let name = format!("writer-test [{pid}] [{pid}]");
    assert!(
        events
            .iter()
            .any(|e| e["name"] == "thread_name" && e["args"]["name"] == name.as_str())
    );
    let inner_end = events
        .iter()
        .find(|e| e["ph"] == "E" && e["name"].as_str().map(short) == Some("lookback_writer_inner"));
    // Inner leaves between the samples at 1.2 ms and 1.3 ms: the midpoint.
    assert_eq!(
        inner_end.map(|e| e["ts"].clone()),
        Some(serde_json::json!(1250.0))
    );
    let trig = events.iter().find(|e| e["ph"] == "i").expect("instant");
    assert_eq!(trig["args"]["duration_ns"], 1_200_000);
    assert_eq!(trig["args"]["kind"], "function");
}

/// A process in a container: its track says which one (the first 12 hex digits of the
/// id, as `docker ps` shows it); its threads' tracks stay `comm [pid] [tid]`.
#[test]
fn a_process_in_a_container_names_it_on_its_track() {
    let id = "edf5184164d5844eac5cdeafc8147feea92df2ad3e928c51dc5c64d37bba1889";
    let pid = std::process::id();
    let names = |snap: &Snapshot| {
        let mut out = Vec::new();
        encode(snap, &mut out, Format::ChromeJson).expect("encode");
        let doc: Value = serde_json::from_slice(&out).expect("JSON");
        let name = |kind: &str| {
            doc["traceEvents"]
                .as_array()
                .expect("events")
                .iter()
                .find(|e| e["name"] == kind)
                .and_then(|e| e["args"]["name"].as_str().map(str::to_owned))
        };
        (name("process_name"), name("thread_name"))
    };
    let mut snap = snapshot();
    assert_eq!(
        names(&snap).0.as_deref(),
        Some(format!("writer-test [{pid}]").as_str())
    );
    snap.maps[0].origin.container_id = Some(id.to_owned());
    let (process, thread) = names(&snap);
    assert_eq!(
        process.as_deref(),
        Some(format!("writer-test [{pid}] (container edf5184164d5)").as_str())
    );
    assert_eq!(thread, Some(format!("writer-test [{pid}] [{pid}]")));
}

#[test]
fn fxt_records_are_well_formed() {
    let snap = snapshot();
    let mut out = Vec::new();
    encode(&snap, &mut out, Format::Fxt).expect("encode");
    assert_eq!(out.len() % 8, 0);
    let words: Vec<u64> = out
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    let mut at = 1;
    let mut kinds = BTreeMap::new();
    while at < words.len() {
        let size = usize::try_from((words[at] >> 4) & 0xfff).unwrap_or(0);
        assert!(size > 0, "zero-size record at word {at}");
        *kinds.entry(words[at] & 0xf).or_insert(0) += 1;
        at += size;
    }
    assert_eq!(at, words.len());
    // 4 begin/end + 1 instant event records, and the trigger call's begin/end; the
    // process, its thread and the trigger call's track as kernel objects.
    assert_eq!(kinds.get(&4), Some(&7));
    assert_eq!(kinds.get(&7), Some(&3));
}

#[test]
fn files_are_gzipped_by_name_and_private() {
    use std::io::Read as _;
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let snap = snapshot();
    let path = dir.path().join("t.json.gz");
    write_trace(&snap, &path).expect("write");
    let meta = fs::metadata(&path).expect("written");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let mut text = String::new();
    flate2::read::GzDecoder::new(fs::File::open(&path).expect("open"))
        .read_to_string(&mut text)
        .expect("gzip");
    assert!(text.starts_with("{\"traceEvents\":["));
    assert_eq!(
        fs::read_dir(dir.path()).expect("dir").count(),
        1,
        "no temp file left"
    );
    assert_eq!(
        Format::from_path(Path::new("a.fxt.gz")),
        (Format::Fxt, true)
    );
    assert_eq!(
        Format::from_path(Path::new("a.JSON")),
        (Format::ChromeJson, false)
    );
}

#[test]
fn a_stack_ends_at_its_first_address_that_is_not_code() {
    let code = |addr: u64| (0x1000..0x2000).contains(&addr);
    // Outermost first: a heap address between two code frames cuts the outer one off.
    assert_eq!(
        code_frames(&[0x1100, 0x7f00_0000, 0x1200, 0x1300], code),
        (&[0x1200, 0x1300][..], true)
    );
    // A walk's terminator (0, small numbers) outermost is no loss.
    assert_eq!(
        code_frames(&[0, 0x10, 0x1200], code),
        (&[0x1200][..], false)
    );
    assert_eq!(
        code_frames(&[0x1200, 0x1300], code),
        (&[0x1200, 0x1300][..], false)
    );
    // A leaf outside code: nothing is left.
    assert_eq!(code_frames(&[0x1200, 0x5000], code), (&[][..], true));
}

#[test]
fn heap_addresses_in_a_sampled_stack_are_no_slices() {
    let mut snap = snapshot();
    let pid = std::process::id();
    let inner = lookback_writer_inner as *const () as u64;
    let outer = lookback_writer_outer as *const () as u64;
    // What a frame-pointer walk through a frame without one reads: a heap pointer as a
    // "return address" between two real frames.
    let heap = Box::new(0u64);
    let heap = std::ptr::from_ref(&*heap) as u64;
    snap.rings[0].data.extend(sample_record(
        pid,
        pid,
        1_350_000,
        &[inner + 1, heap, outer + 5],
    ));
    let mut out = Vec::new();
    let summary = encode(&snap, &mut out, Format::ChromeJson).expect("encode");
    assert_eq!(summary.truncated_stacks, 1);
    let doc: Value = serde_json::from_slice(&out).expect("one JSON document");
    let names: Vec<&str> = doc["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with("[unknown]")),
        "{names:?}"
    );
}

/// The trigger's call on a track of its own, from the kernel's entry to its return: the
/// trigger's time minus its duration, to its time, exactly.
#[test]
fn the_triggering_call_is_one_exact_slice_on_its_own_track() {
    let snap = snapshot();
    let mut out = Vec::new();
    encode(&snap, &mut out, Format::ChromeJson).expect("encode");
    let doc: Value = serde_json::from_slice(&out).expect("JSON");
    let pid = std::process::id();
    let track = pid | CALL_TRACK;
    let on_track: Vec<&Value> = doc["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["tid"] == track)
        .collect();
    let phases: Vec<&str> = on_track.iter().filter_map(|e| e["ph"].as_str()).collect();
    assert_eq!(phases, ["M", "B", "E"]);
    assert_eq!(
        on_track[0]["args"]["name"],
        format!("writer-test [{pid}] [{pid}] trigger call")
    );
    // No trigger stack in this snapshot: the slice is named after the rule.
    assert_eq!(on_track[1]["name"], "func:lookback_writer_inner>1ms");
    assert_eq!(on_track[1]["ts"], serde_json::json!(40.0));
    assert_eq!(on_track[2]["ts"], serde_json::json!(1240.0));
    assert_eq!(on_track[1]["args"]["duration_ns"], 1_200_000);
}

/// A trace read back gives the report its writer computed, FXT and Chrome JSON alike.
#[test]
fn a_trace_read_back_reports_what_its_writer_reported() {
    let snap = snapshot();
    for format in [Format::Fxt, Format::ChromeJson] {
        let mut out = Vec::new();
        let summary = encode(&snap, &mut out, format).expect("encode");
        let written = summary.report.expect("a report");
        assert!(
            written
                .verdict
                .starts_with("func:lookback_writer_inner>1ms")
                || written.verdict.contains("lookback_writer_inner"),
            "{}",
            written.verdict
        );
        let window = report::DEFAULT_WINDOW_NS;
        let (trigger, collector) = report::read::read_trace(&out, window).expect("read back");
        assert_eq!(trigger.duration_ns, Some(1_200_000));
        assert_eq!(trigger.time_ns, 1_240_000);
        // The thread's name, from its track's name.
        assert_eq!(trigger.comm, "writer-test", "{format:?}");
        let read = collector.report(&trigger, report::DEFAULT_DEPTH);
        assert_eq!(read.breakdown, written.breakdown, "{format:?}");
        assert_eq!(read.interval_ns, written.interval_ns);
        assert_eq!(read.covered_ns, written.covered_ns);
    }
    let bad = report::read::read_trace(b"\x00\x01 not a trace", 1);
    assert!(bad.is_err());
}

/// speedscope's own format: frame names without args, one profile per track, the
/// trigger's thread shown first, every open closed in order.
#[test]
fn speedscope_frames_are_clean_names_and_the_trigger_thread_comes_first() {
    let snap = snapshot();
    let mut out = Vec::new();
    encode(&snap, &mut out, Format::Speedscope).expect("encode");
    let doc: Value = serde_json::from_slice(&out).expect("JSON");
    assert_eq!(
        doc["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let frames: Vec<&str> = doc["shared"]["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert!(
        frames.iter().any(|f| short(f) == "lookback_writer_inner"),
        "{frames:?}"
    );
    assert!(frames.iter().all(|f| !f.contains('{')), "{frames:?}");
    let profiles = doc["profiles"].as_array().expect("profiles");
    let pid = std::process::id();
    let active = doc["activeProfileIndex"].as_u64().expect("index");
    let active = usize::try_from(active).expect("small");
    assert_eq!(
        profiles[active]["name"],
        format!("writer-test [{pid}] [{pid}]")
    );
    for p in profiles {
        assert_eq!(p["type"], "evented");
        let mut open = Vec::new();
        let mut last = 0;
        for e in p["events"].as_array().expect("events") {
            let at = e["at"].as_u64().expect("at");
            assert!(at >= last);
            last = at;
            match e["type"].as_str() {
                Some("O") => open.push(e["frame"].clone()),
                Some("C") => assert_eq!(open.pop(), Some(e["frame"].clone())),
                other => panic!("event type {other:?}"),
            }
        }
        assert!(open.is_empty());
    }
}

/// A trace read back from hostile bytes: every truncation, every single-bit flip and
/// random records after the FXT magic read or fail, never panic; the report of whatever
/// was read stays within its interval.
#[test]
fn traces_read_back_from_corrupt_bytes_fail_or_read_without_a_panic() {
    let snap = snapshot();
    let window = report::DEFAULT_WINDOW_NS;
    let check = |bytes: &[u8]| {
        if let Ok((trigger, collector)) = report::read::read_trace(bytes, window) {
            let r = collector.report(&trigger, report::DEFAULT_DEPTH);
            assert!(r.covered_ns <= r.interval_ns);
        }
    };
    for format in [Format::Fxt, Format::ChromeJson] {
        let mut out = Vec::new();
        encode(&snap, &mut out, format).expect("encode");
        for len in 0..out.len() {
            check(&out[..len]);
        }
        for bit in 0..out.len() * 8 {
            let mut flipped = out.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            check(&flipped);
        }
    }
    // xorshift: reproducible noise after the magic word.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..2_000 {
        let mut bytes = 0x0016_5478_4604_0010_u64.to_le_bytes().to_vec();
        for _ in 0..64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bytes.extend(x.to_le_bytes());
        }
        check(&bytes);
    }
}
