//! Daemon stage: the HTTP endpoint of `lookback agent` (`--metrics-addr`, default
//! 127.0.0.1:9464). In: TCP connections. Out: `/metrics` (the registry of
//! [`super::metrics::Metrics`], text format 0.0.4), `/healthz` (200 while the process runs),
//! `/readyz` (200 once the rules are installed and no function rule is left without
//! uprobes by a failed attach, else 503 with the reason: [`super::readiness`]).
//!
//! A deliberately small HTTP/1.1 server on tokio: one request per connection
//! (`Connection: close`), GET and HEAD only, no request bodies. Every connection runs in its
//! own task under a header size limit and a read deadline, and the number of open
//! connections is capped, so a slow or hostile client cannot hold up a Prometheus scrape or
//! exhaust file descriptors.
//!
//! Kernel-side counters are refreshed on scrape: [`HttpState::with_refresher`] installs a
//! hook run right before `/metrics` is encoded (typically
//! `metrics.refresh_from_engine(&engine.lock())`). It runs on a blocking-pool thread, so it
//! may take a `std::sync::Mutex`; it must not wait on a tokio lock.
use std::{
    future::Future,
    io,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
    time::timeout,
};

use super::metrics::Metrics;

/// The default of `--metrics-addr` (contract.md).
pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";

/// The content type of the Prometheus text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const TEXT: &str = "text/plain; charset=utf-8";

/// A failure to start the HTTP endpoint.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: io::Error,
    },
}

/// Binds the listener (host:port; a host name is resolved). Done before the daemon loads
/// anything, so that a taken port fails fast.
pub async fn bind(addr: &str) -> Result<TcpListener, HttpError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Listen {
            addr: addr.to_owned(),
            source,
        })
}

/// Whether the agent is ready (`/readyz`): not ready, with a reason, until the daemon says so.
#[derive(Debug)]
pub struct Readiness {
    /// `None` when ready, else why not.
    not_ready: Mutex<Option<String>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            not_ready: Mutex::new(Some("starting".to_owned())),
        }
    }
}

impl Readiness {
    /// Rules installed and every function rule that needs probes has some.
    pub fn set_ready(&self) {
        *self.lock() = None;
    }

    /// Not ready, e.g. "loading rules" or "no rule could be attached".
    pub fn set_not_ready(&self, reason: impl Into<String>) {
        *self.lock() = Some(reason.into());
    }

    /// `Ok` when ready, else the reason.
    pub fn status(&self) -> Result<(), String> {
        self.lock().clone().map_or(Ok(()), Err)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        // A plain value; a panic elsewhere cannot leave it half-written.
        self.not_ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A hook run before each `/metrics` encoding, to pull counters from the kernel.
pub type Refresher = Box<dyn Fn() + Send + Sync>;

/// What the server answers from: the metrics, the readiness, the scrape hook.
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    refresher: Option<Refresher>,
}

impl HttpState {
    /// Not ready ("starting") and without a scrape hook.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            readiness: Readiness::default(),
            refresher: None,
        }
    }

    /// Runs `refresh` before each scrape (on a blocking-pool thread).
    #[must_use]
    pub fn with_refresher(mut self, refresh: impl Fn() + Send + Sync + 'static) -> Self {
        self.refresher = Some(Box::new(refresh));
        self
    }
}

/// Limits that keep misbehaving clients cheap.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Request line and headers together; more is answered 431.
    pub max_header_bytes: usize,
    /// Time to receive the whole request head; a slower client gets 408.
    pub read_timeout: Duration,
    /// Time to send the response.
    pub write_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
}

impl Default for Limits {
    /// 8 KiB of headers, 5 s to send them, 10 s to take the response, 64 connections.
    fn default() -> Self {
        Self {
            max_header_bytes: 8 * 1024,
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            max_connections: 64,
        }
    }
}

/// Serves with the default [`Limits`] until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    state: Arc<HttpState>,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, state, shutdown, Limits::default()).await;
}

/// Serves until `shutdown` completes. Connections already accepted finish on their own
/// (each is bounded by the limits' timeouts).
pub async fn serve_with(
    listener: TcpListener,
    state: Arc<HttpState>,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    let mut reserve = FdReserve::open();
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break, // never closed
            },
        };
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    reserve.refill();
                    stream
                }
                Err(e) => {
                    if reserve.is_fd_limit(&e) {
                        // The agent is out of fds, which is when /readyz must still say so:
                        // the reserved fd is given up for this connection.
                        if reserve.release() {
                            continue;
                        }
                    } else {
                        log::warn!("metrics endpoint: accept: {e}");
                    }
                    // Back off rather than spin; a connection closed meanwhile frees an fd
                    // for the reserve.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    reserve.refill();
                    continue;
                }
            },
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            handle(stream, &state, limits).await;
            drop(permit);
        });
    }
}

/// One fd held in reserve (`/dev/null`) for the endpoint: when the agent reaches its
/// open-files limit (a node with more targets than `RLIMIT_NOFILE` allows for), `accept`
/// fails with `EMFILE` and the connection would wait in the backlog, unanswered, exactly
/// when `/readyz` has to report it. The reserve is closed to accept that connection and
/// taken again once an fd is free (nginx and libuv do the same).
struct FdReserve {
    file: Option<std::fs::File>,
    /// Out of fds since the last accept that did not need the reserve (logged once).
    starved: bool,
}

impl FdReserve {
    fn open() -> Self {
        let mut reserve = Self {
            file: None,
            starved: false,
        };
        reserve.refill();
        reserve
    }

    /// Takes the reserve again if it was given up and an fd is free.
    fn refill(&mut self) {
        if self.file.is_none() {
            self.file = std::fs::File::open("/dev/null").ok();
        } else if self.starved {
            self.starved = false;
            log::info!("metrics endpoint: file descriptors are available again");
        }
    }

    /// Whether `err` is the open-files limit; the first of an episode is logged.
    fn is_fd_limit(&mut self, err: &io::Error) -> bool {
        let limit = matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
        if limit && !self.starved {
            self.starved = true;
            log::warn!(
                "metrics endpoint: accept: {err}: answering from a reserved fd until fds are free"
            );
        }
        limit
    }

    /// Closes the reserve so that the next `accept` can have its fd; `false` when it was
    /// already given up.
    fn release(&mut self) -> bool {
        self.file.take().is_some()
    }
}

/// Why no complete request head arrived.
enum HeadError {
    TooLarge,
    Closed,
}

async fn read_head(stream: &mut TcpStream, max: usize) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_end(&head[from..]) {
            head.truncate(from + end);
            return Ok(head);
        }
        if head.len() > max {
            return Err(HeadError::TooLarge);
        }
    }
}

/// The offset just past the blank line ending a request head (`\r\n\r\n`, or `\n\n`).
fn find_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len()).find_map(|i| {
        let rest = &bytes[i..];
        if rest.starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if rest.starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

struct Response {
    status: &'static str,
    content_type: &'static str,
    body: String,
    allow: bool,
}

impl Response {
    fn text(status: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: TEXT,
            body: body.into(),
            allow: false,
        }
    }
}

async fn handle(mut stream: TcpStream, state: &Arc<HttpState>, limits: Limits) {
    let (response, head_only) = match timeout(
        limits.read_timeout,
        read_head(&mut stream, limits.max_header_bytes),
    )
    .await
    {
        Err(_) => (
            Response::text("408 Request Timeout", "request timeout\n"),
            false,
        ),
        Ok(Err(HeadError::TooLarge)) => (
            Response::text("431 Request Header Fields Too Large", "headers too large\n"),
            false,
        ),
        Ok(Err(HeadError::Closed)) => return,
        Ok(Ok(head)) => match parse_request_line(&head) {
            Some((method, path)) => (route(state, method, path).await, method == "HEAD"),
            None => (Response::text("400 Bad Request", "bad request\n"), false),
        },
    };
    let bytes = encode_response(&response, head_only);
    let sent = timeout(limits.write_timeout, async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    })
    .await;
    if !matches!(sent, Ok(Ok(()))) {
        return;
    }
    // Read what the client still sends until it closes (briefly), so that closing with
    // unread bytes does not reset the connection before the client read the response.
    let _ = timeout(Duration::from_secs(1), async {
        let mut sink = [0u8; 1024];
        let mut left = 64 * 1024_usize;
        while let Ok(n @ 1..) = stream.read(&mut sink).await {
            left = left.saturating_sub(n);
            if left == 0 {
                break;
            }
        }
    })
    .await;
}

/// Method and path (query string dropped) of an HTTP/1.x request line.
fn parse_request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") || method.is_empty() {
        return None;
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    Some((method, path))
}

async fn route(state: &Arc<HttpState>, method: &str, path: &str) -> Response {
    if method != "GET" && method != "HEAD" {
        return Response {
            allow: true,
            ..Response::text("405 Method Not Allowed", "method not allowed\n")
        };
    }
    match path {
        "/metrics" => scrape(state).await,
        "/healthz" => Response::text("200 OK", "ok\n"),
        "/readyz" => match state.readiness.status() {
            Ok(()) => Response::text("200 OK", "ready\n"),
            Err(reason) => Response::text("503 Service Unavailable", format!("{reason}\n")),
        },
        _ => Response::text("404 Not Found", "not found\n"),
    }
}

/// Runs the refresher and encodes, off the async workers (both may block briefly).
async fn scrape(state: &Arc<HttpState>) -> Response {
    let state = Arc::clone(state);
    let encoded = tokio::task::spawn_blocking(move || {
        if let Some(refresh) = &state.refresher {
            refresh();
        }
        state.metrics.encode()
    })
    .await;
    match encoded {
        Ok(Ok(body)) => Response {
            status: "200 OK",
            content_type: METRICS_CONTENT_TYPE,
            body,
            allow: false,
        },
        Ok(Err(e)) => {
            log::warn!("metrics endpoint: {e}");
            Response::text("500 Internal Server Error", "cannot encode metrics\n")
        }
        Err(e) => {
            log::warn!("metrics endpoint: the scrape hook failed: {e}");
            Response::text("500 Internal Server Error", "scrape failed\n")
        }
    }
}

fn encode_response(r: &Response, head_only: bool) -> Vec<u8> {
    let allow = if r.allow { "Allow: GET, HEAD\r\n" } else { "" };
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        r.status,
        r.content_type,
        r.body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(r.body.as_bytes());
    }
    out
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
