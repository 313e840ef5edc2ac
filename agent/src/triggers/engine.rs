//! The trigger engine: loads lookback's eBPF object, keeps the kernel's rule, target and
//! config maps in step with the agent's rules, attaches uprobes and raw tracepoints on
//! demand, and reads the per-rule counters.
//!
//! Function probes go through `uprobe_multi` links where this kernel and these privileges
//! make them (a second copy of the function programs, `super::uprobe_multi`; one link
//! holds all the exits of a function), else through uprobe perf events (aya's
//! `UProbe::attach`, one per site); [`AttachPath`] says which.
//!
//! Dropping the engine detaches every probe and unloads every program (aya closes the link
//! and program fds); nothing is pinned, so nothing outlives the process.
use std::{
    collections::{BTreeMap, HashMap},
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
};

use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::{Array, HashMap as BpfHashMap, MapData, MapError, PerCpuArray, RingBuf},
    programs::{
        PerfEvent, ProgramError, RawTracePoint, UProbe,
        raw_trace_point::RawTracePointLinkId,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use lookback_common::probe::{
    self, JumpSite, MAX_JUMP_SITES, SITE_COND_JUMP, SITE_ENTRY, SITE_INDIRECT_JUMP, SITE_JUMP,
    SITE_RET, SITE_URETPROBE,
};
use lookback_common::{
    MAX_RULES,
    rule::{
        COUNTER_DEPTH_OVERFLOW, COUNTER_EMITTED, COUNTER_MET, COUNTER_RINGBUF_FULL,
        COUNTER_SUPPRESSED_COOLDOWN, COUNTER_SUPPRESSED_RATE, COUNTER_UNMATCHED_RETURN,
        COUNTER_UNWOUND, COUNTERS_PER_RULE, EngineConfig, EntryKey, FLAG_FOLLOW_FORKS,
        FLAG_FREEZE_IN_KERNEL, FLAG_RUNNING, KIND_FUNCTION, KIND_SIGNAL, KIND_SYSCALL,
        ProcessRuleKey, RuleSpec, RuleState, RunningStack,
    },
};
use serde::Serialize;

use super::{
    btf::{Btf, BtfError},
    exits::{ExitKind, WalkError},
    inflight,
    plan::{EngineRule, PlanError, rule_spec},
    resolve::{ProbeKind, ProbePoint},
    uprobe_multi::MultiPrograms,
};
use crate::rules::{ReturnProbe, Trigger};
use crate::sys::SyscallError;

/// The compiled eBPF object (built by agent/build.rs with aya-build).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lookback"));

/// `LOOKBACK_UPROBE_ATTACH=perf-event`: function probes through uprobe perf events even
/// where `uprobe_multi` links work (a kernel whose links misbehave, or a test of the
/// older path).
pub const ATTACH_ENV: &str = "LOOKBACK_UPROBE_ATTACH";

const PROG_FUNCTION_ENTRY: &str = "function_entry";
const PROG_FUNCTION_EXIT: &str = "function_exit";
const PROG_FUNCTION_RETURN: &str = "function_return";
/// The sampling recorder's in-kernel freeze: set on its perf events, not attached here.
const PROG_SAMPLE_FILTER: &str = "sample_filter";
const PROG_TARGET_FILTER: &str = "target_filter";
/// Raw tracepoint programs and the tracepoint each attaches to.
const PROG_SYS_ENTER: (&str, &str) = ("sys_enter", "sys_enter");
const PROG_SYS_EXIT: (&str, &str) = ("sys_exit", "sys_exit");
const PROG_SIGNAL: (&str, &str) = ("signal_generate", "signal_generate");
const PROG_FORK: (&str, &str) = ("process_fork", "sched_process_fork");
const PROG_EXEC: (&str, &str) = ("process_exec", "sched_process_exec");
const PROG_EXIT: (&str, &str) = ("process_exit", "sched_process_exit");

/// A failure of the trigger engine.
#[derive(Debug, thiserror::Error)]
pub enum TriggerError {
    #[error("cannot load the eBPF programs (root or CAP_BPF+CAP_PERFMON needed)")]
    Load(#[source] Box<EbpfError>),
    #[error("eBPF program {name} is missing from the object")]
    MissingProgram { name: &'static str },
    #[error("eBPF program {name}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("eBPF map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<MapError>,
    },
    #[error("eBPF map {name} is missing from the object")]
    MissingMap { name: &'static str },
    #[error("cannot find task_struct field offsets")]
    Btf(#[from] BtfError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("cannot count the possible CPUs")]
    Cpus(#[source] std::io::Error),
    #[error("rule id {id} is out of range (at most {MAX_RULES} rules)")]
    RuleId { id: u32 },
    #[error("rule id {id} is beyond the {slots} rule slot(s) the engine was loaded with")]
    RuleSlot { id: u32, slots: u32 },
    #[error("rule {rule} is not a function rule: it takes no uprobes")]
    NotFunction { rule: String },
    #[error(
        "rule {rule}: cannot find where {symbol} in {path} returns: {reason}. Choices: an \
         entry trigger (func:{symbol} without a duration), or `return_probe: uretprobe` \
         (--return-probe uretprobe), which replaces return addresses on the stack: C++ \
         exceptions and Rust panics through the function then abort the program"
    )]
    Unbounded {
        rule: String,
        symbol: String,
        path: String,
        reason: WalkError,
    },
    #[error(
        "rule {rule}: {path} is a Go binary: a uretprobe would crash it (Go copies goroutine \
         stacks and checks return addresses); use the default `return_probe: exits`"
    )]
    UretprobeOnGo { rule: String, path: String },
    #[error(
        "rule {rule}: the programs of detect: running could not be loaded ({reason}); they \
         need Linux 5.18 or newer (a sleepable task iterator, bpf_copy_from_user_task) and \
         task_struct.on_cpu/nvcsw/nivcsw in the kernel's BTF; use detect: returned"
    )]
    RunningUnsupported { rule: String, reason: String },
    #[error(
        "rule {rule}: detect: running needs the size of {symbol} in {path} (its symbol has \
         none), to tell its frame from a sibling's"
    )]
    RunningWithoutSize {
        rule: String,
        symbol: String,
        path: String,
    },
    #[error("rule {rule}: more than {MAX_JUMP_SITES} indirect exit jumps")]
    JumpSitesFull { rule: String },
    #[error("cannot attach {what} for rule {rule} at {path}+{offset:#x}")]
    Attach {
        rule: String,
        what: &'static str,
        path: String,
        offset: u64,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("cannot attach {what} for rule {rule} at {path}+{offset:#x} (uprobe_multi link)")]
    AttachMulti {
        rule: String,
        what: &'static str,
        path: String,
        offset: u64,
        #[source]
        source: SyscallError,
    },
}

impl TriggerError {
    /// The errno of a failed probe attach (`EACCES`, `ENOENT`, ...), whichever path placed it.
    pub fn attach_errno(&self) -> Option<i32> {
        match self {
            Self::Attach { source, .. } => match source.as_ref() {
                ProgramError::SyscallError(e) => e.io_error.raw_os_error(),
                _ => None,
            },
            Self::AttachMulti { source, .. } => source.errno(),
            _ => None,
        }
    }
}

pub(super) fn map_err(name: &'static str) -> impl FnOnce(MapError) -> TriggerError {
    move |source| TriggerError::Map {
        name,
        source: Box::new(source),
    }
}

pub(super) fn prog_err(name: &'static str) -> impl FnOnce(ProgramError) -> TriggerError {
    move |source| TriggerError::Program {
        name,
        source: Box::new(source),
    }
}

/// A uprobe or uretprobe placed for a rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttachedProbe {
    pub path: String,
    /// The probed function, as people read its name (demangled).
    pub function: String,
    pub file_offset: u64,
    pub probe_kind: ProbeKind,
    /// Not the entry: an exit probe or a uretprobe.
    pub is_return: bool,
    /// `entry`, `uretprobe`, or the exit's kind: `ret`, `jump`, `cond_jump`, `indirect_jump`.
    pub site: &'static str,
}

/// Per-rule counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RuleCounters {
    /// Conditions met in the kernel, before suppression.
    pub met: u64,
    pub suppressed_cooldown: u64,
    pub suppressed_rate_limit: u64,
    pub emitted: u64,
    pub lost_ringbuf_full: u64,
    pub depth_overflow: u64,
    pub unmatched_return: u64,
    /// Entries dropped because their frame was abandoned (longjmp, exception, panic).
    pub unwound: u64,
}

/// How function probes are placed: the attach path this kernel and these privileges
/// allow, decided once at load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachPath {
    /// BPF `uprobe_multi` links (Linux 6.6): `CAP_BPF` + `CAP_PERFMON` suffice.
    UprobeMulti,
    /// uprobe perf events (aya's `UProbe::attach`): `CAP_SYS_ADMIN` on Linux 6.16 and
    /// newer (and stable kernels with that change); the reason multi links are not used.
    PerfEvent { why_not_multi: String },
}

/// A link holding uprobes of one program at `sites` offsets of one file.
enum ProbeLink {
    /// One perf-event uprobe (one site), detached through its program.
    Perf(UProbeLinkId),
    /// One `uprobe_multi` link; closing it removes all its sites.
    Multi { _link: OwnedFd, sites: usize },
}

impl ProbeLink {
    fn sites(&self) -> usize {
        match self {
            Self::Perf(_) => 1,
            Self::Multi { sites, .. } => *sites,
        }
    }
}

/// The uprobe links of a rule (or of a batch of probe points being attached).
#[derive(Default)]
struct Links {
    entry: Vec<ProbeLink>,
    exit: Vec<ProbeLink>,
    uretprobe: Vec<ProbeLink>,
    /// `JUMP_SITES` slots in use by the exit probes.
    jump_sites: Vec<u32>,
}

impl Links {
    /// Probe sites held (a multi link counts each of its offsets).
    fn len(&self) -> usize {
        [&self.entry, &self.exit, &self.uretprobe]
            .iter()
            .flat_map(|links| links.iter())
            .map(ProbeLink::sites)
            .sum()
    }

    fn append(&mut self, other: Links) {
        self.entry.extend(other.entry);
        self.exit.extend(other.exit);
        self.uretprobe.extend(other.uretprobe);
        self.jump_sites.extend(other.jump_sites);
    }
}

struct LoadedRule {
    rule: EngineRule,
    spec: RuleSpec,
    links: Links,
}

/// Loaded programs and the rules they currently enforce.
pub struct TriggerEngine {
    ebpf: Ebpf,
    /// The function programs loaded for `uprobe_multi` links; `None`: perf events.
    multi: Option<MultiPrograms>,
    attach_path: AttachPath,
    config: EngineConfig,
    rules: BTreeMap<u32, LoadedRule>,
    raw_links: HashMap<&'static str, RawTracePointLinkId>,
    targets: HashMap<u32, u64>,
    /// `JUMP_SITES` slots released by detached probes, reused first.
    free_jump_sites: Vec<u32>,
    /// Slots `0..next_jump_site` have been handed out.
    next_jump_site: u32,
    /// Rule ids `0..rule_slots` are usable (the programs' loops stop there).
    rule_slots: u32,
    /// Entries of the kernel's target set.
    max_targets: u32,
    /// Why the `detect: running` programs could not be loaded, once they could not.
    running_refused: Option<String>,
}

/// Entries of `RUNNING_TIMES` (a thread's or goroutine's calls in flight for one
/// `detect: running` rule) in a session that may have such rules: 16,384 × ~1.3 KB.
pub const RUNNING_THREADS: u32 = 16_384;

impl TriggerEngine {
    /// Loads the eBPF object and the programs every session uses (attaching nothing yet),
    /// and finds the `task_struct` offsets in the kernel's BTF. The syscall and signal
    /// programs are verified when a rule first needs them ([`Self::sync_kinds`]): their
    /// rule loops cost the verifier ~0.8 s of kernel time, which a `run` with a function
    /// rule would otherwise spend before its command starts.
    pub fn load() -> Result<Self, TriggerError> {
        Self::load_for(MAX_RULES, true)
    }

    /// [`load`](Self::load) for rule ids `0..rule_slots` only (clamped to 1..=64): the
    /// verifier then checks the rule loops for that many iterations, not 64; and, without
    /// `running` (no `detect: running` rule), with a one-entry `RUNNING_TIMES` instead of
    /// ~21 MB of preallocated kernel memory. For a session whose rules are known at start
    /// (`run`, `attach`); the agent, whose reloads may use any id and detection, loads all.
    pub fn load_for(rule_slots: u32, running: bool) -> Result<Self, TriggerError> {
        let running_threads = if running { RUNNING_THREADS } else { 1 };
        Self::load_sized(
            rule_slots,
            lookback_common::process::DEFAULT_MAX_TARGETS,
            running_threads,
        )
    }

    /// [`load_for`](Self::load_for) with a kernel target set of `max_targets` processes
    /// (clamped to 1..=1,048,576): the agent on a node with more matching processes than
    /// the default 16,384 (each entry is ~100 bytes of kernel memory), and room for the
    /// calls in flight of `running_threads` threads (or goroutines) per `detect: running`
    /// rule ([`RUNNING_THREADS`] by default; each ~1.3 KB).
    pub fn load_sized(
        rule_slots: u32,
        max_targets: u32,
        running_threads: u32,
    ) -> Result<Self, TriggerError> {
        let rule_slots = rule_slots.clamp(1, MAX_RULES);
        let max_targets = max_targets.clamp(1, 1 << 20);
        let running_threads = running_threads.clamp(1, 1 << 20);
        let btf = Btf::from_sys_fs()?;
        let config = EngineConfig {
            task_tgid_offset: btf.member_offset("task_struct", "tgid")?,
            task_pid_offset: btf.member_offset("task_struct", "pid")?,
            // Only `detect: running` needs these (0: absent, and such rules are refused).
            task_on_cpu_offset: btf.member_offset("task_struct", "on_cpu").unwrap_or(0),
            task_nvcsw_offset: btf.member_offset("task_struct", "nvcsw").unwrap_or(0),
            task_nivcsw_offset: btf.member_offset("task_struct", "nivcsw").unwrap_or(0),
            ..EngineConfig::default()
        };
        let mut ebpf = EbpfLoader::new()
            .override_global("RULE_SLOTS", &rule_slots, true)
            .map_max_entries("TARGET_TGIDS", max_targets)
            .map_max_entries("RUNNING_TIMES", running_threads)
            .load(EBPF_OBJECT)
            .map_err(|e| TriggerError::Load(Box::new(e)))?;
        let slots = rule_slots.to_ne_bytes();
        let (multi, attach_path) =
            if std::env::var_os(ATTACH_ENV).is_some_and(|v| v == "perf-event") {
                let why = format!("not used ({ATTACH_ENV}=perf-event)");
                (None, AttachPath::PerfEvent { why_not_multi: why })
            } else {
                match MultiPrograms::load(
                    &ebpf,
                    EBPF_OBJECT,
                    &[("RULE_SLOTS", &slots)],
                    &[
                        PROG_FUNCTION_ENTRY,
                        PROG_FUNCTION_EXIT,
                        PROG_FUNCTION_RETURN,
                    ],
                ) {
                    Ok(multi) => (Some(multi), AttachPath::UprobeMulti),
                    Err(e) => {
                        let why = crate::sys::error_chain(&e);
                        log::debug!("function probes through uprobe perf events: {why}");
                        (None, AttachPath::PerfEvent { why_not_multi: why })
                    }
                }
            };
        for name in [
            PROG_FUNCTION_ENTRY,
            PROG_FUNCTION_EXIT,
            PROG_FUNCTION_RETURN,
        ] {
            let prog: &mut UProbe = program(&mut ebpf, name)?;
            prog.load().map_err(prog_err(name))?;
        }
        for (name, _) in [PROG_FORK, PROG_EXEC, PROG_EXIT] {
            let prog: &mut RawTracePoint = program(&mut ebpf, name)?;
            prog.load().map_err(prog_err(name))?;
        }
        let filter: &mut PerfEvent = program(&mut ebpf, PROG_SAMPLE_FILTER)?;
        filter.load().map_err(prog_err(PROG_SAMPLE_FILTER))?;
        let mut engine = Self {
            ebpf,
            multi,
            attach_path,
            config,
            rules: BTreeMap::new(),
            raw_links: HashMap::new(),
            targets: HashMap::new(),
            free_jump_sites: Vec::new(),
            next_jump_site: 0,
            rule_slots,
            max_targets,
            running_refused: None,
        };
        engine.write_config()?;
        Ok(engine)
    }

    /// How this engine places function probes.
    pub fn attach_path(&self) -> &AttachPath {
        &self.attach_path
    }

    /// The aya-log channel of the programs, for the caller to poll (`flush` when readable).
    pub fn logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        match aya_log::EbpfLogger::init(&mut self.ebpf) {
            Ok(logger) => Some(logger),
            Err(e) => {
                log::debug!("eBPF logging unavailable: {e}");
                None
            }
        }
    }

    /// Takes the ring buffer of trigger records (once).
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>, TriggerError> {
        self.take_ring("EVENTS")
    }

    /// The loaded `sample_filter` program, for a sampling recorder to set on its perf events
    /// (it drops the samples of processes in `FROZEN`).
    pub fn sample_filter(&self) -> Result<BorrowedFd<'_>, TriggerError> {
        let name = PROG_SAMPLE_FILTER;
        let prog = self
            .ebpf
            .program(name)
            .ok_or(TriggerError::MissingProgram { name })?;
        let prog: &PerfEvent = prog.try_into().map_err(prog_err(name))?;
        Ok(prog.fd().map_err(prog_err(name))?.as_fd())
    }

    /// The `target_filter` program, loaded at its first use (only the agent's per-CPU
    /// recorders need it): set on events that sample every process of a CPU, it keeps the
    /// samples of the targets of the rules in
    /// [`set_shared_record_rules`](Self::set_shared_record_rules) that are not frozen.
    pub fn target_filter(&mut self) -> Result<BorrowedFd<'_>, TriggerError> {
        let name = PROG_TARGET_FILTER;
        let prog: &mut PerfEvent = program(&mut self.ebpf, name)?;
        if prog.fd().is_err() {
            prog.load().map_err(prog_err(name))?;
        }
        Ok(prog.fd().map_err(prog_err(name))?.as_fd())
    }

    /// The rules (bit = id) whose targets the per-CPU recorders keep
    /// ([`target_filter`](Self::target_filter)).
    pub fn set_shared_record_rules(&mut self, mask: u64) -> Result<(), TriggerError> {
        if self.config.shared_record_rules == mask {
            return Ok(());
        }
        self.config.shared_record_rules = mask;
        self.write_config()
    }

    /// Takes the `FROZEN` map out of the object (once): the processes whose samples the
    /// kernel stopped at a trigger.
    pub fn take_frozen(&mut self) -> Result<FrozenProcesses, TriggerError> {
        let name = "FROZEN";
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(TriggerError::MissingMap { name })?;
        Ok(FrozenProcesses {
            map: BpfHashMap::try_from(map).map_err(map_err(name))?,
        })
    }

    /// Makes the installed rules stop their process's samples in the kernel when they send a
    /// trigger (`FLAG_FREEZE_IN_KERNEL`), or not. Only for rules whose snapshot is taken at
    /// once, with a recorder that runs [`sample_filter`](Self::sample_filter); userspace
    /// then removes the process from `FROZEN` after each snapshot ([`FrozenProcesses`]).
    pub fn set_freeze_in_kernel(&mut self, on: bool) -> Result<(), TriggerError> {
        let ids: Vec<u32> = self.rules.keys().copied().collect();
        for id in ids {
            self.set_rule_freeze_in_kernel(id, on)?;
        }
        Ok(())
    }

    /// [`set_freeze_in_kernel`](Self::set_freeze_in_kernel) for the installed rule `id`
    /// alone (the agent decides per rule: its backend and `post_trigger`). Leaves the rule's
    /// cooldown state alone.
    pub fn set_rule_freeze_in_kernel(&mut self, id: u32, on: bool) -> Result<(), TriggerError> {
        let loaded = self.rules.get_mut(&id).ok_or(TriggerError::RuleId { id })?;
        loaded.spec.flags = with_flag(loaded.spec.flags, FLAG_FREEZE_IN_KERNEL, on);
        let spec = loaded.spec;
        let mut rules: Array<_, RuleSpec> = map_mut(&mut self.ebpf, "RULES")?;
        rules.set(id, spec, 0).map_err(map_err("RULES"))
    }

    /// Takes ring buffer map `name` out of the object (once).
    fn take_ring(&mut self, name: &'static str) -> Result<RingBuf<MapData>, TriggerError> {
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(TriggerError::MissingMap { name })?;
        RingBuf::try_from(map).map_err(map_err(name))
    }

    /// Installs a rule: writes it to `RULES`, attaches what it needs (uprobes at `probes`
    /// for a function rule; the shared raw tracepoints otherwise). Returns the probes placed.
    pub fn add_rule(
        &mut self,
        rule: EngineRule,
        probes: &[ProbePoint],
    ) -> Result<Vec<AttachedProbe>, TriggerError> {
        if rule.id >= MAX_RULES {
            return Err(TriggerError::RuleId { id: rule.id });
        }
        if rule.id >= self.rule_slots {
            return Err(TriggerError::RuleSlot {
                id: rule.id,
                slots: self.rule_slots,
            });
        }
        self.remove_rule(rule.id)?;
        let spec = rule_spec(&rule)?;
        self.running_programs(&rule.name, &spec)?;
        let mut loaded = LoadedRule {
            rule,
            spec,
            links: Links::default(),
        };
        let mut attached = Vec::new();
        if spec.kind == KIND_FUNCTION {
            // Write the rule before the probes fire. No probe point yet is fine: the agent
            // places them with `attach_probes` as it finds the binaries.
            self.write_rule(loaded.rule.id, &spec)?;
            let mut links = Links::default();
            for point in probes {
                if let Err(e) = self.attach_function(&loaded, point, &mut attached, &mut links) {
                    self.detach_links(&loaded.rule.name, &mut links);
                    self.write_rule(loaded.rule.id, &RuleSpec::default())?;
                    return Err(e);
                }
            }
            loaded.links = links;
        } else {
            self.write_rule(loaded.rule.id, &spec)?;
        }
        self.rules.insert(loaded.rule.id, loaded);
        self.sync_kinds()?;
        Ok(attached)
    }

    /// Changes installed rule `rule.id` in place when its probes stay as they are: only
    /// the kernel's `RULES` entry is rewritten, so the uprobes, the entries of calls in
    /// flight, the suppression state and the counters carry on (a reload that changes a
    /// threshold or a cooldown loses nothing). Returns `false`, changing nothing, when the
    /// new version needs other probes (another function, binary or return detection, or
    /// entry ↔ latency), another kind, or the id is not installed: the caller then
    /// installs it anew.
    pub fn update_rule(&mut self, rule: &EngineRule) -> Result<bool, TriggerError> {
        let Some(loaded) = self.rules.get(&rule.id) else {
            return Ok(false);
        };
        if !same_probes(&loaded.rule.trigger, &rule.trigger)
            || loaded.rule.follow_forks != rule.follow_forks
        {
            return Ok(false);
        }
        let mut spec = rule_spec(rule)?;
        spec.flags |= loaded.spec.flags & FLAG_FREEZE_IN_KERNEL;
        self.running_programs(&rule.name, &spec)?;
        let mut rules: Array<_, RuleSpec> = map_mut(&mut self.ebpf, "RULES")?;
        rules.set(rule.id, spec, 0).map_err(map_err("RULES"))?;
        if let Some(loaded) = self.rules.get_mut(&rule.id) {
            loaded.rule = rule.clone();
            loaded.spec = spec;
        }
        self.sync_kinds()?;
        Ok(true)
    }

    /// Places more probes for function rule `id` (a binary found later, e.g. a new
    /// process's executable). Returns the probes placed; on error none of `points` stays.
    pub fn attach_probes(
        &mut self,
        id: u32,
        points: &[ProbePoint],
    ) -> Result<Vec<AttachedProbe>, TriggerError> {
        let Some(mut loaded) = self.rules.remove(&id) else {
            return Err(TriggerError::RuleId { id });
        };
        if loaded.spec.kind != KIND_FUNCTION {
            let rule = loaded.rule.name.clone();
            self.rules.insert(id, loaded);
            return Err(TriggerError::NotFunction { rule });
        }
        let mut attached = Vec::new();
        let mut batch = Links::default();
        for point in points {
            if let Err(e) = self.attach_function(&loaded, point, &mut attached, &mut batch) {
                self.detach_links(&loaded.rule.name, &mut batch);
                self.rules.insert(id, loaded);
                return Err(e);
            }
        }
        loaded.links.append(batch);
        self.rules.insert(id, loaded);
        Ok(attached)
    }

    /// Number of uprobe links (entry and return) rule `id` holds.
    pub fn probe_count(&self, id: u32) -> usize {
        self.rules.get(&id).map_or(0, |l| l.links.len())
    }

    /// Starts the exec/exit event stream (agent): attaches the process programs and turns
    /// on `process_events`. Take the ring with [`take_process_events`](Self::take_process_events).
    pub fn enable_process_events(&mut self) -> Result<(), TriggerError> {
        for (name, tracepoint) in [PROG_EXEC, PROG_EXIT] {
            if self.raw_links.contains_key(name) {
                continue;
            }
            let prog: &mut RawTracePoint = program(&mut self.ebpf, name)?;
            let link = prog.attach(tracepoint).map_err(prog_err(name))?;
            self.raw_links.insert(name, link);
        }
        self.config.process_events = 1;
        self.write_config()
    }

    /// Takes the ring buffer of exec/exit records (once).
    pub fn take_process_events(&mut self) -> Result<RingBuf<MapData>, TriggerError> {
        self.take_ring("PROC_EVENTS")
    }

    /// Sets the comms that make a process a target at exec (`EXEC_COMMS`), replacing the
    /// previous set. Names longer than 15 bytes are cut as the kernel cuts `comm`.
    pub fn set_exec_comms(&mut self, comms: &HashMap<String, u64>) -> Result<(), TriggerError> {
        let mut map: BpfHashMap<_, [u8; 16], u64> = map_mut(&mut self.ebpf, "EXEC_COMMS")?;
        let wanted: HashMap<[u8; 16], u64> = comms
            .iter()
            .map(|(name, mask)| (comm_key(name), *mask))
            .collect();
        let stale: Vec<[u8; 16]> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !wanted.contains_key(k))
            .collect();
        for key in stale {
            let _ = map.remove(&key);
        }
        for (key, mask) in wanted {
            map.insert(key, mask, 0).map_err(map_err("EXEC_COMMS"))?;
        }
        Ok(())
    }

    /// Sets the cgroups (v2 ids) whose processes are targets of the rules in their masks,
    /// replacing the previous set: processes started later in them are targets from their
    /// first instruction, before the agent hears of them.
    pub fn set_target_cgroups(&mut self, cgroups: &HashMap<u64, u64>) -> Result<(), TriggerError> {
        let mut map: BpfHashMap<_, u64, u64> = map_mut(&mut self.ebpf, "TARGET_CGROUPS")?;
        let stale: Vec<u64> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !cgroups.contains_key(k))
            .collect();
        for key in stale {
            let _ = map.remove(&key);
        }
        for (&id, &mask) in cgroups {
            map.insert(id, mask, 0).map_err(map_err("TARGET_CGROUPS"))?;
        }
        self.config.cgroups_active = u32::from(!cgroups.is_empty());
        self.write_config()
    }

    /// Removes `tgid` from the kernel's target set even if the engine did not put it there
    /// (`EXEC_COMMS` pre-selected it at exec, and `/proc` says it does not match after all).
    pub fn withdraw_target(&mut self, tgid: u32) -> Result<(), TriggerError> {
        self.targets.remove(&tgid);
        let mut map: BpfHashMap<_, u32, u64> = map_mut(&mut self.ebpf, "TARGET_TGIDS")?;
        match map.remove(&tgid) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(())
            }
            Err(e) => Err(map_err("TARGET_TGIDS")(e)),
        }
    }

    /// Forgets a process the kernel already removed from `TARGET_TGIDS` (exit event).
    pub fn forget_target(&mut self, tgid: u32) {
        self.targets.remove(&tgid);
    }

    /// Places the probes of one function for rule `loaded`: for a latency rule, first one
    /// uprobe on each exit (or the requested uretprobe), then the entry uprobe, so that no
    /// call is entered without its exits watched. The links placed go to `links`, also
    /// those placed before an error (for the caller to detach).
    fn attach_function(
        &mut self,
        loaded: &LoadedRule,
        point: &ProbePoint,
        attached: &mut Vec<AttachedProbe>,
        links: &mut Links,
    ) -> Result<(), TriggerError> {
        let id = loaded.rule.id;
        let rule = &loaded.rule.name;
        let path = || point.path.display().to_string();
        let mut entry_cookie = probe::cookie(id, SITE_ENTRY, point.go, 0, 0);
        if loaded.spec.flags & FLAG_RUNNING != 0 {
            // Only the entry probe; its cookie carries the function's size (and, in Go,
            // that calls are keyed by goroutine).
            let size = u32::try_from(point.size)
                .ok()
                .filter(|&s| s > 0)
                .ok_or_else(|| TriggerError::RunningWithoutSize {
                    rule: rule.clone(),
                    symbol: point.display.clone(),
                    path: path(),
                })?;
            entry_cookie = probe::cookie(id, SITE_ENTRY, point.go, 0, size);
        } else if loaded.spec.min_duration_ns > 0 {
            let return_probe = match &loaded.rule.trigger {
                Trigger::Function(f) => f.return_probe,
                _ => ReturnProbe::default(),
            };
            match return_probe {
                ReturnProbe::Uretprobe if point.go => {
                    return Err(TriggerError::UretprobeOnGo {
                        rule: rule.clone(),
                        path: path(),
                    });
                }
                ReturnProbe::Uretprobe => {
                    let cookie = probe::cookie(id, SITE_URETPROBE, false, 0, 0);
                    let placed = self.attach_sites(
                        PROG_FUNCTION_RETURN,
                        rule,
                        point,
                        &[(point.file_offset, cookie)],
                        &mut links.uretprobe,
                    );
                    placed?;
                    attached.push(attached_probe(point, point.file_offset, "uretprobe"));
                }
                ReturnProbe::Exits => {
                    let exits = point
                        .exits
                        .as_ref()
                        .map_err(|reason| TriggerError::Unbounded {
                            rule: rule.clone(),
                            symbol: point.symbol.clone(),
                            path: path(),
                            reason: reason.clone(),
                        })?;
                    let mut sites = Vec::with_capacity(exits.len());
                    for exit in exits {
                        let (site, condition, jump_site) = match exit.kind {
                            ExitKind::Ret => (SITE_RET, 0, 0),
                            ExitKind::Jump => (SITE_JUMP, 0, 0),
                            ExitKind::CondJump { condition } => (SITE_COND_JUMP, condition, 0),
                            ExitKind::IndirectJump(jump) => {
                                let slot = self.claim_jump_site(rule, &jump)?;
                                links.jump_sites.push(slot);
                                (SITE_INDIRECT_JUMP, 0, slot)
                            }
                        };
                        let cookie = probe::cookie(id, site, point.go, condition, jump_site);
                        sites.push((exit.file_offset, cookie));
                    }
                    self.attach_sites(PROG_FUNCTION_EXIT, rule, point, &sites, &mut links.exit)?;
                    for exit in exits {
                        let mut probe = attached_probe(point, exit.file_offset, exit.kind.name());
                        probe.probe_kind = ProbeKind::Trap;
                        attached.push(probe);
                    }
                }
            }
        }
        let sites = [(point.file_offset, entry_cookie)];
        self.attach_sites(PROG_FUNCTION_ENTRY, rule, point, &sites, &mut links.entry)?;
        attached.push(attached_probe(point, point.file_offset, "entry"));
        Ok(())
    }

    /// Places program `name` at the `(file offset, cookie)` `sites` of `point`'s file: one
    /// `uprobe_multi` link for all of them, else one perf-event uprobe each. The links
    /// placed go to `out`, also those placed before an error (for the caller to detach).
    fn attach_sites(
        &mut self,
        name: &'static str,
        rule: &str,
        point: &ProbePoint,
        sites: &[(u64, u64)],
        out: &mut Vec<ProbeLink>,
    ) -> Result<(), TriggerError> {
        let what = if name == PROG_FUNCTION_RETURN {
            "uretprobe"
        } else {
            "uprobe"
        };
        if let Some(multi) = &self.multi {
            if sites.is_empty() {
                return Ok(());
            }
            let ret = name == PROG_FUNCTION_RETURN;
            let link = multi
                .attach(name, &point.path, sites, ret)
                .map_err(|source| TriggerError::AttachMulti {
                    rule: rule.to_owned(),
                    what,
                    path: point.path.display().to_string(),
                    offset: sites[0].0,
                    source,
                })?;
            out.push(ProbeLink::Multi {
                _link: link,
                sites: sites.len(),
            });
            return Ok(());
        }
        let prog: &mut UProbe = program(&mut self.ebpf, name)?;
        for &(file_offset, cookie) in sites {
            let at = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(file_offset),
                cookie: Some(cookie),
            };
            let link = prog
                .attach(at, &point.path, UProbeScope::AllProcesses)
                .map_err(|source| TriggerError::Attach {
                    rule: rule.to_owned(),
                    what,
                    path: point.path.display().to_string(),
                    offset: file_offset,
                    source: Box::new(source),
                })?;
            out.push(ProbeLink::Perf(link));
        }
        Ok(())
    }

    /// Writes `jump` to a free `JUMP_SITES` slot and returns it.
    fn claim_jump_site(&mut self, rule: &str, jump: &JumpSite) -> Result<u32, TriggerError> {
        let slot = match self.free_jump_sites.pop() {
            Some(slot) => slot,
            None if self.next_jump_site < MAX_JUMP_SITES => {
                self.next_jump_site += 1;
                self.next_jump_site - 1
            }
            None => {
                return Err(TriggerError::JumpSitesFull {
                    rule: rule.to_owned(),
                });
            }
        };
        let mut sites: Array<_, JumpSite> = map_mut(&mut self.ebpf, "JUMP_SITES")?;
        if let Err(e) = sites.set(slot, jump, 0) {
            self.free_jump_sites.push(slot);
            return Err(map_err("JUMP_SITES")(e));
        }
        Ok(slot)
    }

    fn detach_links(&mut self, rule: &str, links: &mut Links) {
        for (name, links) in [
            (PROG_FUNCTION_ENTRY, &mut links.entry),
            (PROG_FUNCTION_EXIT, &mut links.exit),
            (PROG_FUNCTION_RETURN, &mut links.uretprobe),
        ] {
            let mut prog = program::<UProbe>(&mut self.ebpf, name).ok();
            for link in links.drain(..) {
                // A multi link is closed (and its probes removed) as it drops here.
                if let (ProbeLink::Perf(link), Some(prog)) = (link, prog.as_deref_mut())
                    && let Err(e) = prog.detach(link)
                {
                    log::warn!("detaching {name} of rule {rule}: {e}");
                }
            }
        }
        // The exit probes that read these slots are gone.
        self.free_jump_sites.append(&mut links.jump_sites);
    }

    /// Removes a rule (no-op when absent): detaches its probes, clears its kernel slot and
    /// counters, and drops it from every target's rule mask.
    pub fn remove_rule(&mut self, id: u32) -> Result<(), TriggerError> {
        let Some(mut loaded) = self.rules.remove(&id) else {
            return Ok(());
        };
        self.detach_links(&loaded.rule.name, &mut loaded.links);
        self.write_rule(id, &RuleSpec::default())?;
        let bit = 1u64 << id;
        let tgids: Vec<u32> = self
            .targets
            .iter()
            .filter(|(_, m)| *m & bit != 0)
            .map(|(t, _)| *t)
            .collect();
        for tgid in tgids {
            let mask = self.targets.get(&tgid).copied().unwrap_or(0) & !bit;
            self.set_target(tgid, mask)?;
        }
        self.reset_counters(id)?;
        self.forget_running_calls(id);
        self.sync_kinds()
    }

    /// Loads the in-flight programs for a `detect: running` rule `spec`, before anything of
    /// the rule is written: a kernel without them refuses the rule alone.
    fn running_programs(&mut self, rule: &str, spec: &RuleSpec) -> Result<(), TriggerError> {
        if spec.flags & FLAG_RUNNING == 0 {
            return Ok(());
        }
        // A kernel that refused them once refuses them again: said at once for later rules.
        if self.running_refused.is_none()
            && let Err(e) = inflight::load_programs(&mut self.ebpf, &self.config)
        {
            self.running_refused = Some(crate::sys::error_chain(&e));
        }
        match &self.running_refused {
            None => Ok(()),
            Some(reason) => Err(TriggerError::RunningUnsupported {
                rule: rule.to_owned(),
                reason: reason.clone(),
            }),
        }
    }

    /// Drops the calls in flight of rule `id` (`RUNNING_TIMES`), so that a rule that later
    /// gets the id does not judge the old function's calls. Best effort: an entry the map
    /// refuses to drop is logged.
    fn forget_running_calls(&mut self, id: u32) {
        let Ok(mut map) =
            map_mut::<BpfHashMap<_, EntryKey, RunningStack>>(&mut self.ebpf, "RUNNING_TIMES")
        else {
            return;
        };
        let keys: Vec<EntryKey> = map.keys().filter_map(Result::ok).collect();
        for key in keys.into_iter().filter(|k| k.rule_id == id) {
            if let Err(e) = map.remove(&key) {
                log::debug!("RUNNING_TIMES: dropping rule {id}'s entry: {e}");
            }
        }
    }

    /// Makes `tgid` a target of the rules in `rule_mask` (bit = rule id), in addition to
    /// those it already has.
    pub fn add_target(&mut self, tgid: u32, rule_mask: u64) -> Result<(), TriggerError> {
        let mask = self.targets.get(&tgid).copied().unwrap_or(0) | rule_mask;
        self.set_target(tgid, mask)
    }

    /// Makes `tgid` a target of exactly the rules in `rule_mask` in one write of the
    /// kernel's map: rules that leave and rules that come change at one instant, with
    /// no moment in which it has neither (0: no longer a target).
    pub fn retarget(&mut self, tgid: u32, rule_mask: u64) -> Result<(), TriggerError> {
        self.set_target(tgid, rule_mask)
    }

    /// Stops tracing `tgid` for every rule.
    pub fn remove_target(&mut self, tgid: u32) -> Result<(), TriggerError> {
        self.set_target(tgid, 0)
    }

    fn set_target(&mut self, tgid: u32, mask: u64) -> Result<(), TriggerError> {
        let mut map: BpfHashMap<_, u32, u64> = map_mut(&mut self.ebpf, "TARGET_TGIDS")?;
        if mask == 0 {
            if self.targets.remove(&tgid).is_none() {
                return Ok(());
            }
            match map.remove(&tgid) {
                Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
                // Already gone (e.g. removed by the kernel side): nothing to do.
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
                {
                    Ok(())
                }
                Err(e) => Err(map_err("TARGET_TGIDS")(e)),
            }
        } else {
            map.insert(tgid, mask, 0).map_err(map_err("TARGET_TGIDS"))?;
            self.targets.insert(tgid, mask);
            Ok(())
        }
    }

    /// Processes the kernel currently treats as targets (including followed children),
    /// with their rule masks.
    pub fn kernel_targets(&self) -> Result<Vec<(u32, u64)>, TriggerError> {
        let map = self
            .ebpf
            .map("TARGET_TGIDS")
            .ok_or(TriggerError::MissingMap {
                name: "TARGET_TGIDS",
            })?;
        let map: BpfHashMap<_, u32, u64> =
            BpfHashMap::try_from(map).map_err(map_err("TARGET_TGIDS"))?;
        map.iter()
            .map(|r| r.map_err(map_err("TARGET_TGIDS")))
            .collect()
    }

    /// Slot `index` of the per-CPU counter array `name`, summed over CPUs.
    fn per_cpu_sum(&self, name: &'static str, index: u32) -> Result<u64, TriggerError> {
        let map = self
            .ebpf
            .map(name)
            .ok_or(TriggerError::MissingMap { name })?;
        let map: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(map_err(name))?;
        Ok(map.get(&index, 0).map_err(map_err(name))?.iter().sum())
    }

    /// Exec/exit records the kernel dropped because their ring was full (summed over CPUs).
    pub fn process_events_lost(&self) -> Result<u64, TriggerError> {
        self.per_cpu_sum("PROC_EVENTS_LOST", 0)
    }

    /// How many processes the kernel's target set holds at most.
    #[must_use]
    pub fn max_targets(&self) -> u32 {
        self.max_targets
    }

    /// Processes the kernel left out of its full target set at exec or fork (summed over
    /// CPUs; `TARGET_SET_FULL`).
    pub fn target_set_full(&self) -> Result<u64, TriggerError> {
        self.per_cpu_sum("TARGET_SET_FULL", 0)
    }

    /// Processes the kernel selected at exec by their comm, and how many of those had
    /// their exec record dropped (summed over CPUs; `EXEC_SELECTED`).
    pub fn exec_selected(&self) -> Result<ExecSelected, TriggerError> {
        use lookback_common::process::{EXEC_SELECTED_ALL, EXEC_SELECTED_LOST};
        Ok(ExecSelected {
            selected: self.per_cpu_sum("EXEC_SELECTED", EXEC_SELECTED_ALL)?,
            lost: self.per_cpu_sum("EXEC_SELECTED", EXEC_SELECTED_LOST)?,
        })
    }

    /// The counters of rule `id`.
    pub fn counters(&self, id: u32) -> Result<RuleCounters, TriggerError> {
        let map = self
            .ebpf
            .map("COUNTERS")
            .ok_or(TriggerError::MissingMap { name: "COUNTERS" })?;
        let map: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(map_err("COUNTERS"))?;
        let get = |c: u32| -> Result<u64, TriggerError> {
            let values = map
                .get(&(id * COUNTERS_PER_RULE + c), 0)
                .map_err(map_err("COUNTERS"))?;
            Ok(values.iter().sum())
        };
        Ok(RuleCounters {
            met: get(COUNTER_MET)?,
            suppressed_cooldown: get(COUNTER_SUPPRESSED_COOLDOWN)?,
            suppressed_rate_limit: get(COUNTER_SUPPRESSED_RATE)?,
            emitted: get(COUNTER_EMITTED)?,
            lost_ringbuf_full: get(COUNTER_RINGBUF_FULL)?,
            depth_overflow: get(COUNTER_DEPTH_OVERFLOW)?,
            unmatched_return: get(COUNTER_UNMATCHED_RETURN)?,
            unwound: get(COUNTER_UNWOUND)?,
        })
    }

    /// The installed rules, by id.
    pub fn rules(&self) -> impl Iterator<Item = &EngineRule> {
        self.rules.values().map(|l| &l.rule)
    }

    fn reset_counters(&mut self, id: u32) -> Result<(), TriggerError> {
        let ncpus = aya::util::nr_cpus().map_err(|(_, e)| TriggerError::Cpus(e))?;
        let mut map: PerCpuArray<_, u64> = map_mut(&mut self.ebpf, "COUNTERS")?;
        for c in 0..COUNTERS_PER_RULE {
            let zeros =
                aya::maps::PerCpuValues::try_from(vec![0u64; ncpus]).map_err(TriggerError::Cpus)?;
            map.set(id * COUNTERS_PER_RULE + c, zeros, 0)
                .map_err(map_err("COUNTERS"))?;
        }
        Ok(())
    }

    fn write_rule(&mut self, id: u32, spec: &RuleSpec) -> Result<(), TriggerError> {
        let mut rules: Array<_, RuleSpec> = map_mut(&mut self.ebpf, "RULES")?;
        rules.set(id, spec, 0).map_err(map_err("RULES"))?;
        let mut state: Array<_, RuleState> = map_mut(&mut self.ebpf, "RULE_STATE")?;
        state
            .set(id, RuleState::default(), 0)
            .map_err(map_err("RULE_STATE"))?;
        // And its per-process state: a rule that reuses the id starts without cooldowns.
        let mut per_process: aya::maps::HashMap<_, ProcessRuleKey, RuleState> =
            map_mut(&mut self.ebpf, "PROCESS_RULE_STATE")?;
        let of_this_rule: Vec<ProcessRuleKey> = per_process
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.rule_id == id)
            .collect();
        for key in of_this_rule {
            // Gone already (evicted, or removed by another pass): nothing to clear.
            let _ = per_process.remove(&key);
        }
        Ok(())
    }

    /// Recomputes the per-kind rule masks and attaches/detaches the shared raw tracepoints
    /// so that a machine without syscall rules pays nothing per syscall.
    fn sync_kinds(&mut self) -> Result<(), TriggerError> {
        let mask_of = |pred: &dyn Fn(&RuleSpec) -> bool| {
            self.rules
                .values()
                .filter(|l| pred(&l.spec))
                .fold(0u64, |m, l| m | 1 << l.rule.id)
        };
        self.config.syscall_rules = mask_of(&|s| s.kind == KIND_SYSCALL);
        self.config.signal_rules = mask_of(&|s| s.kind == KIND_SIGNAL);
        self.config.follow_fork_rules = mask_of(&|s| s.flags & FLAG_FOLLOW_FORKS != 0);
        self.config.running_rules = mask_of(&|s| s.flags & FLAG_RUNNING != 0);
        self.write_config()?;
        let want = [
            (PROG_SYS_ENTER, self.config.syscall_rules != 0),
            (PROG_SYS_EXIT, self.config.syscall_rules != 0),
            (PROG_SIGNAL, self.config.signal_rules != 0),
            (PROG_FORK, self.config.follow_fork_rules != 0),
        ];
        for ((name, tracepoint), wanted) in want {
            let prog: &mut RawTracePoint = program(&mut self.ebpf, name)?;
            match (wanted, self.raw_links.contains_key(name)) {
                (true, false) => {
                    if prog.fd().is_err() {
                        prog.load().map_err(prog_err(name))?;
                    }
                    let link = prog.attach(tracepoint).map_err(prog_err(name))?;
                    self.raw_links.insert(name, link);
                }
                (false, true) => {
                    if let Some(link) = self.raw_links.remove(name) {
                        prog.detach(link).map_err(prog_err(name))?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn write_config(&mut self) -> Result<(), TriggerError> {
        let config = self.config;
        let mut map: Array<_, EngineConfig> = map_mut(&mut self.ebpf, "CONFIG")?;
        map.set(0, config, 0).map_err(map_err("CONFIG"))
    }

    /// Descriptors for the in-flight watcher ([`crate::inflight::Watcher`]) once a
    /// `detect: running` rule is loaded; `None` before.
    pub fn inflight_handles(&self) -> Option<Result<inflight::Handles, TriggerError>> {
        (self.config.running_rules != 0).then(|| inflight::Handles::new(&self.ebpf))
    }

    /// Run-time statistics of every loaded program (for `lookback_bpf_program_*`). The
    /// kernel fills them only while stats are enabled (`BPF_ENABLE_STATS` or the
    /// `kernel.bpf_stats_enabled` sysctl); otherwise they read zero. A program whose info
    /// cannot be read is left out, as are those not loaded (yet: the lazily loaded ones).
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        self.ebpf
            .programs()
            .filter(|(_, prog)| prog.fd().is_ok())
            .filter_map(|(name, prog)| match prog.info() {
                Ok(info) => Some(ProgramStats {
                    name: name.to_owned(),
                    run_count: info.run_count(),
                    run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                }),
                Err(e) => {
                    log::debug!("info of eBPF program {name}: {e}");
                    None
                }
            })
            .collect()
    }
}

/// The kernel's `FROZEN` map: processes whose samples the sampling recorder's filter drops
/// since a trigger, with the kernel time from which it does.
pub struct FrozenProcesses {
    map: BpfHashMap<MapData, u32, u64>,
}

impl FrozenProcesses {
    /// `CLOCK_MONOTONIC` ns from which the kernel dropped `tgid`'s samples, if it does.
    pub fn frozen_at(&self, tgid: u32) -> Option<u64> {
        self.map.get(&tgid, 0).ok()
    }

    /// Lets `tgid`'s samples be recorded again.
    pub fn thaw(&mut self, tgid: u32) -> Result<(), TriggerError> {
        match self.map.remove(&tgid) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(())
            }
            Err(e) => Err(map_err("FROZEN")(e)),
        }
    }
}

/// The kernel's freeze time of a triggering process, when it belongs to this trigger: not
/// before the trigger (a stale mark) and not after the rings were paused (a later trigger
/// of the same process set it). `None`: the snapshot's freeze is the rings' pause.
pub fn kernel_freeze(trigger_ns: u64, kernel_ns: Option<u64>, paused_ns: u64) -> Option<u64> {
    kernel_ns.filter(|&k| k >= trigger_ns && k <= paused_ns)
}

/// Logs the probes placed for `rule` in one line per binary (entry and its kind, the exit
/// probes by kind), with a warning for each hazard: a uretprobe (it replaces return
/// addresses), a trap entry (~7 µs per call).
pub fn log_probes(rule: &str, probes: &[AttachedProbe]) {
    let traps = probes
        .iter()
        .filter(|p| !p.is_return && p.probe_kind == ProbeKind::Trap)
        .count();
    if traps > 0 {
        let which = if traps == 1 {
            "trap uprobe".to_owned()
        } else {
            format!("{traps} trap uprobes")
        };
        log::warn!(
            "rule {rule}: {which} (~7 µs per call); on a hot function build with -pg -mfentry \
             -mnop-mcount (C/C++; Rust: see docs/usage.md) for NOP5 entries the kernel can optimize"
        );
    }
    let mut by_function: BTreeMap<(&str, &str), Vec<&AttachedProbe>> = BTreeMap::new();
    for p in probes {
        by_function
            .entry((p.path.as_str(), p.function.as_str()))
            .or_default()
            .push(p);
    }
    for ((path, function), probes) in by_function {
        let mut exits: BTreeMap<&str, usize> = BTreeMap::new();
        for p in probes.iter().filter(|p| p.is_return) {
            *exits.entry(p.site).or_default() += 1;
        }
        let exits = exits
            .iter()
            .map(|(site, n)| format!("{n} {site}"))
            .collect::<Vec<_>>()
            .join(", ");
        for entry in probes.iter().filter(|p| !p.is_return) {
            let returns = if exits.is_empty() {
                String::new()
            } else {
                format!("; returns seen by {exits}")
            };
            log::info!(
                "rule {rule}: uprobe on {function} at {path}+{:#x} ({}){returns}",
                entry.file_offset,
                entry.probe_kind
            );
        }
        if probes.iter().any(|p| p.site == "uretprobe") {
            log::warn!(
                "rule {rule}: uretprobe in {path} (return_probe: uretprobe): it replaces the \
                 return address on the stack, so a C++ exception or a Rust panic unwinding \
                 through the function aborts the program; the default `exits` does not"
            );
        }
    }
}

/// The record of a probe placed at `file_offset` of `point`'s file; every site but the
/// entry sees a return.
/// Whether triggers `a` and `b` are served by the same probes: both not function
/// triggers (raw tracepoints shared by all rules), or the same function, binary, selection
/// and return detection, both entry or both latency triggers (only the threshold differs).
fn same_probes(a: &Trigger, b: &Trigger) -> bool {
    match (a, b) {
        (Trigger::Function(a), Trigger::Function(b)) => {
            a.symbol == b.symbol
                && a.binary == b.binary
                && a.all == b.all
                && a.debug_dirs == b.debug_dirs
                && a.min_duration.is_some() == b.min_duration.is_some()
                && (a.min_duration.is_none()
                    || (a.return_probe == b.return_probe && a.detect == b.detect))
        }
        (Trigger::Function(_), _) | (_, Trigger::Function(_)) => false,
        _ => true,
    }
}

/// [`TriggerEngine::exec_selected`]: absolute kernel counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecSelected {
    /// Processes `EXEC_COMMS` put into the target set at exec.
    pub selected: u64,
    /// Of those, the ones whose exec record did not fit into the ring.
    pub lost: u64,
}

fn attached_probe(point: &ProbePoint, file_offset: u64, site: &'static str) -> AttachedProbe {
    AttachedProbe {
        path: point.path.display().to_string(),
        function: point.display.clone(),
        file_offset,
        probe_kind: point.kind,
        is_return: site != "entry",
        site,
    }
}

/// `flags` with `flag` set (`on`) or cleared.
fn with_flag(flags: u32, flag: u32, on: bool) -> u32 {
    if on { flags | flag } else { flags & !flag }
}

/// Cumulative run-time statistics of one loaded eBPF program (`bpf_prog_info`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProgramStats {
    /// The program's name in the object (its function name).
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

/// `comm` as the kernel stores it: at most 15 bytes, NUL-padded to 16.
pub fn comm_key(name: &str) -> [u8; 16] {
    let mut key = [0u8; 16];
    for (dst, src) in key.iter_mut().zip(name.bytes().take(15)) {
        *dst = src;
    }
    key
}

fn map_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<T, TriggerError>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = MapError>,
{
    let map = ebpf
        .map_mut(name)
        .ok_or(TriggerError::MissingMap { name })?;
    T::try_from(map).map_err(map_err(name))
}

pub(super) fn program<'a, T>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut T, TriggerError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let prog = ebpf
        .program_mut(name)
        .ok_or(TriggerError::MissingProgram { name })?;
    prog.try_into().map_err(prog_err(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_freeze_counts_only_between_trigger_and_pause() {
        assert_eq!(kernel_freeze(1_000, Some(1_002), 90_000), Some(1_002));
        assert_eq!(kernel_freeze(1_000, Some(1_000), 1_000), Some(1_000));
        assert_eq!(kernel_freeze(1_000, None, 90_000), None, "not frozen");
        assert_eq!(kernel_freeze(1_000, Some(999), 90_000), None, "stale entry");
        assert_eq!(
            kernel_freeze(1_000, Some(90_001), 90_000),
            None,
            "a later trigger"
        );
    }

    #[test]
    fn the_in_kernel_freeze_flag_is_set_and_cleared_alone() {
        let both = FLAG_FOLLOW_FORKS | FLAG_FREEZE_IN_KERNEL;
        assert_eq!(
            with_flag(FLAG_FOLLOW_FORKS, FLAG_FREEZE_IN_KERNEL, true),
            both
        );
        assert_eq!(with_flag(both, FLAG_FREEZE_IN_KERNEL, true), both);
        assert_eq!(
            with_flag(both, FLAG_FREEZE_IN_KERNEL, false),
            FLAG_FOLLOW_FORKS
        );
        assert_eq!(with_flag(0, FLAG_FREEZE_IN_KERNEL, false), 0);
    }
}
