//! Tests of [`super::reconstruct`]: hand-made branch streams, and conformance with
//! magic-trace's fixtures (`<shared>/corpus/magic-trace`, or `$LOOKBACK_SHARED_DIR/corpus/
//! magic-trace`: `perf script` text in, the `-> TIME BEGIN|END name` lines magic-trace
//! writes out). A case matches when, per function, the BEGIN/END counts, the depths its
//! slices nest at, and the times its calls begin (to within one input timestamp: magic-trace
//! spreads events that share one) are the same. `LOOKBACK_MT_DUMP=DIR` writes our lines.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use super::{Branch, Frame, Symbol, reconstruct, reconstruct_window, spread_ties};
use crate::decode::pt::flow::branches::BranchKind;
use crate::stacks::StackEvent;

// ---- hand-made streams -------------------------------------------------------------

/// Functions are 0x1000 apart: `f0` at 0x1000, `f1` at 0x2000, ...; an address is
/// `0x1000 * (n + 1) + offset`.
fn sym(addr: u64) -> Option<Symbol> {
    let index = (addr / 0x1000).checked_sub(1)?;
    Some(Symbol {
        name: format!("f{index}").into(),
        start: (index + 1) * 0x1000,
    })
}

fn at(f: u64, off: u64) -> u64 {
    (f + 1) * 0x1000 + off
}

fn br(kind: BranchKind, time_ns: u64, from: u64, to: u64) -> Branch {
    Branch {
        kind,
        time_ns,
        from,
        to,
        error: None,
    }
}

/// The events as text: `+name@ts` and `-@ts`.
fn text(events: &[StackEvent<Frame>]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            StackEvent::Begin { ts, frame } => format!("+{frame}@{ts}"),
            StackEvent::End { ts } => format!("-@{ts}"),
            StackEvent::Gap { start, end } => format!("gap@{start}-{end}"),
            StackEvent::OffCpu { start, end, .. } => format!("off@{start}-{end}"),
        })
        .collect()
}

fn run(branches: &[Branch]) -> Vec<String> {
    text(&reconstruct(branches, sym))
}

#[test]
fn two_functions_at_one_start_keep_their_names() {
    // A CPU track can hold two processes whose functions share addresses.
    let two = |addr: u64| {
        Some(Symbol {
            name: if addr & 0x100 == 0 { "left" } else { "right" }.into(),
            start: 0x1000,
        })
    };
    let events = reconstruct(
        &[
            br(BranchKind::Call, 1, 0x1000, 0x1000),
            br(BranchKind::Return, 2, 0x1000, 0x1005),
            br(BranchKind::Call, 3, 0x1000, 0x1100),
            br(BranchKind::Return, 4, 0x1000, 0x1005),
            br(BranchKind::Call, 5, 0x1000, 0x1000),
        ],
        two,
    );
    let begins: Vec<String> = text(&events)
        .into_iter()
        .filter(|e| e.starts_with('+'))
        .collect();
    assert_eq!(
        begins,
        [
            "+left [inferred start time]@1",
            "+left@1",
            "+right@3",
            "+left@5"
        ]
    );
}

#[test]
fn calls_push_returns_pop_and_returns_past_the_window_infer_the_caller() {
    use BranchKind::{Call, Jump, Return};
    let out = run(&[
        br(Jump, 10, at(0, 4), at(0, 8)),
        br(Call, 20, at(0, 0x10), at(1, 0)),
        br(Return, 30, at(1, 0x20), at(0, 0x15)),
        br(Return, 40, at(0, 0x30), at(2, 0x45)),
    ]);
    assert_eq!(
        out,
        [
            "+f2 [inferred start time]@10",
            "+f0 [inferred start time]@10",
            "+f1@20",
            "-@30",
            "-@40",
            "-@40",
        ]
    );
}

#[test]
fn tail_calls_replace_the_top_frame() {
    use BranchKind::{Call, Jump, Return};
    let out = run(&[
        br(BranchKind::TraceStart, 0, 0, at(0, 0)),
        br(Call, 10, at(0, 4), at(1, 0)),
        br(Jump, 20, at(1, 8), at(2, 0)),
        br(Return, 30, at(2, 8), at(0, 9)),
    ]);
    assert_eq!(out, ["+f0@0", "+f1@10", "-@20", "+f2@20", "-@30", "-@30"]);
}

#[test]
fn a_return_to_a_deeper_frame_unwinds_without_a_staircase() {
    use BranchKind::{Call, Return};
    let out = run(&[
        br(BranchKind::TraceStart, 0, 0, at(0, 0)),
        br(Call, 1, at(0, 0x10), at(1, 0)),
        br(Call, 2, at(1, 0x10), at(2, 0)),
        br(Call, 3, at(2, 0x10), at(3, 0)),
        // longjmp back into f0, just after its call of f1.
        br(Return, 4, at(3, 0x10), at(0, 0x15)),
        br(Call, 5, at(0, 0x20), at(4, 0)),
    ]);
    assert_eq!(
        out,
        [
            "+f0@0", "+f1@1", "+f2@2", "+f3@3", "-@4", "-@4", "-@4", "+f4@5", "-@5", "-@5"
        ]
    );
}

#[test]
fn syscalls_gaps_and_decode_errors() {
    use BranchKind::{Call, Error, Return, Syscall, TraceStart, TraceStop};
    let mut error = br(Error, 50, 0, 0);
    error.error = Some("Overflow packet".into());
    let out = run(&[
        br(TraceStart, 0, 0, at(0, 0)),
        br(Call, 10, at(0, 4), at(1, 0)),
        br(Syscall, 20, at(1, 4), 0),
        br(TraceStart, 30, 0, at(1, 6)),
        br(TraceStop, 35, at(1, 8), 0),
        br(TraceStart, 40, 0, at(1, 8)),
        error,
        br(TraceStart, 60, 0, at(1, 0x10)),
        br(Return, 70, at(1, 0x20), at(0, 9)),
    ]);
    assert_eq!(
        out,
        [
            "+f0@0",
            "+f1@10",
            "+[syscall]@20",
            "-@30",
            "+[untraced]@35",
            "-@40",
            "+[decode error: Overflow packet]@50",
            "-@50",
            "-@50",
            "-@50",
            "+f0 [inferred start time]@50",
            "+f1@60",
            "-@70",
            "-@70",
        ]
    );
}

#[test]
fn jumping_into_a_function_on_the_stack_unwinds_to_it() {
    use BranchKind::{Call, Jump};
    let out = run(&[
        br(BranchKind::TraceStart, 0, 0, at(0, 0)),
        br(Call, 1, at(0, 0x10), at(1, 0)),
        br(Call, 2, at(1, 0x10), at(2, 0)),
        br(Jump, 3, at(2, 0x10), at(1, 0x40)),
    ]);
    assert_eq!(
        out,
        [
            "+f0@0", "+f1@1", "+f2@2", "-@3", "-@3", "+f1@3", "-@3", "-@3"
        ]
    );
}

#[test]
fn a_return_into_the_next_function_replaces_the_caller_and_unknown_calls_still_nest() {
    use BranchKind::{Call, Return};
    let out = run(&[
        br(BranchKind::TraceStart, 0, 0, at(0, 0)),
        // f0 ends with a call; the return lands at the start of f1 (glibc's _start).
        br(Call, 1, at(0, 0xffb), at(2, 0)),
        br(Return, 2, at(2, 8), at(1, 0)),
        // A call into code without a symbol.
        br(Call, 3, at(1, 0x10), 0x10),
        br(Return, 4, 0x18, at(1, 0x15)),
    ]);
    assert_eq!(
        out,
        [
            "+f0@0",
            "+f2@1",
            "-@2",
            "-@2",
            "+f1@2",
            "+[unknown @ 0x10]@3",
            "-@4",
            "-@4"
        ]
    );
}

#[test]
fn nothing_panics_on_odd_input() {
    use BranchKind::{FarReturn, Return, TraceStop};
    assert!(run(&[]).is_empty());
    let out = run(&[
        br(Return, 5, 0, 0),
        br(FarReturn, 3, 0, 0),
        br(TraceStop, 1, 0, 0),
        br(Return, 0, u64::MAX, u64::MAX),
    ]);
    assert!(
        out.iter().filter(|l| l.starts_with('+')).count()
            == out.iter().filter(|l| l.starts_with('-')).count()
    );
}

#[test]
fn ties_are_spread_over_the_time_to_the_next_event() {
    use BranchKind::{Call, Jump, Return};
    // At 10: call f1, call f2, return from f2; the next event is at 16.
    let mut events = reconstruct(
        &[
            br(BranchKind::TraceStart, 0, 0, at(0, 0)),
            br(Call, 10, at(0, 4), at(1, 0)),
            br(Call, 10, at(1, 4), at(2, 0)),
            br(Return, 10, at(2, 8), at(1, 9)),
            br(Jump, 16, at(1, 0x10), at(3, 0)),
        ],
        sym,
    );
    spread_ties(&mut events);
    assert_eq!(
        text(&events),
        [
            "+f0@0", "+f1@10", "+f2@13", "-@16", "-@16", "+f3@16", "-@16", "-@16"
        ]
    );
}

// ---- perf script reader --------------------------------------------------------------

/// One thread's branches from `perf script --itrace=bep -F pid,tid,time,flags,ip,addr,sym,
/// symoff,...` text, with the symbols its lines name.
#[derive(Default)]
struct PerfInput {
    /// `tid → branches` in file order.
    threads: BTreeMap<u32, Vec<Branch>>,
    symbols: HashMap<u64, Symbol>,
    /// Lines of other events (samples) that were left out.
    other_events: usize,
    /// The first event's time, of any kind (magic-trace's time origin).
    origin: Option<u64>,
    /// Every event's time.
    times: Vec<u64>,
}

fn parse_time_ns(text: &str) -> Option<u64> {
    let (secs, frac) = text.trim_end_matches(':').split_once('.')?;
    let mut frac = frac.to_owned();
    if frac.len() > 9 {
        return None;
    }
    while frac.len() < 9 {
        frac.push('0');
    }
    secs.parse::<u64>()
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(frac.parse().ok()?)
}

fn is_hex(token: &str) -> bool {
    !token.is_empty() && token.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `ADDR SYM+0xOFF (DSO)` → the address and, where named, its symbol.
fn parse_location(text: &str) -> Option<(u64, Option<Symbol>)> {
    let text = text.trim();
    let (addr, rest) = text.split_once(char::is_whitespace)?;
    let addr = u64::from_str_radix(addr, 16).ok()?;
    let (name_off, dso) = rest
        .rsplit_once(" (")
        .map_or((rest, ""), |(s, d)| (s, d.trim_end_matches(')')));
    let name_off = name_off.trim();
    if name_off == "[unknown]" {
        // magic-trace names each unknown address on its own.
        let symbol = (addr != 0 && dso != "[unknown]").then(|| Symbol {
            name: format!("[unknown @ {addr:#x} ({dso})]").into(),
            start: addr,
        });
        return Some((addr, symbol));
    }
    let symbol = name_off.rsplit_once("+0x").and_then(|(name, off)| {
        let off = u64::from_str_radix(off, 16).ok()?;
        Some(Symbol {
            name: name.into(),
            start: addr.checked_sub(off)?,
        })
    });
    Some((addr, symbol))
}

fn branch_kind(flags: &str) -> Option<BranchKind> {
    Some(match flags {
        "call" => BranchKind::Call,
        "return" => BranchKind::Return,
        "jmp" | "jcc" => BranchKind::Jump,
        "tr strt" => BranchKind::TraceStart,
        "tr end" => BranchKind::TraceStop,
        "syscall" | "tr end syscall" => BranchKind::Syscall,
        "sysret" | "iret" | "tr strt sysret" | "tr strt iret" => BranchKind::FarReturn,
        f if f.contains("int") || f.contains("async") => BranchKind::Interrupt,
        _ => return None,
    })
}

fn parse_error_line(line: &str) -> Option<(u32, Branch)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| {
        words
            .iter()
            .position(|w| *w == key)
            .and_then(|i| words.get(i + 1))
    };
    let time_ns = parse_time_ns(after("time")?)?;
    let tid = after("tid")?.parse().ok()?;
    let message = line.split_once(": ").map_or("unknown", |(_, m)| m.trim());
    Some((
        tid,
        Branch {
            kind: BranchKind::Error,
            time_ns,
            from: 0,
            to: 0,
            error: Some(message.to_owned()),
        },
    ))
}

fn parse_perf(text: &str) -> Result<PerfInput, String> {
    let mut input = PerfInput::default();
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty()
            || line.starts_with(char::is_whitespace)
                && !trimmed.starts_with("instruction trace error")
        {
            continue; // callchain lines of samples
        }
        if trimmed.starts_with("instruction trace error") {
            let (tid, branch) = parse_error_line(trimmed)
                .ok_or_else(|| format!("line {}: bad error line", number + 1))?;
            input.threads.entry(tid).or_default().push(branch);
            continue;
        }
        if trimmed.starts_with("Warning:") {
            continue;
        }
        let mut words = trimmed.split_whitespace();
        let (Some(pid_tid), Some(time), Some(_period), Some(event)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        let bad = || format!("line {}: {line}", number + 1);
        if let Some(t) = parse_time_ns(time) {
            input.origin = Some(input.origin.map_or(t, |o| o.min(t)));
            input.times.push(t);
        }
        if !event.starts_with("branches") {
            input.other_events += 1;
            continue;
        }
        let tid: u32 = pid_tid
            .split_once('/')
            .and_then(|(_, t)| t.parse().ok())
            .ok_or_else(bad)?;
        let time_ns = parse_time_ns(time).ok_or_else(bad)?;
        let (left, right) = trimmed.split_once(" => ").ok_or_else(bad)?;
        let after_event = left
            .split_once(event)
            .map(|(_, rest)| rest)
            .ok_or_else(bad)?;
        let tokens: Vec<&str> = after_event.split_whitespace().collect();
        let addr_at = tokens.iter().position(|t| is_hex(t)).ok_or_else(bad)?;
        let flags = tokens[..addr_at].join(" ");
        let Some(kind) = branch_kind(&flags) else {
            return Err(format!("line {}: flags {flags:?}", number + 1));
        };
        let (from, from_sym) = parse_location(&tokens[addr_at..].join(" ")).ok_or_else(bad)?;
        let (to, to_sym) = parse_location(right).ok_or_else(bad)?;
        for (addr, symbol) in [(from, from_sym), (to, to_sym)] {
            if let Some(symbol) = symbol {
                input.symbols.insert(addr, symbol);
            }
        }
        input.threads.entry(tid).or_default().push(Branch {
            kind,
            time_ns,
            from,
            to,
            error: None,
        });
    }
    Ok(input)
}

// ---- magic-trace's output --------------------------------------------------------------

/// magic-trace's time format: `436ns`, `2.253us`, `1.5ms`, `2s` (relative to the first
/// event).
fn format_time(ns: u64) -> String {
    let trimmed = |value: f64| {
        let s = format!("{value:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    };
    #[expect(clippy::cast_precision_loss, reason = "display only")]
    let ns_f = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{}us", trimmed(ns_f / 1e3))
    } else if ns < 1_000_000_000 {
        format!("{}ms", trimmed(ns_f / 1e6))
    } else {
        format!("{}s", trimmed(ns_f / 1e9))
    }
}

/// Our events as magic-trace's lines.
fn render(events: &[StackEvent<Frame>], origin: u64, out: &mut Vec<String>) {
    let mut open: Vec<String> = Vec::new();
    for event in events {
        match event {
            StackEvent::Begin { ts, frame } => {
                out.push(format!(
                    "-> {:>8} BEGIN {frame}",
                    format_time(ts.saturating_sub(origin))
                ));
                // magic-trace's END lines name the function without the label.
                let name = frame.to_string();
                open.push(name.trim_end_matches(" [inferred start time]").to_owned());
            }
            StackEvent::End { ts } => {
                let name = open.pop().unwrap_or_default();
                out.push(format!(
                    "-> {:>8} END   {name}",
                    format_time(ts.saturating_sub(origin))
                ));
            }
            StackEvent::Gap { .. } | StackEvent::OffCpu { .. } => {}
        }
    }
}

/// Per slice name: (BEGIN lines, END lines). With [`begin_order`] this is the structure
/// compared (see the test).
fn counts(lines: &[String]) -> BTreeMap<String, (usize, usize)> {
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for line in lines {
        let Some(rest) = line.strip_prefix("->") else {
            continue;
        };
        let rest = rest.trim_start();
        // An END may have no time (magic-trace's decode-error slices).
        let rest = rest
            .split_once(char::is_whitespace)
            .filter(|(t, _)| !t.starts_with("BEGIN") && !t.starts_with("END"))
            .map_or(rest, |(_, r)| r.trim_start());
        if let Some(name) = rest.strip_prefix("BEGIN ") {
            counts.entry(name.trim().to_owned()).or_default().0 += 1;
        } else if let Some(name) = rest.strip_prefix("END") {
            counts.entry(name.trim().to_owned()).or_default().1 += 1;
        }
    }
    counts
}

/// A printed time (`436ns`, `2.253us`, `1.5ms`, `2s`) in ns; `None` when blank or odd.
fn parse_printed_time(text: &str) -> Option<u64> {
    let (number, scale) = [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)]
        .iter()
        .find_map(|(unit, scale)| text.strip_suffix(unit).map(|n| (n, *scale)))?;
    let value: f64 = number.parse().ok()?;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "non-negative printed times, far below 2^53 ns"
    )]
    Some((value * scale).round() as u64)
}

/// The calls in time order: every BEGIN as (time bucket, name), sorted by bucket and then
/// name, so magic-trace's deferred lines (frames whose start was inferred, printed after
/// `INPUT TRACE STREAM ENDED`) and our in-order lines compare equal when the same frames
/// begin at the same times. A bucket is the number of distinct input event times (as
/// printed) up to the line's time: magic-trace spreads events that share a timestamp over
/// the time to the next one, which keeps them in their bucket.
fn begin_order(lines: &[String], bounds: &[u64]) -> Vec<(u64, String)> {
    let mut begins: Vec<(u64, String)> = lines
        .iter()
        .filter_map(|line| {
            let rest = line.strip_prefix("->")?.trim_start();
            let (time, rest) = rest.split_once(char::is_whitespace)?;
            let name = rest.trim_start().strip_prefix("BEGIN ")?;
            let time = parse_printed_time(time)?;
            let bucket = bounds.partition_point(|b| *b <= time) as u64;
            Some((bucket, name.trim().to_owned()))
        })
        .collect();
    begins.sort();
    begins
}

/// Where two begin orders part: per name, the k-th BEGIN of each side must fall in the
/// same time bucket, give or take one (magic-trace's spreading of shared timestamps and
/// its printed rounding can push a line into the next bucket).
fn order_diff(expected: &[(u64, String)], got: &[(u64, String)]) -> Option<String> {
    let per_name = |v: &[(u64, String)]| {
        let mut map: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for (bucket, name) in v {
            map.entry(name.clone()).or_default().push(*bucket);
        }
        map
    };
    let (e, g) = (per_name(expected), per_name(got));
    for (name, e_buckets) in &e {
        let g_buckets = g.get(name).map_or(&[][..], Vec::as_slice);
        let first_bad = e_buckets
            .iter()
            .zip(g_buckets)
            .position(|(a, b)| a.abs_diff(*b) > 1)
            .or_else(|| {
                (e_buckets.len() != g_buckets.len()).then(|| e_buckets.len().min(g_buckets.len()))
            });
        if let Some(at) = first_bad {
            let show = |v: &[u64]| {
                v.iter()
                    .skip(at.saturating_sub(1))
                    .take(4)
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            return Some(format!(
                "    {name}: call #{at} begins in time bucket [{}] expected, [{}] got",
                show(e_buckets),
                show(g_buckets)
            ));
        }
    }
    None
}

/// One `->` line of magic-trace's output (or ours).
struct Line {
    time: u64,
    begin: bool,
    /// The name without ` [inferred start time]`.
    name: String,
    /// Labelled `[inferred start time]`.
    inferred: bool,
    deferred: bool,
}

fn parse_lines(lines: &[String]) -> Vec<Line> {
    let mut out = Vec::new();
    let (mut time, mut deferred) = (0, false);
    for line in lines {
        if line.starts_with("INPUT TRACE STREAM ENDED") {
            deferred = true;
            continue;
        }
        let Some(rest) = line.strip_prefix("->") else {
            continue;
        };
        let rest = rest.trim_start();
        let (stamp, rest) = match rest.split_once(char::is_whitespace) {
            Some((t, r)) if t != "BEGIN" && t != "END" => (Some(t), r.trim_start()),
            _ => (None, rest),
        };
        if let Some(t) = stamp.and_then(parse_printed_time) {
            time = t;
        }
        let (begin, name) = if let Some(name) = rest.strip_prefix("BEGIN") {
            (true, name)
        } else if let Some(name) = rest.strip_prefix("END") {
            (false, name)
        } else {
            continue;
        };
        let name = name.trim();
        let bare = name.trim_end_matches(" [inferred start time]");
        out.push(Line {
            time,
            begin,
            name: bare.to_owned(),
            inferred: bare.len() != name.len(),
            deferred,
        });
    }
    out
}

/// Per function, the sorted depths its slices begin at. Depth is the nesting of the
/// lines as written, plus one for each "late" frame around the slice: magic-trace prints a
/// frame whose start was inferred only once it is known (an inferred BEGIN whose time is
/// before lines already printed, or any BEGIN in the deferred section), so the slices printed before it that
/// lie in its time range (after the last line at or before its start) are inside it too.
/// `[decode error]` slices are left out.
fn depths(lines: &[String]) -> BTreeMap<String, Vec<usize>> {
    let lines = parse_lines(lines);
    let max_time = lines.iter().map(|l| l.time).max().unwrap_or(0);
    // Slice ends and depths as written: an END closes the innermost open line if it has its
    // name; otherwise it belongs to a frame printed later (deferred), which takes the first
    // such END of its name at or after its start.
    let mut ends = vec![max_time; lines.len()];
    // The END's line: a slice that begins after it is not inside (times may tie).
    let mut end_lines = vec![lines.len(); lines.len()];
    let mut depth = vec![0; lines.len()];
    // The frames open as written; in the deferred section, inferred frames go on a stack of
    // their own, outside the frames still open from before.
    let mut stack: Vec<usize> = Vec::new();
    let mut outer: Vec<usize> = Vec::new();
    let mut orphans: Vec<(usize, bool)> = Vec::new(); // (END line, used)
    let mut late = Vec::new();
    let mut latest = 0;
    // Where the next of a run of printed-late inferred frames goes: under the open frames.
    let mut insert_at = 0;
    for (i, line) in lines.iter().enumerate() {
        if !(line.begin && line.deferred && line.inferred) {
            outer.retain(|&o| end_lines[o] > i);
        }
        if line.begin {
            // A deferred frame whose END was printed before it is closed already.
            let closed = line.deferred
                && orphans
                    .iter_mut()
                    .find(|(e, used)| {
                        !*used && lines[*e].name == line.name && lines[*e].time >= line.time
                    })
                    .map(|orphan| {
                        orphan.1 = true;
                        ends[i] = lines[orphan.0].time;
                        end_lines[i] = orphan.0;
                    })
                    .is_some();
            // Such a frame ended before the frames still open began: it is outermost.
            depth[i] = if line.deferred && (line.inferred || closed) {
                outer.len()
            } else {
                outer.len() + stack.len()
            };
            let inline_late = !line.deferred && line.inferred && line.time < latest;
            if line.deferred && line.inferred {
                // Kept while the run of deferred inferred BEGINs lasts: they nest.
                outer.push(i);
            } else if inline_late {
                // Printed when its start became known: it is under the frames open now.
                depth[i] = insert_at;
                stack.insert(insert_at.min(stack.len()), i);
                insert_at += 1;
            } else if !closed {
                stack.push(i);
            }
            if !inline_late {
                insert_at = 0;
            }
            if line.deferred || inline_late {
                late.push(i);
            }
        } else if let Some(b) = [&mut stack, &mut outer]
            .into_iter()
            .find(|s| s.last().is_some_and(|&b| lines[b].name == line.name))
            .and_then(Vec::pop)
        {
            ends[b] = line.time;
            end_lines[b] = i;
        } else {
            orphans.push((i, false));
        }
        if !line.begin {
            insert_at = 0;
        }
        if !line.deferred {
            latest = latest.max(line.time);
        }
    }
    for &l in &late {
        let (start, end) = (lines[l].time, ends[l]);
        let anchor = lines[..l]
            .iter()
            .rposition(|x| !(x.deferred || x.begin && x.inferred) && x.time <= start);
        let first = anchor.map_or(0, |a| a + 1);
        for s in first..l.min(end_lines[l]) {
            let line = &lines[s];
            if line.begin
                && !line.deferred
                && !line.name.starts_with("[decode error")
                && start <= line.time
                && ends[s] <= end
            {
                depth[s] += 1;
            }
        }
    }
    let mut out: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, line) in lines.iter().enumerate() {
        // A decode error's place as written depends on which frames magic-trace had
        // printed yet; its count and time are compared elsewhere.
        if line.begin && !line.name.starts_with("[decode error") {
            out.entry(line.name.clone()).or_default().push(depth[i]);
        }
    }
    for v in out.values_mut() {
        v.sort_unstable();
    }
    out
}

/// The first function whose slices nest at other depths.
fn depth_diff(
    expected: &BTreeMap<String, Vec<usize>>,
    got: &BTreeMap<String, Vec<usize>>,
) -> Option<String> {
    expected.iter().find_map(|(name, e)| {
        let g = got.get(name).map_or(&[][..], Vec::as_slice);
        (e.as_slice() != g).then(|| {
            let show = |v: &[usize]| {
                let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
                for d in v {
                    *counts.entry(*d).or_default() += 1;
                }
                counts
                    .iter()
                    .map(|(d, n)| format!("{n}x{d}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            format!(
                "    {name}: depths expected [{}], got [{}]",
                show(e),
                show(g)
            )
        })
    })
}

/// A short diff of two count maps (at most `limit` names).
fn diff(
    expected: &BTreeMap<String, (usize, usize)>,
    got: &BTreeMap<String, (usize, usize)>,
    limit: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    for name in expected
        .keys()
        .chain(got.keys().filter(|k| !expected.contains_key(*k)))
    {
        let e = expected.get(name).copied().unwrap_or_default();
        let g = got.get(name).copied().unwrap_or_default();
        if e != g {
            out.push(format!(
                "    {name}: expected {} BEGIN/{} END, got {}/{}",
                e.0, e.1, g.0, g.1
            ));
        }
    }
    let total = out.len();
    if total > limit {
        out.truncate(limit);
        out.push(format!("    ... {} more names", total - limit));
    }
    out
}

// ---- conformance ---------------------------------------------------------------------

/// At most this many fixtures may differ (lower it as the rules improve).
const MAX_DIFFERING: usize = 0;

fn corpus_dir() -> Option<PathBuf> {
    crate::test_support::shared_corpus("magic-trace", "INDEX.tsv")
}

/// Why a case is not run, if it is not.
fn skip_reason(options: &str, input: &PerfInput) -> Option<&'static str> {
    if options.contains("~ocaml_exception_info") {
        Some("needs OCaml exception info (pushtrap/poptrap addresses), not modelled")
    } else if options.contains("Userspace_and_kernel") {
        Some("kernel trace scope, not modelled")
    } else if input.threads.is_empty() {
        Some("sampling only (callchains, no branch events): the sampled-stack path's input")
    } else {
        None
    }
}

fn run_case(input: &PerfInput) -> Vec<String> {
    let symbol = |addr: u64| input.symbols.get(&addr).cloned();
    let origin = input.origin.unwrap_or(0);
    let mut lines = Vec::new();
    for branches in input.threads.values() {
        let mut events = reconstruct_window(origin, branches, symbol);
        spread_ties(&mut events);
        render(&events, origin, &mut lines);
    }
    lines
}

#[test]
fn magic_trace_fixtures() {
    let Some(dir) = corpus_dir() else {
        println!("magic-trace fixtures: skipped, corpus not found (set LOOKBACK_SHARED_DIR)");
        return;
    };
    let index = fs::read_to_string(dir.join("INDEX.tsv")).expect("read INDEX.tsv");
    let (mut matched, mut differ, mut skipped) = (0, 0_usize, 0);
    let mut report = String::new();
    for row in index.lines().skip(1) {
        let fields: Vec<&str> = row.split('\t').collect();
        let [expected_file, input_file, options, ..] = fields[..] else {
            continue;
        };
        let text = fs::read_to_string(dir.join(input_file)).expect("read input");
        let input = match parse_perf(&text) {
            Ok(input) => input,
            Err(e) => panic!("{input_file}: {e}"),
        };
        if let Some(reason) = skip_reason(options, &input) {
            skipped += 1;
            let _ = writeln!(report, "  skipped {expected_file}: {reason}");
            continue;
        }
        let expected_text = fs::read_to_string(dir.join(expected_file)).expect("read expected");
        let expected: Vec<String> = expected_text.lines().map(str::to_owned).collect();
        let got = run_case(&input);
        // LOOKBACK_MT_DUMP=DIR writes our lines beside magic-trace's, for diffing by hand.
        if let Some(dump) = std::env::var_os("LOOKBACK_MT_DUMP") {
            let _ = fs::write(Path::new(&dump).join(expected_file), got.join("\n") + "\n");
        }
        let (e, g) = (counts(&expected), counts(&got));
        let origin = input.origin.unwrap_or(0);
        let mut bounds: Vec<u64> = input
            .times
            .iter()
            .filter_map(|t| parse_printed_time(&format_time(t.saturating_sub(origin))))
            .collect();
        bounds.sort_unstable();
        bounds.dedup();
        let order = order_diff(
            &begin_order(&expected, &bounds),
            &begin_order(&got, &bounds),
        );
        let nesting = depth_diff(&depths(&expected), &depths(&got));
        if e == g && order.is_none() && nesting.is_none() {
            matched += 1;
        } else {
            differ += 1;
            let _ = writeln!(report, "  differs {expected_file}:");
            for line in diff(&e, &g, 8).into_iter().chain(order).chain(nesting) {
                let _ = writeln!(report, "{line}");
            }
        }
    }
    println!("magic-trace fixtures: {matched} matched, {differ} differ, {skipped} skipped");
    print!("{report}");
    assert!(
        differ.saturating_sub(MAX_DIFFERING) == 0,
        "{differ} fixtures differ, more than the ratchet {MAX_DIFFERING}"
    );
}
