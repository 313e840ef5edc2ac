//! Tests of the HTTP endpoint over real TCP on 127.0.0.1.
use std::{
    net::SocketAddr,
    sync::atomic::{AtomicUsize, Ordering},
    time::Instant,
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    sync::oneshot,
    task::JoinHandle,
};

use super::*;

struct Server {
    addr: SocketAddr,
    state: Arc<HttpState>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// Short timeouts and a small table so that the slow-client cases run quickly.
const TEST_LIMITS: Limits = Limits {
    header_timeout: Duration::from_secs(1),
    max_head_bytes: 8 * 1024,
    soft_cap: 8,
    hard_cap: 10,
    shutdown_grace: Duration::from_secs(1),
};

async fn start(state: HttpState) -> Server {
    let listener = bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let state = Arc::new(state);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_with(
        listener,
        Arc::clone(&state),
        async {
            let _ = stopped.await;
        },
        TEST_LIMITS,
    ));
    Server {
        addr,
        state,
        stop,
        task,
    }
}

fn state() -> HttpState {
    HttpState::new(Arc::new(Metrics::new("sampling").expect("registry")))
}

/// Status code, headers (lower-cased names), body of a raw exchange.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn parse_reply(raw: &[u8]) -> Reply {
    let text = String::from_utf8(raw.to_vec()).expect("utf-8 reply");
    let (head, body) = text.split_once("\r\n\r\n").expect("end of head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    assert!(status_line.starts_with("HTTP/1."), "{status_line}");
    let status = status_line[9..12].parse().expect("status code");
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(": ").expect("header");
            (n.to_ascii_lowercase(), v.to_owned())
        })
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

async fn exchange(addr: SocketAddr, request: &str) -> Reply {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read reply");
    parse_reply(&raw)
}

async fn get(addr: SocketAddr, path: &str) -> Reply {
    exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
    .await
}

#[tokio::test]
async fn metrics_are_served_in_the_text_format_after_a_refresh() {
    let refreshed = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&refreshed);
    let server = start(state().with_refresher(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    }))
    .await;
    server.state.metrics.set_rules_loaded(3);
    let r = get(server.addr, "/metrics").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    assert!(
        r.body.contains("# TYPE lookback_rules_loaded gauge"),
        "{}",
        r.body
    );
    assert!(r.body.contains("\nlookback_rules_loaded 3\n"), "{}", r.body);
    assert!(r.body.contains("lookback_build_info{"), "{}", r.body);
    assert_eq!(refreshed.load(Ordering::SeqCst), 1);
    // A query string is ignored.
    assert_eq!(get(server.addr, "/metrics?x=1").await.status, 200);
    assert_eq!(refreshed.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn healthz_and_readyz() {
    let server = start(state()).await;
    let r = get(server.addr, "/healthz").await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    let r = get(server.addr, "/readyz").await;
    assert_eq!((r.status, r.body.as_str()), (503, "starting\n"));
    server.state.readiness.set_not_ready("no probe attached");
    let r = get(server.addr, "/readyz").await;
    assert_eq!((r.status, r.body.as_str()), (503, "no probe attached\n"));
    server.state.readiness.set_ready();
    assert_eq!(get(server.addr, "/readyz").await.status, 200);
}

#[tokio::test]
async fn unknown_paths_methods_and_garbage() {
    let server = start(state()).await;
    assert_eq!(get(server.addr, "/").await.status, 404);
    assert_eq!(get(server.addr, "/metricsx").await.status, 404);
    let r = exchange(
        server.addr,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    assert_eq!(exchange(server.addr, "hello\r\n\r\n").await.status, 400);
    assert_eq!(
        exchange(server.addr, "GET / SPDY/3\r\n\r\n").await.status,
        400
    );
    // Bare LF line endings are accepted.
    assert_eq!(
        exchange(server.addr, "GET /healthz HTTP/1.0\n\n")
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn head_sends_headers_only() {
    let server = start(state()).await;
    let r = exchange(
        server.addr,
        "HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    let len: usize = r
        .header("content-length")
        .expect("content-length")
        .parse()
        .expect("number");
    assert!(len > 0);
}

#[tokio::test]
async fn oversized_headers_get_431_or_a_closed_connection() {
    let server = start(state()).await;
    let mut s = TcpStream::connect(server.addr).await.expect("connect");
    let request = format!(
        "GET /metrics HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(16 * 1024)
    );
    // The server may close before reading everything: a send error is acceptable.
    let _ = s.write_all(request.as_bytes()).await;
    let mut raw = Vec::new();
    match s.read_to_end(&mut raw).await {
        Ok(_) if raw.is_empty() => {}
        Ok(_) => assert_eq!(parse_reply(&raw).status, 431),
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
    }
}

#[tokio::test]
async fn a_slow_client_neither_blocks_others_nor_stays_forever() {
    let server = start(state()).await;
    let mut slow = TcpStream::connect(server.addr).await.expect("connect");
    slow.write_all(b"GET /metr").await.expect("send");
    let t0 = Instant::now();
    assert_eq!(get(server.addr, "/healthz").await.status, 200);
    assert!(
        t0.elapsed() < TEST_LIMITS.header_timeout,
        "{:?}",
        t0.elapsed()
    );
    // The slow one is closed once its head has not come in time.
    let mut raw = Vec::new();
    timeout(Duration::from_secs(5), slow.read_to_end(&mut raw))
        .await
        .expect("closed by the server")
        .expect("read");
    assert!(raw.is_empty(), "{}", String::from_utf8_lossy(&raw));
    settle(&server, "header_timeout", 1).await;
}

/// Waits until `lookback_http_rejected_total{reason}` is `n` (the connection task counts
/// it after the client sees the connection close).
async fn settle(server: &Server, reason: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = server.state.metrics.encode().expect("encode");
        let line = format!("lookback_http_rejected_total{{reason=\"{reason}\"}} {n}\n");
        if text.contains(&line) {
            return;
        }
        assert!(Instant::now() < deadline, "no {line} in\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn silent_connections_beyond_the_cap_are_shed_and_probes_answered() {
    let server = start(state()).await;
    let mut silent = Vec::new();
    for _ in 0..40 {
        let mut s = TcpStream::connect(server.addr).await.expect("connect");
        s.write_all(b"GET /he").await.expect("send");
        silent.push(s);
    }
    for _ in 0..5 {
        let t0 = Instant::now();
        assert_eq!(get(server.addr, "/readyz").await.status, 503);
        assert_eq!(get(server.addr, "/healthz").await.status, 200);
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "{:?}",
            t0.elapsed()
        );
    }
    // The oldest silent ones were closed to make room: 40 + 10 probes through 8 slots.
    let mut closed = 0;
    for s in &mut silent {
        let mut byte = [0u8; 1];
        if matches!(
            timeout(Duration::from_millis(50), s.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        ) {
            closed += 1;
        }
    }
    assert!(closed >= 40 - 8, "{closed} of 40 closed");
    let text = server.state.metrics.encode().expect("encode");
    assert!(
        !text.contains("lookback_http_rejected_total{reason=\"shed\"} 0\n"),
        "{text}"
    );
}

#[tokio::test]
async fn keep_alive_serves_several_requests_on_one_connection() {
    let server = start(state()).await;
    let mut s = TcpStream::connect(server.addr).await.expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut raw = Vec::new();
    timeout(Duration::from_secs(5), s.read_to_end(&mut raw))
        .await
        .expect("answered")
        .expect("read");
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(text.matches("HTTP/1.1 ").count(), 2, "{text}");
    assert!(
        text.contains("200 OK") && text.contains("503 Service Unavailable"),
        "{text}"
    );
}

#[tokio::test]
async fn shutdown_stops_accepting() {
    let server = start(state()).await;
    assert_eq!(get(server.addr, "/healthz").await.status, 200);
    server.stop.send(()).expect("server running");
    timeout(Duration::from_secs(5), server.task)
        .await
        .expect("serve returns")
        .expect("no panic");
    assert!(TcpStream::connect(server.addr).await.is_err());
}

#[tokio::test]
async fn bind_errors_name_the_address() {
    let taken = bind("127.0.0.1:0").await.expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let e = bind(&addr).await.expect_err("port in use");
    assert_eq!(e.to_string(), format!("cannot listen on {addr}"));
    assert!(std::error::Error::source(&e).is_some());
    let e = bind("not an address").await.expect_err("bad address");
    assert_eq!(e.to_string(), "cannot listen on not an address");
}
