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

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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

/// The upload loop.
async fn run(
    shared: Arc<Shared>,
    node: String,
    observer: Arc<dyn Observer>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut stores: HashMap<StoreConfig, Arc<dyn ObjectStore>> = HashMap::new();
    let mut failures: u32 = 0;
    loop {
        if *stopped.borrow() {
            return;
        }
        let rules = lock(&shared.rules).clone();
        let mut failed = false;
        for rule in &rules {
            // A rule removed or changed by a reload since this pass began is left alone.
            if !lock(&shared.rules).contains(rule) {
                continue;
            }
            let ctx = RuleCtx {
                rule,
                node: &node,
                stopped: &stopped,
            };
            // Stop is checked between snapshots: an upload in flight finishes within the
            // shutdown's grace, or is abandoned by it.
            failed |= drain(&ctx, &mut stores, observer.as_ref(), &shared)
                .await
                .is_err();
            if *stopped.borrow() {
                return;
            }
        }
        // A reason for a rule a reload removed meanwhile would keep /readyz failing.
        let current: Vec<String> = lock(&shared.rules).iter().map(|r| r.rule.clone()).collect();
        lock(&shared.refused).retain(|rule, _| current.contains(rule));
        let wait = if failed {
            failures = failures.saturating_add(1);
            backoff(failures)
        } else {
            failures = 0;
            RESCAN
        };
        tokio::select! {
            () = shared.wake.notified(), if !failed => {}
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

/// Uploads `ctx`'s pending snapshots, oldest first, until one fails.
async fn drain(
    ctx: &RuleCtx<'_>,
    stores: &mut HashMap<StoreConfig, Arc<dyn ObjectStore>>,
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
    if pending.is_empty() {
        return Ok(());
    }
    let config = StoreConfig {
        url: policy.url.clone(),
        endpoint: policy.endpoint.clone(),
        region: policy.region.clone(),
        allow_http: policy.allow_http,
    };
    let store = if let Some(store) = stores.get(&config) {
        Arc::clone(store)
    } else {
        match store::open(&config) {
            Ok(store) => Arc::clone(stores.entry(config).or_insert(store)),
            Err(e) => {
                let why = crate::sys::error_chain(&e);
                log::error!("upload {rule}: {why}");
                lock(&shared.refused).insert(rule.clone(), why);
                return Err(());
            }
        }
    };
    for (done, snapshot) in pending.iter().enumerate() {
        if *ctx.stopped.borrow() {
            return Ok(());
        }
        let started = Instant::now();
        match upload_one(store.as_ref(), ctx, snapshot).await {
            Ok(Uploaded::Gone) => {
                // Retention removed it meanwhile (counted there when it was pending).
                log::debug!("upload {rule}: {} is gone from the spool", snapshot.stem);
                report_queue(observer, rule, &pending[done + 1..], policy.include_raw);
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
                if lock(&shared.refused).remove(rule).is_some() {
                    log::info!("upload {rule}: the store takes uploads again");
                }
                log::debug!(
                    "upload {rule}: {} in {:.1?}",
                    snapshot.stem,
                    started.elapsed()
                );
                report_queue(observer, rule, &pending[done + 1..], policy.include_raw);
            }
            Err(code) => {
                observer.failed(rule, &code);
                if code.configuration {
                    let why = format!("{} ({})", code.code, policy.url);
                    let mut refused = lock(&shared.refused);
                    if refused.get(rule) != Some(&why) {
                        log::error!(
                            "upload {rule}: the store refuses: {} for {}: {}",
                            code.code,
                            policy.url,
                            hint(&code.code)
                        );
                    }
                    refused.insert(rule.clone(), why);
                } else {
                    log::warn!(
                        "upload {rule}: {} to {} failed ({}); {} snapshot(s) wait in {}",
                        snapshot.stem,
                        policy.url,
                        code.code,
                        pending.len() - done,
                        ctx.rule.dir.display()
                    );
                }
                return Err(());
            }
        }
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
    let other = |what: String| ErrorCode {
        code: what,
        configuration: false,
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
