//! The daemon (`lookback agent`): rules from a YAML file applied to every matching process
//! on the machine, snapshots to disk, Prometheus metrics. The last pipeline stage: it drives
//! triggers → capture → snapshot → decode → writer for many targets at once.
//!
//! - [`config`]: the rules file and how a new version is noticed (SIGHUP or a change).
//! - [`discovery`]: which processes match a rule's target (pid, comm, exe, cgroup), found by
//!   a `/proc` scan at start and by exec/exit events from the kernel afterwards.
//! - [`kubernetes`]: the `kubernetes` target selector (pods on this node → cgroups, PIDs).
//! - [`targets`]: rules in the engine, probes per binary, one recorder per traced process.
//! - [`pipeline`]: trigger → freeze (here, on the event loop: it must be quick) → decode and
//!   write (on the blocking pool, bounded) → retention.
//! - [`output`] and [`retention`]: the file layout of contract.md, atomic writes, pruning.
//! - [`metrics`] and [`http`]: the Prometheus registry and the `/metrics`, `/healthz`,
//!   `/readyz` server.

pub mod config;
pub mod discovery;
pub mod early_freeze;
pub mod exec_accounting;
pub mod http;
pub mod kubernetes;
pub mod limits;
pub mod metrics;
pub mod output;
pub mod pipeline;
pub mod pod_targets;
pub mod privileges;
pub mod readiness;
pub mod retention;
pub mod selected;
pub mod targets;
pub mod upload_metrics;

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::signal::unix::{SignalKind, signal};

use self::early_freeze::EarlyFreeze;
use self::{
    config::ConfigFile,
    http::{HttpError, HttpState},
    metrics::{Metrics, MetricsError},
    pipeline::Pipeline,
    pod_targets::PodSelection,
    readiness::{RuleProbes, not_ready_reason},
    targets::{ApplyError, ErrorChain, RuleChanges, Tracer},
};
use crate::{
    capture::BackendRequest,
    check::{self, Backend},
    rules::{RuleSet, RulesError, Trigger},
    triggers::{
        TriggerEngine, TriggerError,
        pump::{PumpError, TriggerPump, Wait},
        stream::{ProcessEvent, ProcessEventStream, forward_logs},
    },
    upload::{RuleSpool, UploadHandle, Uploader},
};

/// Where snapshots go when neither `--output-dir` nor the rule's `output.dir` says.
pub const DEFAULT_OUTPUT_DIR: &str = "/var/lib/lookback";
/// `--metrics-addr` default (contract.md).
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub config: PathBuf,
    pub metrics_addr: String,
    /// Overrides every rule's `output.dir`.
    pub output_dir: Option<PathBuf>,
    /// Where processes are found (`/proc`; the host's `/proc` in a container with hostPID).
    pub proc_root: PathBuf,
    /// Snapshots queued or being written at once; a trigger beyond is suppressed (`busy`).
    pub max_queued: usize,
    /// Snapshots decoded at once (each takes a core while it decodes).
    pub workers: usize,
    /// How long SIGTERM waits for snapshots in flight.
    pub shutdown_timeout: Duration,
    /// Full `/proc` rescans, a safety net for exec events a full ring dropped.
    pub rescan_interval: Duration,
    /// Collect eBPF program run time (`lookback_bpf_program_*`; ~20 ns per program run).
    pub bpf_stats: bool,
    /// Processes the kernel's target set holds at most.
    pub max_targets: u32,
    /// Files of traced processes held open at most (`capture::held_files`).
    pub max_held_files: usize,
    /// TLS and basic auth of the HTTP endpoint (`--web-config`; `http::web_config`).
    pub web_config: Option<PathBuf>,
}

impl AgentOptions {
    /// Defaults for everything but the config file.
    pub fn new(config: PathBuf) -> Self {
        Self {
            config,
            metrics_addr: DEFAULT_METRICS_ADDR.to_owned(),
            output_dir: None,
            proc_root: PathBuf::from("/proc"),
            max_queued: 8,
            workers: 2,
            shutdown_timeout: Duration::from_secs(10),
            rescan_interval: rescan_interval(),
            bpf_stats: false,
            max_targets: lookback_common::process::DEFAULT_MAX_TARGETS,
            max_held_files: crate::capture::held_files::DEFAULT_LIMIT,
            web_config: None,
        }
    }
}

/// Removes, once at start, the temporary files a write killed part-way (`kill -9`) left
/// in the directories the rules write to (`--output-dir`, else each rule's `output.dir`,
/// else the default): nothing else would ever remove them.
fn remove_stale_temp_files(opts: &AgentOptions, rules: &RuleSet) {
    let dirs: std::collections::BTreeSet<PathBuf> = match &opts.output_dir {
        Some(dir) => std::iter::once(dir.clone()).collect(),
        None => rules
            .rules
            .iter()
            .map(|r| {
                r.output
                    .dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_OUTPUT_DIR))
            })
            .collect(),
    };
    for dir in dirs {
        match retention::remove_stale_temp_files(&dir, std::process::id()) {
            Ok(0) => {}
            Ok(n) => log::info!(
                "removed {n} temporary file(s) an interrupted write left in {}",
                dir.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => log::warn!("temporary files in {}: {e}", dir.display()),
        }
    }
}

/// `LOOKBACK_RESCAN_SECS` (tests), else 30 s.
fn rescan_interval() -> Duration {
    std::env::var("LOOKBACK_RESCAN_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(30), Duration::from_secs)
}

/// Why the agent could not start (after it started, errors are logged and counted).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] RulesError),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("loading the trigger engine")]
    Engine(#[from] TriggerError),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    WebConfig(#[from] http::web_config::WebConfigError),
    #[error("metrics")]
    Metrics(#[from] MetricsError),
    #[error("starting the trigger thread")]
    Pump(#[from] PumpError),
    #[error("setting up the agent")]
    Io(#[from] std::io::Error),
}

impl DaemonError {
    /// Whether the user must fix their input (exit 2) rather than the machine (exit 1).
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Config(_) | Self::Apply(_) | Self::WebConfig(_))
    }
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn run(opts: AgentOptions) -> Result<(), DaemonError> {
    limit_malloc_arenas();
    // A fixed set of long-lived blocking threads for the decode/write jobs: glibc gives
    // each new thread an arena it keeps, so threads that come and go grow RSS for good.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(opts.workers.max(1) + 1)
        .thread_keep_alive(Duration::from_hours(24))
        .build()?;
    let result = runtime.block_on(run_async(opts));
    // A decode still running after `--shutdown-timeout` cannot be aborted (it is on the
    // blocking pool), and dropping the runtime would wait for it without bound: leave it
    // behind; the process exits under it.
    runtime.shutdown_timeout(SHUTDOWN_MARGIN);
    result
}

/// How long the runtime waits for abandoned blocking jobs after `--shutdown-timeout`.
const SHUTDOWN_MARGIN: Duration = Duration::from_millis(500);

/// At most two glibc malloc arenas: the decode jobs allocate and free tens of megabytes
/// each; with an arena per thread that high-water mark is kept once per thread (measured:
/// `cargo xtask soak`, docs/benchmarks.md).
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Gives the memory a finished snapshot freed back to the system (glibc keeps freed heap
/// pages otherwise, and the agent's RSS stays at its largest snapshot forever).
pub(crate) fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim walks the allocator's own free lists; no pointers are passed.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "start-up, the one select over every event source, and shutdown read best together"
)]
async fn run_async(opts: AgentOptions) -> Result<(), DaemonError> {
    limits::raise_open_files();
    let held_limit = limits::held_files_limit(opts.max_held_files);
    crate::capture::held_files::HeldFiles::global().set_limit(held_limit);
    let mut config = ConfigFile::new(opts.config.clone());
    let rules = config.load()?;
    remove_stale_temp_files(&opts, &rules);
    let choice = check::probe_backend(&check::Paths::default());
    let auto = match choice.backend {
        Some(Backend::IntelPt) => BackendRequest::IntelPt,
        _ => BackendRequest::Sampling,
    };
    log::info!(
        "backend auto: {}, because {}",
        choice.backend.map_or("none", Backend::as_str),
        choice.reason
    );
    let metrics = Arc::new(Metrics::new(
        choice.backend.map_or("none", Backend::as_str),
    )?);
    let web = match &opts.web_config {
        Some(path) => http::web_config::WebConfig::from_file(path)?,
        None => http::web_config::WebConfig::default(),
    };
    let scheme = if web.tls.is_some() { "https" } else { "http" };
    let users = if web.users.is_empty() {
        String::new()
    } else {
        format!(" (basic auth: {} user(s))", web.users.len())
    };
    let listener = http::bind(&opts.metrics_addr).await?;
    log::info!(
        "metrics on {scheme}://{}/metrics{users}",
        listener
            .local_addr()
            .map_or_else(|_| opts.metrics_addr.clone(), |a| a.to_string())
    );
    let state = Arc::new(HttpState::new(Arc::clone(&metrics)).with_web_config(web));
    state.readiness.set_not_ready("loading rules");
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(http::serve(listener, Arc::clone(&state), async {
        let _ = http_stopped.await;
    }));

    let mut engine = TriggerEngine::load_sized(
        lookback_common::MAX_RULES,
        opts.max_targets,
        crate::triggers::engine::RUNNING_THREADS,
    )?;
    if let Some(logger) = engine.logger() {
        tokio::spawn(forward_logs(logger));
    }
    // Triggers are read by their own thread, which stops the triggering process's recorder
    // before the event loop gets to the trigger (`early_freeze`).
    let early = Arc::new(EarlyFreeze::default());
    let hook_table = Arc::clone(&early);
    let mut triggers = TriggerPump::start(
        engine.take_events()?,
        Box::new(move |record| {
            hook_table.on_trigger(record);
            // The first to hear of a crash: the files of the process are secured before
            // it is gone, if it was not traced long enough for the event loop to.
            crate::capture::held_files::HeldFiles::global().secure_for_trigger(record.pid);
        }),
        Wait::Sleep,
    )?;
    let mut processes = ProcessEventStream::new(engine.take_process_events()?)?;
    engine.enable_process_events()?;
    let _bpf_stats = if opts.bpf_stats {
        match metrics::enable_bpf_stats() {
            Ok(guard) => Some(guard),
            Err(e) => {
                log::warn!("{}", ErrorChain(&e));
                None
            }
        }
    } else {
        None
    };
    let assessment = privileges::assess(
        engine.attach_path(),
        &check::own_capabilities(),
        check::probe_uprobe_perf_event,
    );
    assessment.log();
    let mut tracer = Tracer::new(engine, opts.proc_root.clone(), auto, early);
    tracer.set_function_probes(assessment.function.map(|_| ()));
    let mut pods = start_pods(&opts, &rules, &mut tracer);
    let (mut pipeline, mut due) = Pipeline::new(&opts, Arc::clone(&metrics));
    let observer: Arc<dyn crate::upload::Observer> = metrics.upload().clone();
    let uploader = Uploader::start(node_name(), observer);
    let uploads = uploader.handle();
    pipeline.set_uploads(uploads.clone());
    let changes = tracer.apply_rules(&rules)?;
    report_changes(&changes);
    let mut inflight = None;
    crate::inflight::ensure_watcher(&mut inflight, tracer.engine());
    set_upload_rules(&opts, &rules, &uploads, &metrics);
    // Rules the last accepted rule file could not install, for readiness.
    let mut failed = changes.failed;
    after_rules(&tracer, &metrics, &state, &failed, &uploads);
    log::info!(
        "agent ready: {} rule(s), {} process(es) traced",
        tracer.rules().count(),
        tracer.process_count()
    );

    let hangups = crate::sys::signals::Counter::register(libc::SIGHUP)?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut config_tick = tokio::time::interval(Duration::from_secs(1));
    let mut rescan = tokio::time::interval(opts.rescan_interval);
    let mut kernel_targets_at = None;
    rescan.reset();
    loop {
        tokio::select! {
            batch = triggers.next_batch() => match batch {
                Ok(events) => for event in events {
                    pipeline.on_trigger(&mut tracer, event);
                },
                Err(e) => log::error!("reading triggers: {e}"),
            },
            batch = processes.next_batch() => match batch {
                Ok(events) => for event in events {
                    match event {
                        ProcessEvent::Exec { tgid, at_ns, selected } => {
                            tracer.note_selected(tgid, selected);
                            let outcome = tracer.consider_exec(tgid, at_ns);
                            if selected != 0 {
                                metrics.count_exec_outcome(outcome);
                            }
                            for rule in tracer.take_late_probes() {
                                metrics.count_late_probe(&rule);
                            }
                            // The first process of a selected container: its cgroup goes
                            // into the kernel's target set for the ones after it.
                            if let Some(p) = pods.as_mut()
                                && p.absorb_observed()
                            {
                                tracer.set_cgroup_targets(p.cgroups());
                            }
                        }
                        ProcessEvent::Exit { tgid } => {
                            // Its last triggers happened before its exit: handle them
                            // while its recorder is still there.
                            for event in triggers.drain() {
                                pipeline.on_trigger(&mut tracer, event);
                            }
                            // A freeze waiting for post_trigger happens now: the process
                            // is gone, and its recorder goes with it.
                            pipeline.freeze_pending(&mut tracer, tgid);
                            tracer.forget(tgid, true);
                        }
                    }
                },
                Err(e) => log::error!("reading process events: {e}"),
            },
            Some(pid) = due.recv() => pipeline.freeze_pending(&mut tracer, pid),
            Some(()) = pipeline.next_done() => {}
            _ = tick.tick() => {
                refresh_metrics(&tracer, &metrics);
                if let Some(watcher) = &inflight {
                    metrics.observe_inflight(watcher.stats());
                }
                refresh_kernel_targets(&tracer, &metrics, &mut kernel_targets_at);
                tracer.retry_recorders();
                update_readiness(&tracer, &state, &failed, &uploads);
                tracer.poll_recorders();
                if let Some(p) = pods.as_mut()
                    && sync_pods(p, &mut tracer, false)
                {
                    tracer.rescan();
                }
            }
            _ = config_tick.tick() => {
                if config.changed() {
                    log::info!("{} changed; reloading", config.path().display());
                    if let Some(f) = reload(&opts, &mut config, &mut tracer, &metrics, &state, &uploads) {
                        crate::inflight::ensure_watcher(&mut inflight, tracer.engine());
                        failed = f;
                    }
                    reload_pods(&opts, &mut pods, &mut tracer);
                }
            }
            _ = rescan.tick() => {
                if let Some(p) = pods.as_mut() {
                    // Containers that gained their first process since: their cgroups.
                    sync_pods(p, &mut tracer, true);
                }
                tracer.rescan();
            }
            _ = sighup.recv() => {
                match hangups.take() {
                    n @ 2.. => log::info!(
                        "SIGHUP ({n} since the last reload, folded into one): reloading {}",
                        config.path().display()
                    ),
                    _ => log::info!("SIGHUP: reloading {}", config.path().display()),
                }
                if let Some(f) = reload(&opts, &mut config, &mut tracer, &metrics, &state, &uploads) {
                    crate::inflight::ensure_watcher(&mut inflight, tracer.engine());
                    failed = f;
                }
                reload_pods(&opts, &mut pods, &mut tracer);
            }
            _ = sigterm.recv() => { log::info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { log::info!("SIGINT: shutting down"); break; }
        }
    }
    state.readiness.set_not_ready("shutting down");
    // Stop triggers first: no new snapshot starts while the last ones are written.
    drop(triggers);
    pipeline.freeze_all_pending(&mut tracer);
    pipeline.finish(opts.shutdown_timeout).await;
    // What is not uploaded by now stays in the spool for the next start.
    uploader.shutdown(UPLOAD_GRACE).await;
    refresh_metrics(&tracer, &metrics);
    drop(processes);
    drop(tracer); // detaches every probe, closes every recorder
    let _ = stop_http.send(());
    let _ = server.await;
    log::info!("agent stopped; every probe detached");
    Ok(())
}

/// Starts the pod watcher when a rule selects by Kubernetes pod; without it (not in a
/// cluster, no `NODE_NAME`) those rules select nothing, which is logged.
fn start_pods(opts: &AgentOptions, rules: &RuleSet, tracer: &mut Tracer) -> Option<PodSelection> {
    // In a cluster the watcher also names the pod of each snapshot's container (origin),
    // whatever the rules select by.
    let needed = PodSelection::needed(&rules.rules);
    if !needed && std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        return None;
    }
    match PodSelection::start(opts.proc_root.clone()) {
        Ok(p) => {
            tracer.set_pod_matcher(p.matcher());
            tracer.set_pod_of(p.pod_of());
            Some(p)
        }
        Err(e) if needed => {
            log::error!("kubernetes selectors match nothing: {}", ErrorChain(&e));
            None
        }
        Err(e) => {
            log::warn!(
                "snapshots will not name their pods (no pod watcher): {}",
                ErrorChain(&e)
            );
            None
        }
    }
}

/// Recomputes what the rules select from the pods (when the pods changed, or `force`) and
/// puts the selected containers' cgroups into the kernel; returns whether it did, so the
/// caller rescans. Cheap when nothing changed: the rules are only copied when needed.
fn sync_pods(p: &mut PodSelection, tracer: &mut Tracer, force: bool) -> bool {
    if !force && !p.pods_changed() {
        return false;
    }
    let rules: Vec<_> = tracer.rules().map(|a| a.rule.clone()).collect();
    p.refresh(&rules, true);
    tracer.set_cgroup_targets(p.cgroups());
    // Only the pods of snapshots' origin changed when no rule selects by pod: nothing to
    // rescan for.
    PodSelection::needed(&rules)
}

/// After a reload: start the pod watcher if a new rule needs it, and recompute what the
/// rules select.
fn reload_pods(opts: &AgentOptions, pods: &mut Option<PodSelection>, tracer: &mut Tracer) {
    if let Some(p) = pods {
        sync_pods(p, tracer, true);
        tracer.rescan();
    } else {
        let rules = tracer.rules().map(|a| a.rule.clone()).collect();
        *pods = start_pods(opts, &RuleSet { rules }, tracer);
        if pods.is_some() {
            tracer.rescan();
        }
    }
}

/// Applies the rule file again; returns the rules it could not install, or `None` when the
/// file was rejected (the previous rules keep running).
fn reload(
    opts: &AgentOptions,
    config: &mut ConfigFile,
    tracer: &mut Tracer,
    metrics: &Metrics,
    state: &HttpState,
    uploads: &UploadHandle,
) -> Option<Vec<String>> {
    let rules: RuleSet = match config.load() {
        Ok(rules) => rules,
        Err(e) => {
            log::error!("reload rejected, the previous rules keep running: {e}");
            metrics.config_reload(false);
            return None;
        }
    };
    match tracer.apply_rules(&rules) {
        Ok(changes) => {
            report_changes(&changes);
            // What the old versions counted since the last read, before their series
            // start over from the new versions' counters.
            for (name, counters) in &changes.retired_counters {
                metrics.observe_rule_counters(name, counters);
            }
            // A rule changed in place keeps its id and counters: its series go on.
            for name in changes
                .removed
                .iter()
                .chain(&changes.changed)
                .filter(|n| !changes.in_place.contains(n))
            {
                metrics.remove_rule(name);
            }
            metrics.config_reload(true);
            set_upload_rules(opts, &rules, uploads, metrics);
            after_rules(tracer, metrics, state, &changes.failed, uploads);
            Some(changes.failed)
        }
        Err(e) => {
            log::error!("reload rejected, the previous rules keep running: {e}");
            metrics.config_reload(false);
            None
        }
    }
}

fn report_changes(c: &RuleChanges) {
    log::info!(
        "rules: {} added, {} changed, {} removed, {} unchanged{}",
        c.added.len(),
        c.changed.len(),
        c.removed.len(),
        c.unchanged.len(),
        if c.failed.is_empty() {
            String::new()
        } else {
            format!("; not installed: {}", c.failed.join(", "))
        }
    );
}

/// Gauges and readiness after the rule set changed.
fn after_rules(
    tracer: &Tracer,
    metrics: &Metrics,
    state: &HttpState,
    failed: &[String],
    uploads: &UploadHandle,
) {
    metrics.set_rules_loaded(tracer.rules().count());
    refresh_metrics(tracer, metrics);
    update_readiness(tracer, state, failed, uploads);
}

/// How long an upload in flight may finish at shutdown; the rest waits for the next start.
const UPLOAD_GRACE: Duration = Duration::from_secs(3);

/// This machine's name in object keys: `NODE_NAME` (the `DaemonSet` sets it from the
/// downward API), else the host name.
fn node_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty() && !n.contains('/'))
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "unknown-node".to_owned())
}

/// Tells the uploader which rules upload, and where their spools are.
fn set_upload_rules(
    opts: &AgentOptions,
    rules: &RuleSet,
    uploads: &UploadHandle,
    metrics: &Metrics,
) {
    let spools: Vec<RuleSpool> = rules
        .rules
        .iter()
        .filter_map(|rule| {
            let policy = rule.output.upload.clone()?;
            let root = opts
                .output_dir
                .clone()
                .or_else(|| rule.output.dir.clone())
                .unwrap_or_else(|| PathBuf::from(DEFAULT_OUTPUT_DIR));
            metrics.upload().init_rule(&rule.name);
            log::info!(
                "rule {}: snapshots upload to {} from {}",
                rule.name,
                policy.url,
                root.join(&rule.name).display()
            );
            Some(RuleSpool {
                rule: rule.name.clone(),
                dir: root.join(&rule.name),
                policy,
            })
        })
        .collect();
    let names: Vec<String> = spools.iter().map(|s| s.rule.clone()).collect();
    metrics.upload().retain_rules(&names);
    uploads.set_rules(spools);
}

/// Sets `/readyz` from the installed rules and their probes, and from the recorders a
/// resource limit kept from opening: after a rule change, and on every tick, since probes
/// and recorders come and go with the processes. A change to not ready is
/// logged once, with the reason.
fn update_readiness(tracer: &Tracer, state: &HttpState, failed: &[String], uploads: &UploadHandle) {
    let installed: Vec<RuleProbes<'_>> = tracer
        .rules()
        .map(|a| RuleProbes {
            rule: &a.rule.name,
            // A rule the agent's privileges cannot serve is not ready before its first
            // target shows up: it would never fire for it.
            needs_probes: match &a.rule.trigger {
                Trigger::Function(f) => {
                    !a.targets.is_empty()
                        || f.binary.is_some()
                        || a.rule.target.exe.is_some()
                        || a.probe_error_reason == Some(privileges::CAPABILITY)
                }
                _ => false,
            },
            probes: tracer.engine().probe_count(a.id),
            error: a.probe_error.as_deref(),
        })
        .collect();
    let resources = limits::recorders_missing(&tracer.recorders_missing());
    let shared = limits::shared_rings_missing(tracer.shared_missing());
    let probes = limits::probes_missing(&tracer.probes_missing());
    match not_ready_reason(&installed, failed)
        .into_iter()
        .chain(resources)
        .chain(shared)
        .chain(probes)
        .chain(uploads.not_ready_reason())
        .reduce(|a, b| format!("{a}; {b}"))
    {
        Some(reason) => {
            if state.readiness.status().err().as_deref() != Some(reason.as_str()) {
                log::error!("not ready: {reason}");
            }
            state.readiness.set_not_ready(reason);
        }
        None => state.readiness.set_ready(),
    }
}

/// Copies the kernel counters and the target/probe gauges into the registry.
fn refresh_metrics(tracer: &Tracer, metrics: &Metrics) {
    for active in tracer.rules() {
        match tracer.engine().counters(active.id) {
            Ok(c) => metrics.observe_rule_counters(&active.rule.name, &c),
            Err(e) => log::debug!("counters of {}: {}", active.rule.name, ErrorChain(&e)),
        }
        metrics.set_targets(&active.rule.name, active.targets.len());
        metrics.set_probes(&active.rule.name, tracer.engine().probe_count(active.id));
        metrics.set_probe_error(&active.rule.name, active.probe_error_reason);
    }
    metrics.observe_program_stats(&tracer.engine().program_stats());
    metrics.observe_held_files(crate::capture::held_files::HeldFiles::global().stats());
    metrics.observe_errors(tracer.errors());
    match tracer.engine().exec_selected() {
        Ok(now) => metrics.observe_exec_selected(now),
        Err(e) => log::debug!("processes selected at exec: {}", ErrorChain(&e)),
    }
    match tracer.engine().target_set_full() {
        Ok(total) => {
            let left_out = metrics.observe_target_set_full(total + tracer.target_set_refused());
            if left_out > 0 {
                log::warn!(
                    "{left_out} process(es) not added to the kernel's target set: it is \
                     full ({} processes; raise `lookback agent --max-targets`); they are \
                     not traced",
                    tracer.engine().max_targets()
                );
            }
        }
        Err(e) => log::debug!("target set full: {}", ErrorChain(&e)),
    }
    match tracer.engine().process_events_lost() {
        Ok(total) => {
            let lost = metrics.observe_process_events_lost(total);
            if lost > 0 {
                log::warn!(
                    "{lost} exec/exit event(s) dropped from a full ring; the next /proc rescan \
                     finds the processes they were about"
                );
            }
        }
        Err(e) => log::debug!("dropped process events: {}", ErrorChain(&e)),
    }
}

/// How often `lookback_kernel_targets` is counted: one pass over the kernel's target set
/// is a syscall per target, too many for every 250 ms tick on a busy node.
const KERNEL_TARGETS_EVERY: Duration = Duration::from_secs(5);

/// `lookback_kernel_targets`, when [`KERNEL_TARGETS_EVERY`] has passed since `last`.
fn refresh_kernel_targets(tracer: &Tracer, metrics: &Metrics, last: &mut Option<Instant>) {
    if last.is_some_and(|at| at.elapsed() < KERNEL_TARGETS_EVERY) {
        return;
    }
    *last = Some(Instant::now());
    match tracer.engine().kernel_targets() {
        Ok(targets) => metrics.set_kernel_targets(targets.len()),
        Err(e) => log::debug!("kernel target set: {}", ErrorChain(&e)),
    }
}
