//! Real containers for the container tests (tests/tests/containers.rs): a Docker engine
//! (Debian's `docker.io`, started here when it is not running), a base image made from
//! `debootstrap --variant=minbase` + `docker import` (no registry is needed or reached),
//! the agent image built from `deploy/Dockerfile` itself, a workload image, and the agent
//! run the way `deploy/kubernetes/daemonset.yaml` runs it, read from that file.
#![expect(
    clippy::missing_panics_doc,
    reason = "test helpers: every failure is a test failure"
)]
#![expect(
    clippy::print_stderr,
    reason = "the harness says what it starts and skips"
)]

use std::{
    collections::BTreeMap,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use crate::{
    agent::{parse_metrics, series_value},
    is_root, lookback_bin, workspace_root,
};

/// The base image: Debian 12 minbase (glibc, libgcc: what the agent binary needs).
pub const BASE_IMAGE: &str = "lookback-test/base:bookworm";
/// The agent image, built from `deploy/Dockerfile` by [`agent_image`].
pub const AGENT_IMAGE: &str = "lookback-test/agent:dev";
/// The workload image ([`workload_image`]): the base plus `/usr/local/bin/lbwork`.
pub const WORKLOAD_IMAGE: &str = "lookback-test/lbwork:dev";
/// The node name the agent is given (`NODE_NAME`, the downward API's `spec.nodeName`).
pub const NODE_NAME: &str = "lookback-test-node";

/// The Docker client: Debian's (`/usr/bin/docker`, the engine's own version) when
/// installed, else the first on `PATH`.
#[derive(Debug)]
pub struct Docker {
    pub client: PathBuf,
}

impl Docker {
    /// `docker ARGS`, output captured.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.client);
        cmd.args(args).env("DOCKER_BUILDKIT", "1");
        cmd
    }

    /// `docker ARGS`, which must succeed; its stdout, trimmed.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.output(args);
        assert!(
            out.status.success(),
            "docker {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `docker ARGS`, whatever its outcome.
    pub fn output(&self, args: &[&str]) -> Output {
        self.cmd(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running docker {args:?}: {e}"))
    }

    /// Whether `docker image inspect IMAGE` finds it.
    pub fn has_image(&self, image: &str) -> bool {
        self.output(&["image", "inspect", image]).status.success()
    }

    /// The engine answers.
    fn engine_up(&self) -> bool {
        self.output(&["version", "--format", "{{.Server.Version}}"])
            .status
            .success()
    }

    /// Whether the engine knows capability `cap` by name (Docker 20.10 does not know
    /// `BPF` and `PERFMON`).
    pub fn knows_capability(&self, cap: &str) -> bool {
        let out = self.output(&[
            "run",
            "--rm",
            "--cap-drop",
            "ALL",
            "--cap-add",
            cap,
            BASE_IMAGE,
            "true",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        out.status.success() || !err.contains("unknown capability")
    }

    /// The first IP address of container `name`.
    pub fn ip_of(&self, name: &str) -> String {
        self.ok(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
            name,
        ])
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("container {name} has no IP address"))
        .to_owned()
    }
}

/// The engine, started when it is not running and the base image made when missing;
/// `None` (the test is skipped, with a message) where no engine can run here. Under CI
/// (`CI` set) a machine that cannot run one fails the test instead.
pub fn engine(test: &str) -> Option<&'static Docker> {
    static ENGINE: OnceLock<Result<Docker, String>> = OnceLock::new();
    let found = ENGINE.get_or_init(start_engine);
    match found {
        Ok(docker) => Some(docker),
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("{test}: no container engine under CI: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED {test}: no container engine: {why}");
            None
        }
    }
}

fn start_engine() -> Result<Docker, String> {
    if !is_root() {
        return Err("needs root (dockerd, BPF)".to_owned());
    }
    let client = ["/usr/bin/docker"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("docker"));
    let docker = Docker { client };
    if !docker.engine_up() {
        let dockerd = ["/usr/sbin/dockerd", "/usr/bin/dockerd"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or(
                "dockerd not installed (Debian package docker.io; cargo xtask setup installs it)",
            )?;
        let log_path = workspace_root().join("target/dockerd.log");
        let log = std::fs::File::create(&log_path).map_err(|e| format!("dockerd log: {e}"))?;
        let err = log.try_clone().map_err(|e| format!("dockerd log: {e}"))?;
        eprintln!(
            "starting {} (log: {})",
            dockerd.display(),
            log_path.display()
        );
        // Its own process group: it outlives this test process (the next test binary
        // uses it), like a service.
        Command::new(&dockerd)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", dockerd.display()))?;
        let deadline = Instant::now() + Duration::from_mins(1);
        while !docker.engine_up() {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                return Err(format!(
                    "dockerd did not answer within 60 s; its log ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    if !docker.has_image(BASE_IMAGE) {
        make_base_image(&docker)?;
    }
    // Agent containers an interrupted run left behind would hold BPF programs.
    let left = docker.ok(&["ps", "-aq", "--filter", "name=lookback-test-agent-"]);
    for id in left.split_whitespace() {
        let _ = docker.output(&["rm", "-f", id]);
    }
    Ok(docker)
}

/// `debootstrap --variant=minbase bookworm` into a temporary directory, imported as
/// [`BASE_IMAGE`] (about a minute; once per machine).
fn make_base_image(docker: &Docker) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let root = dir.path().join("rootfs");
    eprintln!("making {BASE_IMAGE} with debootstrap (about a minute, once)");
    let status = Command::new("debootstrap")
        .args(["--variant=minbase", "bookworm"])
        .arg(&root)
        .arg("http://deb.debian.org/debian")
        .stdout(Stdio::null())
        .status()
        .map_err(|e| {
            format!("running debootstrap (Debian package debootstrap; cargo xtask setup): {e}")
        })?;
    if !status.success() {
        return Err(format!("debootstrap failed: {status}"));
    }
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("tar: {e}"))?;
    let stdout = tar.stdout.ok_or("tar stdout")?;
    let out = docker
        .cmd(&["import", "-", BASE_IMAGE])
        .stdin(stdout)
        .output()
        .map_err(|e| format!("docker import: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "docker import: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// [`AGENT_IMAGE`]: `deploy/Dockerfile` built with `BuildKit`, `BASE_IMAGE` = the local
/// base, `BINARY=prebuilt` (the shipped stage, fed the `lookback` the other tests run);
/// built once per test process.
pub fn agent_image(docker: &Docker) -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let ctx = tempfile::tempdir().expect("tempdir");
        let bin = ctx.path().join("target/release/lookback");
        std::fs::create_dir_all(bin.parent().expect("parent")).expect("mkdir");
        std::fs::copy(lookback_bin(), &bin).expect("copying lookback into the context");
        let dockerfile = workspace_root().join("deploy/Dockerfile");
        docker.ok(&[
            "build",
            "-q",
            "-f",
            path(&dockerfile),
            "--build-arg",
            &format!("BASE_IMAGE={BASE_IMAGE}"),
            "--build-arg",
            "BINARY=prebuilt",
            "-t",
            AGENT_IMAGE,
            path(ctx.path()),
        ]);
    });
    AGENT_IMAGE
}

/// [`WORKLOAD_IMAGE`]: `tests/workloads/lbwork.c` compiled here (`-O1 -g
/// -fno-omit-frame-pointer`) and copied onto the base image; built once per test process.
/// Its binary lives only in the image's layer: gone from every path once the container
/// is removed.
pub fn workload_image(docker: &Docker) -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let ctx = tempfile::tempdir().expect("tempdir");
        let src = workspace_root().join("tests/workloads/lbwork.c");
        let bin = ctx.path().join("lbwork");
        let status = Command::new("cc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .expect("running cc (install gcc)");
        assert!(status.success(), "cc lbwork.c failed");
        std::fs::write(
            ctx.path().join("Dockerfile"),
            format!("FROM {BASE_IMAGE}\nCOPY lbwork /usr/local/bin/lbwork\n"),
        )
        .expect("Dockerfile");
        docker.ok(&["build", "-q", "-t", WORKLOAD_IMAGE, path(ctx.path())]);
    });
    WORKLOAD_IMAGE
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 paths")
}

/// What `deploy/kubernetes/daemonset.yaml` says about the agent's container, read from
/// the file so that the tests run what the manifest says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "one field per setting of the manifest, as it writes them"
)]
pub struct ManifestAgent {
    pub host_pid: bool,
    pub read_only_root: bool,
    pub drop_all: bool,
    /// `capabilities.add`, as written (`BPF`, `PERFMON`, ...).
    pub capabilities: Vec<String>,
    pub privileged: bool,
    /// `env`: plain values, and `NODE_NAME` from the downward API (`spec.nodeName`).
    pub env: Vec<(String, EnvValue)>,
    pub args: Vec<String>,
    /// `volumeMounts` with their volumes.
    pub mounts: Vec<Mount>,
    /// `resources.limits.memory`, as written (`1Gi`).
    pub memory_limit: Option<String>,
    pub metrics_port: u16,
}

/// An environment value of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    Value(String),
    /// `valueFrom.fieldRef.fieldPath`.
    Field(String),
}

/// A volume mount and where its volume comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub name: String,
    pub mount_path: String,
    pub read_only: bool,
    pub source: VolumeSource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    HostPath(String),
    ConfigMap(String),
    /// `emptyDir`, with its `sizeLimit` when given.
    EmptyDir(Option<String>),
}

impl ManifestAgent {
    /// Reads the agent container of `deploy/kubernetes/daemonset.yaml`.
    pub fn read() -> Self {
        let file = workspace_root().join("deploy/kubernetes/daemonset.yaml");
        let text = std::fs::read_to_string(&file).expect("daemonset.yaml");
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("daemonset.yaml is YAML");
        Self::from_doc(&doc)
    }

    fn from_doc(doc: &serde_yaml::Value) -> Self {
        let pod = &doc["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let security = &container["securityContext"];
        let strings = |v: &serde_yaml::Value| -> Vec<String> {
            v.as_sequence()
                .map(|s| {
                    s.iter()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let env = container["env"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let name = e["name"].as_str()?.to_owned();
                let value = match e["value"].as_str() {
                    Some(v) => EnvValue::Value(v.to_owned()),
                    None => EnvValue::Field(
                        e["valueFrom"]["fieldRef"]["fieldPath"].as_str()?.to_owned(),
                    ),
                };
                Some((name, value))
            })
            .collect();
        let volumes: BTreeMap<String, VolumeSource> = pod["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|v| {
                let name = v["name"].as_str()?.to_owned();
                let source = if let Some(p) = v["hostPath"]["path"].as_str() {
                    VolumeSource::HostPath(p.to_owned())
                } else if let Some(c) = v["configMap"]["name"].as_str() {
                    VolumeSource::ConfigMap(c.to_owned())
                } else if v.get("emptyDir").is_some() {
                    VolumeSource::EmptyDir(v["emptyDir"]["sizeLimit"].as_str().map(str::to_owned))
                } else {
                    return None;
                };
                Some((name, source))
            })
            .collect();
        let mounts = container["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let name = m["name"].as_str()?.to_owned();
                Some(Mount {
                    source: volumes.get(&name)?.clone(),
                    mount_path: m["mountPath"].as_str()?.to_owned(),
                    read_only: m["readOnly"].as_bool().unwrap_or(false),
                    name,
                })
            })
            .collect();
        let port = container["ports"]
            .as_sequence()
            .and_then(|p| p.first())
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(9464);
        Self {
            host_pid: pod["hostPID"].as_bool().unwrap_or(false),
            read_only_root: security["readOnlyRootFilesystem"]
                .as_bool()
                .unwrap_or(false),
            drop_all: strings(&security["capabilities"]["drop"]).contains(&"ALL".to_owned()),
            capabilities: strings(&security["capabilities"]["add"]),
            privileged: security["privileged"].as_bool().unwrap_or(false),
            env,
            args: strings(&container["args"]),
            mounts,
            memory_limit: container["resources"]["limits"]["memory"]
                .as_str()
                .map(str::to_owned),
            metrics_port: port,
        }
    }

    /// The capabilities for `setpriv --bounding-set` (`-all,+bpf,+perfmon,...`).
    pub fn setpriv_bounding_set(&self) -> String {
        let mut set = "-all".to_owned();
        for cap in &self.capabilities {
            set.push_str(",+");
            set.push_str(&cap.to_ascii_lowercase());
        }
        set
    }
}

/// `1Gi` → `1g`, `256Mi` → `256m` (Docker's units).
fn docker_size(k8s: &str) -> String {
    k8s.strip_suffix("Gi")
        .map(|n| format!("{n}g"))
        .or_else(|| k8s.strip_suffix("Mi").map(|n| format!("{n}m")))
        .unwrap_or_else(|| k8s.to_owned())
}

/// The agent in a container, started the way the manifest runs it; removed on drop.
pub struct AgentContainer {
    pub name: String,
    docker: &'static Docker,
    /// The rules file directory (the `ConfigMap`) and the node's `/var/lib/lookback`.
    pub dir: tempfile::TempDir,
    pub addr: String,
    /// How the manifest's capabilities were expressed to Docker (`BPF` → `SYS_ADMIN`
    /// where the engine does not know it), for the test's output.
    pub capabilities: Vec<String>,
}

impl AgentContainer {
    /// Writes `rules` as the `ConfigMap`'s `rules.yaml` and runs [`AGENT_IMAGE`] with the
    /// manifest's settings: `hostPID`, read-only root, every capability dropped and the
    /// manifest's added (those Docker 20.10 does not know by name — `BPF`, `PERFMON` —
    /// as `SYS_ADMIN`, which the kernel's checks accept in their place), its env
    /// (`NODE_NAME` = [`NODE_NAME`]), its volumes (`hostPath` as the same host path, the
    /// output `hostPath` as a directory of this test, the `ConfigMap` as a directory,
    /// `emptyDir` as tmpfs), its memory limit and its args. Waits for `/readyz` to say 200.
    pub fn start(docker: &'static Docker, rules: &str) -> Self {
        let mut agent = Self::launch(docker, rules);
        agent.wait_readyz(200, Duration::from_mins(1));
        agent
    }

    /// [`start`](Self::start) without waiting for readiness (only for the HTTP server).
    pub fn launch(docker: &'static Docker, rules: &str) -> Self {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let manifest = ManifestAgent::read();
        let image = agent_image(docker);
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("config");
        let out = dir.path().join("out");
        std::fs::create_dir_all(&config).expect("mkdir");
        std::fs::create_dir_all(&out).expect("mkdir");
        std::fs::write(config.join("rules.yaml"), rules).expect("rules.yaml");
        let name = format!(
            "lookback-test-agent-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.clone()];
        assert!(
            !manifest.privileged,
            "the manifest runs the agent unprivileged"
        );
        if manifest.host_pid {
            args.push("--pid=host".into());
        }
        if manifest.read_only_root {
            args.push("--read-only".into());
        }
        if manifest.drop_all {
            args.extend(["--cap-drop".into(), "ALL".into()]);
        }
        let mut capabilities = Vec::new();
        for cap in &manifest.capabilities {
            let given = if docker.knows_capability(cap) {
                cap.clone()
            } else {
                "SYS_ADMIN".to_owned()
            };
            if !capabilities.contains(&given) {
                capabilities.push(given);
            }
        }
        for cap in &capabilities {
            args.extend(["--cap-add".into(), cap.clone()]);
        }
        for (key, value) in &manifest.env {
            let value = match value {
                EnvValue::Value(v) => v.clone(),
                EnvValue::Field(f) if f == "spec.nodeName" => NODE_NAME.to_owned(),
                EnvValue::Field(f) => panic!("env {key}: fieldRef {f} not translated"),
            };
            args.extend(["-e".into(), format!("{key}={value}")]);
        }
        for m in &manifest.mounts {
            let ro = if m.read_only { ":ro" } else { "" };
            match &m.source {
                VolumeSource::HostPath(p) if p == "/var/lib/lookback" => {
                    args.extend([
                        "-v".into(),
                        format!("{}:{}{ro}", out.display(), m.mount_path),
                    ]);
                }
                VolumeSource::HostPath(p) => {
                    args.extend(["-v".into(), format!("{p}:{}{ro}", m.mount_path)]);
                }
                VolumeSource::ConfigMap(_) => {
                    args.extend([
                        "-v".into(),
                        format!("{}:{}{ro}", config.display(), m.mount_path),
                    ]);
                }
                VolumeSource::EmptyDir(limit) => {
                    let size = limit
                        .as_deref()
                        .map(|l| format!(":size={}", docker_size(l)))
                        .unwrap_or_default();
                    args.extend(["--tmpfs".into(), format!("{}{size}", m.mount_path)]);
                }
            }
        }
        if let Some(limit) = &manifest.memory_limit {
            args.extend(["--memory".into(), docker_size(limit)]);
        }
        args.push(image.to_owned());
        args.extend(manifest.args.iter().cloned());
        let run: Vec<&str> = args.iter().map(String::as_str).collect();
        docker.ok(&run);
        let addr = format!("{}:{}", docker.ip_of(&name), manifest.metrics_port);
        Self {
            name,
            docker,
            dir,
            addr,
            capabilities,
        }
    }

    /// The node's `/var/lib/lookback` (the output hostPath).
    pub fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// `docker logs`.
    pub fn log(&self) -> String {
        let out = self.docker.output(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `GET path` → (status, body); (0, "") when nothing answers.
    pub fn get(&self, path: &str) -> (u16, String) {
        crate::http_get(&self.addr, path)
    }

    /// Waits until `/readyz` answers `status`; returns its body.
    pub fn wait_readyz(&mut self, status: u16, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let (got, body) = self.get("/readyz");
            if got == status {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "/readyz {got} {body}, expected {status}; agent log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The value of metric `name` with exactly `labels`; 0 when absent.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "{body}");
        series_value(&parse_metrics(&body), name, labels).unwrap_or(0.0)
    }

    /// `docker stop` (SIGTERM, then the grace period); the container's exit code.
    pub fn stop(&self) -> i64 {
        self.docker.ok(&["stop", "-t", "30", &self.name]);
        self.docker
            .ok(&["inspect", "-f", "{{.State.ExitCode}}", &self.name])
            .parse()
            .expect("exit code")
    }

    /// `docker restart`: the same container, a new agent process.
    pub fn restart(&mut self) {
        self.docker.ok(&["restart", "-t", "30", &self.name]);
        self.addr = format!(
            "{}:{}",
            self.docker.ip_of(&self.name),
            self.addr.rsplit(':').next().unwrap_or("9464")
        );
    }
}

impl Drop for AgentContainer {
    fn drop(&mut self) {
        let _ = self.docker.output(&["rm", "-f", &self.name]);
    }
}

/// A workload container: `docker run -d [EXTRA] WORKLOAD_IMAGE lbwork ARGS...`, kept
/// (not `--rm`) until dropped so that its id and exit code can be read, then removed.
pub struct Workload {
    docker: &'static Docker,
    pub id: String,
}

impl Workload {
    /// Starts `lbwork ARGS` in a new container with the `docker run` options `extra`.
    pub fn run(docker: &'static Docker, extra: &[&str], args: &[&str]) -> Self {
        let image = workload_image(docker);
        let mut command = vec!["run", "-d"];
        command.extend(extra);
        command.push(image);
        command.push("lbwork");
        command.extend(args);
        let id = docker.ok(&command);
        Self { docker, id }
    }

    /// Waits for the container to exit; its exit code.
    pub fn wait(&self) -> i64 {
        self.docker
            .ok(&["wait", &self.id])
            .parse()
            .expect("exit code")
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.docker.output(&["rm", "-f", &self.id]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_is_read() {
        let m = ManifestAgent::read();
        assert!(m.host_pid && m.read_only_root && m.drop_all && !m.privileged);
        assert!(m.capabilities.contains(&"BPF".to_owned()), "{m:?}");
        assert!(m.setpriv_bounding_set().starts_with("-all,+"));
        assert!(
            m.env
                .iter()
                .any(|(k, v)| k == "NODE_NAME" && *v == EnvValue::Field("spec.nodeName".into()))
        );
        assert!(
            m.mounts
                .iter()
                .any(|mount| mount.mount_path == "/var/lib/lookback")
        );
        assert!(m.args.iter().any(|a| a.starts_with("--config=")));
    }

    #[test]
    fn metric_lines_are_found_by_labels() {
        let text = "# HELP x y\nlookback_triggers_total{rule=\"a\"} 3\n\
                    lookback_x{b=\"2\",a=\"1\"} 4.5\nlookback_y 7\n";
        let samples = parse_metrics(text);
        let value = |name, labels: &[(&str, &str)]| series_value(&samples, name, labels);
        assert_eq!(
            value("lookback_triggers_total", &[("rule", "a")]),
            Some(3.0)
        );
        assert_eq!(value("lookback_x", &[("a", "1"), ("b", "2")]), Some(4.5));
        assert_eq!(value("lookback_y", &[]), Some(7.0));
        assert_eq!(value("lookback_triggers_total", &[]), None);
    }

    #[test]
    fn kubernetes_sizes_become_dockers() {
        assert_eq!(docker_size("1Gi"), "1g");
        assert_eq!(docker_size("256Mi"), "256m");
        assert_eq!(docker_size("512"), "512");
    }
}
