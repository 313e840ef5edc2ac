//! The `kubernetes` target selector: pods on this node → containers → PIDs and cgroup ids.
//!
//! In: a rule's [`KubernetesSelector`], the pods of this node (kept current by a
//! [`PodWatcher`] thread from the API server), the host's `/proc` and cgroup v2 tree.
//! Out: one [`ContainerTarget`] per matching container — its PIDs (for the PID filter and
//! uprobes) and cgroup ids (for the `TARGET_CGROUPS` BPF map).
//!
//! ```text
//! let watcher = PodWatcher::spawn(KubeConfig::from_env()?)?;        // once, at start
//! // whenever watcher.generation() moved, and on process exec/exit:
//! let targets = resolve_targets(&selector, &watcher.current(), &HostPaths::default())?;
//! ```
//!
//! A uprobe on a binary inside a container is attached through the container's root:
//! `host_path(proc_root, pid, "/app/server")` = `/proc/PID/root/app/server`.
//!
//! - `config`: in-cluster settings (`KUBERNETES_SERVICE_*`, service account, `NODE_NAME`,
//!   the `LOOKBACK_KUBE_API` override); `client`: list and watch over ureq;
//!   `watcher`: the background thread; `pods`: the pod model and selector matching;
//!   `cgroups`: `/proc/PID/cgroup` parsing and cgroup ids.

use std::io;
use std::path::{Component, Path, PathBuf};

mod cgroups;
mod client;
mod config;
mod pods;
mod watcher;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_fake_api;

pub use cgroups::{
    CGROUP_ROOT_ENV, CgroupContainer, CgroupResolver, ContainerProcesses, HostPaths, ProcIndex,
    ProcessCgroups, ProcessEntry, container_of_path, container_processes, unified_under,
};
pub use client::{KubeClient, WatchStream};
pub use config::{API_OVERRIDE_ENV, KubeConfig, NODE_NAME_ENV, SERVICE_ACCOUNT_DIR};
pub use pods::{
    ApiStatus, Applied, ContainerId, MatchedContainer, Pod, PodContainer, PodList, PodStore,
    Runtime, WatchEvent, matching_containers, pod_matches,
};
pub use watcher::PodWatcher;

use crate::rules::KubernetesSelector;

/// Failures of the Kubernetes selector: configuration, API access, `/proc` access.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(
        "environment variable {name} is not set (in a pod it comes from Kubernetes; \
         out of a cluster set NODE_NAME and LOOKBACK_KUBE_API)"
    )]
    MissingEnv { name: &'static str },
    #[error("invalid value `{value}` of environment variable {name}")]
    InvalidEnv { name: &'static str, value: String },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no certificate in CA file {path}")]
    NoCertificate { path: PathBuf },
    #[error("invalid PEM in CA file {path}")]
    Certificate {
        path: PathBuf,
        #[source]
        source: ureq::Error,
    },
    #[error("request GET {url} failed")]
    Http {
        url: String,
        #[source]
        source: ureq::Error,
    },
    #[error("GET {url}: HTTP {code}: {message}")]
    Status {
        url: String,
        code: u16,
        message: String,
    },
    /// The resource version is too old (HTTP 410): list again.
    #[error("GET {url}: resource version expired (410 Gone)")]
    Gone { url: String },
    #[error("watch error event: {code} {reason}: {message}")]
    WatchStatus {
        code: u16,
        reason: String,
        message: String,
    },
    #[error("invalid {what} JSON")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("watch event longer than {limit} bytes")]
    LineTooLong { limit: u64 },
    #[error("reading the watch stream failed")]
    Stream {
        #[source]
        source: io::Error,
    },
    #[error("unknown watch event type `{0}`")]
    UnknownEvent(String),
    #[error("cannot start the pod watcher thread")]
    Spawn {
        #[source]
        source: io::Error,
    },
}

/// One container a rule targets, with what the daemon filters and attaches on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerTarget {
    pub pod_namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub container: String,
    pub container_id: ContainerId,
    /// Its processes (thread group ids, in the proc root's PID namespace), ascending;
    /// empty while the container is not running.
    pub pids: Vec<u32>,
    /// Inode numbers of the cgroup v2 directories its processes are in (usually one):
    /// the values `bpf_get_current_cgroup_id()` returns for them. Empty on a v1-only host.
    pub cgroup_ids: Vec<u64>,
    /// The container's cgroup path as `/proc/PID/cgroup` shows it.
    pub cgroup_path: Option<String>,
}

/// The containers `selector` picks among `pods`, with their processes and cgroups found
/// by one scan of `host.proc_root`. Only an unreadable proc root is an error.
pub fn resolve_targets(
    selector: &KubernetesSelector,
    pods: &[Pod],
    host: &HostPaths,
) -> Result<Vec<ContainerTarget>, KubeError> {
    let index = ProcIndex::scan(&host.proc_root)?;
    Ok(targets_from_index(selector, pods, &index, host))
}

/// [`resolve_targets`] with a scan made beforehand (one scan for all rules).
pub fn targets_from_index(
    selector: &KubernetesSelector,
    pods: &[Pod],
    index: &ProcIndex,
    host: &HostPaths,
) -> Vec<ContainerTarget> {
    let mut resolver = CgroupResolver::new(&host.cgroup_root);
    matching_containers(selector, pods)
        .into_iter()
        .map(|matched| {
            let found = container_processes(index, &mut resolver, &matched.container_id.id);
            ContainerTarget {
                pod_namespace: matched.pod_namespace,
                pod_name: matched.pod_name,
                pod_uid: matched.pod_uid,
                container: matched.container,
                container_id: matched.container_id,
                pids: found.pids,
                cgroup_ids: found.cgroup_ids,
                cgroup_path: found.cgroup_path,
            }
        })
        .collect()
}

/// A path inside process `pid`'s root (its container's filesystem) as seen from the host:
/// `PROC_ROOT/PID/root/PATH`. Uprobes on container binaries attach through this path
/// (the kernel resolves the inode, so the probe fires in the container). `..` is resolved
/// lexically and never climbs above that root, as in the container itself. Symlinks inside
/// the container are resolved by the kernel through `root`, which is the container's.
pub fn host_path(proc_root: &Path, pid: u32, path_in_container: &Path) -> PathBuf {
    let mut parts = Vec::new();
    for component in path_in_container.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let mut out = proc_root.join(pid.to_string()).join("root");
    out.extend(parts);
    out
}
