//! `lookback snapshots list|get`: the snapshots agents uploaded, found in their bucket.
//!
//! In: an object URL (`s3://BUCKET/PREFIX`, as a rule's `output.upload.url`), filters, and
//! the store's endpoint options; credentials from the environment, as the agent takes
//! them. Out: `list` prints one line per snapshot (time, node, rule, process, trigger,
//! trace key), newest last, from the metadata objects; `get` writes one object (a trace,
//! ready for Perfetto) to a file.
#![expect(
    clippy::print_stdout,
    reason = "the listing and the file written are the command's output"
)]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, anyhow};
use clap::{Args, Subcommand};
use futures_util::TryStreamExt as _;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

use super::{CliError, CliResult};
use crate::rules::{ObjectUrl, parse_duration};
use crate::upload::layout::{KeyParts, parse_key};
use crate::upload::store::{self, StoreConfig};

#[derive(Debug, Args)]
pub struct SnapshotsArgs {
    #[command(subcommand)]
    pub command: SnapshotsCommand,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotsCommand {
    /// One line per uploaded snapshot under URL (`s3://BUCKET/PREFIX`), oldest first.
    List(ListArgs),
    /// Download one object (URL/KEY, as `list` prints it) to a file.
    Get(GetArgs),
}

/// How to reach the store (credentials: `AWS_*` in the environment).
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// An S3-compatible server instead of AWS (`AWS_ENDPOINT_URL` too).
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// The bucket's region (`AWS_REGION` too).
    #[arg(long)]
    pub region: Option<String>,
    /// Plain HTTP to `--endpoint`.
    #[arg(long)]
    pub allow_http: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Where the agents upload: `s3://BUCKET/PREFIX` (their rule's `output.upload.url`).
    pub url: String,
    /// Only this rule's snapshots.
    #[arg(long)]
    pub rule: Option<String>,
    /// Only this node's snapshots.
    #[arg(long)]
    pub node: Option<String>,
    /// Only snapshots triggered in this last stretch (`1h`, `30m`).
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// URL/KEY: `s3://BUCKET/KEY`.
    pub url: String,
    /// Where to write it (default: the key's file name, in the current directory).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub store: StoreArgs,
}

fn usage(e: impl std::fmt::Display) -> CliError {
    CliError::usage(anyhow!("{e}"))
}

/// The bucket URL and prefix (or key) of `url`.
fn parse_url(url: &str) -> Result<ObjectUrl, CliError> {
    url.parse::<ObjectUrl>().map_err(usage)
}

fn open(url: &ObjectUrl, args: &StoreArgs) -> Result<Arc<dyn ObjectStore>, CliError> {
    let config = StoreConfig {
        url: url.clone(),
        endpoint: args.endpoint.clone(),
        region: args.region.clone(),
        allow_http: args.allow_http,
    };
    store::open(&config).map_err(|e| CliError::usage(anyhow::Error::new(e)))
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
        .map_err(CliError::runtime)
}

pub fn run(args: &SnapshotsArgs) -> CliResult {
    match &args.command {
        SnapshotsCommand::List(list) => runtime()?.block_on(run_list(list)),
        SnapshotsCommand::Get(get) => runtime()?.block_on(run_get(get)),
    }
}

/// A store error as the command reports it: the store's code first.
fn store_error(what: &str, e: &object_store::Error) -> CliError {
    let code = store::ErrorCode::of(e);
    CliError::runtime(anyhow!(
        "{what}: {} ({})",
        code.code,
        crate::sys::error_chain(e)
    ))
}

async fn run_list(args: &ListArgs) -> CliResult {
    let url = parse_url(&args.url)?;
    let since_ns = match &args.since {
        Some(text) => {
            let d = parse_duration(text).map_err(usage)?;
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO);
            Some(u64::try_from(now.saturating_sub(d).as_nanos()).unwrap_or(u64::MAX))
        }
        None => None,
    };
    let store = open(&url, &args.store)?;
    // Narrow the listing to the node and rule when both or the node are given.
    let mut under = url.prefix.clone();
    if let Some(node) = &args.node {
        under = url.key(node);
        if let Some(rule) = &args.rule {
            under = format!("{under}/{rule}");
        }
    }
    let prefix = (!under.is_empty()).then(|| ObjectPath::from(under.as_str()));
    let objects: Vec<_> = store
        .list(prefix.as_ref())
        .try_collect()
        .await
        .map_err(|e| store_error(&format!("listing {url}"), &e))?;
    let mut found: Vec<(KeyParts, String)> = objects
        .iter()
        .filter_map(|o| {
            Some((
                parse_key(&url.prefix, o.location.as_ref())?,
                o.location.to_string(),
            ))
        })
        .filter(|(p, _)| p.ext == "json")
        .filter(|(p, _)| args.rule.as_ref().is_none_or(|r| *r == p.rule))
        .filter(|(p, _)| args.node.as_ref().is_none_or(|n| *n == p.node))
        .filter(|(p, _)| since_ns.is_none_or(|t| p.unix_ns.is_some_and(|at| at >= t)))
        .collect();
    found.sort_by(|a, b| a.0.unix_ns.cmp(&b.0.unix_ns).then(a.1.cmp(&b.1)));
    let traces: std::collections::HashSet<&str> =
        objects.iter().map(|o| o.location.as_ref()).collect();
    let mut out = std::io::stdout().lock();
    for (parts, key) in &found {
        let meta = store
            .get(&ObjectPath::from(key.as_str()))
            .await
            .map_err(|e| store_error(&format!("reading {key}"), &e))?
            .bytes()
            .await
            .map_err(|e| store_error(&format!("reading {key}"), &e))?;
        let meta: serde_json::Value = serde_json::from_slice(&meta).unwrap_or_default();
        let base = &key[..key.len() - ".json".len()];
        let trace = [".fxt.gz", ".json.gz"]
            .iter()
            .map(|ext| format!("{base}{ext}"))
            .find(|k| traces.contains(&k.as_str()))
            .unwrap_or_default();
        let line = if args.json {
            serde_json::json!({
                "time": parts.unix_ns.map(crate::daemon::output::utc_stamp),
                "node": parts.node,
                "rule": parts.rule,
                "pid": meta["pid"],
                "tid": meta["tid"],
                "comm": meta["comm"],
                "kind": meta["trigger"]["kind"],
                "detail": meta["trigger"]["detail"],
                "pod": meta["origin"]["pod"],
                "trace": (!trace.is_empty()).then(|| format!("{}/{trace}", url.bucket_url())),
                "metadata": format!("{}/{key}", url.bucket_url()),
            })
            .to_string()
        } else {
            format!(
                "{}  {}  {}  {} [{}/{}]  {}  {}/{}",
                parts
                    .unix_ns
                    .map_or_else(|| "-".to_owned(), crate::daemon::output::utc_stamp),
                parts.node,
                parts.rule,
                meta["comm"].as_str().unwrap_or("?"),
                meta["pid"],
                meta["tid"],
                meta["trigger"]["detail"].as_str().unwrap_or(""),
                url.bucket_url(),
                if trace.is_empty() {
                    key.as_str()
                } else {
                    trace.as_str()
                },
            )
        };
        writeln!(out, "{line}")
            .context("writing the listing")
            .map_err(CliError::runtime)?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_get(args: &GetArgs) -> CliResult {
    let url = parse_url(&args.url)?;
    if url.prefix.is_empty() {
        return Err(usage(format!("{}: no key after the bucket", args.url)));
    }
    let store = open(&url, &args.store)?;
    let key = ObjectPath::from(url.prefix.as_str());
    let bytes = store
        .get(&key)
        .await
        .map_err(|e| store_error(&format!("reading {}", args.url), &e))?
        .bytes()
        .await
        .map_err(|e| store_error(&format!("reading {}", args.url), &e))?;
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(url.prefix.rsplit('/').next().unwrap_or("snapshot")));
    std::fs::write(&out, &bytes)
        .with_context(|| format!("writing {}", out.display()))
        .map_err(CliError::runtime)?;
    println!("{} ({} bytes)", out.display(), bytes.len());
    Ok(ExitCode::SUCCESS)
}
