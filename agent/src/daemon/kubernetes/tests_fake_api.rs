//! The whole selector against a fake API server (a `TcpListener` thread answering with the
//! recorded responses in `testdata/`) and a fake `/proc` and cgroup tree in a tempdir:
//! list → targets; watch events add and delete pods → targets follow; a 410 `ERROR` event,
//! an HTTP 410 and an HTTP 403 → relist with backoff, pods kept meanwhile; a status-only
//! update changes no generation.
//!
//! The server answers one request at a time, each only when the test hands it a reply, so
//! every stage is checked before the watcher can move on.

use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use super::tests::selector;
use super::*;

const WAIT: Duration = Duration::from_secs(10);

const API1_SERVER: &str = "571d86cad1a9dd89d096771fc32a0ba99ad5c80a6546d4ad5b7381050a1cb138";
const API1_ENVOY: &str = "7b9cf95e6be37315bf1c3ac7ec0e0f0224c0405ce0fd528df358fc28a7ac2496";
const API1_PAUSE: &str = "e6830325c4736da1904600f9c71263059e66f962fbb66461bb7760474c91dc84";
const WEB: &str = "723359e2b37dccb7c092a33062cd0f0d124def7784825ded4cb010ee0e11aaad";
const PROXY: &str = "1241936d4dd3aad68fe7bfbdfe854b935926bc678fc72377e15166078916227a";
const NEW_SERVER: &str = "ed669401591f2663315b08f2338d7aae17550f72f040aa73942edb793c468784";
const REPORT: &str = "845e91831319e89c4d656bdb80c278ac09a7230d61e5dfd2e1b1fbb436ac8917";

const API1_UID: &str = "3f1c2a4b_5d6e_4f70_8a9b_0c1d2e3f4a5b";
const WEB_UID: &str = "1b2c3d4e_5f60_4718_9a2b_3c4d5e6f7081";
const PROXY_UID: &str = "e5f6a7b8_c9d0_4e1f_8a2b_3c4d5e6f7a8b";
const NEW_UID: &str = "0f9e8d7c_6b5a_4938_a7b6_c5d4e3f2a1b0";
const REPORT_UID: &str = "6d5c4b3a_2918_4f7e_8d6c_5b4a39281706";

fn testdata(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/daemon/kubernetes/testdata")
        .join(name);
    fs::read_to_string(&path).expect("fixture")
}

struct Reply {
    code: u16,
    body: String,
}

/// A one-request-at-a-time HTTP server; [`FakeApi::next`] returns the request target,
/// [`FakeApi::reply`] answers it.
struct FakeApi {
    url: String,
    /// Request target and `Authorization` header of each request.
    requests: Receiver<(String, Option<String>)>,
    replies: Sender<Reply>,
}

impl FakeApi {
    fn start() -> FakeApi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (request_tx, requests) = mpsc::channel();
        let (replies, reply_rx) = mpsc::channel::<Reply>();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut request_line = String::new();
                reader.read_line(&mut request_line).expect("request line");
                let mut authorization = None;
                loop {
                    let mut header = String::new();
                    let n = reader.read_line(&mut header).expect("header");
                    if n == 0 || header == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = header.split_once(':')
                        && name.eq_ignore_ascii_case("authorization")
                    {
                        authorization = Some(value.trim().to_owned());
                    }
                }
                let target = request_line.split(' ').nth(1).unwrap_or("").to_owned();
                if request_tx.send((target, authorization)).is_err() {
                    return;
                }
                let Ok(reply) = reply_rx.recv() else { return };
                let reason = if reply.code == 200 { "OK" } else { "Error" };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{}",
                    reply.code,
                    reply.body.len(),
                    reply.body
                );
            }
        });
        FakeApi {
            url,
            requests,
            replies,
        }
    }

    fn next(&self) -> String {
        self.next_with_auth().0
    }

    fn next_with_auth(&self) -> (String, Option<String>) {
        self.requests.recv_timeout(WAIT).expect("a request")
    }

    fn reply(&self, code: u16, body: String) {
        self.replies
            .send(Reply { code, body })
            .expect("server running");
    }

    /// Answers a list request as the API server does: only the pods of the node named in
    /// the `fieldSelector`.
    fn reply_list(&self, target: &str, fixture: &str) {
        let node = query(target, "fieldSelector")
            .and_then(|s| s.strip_prefix("spec.nodeName=").map(str::to_owned))
            .expect("a spec.nodeName field selector");
        let mut list: serde_json::Value =
            serde_json::from_str(&testdata(fixture)).expect("fixture JSON");
        let items = list["items"].as_array_mut().expect("items");
        items.retain(|pod| pod["spec"]["nodeName"] == node.as_str());
        self.reply(200, list.to_string());
    }
}

/// A query parameter, percent-decoded.
fn query(target: &str, key: &str) -> Option<String> {
    let (_, query) = target.split_once('?')?;
    let value = query
        .split('&')
        .find_map(|pair| pair.strip_prefix(&format!("{key}=")))?;
    let mut out = Vec::new();
    let bytes = value.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("hex");
            out.push(u8::from_str_radix(hex, 16).expect("hex"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(String::from_utf8(out).expect("UTF-8"))
}

fn expect_list(target: &str) {
    assert!(target.starts_with("/api/v1/pods?"), "{target}");
    assert_eq!(query(target, "watch"), None, "{target}");
}

fn expect_watch(target: &str, resource_version: &str) {
    assert!(target.starts_with("/api/v1/pods?"), "{target}");
    assert_eq!(query(target, "watch").as_deref(), Some("1"), "{target}");
    assert_eq!(
        query(target, "allowWatchBookmarks").as_deref(),
        Some("true")
    );
    assert_eq!(
        query(target, "fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
    assert_eq!(
        query(target, "resourceVersion").as_deref(),
        Some(resource_version),
        "{target}"
    );
}

/// A node's `/proc` and cgroup v2 tree (systemd driver; containerd, and CRI-O for the
/// batch pod).
struct FakeHost {
    _dir: tempfile::TempDir,
    host: HostPaths,
}

fn scope(qos: &str, uid: &str, name: &str) -> String {
    let qos_slice = format!("kubepods-{qos}.slice");
    format!("/kubepods.slice/{qos_slice}/kubepods-{qos}-pod{uid}.slice/{name}")
}

impl FakeHost {
    fn new() -> FakeHost {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = HostPaths {
            proc_root: dir.path().join("proc"),
            cgroup_root: dir.path().join("cgroup"),
        };
        let server = scope(
            "burstable",
            API1_UID,
            &format!("cri-containerd-{API1_SERVER}.scope"),
        );
        let new_server = scope(
            "besteffort",
            NEW_UID,
            &format!("cri-containerd-{NEW_SERVER}.scope"),
        );
        let report = scope("besteffort", REPORT_UID, &format!("crio-{REPORT}.scope"));
        let processes: Vec<(u32, String)> = vec![
            (1, "/init.scope".to_owned()),
            (101, server.clone()),
            (102, server.clone()),
            (
                103,
                scope(
                    "burstable",
                    API1_UID,
                    &format!("cri-containerd-{API1_ENVOY}.scope"),
                ),
            ),
            (104, format!("{server}/worker")),
            (
                105,
                scope(
                    "burstable",
                    API1_UID,
                    &format!("cri-containerd-{API1_PAUSE}.scope"),
                ),
            ),
            (
                201,
                scope("burstable", WEB_UID, &format!("cri-containerd-{WEB}.scope")),
            ),
            (
                301,
                scope(
                    "besteffort",
                    PROXY_UID,
                    &format!("cri-containerd-{PROXY}.scope"),
                ),
            ),
            (401, new_server.clone()),
            (501, report),
            (
                502,
                scope(
                    "besteffort",
                    REPORT_UID,
                    &format!("crio-conmon-{REPORT}.scope"),
                ),
            ),
        ];
        for (pid, path) in &processes {
            fs::create_dir_all(host.cgroup_root.join(path.trim_start_matches('/')))
                .expect("cgroup dir");
            let proc_dir = host.proc_root.join(pid.to_string());
            fs::create_dir_all(&proc_dir).expect("proc dir");
            // PID 401 is read from inside the agent's own cgroup namespace.
            let shown = if *pid == 401 {
                new_server.replacen("/kubepods.slice", "/../../..", 1)
            } else {
                path.clone()
            };
            fs::write(proc_dir.join("cgroup"), format!("0::{shown}\n")).expect("cgroup file");
        }
        fs::create_dir_all(host.proc_root.join("self")).expect("self");
        fs::create_dir_all(host.proc_root.join("777")).expect("exited process");
        FakeHost { _dir: dir, host }
    }

    fn cgroup_id(&self, path: &str) -> u64 {
        let dir: PathBuf = self.host.cgroup_root.join(path.trim_start_matches('/'));
        fs::metadata(&dir).expect("cgroup dir").ino()
    }
}

fn wait_for(watcher: &PodWatcher, what: &str, done: impl Fn(&[Pod]) -> bool) {
    let deadline = Instant::now() + WAIT;
    let mut seen = watcher.generation();
    while !done(&watcher.current()) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "timed out waiting for {what}: {:?}",
            watcher.current()
        );
        seen = watcher.wait_for_change(seen, left.min(Duration::from_millis(200)));
    }
}

fn has(pods: &[Pod], name: &str) -> bool {
    pods.iter().any(|p| p.name == name)
}

/// (pod name, container, pids, cgroup ids) of each target.
type Summary = Vec<(String, String, Vec<u32>, Vec<u64>)>;

fn summary(selector: &KubernetesSelector, pods: &[Pod], host: &HostPaths) -> Summary {
    resolve_targets(selector, pods, host)
        .expect("targets")
        .into_iter()
        .map(|t| (t.pod_name, t.container, t.pids, t.cgroup_ids))
        .collect()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario, stage by stage; split up, its order would be harder to follow"
)]
fn selector_follows_list_and_watch() {
    let fake = FakeHost::new();
    let host = &fake.host;
    let api = FakeApi::start();
    let config = KubeConfig {
        api_url: api.url.clone(),
        node_name: "node-a".to_owned(),
        token_file: None,
        ca_file: None,
        watch_timeout: Duration::from_secs(5),
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    };
    let watcher = PodWatcher::spawn(config).expect("watcher");
    assert!(!watcher.is_synced());
    let api_server = selector(Some("prod"), &[("app", "api")], Some("server"));
    let server_scope = scope(
        "burstable",
        API1_UID,
        &format!("cri-containerd-{API1_SERVER}.scope"),
    );
    let new_scope = scope(
        "besteffort",
        NEW_UID,
        &format!("cri-containerd-{NEW_SERVER}.scope"),
    );

    // 1. The list: the node-a pods; the node-b replica and the pending one do not count.
    let target = api.next();
    expect_list(&target);
    assert_eq!(
        query(&target, "fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
    api.reply_list(&target, "podlist-two-nodes.json");
    let watch = api.next(); // the watcher is now blocked on its first watch
    expect_watch(&watch, "1000");
    assert!(watcher.is_synced());
    let pods = watcher.current();
    assert_eq!(pods.len(), 4, "{pods:?}");
    assert!(!has(&pods, "api-7d9f8b6c5d-p9w7z"), "a node-b pod");
    assert_eq!(
        summary(&api_server, &pods, host),
        [(
            "api-7d9f8b6c5d-x2k4q".to_owned(),
            "server".to_owned(),
            vec![101, 102, 104],
            sorted(vec![
                fake.cgroup_id(&server_scope),
                fake.cgroup_id(&format!("{server_scope}/worker")),
            ]),
        )]
    );
    let targets = resolve_targets(&api_server, &pods, host).expect("targets");
    assert_eq!(
        targets[0].cgroup_path.as_deref(),
        Some(server_scope.as_str())
    );
    assert_eq!(targets[0].pod_uid, "3f1c2a4b-5d6e-4f70-8a9b-0c1d2e3f4a5b");
    assert_eq!(
        targets[0].container_id.to_string(),
        format!("containerd://{API1_SERVER}")
    );
    // Without a container name: server and envoy; the pause container is no container.
    let whole_pod = summary(
        &selector(Some("prod"), &[("app", "api")], None),
        &pods,
        host,
    );
    let pid_lists: Vec<Vec<u32>> = whole_pod.iter().map(|t| t.2.clone()).collect();
    assert_eq!(pid_lists, [vec![103], vec![101, 102, 104]]);

    // 2. Watch: a new replica appears (pending, then running), the old one is deleted.
    api.reply(200, testdata("watch-add-then-delete.jsonl"));
    wait_for(
        &watcher,
        "the new pod running and the old one gone",
        |pods| {
            !has(pods, "api-7d9f8b6c5d-x2k4q")
                && pods
                    .iter()
                    .any(|p| p.name == "api-7d9f8b6c5d-m4n6b" && p.phase == "Running")
        },
    );
    assert_eq!(
        summary(&api_server, &watcher.current(), host),
        [(
            "api-7d9f8b6c5d-m4n6b".to_owned(),
            "server".to_owned(),
            vec![401],
            vec![fake.cgroup_id(&new_scope)],
        )],
        "PID 401's namespaced path is found by its container directory"
    );

    // 3. The next watch resumes after the last event, then expires (ERROR 410): relist.
    let target = api.next();
    expect_watch(&target, "1011");
    api.reply(200, testdata("watch-expired.jsonl"));
    let target = api.next();
    expect_list(&target);
    api.reply_list(&target, "podlist-after-relist.json");
    wait_for(&watcher, "the relisted batch pod", |pods| {
        has(pods, "report-28911520-7xk2p")
    });
    let any_api = selector(None, &[("app", "api")], None);
    assert_eq!(
        summary(&any_api, &watcher.current(), host),
        [
            (
                "api-7d9f8b6c5d-m4n6b".to_owned(),
                "server".to_owned(),
                vec![401],
                vec![fake.cgroup_id(&new_scope)],
            ),
            (
                "report-28911520-7xk2p".to_owned(),
                "worker".to_owned(),
                vec![501],
                vec![fake.cgroup_id(&scope(
                    "besteffort",
                    REPORT_UID,
                    &format!("crio-{REPORT}.scope")
                ))],
            ),
        ],
        "CRI-O's conmon (PID 502) is not the container"
    );

    // 4. HTTP 410 on the watch request itself → list; a 403 there → backoff, pods kept.
    let target = api.next();
    expect_watch(&target, "1450");
    api.reply(410, testdata("status-gone.json"));
    let target = api.next();
    expect_list(&target);
    let generation = watcher.generation();
    api.reply(
        403,
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods is forbidden","reason":"Forbidden","code":403}"#
            .to_owned(),
    );
    let target = api.next();
    expect_list(&target);
    let error = watcher.last_error().expect("the 403 is reported");
    assert!(
        error.contains("403") && error.contains("pods is forbidden"),
        "{error}"
    );
    assert_eq!(
        watcher.generation(),
        generation,
        "pods kept while the API fails"
    );
    assert!(has(&watcher.current(), "report-28911520-7xk2p"));
    api.reply_list(&target, "podlist-after-relist.json");
    let target = api.next();
    expect_watch(&target, "1450");
    assert_eq!(watcher.last_error(), None);

    // 5. A status-only update (the job finished) is kept but moves no generation: the
    //    daemon does not rescan /proc for it.
    let generation = watcher.generation();
    let list: serde_json::Value =
        serde_json::from_str(&testdata("podlist-after-relist.json")).expect("JSON");
    let mut report = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|p| p["metadata"]["name"] == "report-28911520-7xk2p")
        .expect("report pod")
        .clone();
    report["metadata"]["resourceVersion"] = "1460".into();
    report["status"]["phase"] = "Succeeded".into();
    let event = serde_json::json!({"type": "MODIFIED", "object": report});
    api.reply(200, format!("{event}\n"));
    let target = api.next();
    expect_watch(&target, "1460");
    assert_eq!(watcher.generation(), generation);
    let phase = watcher
        .current()
        .into_iter()
        .find(|p| p.name == "report-28911520-7xk2p")
        .map(|p| p.phase);
    assert_eq!(phase.as_deref(), Some("Succeeded"));
}

fn sorted(mut ids: Vec<u64>) -> Vec<u64> {
    ids.sort_unstable();
    ids
}

/// Projected service account tokens are rotated by the kubelet: every request reads the
/// file again.
#[test]
fn rotated_token_is_used_by_the_next_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    fs::write(&token, "first-token\n").expect("token");
    let api = FakeApi::start();
    let config = KubeConfig {
        api_url: api.url.clone(),
        node_name: "node-a".to_owned(),
        token_file: Some(token.clone()),
        ca_file: None,
        watch_timeout: Duration::from_secs(5),
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    };
    let watcher = PodWatcher::spawn(config).expect("watcher");
    let (target, auth) = api.next_with_auth();
    assert_eq!(auth.as_deref(), Some("Bearer first-token"));
    // Rotated the way the kubelet does it: a new file renamed over the old one.
    let next = dir.path().join("token.new");
    fs::write(&next, "second-token").expect("token");
    fs::rename(&next, &token).expect("rotate");
    api.reply_list(&target, "podlist-two-nodes.json");
    let (target, auth) = api.next_with_auth();
    expect_watch(&target, "1000");
    assert_eq!(auth.as_deref(), Some("Bearer second-token"));
    drop(watcher);
}

#[test]
fn service_account_ca_is_loaded() {
    let ca = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/daemon/kubernetes/testdata/ca.crt");
    let config = KubeConfig {
        api_url: "https://10.96.0.1:443".to_owned(),
        node_name: "node-a".to_owned(),
        token_file: None,
        ca_file: Some(ca),
        watch_timeout: Duration::from_secs(5),
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    };
    KubeClient::new(&config).expect("a PEM CA certificate is accepted");
}

#[test]
fn unreadable_proc_root_is_an_error() {
    let host = HostPaths {
        proc_root: PathBuf::from("/nonexistent/proc"),
        cgroup_root: PathBuf::from("/nonexistent/cgroup"),
    };
    let any = selector(None, &[], None);
    assert!(matches!(
        resolve_targets(&any, &[], &host),
        Err(KubeError::Read { .. })
    ));
}
