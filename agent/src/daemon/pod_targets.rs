//! The `kubernetes` part of rule targets, for discovery: which containers each rule's
//! selector picks among the pods on this node (from the [`PodWatcher`]), and whether a
//! process runs in one of them (its cgroup names the container id).
//!
//! Selections are recomputed when the watcher's pod set changes; the daemon then rescans
//! the processes. A process started later in a selected container is matched at its exec
//! event like any other. Every pod's containers also name the pod of a snapshot's
//! container in its origin ([`PodSelection::pod_of`]).
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
};

use super::{
    kubernetes::{
        CGROUP_ROOT_ENV, HostPaths, KubeConfig, KubeError, PodWatcher, ProcIndex, ProcessCgroups,
        matching_containers, targets_from_index, unified_under,
    },
    targets::{PodMatcher, PodOf, PodRef},
};
use crate::rules::Rule;

/// Rule name → selected container ids.
type Selected = Arc<Mutex<HashMap<String, HashSet<String>>>>;

/// The pod watcher and what the rules select from it.
pub struct PodSelection {
    watcher: PodWatcher,
    seen: Option<u64>,
    selected: Selected,
    proc_root: PathBuf,
    host: HostPaths,
    /// Container id → its cgroup v2 ids, learnt from `/proc` scans and from processes the
    /// matcher saw; kept while the container is selected, so a container whose processes
    /// all exited still has its cgroup targeted for the next one.
    known: HashMap<String, HashSet<u64>>,
    /// Container id → cgroup v2 path, reported by the matcher, not yet resolved to ids.
    observed: Observed,
    /// Rule name → cgroup v2 ids of its selected containers (for `TARGET_CGROUPS`).
    cgroups: HashMap<String, Vec<u64>>,
    /// The rules that select by pod alone, with their selected containers.
    pod_only: Vec<(String, HashSet<String>)>,
    /// Container id → its pod, of every pod on this node (snapshots' origin).
    pods_by_container: Arc<Mutex<HashMap<String, PodRef>>>,
}

/// Container id → cgroup v2 path, shared with the matcher.
type Observed = Arc<Mutex<HashMap<String, String>>>;

impl PodSelection {
    /// Starts watching the pods of this node (in-cluster config, `NODE_NAME`).
    pub fn start(proc_root: PathBuf) -> Result<Self, KubeError> {
        let watcher = PodWatcher::spawn(KubeConfig::from_env()?)?;
        let mut host = HostPaths::from_env();
        host.proc_root.clone_from(&proc_root);
        // No v2 hierarchy at or under the root: it may be mounted elsewhere.
        if std::env::var_os(CGROUP_ROOT_ENV).is_none()
            && unified_under(&host.cgroup_root).is_none()
            && let Some(unified) = cgroup2_mount()
        {
            host.cgroup_root = unified;
        }
        Ok(Self {
            watcher,
            seen: None,
            selected: Arc::default(),
            proc_root,
            host,
            known: HashMap::new(),
            observed: Arc::default(),
            cgroups: HashMap::new(),
            pod_only: Vec::new(),
            pods_by_container: Arc::default(),
        })
    }

    /// Whether any rule needs the pod watcher.
    pub fn needed<'a>(rules: impl IntoIterator<Item = &'a Rule>) -> bool {
        rules
            .into_iter()
            .any(|r| r.target.kubernetes.as_ref().is_some_and(|k| !k.is_empty()))
    }

    /// Whether the watcher's pod set moved since the last [`refresh`](Self::refresh).
    pub fn pods_changed(&self) -> bool {
        self.seen != Some(self.watcher.generation())
    }

    /// Recomputes the selections when the pods changed (or `force`); returns whether they
    /// did, so the caller rescans.
    pub fn refresh(&mut self, rules: &[Rule], force: bool) -> bool {
        let generation = self.watcher.generation();
        if !force && self.seen == Some(generation) {
            return false;
        }
        self.seen = Some(generation);
        let pods = self.watcher.current();
        *self
            .pods_by_container
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = pods
            .iter()
            .flat_map(|pod| {
                pod.containers.iter().filter_map(move |c| {
                    let id = c.id.as_ref()?.id.clone();
                    let pod = PodRef {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                    };
                    Some((id, pod))
                })
            })
            .collect();
        let mut selected: HashMap<String, HashSet<String>> = HashMap::new();
        let rules_with_selectors: Vec<&Rule> = rules
            .iter()
            .filter(|r| r.target.kubernetes.is_some())
            .collect();
        for rule in &rules_with_selectors {
            let Some(selector) = rule.target.kubernetes.as_ref() else {
                continue;
            };
            let ids = matching_containers(selector, &pods)
                .into_iter()
                .map(|c| c.container_id.id)
                .collect();
            selected.insert(rule.name.clone(), ids);
        }
        self.pod_only = rules_with_selectors
            .iter()
            .filter(|r| is_pod_only(r))
            .map(|r| {
                (
                    r.name.clone(),
                    selected.get(&r.name).cloned().unwrap_or_default(),
                )
            })
            .collect();
        self.scan_cgroups(&rules_with_selectors, &pods);
        let count: usize = selected.values().map(HashSet::len).sum();
        let mut current = self.selected.lock().unwrap_or_else(PoisonError::into_inner);
        if *current == selected {
            log::debug!("kubernetes: {} pod(s), selection unchanged", pods.len());
        } else {
            log::info!(
                "kubernetes: {} pod(s) on this node, {count} container(s) selected",
                pods.len()
            );
        }
        *current = selected;
        true
    }

    /// The container → pod lookup for snapshots' origin.
    pub fn pod_of(&self) -> PodOf {
        let pods = Arc::clone(&self.pods_by_container);
        Box::new(move |id| {
            pods.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(id)
                .cloned()
        })
    }

    /// The membership test discovery calls for a rule's `kubernetes` selector.
    pub fn matcher(&self) -> PodMatcher {
        let selected = Arc::clone(&self.selected);
        let observed = Arc::clone(&self.observed);
        let proc_root = self.proc_root.clone();
        Box::new(move |rule, info| {
            let path = proc_root.join(info.pid.to_string()).join("cgroup");
            let Ok(text) = std::fs::read_to_string(path) else {
                return false;
            };
            let cgroups = ProcessCgroups::parse(&text);
            let Some((container, _)) = cgroups.container() else {
                return false;
            };
            let hit = selected
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&rule.name)
                .is_some_and(|ids| ids.contains(&container.container_id));
            if hit && let Some(v2) = cgroups.v2 {
                observed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(container.container_id, v2);
            }
            hit
        })
    }

    /// Learns the cgroup ids of the selected containers that have processes now, forgets
    /// containers no longer selected, and rebuilds [`cgroups`](Self::cgroups).
    fn scan_cgroups(&mut self, rules: &[&Rule], pods: &[super::kubernetes::Pod]) {
        let wanted: HashSet<&String> = self.pod_only.iter().flat_map(|(_, ids)| ids).collect();
        self.known.retain(|id, _| wanted.contains(id));
        if !self.pod_only.is_empty() {
            match ProcIndex::scan(&self.host.proc_root) {
                Ok(index) => {
                    for rule in rules.iter().filter(|r| is_pod_only(r)) {
                        let Some(selector) = rule.target.kubernetes.as_ref() else {
                            continue;
                        };
                        for t in targets_from_index(selector, pods, &index, &self.host) {
                            self.known
                                .entry(t.container_id.id)
                                .or_default()
                                .extend(t.cgroup_ids);
                        }
                    }
                }
                Err(e) => log::warn!("kubernetes: {}", super::targets::ErrorChain(&e)),
            }
        }
        self.rebuild();
    }

    /// Resolves the cgroups the matcher saw since the last call; returns whether that
    /// taught anything new (then [`cgroups`](Self::cgroups) changed).
    pub fn absorb_observed(&mut self) -> bool {
        let seen: Vec<(String, String)> = self
            .observed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        let mut learnt = false;
        for (container, path) in seen {
            // A path with `..` is relative to another cgroup namespace (the agent in a pod):
            // the /proc scan's resolver handles those.
            if path.contains("/..") {
                continue;
            }
            let dir = self.host.cgroup_root.join(path.trim_start_matches('/'));
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            learnt |= self
                .known
                .entry(container)
                .or_default()
                .insert(std::os::unix::fs::MetadataExt::ino(&meta));
        }
        if learnt {
            self.rebuild();
        }
        learnt
    }

    fn rebuild(&mut self) {
        self.cgroups = self
            .pod_only
            .iter()
            .map(|(rule, containers)| {
                let ids = containers
                    .iter()
                    .filter_map(|c| self.known.get(c))
                    .flatten()
                    .copied()
                    .collect();
                (rule.clone(), ids)
            })
            .collect();
    }

    /// Rule name → cgroup ids of its containers (rules selecting by pod alone).
    pub fn cgroups(&self) -> &HashMap<String, Vec<u64>> {
        &self.cgroups
    }

    /// Whether the watcher has listed the pods at least once (for `/readyz`).
    pub fn is_synced(&self) -> bool {
        self.watcher.is_synced()
    }
}

/// Whether a rule selects by pod alone: then every process of its containers is a target,
/// and the kernel may decide that by cgroup (with `comm`, `exe` or `cgroup` also given, a
/// process in the container may still not match, so only the agent's check can).
fn is_pod_only(rule: &Rule) -> bool {
    let t = &rule.target;
    t.kubernetes.as_ref().is_some_and(|k| !k.is_empty())
        && t.pid.is_none()
        && t.comm.is_none()
        && t.exe.is_none()
        && t.cgroup.is_none()
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// on a hybrid host): `bpf_get_current_cgroup_id` returns inode numbers of its directories.
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, dir, kind) = (f.next()?, f.next()?, f.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(dir))
    })
}
