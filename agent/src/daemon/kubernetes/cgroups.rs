//! Containers → processes and cgroups. In: a proc root (`/proc`, or the host's mounted at
//! `/host/proc`) and a cgroup v2 root (`/sys/fs/cgroup`). Out: for each container id found
//! in a `/proc/PID/cgroup` path, its PIDs and the cgroup directories they are in, with
//! each directory's inode number — the cgroup id that `bpf_get_current_cgroup_id()`
//! returns (kernel 4.18+), which the daemon puts into its cgroup filter map.
//!
//! Path forms understood (containerd, CRI-O, Docker; systemd and cgroupfs drivers):
//! - `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope`
//!   (also `crio-<id>.scope`, `docker-<id>.scope`; `_` in the uid stands for `-`);
//! - `/kubepods/burstable/pod<uid>/<id>` (also `crio-<id>`, `docker-<id>`);
//! - any prefix (kind, k3s in Docker) and any sub-cgroup a container makes inside its own.
//!
//! cgroup v2 (`0::PATH`) is preferred; on a v1-only host the `name=systemd`, then `memory`,
//! then `cpu` hierarchy names the container, and there are no cgroup ids (the BPF helper
//! reports the v2 hierarchy only): the daemon must filter by PID there.
//!
//! When the agent runs in its own cgroup namespace, paths of other containers read as
//! `/../../kubepods-…`: those are found under the cgroup root by the container's directory
//! name instead (one walk per scan, only when needed).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::KubeError;
pub use crate::capture::origin::{
    CgroupContainer, ProcessCgroups, container_id_of, container_of_path,
};

/// Where the host's `/proc` and cgroup v2 hierarchy are visible to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// Default `/proc`; with `hostPID: true` it already shows every process of the node.
    pub proc_root: PathBuf,
    /// The cgroup v2 hierarchy: default `/sys/fs/cgroup`, or `LOOKBACK_CGROUP_ROOT`; on a
    /// hybrid v1/v2 host its `unified/` ([`unified_under`]).
    pub cgroup_root: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            proc_root: PathBuf::from("/proc"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        }
    }
}

/// Overrides [`HostPaths::cgroup_root`]. The `DaemonSet` sets `/host/sys/fs/cgroup`: a
/// container's own `/sys/fs/cgroup` shows only its own cgroup (cgroup namespace).
pub const CGROUP_ROOT_ENV: &str = "LOOKBACK_CGROUP_ROOT";

impl HostPaths {
    /// The defaults, the cgroup root overridden by `LOOKBACK_CGROUP_ROOT`. The proc root
    /// has no variable: it is the agent's `--proc-root` (set by the caller), so discovery
    /// and pod matching read the same procfs.
    pub fn from_env() -> HostPaths {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// [`Self::from_env`] with the environment given by `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<std::ffi::OsString>) -> HostPaths {
        let defaults = HostPaths::default();
        let get = |name| lookup(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let root = get(CGROUP_ROOT_ENV).unwrap_or(defaults.cgroup_root);
        HostPaths {
            proc_root: defaults.proc_root,
            cgroup_root: unified_under(&root).unwrap_or(root),
        }
    }
}

/// The cgroup v2 hierarchy at or just under `root`: `root` itself on a v2 host, its
/// `unified/` on a hybrid one (v1 controllers beside v2, as systemd and this project's
/// test VM mount them); `None` on a v1-only host. Found by the file only a v2 hierarchy
/// has at its top (`cgroup.controllers`), so a bind mount of the host's tree anywhere
/// (`LOOKBACK_CGROUP_ROOT`) is read as it is laid out, not as assumed.
pub fn unified_under(root: &Path) -> Option<PathBuf> {
    [root.to_owned(), root.join("unified")]
        .into_iter()
        .find(|dir| dir.join("cgroup.controllers").is_file())
}

/// Deepest directory level searched below the cgroup root for a container's directory.
const MAX_WALK_DEPTH: usize = 10;

/// One process found in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessEntry {
    pub pid: u32,
    /// The process's full cgroup path (v2 when available).
    pub cgroup_path: String,
    /// The container's own cgroup directory (a prefix of `cgroup_path`).
    pub container_path: String,
    /// Whether the paths are cgroup v2 (and so have cgroup ids).
    pub v2: bool,
}

/// Every containerized process of the host, by container id; one `/proc` scan.
#[derive(Debug, Clone, Default)]
pub struct ProcIndex {
    by_container: HashMap<String, Vec<ProcessEntry>>,
}

impl ProcIndex {
    /// Reads `/proc/PID/cgroup` of every process. Processes that exit meanwhile or cannot
    /// be read are skipped; only an unreadable proc root is an error.
    pub fn scan(proc_root: &Path) -> Result<ProcIndex, KubeError> {
        let read_error = |source| KubeError::Read {
            path: proc_root.to_owned(),
            source,
        };
        let mut index = ProcIndex::default();
        for entry in fs::read_dir(proc_root).map_err(read_error)? {
            let Ok(entry) = entry else { continue };
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(text) = fs::read_to_string(entry.path().join("cgroup")) else {
                continue;
            };
            let cgroups = ProcessCgroups::parse(&text);
            let Some((found, v2)) = cgroups.container() else {
                continue;
            };
            let cgroup_path = if v2 { cgroups.v2 } else { cgroups.v1 }.unwrap_or_default();
            index
                .by_container
                .entry(found.container_id)
                .or_default()
                .push(ProcessEntry {
                    pid,
                    cgroup_path,
                    container_path: found.container_path,
                    v2,
                });
        }
        for entries in index.by_container.values_mut() {
            entries.sort_by_key(|e| e.pid);
        }
        Ok(index)
    }

    /// The processes of one container (lowercase id), by PID.
    pub fn processes(&self, container_id: &str) -> &[ProcessEntry] {
        self.by_container
            .get(container_id)
            .map_or(&[], Vec::as_slice)
    }
}

/// Finds cgroup directories under the v2 root and their inode numbers (cgroup ids).
#[derive(Debug)]
pub struct CgroupResolver<'a> {
    root: &'a Path,
    /// Directory name → paths under the root, built on first need (namespaced paths).
    by_name: Option<HashMap<String, Vec<PathBuf>>>,
}

impl<'a> CgroupResolver<'a> {
    pub fn new(root: &'a Path) -> CgroupResolver<'a> {
        CgroupResolver {
            root,
            by_name: None,
        }
    }

    /// The cgroup id of `path` (as read from `/proc/PID/cgroup`), whose container
    /// directory is `container_path`; `None` when the directory cannot be found.
    pub fn cgroup_id(&mut self, path: &str, container_path: &str) -> Option<(u64, PathBuf)> {
        let dir = self.locate(path, container_path)?;
        let meta = fs::metadata(&dir).ok()?;
        meta.is_dir().then(|| (meta.ino(), dir))
    }

    fn locate(&mut self, path: &str, container_path: &str) -> Option<PathBuf> {
        let relative = path.trim_start_matches('/');
        if !relative.split('/').any(|c| c == "..") {
            let direct = self.root.join(relative);
            if direct.is_dir() {
                return Some(direct);
            }
        }
        // Outside our cgroup namespace: find the container's directory by name, then
        // follow the rest of the path (a sub-cgroup the container made).
        let tail = path.strip_prefix(container_path)?.trim_start_matches('/');
        let name = container_path.rsplit('/').next()?;
        let candidates = self.index().get(name)?;
        let [only] = candidates.as_slice() else {
            return None;
        };
        Some(if tail.is_empty() {
            only.clone()
        } else {
            only.join(tail)
        })
    }

    fn index(&mut self) -> &HashMap<String, Vec<PathBuf>> {
        let root = self.root;
        self.by_name.get_or_insert_with(|| {
            let mut by_name: HashMap<String, Vec<PathBuf>> = HashMap::new();
            let mut stack = vec![(root.to_owned(), 0)];
            while let Some((dir, depth)) = stack.pop() {
                let Ok(entries) = fs::read_dir(&dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    let path = entry.path();
                    if let Some(name) = entry.file_name().to_str()
                        && container_id_of(name).is_some()
                    {
                        by_name
                            .entry(name.to_owned())
                            .or_default()
                            .push(path.clone());
                    }
                    if depth + 1 < MAX_WALK_DEPTH {
                        stack.push((path, depth + 1));
                    }
                }
            }
            by_name
        })
    }
}

/// The processes and cgroups of one container, summarized for the daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerProcesses {
    pub pids: Vec<u32>,
    /// Distinct cgroup ids of the cgroups its processes are in (v2 only).
    pub cgroup_ids: Vec<u64>,
    /// The container's own cgroup path as the proc root shows it.
    pub cgroup_path: Option<String>,
    /// Whether the cgroup paths came from the v1 hierarchy (no cgroup ids).
    pub cgroup_v1: bool,
}

/// Summarizes the processes of `container_id` from `index`.
pub fn container_processes(
    index: &ProcIndex,
    resolver: &mut CgroupResolver<'_>,
    container_id: &str,
) -> ContainerProcesses {
    let entries = index.processes(container_id);
    let mut ids = BTreeSet::new();
    let mut paths: BTreeMap<&str, usize> = BTreeMap::new();
    for entry in entries {
        *paths.entry(&entry.container_path).or_default() += 1;
        if entry.v2
            && let Some((id, _)) = resolver.cgroup_id(&entry.cgroup_path, &entry.container_path)
        {
            ids.insert(id);
        }
    }
    ContainerProcesses {
        pids: entries.iter().map(|e| e.pid).collect(),
        cgroup_ids: ids.into_iter().collect(),
        cgroup_path: paths
            .into_iter()
            .max_by_key(|(_, count)| *count)
            .map(|(path, _)| path.to_owned()),
        cgroup_v1: entries.iter().any(|e| !e.v2),
    }
}
