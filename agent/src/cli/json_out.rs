//! Where `run`/`attach` write their machine-readable lines (`--json [FILE]`): one JSON
//! object per trigger (dry run) or written snapshot, then a summary.
//!
//! In: the destination the user named. Out: a sink that the event loop and the writer
//! thread share, one whole line per object. Why a sink of its own: with `--json` on
//! stdout, a program started by `run` writes there too, and a script reading our lines must
//! never meet the program's output between them (`run` then sends the program's stdout to
//! stderr, see [`JsonDest::takes_stdout`]).
use std::{
    fs::File,
    io::{self, LineWriter, Write},
    path::PathBuf,
    str::FromStr,
    sync::{Arc, Mutex, PoisonError},
};

/// `--json` destination: `-` (the default when the flag has no value) or a file, e.g.
/// `/dev/fd/3` for an inherited descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonDest {
    Stdout,
    File(PathBuf),
}

impl FromStr for JsonDest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "" => Err("an empty file name (use - for stdout)".into()),
            "-" => Ok(Self::Stdout),
            path => Ok(Self::File(PathBuf::from(path))),
        }
    }
}

impl JsonDest {
    /// Whether our lines go to stdout, where a started program would write too.
    pub fn takes_stdout(&self) -> bool {
        matches!(self, Self::Stdout)
    }
}

/// A shared, line-buffered writer of JSON lines. Clones write to the same destination.
#[derive(Clone)]
pub struct JsonSink(Arc<Mutex<Box<dyn Write + Send>>>);

impl std::fmt::Debug for JsonSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JsonSink")
    }
}

impl JsonSink {
    /// Opens (creates or truncates) the destination; called before anything is traced so
    /// that an unwritable file is a usage error, not a lost recording.
    pub fn open(dest: &JsonDest) -> io::Result<Self> {
        let out: Box<dyn Write + Send> = match dest {
            JsonDest::Stdout => Box::new(io::stdout()),
            JsonDest::File(path) => Box::new(LineWriter::new(File::create(path)?)),
        };
        Ok(Self(Arc::new(Mutex::new(out))))
    }

    /// Writes `value` as one line and flushes it, so that a reader sees each event as it
    /// happens. A failed write (a closed pipe) is logged once per call, never fatal: the
    /// recording and the command matter more than the report.
    pub fn line(&self, value: &serde_json::Value) {
        let mut out = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let written = serde_json::to_writer(&mut *out, value)
            .map_err(io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if let Err(e) = written {
            log::warn!("--json: cannot write: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{JsonDest, JsonSink};

    #[test]
    fn dash_is_stdout_and_anything_else_a_file() {
        assert_eq!("-".parse::<JsonDest>(), Ok(JsonDest::Stdout));
        assert_eq!(
            "/dev/fd/3".parse::<JsonDest>(),
            Ok(JsonDest::File("/dev/fd/3".into()))
        );
        assert!("".parse::<JsonDest>().is_err());
    }

    #[test]
    fn lines_from_clones_land_whole_in_one_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("events.json");
        let sink = JsonSink::open(&JsonDest::File(path.clone())).expect("open");
        let other = sink.clone();
        sink.line(&serde_json::json!({ "a": 1 }));
        other.line(&serde_json::json!({ "b": [2, 3] }));
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text, "{\"a\":1}\n{\"b\":[2,3]}\n");
    }

    #[test]
    fn an_unwritable_destination_is_refused_at_open() {
        let dest = JsonDest::File("/nonexistent-dir/events.json".into());
        assert!(JsonSink::open(&dest).is_err());
    }
}
