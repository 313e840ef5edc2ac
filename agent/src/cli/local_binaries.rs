//! The binaries of a recording made elsewhere (a `perf.data`, a raw capture), found on
//! this machine.
//!
//! In: a snapshot whose maps name files as the recording machine saw them, with the
//! build-ids the recording gave. Out: each file map pointed at a local copy (its path and
//! inode, which is what the code and symbol stages open), tried in perf's order: under
//! `--symfs DIR`, in the build-id cache (`--buildid-dir`, default `~/.debug`: both
//! `.build-id/xx/yyyy…/elf` and `PATH/BUILDID/elf`), at the path itself. A copy whose
//! build-id differs from the recorded one is refused: decoding a trace over other code
//! invents flow. A map without a copy is renamed `[not found] PATH`, so that no stage
//! reads whatever file has that path here; its stretches of trace are decode errors and
//! its frames `[unknown]`.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::elf::build_id::build_id_of;
use crate::snapshot::Snapshot;

/// Where copies of the recording's binaries are looked for.
#[derive(Debug, Clone, Default)]
pub struct Places {
    pub symfs: Option<PathBuf>,
    pub buildid_dir: Option<PathBuf>,
}

/// What [`resolve`] found: local copies, files without one (and why).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    pub found: Vec<(String, PathBuf)>,
    pub missing: Vec<(String, String)>,
}

impl Places {
    /// The places to try for `path` (with build-id `build_id`), in order.
    fn candidates(&self, path: &str, build_id: Option<&str>) -> Vec<PathBuf> {
        let relative = path.trim_start_matches('/');
        let mut out = Vec::new();
        if let Some(root) = &self.symfs {
            out.push(root.join(relative));
        }
        let cache = self
            .buildid_dir
            .clone()
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".debug")));
        if let (Some(cache), Some(id)) = (cache, build_id)
            && id.len() > 2
        {
            out.push(
                cache
                    .join(".build-id")
                    .join(&id[..2])
                    .join(&id[2..])
                    .join("elf"),
            );
            out.push(cache.join(relative).join(id).join("elf"));
        }
        if self.symfs.is_none() {
            out.push(PathBuf::from(path));
        }
        out
    }

    /// A local copy of `path`, or why there is none.
    fn find(&self, path: &str, build_id: Option<&str>) -> Result<PathBuf, String> {
        let mut refused = None;
        for candidate in self.candidates(path, build_id) {
            if !candidate.is_file() {
                continue;
            }
            let local = build_id_of(&candidate);
            match (build_id, local.as_deref()) {
                (Some(want), Some(have)) if want != have => {
                    refused = Some(format!(
                        "{} has build-id {have}, the recording {want}",
                        candidate.display()
                    ));
                }
                _ => return Ok(candidate),
            }
        }
        Err(refused.unwrap_or_else(|| "no copy here".to_owned()))
    }
}

/// A local copy and its inode, or why there is none.
type Found = Result<(PathBuf, u64), String>;

/// Points the file maps of `snap` at local copies (see the module doc).
pub fn resolve(snap: &mut Snapshot, places: &Places) -> Resolved {
    let mut cache: HashMap<(String, Option<String>), Found> = HashMap::new();
    let mut resolved = Resolved::default();
    for process in &mut snap.maps {
        for entry in process.maps.iter_mut().filter(|m| m.is_file()) {
            let key = (entry.path.clone(), entry.build_id.clone());
            let found = cache.entry(key).or_insert_with(|| {
                let found = places.find(&entry.path, entry.build_id.as_deref());
                match &found {
                    Ok(local) => resolved.found.push((entry.path.clone(), local.clone())),
                    Err(why) => resolved.missing.push((entry.path.clone(), why.clone())),
                }
                found.map(|local| {
                    let inode = fs::metadata(&local).map_or(0, |m| m.ino());
                    let local = fs::canonicalize(&local).unwrap_or(local);
                    (local, inode)
                })
            });
            match found {
                Ok((local, inode)) => {
                    entry.path = local.to_string_lossy().into_owned();
                    entry.inode = *inode;
                }
                Err(_) => entry.path = format!("[not found] {}", entry.path),
            }
        }
    }
    for region in &mut snap.code {
        if Path::new(&region.path).is_absolute()
            && let Some((_, local)) = resolved.found.iter().find(|(p, _)| *p == region.path)
        {
            region.path = local.to_string_lossy().into_owned();
        }
    }
    resolved
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::procmaps::{MapEntry, ProcessMaps};

    fn snap_with(path: &str, build_id: Option<&str>) -> Snapshot {
        let mut snap = crate::decode::import::raw::snapshot(Vec::new(), Vec::new(), "t");
        snap.maps = vec![ProcessMaps {
            pid: 1,
            comm: String::new(),
            exe: None,
            read_at_ns: 0,
            at_freeze: false,
            maps: vec![MapEntry {
                start: 0x1000,
                end: 0x2000,
                perms: "r-xp".to_owned(),
                offset: 0,
                dev: "00:00".to_owned(),
                inode: 0,
                path: path.to_owned(),
                build_id: build_id.map(str::to_owned),
            }],
            origin: crate::capture::origin::ProcessOrigin::default(),
        }];
        snap
    }

    #[test]
    fn a_copy_with_another_build_id_is_refused_and_the_map_renamed() {
        let exe = std::env::current_exe().unwrap();
        let path = exe.to_string_lossy().into_owned();
        let mut snap = snap_with(&path, Some("00112233445566778899aabbccddeeff00112233"));
        let resolved = resolve(&mut snap, &Places::default());
        assert!(resolved.found.is_empty(), "{resolved:?}");
        assert!(
            resolved.missing[0].1.contains("has build-id"),
            "{resolved:?}"
        );
        assert_eq!(snap.maps[0].maps[0].path, format!("[not found] {path}"));
    }

    #[test]
    fn the_same_build_id_at_the_path_is_taken_with_its_inode() {
        let exe = std::env::current_exe().unwrap();
        let path = exe.to_string_lossy().into_owned();
        let id = build_id_of(&exe);
        let mut snap = snap_with(&path, id.as_deref());
        let resolved = resolve(&mut snap, &Places::default());
        assert_eq!(resolved.found.len(), 1, "{resolved:?}");
        let entry = &snap.maps[0].maps[0];
        assert_eq!(entry.inode, fs::metadata(&exe).unwrap().ino());
        assert_eq!(Path::new(&entry.path), fs::canonicalize(&exe).unwrap());
    }

    #[test]
    fn symfs_is_looked_in_first_and_the_plain_path_not_at_all() {
        let dir = std::env::temp_dir().join(format!("lookback-symfs-{}", std::process::id()));
        fs::create_dir_all(dir.join("usr/bin")).unwrap();
        let exe = std::env::current_exe().unwrap();
        fs::copy(&exe, dir.join("usr/bin/tool")).unwrap();
        let places = Places {
            symfs: Some(dir.clone()),
            buildid_dir: Some(dir.join("cache")),
        };
        let mut snap = snap_with("/usr/bin/tool", build_id_of(&exe).as_deref());
        resolve(&mut snap, &places);
        assert!(snap.maps[0].maps[0].path.ends_with("usr/bin/tool"));
        // Under symfs, a file that exists here at the recorded path is not taken.
        let mut snap = snap_with(&exe.to_string_lossy(), None);
        let resolved = resolve(&mut snap, &places);
        assert_eq!(resolved.missing.len(), 1, "{resolved:?}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
