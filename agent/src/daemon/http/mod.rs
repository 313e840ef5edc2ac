//! Daemon stage: the HTTP endpoint of `lookback agent` (`--metrics-addr`, default
//! 127.0.0.1:9464). In: TCP connections. Out: `/metrics` (the registry of
//! [`super::metrics::Metrics`], text format 0.0.4), `/healthz` (200 while the process runs),
//! `/readyz` (200 once the rules are installed and no function rule is left without
//! uprobes by a failed attach, else 503 with the reason: [`super::readiness`]).
//!
//! HTTP/1.0 and 1.1 (keep-alive) by hyper, configured for hostile clients: a request head
//! must arrive within [`Limits::header_timeout`] of the connection (or of the answer
//! before it, on a kept-alive connection) and fit in [`Limits::max_head_bytes`], else the
//! connection is closed (with 431 or 414 for a head too large, 400 for one that is not
//! HTTP/1). GET and HEAD only; no request bodies are read.
//!
//! Health before everything: every accepted connection goes into a table
//! ([`conns`]) that sheds, when [`Limits::soft_cap`] connections are open, the oldest one
//! that has not sent a complete request (then the oldest idle keep-alive one) to let the
//! new one in, rather than refusing it: a thousand silent connections hold at most
//! `soft_cap` fds and buffers, and a kubelet probe, which sends its request at once, is
//! answered. Only when every connection is answering a request does the table take more,
//! up to [`Limits::hard_cap`]. One fd is kept in reserve for the moment the agent runs out
//! of fds ([`FdReserve`]). `lookback_http_connections` counts the open connections,
//! `lookback_http_rejected_total{reason}` those closed unanswered.
//!
//! With `--web-config` ([`web_config`]): TLS (`/healthz` and `/readyz` too) and basic
//! auth (not for `/healthz` and `/readyz`: probes send no credentials). SIGTERM stops
//! accepting, lets answers in flight finish ([`Limits::shutdown_grace`]) and closes idle
//! connections.
//!
//! Kernel-side counters are refreshed on scrape: [`HttpState::with_refresher`] installs a
//! hook run right before `/metrics` is encoded (typically
//! `metrics.refresh_from_engine(&engine.lock())`). It runs on a blocking-pool thread, so it
//! may take a `std::sync::Mutex`; it must not wait on a tokio lock.

pub mod conns;
pub mod web_config;

use std::{
    convert::Infallible,
    future::Future,
    io,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::{GracefulShutdown, Watcher},
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
    time::timeout,
};
use tokio_rustls::TlsAcceptor;

use self::{
    conns::{Admission, ShedSignal, Slot, Table},
    web_config::{Credentials, WebConfig},
};
use super::metrics::Metrics;

/// The default of `--metrics-addr` (contract.md).
pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";

/// The content type of the Prometheus text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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

/// What the server answers from: the metrics, the readiness, the scrape hook, the web
/// configuration.
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    refresher: Option<Refresher>,
    web: WebConfig,
    /// Password checks (bcrypt, milliseconds of CPU each) run at once at most.
    auth_slots: Semaphore,
}

impl HttpState {
    /// Not ready ("starting"), without a scrape hook, plain HTTP without credentials.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            readiness: Readiness::default(),
            refresher: None,
            web: WebConfig::default(),
            auth_slots: Semaphore::new(2),
        }
    }

    /// Runs `refresh` before each scrape (on a blocking-pool thread).
    #[must_use]
    pub fn with_refresher(mut self, refresh: impl Fn() + Send + Sync + 'static) -> Self {
        self.refresher = Some(Box::new(refresh));
        self
    }

    /// Serves with `web`'s TLS, users and headers.
    #[must_use]
    pub fn with_web_config(mut self, web: WebConfig) -> Self {
        self.web = web;
        self
    }
}

/// Limits that keep misbehaving clients cheap.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time for a request head to arrive (from the connection, the TLS handshake, or the
    /// answer before it on a kept-alive connection); the connection is closed after.
    pub header_timeout: Duration,
    /// Request line and headers together at most (hyper's buffer; at least 8 KiB); a
    /// larger head is answered 431 (414 for its request line) and the connection closed.
    pub max_head_bytes: usize,
    /// Connections open before the silent or idle ones are shed for new ones.
    pub soft_cap: usize,
    /// Connections open at most, all answering requests.
    pub hard_cap: usize,
    /// After SIGTERM, how long answers in flight may take.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    /// 5 s for a head of at most 16 KiB; shed beyond 256 connections, refuse beyond 320;
    /// 2 s of grace at shutdown.
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(5),
            max_head_bytes: 16 * 1024,
            soft_cap: 256,
            hard_cap: 320,
            shutdown_grace: Duration::from_secs(2),
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

/// Serves until `shutdown` completes, then lets the answers in flight finish (at most
/// [`Limits::shutdown_grace`]) and closes the rest.
pub async fn serve_with(
    listener: TcpListener,
    state: Arc<HttpState>,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
) {
    let table = Table::new(limits.soft_cap, limits.hard_cap);
    let graceful = GracefulShutdown::new();
    let tls = state.web.tls.clone().map(TlsAcceptor::from);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut reserve = FdReserve::open();
    loop {
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
        let (slot, signal) = match table.admit() {
            Admission::Admitted { slot, signal, shed } => {
                for _ in 0..shed {
                    state.metrics.http_rejected("shed");
                }
                (slot, signal)
            }
            Admission::Refused => {
                state.metrics.http_rejected("shed");
                continue;
            }
        };
        let conn = Conn {
            state: Arc::clone(&state),
            slot: Arc::new(slot),
            served: Arc::new(AtomicBool::new(false)),
            limits,
        };
        tokio::spawn(conn.run(stream, tls.clone(), signal, graceful.watcher()));
    }
    drop(listener);
    if timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        log::debug!("metrics endpoint: connections still open after the shutdown grace");
    }
}

/// One connection being served; counted in `lookback_http_connections` while it lives.
struct Conn {
    state: Arc<HttpState>,
    slot: Arc<Slot>,
    /// A request was answered on it (its later header timeout is a kept-alive connection
    /// closing, not a rejection).
    served: Arc<AtomicBool>,
    limits: Limits,
}

impl Conn {
    async fn run(
        self,
        stream: TcpStream,
        tls: Option<TlsAcceptor>,
        mut signal: ShedSignal,
        watcher: Watcher,
    ) {
        let metrics = Arc::clone(&self.state.metrics);
        metrics.http_connection(true);
        match tls {
            None => self.serve(stream, signal, watcher).await,
            Some(tls) => {
                let handshake = tokio::select! {
                    done = timeout(self.limits.header_timeout, tls.accept(stream)) => done,
                    _ = &mut signal => {
                        metrics.http_connection(false);
                        return;
                    }
                };
                match handshake {
                    Ok(Ok(stream)) => self.serve(stream, signal, watcher).await,
                    Ok(Err(e)) => {
                        log::debug!("metrics endpoint: TLS handshake: {e}");
                        metrics.http_rejected("bad_request");
                    }
                    Err(_) => metrics.http_rejected("header_timeout"),
                }
            }
        }
        metrics.http_connection(false);
    }

    async fn serve<I>(self, io: I, signal: ShedSignal, watcher: Watcher)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let metrics = Arc::clone(&self.state.metrics);
        let served = Arc::clone(&self.served);
        let (state, slot) = (Arc::clone(&self.state), Arc::clone(&self.slot));
        let service = service_fn(move |req: Request<Incoming>| {
            let (state, slot, served) =
                (Arc::clone(&state), Arc::clone(&slot), Arc::clone(&served));
            async move {
                slot.busy();
                let response = respond(&state, &req).await;
                served.store(true, Ordering::Relaxed);
                slot.idle();
                Ok::<_, Infallible>(response)
            }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_buf_size(self.limits.max_head_bytes.max(8 * 1024))
            .serve_connection(TokioIo::new(io), service);
        let conn = watcher.watch(conn);
        let result = tokio::select! {
            result = conn => result,
            // Shed (counted when the table chose it): closed by dropping it.
            _ = signal => return,
        };
        if let Err(e) = result {
            let reason = if e.is_timeout() {
                (!self.served.load(Ordering::Relaxed)).then_some("header_timeout")
            } else if e.is_parse_too_large() {
                Some("too_large")
            } else if e.is_parse() {
                Some("bad_request")
            } else {
                None
            };
            if let Some(reason) = reason {
                metrics.http_rejected(reason);
            }
        }
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

type Reply = Response<Full<Bytes>>;

fn text(status: StatusCode, body: impl Into<String>) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The answer to one request: GET and HEAD of the three paths; `/metrics` (and unknown
/// paths) behind basic auth when the web configuration has users.
async fn respond(state: &Arc<HttpState>, req: &Request<Incoming>) -> Reply {
    let mut reply = route(state, req).await;
    for (name, value) in &state.web.headers {
        reply.headers_mut().insert(name.clone(), value.clone());
    }
    reply
}

async fn route(state: &Arc<HttpState>, req: &Request<Incoming>) -> Reply {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/healthz" => return text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            return match state.readiness.status() {
                Ok(()) => text(StatusCode::OK, "ready\n"),
                Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
            };
        }
        _ => {}
    }
    if !authorized(state, req).await {
        let mut r = text(StatusCode::UNAUTHORIZED, "unauthorized\n");
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"lookback\""),
        );
        return r;
    }
    match req.uri().path() {
        "/metrics" => scrape(state).await,
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// Whether the request carries a configured user's credentials (always, without users).
/// The bcrypt check runs on the blocking pool, two at a time at most.
async fn authorized(state: &Arc<HttpState>, req: &Request<Incoming>) -> bool {
    if state.web.users.is_empty() {
        return true;
    }
    let credentials = Credentials::of(
        req.headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    );
    if credentials == Credentials::Missing {
        return false;
    }
    let Ok(_permit) = state.auth_slots.acquire().await else {
        return false;
    };
    let state = Arc::clone(state);
    tokio::task::spawn_blocking(move || state.web.authorized(&credentials))
        .await
        .unwrap_or(false)
}

/// Runs the refresher and encodes, off the async workers (both may block briefly).
async fn scrape(state: &Arc<HttpState>) -> Reply {
    let state = Arc::clone(state);
    let encoded = tokio::task::spawn_blocking(move || {
        if let Some(refresh) = &state.refresher {
            refresh();
        }
        state.metrics.encode()
    })
    .await;
    match encoded {
        Ok(Ok(body)) => {
            let mut r = text(StatusCode::OK, body);
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(METRICS_CONTENT_TYPE),
            );
            r
        }
        Ok(Err(e)) => {
            log::warn!("metrics endpoint: {e}");
            text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n")
        }
        Err(e) => {
            log::warn!("metrics endpoint: the scrape hook failed: {e}");
            text(StatusCode::INTERNAL_SERVER_ERROR, "scrape failed\n")
        }
    }
}

#[cfg(test)]
mod tests;
