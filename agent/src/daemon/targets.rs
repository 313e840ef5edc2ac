//! The daemon's live state: which rules are installed in the trigger engine (with their
//! kernel ids and uprobes), which processes each rule targets, and one flight recorder per
//! traced process.
//!
//! Rules are applied by difference ([`Tracer::apply_rules`]): a rule whose definition did
//! not change keeps its id, probes, kernel counters and cooldown state. Processes are
//! (re)evaluated one at a time ([`Tracer::consider`]) on exec events and by rescans.
//! Uprobes go on files, not processes: a function rule gets one probe per binary inode, and
//! the kernel filters by the target set (`TARGET_TGIDS`), so a hundred processes of one
//! program cost one probe.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use lookback_common::MAX_RULES;

use super::discovery::{self, ProcessInfo};
use super::early_freeze::EarlyFreeze;
use super::exec_accounting::Outcome;
use super::limits::ErrorTally;
use crate::{
    capture::{self, BackendRequest, CaptureOptions, Recorder, aux_pause, held_files::HeldFiles},
    rules::{self, Rule, RuleSet, Trigger},
    snapshot::Origin,
    triggers::{
        EngineRule, TriggerEngine, TriggerError,
        engine::{AttachedProbe, FrozenProcesses, kernel_freeze},
        resolve::{self, ResolveError},
    },
};

/// Decides whether a process is in a pod a rule's `kubernetes` selector picks.
pub type PodMatcher = Box<dyn Fn(&Rule, &ProcessInfo) -> bool + Send>;

/// The pod a container (by id) belongs to, when the agent follows the node's pods.
pub type PodOf = Box<dyn Fn(&str) -> Option<PodRef> + Send>;

/// A container's pod: namespace, pod name and container name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// A rule installed in the engine.
pub struct ActiveRule {
    pub rule: Rule,
    /// Kernel rule id (bit in the target masks).
    pub id: u32,
    /// Processes the rule currently targets.
    pub targets: BTreeSet<u32>,
    /// Binaries (device, inode) already examined for the function symbol: probed, or
    /// reported as missing the symbol (reported once, not on every exec).
    binaries: BTreeMap<BinaryKey, bool>,
    /// Binaries whose probe a resource limit refused: tried again (not examined for
    /// good), and the agent is not ready while any is left.
    limited: BTreeMap<BinaryKey, LimitedProbe>,
    /// The last probe problem, for readiness and logs.
    pub probe_error: Option<String>,
    /// Its short reason (`lookback_rule_probe_errors`).
    pub probe_error_reason: Option<&'static str>,
    /// When the rule was installed ([`discovery::now_ticks`], and `CLOCK_MONOTONIC` ns):
    /// a process started later that gets the rule's probe only now ran unprobed for a
    /// while.
    installed_ticks: Option<u64>,
    installed_ns: u64,
}

/// Which file a binary is, for placing its probe once: a uprobe goes on the file's real
/// inode, so every process (and every container) that runs it is covered by one probe.
///
/// A file on an overlay file system (a container's root) shows the overlay's device,
/// which differs for every container, over the inode of the image layer's file, which
/// they share: there the key is its inode number with its size and modification and
/// change times (the layer file's), not the device. Elsewhere it is (device, inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct BinaryKey {
    /// 0 on an overlay file system.
    dev: u64,
    ino: u64,
    /// 0 unless on an overlay file system.
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl BinaryKey {
    fn of(path: &Path, meta: &std::fs::Metadata) -> Self {
        if crate::sys::is_overlayfs(path) {
            let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
            Self {
                dev: 0,
                ino: meta.ino(),
                size: meta.size(),
                mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
                ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            }
        } else {
            Self {
                dev: meta.dev(),
                ino: meta.ino(),
                size: 0,
                mtime_ns: 0,
                ctime_ns: 0,
            }
        }
    }
}

/// A probe a resource limit refused (`EMFILE`, `ENOMEM`, ...): tried again each
/// [`RECORDER_RETRY`], for the process it was placed for (`None`: the binary the rule
/// names, probed at install); a limit raised or fds freed bring it back without a restart.
#[derive(Debug, Clone)]
struct LimitedProbe {
    binary: PathBuf,
    pid: Option<u32>,
    errno: &'static str,
    at: Instant,
}

/// Whether a process that got a rule's probe only now started after the rule was
/// installed: by its start time (`/proc/PID/stat`, clock ticks: 10 ms apart, so a start
/// in the tick of the install counts, since it may have followed it), else, when the
/// process is already gone, by its exec event's time.
fn started_after(
    started_ticks: Option<u64>,
    exec_ns: Option<u64>,
    installed_ticks: Option<u64>,
    installed_ns: u64,
) -> bool {
    match (started_ticks, installed_ticks) {
        (Some(started), Some(installed)) => started >= installed,
        _ => exec_ns.is_some_and(|at| at >= installed_ns),
    }
}

/// A traced process.
pub struct Traced {
    pub info: ProcessInfo,
    /// Rules (bit = id) that target it.
    pub mask: u64,
    /// Its flight recorder of its own (`capture.isolate`, Intel PT); `None` when it could
    /// not be opened (triggers still counted) or it is recorded by a shared one.
    pub recorder: Option<Box<dyn Recorder>>,
    /// The per-CPU recorder that records it ([`Tracer::shared`] index), instead of one of
    /// its own.
    pub shared: Option<usize>,
    /// Whether the recorder runs `sample_filter`: drops the samples of processes the
    /// kernel froze at a trigger (`FROZEN`).
    pub filtered: bool,
    /// Why its recorder could not be opened, the last time that was tried.
    pub recorder_error: Option<RecorderFailure>,
    /// Signal rules (bit = id) already warned about signals the process ignores.
    pub warned_ignored: u64,
    /// Recorded by the Intel PT events it inherited from a traced ancestor at fork (its
    /// own open was refused with `EBUSY`): no recorder of its own is needed.
    pub inherited: bool,
}

impl Traced {
    /// Whether something records it: a recorder of its own, a per-CPU one, or the events
    /// it inherited from a traced ancestor.
    fn has_recorder(&self) -> bool {
        self.recorder.is_some() || self.shared.is_some() || self.inherited
    }
}

/// A failed recorder open.
#[derive(Debug, Clone, Copy)]
pub struct RecorderFailure {
    /// The resource limit it hit (`EMFILE`, ...); `None`: another failure, not retried.
    pub errno: Option<&'static str>,
    pub at: Instant,
}

/// How long a recorder that failed on a resource limit waits before it is tried again.
const RECORDER_RETRY: Duration = Duration::from_secs(1);
/// CPU time the 250 ms tick spends polling recorders, at most (2 %): see
/// [`Tracer::poll_recorders`].
const POLL_BUDGET: Duration = Duration::from_millis(5);

/// What [`Tracer::apply_rules`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RuleChanges {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    /// Of `changed`, those changed in place: same rule id, their kernel counters go on.
    pub in_place: Vec<String>,
    pub unchanged: Vec<String>,
    /// Rules that could not be installed (logged; the others run).
    pub failed: Vec<String>,
    /// The kernel counters of the old versions of swapped rules as they left (what they
    /// counted since the last read would be lost otherwise).
    pub retired_counters: Vec<(String, crate::triggers::engine::RuleCounters)>,
}

/// Why the rules could not be applied at all.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{count} rules: at most {MAX_RULES} can be loaded at once")]
    TooMany { count: usize },
}

/// Rules, targets and recorders, kept in step with the trigger engine.
pub struct Tracer {
    engine: TriggerEngine,
    proc_root: PathBuf,
    /// Processes never traced: the agent itself.
    own_pid: u32,
    rules: BTreeMap<String, ActiveRule>,
    processes: HashMap<u32, Traced>,
    /// Decides the `kubernetes` part of a target (pod watcher); `None`: no pod matches.
    pods: Option<PodMatcher>,
    /// What `backend: auto` means on this machine (probed once at start).
    auto: BackendRequest,
    /// The comms the kernel pre-selects at exec (`EXEC_COMMS`).
    exec_comms: HashMap<String, u64>,
    /// The recorders' freeze switches, for the trigger thread.
    early: Arc<EarlyFreeze>,
    /// The kernel's `FROZEN` map: processes whose samples stopped at their trigger (rules
    /// that freeze in the kernel); `None` when it could not be taken (no in-kernel freeze).
    frozen: Option<FrozenProcesses>,
    /// Recorder and probe failures, for `lookback_errors_total`.
    errors: ErrorTally,
    /// Processes the agent could not add to the kernel's full target set (beside the
    /// kernel's own count at exec and fork), for `lookback_errors_total{op="target_set"}`.
    target_set_refused: u64,
    /// Processes the agent found the kernel's target set full for: each counted once.
    refused: BTreeSet<u32>,
    /// During a reload, the ids of old rule versions whose processes the per-CPU rings
    /// still record until they move to the new versions.
    retiring_shared: u64,
    /// Rules whose probe was placed after a process of its binary started (one entry per
    /// such process), for `lookback_function_probes_late_total`; taken by the daemon.
    late_probes: Vec<String>,
    /// The pid [`Self::poll_recorders`] polled last: it goes on after it next time.
    poll_cursor: u32,
    /// The per-CPU recorders shared by all targets, one per recorder configuration.
    shared: Vec<SharedRecorder>,
    /// Why per-CPU sampling recorders cannot be used here (the first open failed): every
    /// target then gets rings of its own.
    shared_unavailable: Option<String>,
    /// The same for the per-CPU Intel PT recorder.
    pt_shared_unavailable: Option<String>,
    /// Rules (bit = id) that record with Intel PT per process only because another Intel PT
    /// rule needs rings per process, already said so in the log.
    pt_per_process_told: u64,
    /// The last open of a per-CPU recorder failed on a resource limit (errno, when): tried
    /// again by [`Self::retry_recorders`], and `/readyz` is not ready meanwhile.
    shared_failure: Option<RecorderFailure>,
    /// The processes each rule selected lately, gone ones included (`capture.peers`).
    selected: super::selected::Selected,
    /// Whether this process's privileges can place function probes; `Err`: why not
    /// (`daemon::privileges`), each function rule then not ready with that reason.
    function_probes: Result<(), String>,
    /// The container → pod lookup of the pod watcher, when one runs.
    pod_of: Option<PodOf>,
    /// This node's name (`NODE_NAME`, else the host name), for snapshots' origin.
    node: String,
    /// When each traced process's files were first and last secured
    /// ([`HeldFiles`]): [`Self::refresh_held_files`] secures them again while its loader
    /// maps libraries, and now and then for `dlopen`.
    secured: HashMap<u32, (Instant, Instant)>,
}

/// Files of a process traced less than this long ago are secured again each tick (its
/// loader maps its libraries right after the exec the agent heard of).
const SECURE_EARLY: Duration = Duration::from_secs(3);
/// Files of every traced process are secured again this often (`dlopen`).
const SECURE_EVERY: Duration = Duration::from_secs(30);
/// Processes whose files the periodic pass secures again in one tick at most.
const SECURE_BUDGET: usize = 32;

/// Where a process's history is recorded.
#[derive(Debug, Clone, Copy)]
enum Located {
    /// The recorder of this traced process (itself or an ancestor).
    Own(u32),
    /// `Tracer::shared[N]`.
    Shared(usize),
}

/// A per-CPU recorder for every target of the rules whose capture options it has.
struct SharedRecorder {
    opts: CaptureOptions,
    recorder: Box<dyn Recorder>,
}

impl Tracer {
    pub fn new(
        mut engine: TriggerEngine,
        proc_root: PathBuf,
        auto: BackendRequest,
        early: Arc<EarlyFreeze>,
    ) -> Self {
        let frozen = engine
            .take_frozen()
            .inspect_err(|e| {
                log::warn!("no in-kernel freeze: {}", ErrorChain(e));
            })
            .ok();
        Self {
            frozen,
            early,
            auto,
            exec_comms: HashMap::new(),
            engine,
            proc_root,
            own_pid: std::process::id(),
            rules: BTreeMap::new(),
            processes: HashMap::new(),
            pods: None,
            errors: ErrorTally::default(),
            target_set_refused: 0,
            refused: BTreeSet::new(),
            retiring_shared: 0,
            late_probes: Vec::new(),
            poll_cursor: 0,
            shared: Vec::new(),
            shared_unavailable: None,
            pt_shared_unavailable: None,
            pt_per_process_told: 0,
            shared_failure: None,
            selected: super::selected::Selected::default(),
            function_probes: Ok(()),
            pod_of: None,
            node: capture::origin::node_name(),
            secured: HashMap::new(),
        }
    }

    /// Sets the container → pod lookup (the pod watcher's).
    pub fn set_pod_of(&mut self, f: PodOf) {
        self.pod_of = Some(f);
    }

    /// The origin of a snapshot of `pid` whose processes' maps are `maps`: the node, and
    /// the process's cgroup and container — from its maps read at the freeze, else from
    /// when it was found (it may be gone) — with its pod where known. Maps without an
    /// origin (a process gone by the freeze) get the one found earlier.
    pub fn origin_of(&self, pid: u32, maps: &mut [capture::ProcessMaps]) -> Origin {
        for m in maps.iter_mut().filter(|m| m.origin.is_empty()) {
            if let Some(p) = self.processes.get(&m.pid) {
                m.origin = p.info.origin.clone();
            }
        }
        let process = maps
            .iter()
            .find(|m| m.pid == pid && !m.origin.is_empty())
            .map(|m| m.origin.clone())
            .or_else(|| self.processes.get(&pid).map(|p| p.info.origin.clone()))
            .filter(|o| !o.is_empty())
            .unwrap_or_else(|| capture::origin::ProcessOrigin::read(pid));
        let pod = process
            .container_id
            .as_deref()
            .and_then(|id| self.pod_of.as_ref().and_then(|f| f(id)));
        Origin {
            node: self.node.clone(),
            container_id: process.container_id,
            cgroup: process.cgroup,
            pod: pod.as_ref().map(|p| p.pod.clone()),
            namespace: pod.as_ref().map(|p| p.namespace.clone()),
            container: pod.map(|p| p.container),
        }
    }

    /// Says whether this process's privileges can place function probes (`Err`: why
    /// not). Set before the first rules are applied.
    pub fn set_function_probes(&mut self, allowed: Result<(), String>) {
        self.function_probes = allowed;
    }

    /// Sets the Kubernetes membership test used for `target.kubernetes`.
    pub fn set_pod_matcher(&mut self, f: PodMatcher) {
        self.pods = Some(f);
    }

    pub fn engine(&self) -> &TriggerEngine {
        &self.engine
    }

    pub fn engine_mut(&mut self) -> &mut TriggerEngine {
        &mut self.engine
    }

    /// The installed rules, by name.
    pub fn rules(&self) -> impl Iterator<Item = &ActiveRule> {
        self.rules.values()
    }

    /// The rule with kernel id `id`.
    pub fn rule_by_id(&self, id: u32) -> Option<&ActiveRule> {
        self.rules.values().find(|r| r.id == id)
    }

    /// Installs `set` by difference with what runs now.
    pub fn apply_rules(&mut self, set: &RuleSet) -> Result<RuleChanges, ApplyError> {
        if set.rules.len() > MAX_RULES as usize {
            return Err(ApplyError::TooMany {
                count: set.rules.len(),
            });
        }
        let mut changes = RuleChanges::default();
        let wanted: BTreeMap<&str, &Rule> =
            set.rules.iter().map(|r| (r.name.as_str(), r)).collect();
        let current: Vec<String> = self.rules.keys().cloned().collect();
        // Changed rules that need other probes or targets: their old versions keep
        // running until the new ones are in place and hold their processes (swapped,
        // not detached first: no gap in which the rule sees nothing).
        let mut retiring: Vec<ActiveRule> = Vec::new();
        for name in current {
            match wanted.get(name.as_str()) {
                Some(rule) if self.rules.get(&name).is_some_and(|a| a.rule == **rule) => {
                    changes.unchanged.push(name);
                }
                Some(rule) => {
                    // Changed in place when only thresholds, limits or outputs changed:
                    // the rule keeps measuring through the reload (probes, calls in
                    // flight, its processes' rings). Otherwise swapped (below).
                    if self.update_in_place(&name, rule) {
                        log::info!("rule {name}: changed in place");
                        changes.in_place.push(name.clone());
                    } else if let Some(old) = self.rules.remove(&name) {
                        retiring.push(old);
                    }
                    changes.changed.push(name);
                }
                None => {
                    self.uninstall(&name);
                    changes.removed.push(name);
                }
            }
        }
        self.install_added(set, &mut retiring, &mut changes);
        // The per-CPU rings keep recording the old versions' processes until they have
        // moved to the new versions.
        self.retiring_shared = retiring
            .iter()
            .filter(|a| self.records_shared(&a.rule))
            .fold(0, |bits, a| bits | 1u64 << a.id);
        self.sync_exec_comms();
        self.sync_shared_rules();
        self.early.set_immediate(
            self.rules
                .values()
                .filter(|a| a.rule.snapshot.post_trigger.is_zero())
                .fold(0, |bits, a| bits | 1u64 << a.id),
        );
        // Each process moves to the new versions' bits in one write (`retarget`); the
        // old versions, matching nothing any more, then go.
        self.rescan();
        self.finish_swaps(retiring, &mut changes);
        self.retiring_shared = 0;
        self.publish_shared();
        Ok(changes)
    }

    /// Installs the rules of `set` not running now (added ones, and the new versions of
    /// `retiring`, whose ids are held meanwhile); records what failed in `changes`.
    fn install_added(
        &mut self,
        set: &RuleSet,
        retiring: &mut Vec<ActiveRule>,
        changes: &mut RuleChanges,
    ) {
        for rule in &set.rules {
            if self.rules.contains_key(&rule.name) {
                continue;
            }
            if !changes.changed.contains(&rule.name) {
                changes.added.push(rule.name.clone());
            }
            let held: BTreeSet<u32> = retiring.iter().map(|r| r.id).collect();
            let mut installed = self.install(rule, &held);
            if matches!(installed, Err(TriggerError::RuleId { .. })) && !retiring.is_empty() {
                // Every id is taken while old versions still hold theirs: one goes first
                // (this rule's own old version when it has one).
                let at = retiring
                    .iter()
                    .position(|r| r.rule.name == rule.name)
                    .unwrap_or(retiring.len() - 1);
                let old = retiring.swap_remove(at);
                log::warn!(
                    "rule {}: no free rule id while old versions are in place: rule {}'s \
                     old version is removed before its new one is in place",
                    rule.name,
                    old.rule.name
                );
                let new_id = self.rules.get(&old.rule.name).map(|r| r.id);
                self.hand_over(&old, new_id);
                self.retire(old);
                let held: BTreeSet<u32> = retiring.iter().map(|r| r.id).collect();
                installed = self.install(rule, &held);
            }
            if let Err(e) = installed {
                log::error!("rule {}: {}", rule.name, ErrorChain(&e));
                changes.failed.push(rule.name.clone());
            }
        }
    }

    /// The old versions of swapped rules go, once their new versions hold the processes:
    /// their last counts read into `changes`, the kernel-only target entries handed over,
    /// the processes whose capture changed given new recorders.
    fn finish_swaps(&mut self, retiring: Vec<ActiveRule>, changes: &mut RuleChanges) {
        for old in retiring {
            log::info!(
                "rule {}: swapped (the new version was in place before the old one left)",
                old.rule.name
            );
            if let Ok(counters) = self.engine.counters(old.id) {
                changes
                    .retired_counters
                    .push((old.rule.name.clone(), counters));
            }
            let new = self
                .rules
                .get(&old.rule.name)
                .map(|r| (r.id, r.rule.capture != old.rule.capture));
            self.hand_over(&old, new.map(|(id, _)| id));
            if new.is_some_and(|(_, capture_changed)| capture_changed) {
                // Recorded as the new version says: new rings (their history starts now).
                let pids: Vec<u32> = old
                    .targets
                    .iter()
                    .copied()
                    .filter(|p| self.processes.contains_key(p))
                    .collect();
                for pid in pids {
                    self.reopen_recorder(pid);
                }
            }
            self.retire(old);
        }
    }

    /// Moves the processes only the kernel's target set knows with `old`'s bit (children
    /// it followed at fork, during the rescan or of pid-selected targets) to the bit of
    /// `old`'s new version (`new_id`), or clears it: a freed id must select nothing when
    /// another rule takes it.
    fn hand_over(&mut self, old: &ActiveRule, new_id: Option<u32>) {
        let bit = 1u64 << old.id;
        let Ok(entries) = self.engine.kernel_targets() else {
            return;
        };
        for (tgid, mask) in entries.into_iter().filter(|(_, m)| m & bit != 0) {
            let moved = (mask & !bit) | new_id.map_or(0, |id| 1u64 << id);
            if let Err(e) = self.engine.retarget(tgid, moved) {
                log::debug!("process {tgid}: {}", ErrorChain(&e));
            }
        }
    }

    /// Closes the recorder `pid` has (its own rings, or its place in per-CPU ones) and
    /// opens the one its rules now ask for.
    fn reopen_recorder(&mut self, pid: u32) {
        let Some(traced) = self.processes.get_mut(&pid) else {
            return;
        };
        traced.recorder = None;
        let shared = traced.shared.take();
        traced.filtered = false;
        traced.inherited = false;
        traced.recorder_error = None;
        if let Some(s) = shared.and_then(|at| self.shared.get_mut(at)) {
            s.recorder.remove_process(pid);
        }
        self.early.remove(pid);
        self.open_recorder_of(pid);
    }

    /// Tells the kernel which comms to pre-select at exec: a rule's `comm`, else its
    /// `exe`'s file name (what the kernel sets `comm` to). Rules selecting by pid or only
    /// by cgroup or pod have nothing to pre-select; their processes are targeted when the
    /// exec event reaches the agent (a few hundred microseconds later).
    fn sync_exec_comms(&mut self) {
        let mut comms: HashMap<String, u64> = HashMap::new();
        for active in self.rules.values() {
            let t = &active.rule.target;
            if t.pid.is_some() {
                continue;
            }
            let name = t.comm.clone().or_else(|| {
                t.exe
                    .as_ref()
                    .and_then(|e| e.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
            });
            if let Some(name) = name {
                let key: String = name.chars().take(15).collect();
                *comms.entry(key).or_default() |= 1 << active.id;
            }
        }
        if let Err(e) = self.engine.set_exec_comms(&comms) {
            log::warn!("pre-selecting targets at exec: {}", ErrorChain(&e));
        }
        self.exec_comms = comms;
    }

    /// Whether `rule`'s targets are recorded by a per-CPU recorder: not `capture.isolate`,
    /// per-CPU recorders of its backend work here, and for Intel PT no rule needs PT rings
    /// per process ([`Self::pt_rings_per_process`]).
    fn records_shared(&self, rule: &Rule) -> bool {
        match self.backend_of(rule) {
            BackendRequest::Sampling => !rule.capture.isolate && self.shared_unavailable.is_none(),
            BackendRequest::IntelPt => {
                self.pt_shared_unavailable.is_none() && !self.pt_rings_per_process()
            }
            BackendRequest::Auto => false,
        }
    }

    /// Whether some Intel PT rule needs PT rings per process: `capture.isolate`, or
    /// `trace_binaries` (address filters, which the kernel takes only on per-process
    /// events). Then every Intel PT rule gets them: the kernel runs one PT event per CPU
    /// and refuses per-process ones next to a per-CPU one (`EBUSY`).
    fn pt_rings_per_process(&self) -> bool {
        pt_rings_per_process(
            self.rules
                .values()
                .map(|a| (&a.rule, self.backend_of(&a.rule))),
        )
    }

    /// Says once per rule when an Intel PT rule that could share the per-CPU recorder gets
    /// rings per process because of another rule.
    fn tell_pt_per_process(&mut self) {
        if !self.pt_rings_per_process() {
            self.pt_per_process_told = 0;
            return;
        }
        let mut told = self.pt_per_process_told;
        for active in self.rules.values() {
            let rule = &active.rule;
            if self.backend_of(rule) == BackendRequest::IntelPt
                && !needs_own_pt_rings(rule)
                && told & 1 << active.id == 0
            {
                told |= 1 << active.id;
                log::warn!(
                    "rule {}: Intel PT rings per process (memory and fds grow with its \
                     targets), because another Intel PT rule sets capture.isolate or \
                     trace_binaries and the kernel runs either per-process or per-CPU PT",
                    rule.name
                );
            }
        }
        self.pt_per_process_told = told;
    }

    /// Opens the per-CPU recorder of every rule that records that way, before any of its
    /// targets is seen (the kernel makes a process a target at exec: its first
    /// instructions are recorded only if the rings already exist), and publishes the rules.
    fn sync_shared_rules(&mut self) {
        self.tell_pt_per_process();
        let wanted: Vec<CaptureOptions> = self
            .rules
            .values()
            .filter(|a| self.records_shared(&a.rule))
            .filter_map(|a| self.capture_for(1 << a.id))
            .collect();
        for opts in wanted {
            if self.shared_recorder(&opts).is_err() {
                break;
            }
        }
        self.publish_shared();
    }

    /// Tells `target_filter` which rules' targets the per-CPU recorders keep. The trigger
    /// thread does not stop shared rings: that would stop every target's recording until
    /// the event loop gets to the copy (a burst of short processes then recorded
    /// nothing); the triggering process's own samples stop in the kernel (`FROZEN`).
    fn publish_shared(&mut self) {
        // Intel PT has no samples to filter: its per-CPU rings record every process.
        let mask = self
            .rules
            .values()
            .filter(|a| {
                self.backend_of(&a.rule) == BackendRequest::Sampling && self.records_shared(&a.rule)
            })
            .fold(self.retiring_shared, |bits, a| bits | 1u64 << a.id);
        if let Err(e) = self.engine.set_shared_record_rules(mask) {
            log::warn!("per-CPU recording: {}", ErrorChain(&e));
        }
    }

    /// The per-CPU recorder for `opts`, opened at its first use; `Err`: none can be (the
    /// reason, also kept in `shared_unavailable`, and the rules fall back to rings per
    /// process).
    ///
    /// Intel PT: one for all its rules, set up by the first one opened (the kernel runs one
    /// PT event per CPU); its `aux_pause` sources are not used.
    fn shared_recorder(&mut self, opts: &CaptureOptions) -> Result<usize, String> {
        let pt = opts.backend == BackendRequest::IntelPt;
        if let Some(at) = self
            .shared
            .iter()
            .position(|s| s.opts == *opts || (pt && s.opts.backend == BackendRequest::IntelPt))
        {
            return Ok(at);
        }
        let unavailable = if pt {
            &self.pt_shared_unavailable
        } else {
            &self.shared_unavailable
        };
        if let Some(reason) = unavailable {
            return Err(reason.clone());
        }
        let filter = if pt {
            Ok(None)
        } else {
            self.engine.target_filter().map(Some)
        };
        let opened = match filter {
            Ok(filter) => capture::open_cpu_wide_recorder(opts, filter).map_err(|e| {
                // A resource limit passes (fds, locked memory): tried again with the next
                // target, counted and shown by `/readyz` like any recorder's.
                let errno = self.errors.record("recorder", &e);
                (ErrorChain(&e).to_string(), errno)
            }),
            Err(e) => Err((ErrorChain(&e).to_string(), None)),
        };
        match opened {
            Ok(recorder) => {
                log::info!(
                    "per-CPU flight recorder opened: {} ring(s) of {} KiB for every target \
                     of the rules recording with these options",
                    recorder.params().cpus.len(),
                    recorder.params().buffer_size / 1024
                );
                self.shared.push(SharedRecorder {
                    opts: opts.clone(),
                    recorder,
                });
                self.shared_failure = None;
                self.publish_shared();
                Ok(self.shared.len() - 1)
            }
            Err((reason, Some(errno @ ("EMFILE" | "ENFILE" | "ENOMEM")))) => {
                if self.shared_failure.is_none() {
                    log::warn!(
                        "no per-CPU flight recorder yet ({reason}); tried again each second"
                    );
                }
                self.shared_failure = Some(RecorderFailure {
                    errno: Some(errno),
                    at: Instant::now(),
                });
                Err(reason)
            }
            Err((reason, _)) => {
                log::warn!(
                    "no per-CPU flight recorder ({reason}): every target gets rings of its \
                     own (memory and fds grow with the number of targets)"
                );
                if pt {
                    self.pt_shared_unavailable = Some(reason.clone());
                } else {
                    self.shared_unavailable = Some(reason.clone());
                }
                self.publish_shared();
                Err(reason)
            }
        }
    }

    /// The kernel's view of `rule` under id `id`.
    fn engine_rule(id: u32, rule: &Rule) -> EngineRule {
        EngineRule {
            id,
            name: rule.name.clone(),
            trigger: rule.trigger.clone(),
            cooldown: rule.snapshot.cooldown,
            max_per_hour: rule.snapshot.max_per_hour,
            follow_forks: true,
            per_process: rule.snapshot.scope == rules::SnapshotScope::Process,
        }
    }

    /// Replaces installed rule `name` by `rule` without detaching anything, when it
    /// selects the same processes, records them the same way and needs the same probes;
    /// returns whether it did (else nothing changed).
    fn update_in_place(&mut self, name: &str, rule: &Rule) -> bool {
        let Some(active) = self.rules.get(name) else {
            return false;
        };
        if active.rule.target != rule.target || active.rule.capture != rule.capture {
            return false;
        }
        let id = active.id;
        match self.engine.update_rule(&Self::engine_rule(id, rule)) {
            Ok(true) => {}
            Ok(false) => return false,
            Err(e) => {
                log::warn!("rule {name}: cannot change in place: {}", ErrorChain(&e));
                return false;
            }
        }
        let freeze = self.freezes_in_kernel(rule);
        if let Err(e) = self.engine.set_rule_freeze_in_kernel(id, freeze) {
            log::warn!("rule {name}: in-kernel freeze: {}", ErrorChain(&e));
        }
        if let Some(active) = self.rules.get_mut(name) {
            active.rule = rule.clone();
        }
        true
    }

    /// Installs `rule` under the lowest rule id neither an installed rule nor `held` (the
    /// old versions of rules being swapped) has.
    fn install(&mut self, rule: &Rule, held: &BTreeSet<u32>) -> Result<(), TriggerError> {
        let mut used: BTreeSet<u32> = self.rules.values().map(|r| r.id).collect();
        used.extend(held);
        let id = (0..MAX_RULES)
            .find(|id| !used.contains(id))
            .ok_or(TriggerError::RuleId { id: MAX_RULES })?;
        self.engine.add_rule(Self::engine_rule(id, rule), &[])?;
        if self.freezes_in_kernel(rule) {
            self.engine.set_rule_freeze_in_kernel(id, true)?;
        }
        let mut active = ActiveRule {
            rule: rule.clone(),
            id,
            targets: BTreeSet::new(),
            binaries: BTreeMap::new(),
            limited: BTreeMap::new(),
            probe_error: None,
            probe_error_reason: None,
            installed_ticks: discovery::now_ticks(),
            installed_ns: crate::sys::monotonic_ns(),
        };
        if let (Trigger::Function(_), Err(why)) = (&rule.trigger, &self.function_probes) {
            log::error!("rule {}: {why}", rule.name);
            active.probe_error = Some(why.clone());
            active.probe_error_reason = Some(super::privileges::CAPABILITY);
            self.rules.insert(rule.name.clone(), active);
            return Ok(());
        }
        // A function rule that names its binary (or an exe target) is probed right away,
        // so that processes started later are covered from their first instruction. Not
        // for pod targets: their paths are inside the containers (/proc/PID/root), never
        // on the agent's own filesystem.
        if let Trigger::Function(f) = &rule.trigger
            && rule.target.kubernetes.is_none()
            && let Some(binary) = f.binary.clone().or_else(|| rule.target.exe.clone())
            && Path::new(&binary).exists()
        {
            let _ = place_probe(
                &mut self.engine,
                &mut self.errors,
                &mut active,
                (&binary, None),
                || {
                    let lookup = resolve::Lookup::of(f).servers(&rule.debuginfod);
                    resolve::resolve_symbol(&binary, &lookup)
                },
            );
        }
        self.rules.insert(rule.name.clone(), active);
        Ok(())
    }

    /// Whether `rule`'s triggers stop their process's samples in the kernel: it snapshots
    /// at once (with `post_trigger` the recording must go on after the trigger, as in
    /// `run`) and records with the sampling backend (the only one `sample_filter` works
    /// on), and the agent can remove the marks again.
    fn freezes_in_kernel(&self, rule: &Rule) -> bool {
        self.frozen.is_some()
            && rule.snapshot.post_trigger.is_zero()
            && self.backend_of(rule) == BackendRequest::Sampling
    }

    /// The backend `rule` records with here (`auto` resolved).
    fn backend_of(&self, rule: &Rule) -> BackendRequest {
        match capture_options(&rule.capture).backend {
            BackendRequest::Auto => self.auto,
            other => other,
        }
    }

    /// After the rings for `pid`'s trigger (at `trigger_ns`) were copied from the recorder
    /// of `owner` and paused at `paused_ns`: lets `pid` be sampled again, and returns the
    /// time the kernel stopped its samples when that belongs to this trigger and the
    /// recorder drops frozen samples (else the rings' pause is the freeze).
    pub fn thaw_after_copy(
        &mut self,
        owner: u32,
        pid: u32,
        trigger_ns: u64,
        paused_ns: u64,
    ) -> Option<u64> {
        let at = self.frozen.as_ref()?.frozen_at(pid);
        self.thaw(pid);
        // A recorder found for a process never traced is a per-CPU one: it filters.
        let filtered = self
            .processes
            .get(&owner)
            .map_or(!self.shared.is_empty(), |p| p.filtered);
        log::debug!(
            "process {pid} frozen in the kernel at {at:?}, trigger at {trigger_ns}, rings \
             paused at {paused_ns}, recorder of {owner} filtered: {filtered}"
        );
        kernel_freeze(trigger_ns, at, paused_ns).filter(|_| filtered)
    }

    /// Lets `pid` be sampled again: every trigger that froze it in the kernel ends here,
    /// after its snapshot's copy or when the trigger is dropped (busy, rule removed, no
    /// recorder, an error), and when the process is forgotten (its pid may be reused).
    pub fn thaw(&mut self, pid: u32) {
        if let Some(frozen) = self.frozen.as_mut()
            && let Err(e) = frozen.thaw(pid)
        {
            log::warn!("unfreezing process {pid}: {}", ErrorChain(&e));
        }
    }

    fn uninstall(&mut self, name: &str) {
        if let Some(active) = self.rules.remove(name) {
            self.hand_over(&active, None);
            self.retire(active);
        }
    }

    /// Removes rule `active` (no longer in [`Self::rules`]) from the kernel and from the
    /// processes it targeted.
    fn retire(&mut self, active: ActiveRule) {
        let name = active.rule.name.clone();
        if let Err(e) = self.engine.remove_rule(active.id) {
            log::warn!("removing rule {name}: {}", ErrorChain(&e));
        }
        let bit = 1u64 << active.id;
        self.selected.drop_rule(active.id);
        for pid in active.targets {
            if let Some(p) = self.processes.get_mut(&pid) {
                p.mask &= !bit;
            }
        }
        // A rule that takes this id later warns anew.
        for p in self.processes.values_mut() {
            p.warned_ignored &= !bit;
        }
        self.processes.retain(|_, p| p.mask != 0);
        let processes = &self.processes;
        self.early.retain(|pid| processes.contains_key(&pid));
    }

    /// Puts the cgroups of pod-selected containers into the kernel's target set, each with
    /// the bits of the rules (by name) that select it.
    pub fn set_cgroup_targets(&mut self, by_rule: &HashMap<String, Vec<u64>>) {
        let mut cgroups: HashMap<u64, u64> = HashMap::new();
        for (name, ids) in by_rule {
            let Some(active) = self.rules.get(name) else {
                continue;
            };
            for &id in ids {
                *cgroups.entry(id).or_default() |= 1 << active.id;
            }
        }
        if let Err(e) = self.engine.set_target_cgroups(&cgroups) {
            log::warn!("targeting container cgroups: {}", ErrorChain(&e));
        }
    }

    /// Re-evaluates every process on the machine, and forgets those that are gone.
    pub fn rescan(&mut self) {
        let pids = discovery::scan(&self.proc_root);
        // Refused processes have no exit event (the kernel reports targets' exits only).
        self.refused.retain(|p| pids.binary_search(p).is_ok());
        let gone: Vec<u32> = self
            .processes
            .keys()
            .filter(|p| pids.binary_search(p).is_err())
            .copied()
            .collect();
        for pid in gone {
            self.forget(pid, false);
        }
        for pid in pids {
            self.consider(pid);
        }
    }

    /// Matches process `pid` against every rule and makes the kernel, the probes and the
    /// recorders agree with the result (a rescan; see [`Self::consider_exec`]).
    pub fn consider(&mut self, pid: u32) -> Outcome {
        self.consider_with(pid, None)
    }

    /// [`Self::consider`] for the exec event of `pid` at `exec_ns` (`CLOCK_MONOTONIC`): a
    /// function probe placed now for its binary came after the process started.
    pub fn consider_exec(&mut self, pid: u32, exec_ns: u64) -> Outcome {
        // A traced process that exec'd maps other files now: the old ones linger (a
        // trigger from before the exec may still need them), the new ones are secured.
        if self.secured.remove(&pid).is_some() {
            HeldFiles::global().release(pid);
        }
        self.consider_with(pid, Some(exec_ns))
    }

    /// The rules whose probes were placed late since the last call (one per process).
    pub fn take_late_probes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.late_probes)
    }

    fn consider_with(&mut self, pid: u32, exec_ns: Option<u64>) -> Outcome {
        if pid == self.own_pid {
            return Outcome::NotMatching;
        }
        let Some(info) = ProcessInfo::read(&self.proc_root, pid) else {
            self.forget(pid, false);
            return Outcome::Gone;
        };
        let mut mask = 0u64;
        for active in self.rules.values() {
            let pods = self.pods.as_ref();
            if discovery::matches(&active.rule.target, &info, |i| {
                pods.is_some_and(|f| f(&active.rule, i))
            }) {
                mask |= 1 << active.id;
            }
        }
        let old = self.processes.get(&pid).map_or(0, |p| p.mask);
        if mask == 0 && info.exe.is_none() && discovery::has_exited(&self.proc_root, pid) {
            // A zombie: gone, not turned down (its exe link is unreadable).
            self.forget(pid, false);
            return Outcome::Gone;
        }
        if mask == 0 {
            if old != 0 {
                self.forget(pid, false);
            } else if self.exec_comms.contains_key(&info.comm)
                && let Err(e) = self.engine.withdraw_target(pid)
            {
                log::debug!("process {pid}: {}", ErrorChain(&e));
            }
            return Outcome::NotMatching;
        }
        // First: a process may crash or exit right after its exec, and with it go its
        // files (in a container, its root).
        if let std::collections::hash_map::Entry::Vacant(first) = self.secured.entry(pid) {
            HeldFiles::global().secure_pid(pid);
            first.insert((Instant::now(), Instant::now()));
        }
        self.probe_binaries(&info, mask, exec_ns);
        self.selected.note(pid, mask);
        if mask != old {
            // One write: a rule swapped by a reload hands the process over from its old
            // version to its new one at one instant.
            if let Err(e) = self.engine.retarget(pid, mask) {
                if super::limits::errno_of(&e) != Some(libc::E2BIG) {
                    log::warn!("process {pid}: {}", ErrorChain(&e));
                } else if self.refused.insert(pid) {
                    self.target_set_refused += 1;
                    log::warn!(
                        "process {pid} ({}): not traced: the kernel's target set is full \
                         ({} processes; raise `lookback agent --max-targets`)",
                        info.comm,
                        self.engine.max_targets()
                    );
                }
                return Outcome::Failed;
            }
            for active in self.rules.values_mut() {
                if mask & 1 << active.id != 0 {
                    active.targets.insert(pid);
                } else {
                    active.targets.remove(&pid);
                }
            }
        }
        let traced = self.processes.entry(pid).or_insert_with(|| Traced {
            info: info.clone(),
            mask,
            recorder: None,
            shared: None,
            filtered: false,
            recorder_error: None,
            warned_ignored: 0,
            inherited: false,
        });
        traced.info = info;
        traced.mask = mask;
        self.open_recorder_of(pid);
        self.warn_ignored_signals(pid);
        if old == 0 {
            // Logged once the recorder runs: from here on, the process is recorded.
            let recorder = match self.processes.get(&pid) {
                Some(Traced {
                    shared: Some(at), ..
                }) => match self.shared.get(*at).map(|s| s.recorder.backend()) {
                    Some(capture::Backend::IntelPt) => "intel-pt, per-CPU rings",
                    _ => "sampling, per-CPU rings",
                },
                Some(Traced {
                    recorder: Some(r), ..
                }) => r.backend().as_str(),
                Some(Traced {
                    inherited: true, ..
                }) => "intel-pt, inherited from its parent",
                _ => "no recorder",
            };
            log::info!(
                "tracing process {pid} ({}) for {} [{recorder}]",
                self.processes
                    .get(&pid)
                    .map_or("", |p| p.info.comm.as_str()),
                self.rule_names(mask).join(", ")
            );
        }
        Outcome::Traced
    }

    /// The kernel selected `pid` at its exec for the rules of `mask` (it may be gone before
    /// [`Self::consider_exec`] reads it).
    pub fn note_selected(&mut self, pid: u32, mask: u64) {
        self.selected.note(pid, mask);
    }

    /// The processes rule `id` selects or selected lately (gone ones included): the peers
    /// of its snapshots (`capture.peers: true`).
    pub fn selected_by(&self, id: u32) -> BTreeSet<u32> {
        let bit = 1u64 << id;
        let mut pids = self.selected.of_rule(id);
        pids.extend(
            self.processes
                .iter()
                .filter(|(_, p)| p.mask & bit != 0)
                .map(|(&pid, _)| pid),
        );
        pids
    }

    /// Secures the files of the processes traced less than [`SECURE_EARLY`] ago (their
    /// loader is at work) and, every [`SECURE_EVERY`], of the others (`dlopen`); lets go
    /// of what exited processes held longer than [`held_files::LINGER`] ago.
    ///
    /// [`held_files::LINGER`]: capture::held_files::LINGER
    pub fn refresh_held_files(&mut self) {
        let held = HeldFiles::global();
        // The periodic pass reads at most this many processes' maps a tick, so that the
        // hundreds found by one scan do not all come due on the same tick.
        let mut budget = SECURE_BUDGET;
        for (&pid, (first, last)) in &mut self.secured {
            let early = first.elapsed() < SECURE_EARLY;
            if early || (last.elapsed() >= SECURE_EVERY && budget > 0) {
                budget -= usize::from(!early);
                held.secure_pid(pid);
                *last = Instant::now();
            }
        }
        held.expire(capture::held_files::LINGER);
    }

    /// Stops tracing `pid`. `kernel_gone`: the kernel already removed its target entry
    /// (exit event).
    pub fn forget(&mut self, pid: u32, kernel_gone: bool) {
        self.refused.remove(&pid);
        // Whoever secured them (this tracer, or the trigger thread just before).
        self.secured.remove(&pid);
        HeldFiles::global().release(pid);
        let Some(traced) = self.processes.remove(&pid) else {
            return;
        };
        if let Some(shared) = traced.shared.and_then(|at| self.shared.get_mut(at)) {
            shared.recorder.remove_process(pid);
        }
        self.early.remove(pid);
        self.thaw(pid);
        if kernel_gone {
            self.engine.forget_target(pid);
        } else if let Err(e) = self.engine.remove_target(pid) {
            log::debug!("process {pid}: {}", ErrorChain(&e));
        }
        for active in self.rules.values_mut() {
            active.targets.remove(&pid);
        }
        log::debug!("process {pid} no longer traced");
    }

    /// The recorder that holds the history of `pid`: its own, or that of the closest
    /// traced ancestor (children of targets are followed by the kernel and recorded by
    /// their parent's inherited events), or the per-CPU recorder that records it.
    pub fn recorder_for(&mut self, pid: u32) -> Option<(u32, &mut Box<dyn Recorder>)> {
        let found = self.locate(pid)?;
        self.recorder_at(pid, found)
    }

    /// [`recorder_for`](Self::recorder_for) the trigger of rule `rule_id` in `pid`; also a
    /// process the agent never traced (it lived less than the time its exec event took to
    /// arrive), when the rule records with the per-CPU recorders: the kernel made it a
    /// target at exec, so its samples are in their rings, and its maps in their MMAP2
    /// records.
    pub fn recorder_for_trigger(
        &mut self,
        pid: u32,
        rule_id: u32,
    ) -> Option<(u32, &mut Box<dyn Recorder>)> {
        let found = self.locate(pid).or_else(|| {
            let rule = self.rule_by_id(rule_id)?;
            if self.processes.contains_key(&pid) || !self.records_shared(&rule.rule) {
                return None;
            }
            let opts = self.capture_for(1 << rule_id)?;
            let at = self.shared.iter().position(|s| s.opts == opts)?;
            log::debug!("process {pid}: gone before it was traced; from the per-CPU rings");
            Some(Located::Shared(at))
        })?;
        self.recorder_at(pid, found)
    }

    /// Where the recorder of `pid` is (see [`recorder_for`](Self::recorder_for)).
    fn locate(&self, pid: u32) -> Option<Located> {
        let mut at = pid;
        for _ in 0..64 {
            if let Some(traced) = self.processes.get(&at) {
                if let Some(index) = traced.shared {
                    // A per-CPU recorder records the process itself (the kernel's target
                    // set follows forks), not through an ancestor's events.
                    return Some(Located::Shared(index));
                }
                if traced.recorder.is_some() {
                    return Some(Located::Own(at));
                }
            }
            at = parent_of(&self.proc_root, at)?;
        }
        None
    }

    fn recorder_at(&mut self, pid: u32, found: Located) -> Option<(u32, &mut Box<dyn Recorder>)> {
        match found {
            Located::Shared(index) => Some((pid, &mut self.shared.get_mut(index)?.recorder)),
            Located::Own(at) => Some((at, self.processes.get_mut(&at)?.recorder.as_mut()?)),
        }
    }

    /// Opens the flight recorder of traced process `pid` when its rules want one and it
    /// has none; a failure is logged, counted (`errors`) and kept for readiness and
    /// [`retry_recorders`](Self::retry_recorders).
    fn open_recorder_of(&mut self, pid: u32) {
        let Some(mask) = self
            .processes
            .get(&pid)
            .filter(|p| !p.has_recorder())
            .map(|p| p.mask)
        else {
            return;
        };
        let Some(opts) = self.capture_for(mask) else {
            return;
        };
        if self.shares_recorder(mask)
            && let Ok(index) = self.shared_recorder(&opts)
        {
            let added = self.shared.get_mut(index).map(|s| {
                // Intel PT: the trigger pump stops the shared PT rings at a trigger of this
                // process (they fill fast; nothing stops one process's trace in the kernel).
                if s.recorder.backend() == capture::Backend::IntelPt
                    && let Some(switch) = s.recorder.freeze_switch()
                {
                    self.early.insert(pid, switch);
                }
                s.recorder.add_process(pid)
            });
            let Some(traced) = self.processes.get_mut(&pid) else {
                return;
            };
            // Recorded by the kernel's target set whether or not its maps could be read
            // (it may be gone already: they then come from the rings' MMAP2 records).
            if let Some(Err(e)) = added {
                log::debug!("process {pid}: {}", ErrorChain(&e));
            }
            traced.shared = Some(index);
            traced.filtered = true;
            traced.recorder_error = None;
            return;
        }
        let filter = self.frozen.as_ref().and(self.engine.sample_filter().ok());
        let opened = open_recorder(&opts, pid, filter);
        let inherited = opened.as_ref().err().is_some_and(|e| {
            inherits_instead(super::limits::errno_of(e), self.ancestor_recorded(pid))
        });
        let Some(traced) = self.processes.get_mut(&pid) else {
            return;
        };
        if inherited {
            // Its events came with the fork; a second set on this task is what the
            // exclusive PMU refuses. Triggers find the ancestor's recorder (`locate`).
            if !traced.inherited {
                log::info!(
                    "process {pid}: recorded by the Intel PT events it inherited from its \
                     traced parent (the PMU takes one event per task and CPU)"
                );
            }
            traced.inherited = true;
            traced.recorder_error = None;
            return;
        }
        match opened {
            Ok((r, filtered)) => {
                if let Some(switch) = r.freeze_switch() {
                    self.early.insert(pid, switch);
                }
                if traced.recorder_error.take().is_some() {
                    log::info!("process {pid}: flight recorder opened on a retry");
                }
                traced.recorder = Some(r);
                traced.filtered = filtered;
            }
            Err(e) => {
                let errno = self.errors.record("recorder", &e);
                if traced.recorder_error.is_none() {
                    let busy = if super::limits::errno_of(&e) == Some(libc::EBUSY) {
                        " (Intel PT takes one event per task and CPU: another tool, e.g. \
                         `perf record -e intel_pt//` or magic-trace, records this process \
                         or a CPU)"
                    } else {
                        ""
                    };
                    log::warn!(
                        "process {pid}: no flight recorder ({}){busy}; triggers are still counted",
                        ErrorChain(&e)
                    );
                }
                traced.recorder_error = Some(RecorderFailure {
                    errno,
                    at: Instant::now(),
                });
            }
        }
    }

    /// Whether a traced ancestor of `pid` (not `pid` itself) has a recorder of its own.
    fn ancestor_recorded(&self, pid: u32) -> bool {
        matches!(self.locate(pid), Some(Located::Own(at)) if at != pid)
    }

    /// Warns once per signal rule of traced process `pid` whose signals it ignores
    /// (`SigIgn`: `nohup`, a shell's background job): sent to it, they are dropped
    /// before delivery and the rule never fires (faults are forced through); or blocks
    /// (`SigBlk` of its main thread: a `sigwait`/`signalfd` loop): the rule fires when
    /// one is sent, but while one is pending the kernel merges further ones into it
    /// (`TRACE_SIGNAL_ALREADY_PENDING`, real-time signals excepted) and they do not fire.
    fn warn_ignored_signals(&mut self, pid: u32) {
        let Some(traced) = self.processes.get_mut(&pid) else {
            return;
        };
        let unwarned = traced.mask & !traced.warned_ignored;
        if unwarned == 0 {
            return;
        }
        let Some(masks) = discovery::signal_masks(&self.proc_root, pid) else {
            return;
        };
        for active in self.rules.values() {
            let Trigger::Signal(trigger) = &active.rule.trigger else {
                continue;
            };
            if unwarned & 1 << active.id == 0 {
                continue;
            }
            let in_mask =
                |mask: u64, sig: u32| (1..=64).contains(&sig) && mask >> (sig - 1) & 1 == 1;
            let names = |pick: &dyn Fn(u32) -> bool| -> Vec<&str> {
                trigger
                    .signals
                    .iter()
                    .filter(|&&sig| pick(sig))
                    .map(|&sig| rules::signal_name(sig).unwrap_or("?"))
                    .collect()
            };
            let ignored = names(&|sig| in_mask(masks.ignored, sig));
            // Real-time signals queue one by one, so blocking them loses no trigger.
            let blocked = names(&|sig| {
                sig < 32 && in_mask(masks.blocked, sig) && !in_mask(masks.ignored, sig)
            });
            if !ignored.is_empty() {
                log::warn!(
                    "rule {}: process {pid} ({}) ignores {}: sent to it, they are dropped \
                     before delivery and the rule does not fire (a fault's SIGSEGV or \
                     SIGBUS still does)",
                    active.rule.name,
                    traced.info.comm,
                    ignored.join(", ")
                );
            }
            if !blocked.is_empty() {
                log::warn!(
                    "rule {}: process {pid} ({}) blocks {}: the rule fires when one is \
                     sent, but while one is pending (until the process unblocks or waits \
                     for it) the kernel merges further ones into it and they do not fire",
                    active.rule.name,
                    traced.info.comm,
                    blocked.join(", ")
                );
            }
            if !ignored.is_empty() || !blocked.is_empty() {
                traced.warned_ignored |= 1 << active.id;
            }
        }
    }

    /// Whether the rule that decides the recorder of a process with rules `mask` (the
    /// lowest id, as in [`Self::capture_for`]) records with the per-CPU recorders.
    fn shares_recorder(&self, mask: u64) -> bool {
        self.deciding_rule(mask)
            .is_some_and(|r| self.records_shared(&r.rule))
    }

    /// The rule that decides the recorder of a process with rules `mask`: the lowest id.
    fn deciding_rule(&self, mask: u64) -> Option<&ActiveRule> {
        self.rules
            .values()
            .filter(|r| mask & 1 << r.id != 0)
            .min_by_key(|r| r.id)
    }

    /// Tries again to open the recorders that failed on a resource limit, at most once a
    /// second each: fds or memory freed, or a raised limit, bring them back without a
    /// restart.
    pub fn retry_recorders(&mut self) {
        if self
            .shared_failure
            .is_some_and(|f| f.at.elapsed() >= RECORDER_RETRY)
        {
            self.sync_shared_rules();
        }
        let due: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, p)| {
                !p.has_recorder()
                    && p.recorder_error
                        .as_ref()
                        .is_some_and(|f| f.errno.is_some() && f.at.elapsed() >= RECORDER_RETRY)
            })
            .map(|(&pid, _)| pid)
            .collect();
        for pid in due {
            self.open_recorder_of(pid);
        }
        self.retry_probes();
    }

    /// Tries again the probes a resource limit refused ([`LimitedProbe`]), each at most
    /// once a second: for the process they were for while it lives (gone: the next
    /// process of the binary tries), or the binary the rule names.
    fn retry_probes(&mut self) {
        let due: Vec<(String, BinaryKey, LimitedProbe)> = self
            .rules
            .iter()
            .flat_map(|(name, r)| {
                r.limited
                    .iter()
                    .filter(|(_, l)| l.at.elapsed() >= RECORDER_RETRY)
                    .map(|(&key, l)| (name.clone(), key, l.clone()))
            })
            .collect();
        for (name, key, probe) in due {
            let Some(active) = self.rules.get_mut(&name) else {
                continue;
            };
            let id = active.id;
            // The binary is gone or replaced (another inode at the path): nothing left to
            // retry; a new binary is probed when a process of it shows up.
            let same = std::fs::metadata(&probe.binary)
                .is_ok_and(|m| BinaryKey::of(&probe.binary, &m) == key);
            // Its process gone, or running another binary now: the same.
            let info = probe
                .pid
                .map(|pid| self.processes.get(&pid).map(|p| p.info.clone()));
            let still_runs = match (&info, &active.rule.trigger) {
                (Some(Some(info)), Trigger::Function(f)) => f
                    .binary
                    .clone()
                    .or_else(|| info.exe_path())
                    .is_some_and(|b| resolve::in_process_root(info.pid, &b) == probe.binary),
                (Some(_), _) => false,
                (None, _) => true,
            };
            if !same || !still_runs {
                active.limited.remove(&key);
                continue;
            }
            // Placed: `place_probe` drops the entry; still limited: it puts it back with
            // a new time. Either way it is tried now, not again at the next tick.
            if let Some(l) = active.limited.get_mut(&key) {
                l.at = Instant::now();
            }
            if let Some(Some(info)) = info {
                self.probe_binaries(&info, 1 << id, None);
            } else if let Trigger::Function(f) = active.rule.trigger.clone() {
                let binary = probe.binary;
                let servers = active.rule.debuginfod.clone();
                let _ = place_probe(
                    &mut self.engine,
                    &mut self.errors,
                    active,
                    (&binary, None),
                    || {
                        let lookup = resolve::Lookup::of(&f).servers(&servers);
                        resolve::resolve_symbol(&binary, &lookup)
                    },
                );
            }
        }
    }

    /// Function-rule probes a resource limit refused (one per rule and binary), by errno.
    pub fn probes_missing(&self) -> BTreeMap<&'static str, usize> {
        let mut missing = BTreeMap::new();
        for probe in self.rules.values().flat_map(|r| r.limited.values()) {
            *missing.entry(probe.errno).or_default() += 1;
        }
        missing
    }

    /// Traced processes without a flight recorder because of a resource limit, by errno.
    pub fn recorders_missing(&self) -> BTreeMap<&'static str, usize> {
        let mut missing = BTreeMap::new();
        for p in self.processes.values().filter(|p| !p.has_recorder()) {
            if let Some(errno) = p.recorder_error.as_ref().and_then(|f| f.errno) {
                *missing.entry(errno).or_default() += 1;
            }
        }
        missing
    }

    /// The resource limit the last open of a per-CPU recorder hit, while it is not open.
    pub fn shared_missing(&self) -> Option<&'static str> {
        self.shared_failure.and_then(|f| f.errno)
    }

    /// Failures of recorders and probes so far, by operation and errno.
    pub fn errors(&self) -> &ErrorTally {
        &self.errors
    }

    /// Processes the agent found matching but could not add to the kernel's full target
    /// set (the kernel counts its own refusals at exec and fork).
    pub fn target_set_refused(&self) -> u64 {
        self.target_set_refused
    }

    /// Gives the recorders a chance to drain their sideband and re-read their process's
    /// maps, round-robin for at most [`POLL_BUDGET`] per call (every 250 ms): a few
    /// processes are all polled each time, hundreds each in turn (at 500 targets a poll
    /// of all of them took the whole tick, and the agent 1.7 CPUs while nothing happened).
    pub fn poll_recorders(&mut self) {
        self.refresh_held_files();
        let started = Instant::now();
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        let next = pids.partition_point(|&p| p <= self.poll_cursor);
        for &pid in pids[next..].iter().chain(&pids[..next]) {
            if started.elapsed() >= POLL_BUDGET {
                return;
            }
            self.poll_cursor = pid;
            if let Some(r) = self
                .processes
                .get_mut(&pid)
                .and_then(|p| p.recorder.as_mut())
                && let Err(e) = r.poll()
            {
                log::debug!("recorder of {pid}: {}", ErrorChain(&e));
            }
        }
    }

    /// Number of traced processes.
    pub fn process_count(&self) -> usize {
        self.processes.len()
    }

    fn rule_names(&self, mask: u64) -> Vec<&str> {
        self.rules
            .values()
            .filter(|r| mask & 1 << r.id != 0)
            .map(|r| r.rule.name.as_str())
            .collect()
    }

    /// The capture options of the first rule (by id) in `mask`: one recorder per process,
    /// so the rule with the lowest id decides backend and buffer size.
    fn capture_for(&self, mask: u64) -> Option<CaptureOptions> {
        let rule = self.deciding_rule(mask)?;
        let mut opts = capture_options(&rule.rule.capture);
        if opts.backend == BackendRequest::Auto {
            opts.backend = self.auto;
        }
        opts.pt.pause_on = self.pause_sources(mask);
        Some(opts)
    }

    /// [`pause_sources`] of the rules in `mask`.
    fn pause_sources(&self, mask: u64) -> Vec<aux_pause::PauseSource> {
        pause_sources(
            self.rules
                .values()
                .filter(|r| mask & 1 << r.id != 0)
                .map(|r| &r.rule),
        )
    }

    /// Places the uprobes function rules in `mask` need for this process's binary. `exec_ns`:
    /// the process's exec, when known; a probe placed for it now came late.
    fn probe_binaries(&mut self, info: &ProcessInfo, mask: u64, exec_ns: Option<u64>) {
        // The privileges cannot place them: said at start, and the rules are not ready.
        if self.function_probes.is_err() {
            return;
        }
        let pid = info.pid;
        // Its start time, read before any probe is placed: a short process (one that hit
        // another rule's trigger and exited) may be gone once the probe is in, and then
        // nothing tells whether it started after the rule (CI: a late probe not counted).
        let mut started: Option<Option<u64>> = None;
        for active in self.rules.values_mut() {
            if mask & 1 << active.id == 0 {
                continue;
            }
            let Trigger::Function(f) = &active.rule.trigger else {
                continue;
            };
            let Some(binary) = f.binary.clone().or_else(|| info.exe_path()) else {
                continue;
            };
            let host = resolve::in_process_root(pid, &binary);
            let trigger = f.clone();
            let servers = active.rule.debuginfod.clone();
            let started =
                *started.get_or_insert_with(|| discovery::start_ticks(&self.proc_root, pid));
            if started.is_none()
                && exec_ns.is_none()
                && !self.proc_root.join(pid.to_string()).exists()
            {
                // Gone before anything says when it started: whether it ran before its
                // probe cannot be told, and it needs none now; the binary's next process
                // places the probe (and is counted when it comes late).
                return;
            }
            let at = (host.as_path(), Some(pid));
            let placed = place_probe(&mut self.engine, &mut self.errors, active, at, || {
                resolve::resolve_for_process(
                    pid,
                    trigger.binary.as_deref(),
                    &resolve::Lookup::of(&trigger).servers(&servers),
                )
            });
            if !placed {
                continue;
            }
            // Late: the process started after the rule was installed (found by its exec
            // event, a trigger or a rescan alike), so it ran before its probe.
            if started_after(
                started,
                exec_ns,
                active.installed_ticks,
                active.installed_ns,
            ) {
                let late_ms = exec_ns.map_or_else(
                    || {
                        let hz = discovery::ticks_per_second().unwrap_or(100);
                        let now = discovery::now_ticks().unwrap_or(0);
                        now.saturating_sub(started.unwrap_or(now)) * 1000 / hz
                    },
                    |at| crate::sys::monotonic_ns().saturating_sub(at) / 1_000_000,
                );
                log::info!(
                    "rule {}: process {pid} ({}) ran {} for {late_ms} ms before the rule's \
                     probe was placed in it: its calls until then are not seen (name the \
                     binary in the rule, trigger.function.binary or target.exe, to have \
                     it probed when the rule loads)",
                    active.rule.name,
                    info.comm,
                    host.display()
                );
                self.late_probes.push(active.rule.name.clone());
            }
        }
    }
}

/// Opens the recorder of `pid`, with `sample_filter` when given and taken (the sampling
/// backend); a kernel that refuses the filter still records, only the freeze is later.
fn open_recorder(
    opts: &CaptureOptions,
    pid: u32,
    filter: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<(Box<dyn Recorder>, bool), capture::CaptureError> {
    let Some(filter) = filter else {
        return capture::open_recorder_filtered(opts, &[pid], None);
    };
    capture::open_recorder_filtered(opts, &[pid], Some(filter)).or_else(|e| {
        log::warn!(
            "process {pid}: recording without the in-kernel freeze: {}",
            ErrorChain(&e)
        );
        capture::open_recorder_filtered(opts, &[pid], None)
    })
}

/// What [`place_probe`] attaches probes with: the trigger engine (a unit test gives one
/// that must not be reached).
trait AttachProbes {
    fn attach(
        &mut self,
        id: u32,
        points: &[resolve::ProbePoint],
    ) -> Result<Vec<AttachedProbe>, TriggerError>;
}

impl AttachProbes for TriggerEngine {
    fn attach(
        &mut self,
        id: u32,
        points: &[resolve::ProbePoint],
    ) -> Result<Vec<AttachedProbe>, TriggerError> {
        self.attach_probes(id, points)
    }
}

/// Whether a recorder open that failed with `errno` for a process whose traced ancestor
/// has a recorder of its own means the process is recorded already: Intel PT is an
/// exclusive PMU (`PERF_PMU_CAP_EXCLUSIVE`), and the kernel's
/// `exclusive_event_installable` refuses a second PT event on a task context (same CPU,
/// or either for any CPU) with `EBUSY`; a child forked after its parent's events were
/// opened has inherited them (`inherit`), and they write into the parent's rings.
fn inherits_instead(errno: Option<i32>, ancestor_recorded: bool) -> bool {
    errno == Some(libc::EBUSY) && ancestor_recorded
}

/// The `lookback_rule_probe_errors` reason of a failed attach: `capability` when it was
/// refused for want of one (a uprobe perf event without `CAP_SYS_ADMIN`, a path the agent
/// may not look up), not for the binary.
fn attach_failure_reason(e: &TriggerError) -> &'static str {
    if matches!(e.attach_errno(), Some(libc::EACCES | libc::EPERM)) {
        super::privileges::CAPABILITY
    } else {
        "attach_failed"
    }
}

/// Resolves and attaches the rule's probe for `binary` (placed for process `pid`, or at
/// install) once per inode; an attach that fails is counted in `errors`. A failure on a
/// resource limit leaves the binary unexamined and in the rule's `limited` probes, tried
/// again by [`Tracer::retry_recorders`]. So does a failure because process `pid` went
/// away while its probe was being placed (its `/proc` entry, through which the binary
/// is read and probed, is gone): that says nothing of the binary, whose next process
/// places the probe. Before, the binary was marked examined and the rule had no probe
/// for good (CI, under load: a 2 ms process exited between its exec event and the
/// attach). Returns whether probes were placed by this call.
fn place_probe(
    engine: &mut impl AttachProbes,
    errors: &mut ErrorTally,
    active: &mut ActiveRule,
    (binary, pid): (&Path, Option<u32>),
    resolve: impl FnOnce() -> Result<Vec<resolve::ProbePoint>, ResolveError>,
) -> bool {
    let Ok(meta) = std::fs::metadata(binary) else {
        return false;
    };
    let key = BinaryKey::of(binary, &meta);
    if active.binaries.contains_key(&key) {
        return false;
    }
    // The process is gone, not the binary: nothing learned (see above).
    let vanished =
        |no_process: bool| pid.is_some() && (no_process || std::fs::metadata(binary).is_err());
    // `limit`: the resource limit that refused it (tried again), if that was why.
    let (placed, limit) = match resolve() {
        Ok(points) => match engine.attach(active.id, &points) {
            Ok(probes) => {
                crate::triggers::engine::log_probes(&active.rule.name, &probes);
                if active.limited.remove(&key).is_some() {
                    log::info!(
                        "rule {}: probe in {} attached on a retry",
                        active.rule.name,
                        binary.display()
                    );
                }
                active.probe_error = None;
                active.probe_error_reason = None;
                (true, None)
            }
            Err(e) if vanished(false) => {
                log::info!(
                    "rule {}: process {} exited while its probe in {} was attached ({}); \
                     the binary's next process places it",
                    active.rule.name,
                    pid.unwrap_or(0),
                    binary.display(),
                    ErrorChain(&e)
                );
                return false;
            }
            Err(e) => {
                let limit = errors.record("probe", &e);
                let msg = format!("{}", ErrorChain(&e));
                // A retry that fails the same way again is not news.
                let level = if limit.is_some() && active.limited.contains_key(&key) {
                    log::Level::Debug
                } else {
                    log::Level::Error
                };
                log::log!(
                    level,
                    "rule {}: attaching the uprobe in {} failed: {msg}{}",
                    active.rule.name,
                    binary.display(),
                    if limit.is_some() {
                        " (tried again each second)"
                    } else {
                        ""
                    }
                );
                active.probe_error = Some(msg);
                active.probe_error_reason = Some(attach_failure_reason(&e));
                (false, limit)
            }
        },
        Err(e) if vanished(matches!(e, ResolveError::NoProcess { .. })) => {
            log::info!(
                "rule {}: process {} exited while its probe in {} was resolved ({e}); the \
                 binary's next process places it",
                active.rule.name,
                pid.unwrap_or(0),
                binary.display()
            );
            return false;
        }
        Err(e) => {
            let msg = e.to_string();
            log::error!(
                "rule {}: no uprobe in {}: {msg}",
                active.rule.name,
                binary.display()
            );
            active.probe_error = Some(msg);
            active.probe_error_reason = Some(e.reason());
            let limit = super::limits::resource_errno(&e);
            if limit.is_some() {
                errors.record("probe", &e);
            }
            (false, limit)
        }
    };
    if let Some(errno) = limit {
        let retry = LimitedProbe {
            binary: binary.to_owned(),
            pid,
            errno,
            at: Instant::now(),
        };
        active.limited.insert(key, retry);
        return false;
    }
    // Examined for good (placed, or refused for a reason a retry cannot change).
    active.limited.remove(&key);
    active.binaries.insert(key, placed);
    placed
}

/// The triggers of `rules` (those of one process) that can pause a PT recording in the
/// kernel (`capture::aux_pause`): signals and plain syscalls, and only when no rule asks
/// for trace after its trigger (`post_trigger`). Function entries would need the probe
/// placed for this process's binary: not done here (they freeze from userspace).
fn pause_sources<'a>(rules: impl Iterator<Item = &'a Rule>) -> Vec<aux_pause::PauseSource> {
    let rules: Vec<&Rule> = rules.collect();
    if rules.iter().any(|r| !r.snapshot.post_trigger.is_zero()) {
        return Vec::new();
    }
    rules
        .iter()
        .filter_map(|r| aux_pause::pause_source(&r.trigger).ok())
        .filter(|source| !matches!(source, aux_pause::PauseSource::FunctionEntry { .. }))
        .collect()
}

/// The recorder options a rule's `capture` section asks for.
pub fn capture_options(capture: &rules::Capture) -> CaptureOptions {
    CaptureOptions {
        backend: match capture.backend {
            rules::Backend::Auto => BackendRequest::Auto,
            rules::Backend::IntelPt => BackendRequest::IntelPt,
            rules::Backend::Sampling => BackendRequest::Sampling,
        },
        buffer_size: usize::try_from(capture.buffer_size).unwrap_or(usize::MAX),
        sample_frequency: u64::from(capture.sample_frequency),
        stack_size: capture.stack_size,
        include_kernel: capture.include_kernel,
        pt: capture::PtOptions {
            trace_binaries: capture.trace_binaries.clone(),
            ..capture::PtOptions::default()
        },
        ..CaptureOptions::default()
    }
}

/// The parent of `pid` (`PPid:` of `/proc/PID/status`).
fn parent_of(proc_root: &Path, pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
        .filter(|&p| p != 0)
}

/// Displays an error and its sources, `: `-separated.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::sys::error_chain(self.0))
    }
}

/// Whether an Intel PT rule needs PT rings per process: `capture.isolate`, or
/// `trace_binaries` (the kernel takes file address filters only on per-process events).
fn needs_own_pt_rings(rule: &Rule) -> bool {
    rule.capture.isolate || !rule.capture.trace_binaries.is_empty()
}

/// Whether the Intel PT rules among `rules` (each with the backend it records with) get
/// PT rings per process: when one of them needs them, all do, since the kernel runs
/// either per-process or per-CPU PT events (`PERF_PMU_CAP_EXCLUSIVE`: one per CPU,
/// `EBUSY` for per-process ones next to a per-CPU one).
fn pt_rings_per_process<'a>(rules: impl Iterator<Item = (&'a Rule, BackendRequest)>) -> bool {
    rules
        .filter(|(_, backend)| *backend == BackendRequest::IntelPt)
        .any(|(rule, _)| needs_own_pt_rings(rule))
}

#[cfg(test)]
mod tests {
    use super::{
        ActiveRule, AttachProbes, AttachedProbe, BTreeMap, BTreeSet, ErrorTally, Path,
        ResolveError, TriggerError, inherits_instead, pause_sources, place_probe,
        pt_rings_per_process, resolve, started_after,
    };
    use crate::capture::BackendRequest;

    #[test]
    fn one_intel_pt_rule_that_needs_its_own_rings_gives_every_intel_pt_rule_its_own() {
        let shared = "version: 1
rules:
  - name: a
    target: { comm: app }
    trigger: { signal: { signals: [SIGSEGV] } }
  - name: b
    target: { comm: other }
    trigger: { signal: { signals: [SIGSEGV] } }
";
        let backends = |all: &[crate::rules::Rule], of: &[BackendRequest]| {
            pt_rings_per_process(all.iter().zip(of.iter().copied()))
        };
        let pt = [BackendRequest::IntelPt, BackendRequest::IntelPt];
        assert!(
            !backends(&rules(shared), &pt),
            "both share the per-CPU PT rings"
        );
        for (capture, why) in [
            ("{ isolate: true }", "isolate"),
            ("{ trace_binaries: [/usr/bin/app] }", "address filters"),
        ] {
            let one = rules(&shared.replacen(
                "target: { comm: other }",
                &format!("target: {{ comm: other }}\n    capture: {capture}"),
                1,
            ));
            assert!(backends(&one, &pt), "{why}: every PT rule per process");
            // The same rule recording by sampling changes nothing for Intel PT.
            let sampled = [BackendRequest::IntelPt, BackendRequest::Sampling];
            assert!(!backends(&one, &sampled), "{why} on a sampling rule");
        }
    }

    #[test]
    fn only_ebusy_under_a_recorded_ancestor_is_an_inherited_recording() {
        assert!(inherits_instead(Some(libc::EBUSY), true));
        assert!(
            !inherits_instead(Some(libc::EBUSY), false),
            "another tool holds PT"
        );
        assert!(
            !inherits_instead(Some(libc::EMFILE), true),
            "a resource limit"
        );
        assert!(!inherits_instead(None, true));
    }

    #[test]
    fn a_process_started_in_the_install_tick_or_later_or_exec_d_after_it_came_late() {
        // Ticks are 10 ms: the install tick's processes may have started after it.
        assert!(started_after(Some(500), None, Some(500), 0));
        assert!(started_after(Some(501), None, Some(500), 0));
        assert!(!started_after(Some(499), Some(u64::MAX), Some(500), 0));
        // Gone before its start time was read: its exec event's time decides.
        assert!(started_after(None, Some(2_000), Some(500), 1_000));
        assert!(!started_after(None, Some(999), Some(500), 1_000));
        assert!(!started_after(None, None, Some(500), 1_000));
    }
    use crate::capture::aux_pause::PauseSource;
    use crate::rules::RuleSet;

    fn rules(yaml: &str) -> Vec<crate::rules::Rule> {
        match RuleSet::from_str(yaml, "test.yaml") {
            Ok(set) => set.rules,
            Err(e) => panic!("{e}"),
        }
    }

    const RULES: &str = "version: 1
rules:
  - name: crash
    target: { comm: app }
    trigger: { signal: { signals: [SIGSEGV] } }
  - name: slow
    target: { comm: app }
    trigger: { function: { symbol: handle, min_duration: 5ms } }
  - name: entry
    target: { comm: app }
    trigger: { function: { symbol: handle } }
";

    #[test]
    fn a_process_pauses_pt_in_the_kernel_for_signals_not_durations_nor_post_trigger() {
        let all = rules(RULES);
        let sources = pause_sources(all.iter());
        assert_eq!(sources.len(), 1, "{sources:?}");
        assert!(matches!(
            &sources[0],
            PauseSource::Tracepoint {
                name: "signal_deliver",
                ..
            }
        ));
        // One rule of the process asks for trace after its trigger: no pause at all.
        let with_post = rules(&RULES.replacen(
            "trigger: { signal: { signals: [SIGSEGV] } }",
            "trigger: { signal: { signals: [SIGSEGV] } }\n    snapshot: { post_trigger: 5ms }",
            1,
        ));
        assert!(pause_sources(with_post.iter()).is_empty());
    }

    /// Attaches nothing: the cases below fail before an attach.
    struct NoAttach;

    impl AttachProbes for NoAttach {
        fn attach(
            &mut self,
            _: u32,
            _: &[resolve::ProbePoint],
        ) -> Result<Vec<AttachedProbe>, TriggerError> {
            panic!("no attach expected")
        }
    }

    /// A process that exits while its probe is being placed (its `/proc/PID/root` path
    /// gone by the time the binary is resolved) leaves the binary unexamined, for its
    /// next process; a binary that truly lacks the symbol is examined for good. CI, under
    /// load: a 2 ms process exited between its exec event and the attach, and the rule
    /// had no probe for any later process of the binary.
    #[test]
    fn a_process_gone_while_its_probe_is_placed_leaves_the_binary_to_the_next() {
        let rule = rules(
            "version: 1
rules:
  - name: f
    target: { comm: app }
    trigger: { function: { symbol: lb_work } }
",
        )
        .remove(0);
        let mut active = ActiveRule {
            rule,
            id: 0,
            targets: BTreeSet::new(),
            binaries: BTreeMap::new(),
            limited: BTreeMap::new(),
            probe_error: None,
            probe_error_reason: None,
            installed_ticks: None,
            installed_ns: 0,
        };
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("app");
        std::fs::write(&binary, b"not an ELF").unwrap();
        let mut errors = ErrorTally::default();
        let place = |active: &mut ActiveRule, errors: &mut ErrorTally, gone: bool| {
            place_probe(&mut NoAttach, errors, active, (&binary, Some(4242)), || {
                if gone {
                    // The process exits: its path through /proc goes with it.
                    std::fs::remove_file(&binary).unwrap();
                    Err(ResolveError::NoProcess { pid: 4242 })
                } else {
                    Err(ResolveError::NoSymbol {
                        symbol: "lb_work".into(),
                        path: binary.clone(),
                        symbols: String::new(),
                        hint: String::new(),
                    })
                }
            })
        };
        assert!(!place(&mut active, &mut errors, true));
        assert!(
            active.binaries.is_empty(),
            "examined: {:?}",
            active.binaries
        );
        assert_eq!(
            active.probe_error, None,
            "a vanished process is no probe error"
        );
        // The binary's next process: a real answer, kept.
        std::fs::write(&binary, b"not an ELF").unwrap();
        assert!(!place(&mut active, &mut errors, false));
        assert_eq!(active.binaries.len(), 1);
        assert!(active.probe_error.is_some());
        assert!(Path::new(&binary).exists());
    }
}
