//! Reading a trace lookback wrote back into the report's events.
//!
//! In: the bytes of a Fuchsia trace (FXT) or Chrome trace JSON file, gzipped or not (told
//! by their first bytes, not the name). Out: the trigger instant (`trigger: <rule>` with
//! its args rule, kind, detail, pid, tid, `duration_ns`, stack) and a [`Collector`] fed
//! with the triggering thread's slices. Corrupt bytes are an error naming the offset,
//! never a panic; records this reader does not know are skipped by their size.

use std::collections::HashMap;
use std::io::Read as _;

use flate2::read::MultiGzDecoder;

use super::{Collector, TRIGGER_PREFIX, TriggerInfo};

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("not gzip, FXT or Chrome trace JSON (first bytes {first_bytes:02x?})")]
    Unknown { first_bytes: Vec<u8> },
    #[error("bad gzip data")]
    Gzip(#[source] std::io::Error),
    #[error("the gzip data unpacks to more than {} GiB", MAX_UNPACKED >> 30)]
    TooLarge,
    #[error("not Chrome trace JSON")]
    Json(#[from] serde_json::Error),
    #[error("a speedscope file keeps no trigger: report the .fxt or .json trace or the .lbsnap")]
    Speedscope,
    #[error("FXT: {what} at byte {offset}")]
    Fxt { what: &'static str, offset: usize },
    #[error("the trace has no trigger instant (`trigger: <rule>`): not written for a trigger")]
    NoTrigger,
}

/// The most a gzipped trace may unpack to.
const MAX_UNPACKED: u64 = 16 << 30;

/// One event of a trace, as the report needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Begin,
    End,
    Instant,
    /// A thread's track name (`comm [pid] [tid]`), in `name`.
    ThreadName,
}

#[derive(Debug, Clone)]
struct Event {
    phase: Phase,
    thread: (u32, u32),
    ts: u64,
    name: String,
    args: HashMap<String, ArgValue>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ArgValue {
    Str(String),
    Int(i128),
}

impl Event {
    fn str_arg(&self, key: &str) -> Option<&str> {
        match self.args.get(key)? {
            ArgValue::Str(s) => Some(s),
            ArgValue::Int(_) => None,
        }
    }

    fn int_arg(&self, key: &str) -> Option<i128> {
        match self.args.get(key)? {
            ArgValue::Int(v) => Some(*v),
            ArgValue::Str(s) => s.parse().ok(),
        }
    }
}

/// The trigger of the trace in `bytes`, and a collector fed with its thread's slices over
/// the interval `window_ns` makes of it (see [`TriggerInfo::interval`]).
///
/// # Errors
/// Bytes that are not a trace ([`ReadError`]), or a trace without a trigger instant.
pub fn read_trace(bytes: &[u8], window_ns: u64) -> Result<(TriggerInfo, Collector), ReadError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut plain = Vec::new();
        MultiGzDecoder::new(bytes)
            .take(MAX_UNPACKED + 1)
            .read_to_end(&mut plain)
            .map_err(ReadError::Gzip)?;
        if plain.len() as u64 > MAX_UNPACKED {
            return Err(ReadError::TooLarge);
        }
        return read_trace(&plain, window_ns);
    }
    // Parsed once, then two passes over the events, none of them kept: the trigger
    // instant first (it may come after its thread's slices), then its thread's slices.
    let parsed = Parsed::of(bytes)?;
    let mut trigger = None;
    let mut names: HashMap<(u32, u32), String> = HashMap::new();
    parsed.for_each_event(&mut |e| {
        if trigger.is_none() && e.phase == Phase::Instant && e.name.starts_with(TRIGGER_PREFIX) {
            trigger = Some(trigger_of(&e));
        } else if e.phase == Phase::ThreadName {
            names.insert(e.thread, e.name);
        }
    })?;
    let mut trigger = trigger.ok_or(ReadError::NoTrigger)?;
    if let Some(track) = names.get(&(trigger.pid, trigger.tid)) {
        // `comm [pid] [tid]`: the comm is what comes before the pid.
        let comm = track.split(" [").next().unwrap_or_default();
        comm.clone_into(&mut trigger.comm);
    }
    let mut collector = Collector::new((trigger.pid, trigger.tid), trigger.interval(window_ns));
    parsed.for_each_event(&mut |e| match e.phase {
        Phase::Begin => {
            let preempted = e.str_arg("reason") == Some("preempted");
            collector.begin(e.thread, e.ts, &e.name, e.str_arg("module"), preempted);
        }
        Phase::End => collector.end(e.thread, e.ts),
        Phase::Instant | Phase::ThreadName => {}
    })?;
    Ok((trigger, collector))
}

fn trigger_of(e: &Event) -> TriggerInfo {
    let int = |key| e.int_arg(key).and_then(|v| u64::try_from(v).ok());
    let id = |key| int(key).and_then(|v| u32::try_from(v).ok());
    TriggerInfo {
        rule: e
            .str_arg("rule")
            .map_or_else(|| e.name[TRIGGER_PREFIX.len()..].to_owned(), str::to_owned),
        kind: e.str_arg("kind").unwrap_or_default().to_owned(),
        detail: e.str_arg("detail").unwrap_or_default().to_owned(),
        pid: id("pid").unwrap_or(e.thread.0),
        tid: id("tid").unwrap_or(e.thread.1),
        comm: String::new(),
        time_ns: e.ts,
        duration_ns: int("duration_ns"),
        stack: e
            .str_arg("stack")
            .map(|s| s.split(" → ").map(str::to_owned).collect())
            .unwrap_or_default(),
    }
}

/// An unpacked trace, parsed: FXT as its little-endian words, Chrome JSON as a document.
enum Parsed {
    Fxt(Vec<u64>),
    Json(serde_json::Value),
}

impl Parsed {
    /// The trace in `bytes` (unpacked), told by its first bytes.
    fn of(bytes: &[u8]) -> Result<Self, ReadError> {
        if bytes.starts_with(&FXT_MAGIC.to_le_bytes()) {
            let words = bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            return Ok(Self::Fxt(words));
        }
        match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{' | b'[') => {
                let doc: serde_json::Value = serde_json::from_slice(bytes)?;
                let schema = doc.get("$schema").and_then(serde_json::Value::as_str);
                if schema.is_some_and(|s| s.contains("speedscope")) {
                    return Err(ReadError::Speedscope);
                }
                Ok(Self::Json(doc))
            }
            _ => Err(ReadError::Unknown {
                first_bytes: bytes.iter().take(8).copied().collect(),
            }),
        }
    }

    /// Calls `f` with every event, in file order.
    fn for_each_event(&self, f: &mut dyn FnMut(Event)) -> Result<(), ReadError> {
        match self {
            Self::Fxt(words) => fxt_events(words, f),
            Self::Json(doc) => {
                json_events(doc, f);
                Ok(())
            }
        }
    }
}

/// Chrome trace JSON: `{"traceEvents": [...]}` or a bare array; `ts` in µs.
fn json_events(doc: &serde_json::Value, f: &mut dyn FnMut(Event)) {
    let list = doc
        .get("traceEvents")
        .and_then(serde_json::Value::as_array)
        .or_else(|| doc.as_array())
        .map_or(&[][..], Vec::as_slice);
    let id = |v: &serde_json::Value| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or_default()
    };
    for e in list {
        let phase = match e.get("ph").and_then(serde_json::Value::as_str) {
            Some("B") => Phase::Begin,
            Some("E") => Phase::End,
            Some("i" | "I") => Phase::Instant,
            Some("M")
                if e.get("name").and_then(serde_json::Value::as_str) == Some("thread_name") =>
            {
                let name = e.pointer("/args/name").and_then(serde_json::Value::as_str);
                f(Event {
                    phase: Phase::ThreadName,
                    thread: (
                        id(e.get("pid").unwrap_or(&serde_json::Value::Null)),
                        id(e.get("tid").unwrap_or(&serde_json::Value::Null)),
                    ),
                    ts: 0,
                    name: name.unwrap_or_default().to_owned(),
                    args: HashMap::new(),
                });
                continue;
            }
            _ => continue,
        };
        let Some(ts) = e.get("ts").and_then(serde_json::Value::as_f64) else {
            continue;
        };
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "µs of CLOCK_MONOTONIC back to ns: positive and far below 2^64"
        )]
        let ts = (ts * 1000.0).round().max(0.0) as u64;
        let args = e
            .get("args")
            .and_then(serde_json::Value::as_object)
            .map(|obj| {
                obj.iter()
                    .filter_map(|(k, v)| {
                        let value = match v {
                            serde_json::Value::String(s) => ArgValue::Str(s.clone()),
                            serde_json::Value::Number(n) => ArgValue::Int(i128::from(
                                n.as_i64()
                                    .or_else(|| n.as_u64().and_then(|u| i64::try_from(u).ok()))?,
                            )),
                            _ => return None,
                        };
                        Some((k.clone(), value))
                    })
                    .collect()
            })
            .unwrap_or_default();
        f(Event {
            phase,
            thread: (
                id(e.get("pid").unwrap_or(&serde_json::Value::Null)),
                id(e.get("tid").unwrap_or(&serde_json::Value::Null)),
            ),
            ts,
            name: e
                .get("name")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            args,
        });
    }
}

const FXT_MAGIC: u64 = 0x0016_5478_4604_0010;
const RECORD_INITIALIZATION: u64 = 1;
const RECORD_STRING: u64 = 2;
const RECORD_THREAD: u64 = 3;
const RECORD_EVENT: u64 = 4;
const RECORD_KERNEL_OBJECT: u64 = 7;
const OBJECT_THREAD: u64 = 2;
const STRING_INLINE: u16 = 0x8000;

/// The tables an FXT stream defines as it goes.
struct FxtState {
    strings: HashMap<u16, String>,
    threads: HashMap<u8, (u32, u32)>,
    ticks_per_second: u64,
}

/// A record's words and where it starts in the file, for errors.
struct Record<'a> {
    words: &'a [u64],
    offset: usize,
}

impl Record<'_> {
    fn word(&self, i: usize) -> Result<u64, ReadError> {
        self.words.get(i).copied().ok_or(ReadError::Fxt {
            what: "record shorter than its fields",
            offset: self.offset,
        })
    }

    /// A string reference at word `*at` (inline strings follow it and advance `*at`).
    fn string(
        &self,
        state: &FxtState,
        reference: u16,
        at: &mut usize,
    ) -> Result<String, ReadError> {
        if reference == 0 {
            return Ok(String::new());
        }
        if reference & STRING_INLINE != 0 {
            let len = usize::from(reference & !STRING_INLINE);
            let n = len.div_ceil(8);
            let words = self.words.get(*at..*at + n).ok_or(ReadError::Fxt {
                what: "inline string past the record's end",
                offset: self.offset,
            })?;
            *at += n;
            let bytes: Vec<u8> = words
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .take(len)
                .collect();
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        Ok(state.strings.get(&reference).cloned().unwrap_or_default())
    }
}

/// Fuchsia trace format: the records lookback writes (strings, threads, instant, begin
/// and end events with their args); others skipped by their size.
fn fxt_events(words: &[u64], f: &mut dyn FnMut(Event)) -> Result<(), ReadError> {
    let mut state = FxtState {
        strings: HashMap::new(),
        threads: HashMap::new(),
        ticks_per_second: 1_000_000_000,
    };
    let mut i = 0;
    while i < words.len() {
        let header = words[i];
        let size = usize::try_from(header >> 4 & 0xfff).unwrap_or(0);
        if size == 0 || i + size > words.len() {
            return Err(ReadError::Fxt {
                what: "record size 0 or past the end",
                offset: i * 8,
            });
        }
        let record = Record {
            words: &words[i..i + size],
            offset: i * 8,
        };
        match header & 0xf {
            RECORD_INITIALIZATION => state.ticks_per_second = record.word(1)?.max(1),
            RECORD_STRING => string_record(&record, &mut state)?,
            RECORD_THREAD => {
                let index = u8::try_from(header >> 16 & 0xff).unwrap_or(0);
                let koid = |w: u64| u32::try_from(w).unwrap_or(u32::MAX);
                let thread = (koid(record.word(1)?), koid(record.word(2)?));
                state.threads.insert(index, thread);
            }
            RECORD_EVENT => {
                if let Some(event) = event_record(&record, &state)? {
                    f(event);
                }
            }
            RECORD_KERNEL_OBJECT => {
                if let Some(event) = thread_object(&record, &state)? {
                    f(event);
                }
            }
            _ => {}
        }
        i += size;
    }
    Ok(())
}

fn string_record(record: &Record<'_>, state: &mut FxtState) -> Result<(), ReadError> {
    let header = record.word(0)?;
    let index = u16::try_from(header >> 16 & 0x7fff).unwrap_or(0);
    let len = usize::try_from(header >> 32 & 0x7fff).unwrap_or(0);
    let bytes: Vec<u8> = record.words[1..]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take(len)
        .collect();
    if bytes.len() < len {
        return Err(ReadError::Fxt {
            what: "string longer than its record",
            offset: record.offset,
        });
    }
    state
        .strings
        .insert(index, String::from_utf8_lossy(&bytes).into_owned());
    Ok(())
}

fn event_record(record: &Record<'_>, state: &FxtState) -> Result<Option<Event>, ReadError> {
    let header = record.word(0)?;
    let phase = match header >> 16 & 0xf {
        0 => Phase::Instant,
        2 => Phase::Begin,
        3 => Phase::End,
        _ => return Ok(None),
    };
    let nargs = usize::try_from(header >> 20 & 0xf).unwrap_or(0);
    let thread_ref = u8::try_from(header >> 24 & 0xff).unwrap_or(0);
    let category_ref = u16::try_from(header >> 32 & 0xffff).unwrap_or(0);
    let name_ref = u16::try_from(header >> 48 & 0xffff).unwrap_or(0);
    let ticks = record.word(1)?;
    let mut at = 2;
    let thread = if thread_ref == 0 {
        let pid = record.word(at)?;
        let tid = record.word(at + 1)?;
        at += 2;
        (
            u32::try_from(pid).unwrap_or(u32::MAX),
            u32::try_from(tid).unwrap_or(u32::MAX),
        )
    } else {
        state.threads.get(&thread_ref).copied().unwrap_or_default()
    };
    record.string(state, category_ref, &mut at)?;
    let name = record.string(state, name_ref, &mut at)?;
    let args = args_of(record, state, at, nargs)?;
    let ts = u64::try_from(u128::from(ticks) * 1_000_000_000 / u128::from(state.ticks_per_second))
        .unwrap_or(u64::MAX);
    Ok(Some(Event {
        phase,
        thread,
        ts,
        name,
        args,
    }))
}

/// The `nargs` args of `record` from word `at` on, by name (values lookback writes:
/// integers and strings; others skipped by their size).
fn args_of(
    record: &Record<'_>,
    state: &FxtState,
    mut at: usize,
    nargs: usize,
) -> Result<HashMap<String, ArgValue>, ReadError> {
    let mut args = HashMap::new();
    for _ in 0..nargs {
        let arg = record.word(at)?;
        let size = usize::try_from(arg >> 4 & 0xfff).unwrap_or(0).max(1);
        let end = at + size;
        let mut inner = at + 1;
        let key = record.string(
            state,
            u16::try_from(arg >> 16 & 0xffff).unwrap_or(0),
            &mut inner,
        )?;
        let value = match arg & 0xf {
            1 => Some(ArgValue::Int(i128::from(
                ((arg >> 32) as u32).cast_signed(),
            ))),
            2 => Some(ArgValue::Int(i128::from((arg >> 32) as u32))),
            3 => Some(ArgValue::Int(i128::from(record.word(inner)?.cast_signed()))),
            4 | 7 | 8 => Some(ArgValue::Int(i128::from(record.word(inner)?))),
            6 => {
                let reference = u16::try_from(arg >> 32 & 0xffff).unwrap_or(0);
                Some(ArgValue::Str(record.string(state, reference, &mut inner)?))
            }
            _ => None,
        };
        if let Some(value) = value {
            args.insert(key, value);
        }
        at = end;
    }
    Ok(args)
}

/// A thread's kernel object record (its name and, in the `process` arg, its process) as a
/// [`Phase::ThreadName`] event; other objects are `None`.
fn thread_object(record: &Record<'_>, state: &FxtState) -> Result<Option<Event>, ReadError> {
    let header = record.word(0)?;
    if header >> 16 & 0xff != OBJECT_THREAD {
        return Ok(None);
    }
    let name_ref = u16::try_from(header >> 24 & 0xffff).unwrap_or(0);
    let nargs = usize::try_from(header >> 40 & 0xf).unwrap_or(0);
    let tid = u32::try_from(record.word(1)?).unwrap_or(u32::MAX);
    let mut at = 2;
    let name = record.string(state, name_ref, &mut at)?;
    let args = args_of(record, state, at, nargs)?;
    let pid = match args.get("process") {
        Some(ArgValue::Int(v)) => u32::try_from(*v).unwrap_or(u32::MAX),
        _ => 0,
    };
    Ok(Some(Event {
        phase: Phase::ThreadName,
        thread: (pid, tid),
        ts: 0,
        name,
        args: HashMap::new(),
    }))
}
