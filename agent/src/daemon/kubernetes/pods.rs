//! The pod model: what the agent needs of a Kubernetes v1 `Pod` (namespace, name, uid,
//! labels, node, container names and ids), parsed from `PodList` and `WatchEvent` JSON; the
//! [`PodStore`] that a list and the watch events after it keep current; and
//! [`KubernetesSelector`] matching.
//!
//! Raw structs accept any extra field (the API adds fields every release) and default
//! every missing one: a pod the agent cannot use (no uid, no container id yet) is kept and
//! simply matches nothing.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use super::KubeError;
use crate::rules::KubernetesSelector;

/// A pod as the agent sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.nodeName`; empty while unscheduled.
    pub node_name: String,
    pub labels: BTreeMap<String, String>,
    /// `status.phase`: `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    pub phase: String,
    pub resource_version: String,
    /// Regular, init and ephemeral containers that have a status, in that order.
    pub containers: Vec<PodContainer>,
}

/// One container of a pod, from `status.*containerStatuses[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContainer {
    pub name: String,
    /// `None` until the runtime has created the container.
    pub id: Option<ContainerId>,
}

/// The container runtime named in a `containerID` (`containerd://…`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Runtime {
    Containerd,
    CriO,
    Docker,
    /// Any other scheme, as written.
    Other(String),
}

impl Runtime {
    /// The scheme as Kubernetes writes it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Containerd => "containerd",
            Self::CriO => "cri-o",
            Self::Docker => "docker",
            Self::Other(scheme) => scheme,
        }
    }
}

/// A parsed `containerStatuses[].containerID`: `containerd://<id>`, `cri-o://<id>`,
/// `docker://<id>`. The id is what names the container's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerId {
    pub runtime: Runtime,
    pub id: String,
}

impl ContainerId {
    /// `None` for an empty string, a missing `://`, or an empty or non-alphanumeric id.
    pub fn parse(text: &str) -> Option<ContainerId> {
        let (scheme, id) = text.split_once("://")?;
        if scheme.is_empty() || id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        let runtime = match scheme {
            "containerd" => Runtime::Containerd,
            "cri-o" => Runtime::CriO,
            "docker" => Runtime::Docker,
            other => Runtime::Other(other.to_owned()),
        };
        Some(ContainerId {
            runtime,
            id: id.to_ascii_lowercase(),
        })
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.runtime.as_str(), self.id)
    }
}

/// One container a selector picked: the pod it belongs to and its runtime id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchedContainer {
    pub pod_namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub container: String,
    pub container_id: ContainerId,
}

/// Whether `pod` is in the selector's namespace and carries every one of its labels.
pub fn pod_matches(selector: &KubernetesSelector, pod: &Pod) -> bool {
    selector
        .namespace
        .as_ref()
        .is_none_or(|ns| *ns == pod.namespace)
        && selector
            .pod_labels
            .iter()
            .all(|(key, value)| pod.labels.get(key) == Some(value))
}

/// The containers of `pods` that `selector` picks, in pod order. Containers without an id
/// (not created yet) are left out: they have no cgroup to find.
pub fn matching_containers(selector: &KubernetesSelector, pods: &[Pod]) -> Vec<MatchedContainer> {
    let mut out = Vec::new();
    for pod in pods.iter().filter(|pod| pod_matches(selector, pod)) {
        for container in &pod.containers {
            if selector
                .container
                .as_ref()
                .is_some_and(|name| *name != container.name)
            {
                continue;
            }
            let Some(id) = &container.id else { continue };
            out.push(MatchedContainer {
                pod_namespace: pod.namespace.clone(),
                pod_name: pod.name.clone(),
                pod_uid: pod.uid.clone(),
                container: container.name.clone(),
                container_id: id.clone(),
            });
        }
    }
    out
}

/// A `PodList`: its pods and the `metadata.resourceVersion` to watch from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodList {
    pub pods: Vec<Pod>,
    pub resource_version: String,
}

impl PodList {
    pub fn from_json(text: &str) -> Result<PodList, KubeError> {
        let raw: RawList = serde_json::from_str(text).map_err(|source| KubeError::Json {
            what: "PodList",
            source,
        })?;
        Ok(PodList {
            pods: raw.items.into_iter().map(Pod::from).collect(),
            resource_version: raw.metadata.resource_version,
        })
    }
}

/// A `metav1.Status` as sent in an `ERROR` watch event or an error response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ApiStatus {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl ApiStatus {
    /// 410 Gone / `Expired`: the resource version is too old; list again.
    pub fn is_gone(&self) -> bool {
        self.code == 410 || self.reason == "Expired" || self.reason == "Gone"
    }
}

/// One line of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Added(Pod),
    Modified(Pod),
    Deleted(Pod),
    /// Progress marker: only the resource version to resume from.
    Bookmark {
        resource_version: String,
    },
    Error(ApiStatus),
}

impl WatchEvent {
    /// Parses one newline-delimited `{"type": ..., "object": ...}` event.
    pub fn from_json(line: &str) -> Result<WatchEvent, KubeError> {
        let raw: RawEvent = serde_json::from_str(line).map_err(|source| KubeError::Json {
            what: "watch event",
            source,
        })?;
        let json = |what| move |source| KubeError::Json { what, source };
        let pod = |object| {
            serde_json::from_value::<RawPod>(object)
                .map(Pod::from)
                .map_err(json("watch event pod"))
        };
        Ok(match raw.kind.as_str() {
            "ADDED" => WatchEvent::Added(pod(raw.object)?),
            "MODIFIED" => WatchEvent::Modified(pod(raw.object)?),
            "DELETED" => WatchEvent::Deleted(pod(raw.object)?),
            "BOOKMARK" => WatchEvent::Bookmark {
                resource_version: pod(raw.object)?.resource_version,
            },
            "ERROR" => WatchEvent::Error(
                serde_json::from_value(raw.object).map_err(json("watch error status"))?,
            ),
            other => return Err(KubeError::UnknownEvent(other.chars().take(32).collect())),
        })
    }
}

/// What applying a watch event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The pod set changed.
    Changed,
    /// Only the resource version moved (bookmark, or a pod of another node).
    Unchanged,
    /// The server said 410 Gone: list again.
    Gone,
    /// Any other `ERROR` event: watch again after a pause.
    Failed(ApiStatus),
}

/// The pods of one node, kept current by a list and the watch events after it.
#[derive(Debug, Clone, Default)]
pub struct PodStore {
    node_name: String,
    pods: BTreeMap<String, Pod>,
    resource_version: String,
}

impl PodStore {
    /// An empty store for the pods of `node_name`; an empty name keeps every pod.
    pub fn new(node_name: &str) -> PodStore {
        PodStore {
            node_name: node_name.to_owned(),
            ..PodStore::default()
        }
    }

    /// Replaces everything with a fresh list.
    pub fn replace(&mut self, list: PodList) {
        self.pods.clear();
        for pod in list.pods {
            self.insert(pod);
        }
        self.resource_version = list.resource_version;
    }

    /// The version the next watch starts from.
    pub fn resource_version(&self) -> &str {
        &self.resource_version
    }

    /// The pods, by uid.
    pub fn pods(&self) -> Vec<Pod> {
        self.pods.values().cloned().collect()
    }

    pub fn apply(&mut self, event: WatchEvent) -> Applied {
        match event {
            WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                self.bump(&pod.resource_version);
                if self.pods.get(&pod.uid) == Some(&pod) {
                    return Applied::Unchanged;
                }
                if self.insert(pod) {
                    Applied::Changed
                } else {
                    Applied::Unchanged
                }
            }
            WatchEvent::Deleted(pod) => {
                self.bump(&pod.resource_version);
                if self.pods.remove(&pod.uid).is_some() {
                    Applied::Changed
                } else {
                    Applied::Unchanged
                }
            }
            WatchEvent::Bookmark { resource_version } => {
                self.bump(&resource_version);
                Applied::Unchanged
            }
            WatchEvent::Error(status) if status.is_gone() => Applied::Gone,
            WatchEvent::Error(status) => Applied::Failed(status),
        }
    }

    /// Keeps a pod of this node (the server filters too; this guards a server that does
    /// not, and a pod moved off the node is dropped). Returns whether the set changed.
    fn insert(&mut self, pod: Pod) -> bool {
        if pod.uid.is_empty() {
            return false;
        }
        if !self.node_name.is_empty() && pod.node_name != self.node_name {
            return self.pods.remove(&pod.uid).is_some();
        }
        self.pods.insert(pod.uid.clone(), pod);
        true
    }

    fn bump(&mut self, resource_version: &str) {
        if !resource_version.is_empty() {
            resource_version.clone_into(&mut self.resource_version);
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawList {
    metadata: RawMeta,
    items: Vec<RawPod>,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: serde_json::Value,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawPod {
    metadata: RawMeta,
    spec: RawSpec,
    status: RawStatus,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawMeta {
    name: String,
    namespace: String,
    uid: String,
    resource_version: String,
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawSpec {
    node_name: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawStatus {
    phase: String,
    container_statuses: Vec<RawContainerStatus>,
    init_container_statuses: Vec<RawContainerStatus>,
    ephemeral_container_statuses: Vec<RawContainerStatus>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawContainerStatus {
    name: String,
    #[serde(rename = "containerID")]
    container_id: String,
}

impl From<RawPod> for Pod {
    fn from(raw: RawPod) -> Pod {
        let status = raw.status;
        let containers = status
            .container_statuses
            .into_iter()
            .chain(status.init_container_statuses)
            .chain(status.ephemeral_container_statuses)
            .map(|c| PodContainer {
                id: ContainerId::parse(&c.container_id),
                name: c.name,
            })
            .collect();
        Pod {
            namespace: raw.metadata.namespace,
            name: raw.metadata.name,
            uid: raw.metadata.uid,
            node_name: raw.spec.node_name,
            labels: raw.metadata.labels,
            phase: status.phase,
            resource_version: raw.metadata.resource_version,
            containers,
        }
    }
}
