//! `lookback agent` with Kubernetes selectors, as root: a container's cgroup made for the
//! test, the pod list from a replayed API server, real workloads moved into the cgroup.
#![allow(
    clippy::float_cmp,
    reason = "metric values are integer counts, exactly representable"
)]

use std::{
    io::{Read as _, Write as _},
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use lookback_tests::{agent::Agent, workload};

/// A cgroup v2 directory named like a containerd container of a Kubernetes pod, removed
/// (with its processes gone) on drop.
struct ContainerCgroup(PathBuf);

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Where the unified (v2) cgroup hierarchy is mounted: `/sys/fs/cgroup` on v2 hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones (like this project's CI machine).
fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .expect("a cgroup2 mount")
}

/// Serves `GET /api/v1/pods` with the recorded pod list and holds watch requests open
/// (no events), like an API server with nothing new to say.
fn fake_api_server(pods: String) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        let mut watches = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                request.push(byte[0]);
            }
            if String::from_utf8_lossy(&request).contains("watch=") {
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                );
                watches.push(stream);
            } else {
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{pods}",
                    pods.len()
                );
            }
        }
    });
    format!("http://{addr}")
}

#[test]
fn kubernetes_selectors_pick_the_processes_of_the_selected_container() {
    // The recorded pod list: pod api-...-x2k4q on node-a, its container `server` runs as
    // containerd container 571d86...
    let fixtures = lookback_tests::workspace_root().join("agent/src/daemon/kubernetes/testdata");
    let pods = std::fs::read_to_string(fixtures.join("podlist-two-nodes.json")).expect("fixture");
    let id = "571d86cad1a9dd89d096771fc32a0ba99ad5c80a6546d4ad5b7381050a1cb138";
    assert!(pods.contains(id));
    let api = fake_api_server(pods);
    // A real cgroup named as containerd names it under the systemd driver.
    let slice = cgroup2_mount().join(format!("lookback-test-{}.slice", std::process::id()));
    let cgroup = ContainerCgroup(slice.join(format!("cri-containerd-{id}.scope")));
    std::fs::create_dir_all(&cgroup.0).expect("creating a cgroup (cgroup v2, root)");
    let rules = r"
version: 1
defaults: { capture: { backend: sampling, buffer_size: 256KiB } }
rules:
  - name: pod-sleeps
    target: { kubernetes: { namespace: prod, pod_labels: { app: api }, container: server } }
    trigger: { syscall: { names: [nanosleep, clock_nanosleep], min_duration: 1ms } }
    snapshot: { cooldown: 0s, max_per_hour: 1000 }
";
    let mut agent = Agent::start_with_env(
        rules,
        &[],
        &[
            ("LOOKBACK_KUBE_API", api.as_str()),
            ("NODE_NAME", "node-a"),
            ("LOOKBACK_RESCAN_SECS", "1"),
        ],
    );
    agent.wait_log("1 container(s) selected", Duration::from_secs(20));
    // In the container: started inside the cgroup (as the runtime does), then exec'd.
    let procs = cgroup.0.join("cgroup.procs");
    let mut inside = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && exec {} --wait nanosleep 3 2000",
            procs.display(),
            workload().display()
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("sh");
    // Outside: the same program, not selected (run while the one inside waits).
    let bystander = Command::new(workload())
        .args(["nanosleep", "3", "2000"])
        .status()
        .expect("bystander");
    assert!(bystander.success());
    agent.release_when_traced(&mut inside);
    assert!(inside.wait().expect("wait").success());
    agent.expect_metric("lookback_triggers_total", &[("rule", "pod-sleeps")], 3.0);
    let ok = [
        ("rule", "pod-sleeps"),
        ("backend", "sampling"),
        ("result", "ok"),
    ];
    agent.expect_metric("lookback_snapshots_total", &ok, 3.0);
    // Once the container has had a process, a rescan (1 s here) puts its cgroup into the
    // kernel's target set: a process started there later is a target from its first
    // instruction, even one that sleeps right away (no --wait: nothing waits for the agent).
    let mut quick = Command::new("sh");
    quick.arg("-c").arg(format!(
        "echo $$ > {} && exec {} nanosleep 2 2000",
        procs.display(),
        workload().display()
    ));
    std::thread::sleep(Duration::from_millis(2500));
    assert!(quick.status().expect("sh").success());
    agent.expect_metric("lookback_triggers_total", &[("rule", "pod-sleeps")], 5.0);
    agent.stop_ok();
}
