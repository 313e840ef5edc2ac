//! Output retention: a rule's directory keeps at most `max_files` files and `max_bytes`
//! bytes; whole snapshots (trace, raw, metadata share a stem) go, oldest first. The stems
//! start with a UTC timestamp, so name order is time order. The newest snapshot is never
//! removed, even when it alone exceeds the budget: it is the one someone is about to read.
//!
//! A rule that uploads (`output.upload`) keeps its snapshots not yet uploaded (a metadata
//! `.json` and no `.uploaded` marker: `upload::spool`) whatever the budget: they are
//! removed only when their bytes exceed the rule's `max_pending`, oldest first, and
//! counted as dropped.
use std::{fs, io, path::Path};

use crate::rules::{Retention, UploadPolicy};

/// What a pass removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub snapshots: usize,
    pub files: usize,
    pub bytes: u64,
    /// Of `snapshots`, those removed before they were uploaded (over `max_pending`).
    pub dropped_pending: usize,
}

/// File name suffixes of one snapshot, longest first so `.json.gz` wins over `.json`.
const SUFFIXES: [&str; 6] = [
    ".fxt.gz",
    ".json.gz",
    crate::upload::spool::UPLOADED,
    ".lbsnap",
    ".json",
    ".fxt",
];

/// The snapshot stem of a file name; `None` for temporary and foreign files.
fn stem(name: &str) -> Option<&str> {
    if name.starts_with('.') {
        return None;
    }
    SUFFIXES.iter().find_map(|s| name.strip_suffix(s))
}

/// The snapshots in `dir`: (stem, [(file name, bytes)]), oldest first.
type Groups = Vec<(String, Vec<(String, u64)>)>;

fn snapshot_groups(dir: &Path) -> io::Result<Groups> {
    let mut groups: Groups = Vec::new();
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
    Ok(groups)
}

/// Removes every file of snapshot `group` from `dir`, counting them into `pruned`;
/// returns the bytes freed.
fn remove_group(
    dir: &Path,
    (stem, group): &(String, Vec<(String, u64)>),
    pruned: &mut Pruned,
) -> io::Result<(usize, u64)> {
    let (mut files, mut bytes) = (0, 0);
    for (name, size) in group {
        match fs::remove_file(dir.join(name)) {
            Ok(()) => {
                files += 1;
                bytes += size;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    pruned.files += files;
    pruned.bytes += bytes;
    // Another writer's retention may have removed it first: counted once.
    if files > 0 {
        pruned.snapshots += 1;
    }
    log::debug!("retention: removed snapshot {}", dir.join(stem).display());
    Ok((files, bytes))
}

/// Whether a snapshot waits for its upload: complete (its metadata is there) and not marked
/// uploaded.
fn is_pending((stem, files): &(String, Vec<(String, u64)>)) -> bool {
    let has = |suffix: &str| {
        files
            .iter()
            .any(|(name, _)| *name == format!("{stem}{suffix}"))
    };
    has(".json") && !has(crate::upload::spool::UPLOADED)
}

/// How long a snapshot without its metadata counts as being written (another worker's):
/// far longer than any decode.
const IN_FLIGHT: std::time::Duration = std::time::Duration::from_mins(10);

/// Whether a snapshot is being written now: no metadata yet, and a file of it younger than
/// [`IN_FLIGHT`]. Such a one is never removed (its metadata would land alone).
fn in_flight(dir: &Path, (stem, files): &(String, Vec<(String, u64)>)) -> bool {
    if files
        .iter()
        .any(|(name, _)| *name == format!("{stem}.json"))
    {
        return false;
    }
    files.iter().any(|(name, _)| {
        fs::metadata(dir.join(name))
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < IN_FLIGHT))
    })
}

/// Bytes of a snapshot as its rule's upload counts them: without the raw `.lbsnap` unless
/// the rule uploads it.
fn pending_bytes((_, files): &(String, Vec<(String, u64)>), include_raw: bool) -> u64 {
    files
        .iter()
        .filter(|(name, _)| include_raw || !name.ends_with(".lbsnap"))
        .map(|(_, size)| size)
        .sum()
}

/// Enforces `retention` on `dir` (the markers of uploaded snapshots are not counted as
/// files). `upload`: the rule uploads; its snapshots not yet uploaded are kept unless
/// together they exceed its `max_pending` bytes, then the oldest go. A snapshot still being
/// written is never removed.
pub fn enforce(
    dir: &Path,
    retention: &Retention,
    upload: Option<&UploadPolicy>,
) -> io::Result<Pruned> {
    let groups = snapshot_groups(dir)?;
    let is_marker = |name: &String| name.ends_with(crate::upload::spool::UPLOADED);
    let mut files: usize = groups
        .iter()
        .map(|(_, f)| f.iter().filter(|(n, _)| !is_marker(n)).count())
        .sum();
    let mut bytes: u64 = groups.iter().flat_map(|(_, f)| f.iter().map(|x| x.1)).sum();
    let max_files = usize::try_from(retention.max_files).unwrap_or(usize::MAX);
    let mut pruned = Pruned::default();
    let protected = |group| (upload.is_some() && is_pending(group)) || in_flight(dir, group);
    let older = &groups[..groups.len().saturating_sub(1)];
    let mut removed = vec![false; groups.len()];
    for (i, group) in older.iter().enumerate() {
        if files <= max_files && bytes <= retention.max_bytes {
            break;
        }
        if protected(group) {
            continue;
        }
        let (f, b) = remove_group(dir, group, &mut pruned)?;
        removed[i] = true;
        files = files.saturating_sub(f);
        bytes = bytes.saturating_sub(b);
    }
    let Some(upload) = upload else {
        return Ok(pruned);
    };
    let raw = upload.include_raw;
    let mut pending: u64 = groups
        .iter()
        .filter(|g| is_pending(g))
        .map(|g| pending_bytes(g, raw))
        .sum();
    for (i, group) in older.iter().enumerate() {
        if pending <= upload.max_pending {
            break;
        }
        if removed[i] || !is_pending(group) {
            continue;
        }
        if remove_group(dir, group, &mut pruned)?.0 > 0 {
            pruned.dropped_pending += 1;
        }
        pending = pending.saturating_sub(pending_bytes(group, raw));
    }
    Ok(pruned)
}

/// Bytes an unprivileged writer can still put on the filesystem of `dir`.
fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero statvfs is a valid out buffer.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs reads the NUL-terminated path and writes into `st`, both ours.
    if unsafe { libc::statvfs(path.as_ptr(), &raw mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Makes room in `dir` (a rule's directory) for a snapshot of about `needed` bytes:
/// while its filesystem has less free, removes the rule's oldest snapshots — beyond its
/// retention budget, since a full disk would lose every new one — but never the newest.
/// In: the directory and the estimate. Out: what was removed (nothing when there is room,
/// or the directory does not exist yet).
pub fn make_room(dir: &Path, needed: u64, keep_pending: bool) -> io::Result<Pruned> {
    let mut pruned = Pruned::default();
    let groups = match snapshot_groups(dir) {
        Ok(groups) => groups,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(pruned),
        Err(e) => return Err(e),
    };
    for group in &groups[..groups.len().saturating_sub(1)] {
        if free_bytes(dir)? >= needed {
            break;
        }
        if (keep_pending && is_pending(group)) || in_flight(dir, group) {
            continue;
        }
        remove_group(dir, group, &mut pruned)?;
    }
    Ok(pruned)
}

/// The pid in a temporary file name (`.NAME.tmp-PID` or `.NAME.tmp-PID-SEQ`, as the
/// snapshot writers name them); `None` for every other name.
fn temp_file_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    let (_, tail) = rest.rsplit_once(".tmp-")?;
    let pid = tail.split_once('-').map_or(tail, |(pid, seq)| {
        if seq.bytes().all(|b| b.is_ascii_digit()) {
            pid
        } else {
            ""
        }
    });
    pid.parse().ok()
}

/// Removes the temporary files a writer killed mid-write left in `dir` and the rule
/// directories under it (`kill -9` during a write: nothing else would ever remove them),
/// except those of a process still alive (its write may be in flight). `own`: this
/// process's pid, called before it writes anything: files with it are a predecessor's (an
/// agent restarted in a container gets the same pid, often 1). Returns how many went.
pub fn remove_stale_temp_files(dir: &Path, own: u32) -> io::Result<usize> {
    let mut removed = 0;
    let mut dirs = vec![dir.to_path_buf()];
    for entry in fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            dirs.push(entry.path());
        }
    }
    for d in dirs {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = temp_file_pid(&name) else {
                continue;
            };
            let alive = pid != own && Path::new(&format!("/proc/{pid}")).exists();
            if !alive && entry.file_type().is_ok_and(|t| t.is_file()) {
                match fs::remove_file(entry.path()) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(removed)
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
        let pruned = enforce(dir.path(), &r, None).unwrap();
        assert_eq!(
            pruned,
            Pruned {
                snapshots: 1,
                files: 3,
                bytes: 21,
                dropped_pending: 0,
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
        let pruned = enforce(dir.path(), &r, None).unwrap();
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
                },
                None
            )
            .unwrap(),
            Pruned::default()
        );
    }

    #[test]
    fn snapshots_not_yet_uploaded_stay_until_max_pending_then_the_oldest_goes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // sizes: trace, raw, metadata (`snap` writes .fxt.gz, .lbsnap, .json)
        snap(d, "20260101T000001.000000Z-1-1", [100, 0, 1]);
        snap(d, "20260101T000002.000000Z-1-1", [100, 0, 1]);
        snap(d, "20260101T000003.000000Z-1-1", [100, 0, 1]);
        snap(d, "20260101T000004.000000Z-1-1", [100, 0, 1]);
        crate::upload::spool::mark_uploaded(d, "20260101T000002.000000Z-1-1").unwrap();
        let tight = Retention {
            max_files: 1,
            max_bytes: 1,
        };
        // Over budget, but only the uploaded one may go; the pending ones stay.
        let upload = |max_pending| UploadPolicy {
            url: "s3://bucket/x".parse().unwrap(),
            endpoint: None,
            region: None,
            allow_http: false,
            include_raw: true,
            max_pending,
        };
        let pruned = enforce(d, &tight, Some(&upload(1 << 20))).unwrap();
        assert_eq!((pruned.snapshots, pruned.dropped_pending), (1, 0));
        assert!(!names(d).iter().any(|n| n.starts_with("20260101T000002")));
        // Pending bytes over max_pending: the oldest pending go first, never the newest.
        let pruned = enforce(d, &tight, Some(&upload(250))).unwrap();
        assert_eq!((pruned.snapshots, pruned.dropped_pending), (1, 1));
        let left = names(d);
        assert!(
            !left.iter().any(|n| n.starts_with("20260101T000001")),
            "{left:?}"
        );
        assert!(
            left.iter().any(|n| n.starts_with("20260101T000004")),
            "{left:?}"
        );
        // The marker goes with its snapshot.
        assert_eq!(stem("a.uploaded"), Some("a"));
    }

    #[test]
    fn chrome_json_traces_and_metadata_share_a_stem() {
        assert_eq!(stem("a.json.gz"), Some("a"));
        assert_eq!(stem("a.json"), Some("a"));
        assert_eq!(stem("a.lbsnap"), Some("a"));
        assert_eq!(stem(".a.json.tmp-3"), None);
        assert_eq!(stem("README"), None);
    }

    #[test]
    fn stale_temp_files_go_and_live_writers_keep_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let rule = dir.path().join("slow");
        fs::create_dir(&rule).unwrap();
        // No process has pid 4194304 (above the largest pid_max).
        let dead = ".2026-12-01T10:00:00Z-1-1.fxt.gz.tmp-4194304-3";
        let live = format!(".x.lbsnap.tmp-{}-1", std::process::id());
        for name in [
            dead,
            live.as_str(),
            "2026-12-01T10:00:00Z-1-1.json",
            ".hidden",
        ] {
            fs::write(rule.join(name), b"x").unwrap();
        }
        fs::write(dir.path().join(".y.json.tmp-4194304"), b"x").unwrap();
        assert_eq!(remove_stale_temp_files(dir.path(), 0).unwrap(), 2);
        assert_eq!(
            names(&rule),
            [".hidden", live.as_str(), "2026-12-01T10:00:00Z-1-1.json"]
        );
        // Called by the agent at start: a file with its own pid is a predecessor's.
        assert_eq!(
            remove_stale_temp_files(dir.path(), std::process::id()).unwrap(),
            1
        );
        assert_eq!(names(&rule), [".hidden", "2026-12-01T10:00:00Z-1-1.json"]);
        assert_eq!(temp_file_pid(".a.tmp-12-x"), None);
        assert_eq!(temp_file_pid("a.tmp-12"), None);
    }
}
