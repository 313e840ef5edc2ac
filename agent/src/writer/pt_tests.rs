//! The PT path end to end without PT hardware: Intel's libipt corpus cases (traces whose
//! instruction flow Intel's ptxed checked: `NAME-ptxed.exp`) put into one PT snapshot
//! bundle, one CPU ring and one thread each, written as Chrome JSON and FXT by the real
//! writer. Each thread's slices must nest exactly as the calls and returns of its case's
//! expected flow: the flow's instructions are decoded from `NAME.bin`, every call whose
//! target is traced opens `[unknown @ TARGET]` (the code has no symbols), every return
//! closes the innermost open call.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::*;
use crate::capture::intel_pt::SIDEBAND_SAMPLE_TYPE;
use crate::capture::records::{PERF_AUX_FLAG_TRUNCATED, PERF_RECORD_AUX, PERF_RECORD_LOST};
use crate::capture::{
    CapturedData, CodeRegion, MapEntry, ProcessMaps, RecorderParams, RingData, RingKind,
    SidebandData,
};
use crate::decode::pt::flow::insn;
use crate::decode::pt::packets::packet::ExecMode;
use crate::decode::pt::{Image, InsnClass};
use crate::test_support::{shared_corpus, sideband_record, thread_start_records};

/// One corpus case: its code, its trace and the flow ptxed printed for it.
pub(crate) struct Case {
    name: String,
    org: u64,
    bin: Vec<u8>,
    pt: Vec<u8>,
    pub(crate) flow: Vec<Line>,
}

/// A line of a `-ptxed.exp` flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Line {
    Insn(InsnClass, u64),
    /// `[enabled]`, `[resumed]`: tracing (re)starts.
    Enabled,
    /// `[interrupt]`: an asynchronous branch.
    Interrupt,
    /// `[disabled]`, `[disabled, at ...]`: tracing stops (a branch just before it went
    /// into untraced code).
    Disabled,
    /// Events that change no call stack (`[disabled]` opens `[untraced]`, which the
    /// comparison leaves out; power, timing, paging, TSX and trigger events).
    Other,
}

/// The case `name`, or why it cannot be compared: options or per-CPU expectations (the
/// writer decodes with the defaults), decode errors in the flow, code that is not 64-bit.
pub(crate) fn load_case(dir: &Path, name: &str, org: u64) -> Result<Case, String> {
    let read = |suffix: &str| {
        fs::read(dir.join(format!("{name}{suffix}"))).map_err(|e| format!("{suffix}: {e}"))
    };
    let (bin, pt, exp) = (read(".bin")?, read(".pt")?, read("-ptxed.exp")?);
    let mut image = Image::new();
    image.add(name, bin.clone(), org);
    let mut flow = Vec::new();
    for line in String::from_utf8_lossy(&exp).lines().map(str::trim) {
        let line = line.strip_prefix("? ").unwrap_or(line);
        if line.contains("error") {
            return Err(format!("decode error in the flow: {line}"));
        }
        if line.starts_with("[exec mode") && line != "[exec mode: 64-bit]" {
            return Err(format!("mode change: {line}"));
        }
        if line.starts_with('[') {
            flow.push(match line {
                "[enabled]" | "[resumed]" => Line::Enabled,
                "[interrupt]" => Line::Interrupt,
                _ if line.starts_with("[disabled") => Line::Disabled,
                _ if line.starts_with("[interrupt") => return Err(format!("event {line}")),
                _ => Line::Other,
            });
            continue;
        }
        let addr = u64::from_str_radix(line, 16).map_err(|_| format!("line {line:?}"))?;
        let insn =
            insn::decode(&image, addr, ExecMode::Bits64).map_err(|e| format!("{addr:#x}: {e}"))?;
        flow.push(Line::Insn(insn.class, addr));
    }
    Ok(Case {
        name: name.to_owned(),
        org,
        bin,
        pt,
        flow,
    })
}

/// The slices the flow implies, as `+NAME` / `-` in order, by magic-trace's rules: a
/// call whose target ran opens `[unknown @ TARGET]`, a return closes the innermost call
/// (and the `[syscall]`/`[interrupt]` above it), a far call that lands in traced code
/// opens `[syscall]`, an interrupt `[interrupt]`, which a far return or tracing starting
/// again closes. With `returns: false` returns (near and far) close nothing: a
/// deliberately wrong model, which the trace must not match where it differs.
pub(crate) fn expected(flow: &[Line], returns: bool) -> Vec<String> {
    let mut out = Vec::new();
    // true: a function frame; false: [syscall] / [interrupt].
    let mut stack: Vec<bool> = Vec::new();
    let close_pseudo = |stack: &mut Vec<bool>, out: &mut Vec<String>| {
        while stack.last() == Some(&false) {
            stack.pop();
            out.push("-".to_owned());
        }
    };
    for (at, line) in flow.iter().enumerate() {
        // Where a branch went: the next instruction, past events that change nothing.
        let next = flow[at + 1..]
            .iter()
            .find(|l| **l != Line::Other)
            .and_then(|l| match *l {
                Line::Insn(_, to) => Some(to),
                _ => None,
            });
        match (*line, next) {
            (Line::Insn(InsnClass::Call, _), Some(to)) => {
                out.push(format!("+[unknown @ {to:#x}]"));
                stack.push(true);
            }
            (Line::Insn(InsnClass::Return, _), Some(_)) if returns => {
                close_pseudo(&mut stack, &mut out);
                if stack.pop().is_some() {
                    out.push("-".to_owned());
                }
            }
            (Line::Insn(InsnClass::FarCall, _), Some(_)) => {
                out.push("+[syscall]".to_owned());
                stack.push(false);
            }
            (Line::Interrupt, _) => {
                out.push("+[interrupt]".to_owned());
                stack.push(false);
            }
            (Line::Insn(InsnClass::FarReturn, _), Some(_)) if returns => {
                close_pseudo(&mut stack, &mut out);
            }
            (Line::Enabled, _) => {
                close_pseudo(&mut stack, &mut out);
            }
            _ => {}
        }
    }
    out.extend(std::iter::repeat_n("-".to_owned(), stack.len()));
    out
}

/// The corpus cases whose flow has calls, and the reasons the others were left out.
fn cases(dir: &Path) -> (Vec<Case>, BTreeMap<String, String>) {
    let manifest = fs::read_to_string(dir.join("MANIFEST.tsv")).expect("MANIFEST.tsv");
    let mut found = Vec::new();
    let mut skipped = BTreeMap::new();
    for row in manifest.lines().skip(1) {
        let f: Vec<&str> = row.split('\t').collect();
        let (Some(name), Some(org)) = (f.first(), f.get(1)) else {
            continue;
        };
        let opts = f.get(2..).unwrap_or_default();
        if opts.iter().any(|o| !o.trim().is_empty()) {
            skipped.insert((*name).to_owned(), "CPU or tool options".to_owned());
            continue;
        }
        let org = u64::from_str_radix(org.trim_start_matches("0x"), 16).expect("org");
        match load_case(dir, name, org) {
            Ok(case) if expected(&case.flow, true).is_empty() => {
                skipped.insert(case.name, "no traced call".to_owned());
            }
            Ok(case) => found.push(case),
            Err(reason) => {
                skipped.insert((*name).to_owned(), reason);
            }
        }
    }
    (found, skipped)
}

/// The pid and tid the i-th case is recorded as.
pub(crate) fn ids(i: usize) -> (u32, u32) {
    let i = u32::try_from(i).expect("few cases");
    (1000 + i, 2000 + i)
}

/// One PT snapshot: case i on CPU i as thread `ids(i)` (`ITRACE_START` and COMM sideband,
/// unless `sideband` is false), its code embedded at its `org`.
pub(crate) fn bundle(cases: &[Case], sideband: bool) -> Snapshot {
    let mut captured = CapturedData {
        backend: Backend::IntelPt,
        params: RecorderParams {
            event: "intel_pt".to_owned(),
            sample_type: SIDEBAND_SAMPLE_TYPE,
            sample_id_all: true,
            ..RecorderParams::default()
        },
        freeze_time_ns: 0,
        pause_duration_ns: 0,
        rings: Vec::new(),
        sideband: Vec::new(),
        clock: None,
        processes: Vec::new(),
        code: Vec::new(),
        perf_maps: Vec::new(),
        window: None,
        kernel_symbols: Vec::new(),
    };
    for (i, case) in cases.iter().enumerate() {
        let (pid, tid) = ids(i);
        let cpu = u32::try_from(i).expect("few cases");
        let path = format!("/lookback-corpus/{}.bin", case.name);
        captured.params.cpus.push(cpu);
        captured.rings.push(RingData {
            kind: RingKind::Aux,
            cpu: Some(cpu),
            tid: None,
            wrapped: false,
            records: 0,
            stop: None,
            data: case.pt.clone(),
        });
        if sideband {
            captured.sideband.push(SidebandData {
                cpu: Some(cpu),
                dropped_bytes: 0,
                data: thread_start_records(pid, tid, &format!("case{i}"), 0, cpu),
            });
        }
        captured.processes.push(ProcessMaps {
            pid,
            comm: format!("case{i}"),
            exe: None,
            read_at_ns: 0,
            at_freeze: true,
            maps: vec![MapEntry {
                start: case.org,
                end: case.org + case.bin.len() as u64,
                perms: "r-xp".to_owned(),
                offset: 0,
                dev: "00:00".to_owned(),
                inode: 0,
                path: path.clone(),
                build_id: None,
            }],
            origin: crate::capture::origin::ProcessOrigin::default(),
        });
        captured.code.push(CodeRegion {
            pid,
            start: case.org,
            path,
            data: case.bin.clone(),
        });
    }
    let (pid, tid) = ids(0);
    let trigger = TriggerMeta {
        rule: "corpus".to_owned(),
        kind: "manual".to_owned(),
        detail: "libipt corpus".to_owned(),
        pid,
        tid,
        comm: "case0".to_owned(),
        trigger_time_ns: 0,
        duration_ns: None,
        stack: Vec::new(),
        kernel_stack: Vec::new(),
        call: None,
    };
    Snapshot::from_captured(captured, Some(trigger))
}

/// Per tid: the thread's name and its slices as `+NAME` / `-`, `[untraced]` left out
/// (tracing off and on again inside a call keeps the call open around it).
pub(crate) fn slices_by_thread(events: &[Value]) -> BTreeMap<u64, (String, Vec<String>)> {
    let mut threads: BTreeMap<u64, (String, Vec<String>)> = BTreeMap::new();
    let mut open: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for e in events {
        let tid = e["tid"].as_u64().expect("tid");
        let name = e["name"].as_str().expect("name").to_owned();
        let entry = threads.entry(tid).or_default();
        match e["ph"].as_str() {
            Some("M") if name == "thread_name" => {
                entry.0 = e["args"]["name"].as_str().expect("name").to_owned();
            }
            Some("B") => {
                open.entry(tid).or_default().push(name.clone());
                if name != UNTRACED {
                    entry.1.push(format!("+{name}"));
                }
            }
            Some("E") => {
                let began = open.entry(tid).or_default().pop().expect("E after B");
                assert_eq!(began, name, "E names the slice it ends");
                if began != UNTRACED {
                    entry.1.push("-".to_owned());
                }
            }
            _ => {}
        }
    }
    assert!(open.values().all(Vec::is_empty), "every slice ends");
    threads
}

fn json_events(snap: &Snapshot) -> (TraceSummary, Vec<Value>) {
    let mut out = Vec::new();
    let summary = encode(snap, &mut out, Format::ChromeJson).expect("encode");
    let doc: Value = serde_json::from_slice(&out).expect("one JSON document");
    let events = doc["traceEvents"].as_array().expect("traceEvents").clone();
    (summary, events)
}

/// FXT record kinds and counts, walking the records by their size words.
fn fxt_kinds(snap: &Snapshot) -> BTreeMap<u64, usize> {
    let mut out = Vec::new();
    encode(snap, &mut out, Format::Fxt).expect("encode");
    let words: Vec<u64> = out
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte words")))
        .collect();
    let (mut at, mut kinds) = (1, BTreeMap::new());
    while at < words.len() {
        let size = usize::try_from((words[at] >> 4) & 0xfff).expect("size");
        assert!(size > 0, "zero-size record at word {at}");
        *kinds.entry(words[at] & 0xf).or_insert(0) += 1;
        at += size;
    }
    assert_eq!(at, words.len());
    kinds
}

#[test]
fn libipt_corpus_flows_nest_in_the_trace_as_their_calls_and_returns() {
    let Some(dir) = shared_corpus("libipt/core", "MANIFEST.tsv") else {
        println!("skipped: ../shared/corpus/libipt not found");
        return;
    };
    let (cases, skipped) = cases(&dir);
    assert!(
        cases.len() >= 5,
        "too few corpus cases with calls: {skipped:?}"
    );
    let snap = bundle(&cases, true);
    let (summary, events) = json_events(&snap);
    assert_eq!(summary.decode_errors, 0);
    let threads = slices_by_thread(&events);
    let (mut matched, mut wrong_model_rejected) = (0, 0);
    let mut differ = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (pid, tid) = ids(i);
        let (name, got) = threads
            .get(&u64::from(tid))
            .unwrap_or_else(|| panic!("{}: no track", case.name));
        assert_eq!(name, &format!("case{i} [{pid}] [{tid}]"), "{}", case.name);
        let want = expected(&case.flow, true);
        if got != &want {
            println!("{}: flow {want:?}\n  trace {got:?}", case.name);
            differ.push(case.name.as_str());
            continue;
        }
        matched += 1;
        if expected(&case.flow, false) != want {
            assert_ne!(got, &expected(&case.flow, false));
            wrong_model_rejected += 1;
        }
    }
    assert!(differ.is_empty(), "slices differ from the flow: {differ:?}");
    assert!(wrong_model_rejected > 0, "no case has a return");
    let trigger = events
        .iter()
        .find(|e| e["ph"] == "i")
        .expect("trigger instant");
    assert_eq!(trigger["name"], "trigger: corpus");
    assert_eq!(trigger["tid"], u64::from(ids(0).1));
    // FXT: the same slices and instant as event records, one thread record per case.
    let kinds = fxt_kinds(&snap);
    let be = events.iter().filter(|e| e["ph"] != "M").count();
    assert_eq!(kinds.get(&4), Some(&be));
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for reason in skipped.values() {
        let kind = reason.split(':').next().unwrap_or(reason);
        let kind = if kind.starts_with("0x") {
            "instruction"
        } else {
            kind
        };
        *reasons.entry(kind).or_default() += 1;
    }
    println!(
        "libipt corpus → PT snapshot → trace: {matched} cases matched their ptxed flow \
         ({wrong_model_rejected} tell a model without returns apart), {} skipped: {reasons:?}",
        skipped.len()
    );
}

/// The corpus case with one call and one compressed return, or `None` (skipped, with a
/// message) without ../shared.
fn call_and_return_case() -> Option<Case> {
    let Some(dir) = shared_corpus("libipt/core", "MANIFEST.tsv") else {
        println!("skipped: ../shared/corpus/libipt not found");
        return None;
    };
    Some(load_case(&dir, "call_direct-ret_compressed", 0x0010_0000).expect("corpus case"))
}

#[test]
fn a_ring_without_sideband_is_a_cpu_track_with_the_same_slices() {
    let Some(case) = call_and_return_case() else {
        return;
    };
    let want = expected(&case.flow, true);
    assert_eq!(want, ["+[unknown @ 0x100008]", "-"]);
    let snap = bundle(std::slice::from_ref(&case), false);
    let (_, events) = json_events(&snap);
    let threads = slices_by_thread(&events);
    let (pid, tid) = (ids(0).0, u64::from(u32::MAX));
    let (name, got) = threads.get(&tid).expect("the CPU track");
    assert_eq!(name, "[cpu 0]");
    assert_eq!(got, &want);
    assert!(events.iter().any(|e| e["ph"] == "B" && e["pid"] == pid));
}

#[test]
fn missing_code_is_a_decode_error_slice_not_a_panic() {
    let Some(case) = call_and_return_case() else {
        return;
    };
    let mut snap = bundle(std::slice::from_ref(&case), true);
    snap.code.clear();
    let (summary, events) = json_events(&snap);
    assert!(summary.decode_errors > 0);
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "B")
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("[decode error: ")),
        "{names:?}"
    );
}

#[test]
fn sideband_losses_reach_the_summary() {
    let Some(case) = call_and_return_case() else {
        return;
    };
    let mut snap = bundle(std::slice::from_ref(&case), true);
    let (summary, _) = json_events(&snap);
    assert_eq!((summary.lost_samples, summary.lost_aux), (0, 0));
    // An overwrite-mode AUX record (no loss), a truncated one, and a LOST record of 3.
    let record = |kind: u32, words: &[u64]| {
        let body: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        sideband_record(kind, 0, &body, ids(0), 0, 0)
    };
    let sideband = &mut snap.sideband[0].data;
    sideband.extend(record(PERF_RECORD_AUX, &[0, 4096, 0x02]));
    sideband.extend(record(
        PERF_RECORD_AUX,
        &[4096, 4096, 0x02 | PERF_AUX_FLAG_TRUNCATED],
    ));
    sideband.extend(record(PERF_RECORD_LOST, &[1, 3]));
    let (summary, events) = json_events(&snap);
    assert_eq!((summary.lost_samples, summary.lost_aux), (3, 1));
    // The flow itself is unchanged.
    assert_eq!(
        slices_by_thread(&events)
            .get(&u64::from(ids(0).1))
            .map(|t| &t.1),
        Some(&expected(&case.flow, true))
    );
}
