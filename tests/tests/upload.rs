//! Snapshots leave the node: the real agent uploads to a real S3 server (`SeaweedFS`, started
//! on loopback by `lookback_tests::s3`), and nothing is lost when the store or the agent
//! goes down. The objects are checked with another S3 client (`curl --aws-sigv4`) and the
//! traces with the independent `fxt` parser; `lookback snapshots list/get` read them back.
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use lookback_tests::{agent::Agent, can_run, lookback_bin, read_fxt, s3::S3Server};

/// A signal rule (one snapshot per `workload usr1` run) that uploads to `url`.
fn rules(url: &str, endpoint: &str, extra: &str) -> String {
    format!(
        "version: 1
defaults:
  capture: {{ backend: sampling, buffer_size: 256KiB }}
  snapshot: {{ cooldown: 0s, max_per_hour: 1000 }}
rules:
  - name: usr1
    target: {{ comm: workload }}
    trigger:
      signal: {{ signals: [SIGUSR1] }}
    output:
      upload: {{ url: '{url}', endpoint: '{endpoint}', allow_http: true{extra} }}
"
    )
}

/// The agent with the store's credentials, a node name, and `out` as its output root;
/// ready, unless `secret` replaces the right one (then it may never be).
fn agent(rules: &str, server: &S3Server, out: &Path, secret: Option<&str>) -> Agent {
    let mut env: Vec<(&str, &str)> = server.credentials().to_vec();
    if let Some(secret) = secret {
        env.retain(|(k, _)| *k != "AWS_SECRET_ACCESS_KEY");
        env.push(("AWS_SECRET_ACCESS_KEY", secret));
    }
    env.push(("NODE_NAME", "node-a"));
    let out = out.to_str().expect("utf-8");
    let mut agent = Agent::launch(rules, &["--output-dir", out], &env);
    // Rules loaded and a probe placed ... or refused by the store already.
    agent.wait_log("agent ready", Duration::from_secs(30));
    agent
}

/// The files of `dir` with `suffix`.
fn with_suffix(dir: &Path, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(suffix) && !n.ends_with(&format!(".json{suffix}")))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Waits until `lookback_uploads_total{rule=usr1,result=ok}` is `n`.
fn uploaded(agent: &mut Agent, n: f64) {
    agent.expect_metric(
        "lookback_uploads_total",
        &[("rule", "usr1"), ("result", "ok")],
        n,
    );
}

#[test]
fn each_trigger_gives_one_trace_and_one_metadata_object_under_the_layout() {
    if !can_run("each_trigger_gives_one_trace_and_one_metadata_object") {
        return;
    }
    let Some(server) = S3Server::start() else {
        return;
    };
    server.create_bucket("snaps");
    let out = tempfile::tempdir().expect("tempdir");
    let rules = rules("s3://snaps/fleet/lb", &server.endpoint(), "");
    let mut agent = agent(&rules, &server, out.path(), None);
    for _ in 0..3 {
        agent.run_workload(&["usr1"]);
    }
    agent.expect_metric(
        "lookback_snapshots_total",
        &[("rule", "usr1"), ("backend", "sampling"), ("result", "ok")],
        3.0,
    );
    uploaded(&mut agent, 3.0);
    agent.expect_metric("lookback_upload_queue_files", &[("rule", "usr1")], 0.0);
    let keys = server.keys("snaps");
    let spool = out.path().join("usr1");
    let stems: Vec<String> = with_suffix(&spool, ".json")
        .iter()
        .map(|n| n.trim_end_matches(".json").to_owned())
        .collect();
    assert_eq!(stems.len(), 3, "{stems:?}");
    let mut expected: Vec<String> = stems
        .iter()
        .flat_map(|s| {
            [
                format!("fleet/lb/node-a/usr1/{s}.fxt.gz"),
                format!("fleet/lb/node-a/usr1/{s}.json"),
            ]
        })
        .collect();
    expected.sort();
    // Exactly these: no .lbsnap without include_raw, nothing twice.
    assert_eq!(keys, expected);
    let tmp = tempfile::tempdir().expect("tempdir");
    for key in keys.iter().filter(|k| k.ends_with(".fxt.gz")) {
        let local = tmp.path().join("t.fxt.gz");
        std::fs::write(&local, server.get("snaps", key)).expect("write");
        if let Some(doc) = read_fxt(&local) {
            assert!(doc.to_string().contains("trigger: usr1"), "{key}: {doc}");
        }
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&server.get("snaps", &expected[1])).expect("metadata JSON");
    assert_eq!(meta["rule"], "usr1");
    assert_eq!(meta["trigger"]["signal"], "SIGUSR1");
    // Uploaded snapshots are marked in the spool; their files stay under retention.
    assert_eq!(with_suffix(&spool, ".uploaded").len(), 3);
    assert_eq!(with_suffix(&spool, ".lbsnap").len(), 3);
    // The CLI finds and fetches them with the same credentials.
    let cli = |args: &[&str]| {
        let out = Command::new(lookback_bin())
            .arg("snapshots")
            .args(args)
            .args(["--endpoint", &server.endpoint(), "--allow-http"])
            .envs(server.credentials())
            .output()
            .expect("lookback snapshots");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = cli(&[
        "list",
        "s3://snaps/fleet/lb",
        "--rule",
        "usr1",
        "--since",
        "1h",
        "--json",
    ]);
    let lines: Vec<serde_json::Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 3, "{listed}");
    assert!(
        lines
            .iter()
            .all(|l| l["node"] == "node-a" && l["comm"] == "workload")
    );
    assert!(cli(&["list", "s3://snaps/fleet/lb", "--node", "node-b"]).is_empty());
    let trace = lines[0]["trace"].as_str().expect("trace URL");
    let got = tmp.path().join("got.fxt.gz");
    cli(&["get", trace, "-o", got.to_str().expect("utf-8")]);
    assert_eq!(
        std::fs::read(&got).expect("downloaded"),
        std::fs::read(spool.join(format!("{}.fxt.gz", stems[0]))).expect("local")
    );
    agent.stop_ok();
}

#[test]
fn the_store_down_and_the_agent_restarted_lose_and_double_nothing() {
    if !can_run("the_store_down_and_the_agent_restarted_lose_and_double_nothing") {
        return;
    }
    let Some(mut server) = S3Server::start() else {
        return;
    };
    server.create_bucket("snaps");
    let out = tempfile::tempdir().expect("tempdir");
    let rules = rules("s3://snaps/p", &server.endpoint(), "");
    let mut first = agent(&rules, &server, out.path(), None);
    first.run_workload(&["usr1"]);
    uploaded(&mut first, 1.0);
    server.stop();
    first.run_workload(&["usr1"]);
    first.run_workload(&["usr1"]);
    first.expect_metric(
        "lookback_snapshots_total",
        &[("rule", "usr1"), ("backend", "sampling"), ("result", "ok")],
        3.0,
    );
    first.poll(Duration::from_secs(30), |a| {
        let errors = a.metric(
            "lookback_uploads_total",
            &[("rule", "usr1"), ("result", "error")],
        );
        let queued = a.metric("lookback_upload_queue_files", &[("rule", "usr1")]);
        if errors >= 1.0 && (queued - 4.0).abs() < 0.5 {
            Ok(())
        } else {
            Err(format!("{errors} failed uploads, {queued} files queued"))
        }
    });
    // A store that is down is not the agent's fault: still ready, still writing locally.
    assert_eq!(first.get("/readyz").0, 200);
    first.stop_ok();
    // A new agent on the same spool, the store back: the two waiting go up, once each.
    let mut second = agent(&rules, &server, out.path(), None);
    server.resume();
    uploaded(&mut second, 2.0);
    second.expect_metric("lookback_upload_queue_files", &[("rule", "usr1")], 0.0);
    let keys = server.keys("snaps");
    assert_eq!(keys.len(), 6, "{keys:?}");
    assert_eq!(keys.iter().filter(|k| k.ends_with(".fxt.gz")).count(), 3);
    second.stop_ok();
}

#[test]
fn wrong_credentials_and_a_missing_bucket_are_named_and_nothing_is_deleted() {
    if !can_run("wrong_credentials_and_a_missing_bucket_are_named") {
        return;
    }
    let Some(server) = S3Server::start() else {
        return;
    };
    server.create_bucket("snaps");
    for (url, secret, code) in [
        ("s3://no-such-bucket/x", None, "NoSuchBucket"),
        (
            "s3://snaps/x",
            Some("not-the-secret"),
            "SignatureDoesNotMatch",
        ),
    ] {
        let out = tempfile::tempdir().expect("tempdir");
        let rules = rules(url, &server.endpoint(), "");
        let mut agent = agent(&rules, &server, out.path(), secret);
        // Refused before the first snapshot needs the store: the check at start.
        let body = agent.wait_readyz(503, Duration::from_secs(30));
        assert!(body.contains(code) && body.contains("usr1"), "{body}");
        agent.run_workload(&["usr1"]);
        agent.expect_metric(
            "lookback_snapshots_total",
            &[("rule", "usr1"), ("backend", "sampling"), ("result", "ok")],
            1.0,
        );
        let body = agent.wait_readyz(503, Duration::from_secs(30));
        assert!(body.contains(code) && body.contains("usr1"), "{body}");
        assert!(
            agent.metric(
                "lookback_errors_total",
                &[("op", "upload"), ("errno", code)]
            ) >= 1.0
        );
        assert!(agent.log().contains(code), "{}", agent.log());
        // Kept locally: the trace, the raw snapshot, the metadata, no marker.
        let spool = out.path().join("usr1");
        assert_eq!(with_suffix(&spool, ".fxt.gz").len(), 1);
        assert_eq!(with_suffix(&spool, ".json").len(), 1);
        assert!(with_suffix(&spool, ".uploaded").is_empty());
        agent.stop_ok();
    }
    assert!(server.keys("snaps").is_empty());
}

#[test]
fn a_full_spool_while_the_store_is_down_drops_the_oldest_and_counts_it() {
    if !can_run("a_full_spool_while_the_store_is_down_drops_the_oldest") {
        return;
    }
    let Some(mut server) = S3Server::start() else {
        return;
    };
    server.stop();
    let out = tempfile::tempdir().expect("tempdir");
    // 1 byte: every snapshot but the newest is over the limit.
    let rules = rules("s3://snaps/x", &server.endpoint(), ", max_pending: 1");
    let mut agent = agent(&rules, &server, out.path(), None);
    for _ in 0..3 {
        agent.run_workload(&["usr1"]);
    }
    agent.expect_metric("lookback_upload_dropped_total", &[("rule", "usr1")], 2.0);
    let spool = out.path().join("usr1");
    let deadline = Instant::now() + Duration::from_secs(10);
    while with_suffix(&spool, ".json").len() != 1 {
        assert!(Instant::now() < deadline, "{:?}", with_suffix(&spool, ""));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(agent.get("/healthz").0, 200);
    assert_eq!(agent.get("/readyz").0, 200);
    assert!(agent.log().contains("dropped before their upload"));
    agent.stop_ok();
}
