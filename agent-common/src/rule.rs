//! Rule configuration as the kernel sees it (`RULES` map) and per-rule counters (`COUNTERS`).
#![expect(
    clippy::inline_always,
    reason = "BPF: the checks must inline into the program so the verifier sees map-value bounds"
)]

/// A function rule: uprobe on entry, plus uprobes on its exits (or, on request, a
/// uretprobe) when a minimum duration is set.
pub const KIND_FUNCTION: u32 = 1;
/// A syscall rule: `raw_syscalls` `sys_enter`/`sys_exit` raw tracepoints.
pub const KIND_SYSCALL: u32 = 2;
/// A signal rule: `signal_generate` raw tracepoint.
pub const KIND_SIGNAL: u32 = 3;

/// Fire when the condition is met on entry (function entry, syscall entry).
pub const FLAG_ON_ENTRY: u32 = 1 << 0;
/// The syscall set is "any syscall".
pub const FLAG_ANY_SYSCALL: u32 = 1 << 1;
/// Only returns with an errno in [`RuleSpec::errnos`] match.
pub const FLAG_ERRNO: u32 = 1 << 2;
/// Follow children: a process forked by a target becomes a target of the same rules.
pub const FLAG_FOLLOW_FORKS: u32 = 1 << 3;
/// Stop the triggering process's samples in the kernel when the trigger is sent (`FROZEN`,
/// read by the sampling recorder's `sample_filter`). Set by userspace for rules frozen at
/// once (no `post_trigger`) while a sampling recorder runs that filter.
pub const FLAG_FREEZE_IN_KERNEL: u32 = 1 << 4;
/// Cooldown and hourly limit per rule (`snapshot.scope: rule`); without it they are per
/// rule and process (`PROCESS_RULE_STATE`), so a noisy process cannot use up another's.
pub const FLAG_SCOPE_RULE: u32 = 1 << 5;
/// In-flight detection (`detect: running`): the call is judged slow while it still runs,
/// once it has run longer than `min_duration_ns` (function rules place no exit probes;
/// syscall rules keep `sys_exit` only to end the entry). See agent-ebpf's `inflight`.
pub const FLAG_RUNNING: u32 = 1 << 6;

/// Capacity of the `FROZEN` map (processes frozen at the same time).
pub const MAX_FROZEN: u32 = 4096;

/// Syscall numbers covered by [`RuleSpec::syscalls`] (x86-64 has ~460).
pub const SYSCALL_BITMAP_WORDS: usize = 8;
/// Errno values covered by [`RuleSpec::errnos`] (Linux errnos stop at 133).
pub const ERRNO_BITMAP_WORDS: usize = 4;

/// One rule, indexed by rule id in the `RULES` array map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleSpec {
    /// `KIND_*`; 0 = slot unused.
    pub kind: u32,
    /// `FLAG_*`.
    pub flags: u32,
    /// Minimum duration (function return, syscall exit); 0 = no latency condition.
    pub min_duration_ns: u64,
    /// Minimum time between two emitted triggers of this rule; 0 = none.
    pub cooldown_ns: u64,
    /// Emitted triggers allowed per rolling hour; 0 = unlimited.
    pub max_per_hour: u64,
    /// Bit `n` set = syscall number `n` matches.
    pub syscalls: [u64; SYSCALL_BITMAP_WORDS],
    /// Bit `n` set = a return of `-n` matches (with [`FLAG_ERRNO`]).
    pub errnos: [u64; ERRNO_BITMAP_WORDS],
    /// Bit `n` set = signal `n` matches (1..=64).
    pub signals: u64,
}

impl RuleSpec {
    /// Whether syscall `nr` is in the rule's set.
    #[inline(always)]
    pub fn has_syscall(&self, nr: u64) -> bool {
        if self.flags & FLAG_ANY_SYSCALL != 0 {
            return true;
        }
        bit_is_set(&self.syscalls, nr)
    }

    /// Whether a syscall that returned `ret` satisfies the errno condition.
    #[inline(always)]
    pub fn errno_matches(&self, ret: i64) -> bool {
        if self.flags & FLAG_ERRNO == 0 {
            return true;
        }
        ret < 0 && bit_is_set(&self.errnos, ret.unsigned_abs())
    }

    /// Whether signal `sig` is in the rule's set.
    #[inline(always)]
    pub fn has_signal(&self, sig: u64) -> bool {
        sig < 64 && self.signals & (1 << sig) != 0
    }
}

/// Tests bit `n` of a bitmap of `N` words (`N` a power of two).
///
/// Written for the BPF verifier: the word index is masked after an opaque (volatile) read,
/// so it stays provably in bounds even when LLVM hoists the index computation above the
/// range check (which the verifier otherwise rejects as an unbounded access).
#[inline(always)]
fn bit_is_set<const N: usize>(words: &[u64; N], n: u64) -> bool {
    if n >= (N as u64) * 64 {
        return false;
    }
    let index = (n / 64) as usize;
    // SAFETY: reading a local we own.
    let index = unsafe { core::ptr::read_volatile(&raw const index) } & (N - 1);
    words[index] & (1 << (n % 64)) != 0
}

/// Sets bit `n` of a bitmap; returns `false` when `n` is out of range.
pub fn set_bit(words: &mut [u64], n: u64) -> bool {
    let word = (n / 64) as usize;
    match words.get_mut(word) {
        Some(w) => {
            *w |= 1 << (n % 64);
            true
        }
        None => false,
    }
}

/// Suppression state of one rule (`RULE_STATE` array map), updated atomically.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RuleState {
    /// Kernel time of the last emitted trigger.
    pub last_emit_ns: u64,
    /// Start of the current rate-limit hour.
    pub window_start_ns: u64,
    /// Emitted triggers in the current hour.
    pub window_count: u64,
}

/// Per-rule counters, `COUNTERS[rule * COUNTERS_PER_RULE + COUNTER_*]` (per-CPU, summed by
/// the agent): every way a met condition can be dropped has its own counter.
pub const COUNTERS_PER_RULE: u32 = 8;
/// Conditions met in the kernel, before suppression.
pub const COUNTER_MET: u32 = 0;
/// Suppressed by the cooldown.
pub const COUNTER_SUPPRESSED_COOLDOWN: u32 = 1;
/// Suppressed by `max_per_hour`.
pub const COUNTER_SUPPRESSED_RATE: u32 = 2;
/// Sent to the ring buffer.
pub const COUNTER_EMITTED: u32 = 3;
/// Lost: the ring buffer was full.
pub const COUNTER_RINGBUF_FULL: u32 = 4;
/// Function calls deeper than the per-thread entry stack: their durations are not measured.
pub const COUNTER_DEPTH_OVERFLOW: u32 = 5;
/// Exits without a recorded entry (attached mid-call, or the entry was deeper than the
/// per-thread stack).
pub const COUNTER_UNMATCHED_RETURN: u32 = 6;
/// Entries dropped because their frame was abandoned (longjmp, a C++ exception, a Rust
/// panic unwinding through the function): a later entry or exit of the same thread came
/// from a frame at or above theirs. Their calls are not measured.
pub const COUNTER_UNWOUND: u32 = 7;

/// Kernel-side settings shared by all rules (`CONFIG` array map, index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EngineConfig {
    /// Rules of kind syscall (bit = rule id).
    pub syscall_rules: u64,
    /// Rules of kind signal.
    pub signal_rules: u64,
    /// Rules whose targets follow forks.
    pub follow_fork_rules: u64,
    /// Nonzero when `TARGET_CGROUPS` holds entries (saves a lookup otherwise).
    pub cgroups_active: u32,
    /// Byte offset of `task_struct.tgid` (from the kernel's BTF).
    pub task_tgid_offset: u32,
    /// Byte offset of `task_struct.pid`.
    pub task_pid_offset: u32,
    /// Nonzero: send exec and exit events to `PROC_EVENTS` (the agent discovers targets
    /// with them; `run`/`attach` leave it 0 and pay nothing per exec).
    pub process_events: u32,
    /// Byte offset of `task_struct.on_cpu` (the in-flight look copies only a thread that
    /// is not running).
    pub task_on_cpu_offset: u32,
    /// Rules recorded by the agent's per-CPU recorders (bit = rule id): `target_filter`
    /// keeps the samples of processes any of these rules target.
    pub shared_record_rules: u64,
    /// Byte offsets of `task_struct.nvcsw` and `.nivcsw` (the thread's switch counts: the
    /// in-flight look proves with them that the thread did not run while it was copied).
    pub task_nvcsw_offset: u32,
    pub task_nivcsw_offset: u32,
    /// Rules with [`FLAG_RUNNING`] (bit = rule id).
    pub running_rules: u64,
}

/// Slots of the `LOOKS` array: threads looked at in one in-flight scan at most.
pub const MAX_LOOKS: u32 = 64;

/// A look at one thread for the in-flight scan (`LOOKS` map, slot from `WANT_LOOK`): its
/// user registers and a copy of its user stack, taken at `look_ns` by the thread's own
/// sample (on CPU) or by the task iterator while it provably did not run (off CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Look {
    /// `CLOCK_MONOTONIC` ns of the look; 0 = not taken yet.
    pub look_ns: u64,
    pub tid: u32,
    /// 1: taken by the task iterator (the thread was off CPU), 2: by a sample (on CPU).
    pub how: u32,
    /// The thread's user R14 at the look — in Go code the running goroutine's `g` — and
    /// the two words at it, read at the same moment: a goroutine's stack bounds
    /// (`g.stack.lo`, `g.stack.hi`). Meaningful only when the look's SP lies within them;
    /// 0 when unreadable. They turn the relative height of a Go call into an address.
    pub g: u64,
    pub g_lo: u64,
    pub g_hi: u64,
    pub copy: crate::trigger::TriggerStackCopy,
}

/// How a [`Look`] was taken.
pub const LOOK_ITER: u32 = 1;
/// See [`Look::how`].
pub const LOOK_SAMPLE: u32 = 2;

/// Key of `INFLIGHT_REPORTED`: one call in flight (a thread and the call's entry time).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InflightKey {
    pub thread: u64,
    pub entry_ns: u64,
}

/// Arguments of the `inflight_fire` program (run with `BPF_PROG_TEST_RUN`, never
/// attached), as the raw tracepoint context's `u64`s: kind, thread key, `pid_tgid`, rule
/// id, entry time, look time and height (function calls), 0, and the comm's two words.
pub const INFLIGHT_ARGS: usize = 10;
/// `inflight_fire`'s return: the call fired.
pub const INFLIGHT_SENT: i32 = 1;
/// `inflight_fire`'s return: the call met its rule, and the cooldown or the hourly limit
/// suppressed it (decided all the same).
pub const INFLIGHT_SUPPRESSED: i32 = 2;
/// `inflight_fire` argument 0: a function call (`ENTRY_TIMES`) or a syscall
/// (`SYSCALL_START`).
pub const INFLIGHT_FUNCTION: u64 = 1;
/// See [`INFLIGHT_FUNCTION`].
pub const INFLIGHT_SYSCALL: u64 = 2;

/// Depth of the per-thread stack of function entries (recursion is measured up to it).
pub const MAX_CALL_DEPTH: usize = 32;

/// One call in flight.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EntryFrame {
    /// Where the frame sits: the stack pointer at entry (pointing at the return address),
    /// or, in Go, `sp - stack.hi` (negative: the distance from the goroutine stack's top,
    /// which survives the runtime copying the stack). Compared as `i64`: lower is deeper.
    pub height: u64,
    /// `CLOCK_MONOTONIC` ns at entry.
    pub entry_ns: u64,
}

/// A call in flight of a `detect: running` rule (`RUNNING_TIMES`): an [`EntryFrame`] and
/// what userspace checks a later look's unwound frame against: the return address at
/// entry (the word at `height`), and the function's code `[func, func_end)` (its entry
/// address, and its symbol's size from the probe's cookie).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RunningFrame {
    pub height: u64,
    pub entry_ns: u64,
    pub return_address: u64,
    pub func: u64,
    pub func_end: u64,
}

/// The calls in flight of one thread for one `detect: running` rule (`RUNNING_TIMES`),
/// outermost first, as [`EntryStack`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RunningStack {
    pub depth: u64,
    /// 1: the key's `thread` is a goroutine (`g`) of a Go binary and the heights are
    /// relative to its stack's top (see [`EntryFrame::height`]); 0: a thread id.
    pub go: u64,
    pub frames: [RunningFrame; MAX_CALL_DEPTH],
}

/// A frame of a per-thread stack of calls in flight, by its height.
pub trait Frame {
    /// The stack pointer at entry (see [`EntryFrame::height`]).
    fn height(&self) -> u64;
}

impl Frame for EntryFrame {
    #[inline(always)]
    fn height(&self) -> u64 {
        self.height
    }
}

impl Frame for RunningFrame {
    #[inline(always)]
    fn height(&self) -> u64 {
        self.height
    }
}

/// The calls in flight of one thread (or goroutine) for one function rule (`ENTRY_TIMES`),
/// outermost first: heights strictly decrease from `frames[0]` to `frames[depth - 1]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EntryStack {
    /// Valid frames, at most `MAX_CALL_DEPTH`.
    pub depth: u64,
    pub frames: [EntryFrame; MAX_CALL_DEPTH],
}

/// Key of `ENTRY_TIMES`: a thread id, or for Go the goroutine's `g` pointer (unique only
/// within its process, hence the tgid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntryKey {
    pub thread: u64,
    pub tgid: u32,
    pub rule_id: u32,
}

/// Key of the per-process suppression state (`PROCESS_RULE_STATE`): one rule in one
/// process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessRuleKey {
    pub tgid: u32,
    pub rule_id: u32,
}

/// A syscall in flight on a traced thread (`SYSCALL_START` map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyscallStart {
    pub enter_ns: u64,
    pub nr: u64,
    /// The rules that applied to the thread's process at `sys_enter` (bit = rule id): the
    /// in-flight scan fires only those.
    pub rules: u64,
    /// The thread's process.
    pub tgid: u32,
    /// Padding, 0.
    pub reserved: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all these are #[repr(C)] of integers and integer arrays, without padding
    // holes that matter; every bit pattern is valid.
    unsafe impl aya::Pod for super::RuleSpec {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RuleState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::EngineConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::EntryStack {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SyscallStart {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::EntryKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcessRuleKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Look {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RunningStack {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::InflightKey {}
}
