//! Where a traced process runs: its cgroup paths, the container they name, and the node
//! — the origin every snapshot carries, read while the process lives.
//!
//! In: `/proc/PID/cgroup` text (any runtime and cgroup driver: containerd, CRI-O, Docker;
//! systemd and cgroupfs; cgroup v2, v1 and hybrid hosts). Out: [`ProcessCgroups`],
//! [`CgroupContainer`] and [`ProcessOrigin`]; [`node_name`] for the node.
//!
//! Path forms understood:
//! - `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope`
//!   (also `crio-<id>.scope`, `docker-<id>.scope`; `_` in the uid stands for `-`);
//! - `/kubepods/burstable/pod<uid>/<id>` (also `crio-<id>`, `docker-<id>`);
//! - `/docker/<id>` (Docker's cgroupfs driver, in the v1 hierarchies and in the unified
//!   one of a hybrid host), `/system.slice/docker-<id>.scope` (its systemd driver);
//! - any prefix (kind, k3s in Docker) and any sub-cgroup a container makes inside its own.
//!
//! cgroup v2 (`0::PATH`) is preferred; where it names no container (a v1 host), the
//! `name=systemd`, then `memory`, then `cpu` hierarchy does.
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

/// Container runtime prefixes of a cgroup directory name (systemd driver, and CRI-O and
/// Docker under cgroupfs).
const ID_PREFIXES: [&str; 4] = ["cri-containerd-", "crio-", "docker-", "containerd-"];

/// The container cgroup named in a cgroup path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupContainer {
    /// The pod uid with dashes, when the path names it.
    pub pod_uid: Option<String>,
    /// The 64-hex container id, lowercase.
    pub container_id: String,
    /// The path up to and including the container's directory.
    pub container_path: String,
}

/// A process's cgroup paths, from `/proc/PID/cgroup`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessCgroups {
    /// The `0::PATH` line (cgroup v2, or the unified part of a hybrid host).
    pub v2: Option<String>,
    /// The best v1 hierarchy: `name=systemd`, else `memory`, else `cpu`.
    pub v1: Option<String>,
}

impl ProcessCgroups {
    /// Parses a `/proc/PID/cgroup` file: lines `ID:CONTROLLERS:PATH`. Malformed lines are
    /// skipped (the kernel writes none; a fuzzed file must not fail the whole scan).
    pub fn parse(text: &str) -> ProcessCgroups {
        let mut out = ProcessCgroups::default();
        let mut v1_rank = usize::MAX;
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if !path.starts_with('/') {
                continue;
            }
            if id == "0" && controllers.is_empty() {
                out.v2 = Some(path.to_owned());
                continue;
            }
            let rank = controllers.split(',').filter_map(v1_rank_of).min();
            if let Some(rank) = rank.filter(|r| *r < v1_rank) {
                v1_rank = rank;
                out.v1 = Some(path.to_owned());
            }
        }
        out
    }

    /// The container this process is in: the v2 path when it names one, else the v1 path.
    pub fn container(&self) -> Option<(CgroupContainer, bool)> {
        if let Some(found) = self.v2.as_deref().and_then(container_of_path) {
            return Some((found, true));
        }
        self.v1
            .as_deref()
            .and_then(container_of_path)
            .map(|found| (found, false))
    }
}

fn v1_rank_of(controller: &str) -> Option<usize> {
    match controller {
        "name=systemd" => Some(0),
        "memory" => Some(1),
        "cpu" | "cpuacct" => Some(2),
        _ => None,
    }
}

/// The container named by a cgroup path: its last component that is a container id
/// (bare, or with a runtime prefix and `.scope`), and the pod component before it.
pub fn container_of_path(path: &str) -> Option<CgroupContainer> {
    let components: Vec<&str> = path.split('/').collect();
    let index = components
        .iter()
        .rposition(|c| container_id_of(c).is_some())?;
    let container_id = container_id_of(components[index])?;
    let pod_uid = components[..index].iter().rev().find_map(|c| pod_uid_of(c));
    Some(CgroupContainer {
        pod_uid,
        container_id,
        container_path: components[..=index].join("/"),
    })
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, `crio-<id>`,
/// `<id>` → the id, when it is 64 hex digits (what all three runtimes use).
pub fn container_id_of(component: &str) -> Option<String> {
    let name = component.strip_suffix(".scope").unwrap_or(component);
    let id = ID_PREFIXES
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .unwrap_or(name);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

/// `pod<uid>` (cgroupfs) or `kubepods-…-pod<uid with _>.slice` (systemd) → the uid.
fn pod_uid_of(component: &str) -> Option<String> {
    let uid = if let Some(slice) = component.strip_suffix(".slice") {
        let (_, uid) = slice.rsplit_once("-pod")?;
        uid.replace('_', "-")
    } else {
        component.strip_prefix("pod")?.to_owned()
    };
    let valid = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    valid.then(|| uid.to_ascii_lowercase())
}

/// Where one process runs, as its snapshot records it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOrigin {
    /// Its cgroup path: the v2 one, else the best v1 one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The 64-hex id of the container the cgroup path names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
}

impl ProcessOrigin {
    /// From the text of `/proc/PID/cgroup`.
    pub fn parse(text: &str) -> Self {
        let cgroups = ProcessCgroups::parse(text);
        let container_id = cgroups.container().map(|(c, _)| c.container_id);
        // The v2 path of a hybrid host's container is its own directory too; a v2 path of
        // `/` beside a container's v1 paths says nothing.
        let cgroup = match (&cgroups.v2, &cgroups.v1) {
            (Some(v2), Some(v1)) if v2 == "/" => Some(v1.clone()),
            (Some(v2), _) => Some(v2.clone()),
            (None, v1) => v1.clone(),
        };
        Self {
            cgroup,
            container_id,
        }
    }

    /// Of process `pid`, read now; empty when it is gone.
    pub fn read(pid: u32) -> Self {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map(|text| Self::parse(&text))
            .unwrap_or_default()
    }

    /// Nothing known.
    pub fn is_empty(&self) -> bool {
        self.cgroup.is_none() && self.container_id.is_none()
    }

    /// The first 12 hex digits of the container id, as `docker ps` shows it.
    pub fn short_container_id(&self) -> Option<&str> {
        self.container_id
            .as_deref()
            .map(|id| &id[..id.len().min(12)])
    }
}

/// The environment variable naming the node (the `DaemonSet` sets it from
/// `spec.nodeName`).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// The node this runs on: `NODE_NAME`, else the host name.
pub fn node_name() -> String {
    std::env::var(NODE_NAME_ENV)
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| crate::sys::uname().ok().map(|u| u.nodename))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "571d86cad1a9dd89d096771fc32a0ba99ad5c80a6546d4ad5b7381050a1cb138";
    const UID: &str = "3f1c2a4b-5d6e-4f70-8a9b-0c1d2e3f4a5b";
    const UID_: &str = "3f1c2a4b_5d6e_4f70_8a9b_0c1d2e3f4a5b";

    fn found(path: &str) -> (Option<String>, String) {
        let c = container_of_path(path).unwrap_or_else(|| panic!("no container in {path}"));
        (c.pod_uid, c.container_id)
    }

    #[test]
    fn systemd_driver_paths_of_all_runtimes() {
        for prefix in ["cri-containerd-", "crio-", "docker-"] {
            let path = format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/{prefix}{ID}.scope"
            );
            assert_eq!(
                found(&path),
                (Some(UID.to_owned()), ID.to_owned()),
                "{path}"
            );
        }
        // Guaranteed QoS has no class slice.
        let path = format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope");
        assert_eq!(found(&path), (Some(UID.to_owned()), ID.to_owned()));
    }

    #[test]
    fn cgroupfs_driver_paths() {
        for last in [ID.to_owned(), format!("crio-{ID}"), format!("docker-{ID}")] {
            let path = format!("/kubepods/besteffort/pod{UID}/{last}");
            assert_eq!(
                found(&path),
                (Some(UID.to_owned()), ID.to_owned()),
                "{path}"
            );
        }
        let path = format!("/kubepods/pod{UID}/{ID}");
        assert_eq!(found(&path), (Some(UID.to_owned()), ID.to_owned()));
    }

    #[test]
    fn nested_and_namespaced_paths() {
        // A sub-cgroup the container made, and kind's node container in front.
        let kind = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let path =
            format!("/system.slice/docker-{kind}.scope/kubepods/burstable/pod{UID}/{ID}/worker");
        let c = container_of_path(&path).expect("container");
        assert_eq!(c.container_id, ID);
        assert_eq!(c.pod_uid.as_deref(), Some(UID));
        assert_eq!(
            c.container_path,
            format!("/system.slice/docker-{kind}.scope/kubepods/burstable/pod{UID}/{ID}")
        );
        // Seen from the agent's own cgroup namespace.
        let path = format!("/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope");
        assert_eq!(found(&path), (Some(UID.to_owned()), ID.to_owned()));
    }

    #[test]
    fn paths_without_containers() {
        for path in [
            "/",
            "/init.scope",
            "/system.slice/containerd.service",
            "/user.slice/user-1000.slice/session-3.scope",
            // CRI-O's monitor process is not the container.
            "/kubepods.slice/crio-conmon-571d86cad1a9dd89d096771fc32a0ba99ad5c80a6546d4ad5b7381050a1cb138.scope",
            "/kubepods/burstable/pod3f1c/571d86",
        ] {
            assert_eq!(container_of_path(path), None, "{path}");
        }
    }

    #[test]
    fn cgroup_files_v2_v1_and_hybrid() {
        let v2 = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope\n"
        );
        let parsed = ProcessCgroups::parse(&v2);
        assert!(parsed.v1.is_none());
        let (c, is_v2) = parsed.container().expect("container");
        assert!(is_v2);
        assert_eq!(c.container_id, ID);

        let v1 = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{ID}\n\
             11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{ID}\n\
             4:memory:/kubepods/burstable/pod{UID}/{ID}\n\
             1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n\
             0::/\n"
        );
        let parsed = ProcessCgroups::parse(&v1);
        assert_eq!(parsed.v2.as_deref(), Some("/"));
        assert_eq!(
            parsed.v1.as_deref(),
            Some(format!("/kubepods/burstable/pod{UID}/{ID}").as_str())
        );
        let (c, is_v2) = parsed.container().expect("container");
        assert!(!is_v2, "a v2 path of `/` names no container: v1 decides");
        assert_eq!(c.pod_uid.as_deref(), Some(UID));

        // memory is preferred over cpu when there is no name=systemd line.
        let parsed = ProcessCgroups::parse("3:cpu,cpuacct:/a\n2:memory:/b\n5:blkio:/c\n");
        assert_eq!(parsed.v1.as_deref(), Some("/b"));

        // Garbage lines are skipped, not fatal.
        let parsed = ProcessCgroups::parse("garbage\n7:x\n0::relative\n\n");
        assert_eq!(parsed, ProcessCgroups::default());
    }

    /// Docker 20.10 with the cgroupfs driver on a hybrid host (this project's test VM):
    /// every hierarchy, the unified one included, at `/docker/<id>`.
    #[test]
    fn docker_cgroupfs_on_a_hybrid_host() {
        let text = format!(
            "9:name=systemd:/docker/{ID}\n4:memory:/docker/{ID}\n1:cpu:/docker/{ID}\n0::/docker/{ID}\n"
        );
        let origin = ProcessOrigin::parse(&text);
        assert_eq!(origin.container_id.as_deref(), Some(ID));
        assert_eq!(origin.cgroup, Some(format!("/docker/{ID}")));
        assert_eq!(origin.short_container_id(), Some("571d86cad1a9"));
        // Not in a container: the host's own cgroups.
        let host = ProcessOrigin::parse("4:memory:/user.slice\n0::/user.slice/session-1.scope\n");
        assert_eq!(host.container_id, None);
        assert_eq!(host.cgroup.as_deref(), Some("/user.slice/session-1.scope"));
        // A v1 host whose unified hierarchy is empty: the v1 path says where.
        let v1 = ProcessOrigin::parse(&format!("4:memory:/docker/{ID}\n0::/\n"));
        assert_eq!(v1.cgroup, Some(format!("/docker/{ID}")));
        assert_eq!(ProcessOrigin::parse("garbage"), ProcessOrigin::default());
    }

    #[test]
    fn the_node_is_named() {
        assert!(!node_name().is_empty());
    }
}
