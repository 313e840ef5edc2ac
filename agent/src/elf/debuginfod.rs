//! A debuginfod client: the debug file of a build-id from the servers the user names, as
//! gdb, perf, valgrind and systemd-coredump get it (elfutils' `debuginfod-client`
//! conventions), kept in a cache on disk.
//!
//! In: a build-id (hex) and a [`Config`] — from the environment (`DEBUGINFOD_URLS`,
//! space-separated; `DEBUGINFOD_CACHE_PATH`, default `$XDG_CACHE_HOME/debuginfod_client`
//! or `$HOME/.cache/debuginfod_client`; `DEBUGINFOD_TIMEOUT`, seconds, default 90;
//! `DEBUGINFOD_MAXSIZE`, bytes; `DEBUGINFOD_MAXTIME`, seconds) or a rule's `debuginfod:`
//! list. Out: the path of `CACHE/BUILD-ID/debuginfo` (elfutils' layout, so a cache is
//! shared with gdb and perf), or a [`FetchError`] that names the build-id and the servers.
//!
//! Why bounded everywhere: a trace must never wait on a dead network. Each build-id is
//! asked once per process (a miss is not asked again for [`MISS_FOR`]); the connection and
//! the response wait `DEBUGINFOD_TIMEOUT`, the whole transfer at most `DEBUGINFOD_MAXTIME`
//! (default 5 × the timeout); a file larger than `DEBUGINFOD_MAXSIZE` (default 1 GiB) is
//! refused. What a server sends is kept only when it is an ELF file with the build-id
//! asked for; it is written to a temporary file and renamed, so a cache entry is whole.

use std::{
    collections::HashMap,
    fs,
    io::{self, Read as _, Write as _},
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use super::build_id::build_id_of;

/// How long a build-id no server had is not asked again (elfutils' `cache_miss_s`).
pub const MISS_FOR: Duration = Duration::from_mins(10);

/// `DEBUGINFOD_TIMEOUT`'s default, as elfutils'.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);

/// `DEBUGINFOD_MAXSIZE`'s default: no distribution's debug file comes near it.
const DEFAULT_MAX_SIZE: u64 = 1 << 30;

/// Where a rule or a command takes its servers from.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Servers {
    /// `DEBUGINFOD_URLS` (none when unset or empty).
    #[default]
    FromEnv,
    /// Never asked (`debuginfod: false`, `--no-debuginfod`).
    Off,
    /// These servers (`debuginfod: [URL, ...]`), with the rest of the environment's
    /// settings.
    Urls(Vec<String>),
}

impl Servers {
    /// The client settings: `None` when no server is to be asked.
    #[must_use]
    pub fn config(&self) -> Option<Config> {
        let env = |name: &str| std::env::var(name).ok();
        let urls = match self {
            Self::Off => return None,
            Self::FromEnv => split_urls(&env("DEBUGINFOD_URLS").unwrap_or_default()),
            Self::Urls(urls) => urls.clone(),
        };
        if urls.is_empty() {
            return None;
        }
        Some(Config::from_values(urls, &env))
    }
}

/// The settings of one client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Server base URLs, asked in order (`URL/buildid/ID/debuginfo`).
    pub urls: Vec<String>,
    pub cache: PathBuf,
    /// For the connection and for the response's headers.
    pub timeout: Duration,
    /// For the whole transfer.
    pub max_time: Duration,
    pub max_size: u64,
}

impl Config {
    /// From `urls` and the environment's other settings (`env` reads a variable).
    fn from_values(urls: Vec<String>, env: &dyn Fn(&str) -> Option<String>) -> Self {
        let seconds = |name: &str| {
            env(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|&s| s > 0)
                .map(Duration::from_secs)
        };
        let timeout = seconds("DEBUGINFOD_TIMEOUT").unwrap_or(DEFAULT_TIMEOUT);
        let cache = env("DEBUGINFOD_CACHE_PATH")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                env("XDG_CACHE_HOME")
                    .filter(|p| !p.is_empty())
                    .map(|p| Path::new(&p).join("debuginfod_client"))
            })
            .or_else(|| env("HOME").map(|h| Path::new(&h).join(".cache/debuginfod_client")))
            .unwrap_or_else(|| PathBuf::from("/var/cache/lookback/debuginfod"));
        Self {
            urls,
            cache,
            timeout,
            max_time: seconds("DEBUGINFOD_MAXTIME").unwrap_or(timeout * 5),
            max_size: env("DEBUGINFOD_MAXSIZE")
                .and_then(|v| v.trim().parse().ok())
                .filter(|&s| s > 0)
                .unwrap_or(DEFAULT_MAX_SIZE),
        }
    }

    /// Where the debug file of `build_id` is kept.
    #[must_use]
    pub fn cached(&self, build_id: &str) -> PathBuf {
        self.cache.join(build_id).join("debuginfo")
    }
}

/// `DEBUGINFOD_URLS`: URLs separated by spaces (elfutils also accepts newlines and tabs).
fn split_urls(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|u| u.trim_end_matches('/').to_owned())
        .filter(|u| !u.is_empty())
        .collect()
}

/// Why a debug file could not be had from the servers.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    #[error("not a build-id: {0:?}")]
    BadBuildId(String),
    #[error(
        "debuginfod: no debug file for build-id {build_id} from {servers}: {why} (the trace \
         is written without it; asked again after {} s)",
        MISS_FOR.as_secs()
    )]
    Missed {
        build_id: String,
        servers: String,
        why: String,
    },
    #[error("debuginfod: cache {path}: {why}")]
    Cache { path: PathBuf, why: String },
}

/// What one ask gave: the file, or the miss and when.
type Answer = Result<PathBuf, (FetchError, Instant)>;

/// What this process already asked, by build-id.
static ASKED: Mutex<Option<HashMap<String, Answer>>> = Mutex::new(None);

/// The debug file of `build_id`: from the cache, else from the first server that has it
/// (into the cache). A miss is remembered for [`MISS_FOR`]: a binary's frames do not ask
/// the network again in the meantime.
///
/// # Errors
/// [`FetchError`]: a malformed build-id, no server had it (or none answered in time), or
/// the cache cannot be written.
pub fn fetch(build_id: &str, config: &Config) -> Result<PathBuf, FetchError> {
    if build_id.len() < 2 || !build_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(FetchError::BadBuildId(build_id.to_owned()));
    }
    let build_id = build_id.to_ascii_lowercase();
    let path = config.cached(&build_id);
    if build_id_of(&path).as_deref() == Some(build_id.as_str()) {
        return Ok(path);
    }
    // One fetch at a time: two snapshots naming the same binary ask once.
    let mut asked = ASKED.lock().unwrap_or_else(PoisonError::into_inner);
    let asked = asked.get_or_insert_with(HashMap::new);
    match asked.get(&build_id) {
        Some(Ok(found)) if found.exists() => return Ok(found.clone()),
        Some(Err((e, at))) if at.elapsed() < MISS_FOR => return Err(e.clone()),
        _ => {}
    }
    let result = download(&build_id, config, &path);
    if let Err(e) = &result {
        log::warn!("{e}"); // once per build-id and MISS_FOR: each time it was asked
    }
    let remembered = match &result {
        Ok(found) => Ok(found.clone()),
        Err(e) => Err((e.clone(), Instant::now())),
    };
    asked.insert(build_id, remembered);
    result
}

/// Asks each server in turn for `build_id`'s debug file, kept at `path`.
fn download(build_id: &str, config: &Config, path: &Path) -> Result<PathBuf, FetchError> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(config.timeout))
        .timeout_recv_response(Some(config.timeout))
        .timeout_global(Some(config.max_time))
        .user_agent(concat!("lookback/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let mut whys = Vec::new();
    for url in &config.urls {
        match from_server(&agent, url, build_id, config, path) {
            Ok(()) => return Ok(path.to_owned()),
            Err(Failure::Cache(e)) => return Err(e),
            Err(Failure::Server(why)) => whys.push(format!("{url}: {why}")),
        }
    }
    Err(FetchError::Missed {
        build_id: build_id.to_owned(),
        servers: config.urls.join(" "),
        why: whys.join("; "),
    })
}

enum Failure {
    /// This server did not give it (try the next).
    Server(String),
    /// The cache cannot hold it (no point trying another server).
    Cache(FetchError),
}

/// `GET URL/buildid/ID/debuginfo` into `path`, checked.
fn from_server(
    agent: &ureq::Agent,
    url: &str,
    build_id: &str,
    config: &Config,
    path: &Path,
) -> Result<(), Failure> {
    let started = Instant::now();
    let response = agent
        .get(&format!("{url}/buildid/{build_id}/debuginfo"))
        .call()
        .map_err(|e| Failure::Server(e.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        return Err(Failure::Server(format!("HTTP {}", status.as_u16())));
    }
    let declared = response
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > config.max_size) {
        return Err(Failure::Server(format!(
            "{} bytes, more than DEBUGINFOD_MAXSIZE ({})",
            declared.unwrap_or(0),
            config.max_size
        )));
    }
    let dir = path.parent().unwrap_or(&config.cache);
    let cache_err = |e: io::Error| {
        Failure::Cache(FetchError::Cache {
            path: dir.to_owned(),
            why: e.to_string(),
        })
    };
    fs::create_dir_all(dir).map_err(cache_err)?;
    let temp = dir.join(format!(".debuginfo.{}.tmp", std::process::id()));
    let mut file = fs::File::create(&temp).map_err(cache_err)?;
    let mut body = response.into_body();
    let mut reader = body
        .with_config()
        .limit(config.max_size.saturating_add(1))
        .reader();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    let copied = loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) => break Err(Failure::Server(format!("reading the body: {e}"))),
        };
        total += n as u64;
        if total > config.max_size {
            break Err(Failure::Server(format!(
                "more than DEBUGINFOD_MAXSIZE ({}) bytes",
                config.max_size
            )));
        }
        if let Err(e) = file.write_all(&buf[..n]) {
            break Err(cache_err(e));
        }
    };
    drop(file);
    let checked = copied.and_then(|()| match build_id_of(&temp) {
        Some(id) if id == build_id => Ok(()),
        Some(id) => Err(Failure::Server(format!(
            "sent a file with build-id {id}, not {build_id}"
        ))),
        None => Err(Failure::Server("sent a file that is not ELF".to_owned())),
    });
    if let Err(e) = checked {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    fs::rename(&temp, path).map_err(cache_err)?;
    log::info!(
        "debuginfod: {url} gave the debug file of build-id {build_id} ({total} bytes in {:.1} s): {}",
        started.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config_with(vars: &[(&str, &str)], urls: Vec<String>) -> Config {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::from_values(urls, &|name| vars.get(name).cloned())
    }

    #[test]
    fn urls_are_space_separated_without_trailing_slashes() {
        assert_eq!(
            split_urls(" https://debuginfod.debian.net/  http://127.0.0.1:8002\n"),
            ["https://debuginfod.debian.net", "http://127.0.0.1:8002"]
        );
        assert!(split_urls("  ").is_empty());
    }

    #[test]
    fn settings_follow_elfutils_defaults_and_variables() {
        let urls = vec!["http://a".to_owned()];
        let plain = config_with(&[("HOME", "/home/u")], urls.clone());
        assert_eq!(plain.cache, Path::new("/home/u/.cache/debuginfod_client"));
        assert_eq!(plain.timeout, Duration::from_secs(90));
        assert_eq!(plain.max_time, Duration::from_secs(450));
        assert_eq!(plain.max_size, 1 << 30);
        let xdg = config_with(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")], urls.clone());
        assert_eq!(xdg.cache, Path::new("/x/debuginfod_client"));
        let set = config_with(
            &[
                ("DEBUGINFOD_CACHE_PATH", "/var/cache/lookback/debuginfod"),
                ("DEBUGINFOD_TIMEOUT", "5"),
                ("DEBUGINFOD_MAXTIME", "7"),
                ("DEBUGINFOD_MAXSIZE", "1000"),
                ("XDG_CACHE_HOME", "/x"),
            ],
            urls,
        );
        assert_eq!(set.cache, Path::new("/var/cache/lookback/debuginfod"));
        assert_eq!(set.timeout, Duration::from_secs(5));
        assert_eq!(set.max_time, Duration::from_secs(7));
        assert_eq!(set.max_size, 1000);
        assert_eq!(
            set.cached("abcd"),
            Path::new("/var/cache/lookback/debuginfod/abcd/debuginfo")
        );
    }

    #[test]
    fn off_and_no_urls_ask_nothing() {
        assert_eq!(Servers::Off.config(), None);
        assert_eq!(Servers::Urls(Vec::new()).config(), None);
        let given = Servers::Urls(vec!["http://x".to_owned()]).config();
        assert_eq!(given.map(|c| c.urls), Some(vec!["http://x".to_owned()]));
    }

    #[test]
    fn a_malformed_build_id_is_refused_without_asking() {
        let config = config_with(
            &[("HOME", "/nonexistent")],
            vec!["http://127.0.0.1:9".into()],
        );
        assert!(matches!(
            fetch("../etc", &config),
            Err(FetchError::BadBuildId(_))
        ));
    }

    #[test]
    fn a_server_that_is_down_is_a_miss_that_names_the_build_id_and_the_server() {
        let dir = tempfile::tempdir().expect("tempdir");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener); // nothing listens there now
        let url = format!("http://127.0.0.1:{port}");
        let config = Config {
            urls: vec![url.clone()],
            cache: dir.path().to_owned(),
            timeout: Duration::from_secs(2),
            max_time: Duration::from_secs(2),
            max_size: 1 << 20,
        };
        let id = "00112233445566778899aabbccddeeff00112233";
        let started = Instant::now();
        let err = fetch(id, &config).expect_err("nobody answers");
        let text = err.to_string();
        assert!(text.contains(id) && text.contains(&url), "{text}");
        assert!(started.elapsed() < Duration::from_secs(3), "{text}");
        // Remembered: not asked again.
        assert!(fetch(id, &config).is_err());
        assert!(!config.cached(id).exists());
    }
}
