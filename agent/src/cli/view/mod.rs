//! `lookback view FILE`: opens a trace in the Perfetto UI, as Perfetto's own
//! `tools/open_trace_in_ui` does.
//!
//! In: a trace lookback wrote (`.fxt`, `.fxt.gz`, `.json`, `.json.gz`), a port on 127.0.0.1
//! (9001, the only one the UI's content-security-policy lets it fetch from) and whether to
//! start a browser. Out: the `ui.perfetto.dev` link on stdout (with what to do offline or on
//! a remote host), the browser started on it where there is one, and the file served over
//! HTTP/1.1 on 127.0.0.1 until one GET has received all of it; then exit 0.
//!
//! Why a server: the UI runs in the browser and may only read local files the user picks by
//! hand; it fetches `?url=` links itself, so the trace must be reachable over HTTP with a CORS
//! header for its origin. A tiny std server, one connection at a time, is enough for one
//! client fetching one file; each connection gets read and write timeouts so a stuck client
//! cannot hold it, and requests naming another host than the loopback one are refused, so
//! a web page cannot read the trace through DNS rebinding.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context as _, anyhow};
use clap::Args;

use super::{CliError, CliResult};

mod serve;
use serve::serve;

/// The port the Perfetto UI's content-security-policy allows `?url=` fetches from.
const PERFETTO_PORT: u16 = 9001;
/// The UI's origin, the only one the CORS header lets read the trace.
const PERFETTO_ORIGIN: &str = "https://ui.perfetto.dev";

#[derive(Debug, Args)]
pub struct ViewArgs {
    /// The trace to open (.fxt, .fxt.gz, .json, .json.gz, as lookback wrote it).
    pub file: PathBuf,
    /// The port on 127.0.0.1 to serve it from. The Perfetto UI fetches only from 9001.
    #[arg(long, default_value_t = PERFETTO_PORT)]
    pub port: u16,
    /// Print the link only; do not start a browser ($BROWSER, else xdg-open).
    #[arg(long)]
    pub no_open: bool,
}

/// Serves `args.file` for the Perfetto UI until one GET has received all of it.
///
/// # Errors
/// Usage (exit 2): the file is missing, unreadable, not a regular file or a snapshot.
/// Runtime (exit 1): the port cannot be bound (in use), or accepting connections fails.
pub fn run(args: &ViewArgs) -> CliResult {
    let trace = Trace::check(&args.file)?;
    let listener = listen(args.port)?;
    let port = listener.local_addr().map_or(args.port, |addr| addr.port());
    let link = perfetto_link(port, &trace.encoded_name);
    if port != PERFETTO_PORT {
        log::warn!(
            "the Perfetto UI fetches only from port {PERFETTO_PORT}: the link works where \
             127.0.0.1:{PERFETTO_PORT} forwards here (ssh -L {PERFETTO_PORT}:127.0.0.1:{port} \
             HOST, and {PERFETTO_PORT} in place of {port} in the link); else open the file by hand"
        );
    }
    print_instructions(&instructions(&link, &trace, port));
    if !args.no_open {
        open_browser(&link);
    }
    log::info!(
        "serving {} on 127.0.0.1:{port} until the UI has fetched it (Ctrl-C to stop)",
        trace.path.display()
    );
    serve(&listener, &trace).map_err(CliError::runtime)?;
    Ok(ExitCode::SUCCESS)
}

/// The trace to serve: where it is, and its file name as the URL path carries it.
#[derive(Debug)]
struct Trace {
    /// The path given, made absolute where possible (the instructions print it).
    path: PathBuf,
    /// The file name, as bytes (a name need not be UTF-8).
    name: Vec<u8>,
    /// `name` percent-encoded: the URL's path is `/` and this.
    encoded_name: String,
}

impl Trace {
    /// Checks that `path` is a readable regular file and no snapshot.
    fn check(path: &Path) -> Result<Self, CliError> {
        if path
            .extension()
            .is_some_and(|ext| ext.eq_ignore_ascii_case("lbsnap"))
        {
            return Err(snapshot_refusal(path));
        }
        if path
            .to_string_lossy()
            .to_ascii_lowercase()
            .ends_with(".speedscope.json")
        {
            return Err(CliError::usage(anyhow!(
                "{}: a speedscope file, which the Perfetto UI cannot read: open it with \
                 speedscope (`npm install -g speedscope; speedscope {}`), or view the .fxt \
                 or .json trace",
                path.display(),
                path.display()
            )));
        }
        let mut file = File::open(path)
            .with_context(|| format!("cannot read the trace {}", path.display()))
            .map_err(CliError::usage)?;
        let metadata = file
            .metadata()
            .with_context(|| format!("cannot read the trace {}", path.display()))
            .map_err(CliError::usage)?;
        if !metadata.is_file() {
            return Err(CliError::usage(anyhow!(
                "{}: not a regular file (lookback view serves one trace file)",
                path.display()
            )));
        }
        let mut magic = [0u8; crate::snapshot::MAGIC.len()];
        if file.read_exact(&mut magic).is_ok() && magic == crate::snapshot::MAGIC {
            return Err(snapshot_refusal(path));
        }
        let name = path
            .file_name()
            .ok_or_else(|| CliError::usage(anyhow!("{}: names no file", path.display())))?
            .as_bytes()
            .to_vec();
        warn_unlinkable(&name);
        Ok(Self {
            path: std::path::absolute(path).unwrap_or_else(|_| path.to_owned()),
            encoded_name: percent_encode(&name),
            name,
        })
    }
}

/// The refusal of a snapshot (`.lbsnap`), which the UI cannot read.
fn snapshot_refusal(path: &Path) -> CliError {
    CliError::usage(anyhow!(
        "{} is a snapshot, not a trace; decode it first: lookback decode {} -o trace.fxt",
        path.display(),
        path.display()
    ))
}

/// Warns where the name holds what the UI's link cannot carry to its fetch (it decodes
/// the `url` argument once, so an encoded `#` or `?` ends the path again).
fn warn_unlinkable(name: &[u8]) {
    if name.iter().any(|b| matches!(b, b'#' | b'?')) {
        log::warn!(
            "the file name holds '#' or '?', which the Perfetto UI's link cannot carry; \
             rename or copy the file if the UI reports a 404"
        );
    }
}

/// A listener on 127.0.0.1:`port`, or an error naming the port.
fn listen(port: u16) -> Result<TcpListener, CliError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(|err| {
        let message = if err.kind() == io::ErrorKind::AddrInUse {
            format!(
                "port {port} on 127.0.0.1 is in use (another lookback view?); stop what holds \
                 it, or serve from another port with --port (the Perfetto UI fetches only from \
                 port {PERFETTO_PORT}, so then open the file by hand: ui.perfetto.dev → Open \
                 trace file)"
            )
        } else {
            format!("cannot listen on 127.0.0.1:{port}")
        };
        CliError::runtime(anyhow::Error::new(err).context(message))
    })
}

/// The `ui.perfetto.dev` link that makes the UI fetch `/ENCODED_NAME` from 127.0.0.1:`port`.
fn perfetto_link(port: u16, encoded_name: &str) -> String {
    format!("{PERFETTO_ORIGIN}/#!/?url=http://127.0.0.1:{port}/{encoded_name}&referrer=lookback")
}

/// `bytes` with everything but RFC 3986's unreserved characters as `%XX`.
fn percent_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `bytes` with each `%XX` replaced by its byte; `None` for a `%` without two hex digits.
fn percent_decode(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail.get(..2)?;
            // Digits only: `from_str_radix` alone would take "+1".
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let text = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(text, 16).ok()?);
            rest = &tail[2..];
        } else {
            out.push(b);
            rest = tail;
        }
    }
    Some(out)
}

/// What stdout says: the link first, then what to do without internet or on a remote host.
fn instructions(link: &str, trace: &Trace, port: u16) -> String {
    format!(
        "{link}\n\
         offline: write the trace for speedscope (`lookback decode SNAPSHOT -o \
         trace.speedscope.json`, or `-o trace.speedscope.json` on run/attach) and open it \
         with speedscope (`npm install -g speedscope; speedscope trace.speedscope.json`); \
         the trace is also at {} for ui.perfetto.dev → Open trace file\n\
         on a remote host: ssh -L {PERFETTO_PORT}:127.0.0.1:{port} HOST, then open the link \
         on your machine\n",
        trace.path.display()
    )
}

/// Writes `text` to stdout in one piece; a closed stdout is logged, not fatal (the
/// server is still what the user wants).
fn print_instructions(text: &str) {
    let mut stdout = io::stdout().lock();
    if let Err(err) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        log::debug!("writing the link to stdout: {err}");
    }
}

/// Starts a browser on `link` where there is one; never waits for it, never fails.
fn open_browser(link: &str) {
    let browser = std::env::var("BROWSER").ok();
    let display = ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()));
    let Some((program, args)) = browser_command(browser.as_deref(), display, link) else {
        log::debug!("no browser to start ($BROWSER unset, no display)");
        return;
    };
    let spawned = Command::new(&program)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C that stops the server leaves the browser alone.
        .process_group(0)
        .spawn();
    match spawned {
        Ok(mut child) => {
            log::debug!("started {} on the link", program.to_string_lossy());
            // Reaped on a thread of its own, so an xdg-open that waits never blocks us.
            let reaper = std::thread::Builder::new()
                .name("view-browser".into())
                .spawn(move || child.wait());
            if let Err(err) = reaper {
                log::debug!("waiting for {}: {err}", program.to_string_lossy());
            }
        }
        Err(err) => log::debug!("starting {}: {err}", program.to_string_lossy()),
    }
}

/// The browser command for `link`: `$BROWSER` (its first `:`-separated entry, `%s` replaced
/// by the link, else the link appended), else `xdg-open` where there is a display.
fn browser_command(
    browser: Option<&str>,
    display: bool,
    link: &str,
) -> Option<(OsString, Vec<OsString>)> {
    let entry = browser
        .and_then(|b| b.split(':').map(str::trim).find(|e| !e.is_empty()))
        .map(str::to_owned);
    let Some(entry) = entry else {
        return display.then(|| (OsString::from("xdg-open"), vec![OsString::from(link)]));
    };
    let mut words = entry.split_whitespace();
    let program = OsString::from(words.next()?);
    let mut args: Vec<OsString> = Vec::new();
    let mut placed = false;
    for word in words {
        placed |= word.contains("%s");
        args.push(OsString::from(word.replace("%s", link)));
    }
    if !placed {
        args.push(OsString::from(link));
    }
    Some((program, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_keeps_unreserved_characters_and_escapes_the_rest() {
        assert_eq!(percent_encode(b"trace-1_a.fxt.gz~"), "trace-1_a.fxt.gz~");
        assert_eq!(
            percent_encode(b"my trace&x=1#.fxt"),
            "my%20trace%26x%3D1%23.fxt"
        );
        assert_eq!(percent_encode("é/%".as_bytes()), "%C3%A9%2F%25");
        assert_eq!(percent_encode(&[0xff, b'+']), "%FF%2B");
    }

    #[test]
    fn decoding_undoes_encoding_and_refuses_broken_escapes() {
        let name = b"a b%c\xff+.fxt";
        assert_eq!(
            percent_decode(percent_encode(name).as_bytes()).as_deref(),
            Some(&name[..])
        );
        assert_eq!(percent_decode(b"%2f%2F"), Some(b"//".to_vec()));
        assert_eq!(percent_decode(b"a%2"), None);
        assert_eq!(percent_decode(b"a%zz"), None);
        assert_eq!(percent_decode(b"%+1"), None);
    }

    #[test]
    fn the_link_is_perfettos_url_form() {
        assert_eq!(
            perfetto_link(9001, "trace%201.fxt"),
            "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/trace%201.fxt&referrer=lookback"
        );
    }

    #[test]
    fn browser_command_prefers_browser_then_xdg_open_with_a_display() {
        let link = "https://x/";
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            browser_command(Some("firefox"), false, link),
            Some(("firefox".into(), os(&[link])))
        );
        assert_eq!(
            browser_command(Some(":w3m -o x %s:lynx"), true, link),
            Some(("w3m".into(), os(&["-o", "x", link])))
        );
        assert_eq!(
            browser_command(None, true, link),
            Some(("xdg-open".into(), os(&[link])))
        );
        assert_eq!(browser_command(Some(" "), false, link), None);
        assert_eq!(browser_command(None, false, link), None);
    }
}
