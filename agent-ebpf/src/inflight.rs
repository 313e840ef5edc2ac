//! In-flight latency (`detect: running`): the calls that have run longer than their rule's
//! `min_duration` and are still running are found by the agent's periodic scan of
//! `RUNNING_TIMES` and `SYSCALL_START`; these programs give it what the kernel alone can.
//!
//! - Looks: the registers and user stack of a thread the scan names in `WANT_LOOK`, taken
//!   (and claimed by removing the ask, so only one writes) either on its CPU by
//!   `inflight_tick` (the thread is running) or by the task iterator `inflight_look`
//!   while the thread is off CPU — copied only when its switch counts and `on_cpu` are the
//!   same before and after the copy, so the copy is the stack of one moment at which the
//!   thread did not run. Userspace unwinds a function call's look and checks that the
//!   probed function's frame is still there (a sibling called from the same site at the
//!   same height is not it).
//! - `inflight_fire` (run by the agent with `BPF_PROG_TEST_RUN`, never attached): checks
//!   again that the call is still the one in the map (the entry frame, or the syscall's
//!   start, unchanged), and fires it for one rule through `emit::fire_one` — the
//!   cooldown, hourly limit and in-kernel freeze of every other trigger — once per call
//!   and rule (`INFLIGHT_REPORTED`).
use core::{
    ffi::c_void,
    ptr::{addr_of, addr_of_mut, write_volatile},
};

use aya_ebpf::{
    EbpfContext as _,
    bindings::{pt_regs, task_struct},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_copy_from_user_task, bpf_get_current_task_btf, bpf_task_pt_regs},
    },
    programs::RawTracePointContext,
};
use lookback_common::{
    MAX_RULES,
    rule::{
        EngineConfig, EntryKey, FLAG_RUNNING, INFLIGHT_FUNCTION, INFLIGHT_SENT,
        INFLIGHT_SUPPRESSED, InflightKey, KIND_FUNCTION, KIND_SYSCALL, LOOK_ITER, LOOK_SAMPLE,
        Look, MAX_CALL_DEPTH, RuleSpec,
    },
    trigger::{PHASE_RUNNING, TriggerRecord, TriggerStackCopy},
};

use crate::{
    emit::{copy_sized, copy_stack, fire_one, now_ns, read_kernel_u64},
    maps::{
        INFLIGHT_REPORTED, LOOKS, RULES, RUNNING_TIMES, SYSCALL_START, TARGET_TGIDS, WANT_LOOK,
        config, rule_slots, task_u32,
    },
};

/// The watcher's CPU ticks (a `cpu-clock` event per CPU, every 5 ms, enabled only while
/// a look is wanted): the thread on the CPU fills its look if the scan asked for one.
/// Keeps no sample (returns 0).
#[unsafe(no_mangle)]
#[unsafe(link_section = "perf_event")]
pub extern "C" fn inflight_tick(_ctx: *mut c_void) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    // Claimed by removing the ask: the iterator and a tick cannot both write the slot.
    // SAFETY: a plain u32 value, copied before the entry is removed.
    let Some(slot) = (unsafe { WANT_LOOK.get(tid) }).copied() else {
        return 0;
    };
    if WANT_LOOK.remove(tid).is_err() {
        return 0;
    }
    let Some(look) = LOOKS.get_ptr_mut(slot) else {
        return 0;
    };
    // SAFETY: `look` points at a preallocated array value this program claimed above; the
    // scan accepts it only once `look_ns` is written, last.
    unsafe {
        copy_stack(addr_of_mut!((*look).copy));
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs;
        let g = read_kernel_u64(addr_of!((*regs).r14).cast()).unwrap_or(0);
        let bounds = bpf_probe_read_user(g as *const [u64; 2]).unwrap_or([0; 2]);
        write_goroutine(look, g, bounds);
        publish(look, tid, LOOK_SAMPLE);
    }
    0
}

/// Writes the look's R14 and the goroutine stack bounds read at it (see `Look::g`).
///
/// # Safety
/// `look` points at a `LOOKS` value the caller claimed.
#[inline(always)]
unsafe fn write_goroutine(look: *mut Look, g: u64, bounds: [u64; 2]) {
    // SAFETY: as the caller promises.
    unsafe {
        write_volatile(addr_of_mut!((*look).g), g);
        write_volatile(addr_of_mut!((*look).g_lo), bounds[0]);
        write_volatile(addr_of_mut!((*look).g_hi), bounds[1]);
    }
}

/// Marks a filled look as taken now, by `how`, for `tid` (`look_ns` last).
///
/// # Safety
/// `look` points at a `LOOKS` value the caller claimed.
#[inline(always)]
unsafe fn publish(look: *mut Look, tid: u32, how: u32) {
    // SAFETY: as the caller promises.
    unsafe {
        write_volatile(addr_of_mut!((*look).tid), tid);
        write_volatile(addr_of_mut!((*look).how), how);
        write_volatile(addr_of_mut!((*look).look_ns), now_ns());
    }
}

/// The task iterator (`iter.s/task`: sleepable, for `bpf_copy_from_user_task`; Linux
/// 5.18). The agent reads it once per scan that has threads to look at.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter.s/task")]
pub extern "C" fn inflight_look(ctx: *mut c_void) -> i32 {
    let _ = try_look(ctx);
    0
}

/// A `task_struct`'s `on_cpu` and switch count (`nvcsw + nivcsw`).
#[inline(always)]
fn run_state(task: *const u8, config: &EngineConfig) -> Option<(u32, u64)> {
    let at = |offset: u32| task.wrapping_add(offset as usize).cast::<c_void>();
    let on_cpu = task_u32(task, config.task_on_cpu_offset)?;
    let switches = read_kernel_u64(at(config.task_nvcsw_offset))?
        .wrapping_add(read_kernel_u64(at(config.task_nivcsw_offset))?);
    Some((on_cpu, switches))
}

fn try_look(ctx: *mut c_void) -> Option<()> {
    // struct bpf_iter__task { struct bpf_iter_meta *meta; struct task_struct *task; }
    // SAFETY: the iterator's context holds these two pointers.
    let task = unsafe { *ctx.cast::<*mut task_struct>().add(1) };
    if task.is_null() {
        return None;
    }
    let config = config()?;
    let base = task.cast::<u8>().cast_const();
    let tid = task_u32(base, config.task_pid_offset)?;
    // SAFETY: a plain u32 value.
    let slot = unsafe { WANT_LOOK.get(tid) }.copied()?;
    let before = run_state(base, config)?;
    if before.0 != 0 {
        return None; // running: a tick on its CPU takes the look
    }
    WANT_LOOK.remove(tid).ok()?; // claimed
    let look = LOOKS.get_ptr_mut(slot)?;
    // SAFETY: `task` is the iterator's live task; the regs pointer is only read through
    // `bpf_probe_read_kernel`.
    let regs = unsafe { bpf_task_pt_regs(task) } as *const pt_regs;
    let word = |at: *const u64| read_kernel_u64(at.cast());
    // SAFETY: field addresses of the kernel's pt_regs and of the claimed look value.
    let taken = unsafe {
        let copy: *mut TriggerStackCopy = addr_of_mut!((*look).copy);
        match (
            word(addr_of!((*regs).rip)),
            word(addr_of!((*regs).rsp)),
            word(addr_of!((*regs).rbp)),
        ) {
            (Some(ip), Some(sp), Some(bp)) => {
                let dst: *mut c_void = addr_of_mut!((*copy).bytes).cast();
                let from = sp as *const c_void;
                let len = copy_sized(sp, |size| {
                    bpf_copy_from_user_task(dst, size, from, task, 0) == 0
                });
                write_volatile(addr_of_mut!((*copy).ip), ip);
                write_volatile(addr_of_mut!((*copy).sp), sp);
                write_volatile(addr_of_mut!((*copy).bp), bp);
                write_volatile(addr_of_mut!((*copy).len), len);
                let g = word(addr_of!((*regs).r14)).unwrap_or(0);
                let mut bounds = [0u64; 2];
                let at = g as *const c_void;
                if bpf_copy_from_user_task(addr_of_mut!(bounds).cast(), 16, at, task, 0) != 0 {
                    bounds = [0; 2];
                }
                write_goroutine(look, g, bounds);
                len != 0 && run_state(base, config) == Some(before)
            }
            _ => false,
        }
    };
    if taken {
        // SAFETY: claimed above.
        unsafe { publish(look, tid, LOOK_ITER) };
    } else {
        // It ran meanwhile (or nothing could be read): asked again for the next pass.
        let _ = WANT_LOOK.insert(tid, slot, 0);
    }
    Some(())
}

/// Fires one call in flight; run by the agent (`BPF_PROG_TEST_RUN`) with the arguments
/// `lookback_common::rule::INFLIGHT_*` names. Returns `INFLIGHT_SENT`, `INFLIGHT_SUPPRESSED`
/// (met, and the cooldown or hourly limit held it back) or 0 (not met: the call ended, or
/// it is not a target's any more). Written without `#[raw_tracepoint]`: that macro
/// returns 0 whatever the function returns.
#[unsafe(no_mangle)]
#[unsafe(link_section = "raw_tp/lookback_inflight")]
pub extern "C" fn inflight_fire(ctx: *mut c_void) -> i32 {
    let ctx = RawTracePointContext::new(ctx);
    try_fire(&ctx).unwrap_or(0)
}

fn try_fire(ctx: &RawTracePointContext) -> Option<i32> {
    let kind: u64 = ctx.arg(0);
    let thread: u64 = ctx.arg(1);
    let pid_tgid: u64 = ctx.arg(2);
    let rule_id = ctx.arg::<u64>(3) as u32;
    let entry_ns: u64 = ctx.arg(4);
    let tgid = (pid_tgid >> 32) as u32;
    // One rule per run (the scan names it): no loop over rule ids, which with 64 of them
    // took the verifier past its million instructions.
    if rule_id >= MAX_RULES || rule_id >= rule_slots() {
        return Some(0);
    }
    let rule = RULES.get(rule_id)?;
    let bit = 1u64 << rule_id;
    let key = InflightKey { thread, entry_ns };
    // SAFETY: a plain u64 value.
    let already = unsafe { INFLIGHT_REPORTED.get(key) }.copied().unwrap_or(0);
    if rule.flags & FLAG_RUNNING == 0 || already & bit != 0 || target_rules(tgid) & bit == 0 {
        return Some(0);
    }
    let mut record = TriggerRecord {
        pid: tgid,
        tid: pid_tgid as u32,
        phase: PHASE_RUNNING,
        ..TriggerRecord::default()
    };
    let comm: [u64; 2] = [ctx.arg(8), ctx.arg(9)];
    for (i, word) in comm.iter().enumerate() {
        for (j, byte) in word.to_le_bytes().iter().enumerate() {
            record.comm[(i * 8 + j) & 15] = *byte;
        }
    }
    let met = if kind == INFLIGHT_FUNCTION {
        function_met(ctx, &key, tgid, rule_id, rule, &mut record)
    } else {
        syscall_met(pid_tgid as u32, entry_ns, tgid, bit, rule, &mut record)
    };
    if met != Some(true) {
        return Some(0);
    }
    let _ = INFLIGHT_REPORTED.insert(key, already | bit, 0);
    // Admitted at the kernel's now, as every trigger (the look may be older than the
    // last emit the cooldown compares with); the record keeps the look's time.
    if fire_one(ctx.as_ptr(), rule_id, rule, record, now_ns(), false) {
        Some(INFLIGHT_SENT)
    } else {
        Some(INFLIGHT_SUPPRESSED)
    }
}

/// The rules that apply to process `tgid` now (`TARGET_TGIDS`; the agent adds the
/// processes of cgroup targets there too). The fire program runs in the agent's context,
/// where `current_rules` would read the agent's cgroup.
#[inline(always)]
fn target_rules(tgid: u32) -> u64 {
    // SAFETY: a plain u64 value.
    unsafe { TARGET_TGIDS.get(tgid) }.copied().unwrap_or(0)
}

/// A function call: still the frame at the given height with the given entry time in
/// `RUNNING_TIMES` of function rule `rule_id`, old enough at the look. Fills `record`.
#[inline(always)]
fn function_met(
    ctx: &RawTracePointContext,
    key: &InflightKey,
    tgid: u32,
    rule_id: u32,
    rule: &RuleSpec,
    record: &mut TriggerRecord,
) -> Option<bool> {
    let look_ns: u64 = ctx.arg(5);
    let height: u64 = ctx.arg(6);
    if rule.kind != KIND_FUNCTION {
        return Some(false);
    }
    let entry_key = EntryKey {
        thread: key.thread,
        tgid,
        rule_id,
    };
    // SAFETY: plain-data value, read only.
    let stack = unsafe { RUNNING_TIMES.get(entry_key) }?;
    let mut found = None;
    for i in 0..MAX_CALL_DEPTH {
        if i as u64 >= stack.depth {
            break;
        }
        let frame = stack.frames[i];
        if frame.height == height && frame.entry_ns == key.entry_ns {
            found = Some((i, frame));
            break;
        }
    }
    let Some((depth, frame)) = found else {
        return Some(false); // a later entry replaced it: the call ended
    };
    let duration = look_ns.saturating_sub(frame.entry_ns);
    if look_ns == 0 || duration < rule.min_duration_ns {
        return Some(false);
    }
    record.kind = KIND_FUNCTION;
    record.timestamp_ns = look_ns;
    record.duration_ns = duration;
    record.ip = frame.func;
    record.depth = depth as u32;
    Some(true)
}

/// A syscall: the thread's `SYSCALL_START` still the one that entered at `entry_ns` in
/// process `tgid`, with syscall rule `bit` applying at entry, past its threshold now.
/// Fills `record`.
#[inline(always)]
fn syscall_met(
    thread: u32,
    entry_ns: u64,
    tgid: u32,
    bit: u64,
    rule: &RuleSpec,
    record: &mut TriggerRecord,
) -> Option<bool> {
    // SAFETY: plain-data value copied out.
    let start = unsafe { SYSCALL_START.get(thread) }.copied()?;
    let now = now_ns();
    let duration = now.saturating_sub(entry_ns);
    if start.enter_ns != entry_ns
        || start.tgid != tgid
        || start.rules & bit == 0
        || rule.kind != KIND_SYSCALL
        || !rule.has_syscall(start.nr)
        || duration < rule.min_duration_ns
    {
        return Some(false);
    }
    record.kind = KIND_SYSCALL;
    record.timestamp_ns = now;
    record.duration_ns = duration;
    record.syscall_nr = start.nr as u32;
    Some(true)
}
