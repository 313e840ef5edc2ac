//! Writer stage, Chrome trace JSON half (the Trace Event Format that `chrome://tracing`,
//! ui.perfetto.dev and speedscope read).
//!
//! In: [`TraceSink`] calls. Out: `{"traceEvents":[...]}` streamed to any `Write`, one event
//! per line: `M` metadata (`process_name`, `thread_name`), `B`/`E` duration events and
//! thread-scoped `i` instants; `ts` in microseconds (fractional, so nanoseconds survive).

use std::fmt;
use std::io::{self, Write};

use serde::Serialize;
use serde::ser::{SerializeMap as _, Serializer};

use super::{Arg, ArgValue, TraceSink};

/// Streams Chrome trace JSON to `W`.
pub struct JsonWriter<W: Write> {
    out: W,
    first: bool,
}

/// Nanoseconds as fractional microseconds.
#[expect(
    clippy::cast_precision_loss,
    reason = "µs with ns fraction; f64 holds 2^53 ns"
)]
fn micros(ts_ns: u64) -> f64 {
    ts_ns as f64 / 1000.0
}

/// One event, serialized straight from borrowed fields: a PT trace has millions, and
/// building a `serde_json::Value` for each (a map and a `String` per key) was most of the
/// JSON writer's time.
#[derive(Serialize)]
struct Event<'a> {
    ph: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    pid: u32,
    tid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<Args<'a>>,
}

impl<'a> Event<'a> {
    fn new(ph: &'static str, (pid, tid): (u32, u32), name: &'a str) -> Self {
        Self {
            ph,
            s: None,
            name,
            cat: None,
            pid,
            tid,
            ts: None,
            args: None,
        }
    }

    /// A `B`/`E`/`i` event: category and time.
    fn timed(ph: &'static str, thread: (u32, u32), ts: u64, name: &'a str) -> Self {
        Self {
            cat: Some("lookback"),
            ts: Some(micros(ts)),
            ..Self::new(ph, thread, name)
        }
    }
}

/// The `args` object of an event.
enum Args<'a> {
    List(&'a [Arg<'a>]),
    /// A metadata event's `{"name": ...}`.
    Name(&'a str),
}

/// An address as a `0x…` string, written without allocating.
struct Hex(u64);

impl fmt::Display for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl Serialize for Args<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Args::Name(name) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("name", name)?;
                map.end()
            }
            Args::List(args) => {
                let mut map = serializer.serialize_map(Some(args.len()))?;
                for arg in *args {
                    match &arg.value {
                        ArgValue::Str(s) => map.serialize_entry(arg.name, s)?,
                        ArgValue::U64(v) => map.serialize_entry(arg.name, v)?,
                        ArgValue::I64(v) => map.serialize_entry(arg.name, v)?,
                        ArgValue::Pointer(v) => {
                            map.serialize_key(arg.name)?;
                            map.serialize_value(&format_args!("{}", Hex(*v)))?;
                        }
                    }
                }
                map.end()
            }
        }
    }
}

impl<W: Write> JsonWriter<W> {
    /// Writes the opening of the document.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(b"{\"traceEvents\":[")?;
        Ok(Self { out, first: true })
    }

    fn emit(&mut self, event: &Event<'_>) -> io::Result<()> {
        self.out
            .write_all(if self.first { b"\n" } else { b",\n" })?;
        self.first = false;
        serde_json::to_writer(&mut self.out, event).map_err(io::Error::other)
    }

    /// Flushes and returns the inner writer (call [`TraceSink::finish`] first).
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write> TraceSink for JsonWriter<W> {
    fn process(&mut self, pid: u32, name: &str) -> io::Result<()> {
        self.emit(&Event {
            args: Some(Args::Name(name)),
            ..Event::new("M", (pid, pid), "process_name")
        })
    }

    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        self.emit(&Event {
            args: Some(Args::Name(name)),
            ..Event::new("M", (pid, tid), "thread_name")
        })
    }

    fn begin(
        &mut self,
        thread: (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        self.emit(&Event {
            args: Some(Args::List(args)),
            ..Event::timed("B", thread, ts, name)
        })
    }

    fn end(&mut self, thread: (u32, u32), ts: u64, name: &str) -> io::Result<()> {
        self.emit(&Event::timed("E", thread, ts, name))
    }

    fn instant(
        &mut self,
        thread: (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        self.emit(&Event {
            s: Some("t"),
            args: Some(Args::List(args)),
            ..Event::timed("i", thread, ts, name)
        })
    }

    fn finish(&mut self) -> io::Result<()> {
        self.out.write_all(b"\n]}\n")?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn output_is_one_json_document_with_nested_events() {
        let mut w = JsonWriter::new(Vec::new()).unwrap();
        w.thread(1, 2, "app [1] [2]").unwrap();
        w.begin(
            (1, 2),
            1500,
            "main",
            &[Arg::new("address", ArgValue::Pointer(0x10))],
        )
        .unwrap();
        w.instant(
            (1, 2),
            1600,
            "trigger: x",
            &[Arg::new("pid", ArgValue::U64(1))],
        )
        .unwrap();
        w.end((1, 2), 2000, "main").unwrap();
        w.finish().unwrap();
        let doc: Value = serde_json::from_slice(&w.into_inner().unwrap()).unwrap();
        let events = doc["traceEvents"].as_array().unwrap();
        let phases: Vec<_> = events.iter().map(|e| e["ph"].as_str().unwrap()).collect();
        assert_eq!(phases, ["M", "B", "i", "E"]);
        assert_eq!(events[1]["ts"], json!(1.5));
        assert_eq!(events[1]["args"]["address"], json!("0x10"));
        assert_eq!(events[0]["args"]["name"], json!("app [1] [2]"));
    }
}
