//! Parsing and matching: cgroup lines of every runtime and driver, container ids, labels,
//! watch events, 410 handling, the in-cluster configuration.

use std::collections::BTreeMap;
use std::path::Path;

use super::*;

const ID: &str = "571d86cad1a9dd89d096771fc32a0ba99ad5c80a6546d4ad5b7381050a1cb138";
const UID: &str = "3f1c2a4b-5d6e-4f70-8a9b-0c1d2e3f4a5b";

fn testdata(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/daemon/kubernetes/testdata")
        .join(name);
    std::fs::read_to_string(&path).expect("fixture")
}

#[test]
fn container_ids_of_all_runtimes() {
    for (text, runtime) in [
        ("containerd://", None),
        ("", None),
        ("abc", None),
        ("docker://a/b", None),
        ("containerd://ABC123", Some(Runtime::Containerd)),
        ("cri-o://abc123", Some(Runtime::CriO)),
        ("docker://abc123", Some(Runtime::Docker)),
        ("rkt://abc123", Some(Runtime::Other("rkt".to_owned()))),
    ] {
        let parsed = ContainerId::parse(text);
        assert_eq!(
            parsed.as_ref().map(|c| c.runtime.clone()),
            runtime,
            "{text}"
        );
        if let Some(id) = parsed {
            assert_eq!(id.id, "abc123");
        }
    }
    let id = ContainerId::parse("cri-o://abc").expect("id");
    assert_eq!(id.to_string(), "cri-o://abc");
}

fn pod(ns: &str, labels: &[(&str, &str)], containers: &[(&str, Option<&str>)]) -> Pod {
    Pod {
        namespace: ns.to_owned(),
        name: format!("{ns}-pod"),
        uid: format!("{ns}-uid"),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        containers: containers
            .iter()
            .map(|(name, id)| PodContainer {
                name: (*name).to_owned(),
                id: id.and_then(ContainerId::parse),
            })
            .collect(),
        ..Pod::default()
    }
}

pub(super) fn selector(
    ns: Option<&str>,
    labels: &[(&str, &str)],
    container: Option<&str>,
) -> KubernetesSelector {
    KubernetesSelector {
        namespace: ns.map(str::to_owned),
        pod_labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        container: container.map(str::to_owned),
    }
}

#[test]
fn label_and_container_matching() {
    let api = pod(
        "prod",
        &[("app", "api"), ("tier", "backend")],
        &[
            ("server", Some("containerd://aa")),
            ("envoy", Some("containerd://bb")),
            ("init", None),
        ],
    );
    let web = pod(
        "prod",
        &[("app", "web")],
        &[("nginx", Some("containerd://cc"))],
    );
    let other_ns = pod(
        "staging",
        &[("app", "api")],
        &[("server", Some("containerd://dd"))],
    );
    let pods = [api, web, other_ns];
    let ids = |s: &KubernetesSelector| -> Vec<String> {
        matching_containers(s, &pods)
            .into_iter()
            .map(|m| m.container_id.id)
            .collect()
    };
    assert_eq!(
        ids(&selector(Some("prod"), &[("app", "api")], Some("server"))),
        ["aa"]
    );
    assert_eq!(
        ids(&selector(Some("prod"), &[("app", "api")], None)),
        ["aa", "bb"]
    );
    assert_eq!(
        ids(&selector(None, &[("app", "api")], Some("server"))),
        ["aa", "dd"]
    );
    assert_eq!(ids(&selector(Some("prod"), &[], None)), ["aa", "bb", "cc"]);
    // Every label must match, values exactly.
    assert!(
        ids(&selector(
            None,
            &[("app", "api"), ("tier", "frontend")],
            None
        ))
        .is_empty()
    );
    assert!(ids(&selector(None, &[("app", "API")], None)).is_empty());
    assert!(ids(&selector(None, &[("missing", "")], None)).is_empty());
    assert!(
        ids(&selector(Some("prod"), &[], Some("init"))).is_empty(),
        "no id yet"
    );
}

#[test]
fn pod_list_fixture() {
    let list = PodList::from_json(&testdata("podlist-two-nodes.json")).expect("PodList");
    assert_eq!(list.resource_version, "1000");
    assert_eq!(list.pods.len(), 5);
    let api = &list.pods[0];
    assert_eq!(
        (api.namespace.as_str(), api.name.as_str(), api.uid.as_str()),
        ("prod", "api-7d9f8b6c5d-x2k4q", UID)
    );
    assert_eq!(api.node_name, "node-a");
    assert_eq!(api.labels.get("tier").map(String::as_str), Some("backend"));
    assert_eq!(api.containers.len(), 2);
    assert_eq!(api.containers[1].name, "server");
    assert_eq!(
        api.containers[1].id,
        Some(ContainerId {
            runtime: Runtime::Containerd,
            id: ID.to_owned()
        })
    );
    let pending = &list.pods[2];
    assert_eq!(pending.phase, "Pending");
    assert_eq!(pending.containers[0].id, None);
    assert!(PodList::from_json("{\"items\": 5}").is_err());
    assert!(PodList::from_json("not json").is_err());
}

#[test]
fn watch_events_and_store() {
    let list = PodList::from_json(&testdata("podlist-two-nodes.json")).expect("PodList");
    let mut store = PodStore::new("node-a");
    store.replace(list);
    assert_eq!(
        store.pods().len(),
        4,
        "the node-b pod is dropped even if the server sent it"
    );
    let events: Vec<WatchEvent> = testdata("watch-add-then-delete.jsonl")
        .lines()
        .map(|line| WatchEvent::from_json(line).expect("event"))
        .collect();
    assert!(matches!(&events[0], WatchEvent::Added(p) if p.name == "api-7d9f8b6c5d-m4n6b"));
    assert!(matches!(&events[1], WatchEvent::Modified(p) if p.containers[0].id.is_some()));
    assert_eq!(
        events[2],
        WatchEvent::Bookmark {
            resource_version: "1010".to_owned()
        }
    );
    assert!(matches!(&events[3], WatchEvent::Deleted(p) if p.uid == UID));
    let applied: Vec<Applied> = events.into_iter().map(|e| store.apply(e)).collect();
    assert_eq!(
        applied,
        [
            Applied::Changed,
            Applied::Changed,
            Applied::Unchanged,
            Applied::Changed
        ]
    );
    assert_eq!(store.resource_version(), "1011");
    assert!(store.pods().iter().all(|p| p.uid != UID));
    assert_eq!(store.pods().len(), 4);
    // Replaying an unchanged object changes nothing.
    let again = store.pods()[0].clone();
    assert_eq!(store.apply(WatchEvent::Modified(again)), Applied::Unchanged);
}

#[test]
fn gone_and_other_errors() {
    let event = WatchEvent::from_json(testdata("watch-expired.jsonl").trim()).expect("ERROR event");
    let WatchEvent::Error(status) = &event else {
        panic!("not an error: {event:?}");
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    let mut store = PodStore::new("node-a");
    assert_eq!(store.apply(event), Applied::Gone);
    let forbidden = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden","reason":"Forbidden","code":403}}"#;
    let event = WatchEvent::from_json(forbidden).expect("ERROR event");
    assert!(matches!(store.apply(event), Applied::Failed(s) if s.code == 403));
    assert!(matches!(
        WatchEvent::from_json(r#"{"type":"SURPRISE","object":{}}"#),
        Err(KubeError::UnknownEvent(kind)) if kind == "SURPRISE"
    ));
    assert!(WatchEvent::from_json("{").is_err());
    assert!(WatchEvent::from_json(r#"{"object":{}}"#).is_err());
}

#[test]
fn moved_pod_leaves_the_store() {
    let mut store = PodStore::new("node-a");
    let mut p = pod("prod", &[], &[("c", Some("containerd://aa"))]);
    p.node_name = "node-a".to_owned();
    assert_eq!(store.apply(WatchEvent::Added(p.clone())), Applied::Changed);
    p.node_name = "node-b".to_owned();
    assert_eq!(store.apply(WatchEvent::Modified(p)), Applied::Changed);
    assert!(store.pods().is_empty());
}

#[test]
fn in_cluster_config() {
    let sa = tempfile::tempdir().expect("tempdir");
    std::fs::write(sa.path().join("token"), "tok\n").expect("token");
    std::fs::write(sa.path().join("ca.crt"), "pem").expect("ca");
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    let config = KubeConfig::from_lookup(
        env(&[
            ("NODE_NAME", "node-a"),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
        ]),
        sa.path(),
    )
    .expect("config");
    assert_eq!(config.api_url, "https://10.96.0.1:443");
    assert_eq!(config.node_name, "node-a");
    assert_eq!(config.token_file, Some(sa.path().join("token")));
    assert_eq!(config.ca_file, Some(sa.path().join("ca.crt")));

    let config = KubeConfig::from_lookup(
        env(&[
            ("NODE_NAME", "n"),
            ("KUBERNETES_SERVICE_HOST", "fd00::1"),
            ("KUBERNETES_SERVICE_PORT", "6443"),
        ]),
        sa.path(),
    )
    .expect("config");
    assert_eq!(config.api_url, "https://[fd00::1]:6443");

    // The override wins; over plain HTTP no token or CA is used.
    let config = KubeConfig::from_lookup(
        env(&[
            ("NODE_NAME", "n"),
            ("LOOKBACK_KUBE_API", "http://127.0.0.1:8001/"),
        ]),
        sa.path(),
    )
    .expect("config");
    assert_eq!(config.api_url, "http://127.0.0.1:8001");
    assert_eq!((config.token_file, config.ca_file), (None, None));

    let err = |vars| KubeConfig::from_lookup(env(vars), sa.path()).expect_err("error");
    assert!(matches!(
        err(&[("KUBERNETES_SERVICE_HOST", "h")]),
        KubeError::MissingEnv { name: "NODE_NAME" }
    ));
    assert!(matches!(
        err(&[("NODE_NAME", "n"), ("KUBERNETES_SERVICE_HOST", "h")]),
        KubeError::MissingEnv {
            name: "KUBERNETES_SERVICE_PORT"
        }
    ));
    assert!(matches!(
        err(&[
            ("NODE_NAME", "n"),
            ("KUBERNETES_SERVICE_HOST", "h"),
            ("KUBERNETES_SERVICE_PORT", "https")
        ]),
        KubeError::InvalidEnv { .. }
    ));
    assert!(matches!(
        err(&[("NODE_NAME", "n"), ("LOOKBACK_KUBE_API", "ftp://x")]),
        KubeError::InvalidEnv { .. }
    ));
}

#[test]
fn bad_ca_file_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, "no certificate here\n").expect("ca");
    let config = KubeConfig {
        api_url: "https://10.96.0.1:443".to_owned(),
        node_name: "n".to_owned(),
        token_file: None,
        ca_file: Some(ca),
        watch_timeout: std::time::Duration::from_secs(5),
        min_backoff: std::time::Duration::from_millis(10),
        max_backoff: std::time::Duration::from_millis(10),
    };
    assert!(matches!(
        KubeClient::new(&config),
        Err(KubeError::NoCertificate { .. })
    ));
}

#[test]
fn host_paths_go_through_the_process_root() {
    let proc_root = Path::new("/host/proc");
    assert_eq!(
        host_path(proc_root, 42, Path::new("/app/server")),
        Path::new("/host/proc/42/root/app/server")
    );
    assert_eq!(
        host_path(proc_root, 42, Path::new("usr/lib/../bin/./x")),
        Path::new("/host/proc/42/root/usr/bin/x")
    );
    assert_eq!(
        host_path(proc_root, 7, Path::new("/../../etc/passwd")),
        Path::new("/host/proc/7/root/etc/passwd"),
        "never above the container's root"
    );
}

#[test]
fn host_paths_from_the_environment() {
    let none = HostPaths::from_lookup(|_| None);
    assert_eq!(none.proc_root, HostPaths::default().proc_root);
    assert!(none.cgroup_root.starts_with("/sys/fs/cgroup"));
    // LOOKBACK_PROC_ROOT is no override (the proc root is `--proc-root`).
    let set = HostPaths::from_lookup(|name| match name {
        "LOOKBACK_CGROUP_ROOT" => Some("/host/sys/fs/cgroup".into()),
        "LOOKBACK_PROC_ROOT" => Some("/host/proc".into()),
        _ => None,
    });
    assert_eq!(set.cgroup_root, Path::new("/host/sys/fs/cgroup"));
    assert_eq!(set.proc_root, Path::new("/proc"));
}

/// The host's tree mounted at `LOOKBACK_CGROUP_ROOT`, laid out as cgroup v2, hybrid
/// (v2 under `unified/`, v1 controllers beside it) or v1 only.
#[test]
fn the_v2_hierarchy_is_found_under_the_cgroup_root() {
    let lookup_at = |root: &Path| {
        let root = root.as_os_str().to_owned();
        HostPaths::from_lookup(move |name| (name == CGROUP_ROOT_ENV).then(|| root.clone()))
    };
    let v2 = tempfile::tempdir().expect("tempdir");
    std::fs::write(v2.path().join("cgroup.controllers"), "cpu memory\n").expect("write");
    assert_eq!(lookup_at(v2.path()).cgroup_root, v2.path());
    let hybrid = tempfile::tempdir().expect("tempdir");
    for dir in ["unified", "memory/docker", "cpu"] {
        std::fs::create_dir_all(hybrid.path().join(dir)).expect("mkdir");
    }
    std::fs::write(hybrid.path().join("unified/cgroup.controllers"), "").expect("write");
    assert_eq!(
        lookup_at(hybrid.path()).cgroup_root,
        hybrid.path().join("unified")
    );
    let v1 = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(v1.path().join("memory")).expect("mkdir");
    assert_eq!(lookup_at(v1.path()).cgroup_root, v1.path());
    assert_eq!(unified_under(v1.path()), None);
}
