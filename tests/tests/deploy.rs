//! The Kubernetes manifests in `deploy/kubernetes/`, checked offline by
//! `tests/scripts/check_manifests.py`: core resources against the Kubernetes JSON schemas of
//! the `PyPI` `kubernetes-validate` package (installed into `.tools/python` by `cargo xtask
//! setup`), the `ServiceMonitor` CRD against an embedded subset of its schema, and the
//! references between the files; the `ConfigMap`'s rules through `lookback rules validate`.
//! A deliberately broken copy of each kind must be rejected, so the check cannot pass
//! vacuously. Also the Kubernetes API responses the selector tests replay
//! (`tests/scripts/check_api_fixtures.py`). No root needed.
use std::{
    fs,
    path::Path,
    process::{Command, Output},
};

use lookback_tests::{lookback_bin, workspace_root};
use serde_json::Value;

/// Whether python3 runs here (on CI it must); prints why a test is skipped if not.
fn have_python() -> bool {
    if Command::new("python3").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 is missing on CI: the manifests cannot be checked"
        );
        #[expect(clippy::print_stderr, reason = "a skipped test says why")]
        {
            eprintln!("skipped: python3 is missing, the manifests cannot be checked");
        }
        return false;
    }
    true
}

/// `python3 tests/scripts/SCRIPT DIR [ARGS]`, or `None` (skip) without python3.
fn run_check(script: &str, dir: &Path, args: &[&std::ffi::OsStr]) -> Option<Output> {
    if !have_python() {
        return None;
    }
    let out = Command::new("python3")
        .arg(workspace_root().join("tests/scripts").join(script))
        .arg(dir)
        .args(args)
        .output()
        .expect("python3");
    assert_ne!(
        out.status.code(),
        Some(3),
        "run `cargo xtask setup` to install kubernetes-validate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(out)
}

/// `check_manifests.py DIR [ARGS]`, or `None` (skip) without python3.
fn check_manifests(dir: &Path, args: &[&std::ffi::OsStr]) -> Option<Output> {
    run_check("check_manifests.py", dir, args)
}

/// A copy of `src` with `from` replaced by `to` in `file`, run through `check`: its stderr,
/// after asserting the check rejected it (exit 1); `None` (skip) without python3.
fn rejected_copy(
    src: &Path,
    (file, from, to): (&str, &str, &str),
    check: impl Fn(&Path) -> Option<Output>,
) -> Option<String> {
    let tmp = tempfile::tempdir().expect("tempdir");
    copy_tree(src, tmp.path());
    let path = tmp.path().join(file);
    let text = fs::read_to_string(&path).expect("file");
    assert!(text.contains(from), "{file} no longer contains {from:?}");
    fs::write(&path, text.replacen(from, to, 1)).expect("write");
    let out = check(tmp.path())?;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{file}: {from:?} → {to:?} was accepted"
    );
    Some(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `src` and its subdirectories (the overlays) copied into `dst`.
fn copy_tree(src: &Path, dst: &Path) {
    for entry in fs::read_dir(src).expect("source directory") {
        let entry = entry.expect("entry");
        let to = dst.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            fs::create_dir(&to).expect("mkdir");
            copy_tree(&entry.path(), &to);
        } else {
            fs::copy(entry.path(), to).expect("copy");
        }
    }
}

fn deploy_dir() -> std::path::PathBuf {
    workspace_root().join("deploy/kubernetes")
}

#[test]
fn manifests_match_the_kubernetes_schemas() {
    let Some(out) = check_manifests(&deploy_dir(), &[]) else {
        return;
    };
    assert!(
        out.status.success(),
        "check_manifests.py rejected deploy/kubernetes:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).expect("a JSON summary");
    let resources: Vec<&str> = summary["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for expected in [
        "DaemonSet/lookback",
        "ConfigMap/lookback-rules",
        "ServiceAccount/lookback",
        "ClusterRole/lookback",
        "ClusterRoleBinding/lookback",
        "Service/lookback-metrics",
        "ServiceMonitor/lookback",
    ] {
        assert!(resources.contains(&expected), "{expected} in {resources:?}");
    }
}

#[test]
fn configmap_rules_are_valid() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rules = tmp.path().join("rules.yaml");
    let Some(out) = check_manifests(
        &deploy_dir(),
        &["--extract-rules".as_ref(), rules.as_os_str()],
    ) else {
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let validate = Command::new(lookback_bin())
        .args(["rules", "validate"])
        .arg(&rules)
        .output()
        .expect("lookback");
    assert!(
        validate.status.success(),
        "the ConfigMap's rules.yaml is invalid:\n{}",
        String::from_utf8_lossy(&validate.stderr)
    );
}

/// One file of a copy of deploy/kubernetes edited (`from` → `to`), and the message the
/// check must give.
const BROKEN: [(&str, &str, &str, &str); 7] = [
    // A field the DaemonSet API does not have.
    (
        "daemonset.yaml",
        "      hostPID: true\n",
        "      hostPID: true\n      hostPIDs: true\n",
        "'hostPIDs' was unexpected",
    ),
    // A wrong type.
    (
        "daemonset.yaml",
        "containerPort: 9464",
        "containerPort: \"9464\"",
        "is not of type 'integer'",
    ),
    // A core schema violation in another kind.
    (
        "service.yaml",
        "      protocol: TCP",
        "      protocol: [TCP]",
        "spec.ports.0.protocol",
    ),
    // The CRD: a bad Prometheus duration and an unknown field.
    (
        "servicemonitor.yaml",
        "interval: 30s",
        "interval: 30 seconds",
        "interval",
    ),
    (
        "servicemonitor.yaml",
        "      path: /metrics",
        "      path: /metrics\n      scrapeEvery: 30s",
        "'scrapeEvery' was unexpected",
    ),
    // References: the ServiceMonitor scrapes a port the Service lacks.
    (
        "servicemonitor.yaml",
        "- port: metrics",
        "- port: http",
        "endpoint port http is not a port of the Service",
    ),
    // References: NODE_NAME from somewhere else than the downward API.
    (
        "daemonset.yaml",
        "fieldPath: spec.nodeName",
        "fieldPath: metadata.name",
        "NODE_NAME must come from the downward API",
    ),
];

#[test]
fn broken_manifests_are_rejected() {
    for (file, from, to, message) in BROKEN {
        let Some(stderr) = rejected_copy(&deploy_dir(), (file, from, to), |dir| {
            check_manifests(dir, &[])
        }) else {
            return;
        };
        assert!(
            stderr.contains(message),
            "{file}: {from:?} → {to:?}: expected {message:?} in:\n{stderr}"
        );
    }
}

#[test]
fn the_tls_overlay_builds_on_the_base_and_serves_probes_and_scrapes_over_https() {
    let Some(out) = check_manifests(&deploy_dir().join("tls"), &[]) else {
        return;
    };
    assert!(
        out.status.success(),
        "check_manifests.py rejected deploy/kubernetes/tls:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).expect("a JSON summary");
    let resources = summary["resources"].as_array().expect("resources");
    // The whole base, patched: no resource lost or added.
    assert_eq!(resources.len(), 8, "{resources:?}");
}

/// The TLS overlay edited (`from` → `to` in a file under deploy/kubernetes), and the
/// message the check must give.
const BROKEN_TLS: [(&str, &str, &str, &str); 5] = [
    // A probe left on plain HTTP while the agent serves TLS.
    (
        "tls/daemonset-tls.yaml",
        "  value: HTTPS\n",
        "  value: HTTP\n",
        "livenessProbe must say scheme: HTTPS",
    ),
    // The web config (and its key) from a volume that is not a Secret.
    (
        "tls/daemonset-tls.yaml",
        "    secret:\n      secretName: lookback-web\n      # Read by the agent only (uid 0): \
         the key and the password hashes.\n      defaultMode: 0400\n",
        "    emptyDir:\n      medium: Memory\n",
        "is not in a mounted Secret",
    ),
    // Prometheus scraping plain HTTP, or checking the wrong name.
    (
        "tls/servicemonitor-tls.yaml",
        "  value: https\n",
        "  value: http\n",
        "endpoint scheme http, but the agent serves https",
    ),
    (
        "tls/servicemonitor-tls.yaml",
        "serverName: lookback-metrics.lookback.svc",
        "serverName: lookback-metrics",
        "tlsConfig.serverName must be one of",
    ),
    // A patch whose path is not in the base: kustomize refuses it, so does the check.
    (
        "tls/daemonset-tls.yaml",
        "containers/0/livenessProbe/httpGet/scheme",
        "containers/0/livenesProbe/httpGet/scheme",
        "does not apply",
    ),
];

#[test]
fn broken_tls_overlays_are_rejected() {
    for (file, from, to, message) in BROKEN_TLS {
        let Some(stderr) = rejected_copy(&deploy_dir(), (file, from, to), |dir| {
            check_manifests(&dir.join("tls"), &[])
        }) else {
            return;
        };
        assert!(
            stderr.contains(message),
            "{file}: {from:?} → {to:?}: expected {message:?} in:\n{stderr}"
        );
    }
}

/// `check_api_fixtures.py DIR`, or `None` (skip) without python3.
fn check_api_fixtures(dir: &Path) -> Option<Output> {
    run_check("check_api_fixtures.py", dir, &[])
}

fn api_fixtures_dir() -> std::path::PathBuf {
    workspace_root().join("agent/src/daemon/kubernetes/testdata")
}

/// The API responses the Kubernetes selector tests replay (written by hand in an API
/// server's shape: there is no cluster here) are what the Kubernetes schemas allow:
/// `PodList`s, watch events of `Pod`s, `Status` errors, strict, oldest and newest version.
#[test]
fn recorded_api_responses_match_the_kubernetes_schemas() {
    let Some(out) = check_api_fixtures(&api_fixtures_dir()) else {
        return;
    };
    assert!(
        out.status.success(),
        "check_api_fixtures.py rejected the fixtures:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).expect("a JSON summary");
    assert_eq!(summary["checked"]["podlist-two-nodes.json"], "PodList");
    assert_eq!(summary["checked"]["status-gone.json"], "Status");
    let watch = summary["checked"]["watch-add-then-delete.jsonl"]
        .as_array()
        .expect("watch events");
    assert!(watch.len() >= 3, "{watch:?}");
}

#[test]
fn broken_api_responses_are_rejected() {
    let broken: [(&str, &str, &str, &str); 3] = [
        (
            "podlist-two-nodes.json",
            "\"restartCount\": 0",
            "\"restartCount\": \"none\"",
            "restartCount",
        ),
        (
            "podlist-two-nodes.json",
            "\"containerID\"",
            "\"containerId\"",
            "containerId",
        ),
        (
            "status-gone.json",
            "\"code\": 410",
            "\"code\": \"410\"",
            "Status",
        ),
    ];
    for (file, from, to, message) in broken {
        let Some(stderr) = rejected_copy(&api_fixtures_dir(), (file, from, to), check_api_fixtures)
        else {
            return;
        };
        assert!(
            stderr.contains(message) && stderr.contains(file),
            "{file}: {from:?} → {to:?}: expected {message:?} in:\n{stderr}"
        );
    }
}
