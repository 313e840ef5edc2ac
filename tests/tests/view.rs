//! `lookback view FILE` as the Perfetto UI meets it: the link it prints, the CORS preflight,
//! a HEAD and a wrong path that leave it serving, then the GET that ends it; and its
//! refusals of a snapshot and of a missing file. No root needed.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use lookback_tests::{free_port, lookback_bin};

/// One response: status, headers (names lowercased) and body.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `METHOD PATH` with `extra` header lines to 127.0.0.1:`port` and reads the whole
/// response (the server closes every connection).
fn request(port: u16, method: &str, path: &str, extra: &[&str]) -> Response {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the server");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n");
    for line in extra {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("Connection: close\r\n\r\n");
    stream
        .write_all(head.as_bytes())
        .expect("sending the request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("reading the response");
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {:?}", String::from_utf8_lossy(raw)));
    let head = std::str::from_utf8(&raw[..split]).expect("an ASCII head");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Response {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

/// The child's status once it exits within `limit`, else kills it and fails.
fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waiting for lookback view") {
            return status;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lookback view still running {limit:?} after the GET");
        }
        sleep(Duration::from_millis(20));
    }
}

/// The trace bytes: every byte value, so a text-mode mangling would show.
fn trace_bytes() -> Vec<u8> {
    (0..=255u8).cycle().take(100_000).collect()
}

#[test]
fn view_serves_the_trace_to_the_perfetto_ui_and_exits_after_one_get() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("trace.fxt");
    let bytes = trace_bytes();
    std::fs::write(&file, &bytes).expect("writing the trace");
    let port = free_port();
    let mut child = Command::new(lookback_bin())
        .arg("view")
        .arg(&file)
        .args(["--port", &port.to_string(), "--no-open"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting lookback view");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut link = String::new();
    stdout.read_line(&mut link).expect("reading the link");
    assert_eq!(
        link.trim_end(),
        format!(
            "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/trace.fxt&referrer=lookback"
        )
    );

    let origin = "Origin: https://ui.perfetto.dev";
    let preflight = request(
        port,
        "OPTIONS",
        "/trace.fxt",
        &[origin, "Access-Control-Request-Method: GET"],
    );
    assert_eq!(preflight.status, 204);
    assert_eq!(
        preflight.header("access-control-allow-origin"),
        Some("https://ui.perfetto.dev")
    );
    let methods = preflight
        .header("access-control-allow-methods")
        .unwrap_or_default();
    assert!(methods.contains("GET"), "{methods}");
    let head = request(port, "HEAD", "/trace.fxt", &[origin]);
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-length"),
        Some(bytes.len().to_string().as_str())
    );
    assert!(head.body.is_empty(), "HEAD with a body");
    let wrong = request(port, "GET", "/wrong", &[origin]);
    assert_eq!(wrong.status, 404);
    assert_eq!(
        wrong.header("access-control-allow-origin"),
        Some("https://ui.perfetto.dev")
    );
    let not_allowed = request(port, "POST", "/trace.fxt", &[origin, "Content-Length: 0"]);
    assert_eq!(not_allowed.status, 405);
    assert!(
        not_allowed
            .header("allow")
            .unwrap_or_default()
            .contains("GET")
    );
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "lookback view exited before the trace was fetched"
    );

    let get = request(port, "GET", "/trace.fxt", &[origin]);
    assert_eq!(get.status, 200);
    assert_eq!(
        get.header("access-control-allow-origin"),
        Some("https://ui.perfetto.dev")
    );
    assert_eq!(
        get.header("content-length"),
        Some(bytes.len().to_string().as_str())
    );
    assert_eq!(get.header("content-type"), Some("application/octet-stream"));
    assert!(get.body == bytes, "the body differs from the file");
    let status = wait_exit(&mut child, Duration::from_secs(5));
    assert!(status.success(), "lookback view: {status}");
    drop(stdout);
}

/// Runs `lookback view` on `file` and returns its exit code and stderr.
fn refused(file: &Path) -> (Option<i32>, String) {
    let out = Command::new(lookback_bin())
        .arg("view")
        .arg(file)
        .args(["--port", &free_port().to_string(), "--no-open"])
        .output()
        .expect("running lookback view");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn view_refuses_a_snapshot_and_a_missing_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let snapshot = dir.path().join("x.lbsnap");
    std::fs::write(&snapshot, b"\x89LBSNAP\n").expect("writing the snapshot");
    let (code, stderr) = refused(&snapshot);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("lookback decode"), "{stderr}");

    let missing = dir.path().join("missing.fxt");
    let (code, stderr) = refused(&missing);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("missing.fxt"), "{stderr}");
}
