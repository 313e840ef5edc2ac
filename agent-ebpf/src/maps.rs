//! The maps shared with the agent. Names say what they hold.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use lookback_common::{
    MAX_RULES,
    probe::{JumpSite, MAX_JUMP_SITES},
    rule::{
        COUNTERS_PER_RULE, EngineConfig, EntryKey, EntryStack, InflightKey, Look, MAX_FROZEN,
        MAX_LOOKS, ProcessRuleKey, RuleSpec, RuleState, RunningStack, SyscallStart,
    },
};

/// How many rule ids (`0..RULE_SLOTS`) the loader will use, set at load time
/// (`EbpfLoader::set_global`) in the read-only `.rodata`. The verifier reads a frozen
/// read-only value as the constant it is, so the rule loops are verified for that many
/// iterations only: `run --trigger syscall:...` (one rule) loads in milliseconds instead of
/// the ~0.8 s the full 64-iteration loops cost the verifier. The agent loads with all 64.
#[unsafe(no_mangle)]
static RULE_SLOTS: u32 = MAX_RULES;

/// [`RULE_SLOTS`] as the loader set it (a volatile read, so the compiler cannot fold the
/// default in).
#[inline(always)]
pub fn rule_slots() -> u32 {
    // SAFETY: a plain read of an aligned static.
    unsafe { core::ptr::read_volatile(&raw const RULE_SLOTS) }
}

/// Rule id → rule.
#[map]
pub static RULES: Array<RuleSpec> = Array::with_max_entries(MAX_RULES, 0);

/// Rule id → suppression state (cooldown, hourly window).
#[map]
pub static RULE_STATE: Array<RuleState> = Array::with_max_entries(MAX_RULES, 0);

/// `rule * COUNTERS_PER_RULE + COUNTER_*` → count (per CPU: exact without atomics).
#[map]
pub static COUNTERS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(MAX_RULES * COUNTERS_PER_RULE, 0);

/// Index 0: engine-wide settings.
#[map]
pub static CONFIG: Array<EngineConfig> = Array::with_max_entries(1, 0);

/// Traced process (tgid) → bitmask of the rules that apply to it. The agent may size it
/// at load (`lookback agent --max-targets`); an insert into a full map is counted in
/// `TARGET_SET_FULL`.
#[map]
pub static TARGET_TGIDS: HashMap<u32, u64> =
    HashMap::with_max_entries(lookback_common::process::DEFAULT_MAX_TARGETS, 0);

/// Index 0: processes the kernel could not add to `TARGET_TGIDS` at exec or fork because
/// it was full (per CPU), for `lookback_errors_total{op="target_set",errno="E2BIG"}`:
/// such a process is not selected in the kernel, never silently.
#[map]
pub static TARGET_SET_FULL: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Traced cgroup (v2 id) → bitmask of the rules that apply to its processes.
#[map]
pub static TARGET_CGROUPS: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);

/// (rule, tgid, thread or goroutine) → the calls in flight (function latency rules).
#[map]
pub static ENTRY_TIMES: LruHashMap<EntryKey, EntryStack> = LruHashMap::with_max_entries(65536, 0);

/// Index 0: an empty `EntryStack`, never written: the value a new `ENTRY_TIMES` entry is
/// inserted from (it does not fit on the BPF stack).
#[map]
pub static EMPTY_ENTRY_STACK: Array<EntryStack> = Array::with_max_entries(1, 0);

/// (rule, tgid, thread) → the calls in flight of `detect: running` rules, with what a look
/// is checked against; apart from `ENTRY_TIMES` so that the in-flight scan reads these
/// alone, and the other rules' frames stay 16 bytes. The loader sizes it (one entry in a
/// session without such rules: LRU maps are preallocated).
#[map]
pub static RUNNING_TIMES: LruHashMap<EntryKey, RunningStack> =
    LruHashMap::with_max_entries(16384, 0);

/// Index 0: an empty `RunningStack`, never written (the value a new `RUNNING_TIMES` entry
/// is inserted from).
#[map]
pub static EMPTY_RUNNING_STACK: Array<RunningStack> = Array::with_max_entries(1, 0);

/// How each indirect exit jump computes its target (index in the probe's cookie).
#[map]
pub static JUMP_SITES: Array<JumpSite> = Array::with_max_entries(MAX_JUMP_SITES, 0);

/// tid → syscall in flight, for rules with a latency or errno condition.
#[map]
pub static SYSCALL_START: LruHashMap<u32, SyscallStart> = LruHashMap::with_max_entries(65536, 0);

/// Triggers for the agent: `lookback_common::trigger::TriggerEntry`s (8.8 KiB each with
/// the stack copy: room for ~470 events the reader has not taken yet; a process start
/// under a long `LD_LIBRARY_PATH` makes a burst of ~120 failing opens within a
/// millisecond, which filled the earlier 1 MiB).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(4 * 1024 * 1024, 0);

/// (process, rule) → cooldown and hourly-limit state, for rules without
/// `FLAG_SCOPE_RULE`: least recently used entries go first (a process that exited).
#[map]
pub static PROCESS_RULE_STATE: LruHashMap<ProcessRuleKey, RuleState> =
    LruHashMap::with_max_entries(16384, 0);

/// Per CPU: one word `emit::fire` passes through memory (see there why).
#[map]
pub static FIRE_SCRATCH: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Process (tgid) → kernel time from which its samples are dropped (`sample_filter`): a
/// trigger of a rule with `FLAG_FREEZE_IN_KERNEL` stops its process's recording here, at
/// once, instead of when userspace pauses the rings. Userspace removes the entry once the
/// snapshot is copied.
#[map]
pub static FROZEN: HashMap<u32, u64> = HashMap::with_max_entries(MAX_FROZEN, 0);

/// `comm` after exec (NUL-padded) → rules whose target may match it. Checked at exec so a
/// process started later is a target from its first instruction; the agent confirms (or
/// withdraws) the match from `/proc` right after.
#[map]
pub static EXEC_COMMS: HashMap<[u8; 16], u64> = HashMap::with_max_entries(1024, 0);

/// Exec and exit events for the agent: `lookback_common::process::ProcessRecord`s.
#[map]
pub static PROC_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Index 0: process records dropped because `PROC_EVENTS` was full (per CPU), for
/// `lookback_events_lost_total{source="ringbuf"}`.
#[map]
pub static PROC_EVENTS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU: processes `EXEC_COMMS` selected at exec (`EXEC_SELECTED_ALL`) and those whose
/// exec record was dropped (`EXEC_SELECTED_LOST`), so that "selected in the kernel =
/// handled by the agent + lost" can be checked as a count.
#[map]
pub static EXEC_SELECTED: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

/// The rule bitmask that applies to the current task, or 0. One hash lookup for processes
/// outside the target set (two when cgroup targets exist).
#[inline(always)]
pub fn current_rules(tgid: u32, config: &EngineConfig) -> u64 {
    // SAFETY: the value is a plain u64 read once; the map entry may be replaced
    // concurrently, which at worst yields the previous mask.
    let mut mask = unsafe { TARGET_TGIDS.get(tgid) }.copied().unwrap_or(0);
    if config.cgroups_active != 0 {
        // SAFETY: helper without preconditions.
        let cgroup = unsafe { aya_ebpf::helpers::generated::bpf_get_current_cgroup_id() };
        // SAFETY: as above.
        mask |= unsafe { TARGET_CGROUPS.get(cgroup) }.copied().unwrap_or(0);
    }
    mask
}

/// The engine configuration (always present: array maps are preallocated).
#[inline(always)]
pub fn config() -> Option<&'static EngineConfig> {
    CONFIG.get(0)
}

/// Reads a `u32` field of a kernel `task_struct` at a BTF-derived byte offset.
#[inline(always)]
pub fn task_u32(task: *const u8, offset: u32) -> Option<u32> {
    let mut buf = [0u8; 4];
    // SAFETY: the checked helper copies 4 bytes of kernel memory or fails.
    unsafe {
        aya_ebpf::helpers::bpf_probe_read_kernel_buf(task.wrapping_add(offset as usize), &mut buf)
    }
    .ok()?;
    Some(u32::from_ne_bytes(buf))
}

/// In-flight looks (`detect: running`): slot → the registers and user stack of the thread
/// the scan asked about in `WANT_LOOK`.
#[map]
pub static LOOKS: Array<Look> = Array::with_max_entries(MAX_LOOKS, 0);

/// tid → the `LOOKS` slot to fill at the thread's next look (its next sample while on CPU,
/// or the task iterator while it is off CPU); removed once filled.
#[map]
pub static WANT_LOOK: HashMap<u32, u32> = HashMap::with_max_entries(MAX_LOOKS, 0);

/// Calls in flight already judged by `inflight_fire` → the rules it found met for them
/// (so a call still running fires once).
#[map]
pub static INFLIGHT_REPORTED: LruHashMap<InflightKey, u64> = LruHashMap::with_max_entries(16384, 0);
