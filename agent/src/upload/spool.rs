//! The spool: a rule's output directory, where each snapshot waits until the store has it.
//!
//! In: the directory (`DIR/RULE/`) as the agent's output stage leaves it — per snapshot
//! `<stem>.fxt.gz` or `<stem>.json.gz` (the trace), `<stem>.lbsnap` (raw, when kept) and
//! `<stem>.json` (the metadata, written last: a snapshot is complete once it is there).
//! Out: the snapshots not yet uploaded, oldest first (stems begin with a UTC time), and the
//! marker `<stem>.uploaded` written once the store confirmed every object of one.
//!
//! The directory is the only state: an agent that restarts, or crashed mid-upload, finds
//! the same pending snapshots and uploads them under the same names; none is lost and none
//! is uploaded under two names.
use std::{
    collections::HashSet,
    fs, io,
    path::{Path, PathBuf},
};

/// The suffix of the marker a snapshot gets once uploaded.
pub const UPLOADED: &str = ".uploaded";

/// One snapshot not yet uploaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub stem: String,
    /// The trace file.
    pub trace: PathBuf,
    /// The raw `.lbsnap`, when it was kept.
    pub raw: Option<PathBuf>,
    /// The metadata `.json`.
    pub metadata: PathBuf,
    /// Bytes of the trace and the metadata.
    pub bytes: u64,
    /// Bytes of the raw `.lbsnap` (0 without one).
    pub raw_bytes: u64,
}

impl Pending {
    /// Its files: the trace and (with `include_raw`) the raw snapshot, then the metadata
    /// last (a reader that finds the metadata finds the rest).
    #[must_use]
    pub fn files(&self, include_raw: bool) -> Vec<&Path> {
        let mut files = vec![self.trace.as_path()];
        if include_raw {
            files.extend(self.raw.as_deref());
        }
        files.push(&self.metadata);
        files
    }

    /// The bytes [`files`](Self::files) holds.
    #[must_use]
    pub fn bytes(&self, include_raw: bool) -> u64 {
        self.bytes + if include_raw { self.raw_bytes } else { 0 }
    }
}

/// The snapshots of `dir` without an upload marker, oldest first; none when `dir` does not
/// exist yet. A snapshot whose trace is missing (being removed) is left out.
pub fn pending(dir: &Path) -> io::Result<Vec<Pending>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort();
    let present: HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for name in &names {
        let Some(stem) = name.strip_suffix(".json") else {
            continue;
        };
        let inner = Path::new(stem)
            .extension()
            .is_some_and(|ext| ext.eq_ignore_ascii_case("json"));
        if inner || present.contains(format!("{stem}{UPLOADED}").as_str()) {
            continue; // a Chrome JSON trace's inner name, or done
        }
        let trace = [".fxt.gz", ".json.gz", ".fxt"]
            .iter()
            .map(|ext| format!("{stem}{ext}"))
            .find(|n| present.contains(n.as_str()));
        let Some(trace) = trace else { continue };
        let raw = Some(format!("{stem}.lbsnap")).filter(|n| present.contains(n.as_str()));
        let size = |n: &str| fs::metadata(dir.join(n)).map_or(0, |m| m.len());
        out.push(Pending {
            stem: stem.to_owned(),
            bytes: size(&trace) + size(name),
            raw_bytes: raw.as_deref().map_or(0, size),
            trace: dir.join(trace),
            raw: raw.map(|r| dir.join(r)),
            metadata: dir.join(name),
        });
    }
    Ok(out)
}

/// Marks `stem` in `dir` uploaded (an empty file, synced with its directory entry).
pub fn mark_uploaded(dir: &Path, stem: &str) -> io::Result<()> {
    let path = dir.join(format!("{stem}{UPLOADED}"));
    let file = fs::File::create(&path)?;
    file.sync_all()?;
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &Path, name: &str, bytes: usize) {
        fs::write(dir.join(name), vec![b'x'; bytes]).unwrap();
    }

    #[test]
    fn complete_snapshots_without_a_marker_are_pending_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Newest first on disk order does not matter: names sort by time.
        touch(d, "20261206T100002.000000Z-2-2.json.gz", 10);
        touch(d, "20261206T100002.000000Z-2-2.json", 1);
        touch(d, "20261206T100001.000000Z-1-1.fxt.gz", 100);
        touch(d, "20261206T100001.000000Z-1-1.lbsnap", 1000);
        touch(d, "20261206T100001.000000Z-1-1.json", 2);
        // Being written: no metadata yet.
        touch(d, "20261206T100003.000000Z-3-3.fxt.gz", 5);
        // Uploaded.
        touch(d, "20261206T100000.000000Z-0-0.fxt.gz", 5);
        touch(d, "20261206T100000.000000Z-0-0.json", 5);
        mark_uploaded(d, "20261206T100000.000000Z-0-0").unwrap();
        let got = pending(d).unwrap();
        let stems: Vec<&str> = got.iter().map(|p| p.stem.as_str()).collect();
        assert_eq!(
            stems,
            ["20261206T100001.000000Z-1-1", "20261206T100002.000000Z-2-2"]
        );
        assert_eq!((got[0].bytes(false), got[0].bytes(true)), (102, 1102));
        assert_eq!(got[0].files(false).len(), 2);
        assert_eq!(got[0].files(true).len(), 3);
        assert!(got[0].files(true)[2].ends_with("20261206T100001.000000Z-1-1.json"));
        assert!(
            got[1]
                .trace
                .ends_with("20261206T100002.000000Z-2-2.json.gz")
        );
        assert!(pending(&d.join("absent")).unwrap().is_empty());
    }
}
