//! The agent's HTTP endpoint against slow, hostile and many clients, and with TLS and
//! basic auth (issue: "the agent's HTTP endpoint holds under slow, hostile and many
//! clients"). The real agent; raw TCP clients for what no well-behaved client sends;
//! `curl` and `openssl` (Debian's) for TLS.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use lookback_tests::{agent::Agent, can_run, http_get, succeeded};

const RULES: &str = "\
version: 1
rules:
  - name: usr1
    target: { comm: workload }
    trigger: { signal: { signals: [SIGUSR1] } }
";

/// Raises this process's open-files limit to its hard limit (a thousand client sockets).
fn raise_open_files() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct we own.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit), 0);
    }
    assert!(
        limit.rlim_cur >= 1200,
        "open-files limit {}",
        limit.rlim_cur
    );
}

/// The number of open fds of process `pid`.
fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// A status answered within `limit` and how long it took, or a failure naming that.
fn timed_get(addr: &str, path: &str, limit: Duration) -> (u16, Duration) {
    let t0 = Instant::now();
    let (status, body) = http_get(addr, path);
    let took = t0.elapsed();
    assert!(took < limit, "{path} took {took:?} ({status} {body})");
    (status, took)
}

#[test]
fn a_thousand_slow_connections_never_keep_the_probes_waiting() {
    if !can_run("a_thousand_slow_connections_never_keep_the_probes_waiting") {
        return;
    }
    raise_open_files();
    let mut agent = Agent::start(RULES, &[]);
    let pid = agent.child.id();
    let addr = agent.addr().to_owned();
    // The agent's fds when idle (settled: its start-up is over).
    let mut baseline = fds_of(pid);
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(100));
        baseline = baseline.max(fds_of(pid));
    }
    // A thousand connections that send part of a request line, then nothing.
    let slow: Vec<TcpStream> = (0..1000)
        .map(|i| {
            let mut s = TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connection {i}: {e}"));
            s.write_all(b"GET /metr").expect("partial request line");
            s
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        for path in ["/healthz", "/readyz"] {
            let (status, took) = timed_get(&addr, path, Duration::from_secs(1));
            assert_eq!(status, 200, "{path}");
            slowest = slowest.max(took);
        }
    }
    let (status, body) = http_get(&addr, "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("lookback_http_connections"), "{body}");
    assert!(body.ends_with('\n') && body.contains("lookback_build_info"));
    // Most of the silent connections were shed to let the probes in; the rest are closed
    // by the header timeout.
    let shed = agent.metric("lookback_http_rejected_total", &[("reason", "shed")]);
    assert!(shed >= 700.0, "{shed} shed");
    let open = agent.metric("lookback_http_connections", &[]);
    assert!(open <= 320.0, "{open} connections open");
    // The figures docs/verification.md quotes.
    eprintln!("slowest of 20 probes {slowest:?}; {shed} shed; {open} open");
    drop(slow);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = fds_of(pid);
        if now <= baseline {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{now} fds, {baseline} before the connections"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    agent.stop_ok();
}

/// Sends `request` on a new connection and reads until the server closes it or
/// `limit` passes; the reply (possibly empty: closed without one).
fn raw(addr: &str, request: &[u8], limit: Duration) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(limit)).expect("timeout");
    // The server may close before it read everything: a failed send is an answer too.
    let _ = s.write_all(request);
    let t0 = Instant::now();
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
        }
        assert!(t0.elapsed() < limit, "no close after {limit:?}");
    }
    String::from_utf8_lossy(&reply).into_owned()
}

fn status_of(reply: &str) -> Option<u16> {
    reply
        .strip_prefix("HTTP/1.")?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[test]
fn hostile_and_odd_requests_get_their_answers_and_the_agent_stays_healthy() {
    if !can_run("hostile_and_odd_requests_get_their_answers") {
        return;
    }
    let mut agent = Agent::start(RULES, &[]);
    let addr = agent.addr().to_owned();
    let prompt = Duration::from_secs(3);
    // 10 KB of binary garbage: 400, closed.
    let garbage: Vec<u8> = (0..10_240u32)
        .map(|i| u8::try_from(i.wrapping_mul(2_654_435_761) >> 24).unwrap_or(0))
        .collect();
    let reply = raw(&addr, &garbage, prompt);
    assert!(matches!(status_of(&reply), Some(400) | None), "{reply}");
    // A 1 MB header, a 100 KB request line: too large, closed.
    let big_header = format!(
        "GET /metrics HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let reply = raw(&addr, big_header.as_bytes(), prompt);
    assert!(matches!(status_of(&reply), Some(431) | None), "{reply}");
    let long_line = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(100 * 1024));
    let reply = raw(&addr, long_line.as_bytes(), prompt);
    assert!(
        matches!(status_of(&reply), Some(414 | 431) | None),
        "{reply}"
    );
    // HTTP/1.0: answered, then closed.
    let reply = raw(&addr, b"GET /healthz HTTP/1.0\r\n\r\n", prompt);
    assert_eq!(status_of(&reply), Some(200), "{reply}");
    assert!(reply.ends_with("ok\n"), "{reply}");
    // HTTP/1.1 keep-alive: two requests on one connection.
    let reply = raw(
        &addr,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        prompt,
    );
    assert_eq!(reply.matches("HTTP/1.1 200 OK").count(), 2, "{reply}");
    // HEAD: the headers of GET, no body.
    let reply = raw(
        &addr,
        b"HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
        prompt,
    );
    assert_eq!(status_of(&reply), Some(200), "{reply}");
    let (head, body) = reply.split_once("\r\n\r\n").expect("head");
    assert!(body.is_empty(), "{body}");
    assert!(
        head.to_ascii_lowercase().contains("content-length: "),
        "{head}"
    );
    // An unknown path, a method other than GET and HEAD.
    assert_eq!(http_get(&addr, "/nope").0, 404);
    let reply = raw(
        &addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        prompt,
    );
    assert_eq!(status_of(&reply), Some(405), "{reply}");
    assert!(
        reply.to_ascii_lowercase().contains("allow: get, head"),
        "{reply}"
    );
    // Still healthy, and each kind of bad client counted.
    assert_eq!(http_get(&addr, "/healthz").0, 200);
    assert!(agent.metric("lookback_http_rejected_total", &[("reason", "bad_request")]) >= 1.0);
    assert!(agent.metric("lookback_http_rejected_total", &[("reason", "too_large")]) >= 2.0);
    agent.stop_ok();
}

/// A self-signed certificate for 127.0.0.1 in `dir` (`tls.crt`, `tls.key`, the names the
/// TLS overlay's Secret gives them).
fn certificate(dir: &Path) {
    succeeded(
        Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args([
                "-subj",
                "/CN=lookback-test",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .arg("-keyout")
            .arg(dir.join("tls.key"))
            .arg("-out")
            .arg(dir.join("tls.crt")),
    );
}

/// `curl` over TLS with the test CA: (status, body); status 0 when no HTTP answer came.
fn curl(dir: &Path, url: &str, user: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "5",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "--cacert",
    ])
    .arg(dir.join("tls.crt"));
    if let Some(user) = user {
        cmd.args(["-u", user]);
    }
    let out = cmd.arg(url).output().expect("curl (Debian package curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

#[test]
fn with_tls_and_basic_auth_only_the_right_credentials_scrape() {
    if !can_run("with_tls_and_basic_auth_only_the_right_credentials_scrape") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    certificate(dir.path());
    // The example the TLS overlay ships (deploy/kubernetes/tls/web.yml): refused as it is
    // (a placeholder where the hash goes), then served with a hash in its place.
    let example = std::fs::read_to_string(
        lookback_tests::workspace_root().join("deploy/kubernetes/tls/web.yml"),
    )
    .expect("deploy/kubernetes/tls/web.yml");
    let web = dir.path().join("web.yml");
    std::fs::write(&web, &example).expect("web.yml");
    let (code, stderr) = refused(dir.path(), &web);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("web.yml:11:3:") && stderr.contains("bcrypt"),
        "{stderr}"
    );
    let hash = bcrypt::hash("s3cret", 6).expect("bcrypt");
    std::fs::write(&web, example.replace("REPLACE-WITH-A-BCRYPT-HASH", &hash)).expect("web.yml");
    let web = web.to_str().expect("utf-8 path");
    let mut agent = Agent::launch(RULES, &["--web-config", web], &[]);
    let addr = agent.addr().to_owned();
    let url = |path: &str| format!("https://{addr}{path}");
    // Probes over TLS without credentials.
    let deadline = Instant::now() + Duration::from_secs(30);
    while curl(dir.path(), &url("/readyz"), None).0 != 200 {
        assert!(Instant::now() < deadline, "{}", agent.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(curl(dir.path(), &url("/healthz"), None).0, 200);
    // /metrics: the right credentials only.
    let (status, body) = curl(dir.path(), &url("/metrics"), Some("prometheus:s3cret"));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("lookback_build_info"), "{body}");
    assert_eq!(
        curl(dir.path(), &url("/metrics"), Some("prometheus:wrong")).0,
        401
    );
    assert_eq!(
        curl(dir.path(), &url("/metrics"), Some("someone:s3cret")).0,
        401
    );
    assert_eq!(curl(dir.path(), &url("/metrics"), None).0, 401);
    // Plain HTTP gets no HTTP answer.
    assert_eq!(http_get(&addr, "/healthz").0, 0);
    assert_eq!(curl(dir.path(), &url("/healthz"), None).0, 200);
    agent.stop_ok();
    // A web config with a key the toolkit has and lookback does not: exit 2, position.
    let bad = dir.path().join("bad.yml");
    std::fs::write(&bad, "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n").expect("bad.yml");
    let (code, stderr) = refused(dir.path(), &bad);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.yml:4:3:") && stderr.contains("cipher_suites"),
        "{stderr}"
    );
}

/// `lookback agent --web-config WEB` that must not start: (exit code, stderr).
fn refused(dir: &Path, web: &Path) -> (Option<i32>, String) {
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules.yaml");
    let out = Command::new(lookback_tests::lookback_bin())
        .args(["agent", "--metrics-addr", "127.0.0.1:0", "--config"])
        .arg(&rules)
        .arg("--web-config")
        .arg(web)
        .output()
        .expect("lookback agent");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
