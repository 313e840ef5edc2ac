//! The verdict: one line that says where the interval's time went.
//!
//! In: a [`Report`]'s totals and breakdown, and its segments (frames with their modules).
//! Out: `handle_request 20.2 ms: 98 % off-CPU, sleeping in clock_nanosleep ← nanosleep ←
//! wait_for_backend ← handle_request`. The chain names the innermost frame, the library
//! entry the program called, and the program's own frames up to the report's root: the
//! frames a person can change, and what they waited in or ran.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Frame, Report, Segment, State, human_ns, percent, plain_name};

/// At most this many names in a chain (the innermost few and the outermost few).
const MAX_CHAIN: usize = 8;
/// The other state is mentioned from this share of the interval on.
const SECOND_PERCENT: u64 = 20;

/// The verdict of `report`, whose segments are `segments`.
pub(super) fn verdict(report: &Report, segments: &[Segment]) -> String {
    let subject = subject(report);
    if report.covered_ns == 0 {
        return format!(
            "{subject}: the recorder holds nothing of thread {} in it",
            report.trigger.tid
        );
    }
    let whole = report.interval_ns.max(report.covered_ns);
    let off = off_cpu_part(report, segments, whole, usize::MAX);
    let on = on_cpu_part(report, segments, whole, usize::MAX);
    let (first, second, second_ns) = if report.off_cpu_ns >= report.on_cpu_ns {
        (
            off,
            on_cpu_part(report, segments, whole, 3),
            report.on_cpu_ns,
        )
    } else {
        (
            on,
            off_cpu_part(report, segments, whole, 3),
            report.off_cpu_ns,
        )
    };
    let mut line = format!("{subject}: {}", first.unwrap_or_default());
    if percent(second_ns, whole) >= SECOND_PERCENT
        && let Some(second) = second
    {
        line.push_str("; ");
        line.push_str(&second);
    }
    let covered = percent(report.covered_ns, report.interval_ns);
    if covered < 50 {
        let _ = write!(line, " (samples cover {covered} % of it)");
    }
    line
}

/// What the interval was: `handle_request 20.2 ms`, `read 5.00 s`, `signal (SIGSEGV from
/// pid 1): the last 10.0 ms`.
fn subject(report: &Report) -> String {
    let t = &report.trigger;
    let length = human_ns(report.interval_ns);
    if let Some(function) = t.probed_function() {
        return format!("{} {length}", plain_name(function));
    }
    if let Some(syscall) = t.syscall().filter(|_| t.duration_ns.is_some()) {
        return format!("{syscall} {length}");
    }
    if t.is_latency() {
        return format!("the call {length}");
    }
    if t.detail.is_empty() {
        format!("{}: the last {length}", t.kind)
    } else {
        format!("{} ({}): the last {length}", t.kind, t.detail)
    }
}

/// `98 % off-CPU, sleeping in CHAIN`, from the largest off-CPU entry; `chain_len` caps the
/// chain's names.
fn off_cpu_part(
    report: &Report,
    segments: &[Segment],
    whole: u64,
    chain_len: usize,
) -> Option<String> {
    let entry = report.breakdown.iter().find(|e| e.state == State::OffCpu)?;
    let seg = segments.iter().find(|s| {
        s.state == State::OffCpu
            && s.reason == entry.reason
            && s.frames.iter().map(|f| &f.name).eq(entry.frames.iter())
    })?;
    let reason = entry.reason.unwrap_or(super::Reason::Other);
    // When the largest stretch is not most of the off-CPU time, say its own share.
    let own = if u128::from(entry.ns) * 10 < u128::from(report.off_cpu_ns) * 9 {
        format!("most ({} %) ", percent(entry.ns, whole))
    } else {
        String::new()
    };
    Some(format!(
        "{} % off-CPU, {own}{} in {}",
        percent(report.off_cpu_ns, whole),
        reason.phrase(),
        chain(&seg.frames, chain_len, report.trigger.probed_function())
    ))
}

/// `60 % on-CPU, in CHAIN`: the path from the root that holds most of the on-CPU time, as
/// deep as one child keeps at least half of it.
fn on_cpu_part(
    report: &Report,
    segments: &[Segment],
    whole: u64,
    chain_len: usize,
) -> Option<String> {
    let on: Vec<&Segment> = segments
        .iter()
        .filter(|s| s.state == State::OnCpu)
        .collect();
    let total: u64 = on.iter().fold(0u64, |t, s| t.saturating_add(s.ns));
    if total == 0 {
        return None;
    }
    let mut path: Vec<Frame> = Vec::new();
    loop {
        let depth = path.len();
        let mut children: BTreeMap<&str, (u64, &Frame)> = BTreeMap::new();
        for seg in &on {
            let under = seg.frames.len() > depth
                && seg.frames[..depth]
                    .iter()
                    .zip(&path)
                    .all(|(a, b)| a.name == b.name);
            if under {
                let frame = &seg.frames[depth];
                children.entry(&frame.name).or_insert((0, frame)).0 += seg.ns;
            }
        }
        let Some((ns, frame)) = children.into_values().max_by_key(|(ns, _)| *ns) else {
            break;
        };
        if u128::from(ns) * 2 < u128::from(total) {
            break;
        }
        path.push(frame.clone());
    }
    if path.is_empty() {
        return Some(format!("{} % on-CPU", percent(report.on_cpu_ns, whole)));
    }
    Some(format!(
        "{} % on-CPU, in {}",
        percent(report.on_cpu_ns, whole),
        chain(&path, chain_len, report.trigger.probed_function())
    ))
}

/// `innermost ← library entry ← program frames`: the innermost frame, the program's own
/// frames and the first frame of another file each calls, innermost first. The program's
/// own frames: those in the probed function's file when the chain starts at it, else
/// those outside shared libraries (`.so`) and pseudo-files (`[kernel]`, `[vdso]`); all
/// frames when no frame has a file. At most `max` names (and [`MAX_CHAIN`]), the middle
/// elided.
fn chain(frames: &[Frame], max: usize, probed: Option<&str>) -> String {
    let root_module = frames
        .first()
        .filter(|f| Some(f.name.as_str()) == probed)
        .and_then(|f| f.module.as_deref());
    let own = |j: usize| match (root_module, frames[j].module.as_deref()) {
        (Some(root), module) => module == Some(root),
        (None, Some(m)) => !m.starts_with('[') && !m.contains(".so"),
        (None, None) => false,
    };
    let any_module = frames.iter().any(|f| f.module.is_some());
    let any_own = (0..frames.len()).any(own);
    let keep = |i: usize| {
        !any_module
            || i + 1 == frames.len()
            || own(i)
            || (i > 0 && own(i - 1))
            || (!any_own && i == 0)
    };
    let mut names: Vec<&str> = (0..frames.len())
        .rev()
        .filter(|&i| keep(i))
        .map(|i| plain_name(&frames[i].name))
        .collect();
    names.dedup();
    let max = max.min(MAX_CHAIN);
    if names.len() > max {
        let head = max.div_ceil(2);
        let tail = max - head;
        let mut short: Vec<&str> = names[..head].to_vec();
        if tail > 0 {
            short.push("…");
            short.extend_from_slice(&names[names.len() - tail..]);
        }
        names = short;
    }
    names.join(" ← ")
}
