//! Output retention: a rule's directory keeps at most `max_files` files and `max_bytes`
//! bytes; whole snapshots (trace, raw, metadata share a stem) go, oldest first. The stems
//! start with a UTC timestamp, so name order is time order. The newest snapshot is never
//! removed, even when it alone exceeds the budget: it is the one someone is about to read.
use std::{fs, io, path::Path};

use crate::rules::Retention;

/// What a pass removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub snapshots: usize,
    pub files: usize,
    pub bytes: u64,
}

/// File name suffixes of one snapshot, longest first so `.json.gz` wins over `.json`.
const SUFFIXES: [&str; 5] = [".fxt.gz", ".json.gz", ".lbsnap", ".json", ".fxt"];

/// The snapshot stem of a file name; `None` for temporary and foreign files.
fn stem(name: &str) -> Option<&str> {
    if name.starts_with('.') {
        return None;
    }
    SUFFIXES.iter().find_map(|s| name.strip_suffix(s))
}

/// Enforces `retention` on `dir`.
pub fn enforce(dir: &Path, retention: &Retention) -> io::Result<Pruned> {
    // (stem, [(file name, bytes)]), sorted by stem.
    let mut groups: Vec<(String, Vec<(String, u64)>)> = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = stem(&name) else { continue };
        let meta = entry.metadata()?;
        if !meta.is_file() {
            continue;
        }
        let stem = stem.to_owned();
        match groups.iter_mut().find(|(s, _)| *s == stem) {
            Some((_, files)) => files.push((name, meta.len())),
            None => groups.push((stem, vec![(name, meta.len())])),
        }
    }
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let mut files: usize = groups.iter().map(|(_, f)| f.len()).sum();
    let mut bytes: u64 = groups.iter().flat_map(|(_, f)| f.iter().map(|x| x.1)).sum();
    let max_files = usize::try_from(retention.max_files).unwrap_or(usize::MAX);
    let mut pruned = Pruned::default();
    for (stem, group) in &groups[..groups.len().saturating_sub(1)] {
        if files <= max_files && bytes <= retention.max_bytes {
            break;
        }
        for (name, size) in group {
            match fs::remove_file(dir.join(name)) {
                Ok(()) => {
                    files -= 1;
                    bytes = bytes.saturating_sub(*size);
                    pruned.files += 1;
                    pruned.bytes += size;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        pruned.snapshots += 1;
        log::debug!("retention: removed snapshot {}", dir.join(stem).display());
    }
    Ok(pruned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(dir: &Path, stem: &str, sizes: [usize; 3]) {
        for (ext, size) in ["fxt.gz", "lbsnap", "json"].iter().zip(sizes) {
            fs::write(dir.join(format!("{stem}.{ext}")), vec![0u8; size]).unwrap();
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn oldest_snapshots_go_first_by_count() {
        let dir = tempfile::tempdir().unwrap();
        for s in [
            "20260101T000003.000000Z-1-1",
            "20260101T000001.000000Z-1-1",
            "20260101T000002.000000Z-1-1",
        ] {
            snap(dir.path(), s, [10, 10, 1]);
        }
        fs::write(dir.path().join(".x.fxt.gz.tmp-1"), b"in flight").unwrap();
        fs::write(dir.path().join("notes.txt"), b"not ours").unwrap();
        let r = Retention {
            max_files: 6,
            max_bytes: 1 << 30,
        };
        let pruned = enforce(dir.path(), &r).unwrap();
        assert_eq!(
            pruned,
            Pruned {
                snapshots: 1,
                files: 3,
                bytes: 21
            }
        );
        let left = names(dir.path());
        assert!(
            left.iter().all(|n| !n.starts_with("20260101T000001")),
            "{left:?}"
        );
        assert!(left.contains(&".x.fxt.gz.tmp-1".to_owned()));
        assert!(left.contains(&"notes.txt".to_owned()));
        assert_eq!(left.len(), 8);
    }

    #[test]
    fn bytes_budget_and_the_newest_survives() {
        let dir = tempfile::tempdir().unwrap();
        snap(dir.path(), "20260101T000001.000000Z-1-1", [100, 0, 1]);
        snap(dir.path(), "20260101T000002.000000Z-1-1", [100, 0, 1]);
        snap(dir.path(), "20260101T000003.000000Z-1-1", [500, 0, 1]);
        let r = Retention {
            max_files: 100,
            max_bytes: 300,
        };
        let pruned = enforce(dir.path(), &r).unwrap();
        assert_eq!(
            pruned.snapshots, 2,
            "the newest alone is over budget but kept"
        );
        assert_eq!(names(dir.path()).len(), 3);
        // Within budget: nothing happens.
        assert_eq!(
            enforce(
                dir.path(),
                &Retention {
                    max_files: 3,
                    max_bytes: 501
                }
            )
            .unwrap(),
            Pruned::default()
        );
    }

    #[test]
    fn chrome_json_traces_and_metadata_share_a_stem() {
        assert_eq!(stem("a.json.gz"), Some("a"));
        assert_eq!(stem("a.json"), Some("a"));
        assert_eq!(stem("a.lbsnap"), Some("a"));
        assert_eq!(stem(".a.json.tmp-3"), None);
        assert_eq!(stem("README"), None);
    }
}
