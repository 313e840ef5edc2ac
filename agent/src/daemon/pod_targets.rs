//! The `kubernetes` part of rule targets, for discovery: which containers each rule's
//! selector picks among the pods on this node (from the [`PodWatcher`]), and whether a
//! process runs in one of them (its cgroup names the container id).
//!
//! Selections are recomputed when the watcher's pod set changes; the daemon then rescans
//! the processes. A process started later in a selected container is matched at its exec
//! event like any other.
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
};

use super::{
    kubernetes::{KubeConfig, KubeError, PodWatcher, ProcessCgroups, matching_containers},
    targets::PodMatcher,
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
}

impl PodSelection {
    /// Starts watching the pods of this node (in-cluster config, `NODE_NAME`).
    pub fn start(proc_root: PathBuf) -> Result<Self, KubeError> {
        let watcher = PodWatcher::spawn(KubeConfig::from_env()?)?;
        Ok(Self {
            watcher,
            seen: None,
            selected: Arc::default(),
            proc_root,
        })
    }

    /// Whether any rule needs the pod watcher.
    pub fn needed<'a>(rules: impl IntoIterator<Item = &'a Rule>) -> bool {
        rules
            .into_iter()
            .any(|r| r.target.kubernetes.as_ref().is_some_and(|k| !k.is_empty()))
    }

    /// Recomputes the selections when the pods changed (or `force`); returns whether they
    /// did, so the caller rescans.
    pub fn refresh<'a>(&mut self, rules: impl IntoIterator<Item = &'a Rule>, force: bool) -> bool {
        let generation = self.watcher.generation();
        if !force && self.seen == Some(generation) {
            return false;
        }
        self.seen = Some(generation);
        let pods = self.watcher.current();
        let mut selected: HashMap<String, HashSet<String>> = HashMap::new();
        for rule in rules {
            let Some(selector) = rule.target.kubernetes.as_ref() else {
                continue;
            };
            let ids = matching_containers(selector, &pods)
                .into_iter()
                .map(|c| c.container_id.id)
                .collect();
            selected.insert(rule.name.clone(), ids);
        }
        let count: usize = selected.values().map(HashSet::len).sum();
        log::info!(
            "kubernetes: {} pod(s) on this node, {count} container(s) selected",
            pods.len()
        );
        *self.selected.lock().unwrap_or_else(PoisonError::into_inner) = selected;
        true
    }

    /// The membership test discovery calls for a rule's `kubernetes` selector.
    pub fn matcher(&self) -> PodMatcher {
        let selected = Arc::clone(&self.selected);
        let proc_root = self.proc_root.clone();
        Box::new(move |rule, info| {
            let path = proc_root.join(info.pid.to_string()).join("cgroup");
            let Ok(text) = std::fs::read_to_string(path) else {
                return false;
            };
            let Some((container, _)) = ProcessCgroups::parse(&text).container() else {
                return false;
            };
            selected
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&rule.name)
                .is_some_and(|ids| ids.contains(&container.container_id))
        })
    }

    /// Whether the watcher has listed the pods at least once (for `/readyz`).
    pub fn is_synced(&self) -> bool {
        self.watcher.is_synced()
    }
}
