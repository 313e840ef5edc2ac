//! The agent as users deploy it (issue: "the agent as users deploy it"): the image built
//! from `deploy/Dockerfile`, run with the `DaemonSet`'s settings read from
//! `deploy/kubernetes/daemonset.yaml` (hostPID, read-only root, its volumes, env and
//! capabilities), tracing programs in other containers; and the agent binary run on the
//! host with exactly the manifest's capability set (`setpriv`), since Debian's Docker
//! 20.10 cannot name `CAP_BPF` and `CAP_PERFMON` (the container gets `CAP_SYS_ADMIN` in
//! their place).
//!
//! Needs root and a container engine: Debian's `docker.io` (and `debootstrap` for the base
//! image), which `cargo xtask setup` installs; the engine is started here when it is not
//! running. Without one the tests are skipped with a message (a failure under CI).
#![expect(
    clippy::float_cmp,
    reason = "metric values are integer counts, exactly representable"
)]

use std::{
    collections::BTreeSet,
    io::Read as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use lookback_tests::{
    agent::Agent,
    containers::{AgentContainer, Docker, ManifestAgent, NODE_NAME, Workload, engine},
    lookback_bin, lookback_programs,
};
use serde_json::Value;

/// A crash (SIGSEGV), the slow calls of a function, and slow sleeps of processes under
/// the cgroup `cgroup` (a path prefix). Cooldown 0: every trigger is a snapshot.
fn rules(cgroup: &str) -> String {
    format!(
        "\
version: 1
rules:
  - name: crash
    target: {{ comm: lbwork }}
    trigger: {{ signal: {{ signals: [SIGSEGV] }} }}
    snapshot: {{ cooldown: 0s, max_per_hour: 1000 }}
    output: {{ format: chrome-json }}
  - name: slow-step
    target: {{ comm: lbwork }}
    trigger: {{ function: {{ symbol: slow_step, min_duration: 3ms }} }}
    snapshot: {{ cooldown: 0s, max_per_hour: 1000 }}
  - name: in-cgroup
    target: {{ cgroup: {cgroup} }}
    trigger: {{ syscall: {{ names: [clock_nanosleep, nanosleep], min_duration: 3ms }} }}
    snapshot: {{ cooldown: 0s, max_per_hour: 1000 }}
"
    )
}

/// `docker run --cgroup-parent` for the `in-cgroup` rule's containers, and the cgroup
/// path prefix their processes then have: a plain path under Docker's cgroupfs driver, a
/// slice under its systemd driver (the default on cgroup v2-only hosts).
fn cgroup_parent(docker: &Docker) -> (&'static str, &'static str) {
    if docker.ok(&["info", "-f", "{{.CgroupDriver}}"]) == "systemd" {
        ("lookback_test_cg.slice", "/lookback_test_cg.slice")
    } else {
        ("/lookback-test-cg", "/lookback-test-cg")
    }
}

/// The metadata `.json` files of `rule` under `out`, parsed, oldest first.
fn snapshots(out: &Path, rule: &str) -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out.join(rule))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .map(|f| {
            serde_json::from_str(&std::fs::read_to_string(f).expect("metadata"))
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        })
        .collect()
}

/// Waits until `rule` has `n` snapshots under `out`; fails with `log()` after a minute.
fn wait_snapshots(out: &Path, rule: &str, n: usize, log: &dyn Fn() -> String) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        let found = snapshots(out, rule);
        if found.len() >= n {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{rule}: {} of {n} snapshots; log:\n{}",
            found.len(),
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The frames of `meta`'s module whose path ends in `/lbwork`: (frames, unknown).
fn lbwork_frames(meta: &Value) -> (u64, u64) {
    meta["symbols"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["module"].as_str().is_some_and(|m| m.ends_with("/lbwork")))
        .fold((0, 0), |(f, u), s| {
            (
                f + s["frames"].as_u64().unwrap_or(0),
                u + s["unknown"].as_u64().unwrap_or(0),
            )
        })
}

/// The trigger stack's function names, leaf first.
fn trigger_functions(meta: &Value) -> Vec<String> {
    meta["trigger_stack"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| f["function"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// The crash: named from the faulting function down, 0 unknown frames in the program's
/// own binary (its container is removed before the snapshot is read), the origin names
/// the container, its cgroup and the node, the process track the container.
fn check_crash(meta: &Value, trace: &Path, container_id: &str) {
    let stack = trigger_functions(meta);
    assert!(
        stack.len() >= 2 && stack[0] == "parse_record" && stack[1] == "main",
        "trigger stack {stack:?} in {meta}"
    );
    let (frames, unknown) = lbwork_frames(meta);
    assert!(
        frames > 0 && unknown == 0,
        "lbwork: {unknown} of {frames} frames unknown: {meta}"
    );
    let origin = &meta["origin"];
    assert_eq!(origin["container_id"], container_id, "{meta}");
    assert_eq!(origin["node"], NODE_NAME);
    assert!(
        origin["cgroup"]
            .as_str()
            .is_some_and(|c| c.contains(container_id)),
        "{origin}"
    );
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(trace).expect("trace"))
        .read_to_string(&mut text)
        .expect("gzip JSON");
    let doc: Value = serde_json::from_str(&text).expect("JSON trace");
    let pid = meta["pid"].as_u64().expect("pid");
    let want = format!("lbwork [{pid}] (container {})", &container_id[..12]);
    let names: Vec<&str> = doc["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(names.contains(&want.as_str()), "{want} not in {names:?}");
}

/// A metric of the agent under test: name and labels → value (0 when absent).
type Metric<'a> = &'a dyn Fn(&str, &[(&str, &str)]) -> f64;

/// The agent under test, as `exercise` drives it.
struct Under<'a> {
    out: &'a Path,
    metric: Metric<'a>,
    log: &'a dyn Fn() -> String,
    /// Stops (`true`) or resumes (`false`) the agent: `docker pause`, `SIGSTOP`.
    pause: &'a dyn Fn(bool),
}

/// Runs the crash, two short-lived programs and the cgroup pair against `agent`; asserts
/// every outcome.
fn exercise(docker: &'static Docker, agent: &Under<'_>) {
    let (out, metric, log) = (agent.out, agent.metric, agent.log);
    // A program in another container that segfaults, its container removed before the
    // agent hears of the crash: the agent is stopped once it traces the process (it
    // secured the process's files then), and resumed only after the container is gone.
    let crash = Workload::run(docker, &[], &["crash", "400"]);
    let pid = docker.ok(&["inspect", "-f", "{{.State.Pid}}", &crash.id]);
    let traced = format!("tracing process {pid} (lbwork)");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log().contains(&traced) {
        assert!(Instant::now() < deadline, "{traced} not logged:\n{}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
    (agent.pause)(true);
    let code = crash.wait();
    let crash_id = crash.id.clone();
    drop(crash);
    let gone = docker.output(&["inspect", &crash_id]);
    (agent.pause)(false);
    assert_eq!(code, 139, "lbwork crash dies of SIGSEGV");
    assert!(!gone.status.success(), "container {crash_id} still there");
    let metas = wait_snapshots(out, "crash", 1, log);
    let trace = out.join("crash").join(
        metas[0]["trace_file"]
            .as_str()
            .expect("trace_file in the metadata"),
    );
    check_crash(&metas[0], &trace, &crash_id);

    // Short-lived programs (< 100 ms) in containers: every slow call fires, every
    // snapshot named. A longer-lived process of the same binary (the image layer's file)
    // has it probed first, so the probe is in place from their first instruction: a
    // binary never seen before is probed only once its first process's exec event is
    // handled (~10-20 ms here; calls before that count in
    // lookback_function_probes_late_total).
    let warm = Workload::run(docker, &[], &["sleeps", "10", "20"]);
    assert_eq!(warm.wait(), 0);
    wait_metric(metric, "lookback_probes_attached", "slow-step", 2.0, log);
    let mut ids = BTreeSet::new();
    let mut probes = Vec::new();
    for _ in 0..2 {
        let run = Workload::run(docker, &[], &["steps", "3", "6"]);
        assert_eq!(run.wait(), 0, "lbwork steps exits 0");
        let logs = docker.ok(&["logs", &run.id]);
        assert!(logs.contains("slow_calls=3"), "{logs}");
        ids.insert(run.id.clone());
        wait_snapshots(out, "slow-step", 3 * ids.len(), log);
        probes.push(metric("lookback_probes_attached", &[("rule", "slow-step")]));
    }
    // The second container's binary is the first's image-layer file behind another
    // overlay mount: its probe is already there, not placed twice.
    assert!(
        probes[0] >= 2.0 && probes[1] == probes[0],
        "probes: {probes:?}"
    );
    for reason in ["unwound", "unmatched_return"] {
        assert_eq!(
            metric(
                "lookback_function_calls_unmeasured_total",
                &[("rule", "slow-step"), ("reason", reason)]
            ),
            0.0,
            "{reason}: a probe placed twice sees every call twice"
        );
    }
    let metas = wait_snapshots(out, "slow-step", 6, log);
    assert_eq!(metas.len(), 6, "one snapshot per slow call");
    for meta in &metas {
        let (frames, unknown) = lbwork_frames(meta);
        assert!(
            frames > 0 && unknown == 0,
            "lbwork: {unknown} of {frames} unknown: {meta}"
        );
        let id = meta["origin"]["container_id"].as_str().unwrap_or("none");
        assert!(ids.contains(id), "origin {id} is none of {ids:?}");
    }
    assert_eq!(
        metric("lookback_triggers_total", &[("rule", "slow-step")]),
        6.0
    );

    // A rule selecting by cgroup: the container under the cgroup parent fires for each of
    // its 4 slow sleeps; the same program in a container outside it never does.
    let (parent, prefix) = cgroup_parent(docker);
    let inside = Workload::run(docker, &["--cgroup-parent", parent], &["sleeps", "4", "5"]);
    let outside = Workload::run(docker, &[], &["sleeps", "4", "5"]);
    assert_eq!(inside.wait(), 0);
    assert_eq!(outside.wait(), 0);
    let metas = wait_snapshots(out, "in-cgroup", 4, log);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        metric("lookback_triggers_total", &[("rule", "in-cgroup")]),
        4.0
    );
    for meta in &metas {
        assert_eq!(meta["origin"]["container_id"], inside.id.as_str(), "{meta}");
        assert!(
            meta["origin"]["cgroup"]
                .as_str()
                .is_some_and(|c| c.starts_with(&format!("{prefix}/"))),
            "{meta}"
        );
    }
}

/// Waits until `name{rule}` is at least `at_least`.
fn wait_metric(
    metric: Metric<'_>,
    name: &str,
    rule: &str,
    at_least: f64,
    log: &dyn Fn() -> String,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(name, &[("rule", rule)]) < at_least {
        assert!(
            Instant::now() < deadline,
            "{name}{{rule={rule}}} < {at_least}; log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until no lookback program is loaded (the kernel frees them once their last fd
/// is closed, after an RCU grace period); the ones still loaded.
fn programs_left() -> Vec<String> {
    let mut left = lookback_programs();
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        left = lookback_programs();
    }
    left
}

#[test]
fn the_agent_container_traces_other_containers_as_the_manifest_runs_it() {
    let Some(docker) = engine("the_agent_container_traces_other_containers") else {
        return;
    };
    assert!(
        programs_left().is_empty(),
        "lookback programs already loaded"
    );
    let (_, prefix) = cgroup_parent(docker);
    let agent = AgentContainer::start(docker, &rules(prefix));
    eprintln!(
        "agent container {} with capabilities {:?} (manifest: {:?})",
        agent.name,
        agent.capabilities,
        ManifestAgent::read().capabilities
    );
    // `kubectl exec ... lookback check` in the pod: what its capabilities allow.
    let check = docker.output(&[
        "exec",
        &agent.name,
        "/usr/local/bin/lookback",
        "check",
        "--json",
    ]);
    let report: Value = serde_json::from_slice(&check.stdout).unwrap_or_else(|e| {
        panic!(
            "lookback check in the container: {e}: {}",
            String::from_utf8_lossy(&check.stderr)
        )
    });
    for kind in ["function", "syscall", "signal"] {
        assert_eq!(
            report["rule_kinds"][kind]["ok"], true,
            "{kind}: {}",
            report["rule_kinds"][kind]
        );
    }
    exercise(
        docker,
        &Under {
            out: &agent.out(),
            metric: &|name, labels| agent.metric(name, labels),
            log: &|| agent.log(),
            pause: &|stop| {
                docker.ok(&[if stop { "pause" } else { "unpause" }, &agent.name]);
            },
        },
    );
    // `docker stop`: SIGTERM detaches everything, exit 0, nothing left in the kernel.
    assert_eq!(agent.stop(), 0, "exit code; log:\n{}", agent.log());
    let left = programs_left();
    assert!(left.is_empty(), "programs left behind: {left:?}");
    assert_eq!(lookback_links(), 0, "uprobe_multi links left behind");
}

#[test]
fn a_restarted_agent_container_places_each_probe_once_and_counts_exactly() {
    let Some(docker) = engine("a_restarted_agent_container_places_each_probe_once") else {
        return;
    };
    let rules = "\
version: 1
rules:
  - name: slow-step
    target: { comm: lbwork }
    trigger: { function: { symbol: slow_step, min_duration: 3ms } }
    snapshot: { cooldown: 0s, max_per_hour: 1000 }
";
    let mut agent = AgentContainer::start(docker, rules);
    let run = |agent: &AgentContainer| {
        // A first process of the binary has it probed (see `exercise`).
        let warm = Workload::run(docker, &[], &["sleeps", "10", "20"]);
        assert_eq!(warm.wait(), 0);
        wait_metric(
            &|n, l| agent.metric(n, l),
            "lookback_probes_attached",
            "slow-step",
            2.0,
            &|| agent.log(),
        );
        let w = Workload::run(docker, &[], &["steps", "3", "6"]);
        assert_eq!(w.wait(), 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        while agent.metric("lookback_triggers_total", &[("rule", "slow-step")]) < 3.0 {
            assert!(Instant::now() < deadline, "{}", agent.log());
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    run(&agent);
    let probes = agent.metric("lookback_probes_attached", &[("rule", "slow-step")]);
    assert!(probes >= 2.0, "entry and exit probes: {probes}");
    let links_before = lookback_links();
    agent.restart();
    agent.wait_readyz(200, Duration::from_mins(1));
    // The old process's programs and links are gone, the new one's are as many.
    run(&agent);
    assert_eq!(
        agent.metric("lookback_triggers_total", &[("rule", "slow-step")]),
        3.0,
        "exactly the new run's calls after the restart"
    );
    assert_eq!(
        agent.metric("lookback_probes_attached", &[("rule", "slow-step")]),
        probes,
        "the same probes as before the restart"
    );
    assert_eq!(lookback_links(), links_before, "no duplicate uprobe links");
    assert_eq!(agent.stop(), 0);
    assert!(programs_left().is_empty());
}

/// The `uprobe_multi` links of lookback's function programs on the machine.
fn lookback_links() -> usize {
    let ours: BTreeSet<u32> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            p.name_as_str().is_some_and(|n| {
                ["function_entry", "function_exit", "function_return"].contains(&n)
            })
        })
        .map(|p| p.id())
        .collect();
    aya::programs::loaded_links()
        .filter_map(Result::ok)
        .filter(|l| {
            matches!(
                l.link_type(),
                Ok(aya::programs::links::LinkType::UProbeMulti)
            ) && ours.contains(&l.program_id())
        })
        .count()
}

#[test]
fn an_unplaceable_probe_makes_the_agent_container_not_ready_with_the_reason() {
    let Some(docker) = engine("an_unplaceable_probe_makes_the_agent_container_not_ready") else {
        return;
    };
    let rules = "\
version: 1
rules:
  - name: missing
    target: { comm: lbwork }
    trigger: { function: { symbol: no_such_function, min_duration: 1ms } }
";
    let mut agent = AgentContainer::start(docker, rules);
    // Not ready while the rule has a target its probe cannot be placed in (5 s).
    let w = Workload::run(docker, &[], &["sleeps", "200", "25"]);
    let body = agent.wait_readyz(503, Duration::from_secs(30));
    assert!(
        body.contains("missing") && body.contains("no_such_function"),
        "/readyz: {body}"
    );
    assert_eq!(
        agent.metric(
            "lookback_rule_probe_errors",
            &[("rule", "missing"), ("reason", "symbol_not_found")]
        ),
        1.0
    );
    drop(w);
    assert_eq!(agent.stop(), 0);
}

/// `setpriv` with the manifest's capabilities as the bounding set (root, every other
/// capability dropped at exec), in front of `lookback`.
fn under_manifest_caps() -> Vec<String> {
    vec![
        "setpriv".to_owned(),
        "--inh-caps=-all".to_owned(),
        format!(
            "--bounding-set={}",
            ManifestAgent::read().setpriv_bounding_set()
        ),
        "--".to_owned(),
    ]
}

#[test]
fn with_exactly_the_manifests_capabilities_every_rule_kind_works() {
    let Some(docker) = engine("with_exactly_the_manifests_capabilities") else {
        return;
    };
    let prefix = under_manifest_caps();
    // `lookback check` with those capabilities: every rule kind can be installed.
    let out = Command::new(&prefix[0])
        .args(&prefix[1..])
        .arg(lookback_bin())
        .args(["check", "--json"])
        .output()
        .expect("lookback check");
    let report: Value = serde_json::from_slice(&out.stdout).expect("check --json");
    let caps = &report["capabilities"];
    assert_eq!(caps["cap_sys_admin"], false, "{caps}");
    assert_eq!(caps["cap_bpf"], true, "{caps}");
    for kind in ["function", "syscall", "signal"] {
        assert_eq!(
            report["rule_kinds"][kind]["ok"], true,
            "{kind}: {}",
            report["rule_kinds"][kind]
        );
    }
    // The agent itself, on the host with those capabilities, tracing containers.
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let (_, cgroup) = cgroup_parent(docker);
    let mut agent = Agent::launch_under(&prefix, &rules(cgroup), &[], &[("NODE_NAME", NODE_NAME)]);
    agent.wait_readyz(200, Duration::from_mins(1));
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.child.id()))
        .expect("agent status");
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(str::trim)
        .expect("CapEff");
    eprintln!("agent on the host with CapEff {eff}");
    assert!(!agent.log().contains("cannot be placed"), "{}", agent.log());
    let out = agent.out();
    let pid = agent.child.id().to_string();
    exercise(
        docker,
        &Under {
            out: &out,
            metric: &|name, labels| agent.metric(name, labels),
            log: &|| agent.log(),
            pause: &|stop| {
                let signal = if stop { "-STOP" } else { "-CONT" };
                lookback_tests::succeeded(Command::new("kill").args([signal, &pid]));
            },
        },
    );
}

#[test]
fn without_multi_links_the_manifests_capabilities_say_why_function_rules_cannot_run() {
    if engine("without_multi_links_the_manifests_capabilities_say_why").is_none() {
        return;
    }
    let prefix = under_manifest_caps();
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    // Before Linux 6.16 (and stable kernels without that change) CAP_PERFMON opens a uprobe
    // perf event: then the rule works that way too.
    let out = Command::new(prefix[0])
        .args(&prefix[1..])
        .arg(lookback_bin())
        .args(["check", "--json"])
        .output()
        .expect("lookback check");
    let report: Value = serde_json::from_slice(&out.stdout).expect("check --json");
    let perf_uprobes = report["uprobes"]["ok"] == true;
    let mut agent = Agent::launch_under(
        &prefix,
        &rules("/lookback-test-cg"),
        &[],
        &[("LOOKBACK_UPROBE_ATTACH", "perf-event")],
    );
    if perf_uprobes {
        agent.wait_readyz(200, Duration::from_mins(1));
        return;
    }
    let body = agent.wait_readyz(503, Duration::from_mins(1));
    assert!(
        body.contains("slow-step") && body.contains("CAP_SYS_ADMIN"),
        "/readyz: {body}"
    );
    assert_eq!(
        agent.metric(
            "lookback_rule_probe_errors",
            &[("rule", "slow-step"), ("reason", "capability")]
        ),
        1.0
    );
}
