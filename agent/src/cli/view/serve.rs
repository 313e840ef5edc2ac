//! The HTTP half of `lookback view`: one trace file served on 127.0.0.1 to the Perfetto
//! UI, one connection at a time.
//!
//! In: a bound listener and the trace. Out: answers (GET and HEAD of the file with the UI's
//! CORS header, OPTIONS preflights, 404/405/400/403/431 otherwise) until one GET has sent
//! the whole file. Each connection has read and write timeouts, so a stuck client cannot
//! hold the server; a `Host` other than the loopback one is refused (DNS rebinding).

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};

use super::{PERFETTO_ORIGIN, Trace, percent_decode};

/// The largest request head (request line and headers) read before answering 431.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a client may take to send its request (and to stall between reads of a
/// response) before its connection is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The methods served, as `Allow` lists them.
const ALLOWED_METHODS: &str = "GET, HEAD, OPTIONS";

/// Answers connections one at a time until a GET has received the whole file.
pub(super) fn serve(listener: &TcpListener, trace: &Trace) -> anyhow::Result<()> {
    let name = OsStr::from_bytes(&trace.name).to_string_lossy();
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(stream) => stream,
            Err(err) => {
                log::debug!("accepting a connection: {err}");
                continue;
            }
        };
        let peer = stream.peer_addr().map_or_else(
            |_| "an unknown peer".to_owned(),
            |a: SocketAddr| a.to_string(),
        );
        match handle(stream, trace) {
            Ok(Some(bytes)) => {
                log::info!("served {name} ({bytes} bytes) to {peer}");
                return Ok(());
            }
            Ok(None) => {}
            Err(err) => log::debug!("{peer}: {err:#}"),
        }
    }
    bail!("the listener stopped accepting connections")
}

/// A response status this server sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    NoContent,
    BadRequest,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    HeadTooLarge,
}

impl Status {
    fn line(self) -> &'static str {
        match self {
            Self::Ok => "200 OK",
            Self::NoContent => "204 No Content",
            Self::BadRequest => "400 Bad Request",
            Self::Forbidden => "403 Forbidden",
            Self::NotFound => "404 Not Found",
            Self::MethodNotAllowed => "405 Method Not Allowed",
            Self::HeadTooLarge => "431 Request Header Fields Too Large",
        }
    }
}

/// A request method, as far as the server tells them apart.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Method {
    Get,
    Head,
    Options,
    Other(String),
}

/// The parts of a request the server looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    method: Method,
    /// The target's path, still percent-encoded, without query or fragment.
    path: String,
    /// The `Host` header, when there is one.
    host: Option<String>,
}

/// What to answer a request with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The file's headers, and with `body` its bytes.
    File { body: bool },
    /// A CORS preflight's 204.
    Preflight,
    /// An error status, with a one-line body.
    Error(Status),
}

/// The request line `line` (`METHOD /path HTTP/1.x`), without its line end; `None` when
/// it is malformed or its target is no absolute path.
fn parse_request_line(line: &str) -> Option<(Method, String)> {
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    let is_token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
    if parts.next().is_some()
        || !is_token(method)
        || !target.starts_with('/')
        || !target.bytes().all(|b| b.is_ascii_graphic())
        || !matches!(version, "HTTP/1.0" | "HTTP/1.1")
    {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    let method = match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "OPTIONS" => Method::Options,
        other => Method::Other(other.to_owned()),
    };
    Some((method, path.to_owned()))
}

/// The request in `head` (the bytes before the blank line), or the status to refuse it.
fn parse_head(head: &[u8]) -> Result<Request, Status> {
    let text = std::str::from_utf8(head).map_err(|_| Status::BadRequest)?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let (method, path) = lines
        .next()
        .and_then(parse_request_line)
        .ok_or(Status::BadRequest)?;
    let mut host = None;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(Status::BadRequest)?;
        if name.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return Err(Status::BadRequest);
            }
            host = Some(value.trim().to_owned());
        }
    }
    Ok(Request { method, path, host })
}

/// Whether `host` (a `Host` header) names this machine's loopback interface.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(name, _port)| name)
    };
    ["127.0.0.1", "localhost", "::1"]
        .iter()
        .any(|loopback| name.eq_ignore_ascii_case(loopback))
}

/// Whether the encoded request path `path` names the file called `name`. Browsers re-encode
/// what the UI decoded, so the path is compared both decoded and as it came.
fn names_file(path: &str, name: &[u8]) -> bool {
    let Some(raw) = path.as_bytes().strip_prefix(b"/") else {
        return false;
    };
    raw == name || percent_decode(raw).is_some_and(|decoded| decoded == name)
}

/// What to answer `request` with, for the file called `name`.
fn route(request: &Request, name: &[u8]) -> Route {
    if !request.host.as_deref().is_none_or(is_loopback_host) {
        return Route::Error(Status::Forbidden);
    }
    if matches!(request.method, Method::Other(_)) {
        return Route::Error(Status::MethodNotAllowed);
    }
    if !names_file(&request.path, name) {
        return Route::Error(Status::NotFound);
    }
    match request.method {
        Method::Options => Route::Preflight,
        Method::Head => Route::File { body: false },
        Method::Get | Method::Other(_) => Route::File { body: true },
    }
}

/// The outcome of reading a request head.
enum Head {
    /// The bytes before the blank line.
    Complete(Vec<u8>),
    /// More than [`MAX_HEAD_BYTES`] without a blank line.
    TooLarge,
    /// The client closed the connection before sending anything.
    Closed,
}

/// Where the request head in `buf` ends: the offset of its blank line and that line's
/// length with the line end before it.
fn head_end(buf: &[u8]) -> Option<(usize, usize)> {
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Reads one request head from `stream`, at most [`MAX_HEAD_BYTES`].
fn read_head(stream: &mut impl io::Read) -> io::Result<Head> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((end, _)) = head_end(&buf) {
            if end > MAX_HEAD_BYTES {
                return Ok(Head::TooLarge);
            }
            buf.truncate(end);
            return Ok(Head::Complete(buf));
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Ok(Head::TooLarge);
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return if buf.is_empty() {
                Ok(Head::Closed)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the client closed the connection within its request",
                ))
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Answers one connection; `Some(bytes)` when it received the whole file.
fn handle(mut stream: TcpStream, trace: &Trace) -> anyhow::Result<Option<u64>> {
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let route = match read_head(&mut stream)
        .with_context(|| format!("reading the request (timeout {READ_TIMEOUT:?})"))?
    {
        Head::Closed => return Ok(None),
        Head::TooLarge => Route::Error(Status::HeadTooLarge),
        Head::Complete(head) => match parse_head(&head) {
            Ok(request) => {
                let route = route(&request, &trace.name);
                log::debug!("{:?} {} -> {route:?}", request.method, request.path);
                route
            }
            Err(status) => Route::Error(status),
        },
    };
    match route {
        Route::File { body } => send_file(&mut stream, &trace.path, body),
        Route::Preflight => {
            let headers = [
                ("Access-Control-Allow-Methods", ALLOWED_METHODS),
                ("Access-Control-Allow-Headers", "*"),
                // Chrome's private network access asks this of public pages fetching 127.0.0.1.
                ("Access-Control-Allow-Private-Network", "true"),
                ("Access-Control-Max-Age", "600"),
            ];
            write_head(&mut stream, Status::NoContent, &headers, None)?;
            Ok(None)
        }
        Route::Error(status) => {
            send_error(&mut stream, status)?;
            Ok(None)
        }
    }
}

/// Sends the file at `path` (its headers, and with `body` its bytes); `Some(bytes)` when
/// the body went out whole.
fn send_file(stream: &mut TcpStream, path: &Path, body: bool) -> anyhow::Result<Option<u64>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    let headers = [
        ("Content-Type", "application/octet-stream"),
        ("Cache-Control", "no-cache"),
    ];
    write_head(stream, Status::Ok, &headers, Some(len))?;
    if !body {
        return Ok(None);
    }
    let sent = io::copy(&mut file.take(len), stream).context("sending the file")?;
    if sent < len {
        bail!(
            "{} shrank while it was sent ({sent} of {len} bytes)",
            path.display()
        );
    }
    stream.flush()?;
    Ok(Some(sent))
}

/// Sends `status` with a one-line text body.
fn send_error(stream: &mut TcpStream, status: Status) -> io::Result<()> {
    let body = format!("{}\n", status.line());
    let mut headers = vec![("Content-Type", "text/plain; charset=utf-8")];
    if status == Status::MethodNotAllowed {
        headers.push(("Allow", ALLOWED_METHODS));
    }
    write_head(stream, status, &headers, Some(body.len() as u64))?;
    stream.write_all(body.as_bytes())
}

/// Writes a response head: the status line, `headers`, the CORS origin, `Connection:
/// close` and `Content-Length` when given.
fn write_head(
    out: &mut impl io::Write,
    status: Status,
    headers: &[(&str, &str)],
    content_length: Option<u64>,
) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {}\r\nAccess-Control-Allow-Origin: {PERFETTO_ORIGIN}\r\nConnection: close\r\n",
        status.line()
    );
    for (name, value) in headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    if let Some(len) = content_length {
        let _ = write!(head, "Content-Length: {len}\r\n");
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_parse_into_method_and_path() {
        assert_eq!(
            parse_request_line("GET /trace.fxt HTTP/1.1"),
            Some((Method::Get, "/trace.fxt".to_owned()))
        );
        assert_eq!(
            parse_request_line("HEAD /a%20b?x=1 HTTP/1.0"),
            Some((Method::Head, "/a%20b".to_owned()))
        );
        assert_eq!(
            parse_request_line("OPTIONS /t HTTP/1.1"),
            Some((Method::Options, "/t".to_owned()))
        );
        assert_eq!(
            parse_request_line("POST / HTTP/1.1"),
            Some((Method::Other("POST".to_owned()), "/".to_owned()))
        );
        for bad in [
            "",
            "GET",
            "GET /",
            "GET / HTTP/2",
            "GET  / HTTP/1.1",
            "GET / HTTP/1.1 x",
            "GET http://h/ HTTP/1.1",
            "GET * HTTP/1.1",
            "GET /a\tb HTTP/1.1",
        ] {
            assert_eq!(parse_request_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn heads_give_the_host_and_refuse_malformed_headers() {
        let head = b"GET /t HTTP/1.1\r\nhOsT: 127.0.0.1:9001\r\nOrigin: x\r\n";
        let request = parse_head(head).expect("valid head");
        assert_eq!(request.host.as_deref(), Some("127.0.0.1:9001"));
        assert_eq!(
            parse_head(b"GET /t HTTP/1.1\nno colon"),
            Err(Status::BadRequest)
        );
        assert_eq!(
            parse_head(b"GET /t HTTP/1.1\r\nHost: a\r\nHost: b"),
            Err(Status::BadRequest)
        );
        assert_eq!(parse_head(b"\xff / HTTP/1.1"), Err(Status::BadRequest));
    }

    #[test]
    fn head_end_finds_the_blank_line_either_way() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some((14, 4)));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some((14, 2)));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    }

    #[test]
    fn reading_a_head_stops_at_the_blank_line_and_at_the_bound() {
        let mut input: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nrest";
        assert!(
            matches!(read_head(&mut input), Ok(Head::Complete(h)) if h == b"GET / HTTP/1.1\r\nHost: x")
        );
        let long = vec![b'a'; MAX_HEAD_BYTES + 10];
        assert!(matches!(
            read_head(&mut long.as_slice()),
            Ok(Head::TooLarge)
        ));
        assert!(matches!(read_head(&mut &b""[..]), Ok(Head::Closed)));
        assert!(read_head(&mut &b"GET / HT"[..]).is_err());
    }

    fn request(method: Method, path: &str, host: Option<&str>) -> Request {
        Request {
            method,
            path: path.to_owned(),
            host: host.map(str::to_owned),
        }
    }

    #[test]
    fn routes_serve_only_the_file_to_loopback_hosts() {
        let name = b"my trace.fxt";
        let local = Some("127.0.0.1:9001");
        let get = request(Method::Get, "/my%20trace.fxt", local);
        assert_eq!(route(&get, name), Route::File { body: true });
        let head = request(Method::Head, "/my%20trace.fxt", Some("localhost:9001"));
        assert_eq!(route(&head, name), Route::File { body: false });
        let raw = request(Method::Get, "/my trace.fxt", None);
        assert_eq!(route(&raw, name), Route::File { body: true });
        let options = request(Method::Options, "/my%20trace.fxt", Some("[::1]:9001"));
        assert_eq!(route(&options, name), Route::Preflight);
        for method in [Method::Get, Method::Head, Method::Options] {
            let wrong = request(method, "/other.fxt", local);
            assert_eq!(route(&wrong, name), Route::Error(Status::NotFound));
        }
        let post = request(Method::Other("POST".into()), "/my%20trace.fxt", local);
        assert_eq!(route(&post, name), Route::Error(Status::MethodNotAllowed));
        let rebound = request(Method::Get, "/my%20trace.fxt", Some("evil.example:9001"));
        assert_eq!(route(&rebound, name), Route::Error(Status::Forbidden));
    }

    #[test]
    fn response_heads_carry_cors_close_and_length() {
        let mut out = Vec::new();
        write_head(&mut out, Status::Ok, &[("Content-Type", "a/b")], Some(7)).expect("vec");
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            "HTTP/1.1 200 OK\r\nAccess-Control-Allow-Origin: https://ui.perfetto.dev\r\n\
             Connection: close\r\nContent-Type: a/b\r\nContent-Length: 7\r\n\r\n"
        );
    }
}
