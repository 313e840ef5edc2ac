//! Upload: snapshots from the local spool to object storage, nothing lost when the store or
//! the agent goes down.
//!
//! In: the rules that upload ([`RuleSpool`]: name, output directory, [`UploadPolicy`]) and
//! a wake-up after each snapshot written. Out: for each snapshot, the objects
//! `PREFIX/NODE/RULE/<stem>.fxt.gz` (or `.json.gz`), `<stem>.lbsnap` with `include_raw`,
//! and `<stem>.json` last; the spool's marker once the store confirmed them all
//! ([`spool`]); and what happened, told to an [`Observer`] (the agent's metrics and
//! readiness).
//!
//! One task uploads, one snapshot at a time, oldest first, rule after rule. A failure is
//! retried with a backoff (1 s doubling to 60 s) for as long as the store is down; a
//! rejection the operator must fix (wrong credentials, a missing bucket) is also reported
//! as a reason not to be ready, and cleared by the next success. The spool directory is the
//! only state, so a restart resumes where the last run stopped; the retention that keeps
//! pending snapshots under `max_pending` is the daemon's (`daemon::retention`).

pub mod layout;
pub mod spool;
pub mod store;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use object_store::path::Path as ObjectPath;
use object_store::{Attribute, Attributes, ObjectStore, PutOptions, PutPayload};
use tokio::sync::{Notify, watch};

use crate::rules::UploadPolicy;
pub use spool::Pending;
pub use store::{ErrorCode, StoreConfig};

/// One rule whose snapshots are uploaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpool {
    pub rule: String,
    /// Its output directory (`DIR/RULE`), the spool.
    pub dir: PathBuf,
    pub policy: UploadPolicy,
}

/// What the uploader reports.
pub trait Observer: Send + Sync {
    /// A snapshot's objects are all in the store.
    fn uploaded(&self, rule: &str, took: Duration);
    /// An attempt failed with `code`.
    fn failed(&self, rule: &str, code: &ErrorCode);
    /// The rule's spool now holds `files` files, `bytes` bytes not yet uploaded.
    fn queue(&self, rule: &str, files: u64, bytes: u64);
}

/// The longest wait between two attempts while the store fails.
const MAX_BACKOFF: Duration = Duration::from_mins(1);
/// A rescan of the spools without a wake-up (files another agent run left, say).
const RESCAN: Duration = Duration::from_secs(30);

struct Shared {
    rules: Mutex<Vec<RuleSpool>>,
    /// Rule → why its uploads are refused (credentials, bucket).
    refused: Mutex<BTreeMap<String, String>>,
    wake: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain values; a panic elsewhere cannot leave them half-written.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The upload task: started once, stopped at shutdown.
pub struct Uploader {
    handle: UploadHandle,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// What the rest of the agent tells the upload task, from any thread.
#[derive(Clone)]
pub struct UploadHandle {
    shared: Arc<Shared>,
}

impl Uploader {
    /// Starts the task on the current tokio runtime. `node` names this machine in the keys
    /// of snapshots whose metadata does not (`NODE_NAME`, else the host name).
    pub fn start(node: String, observer: Arc<dyn Observer>) -> Self {
        let shared = Arc::new(Shared {
            rules: Mutex::new(Vec::new()),
            refused: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
        });
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(Arc::clone(&shared), node, observer, stopped));
        Self {
            handle: UploadHandle { shared },
            stop,
            task,
        }
    }

    /// A handle for the event loop and the snapshot writers.
    #[must_use]
    pub fn handle(&self) -> UploadHandle {
        self.handle.clone()
    }

    /// Stops after the snapshot being uploaded, or after `grace` (then that upload is
    /// abandoned: its snapshot stays in the spool and is uploaded by the next start, under
    /// the same names).
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            task.abort();
        }
    }
}

impl UploadHandle {
    /// The rules that upload now (after each load or reload); what their spools hold is
    /// uploaded, what earlier runs left included.
    pub fn set_rules(&self, rules: Vec<RuleSpool>) {
        let names: Vec<String> = rules.iter().map(|r| r.rule.clone()).collect();
        *lock(&self.shared.rules) = rules;
        lock(&self.shared.refused).retain(|rule, _| names.contains(rule));
        self.shared.wake.notify_one();
    }

    /// A snapshot was written: look at the spools now.
    pub fn wake(&self) {
        self.shared.wake.notify_one();
    }

    /// Why uploads are refused, for `/readyz`; `None` while none is.
    #[must_use]
    pub fn not_ready_reason(&self) -> Option<String> {
        let refused = lock(&self.shared.refused);
        (!refused.is_empty()).then(|| {
            refused
                .iter()
                .map(|(rule, why)| format!("rule {rule}: upload refused: {why}"))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }
}

/// A rule's failed passes in a row, and when to try it again.
#[derive(Debug, Default)]
struct Retry {
    failures: u32,
    next: Option<Instant>,
}

/// What the upload task keeps between passes.
#[derive(Default)]
struct State {
    stores: HashMap<StoreConfig, Arc<dyn ObjectStore>>,
    /// Stores whose bucket answered a listing (credentials and bucket good).
    probed: HashSet<StoreConfig>,
    /// Rule → its backoff: one rule's broken store does not delay the others.
    retries: HashMap<String, Retry>,
    /// (rule, stem) → refusals that waiting does not fix (`ErrorCode::permanent`).
    refusals: HashMap<(String, String), u32>,
}

/// Refusals of one snapshot (an object too large, say) before the rule moves on without
/// it; it stays in the spool until `max_pending` drops it.
const MAX_REFUSALS: u32 = 3;

/// The upload loop.
async fn run(
    shared: Arc<Shared>,
    node: String,
    observer: Arc<dyn Observer>,
    stopped: watch::Receiver<bool>,
) {
    let mut state = State::default();
    let mut stopped = stopped;
    loop {
        if *stopped.borrow() {
            return;
        }
        let rules = lock(&shared.rules).clone();
        for rule in &rules {
            // A rule removed or changed by a reload since this pass began is left alone.
            if !lock(&shared.rules).contains(rule) {
                continue;
            }
            let due = state
                .retries
                .get(&rule.rule)
                .and_then(|r| r.next)
                .is_none_or(|next| next <= Instant::now());
            if !due {
                continue;
            }
            let ctx = RuleCtx {
                rule,
                node: &node,
                stopped: &stopped,
            };
            // Stop is checked between snapshots: an upload in flight finishes within the
            // shutdown's grace, or is abandoned by it.
            let ok = drain(&ctx, &mut state, observer.as_ref(), &shared)
                .await
                .is_ok();
            let retry = state.retries.entry(rule.rule.clone()).or_default();
            if ok {
                *retry = Retry::default();
            } else {
                retry.failures = retry.failures.saturating_add(1);
                retry.next = Some(Instant::now() + backoff(retry.failures));
            }
            if *stopped.borrow() {
                return;
            }
        }
        // A reason for a rule a reload removed meanwhile would keep /readyz failing.
        let current: Vec<String> = lock(&shared.rules).iter().map(|r| r.rule.clone()).collect();
        lock(&shared.refused).retain(|rule, _| current.contains(rule));
        state.retries.retain(|rule, _| current.contains(rule));
        state.refusals.retain(|(rule, _), _| current.contains(rule));
        let wait = state
            .retries
            .values()
            .filter_map(|r| r.next)
            .min()
            .map_or(RESCAN, |next| {
                next.saturating_duration_since(Instant::now()).min(RESCAN)
            });
        tokio::select! {
            () = shared.wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
            _ = stopped.changed() => return,
        }
    }
}

/// 1 s, 2 s, 4 s ... up to [`MAX_BACKOFF`].
fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(6)).min(MAX_BACKOFF)
}

/// A rule and the node, as one upload needs them, and the stop signal.
struct RuleCtx<'a> {
    rule: &'a RuleSpool,
    node: &'a str,
    stopped: &'a watch::Receiver<bool>,
}

/// The store of `config`, opened once; `None` (and the rule refused) when it cannot be.
fn store_for(
    state: &mut State,
    config: &StoreConfig,
    rule: &str,
    shared: &Shared,
) -> Option<Arc<dyn ObjectStore>> {
    if let Some(store) = state.stores.get(config) {
        return Some(Arc::clone(store));
    }
    match store::open(config) {
        Ok(store) => Some(Arc::clone(
            state.stores.entry(config.clone()).or_insert(store),
        )),
        Err(e) => {
            let why = crate::sys::error_chain(&e);
            log::error!("upload {rule}: {why}");
            lock(&shared.refused).insert(rule.to_owned(), why);
            None
        }
    }
}

/// Reports a failed request: a refusal the operator must fix goes to `/readyz`.
fn report_failure(ctx: &RuleCtx<'_>, code: &ErrorCode, what: &str, shared: &Shared) {
    let rule = &ctx.rule.rule;
    let url = &ctx.rule.policy.url;
    if code.configuration {
        let why = format!("{} ({url})", code.code);
        let mut refused = lock(&shared.refused);
        if refused.get(rule) != Some(&why) {
            log::error!(
                "upload {rule}: the store refuses: {} for {url}: {}",
                code.code,
                hint(&code.code)
            );
        }
        refused.insert(rule.clone(), why);
    } else {
        log::warn!(
            "upload {rule}: {what} to {url} failed ({}); the spool {} keeps it",
            code.code,
            ctx.rule.dir.display()
        );
    }
}

/// Lists the rule's prefix once: a missing bucket or wrong credentials show before the
/// first snapshot needs them.
async fn probe(
    ctx: &RuleCtx<'_>,
    state: &mut State,
    store: &dyn ObjectStore,
    config: StoreConfig,
    observer: &dyn Observer,
    shared: &Shared,
) -> Result<(), ()> {
    let rule = &ctx.rule.rule;
    let prefix = ObjectPath::from(ctx.rule.policy.url.prefix.as_str());
    match store.list_with_delimiter(Some(&prefix)).await {
        Ok(_) => {
            state.probed.insert(config);
            if lock(&shared.refused).remove(rule).is_some() {
                log::info!("upload {rule}: the store takes uploads again");
            }
            Ok(())
        }
        Err(e) => {
            let code = ErrorCode::of(&e);
            observer.failed(rule, &code);
            report_failure(ctx, &code, "a listing", shared);
            Err(())
        }
    }
}

/// Uploads `ctx`'s pending snapshots, oldest first, until one fails; with none pending,
/// checks once that the store takes this rule's credentials and bucket.
async fn drain(
    ctx: &RuleCtx<'_>,
    state: &mut State,
    observer: &dyn Observer,
    shared: &Shared,
) -> Result<(), ()> {
    let rule = &ctx.rule.rule;
    let policy = &ctx.rule.policy;
    // Directory reads, stats and fsyncs run off the runtime's threads: the agent's event
    // loop freezes recorders on them.
    let dir = ctx.rule.dir.clone();
    let listed = tokio::task::spawn_blocking(move || spool::pending(&dir))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    let pending = match listed {
        Ok(pending) => pending,
        Err(e) => {
            log::warn!("upload {rule}: reading {}: {e}", ctx.rule.dir.display());
            return Err(());
        }
    };
    report_queue(observer, rule, &pending, policy.include_raw);
    let config = StoreConfig {
        url: policy.url.clone(),
        endpoint: policy.endpoint.clone(),
        region: policy.region.clone(),
        allow_http: policy.allow_http,
    };
    if pending.is_empty() && state.probed.contains(&config) {
        return Ok(());
    }
    let Some(store) = store_for(state, &config, rule, shared) else {
        return Err(());
    };
    if pending.is_empty() {
        return probe(ctx, state, store.as_ref(), config, observer, shared).await;
    }
    for (done, snapshot) in pending.iter().enumerate() {
        if *ctx.stopped.borrow() {
            return Ok(());
        }
        let key = (rule.clone(), snapshot.stem.clone());
        if state.refusals.get(&key).is_some_and(|n| *n >= MAX_REFUSALS) {
            continue;
        }
        let started = Instant::now();
        match upload_one(store.as_ref(), ctx, snapshot).await {
            Ok(Uploaded::Gone) => {
                // Retention removed it meanwhile (counted there when it was pending).
                log::debug!("upload {rule}: {} is gone from the spool", snapshot.stem);
            }
            Ok(Uploaded::Done) => {
                let (dir, stem) = (ctx.rule.dir.clone(), snapshot.stem.clone());
                let marked = tokio::task::spawn_blocking(move || spool::mark_uploaded(&dir, &stem))
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
                if let Err(e) = marked {
                    // Uploaded again next time, under the same names: no harm but the bytes.
                    log::warn!("upload {rule}: marking {} uploaded: {e}", snapshot.stem);
                }
                observer.uploaded(rule, started.elapsed());
                state.probed.insert(config.clone());
                if lock(&shared.refused).remove(rule).is_some() {
                    log::info!("upload {rule}: the store takes uploads again");
                }
                log::debug!(
                    "upload {rule}: {} in {:.1?}",
                    snapshot.stem,
                    started.elapsed()
                );
            }
            Err(code) if code.permanent => {
                observer.failed(rule, &code);
                let refusals = state.refusals.entry(key).or_default();
                *refusals += 1;
                if *refusals >= MAX_REFUSALS {
                    log::error!(
                        "upload {rule}: {} refused {MAX_REFUSALS} times ({}): going on without \
                         it; it stays in {} until max_pending drops it",
                        snapshot.stem,
                        code.code,
                        ctx.rule.dir.display()
                    );
                    continue;
                }
                report_failure(ctx, &code, &snapshot.stem, shared);
                return Err(());
            }
            Err(code) => {
                observer.failed(rule, &code);
                report_failure(ctx, &code, &snapshot.stem, shared);
                return Err(());
            }
        }
        report_queue(observer, rule, &pending[done + 1..], policy.include_raw);
    }
    Ok(())
}

/// What to do about a refusal.
fn hint(code: &str) -> &'static str {
    match code {
        "NoSuchBucket" | "ContainerNotFound" => "the bucket does not exist: create it",
        "InvalidAccessKeyId"
        | "SignatureDoesNotMatch"
        | "Unauthenticated"
        | "ExpiredToken"
        | "InvalidToken" => {
            "the credentials are wrong or expired (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, \
             AWS_SESSION_TOKEN, or the pod's web identity)"
        }
        _ => "the credentials may not write to this bucket and prefix",
    }
}

/// The files and bytes `pending` still has to upload.
fn report_queue(observer: &dyn Observer, rule: &str, pending: &[Pending], include_raw: bool) {
    let files = pending
        .iter()
        .map(|p| p.files(include_raw).len() as u64)
        .sum();
    let bytes = pending.iter().map(|p| p.bytes(include_raw)).sum();
    observer.queue(rule, files, bytes);
}

/// What became of one snapshot.
enum Uploaded {
    /// Every object is in the store.
    Done,
    /// Its files left the spool before they could be read (retention): nothing to do.
    Gone,
}

/// The node of a snapshot: its metadata's `origin.node`, else this machine's.
fn node_of(metadata: &serde_json::Value, fallback: &str) -> String {
    metadata["origin"]["node"]
        .as_str()
        .filter(|n| !n.is_empty() && !n.contains('/'))
        .unwrap_or(fallback)
        .to_owned()
}

/// Puts every object of `snapshot`; the metadata last.
async fn upload_one(
    store: &dyn ObjectStore,
    ctx: &RuleCtx<'_>,
    snapshot: &Pending,
) -> Result<Uploaded, ErrorCode> {
    // A local file that cannot be read will not be readable on the next try either.
    let other = |what: String| ErrorCode {
        code: what,
        configuration: false,
        permanent: true,
    };
    let metadata_bytes = match tokio::fs::read(&snapshot.metadata).await {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Uploaded::Gone),
        Err(e) => return Err(other(format!("Local{:?}", e.kind()))),
    };
    let metadata: serde_json::Value =
        serde_json::from_slice(&metadata_bytes).unwrap_or(serde_json::Value::Null);
    let node = node_of(&metadata, ctx.node);
    let mut attributes = Attributes::new();
    attributes.insert(
        Attribute::Metadata("rule".into()),
        ctx.rule.rule.clone().into(),
    );
    attributes.insert(Attribute::Metadata("node".into()), node.clone().into());
    if let Some(pod) = metadata["origin"]["pod"].as_str() {
        attributes.insert(Attribute::Metadata("pod".into()), pod.to_owned().into());
    }
    for file in snapshot.files(ctx.rule.policy.include_raw) {
        let bytes = if file == snapshot.metadata {
            metadata_bytes.clone()
        } else {
            match tokio::fs::read(file).await {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Uploaded::Gone),
                Err(e) => return Err(other(format!("Local{:?}", e.kind()))),
            }
        };
        let key = layout::object_key(&ctx.rule.policy.url, &node, &ctx.rule.rule, file);
        let mut attributes = attributes.clone();
        attributes.insert(Attribute::ContentType, content_type(file).into());
        let options = PutOptions {
            attributes,
            ..PutOptions::default()
        };
        store
            .put_opts(&key, PutPayload::from(bytes), options)
            .await
            .map_err(|e| ErrorCode::of(&e))?;
    }
    Ok(Uploaded::Done)
}

fn content_type(file: &Path) -> &'static str {
    let name = file.to_string_lossy();
    if name.ends_with(".gz") {
        "application/gzip"
    } else if name.ends_with(".json") {
        "application/json"
    } else {
        "application/octet-stream"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_prefix_node_rule_and_the_file_name() {
        let policy = UploadPolicy {
            url: crate::rules::ObjectUrl {
                scheme: "s3".to_owned(),
                bucket: "b".to_owned(),
                prefix: "fleet/lb".to_owned(),
            },
            endpoint: None,
            region: None,
            allow_http: false,
            include_raw: false,
            max_pending: 1,
        };
        let key = layout::object_key(&policy.url, "node-1", "slow", Path::new("/o/slow/S.fxt.gz"));
        assert_eq!(key.as_ref(), "fleet/lb/node-1/slow/S.fxt.gz");
        let meta = serde_json::json!({"origin": {"node": "n7"}});
        assert_eq!(node_of(&meta, "here"), "n7");
        assert_eq!(node_of(&serde_json::Value::Null, "here"), "here");
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(30), MAX_BACKOFF);
    }
}
