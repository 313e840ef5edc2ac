//! The one path from "condition met" to the ring buffer: count, suppress (cooldown, hourly
//! rate), emit. Every way a met condition is dropped increments its own counter.
use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST, BPF_RB_FORCE_WAKEUP, pt_regs},
    helpers::{
        bpf_get_current_comm, bpf_get_stack, bpf_ktime_get_ns,
        generated::{
            bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_probe_read_user, bpf_task_pt_regs,
        },
    },
};
use lookback_common::{
    MAX_RULES,
    rule::{
        COUNTER_EMITTED, COUNTER_MET, COUNTER_RINGBUF_FULL, COUNTER_SUPPRESSED_COOLDOWN,
        COUNTER_SUPPRESSED_RATE, COUNTERS_PER_RULE, FLAG_FREEZE_IN_KERNEL, FLAG_SCOPE_RULE,
        ProcessRuleKey, RuleSpec, RuleState,
    },
    trigger::{
        TRIGGER_KERNEL_FRAMES, TRIGGER_STACK_FRAMES, TriggerEntry, TriggerRecord, TriggerStackCopy,
        TriggerStacks,
    },
};

use crate::maps::{
    COUNTERS, EVENTS, FIRE_SCRATCH, FROZEN, PROCESS_RULE_STATE, RULE_STATE, rule_slots,
};

const HOUR_NS: u64 = 3_600_000_000_000;

/// Adds one to a per-rule counter.
#[inline(always)]
pub fn count(rule_id: u32, counter: u32) {
    count_n(rule_id, counter, 1);
}

/// Adds `n` to a per-rule counter.
#[inline(always)]
pub fn count_n(rule_id: u32, counter: u32, n: u64) {
    if rule_id >= MAX_RULES {
        return;
    }
    if let Some(slot) = COUNTERS.get_ptr_mut(rule_id * COUNTERS_PER_RULE + counter) {
        // SAFETY: per-CPU slot, programs do not migrate while running.
        unsafe { *slot += n };
    }
}

/// Monotonic kernel time.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// Sends `record` once for the rules of `firing` (those whose condition it met and that
/// [`admit`] let through; nothing when empty), with their mask, the comm and the current
/// thread's stacks when `own` (it is the triggering process's thread; `ctx`: the program's
/// context, for `bpf_get_stack`); freezes the process first when one of them freezes in
/// the kernel. The caller fills in `kind`.
///
/// One entry per event, not per rule: the stack helpers and the 8 KiB copy run once,
/// after the rule loop (inside it, their branches multiplied the verifier's states past
/// its limit), and two rules met by one syscall cost one entry.
#[inline(always)]
pub fn fire(ctx: *mut c_void, firing: Firing, record: TriggerRecord, own: bool) {
    // A mask built in a loop is known to the verifier bit by bit; tested as it is, every
    // combination of bits would be a state of its own. Read back from a map, it is one
    // unknown value.
    let freeze = firing.freeze;
    let Some(admitted) = launder(firing.rules) else {
        return;
    };
    if admitted == 0 {
        return;
    }
    let outcome = send(ctx, admitted, record, own, freeze);
    let slots = rule_slots();
    for rule_id in 0..MAX_RULES {
        if rule_id >= slots || admitted >> rule_id == 0 {
            break;
        }
        if admitted & (1 << rule_id) != 0 {
            count(rule_id, outcome);
        }
    }
}

/// `mask` as the verifier sees a value read from a map: unknown (all 64 bits are rule
/// ids, so nothing else shares the word).
#[inline(always)]
fn launder(mask: u64) -> Option<u64> {
    let slot = FIRE_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU array (programs do not migrate while running).
    unsafe {
        write_volatile(slot, mask);
        Some(read_volatile(slot))
    }
}

/// [`fire`] for one rule (function triggers: the probe's cookie names it), without the
/// loop over rule ids.
#[inline(always)]
pub fn fire_rule(ctx: *mut c_void, rule_id: u32, rule: &RuleSpec, record: TriggerRecord) {
    fire_one(ctx, rule_id, rule, record, record.timestamp_ns, true);
}

/// [`fire_rule`] admitted at `now`, with the current thread's stacks only when `own`;
/// whether the record was sent (not suppressed, the ring not full).
#[inline(always)]
pub fn fire_one(
    ctx: *mut c_void,
    rule_id: u32,
    rule: &RuleSpec,
    record: TriggerRecord,
    now: u64,
    own: bool,
) -> bool {
    if rule_id >= MAX_RULES || !admit(rule_id, rule, now, record.pid) {
        return false;
    }
    let freeze = rule.flags & FLAG_FREEZE_IN_KERNEL != 0;
    let outcome = send(ctx, 1 << rule_id, record, own, freeze);
    count(rule_id, outcome);
    outcome == COUNTER_EMITTED
}

/// Counts a met condition of rule `rule_id` at `now` in process `tgid`; whether it is not
/// suppressed (cooldown, hourly limit).
#[inline(always)]
fn admit(rule_id: u32, rule: &RuleSpec, now: u64, tgid: u32) -> bool {
    count(rule_id, COUNTER_MET);
    if let Some(reason) = suppressed(rule_id, rule, now, tgid) {
        count(rule_id, reason);
        return false;
    }
    true
}

/// A bitmask of rules to [`fire`], and whether one of them freezes in the kernel.
#[derive(Clone, Copy, Default)]
pub struct Firing {
    pub rules: u64,
    pub freeze: bool,
}

impl Firing {
    /// Adds rule `rule_id`, whose condition was met at `now` in process `tgid`, unless
    /// [`admit`] suppresses it.
    #[inline(always)]
    pub fn add(&mut self, rule_id: u32, rule: &RuleSpec, now: u64, tgid: u32) {
        if admit(rule_id, rule, now, tgid) {
            self.rules |= 1 << rule_id;
            self.freeze |= rule.flags & FLAG_FREEZE_IN_KERNEL != 0;
        }
    }
}

/// Sends `record` for the rules of `admitted` (a non-empty bitmask), freezing its process
/// first when `freeze_wanted`; returns the counter of the outcome (emitted, or ring full).
#[inline(always)]
fn send(
    ctx: *mut c_void,
    admitted: u64,
    mut record: TriggerRecord,
    own: bool,
    freeze_wanted: bool,
) -> u32 {
    record.rule_mask = admitted;
    record.rule_id = admitted.trailing_zeros();
    // A record for a thread that is not the current one may bring its comm (in-flight
    // triggers fired from the agent's context); else the current task's.
    if record.comm[0] == 0
        && let Ok(comm) = bpf_get_current_comm()
    {
        record.comm = comm;
    }
    // Frozen before the record is submitted: its forced wakeup can preempt this program
    // (the reader runs SCHED_FIFO), and the freeze must not wait for the reader.
    let frozen = freeze_wanted && freeze(record.pid);
    if let Some(mut entry) = EVENTS.reserve::<TriggerEntry>(0) {
        let at = entry.as_mut_ptr();
        // SAFETY: `at` points at the reserved entry, ours until submitted.
        unsafe {
            addr_of_mut!((*at).record).write(record);
            take_stacks(ctx, addr_of_mut!((*at).stacks), own);
        }
        // Wake the reader on every trigger: the default (adaptive) wakeup skips it when
        // the reader has not caught up, and the freeze must not wait for a later record.
        // Triggers are rare (suppressed in here), so the forced wakeup costs nothing.
        entry.submit(u64::from(BPF_RB_FORCE_WAKEUP));
        COUNTER_EMITTED
    } else {
        if frozen {
            // No snapshot will come to unfreeze the process.
            let _ = FROZEN.remove(record.pid);
        }
        COUNTER_RINGBUF_FULL
    }
}

/// Writes the current thread's user and kernel stacks and a copy of its user stack into
/// `stacks`; empty (lengths 0) unless `own`.
///
/// # Safety
/// `stacks` points at writable memory for one `TriggerStacks` (the reserved entry's).
#[inline(always)]
unsafe fn take_stacks(ctx: *mut c_void, stacks: *mut TriggerStacks, own: bool) {
    // SAFETY (whole body): the fields are in writable memory; the helpers write at most
    // the sizes given into their arrays.
    unsafe {
        if !own {
            addr_of_mut!((*stacks).stack.bytes).write(0);
            addr_of_mut!((*stacks).stack.kernel_bytes).write(0);
            addr_of_mut!((*stacks).copy.len).write(0);
            return;
        }
        let user = bpf_get_stack(
            ctx,
            addr_of_mut!((*stacks).stack.frames).cast(),
            (TRIGGER_STACK_FRAMES * 8) as u32,
            u64::from(BPF_F_USER_STACK),
        );
        addr_of_mut!((*stacks).stack.bytes).write(non_negative(user));
        let kernel = bpf_get_stack(
            ctx,
            addr_of_mut!((*stacks).stack.kernel_frames).cast(),
            (TRIGGER_KERNEL_FRAMES * 8) as u32,
            0,
        );
        addr_of_mut!((*stacks).stack.kernel_bytes).write(non_negative(kernel));
        copy_stack(addr_of_mut!((*stacks).copy));
    }
}

/// Fills `copy` with the current thread's user registers and the largest copy of its
/// user stack from SP upwards (up to 8 KiB) that lies within the stack's mapping (a read
/// crossing its end fails as a whole, so the sizes that end at a page boundary are
/// tried); `len` 0 when the registers or SP's page cannot be read.
///
/// # Safety
/// `copy` points at writable memory for one `TriggerStackCopy`.
#[inline(always)]
pub unsafe fn copy_stack(copy: *mut TriggerStackCopy) {
    // SAFETY (whole body): `copy`'s fields are writable; the helpers write at most the
    // sizes given; `regs` is the kernel's pointer to the task's user registers, only read
    // through `bpf_probe_read_kernel` (which faults safely).
    unsafe {
        addr_of_mut!((*copy).len).write(0);
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs;
        let (Some(ip), Some(sp), Some(bp)) = (
            read_kernel_u64(addr_of!((*regs).rip).cast()),
            read_kernel_u64(addr_of!((*regs).rsp).cast()),
            read_kernel_u64(addr_of!((*regs).rbp).cast()),
        ) else {
            return;
        };
        addr_of_mut!((*copy).ip).write(ip);
        addr_of_mut!((*copy).sp).write(sp);
        addr_of_mut!((*copy).bp).write(bp);
        let dst: *mut c_void = addr_of_mut!((*copy).bytes).cast();
        let from = sp as *const c_void;
        let len = copy_sized(sp, |size| bpf_probe_read_user(dst, size, from) == 0);
        addr_of_mut!((*copy).len).write(len);
    }
}

/// How many bytes of a user stack `read(size)` (which copies `size` bytes from `sp` up, or
/// fails as a whole) copied: 8 KiB, else up to the end of the stack's mapping, which is at
/// a page boundary above SP: within 8 KiB, the end of SP's page or of the next one. Fixed
/// halvings missed up to 4 KiB of stack (a 4 KiB copy where 7 KiB were there, and main's
/// frame above a 4 KiB local buffer left out); the sizes are masked so that the verifier
/// sees them bounded by the 8 KiB buffer. 0: nothing could be read.
#[inline(always)]
pub fn copy_sized(sp: u64, mut read: impl FnMut(u32) -> bool) -> u64 {
    let in_page = 4096 - (sp & 4095); // 1..=4096
    let two_pages = (in_page + 4096) & 8191; // 0 when it would be 8192, tried first
    if read(8192) {
        8192
    } else if two_pages != 0 && read(two_pages as u32) {
        two_pages
    } else if read((in_page & 8191) as u32) {
        in_page
    } else {
        0
    }
}

/// `rc` when it is not negative, else 0, without a branch (each branch here multiplies
/// the verifier's states in the programs that loop over rules).
#[inline(always)]
fn non_negative(rc: i64) -> u64 {
    (rc & !(rc >> 63)).cast_unsigned()
}

/// One `u64` of kernel memory at `at`, `None` when it faults.
#[inline(always)]
pub fn read_kernel_u64(at: *const c_void) -> Option<u64> {
    let mut value: u64 = 0;
    // SAFETY: the helper writes at most 8 bytes into `value` and faults safely.
    let rc = unsafe { bpf_probe_read_kernel(addr_of_mut!(value).cast(), 8, at) };
    (rc == 0).then_some(value)
}

/// Stops the samples of process `tgid`: `sample_filter` drops them from now on, until
/// userspace removes the entry after the snapshot. A process already frozen keeps its
/// earlier time (`BPF_NOEXIST`); returns whether this call froze it. The time is written
/// again after the insert, so it is a moment when the filter already held: no kept sample
/// of the process is later.
#[inline(always)]
fn freeze(tgid: u32) -> bool {
    if FROZEN
        .insert(tgid, now_ns(), u64::from(BPF_NOEXIST))
        .is_err()
    {
        return false;
    }
    if let Some(at) = FROZEN.get_ptr_mut(tgid) {
        // SAFETY: `at` points into the map value just inserted; a plain u64.
        unsafe { write_volatile(at, now_ns()) };
    }
    true
}

/// Applies the cooldown and the hourly limit; returns the counter of the reason to drop.
///
/// Lock-free and without compare-and-swap: aya-build links for the generic BPF CPU, where
/// LLVM has no fetch-and-op or cmpxchg (only an add whose result is unused). Two CPUs that
/// pass the check within the same few nanoseconds may therefore both emit: one trigger
/// more than the cooldown allows reaches the agent (at most one per other CPU). The
/// hourly count may overshoot the same way.
#[inline(always)]
fn suppressed(rule_id: u32, rule: &RuleSpec, now: u64, tgid: u32) -> Option<u32> {
    if rule.cooldown_ns == 0 && rule.max_per_hour == 0 {
        return None;
    }
    let state = suppression_state(rule_id, rule, tgid)?;
    // SAFETY: `state` points into a preallocated array map value that lives as long as the
    // map; its fields are naturally aligned u64s, read and written whole.
    unsafe {
        let last = &raw mut (*state).last_emit_ns;
        if rule.cooldown_ns != 0 {
            let prev = read_volatile(last);
            if prev != 0 && now.wrapping_sub(prev) < rule.cooldown_ns {
                return Some(COUNTER_SUPPRESSED_COOLDOWN);
            }
        }
        if rule.max_per_hour != 0 {
            let window_start = &raw mut (*state).window_start_ns;
            let window_count = &raw mut (*state).window_count;
            let start = read_volatile(window_start);
            if start == 0 || now.wrapping_sub(start) >= HOUR_NS {
                write_volatile(window_start, now);
                write_volatile(window_count, 0);
            }
            if read_volatile(window_count) >= rule.max_per_hour {
                return Some(COUNTER_SUPPRESSED_RATE);
            }
            // An atomic add whose result is unused: BPF_XADD, valid on every BPF CPU.
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(window_count, 1);
        }
        if rule.cooldown_ns != 0 {
            write_volatile(last, now);
        }
    }
    None
}

/// The suppression state of rule `rule_id` for process `tgid`: the rule's own with
/// `FLAG_SCOPE_RULE`, else the (process, rule) entry, made on first use. `None` when the
/// map refuses (then nothing is suppressed: a lost cooldown, never a lost trigger).
#[inline(always)]
fn suppression_state(rule_id: u32, rule: &RuleSpec, tgid: u32) -> Option<*mut RuleState> {
    if rule.flags & FLAG_SCOPE_RULE != 0 {
        return RULE_STATE.get_ptr_mut(rule_id);
    }
    let key = ProcessRuleKey { tgid, rule_id };
    if let Some(state) = PROCESS_RULE_STATE.get_ptr_mut(key) {
        return Some(state);
    }
    // Two CPUs may both insert: NOEXIST keeps the first, and both then use it.
    let _ = PROCESS_RULE_STATE.insert(key, RuleState::default(), u64::from(BPF_NOEXIST));
    PROCESS_RULE_STATE.get_ptr_mut(key)
}

/// A record with the calling task's identity and the current time.
#[inline(always)]
pub fn record_for_current(pid_tgid: u64) -> TriggerRecord {
    TriggerRecord {
        timestamp_ns: now_ns(),
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        ..TriggerRecord::default()
    }
}
