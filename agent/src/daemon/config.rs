//! The rules file the agent runs from, and how it notices a new version: SIGHUP (handled
//! by the daemon loop) or a change of the file, seen by polling its identity (inode, size,
//! mtime) once a second. Polling rather than inotify because `ConfigMap` volumes replace the
//! file through a symlink swap of the parent directory, which an inotify watch on the file
//! misses; `stat` through the path sees it.
use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use crate::rules::{RuleSet, RulesError};

/// What identifies one version of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        size: m.len(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    })
}

/// The watched rules file.
#[derive(Debug)]
pub struct ConfigFile {
    path: PathBuf,
    last: Option<Stamp>,
}

impl ConfigFile {
    pub fn new(path: PathBuf) -> Self {
        Self { path, last: None }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads and validates the file, remembering which version was read (also when it is
    /// invalid: a broken file is reported once, not every second).
    pub fn load(&mut self) -> Result<RuleSet, RulesError> {
        self.last = stamp(&self.path);
        RuleSet::from_file(&self.path)
    }

    /// Whether the file changed since the last [`load`](Self::load). A file that vanished
    /// is not a change (the `ConfigMap` swap briefly removes it; the old rules stay).
    pub fn changed(&self) -> bool {
        match stamp(&self.path) {
            Some(now) => Some(now) != self.last,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ConfigFile;

    const RULES: &str = "version: 1\nrules:\n  - name: a\n    target: { comm: x }\n    trigger: { signal: { signals: [SIGSEGV] } }\n";

    #[test]
    fn notices_a_rewrite_and_a_rename_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, RULES).unwrap();
        let mut cfg = ConfigFile::new(path.clone());
        assert!(cfg.changed(), "never loaded");
        assert_eq!(cfg.load().unwrap().rules.len(), 1);
        assert!(!cfg.changed());
        std::fs::write(&path, format!("{RULES}# more\n")).unwrap();
        assert!(cfg.changed());
        cfg.load().unwrap();
        // The ConfigMap way: a new file renamed over the old one (same size and content).
        let tmp = dir.path().join("new.yaml");
        std::fs::write(&tmp, format!("{RULES}# more\n")).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert!(cfg.changed());
        cfg.load().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(!cfg.changed(), "a vanished file keeps the old rules");
    }

    #[test]
    fn a_broken_file_is_reported_with_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, "version: 1\nrules:\n  - name: a\n    bogus: 1\n").unwrap();
        let mut cfg = ConfigFile::new(path);
        let err = cfg.load().unwrap_err().to_string();
        assert!(err.contains("rules.yaml:4:"), "{err}");
        assert!(!cfg.changed(), "the broken version counts as read");
    }
}
