//! Writer stage, Chrome trace JSON half (the Trace Event Format that `chrome://tracing`,
//! ui.perfetto.dev and speedscope read).
//!
//! In: [`TraceSink`] calls. Out: `{"traceEvents":[...]}` streamed to any `Write`, one event
//! per line: `M` metadata (`process_name`, `thread_name`), `B`/`E` duration events and
//! thread-scoped `i` instants; `ts` in microseconds (fractional, so nanoseconds survive).

use std::io::{self, Write};

use serde_json::{Map, Value, json};

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

fn args_object(args: &[Arg<'_>]) -> Value {
    let mut map = Map::new();
    for arg in args {
        let value = match &arg.value {
            ArgValue::Str(s) => json!(s),
            ArgValue::U64(v) => json!(v),
            ArgValue::I64(v) => json!(v),
            ArgValue::Pointer(v) => json!(format!("{v:#x}")),
        };
        map.insert(arg.name.to_owned(), value);
    }
    Value::Object(map)
}

impl<W: Write> JsonWriter<W> {
    /// Writes the opening of the document.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(b"{\"traceEvents\":[")?;
        Ok(Self { out, first: true })
    }

    fn emit(&mut self, event: &Value) -> io::Result<()> {
        if !self.first {
            self.out.write_all(b",")?;
        }
        self.first = false;
        self.out.write_all(b"\n")?;
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
        self.emit(&json!({"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": name}}))
    }

    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        self.emit(&json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}))
    }

    fn begin(
        &mut self,
        (pid, tid): (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        self.emit(&json!({"ph": "B", "name": name, "cat": "lookback", "pid": pid, "tid": tid, "ts": micros(ts), "args": args_object(args)}))
    }

    fn end(&mut self, (pid, tid): (u32, u32), ts: u64, name: &str) -> io::Result<()> {
        self.emit(&json!({"ph": "E", "name": name, "cat": "lookback", "pid": pid, "tid": tid, "ts": micros(ts)}))
    }

    fn instant(
        &mut self,
        (pid, tid): (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        self.emit(&json!({"ph": "i", "s": "t", "name": name, "cat": "lookback", "pid": pid, "tid": tid, "ts": micros(ts), "args": args_object(args)}))
    }

    fn finish(&mut self) -> io::Result<()> {
        self.out.write_all(b"\n]}\n")?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
